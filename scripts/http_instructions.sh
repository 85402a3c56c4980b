#!/usr/bin/env bash
# Counts the user-space instructions each HTTP bench server spends per request, under callgrind:
#
#   ./scripts/http_instructions.sh                      # every variant of bench/benches/http.rs
#   ./scripts/http_instructions.sh bare tollgate-allowed-headers
#
# Requests per second and CPU time on a shared virtual machine move with its speed; instructions
# per request do not, so these counts are the primary HTTP figure, and the CPU time of
# `cargo bench -p tollgate-bench --bench http` gives the direction only. The count leaves out the
# kernel's share, which is about the same for every variant. Each server runs under valgrind while
# wrk sends it requests for a few seconds; the count covers that load only (startup is zeroed away).
# Installs valgrind and wrk from Debian's packages when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in valgrind:valgrind wrk:wrk; do
    if ! command -v "${tool%%:*}" >/dev/null; then
        apt-get install -y "${tool##*:}" >/dev/null
    fi
done

variants=("$@")
if [ ${#variants[@]} -eq 0 ]; then
    variants=(bare tollgate-allowed-headers tollgate-allowed-noheaders tower_governor-allowed
        tower_governor-allowed-headers
        tollgate-denied-headers tower_governor-denied tollgate-denied-around
        tower_governor-denied-around)
fi

binary=$(cargo bench -p tollgate-bench --bench http --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
port=38421

printf '| server | requests measured | user-space instructions per request |\n|---|---:|---:|\n'
for variant in "${variants[@]}"; do
    valgrind --tool=callgrind --callgrind-out-file="$work/out" \
        "$binary" --serve "$variant" "127.0.0.1:$port" >/dev/null 2>&1 &
    server=$!
    for _ in $(seq 150); do
        curl -s -o /dev/null "http://127.0.0.1:$port/" && break
        sleep 0.2
    done
    callgrind_control -z "$server" >/dev/null 2>&1
    requests=$(wrk -t1 -c8 -d4s "http://127.0.0.1:$port/" | awk '/requests in/ {print $1}')
    callgrind_control -d "$server" >/dev/null 2>&1
    sleep 1
    kill -9 "$server"
    wait "$server" 2>/dev/null || true
    total=$(callgrind_annotate "$work/out.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    printf '| %s | %d | %d |\n' "$variant" "$requests" $((total / requests))
    rm -f "$work"/out*
    port=$((port + 1))
done
