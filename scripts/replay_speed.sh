#!/usr/bin/env bash
# `tollgate replay`'s cost per line on the replay bench's log (cli/benches/support/log.rs, written
# by cli/examples/replay_log.rs) through the bench's one rule: user-space instructions per line
# under callgrind (start-up subtracted: the same command over a one-line log), where they go, and
# the binary's CPU time (`perf stat -e task-clock`, best of RUNS) as lines per CPU-second.
#
#   ./scripts/replay_speed.sh [LINES] [RUNS]     (default 1000000 lines, 5 runs)
#
# Instructions are the figure this shared machine's load cannot move; CPU time is what the issue's
# target is stated in. Installs valgrind from Debian's packages when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
lines="${1:-1000000}"
runs="${2:-5}"

if ! command -v valgrind >/dev/null; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq valgrind >/dev/null
fi

cargo build --release -q -p tollgate-cli --bin tollgate --example replay_log
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
target/release/examples/replay_log "$lines" "$work/replay.log" "$work/one-rule.toml"
target/release/examples/replay_log 1 "$work/one.log" "$work/one-rule.toml"

replay() { # log
    target/release/tollgate replay --config "$work/one-rule.toml" --log "$1" --json
}
# The replay must read every line: a log the binary skips would measure nothing.
replay "$work/replay.log" >"$work/out.json"
grep -q "\"lines\": $lines," "$work/out.json"
if grep -q '"skipped": {}' "$work/out.json"; then :; else
    echo "error: lines were skipped:" >&2
    cat "$work/out.json" >&2
    exit 1
fi

total() { callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'; }
valgrind --tool=callgrind --callgrind-out-file="$work/all.out" \
    target/release/tollgate replay --config "$work/one-rule.toml" --log "$work/replay.log" \
    --json >/dev/null 2>&1
valgrind --tool=callgrind --callgrind-out-file="$work/start.out" \
    target/release/tollgate replay --config "$work/one-rule.toml" --log "$work/one.log" \
    --json >/dev/null 2>&1
all=$(total "$work/all.out")
start=$(total "$work/start.out")
echo "tollgate replay, $lines combined lines, one per-IP token bucket"
echo "instructions per line (callgrind, start-up of $start subtracted): $(((all - start) / lines))"

# The costliest functions, inclusive instructions per line (callgrind attributes an inlined
# function to its caller: these are the functions left standing in the release build).
callgrind_annotate --inclusive=yes --threshold=100 "$work/all.out" 2>/dev/null |
    awk -v lines="$lines" '
        $1 ~ /^[0-9,]+$/ && / \[\// {
            c = $1; gsub(",", "", c); n++; cost[n] = c; name[n] = $0
        }
        END {
            for (i = 1; i <= n && shown < 25; i++) {
                if (cost[i] / lines < 40) continue
                if (name[i] ~ /ld-linux|below main|libc_start|:main |tollgate::main |lang_start|backtrace|tollgate::run |replay::replay /) continue
                sub(/^ *[0-9,]+ *(\([^)]*\))? */, "", name[i]); sub(/^(\?\?\?|[^ ]*\.[A-Za-z]+):/, "", name[i]); sub(/ \[.*/, "", name[i])
                printf "  %8.0f  %s\n", cost[i] / lines, substr(name[i], 1, 110); shown++
            }
        }'

# CPU time of the whole process, best of $runs.
best=""
for _ in $(seq "$runs"); do
    ms=$(perf stat -x, -e task-clock target/release/tollgate replay \
        --config "$work/one-rule.toml" --log "$work/replay.log" --json 2>&1 >/dev/null |
        awk -F, '/task-clock/ { printf "%d", $1 }')
    if [ -z "$best" ] || [ "$ms" -lt "$best" ]; then best="$ms"; fi
done
echo "CPU time (perf stat -e task-clock, best of $runs): $best ms," \
    "$((lines * 1000 / best)) lines per CPU-second"
