#!/usr/bin/env bash
# Counts the instructions each HTTP bench server spends per request *in process* (no sockets, no
# hyper: `bench/examples/layer_instructions.rs` sends the requests through the `Router` itself),
# under callgrind, and what each adds to bare axum:
#
#   ./scripts/layer_instructions.sh                          # every server
#   ./scripts/layer_instructions.sh tollgate-denied-headers  # bare and the servers named
#
# These repeat to the instruction from run to run; `./scripts/http_instructions.sh` counts the
# same servers served over loopback, which adds hyper's work and moves by about a hundred. Say
# which of the two a figure is: they differ by a few hundred per request. Installs valgrind from
# Debian's packages when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib/counted.sh
need_valgrind

requests=20000
servers=("$@")
if [ ${#servers[@]} -eq 0 ]; then
    servers=(tollgate-allowed-noheaders tollgate-allowed-headers tollgate-allowed-nothing
        tower_governor-allowed tower_governor-allowed-headers tollgate-denied-headers
        tower_governor-denied)
fi

cargo build --release -p tollgate-bench --example layer_instructions >/dev/null 2>&1
binary=target/release/examples/layer_instructions

# Instructions per request of one server, to one decimal (the warm-up's few requests included).
count() {
    counted "$requests" "$binary" "$1" "$requests"
}

bare=$(count bare)
printf '| server | instructions per request, in process | added over bare axum |\n|---|---:|---:|\n'
printf '| bare | %s | |\n' "$bare"
for server in "${servers[@]}"; do
    figure=$(count "$server")
    printf '| %s | %s | %+.0f |\n' "$server" "$figure" "$(awk -v a="$figure" -v b="$bare" 'BEGIN { print a - b }')"
done
