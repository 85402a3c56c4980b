#!/usr/bin/env bash
# Counts the instructions redis-server spends per script call for every row of the Redis bench's
# per-algorithm table (bench/benches/redis.rs: the store's algorithms, the floor, `return 1`, the
# peers' ways), under callgrind:
#
#   ./scripts/redis_instructions.sh                # the table
#   KEEP=DIR ./scripts/redis_instructions.sh       # also keeps each row's callgrind file in DIR
#                                                  # (callgrind_annotate DIR/ROW.out)
#
# `usec_per_call` of `cargo bench -p tollgate-bench --bench redis` moves with the speed of a shared
# virtual machine; instructions per call do not, so these counts are the primary figure for the
# script. The count is collected inside `evalShaCommand` only (`--toggle-collect`): the script's
# whole run as Redis times it for `usec_per_call` (arguments, the Lua VM, the commands the script
# calls, building the reply, Redis's periodic Lua GC step), and nothing of the network, the
# request's parsing or the server's timers, which are alike for every row. The bench binary
# (`--drive PORT`) runs each row against this server for two seconds after a warm-up; counters are
# zeroed before the row and dumped after it, and the total is divided by the server's own `EVALSHA`
# count over the row. Installs valgrind from Debian's packages when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v valgrind >/dev/null; then
    apt-get install -y valgrind >/dev/null
fi
if ! command -v redis-server >/dev/null; then
    apt-get install -y redis-server redis-tools >/dev/null
fi

binary=$(cargo bench -p tollgate-bench --bench redis --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
work=$(mktemp -d)
port=38521
valgrind --tool=callgrind --callgrind-out-file="$work/out" --toggle-collect=evalShaCommand \
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
    >/dev/null 2>&1 &
server=$!
trap 'kill -9 $server 2>/dev/null; wait $server 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 150); do
    redis-cli -p "$port" PING >/dev/null 2>&1 && break
    sleep 0.2
done

coproc DRIVER { "$binary" --drive "$port"; }
driver=$DRIVER_PID
dumps=0
rows=()
while read -r -u "${DRIVER[0]}" step row calls name; do
    case $step in
    ready)
        callgrind_control -z "$server" >/dev/null 2>&1
        ;;
    done)
        callgrind_control -d "$server" >/dev/null 2>&1
        dumps=$((dumps + 1))
        total=$(callgrind_annotate "$work/out.$dumps" 2>/dev/null |
            awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
        if [ -n "${KEEP:-}" ]; then
            mkdir -p "$KEEP"
            cp "$work/out.$dumps" "$KEEP/$row.out"
        fi
        rows[row]="$calls $((total / calls)) $name"
        ;;
    esac
    echo >&"${DRIVER[1]}"
done
wait "$driver"

# Row 3 is the floor (`TIME` + `GET` + `SET … PX`).
floor=$(echo "${rows[3]}" | awk '{print $2}')
printf '| script | calls measured | instructions per call | above the floor |\n|---|---:|---:|---:|\n'
for row in "${!rows[@]}"; do
    echo "${rows[row]}" | awk -v f="$floor" -v floor_row=$((row == 3)) '{
        calls = $1; per = $2; $1 = ""; $2 = ""; sub(/^ +/, "")
        above = floor_row ? "" : sprintf("%+d (%+.1f %%)", per - f, 100 * (per - f) / f)
        printf "| %s | %d | %d | %s |\n", $0, calls, per, above
    }'
done
