#!/usr/bin/env bash
# tollgate-server's calls per second and latency at 64 concurrent HTTP/2 streams, against the
# protocol's floor measured in the same run: a tonic server that answers every call with one
# constant OK (server/examples/constant_answer.rs). Not a test: figures for BENCHMARKS.md.
#
# The load generator is h2load (Debian's nghttp2-client, installed when missing) sending one
# pre-encoded gRPC request: domain "bench", one descriptor remote_address=10.0.0.1, under a
# reference-form limit of 1,000,000,000 per second (a fixed window, so every call is charged
# and allowed: the whole decision, never a shortcut).
#
# Then the same with the Redis store (a redis-server started here on a loopback port), against the
# Redis floor: the very EVALSHA tollgate-server sends for that call (captured with MONITOR) called
# as often by the Redis client the store uses, from 64 concurrent callers on its one connection
# (server/examples/evalsha_floor.rs).
#
#   ./scripts/bench_server.sh [CALLS]        (default 200000 per server)
set -euo pipefail
cd "$(dirname "$0")/.."
calls="${1:-200000}"

if ! command -v h2load >/dev/null; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nghttp2-client
fi

cargo build --release -q -p tollgate-server --bin tollgate-server --example constant_answer \
    --example evalsha_floor
. scripts/lib/scratch.sh

# The limit and the request (bench.yaml, body.bin), shared with the other server bench.
. scripts/server_request.sh

target/release/tollgate-server --config "$work/bench.yaml" \
    --grpc-addr 127.0.0.1:18081 --http-addr 127.0.0.1:18080 2>"$work/server.log" &
pids+=($!)
target/release/examples/constant_answer 127.0.0.1:18091 &
pids+=($!)
for port in 18081 18091; do
    for _ in $(seq 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
        sleep 0.1
    done
done

path=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
load() { # port calls log
    h2load -n "$2" -c 4 -m 16 --log-file="$3" \
        -H 'content-type: application/grpc' -H 'te: trailers' \
        -d "$work/body.bin" "http://127.0.0.1:$1$path"
}
summary() { # name h2load-output log
    local rps p50 p99
    rps="$(grep -oE 'finished in [0-9.]+[a-z]+, [0-9.]+ req/s' "$2" | grep -oE '[0-9.]+ req/s')"
    read -r p50 p99 < <(cut -f3 "$3" | sort -n | awk '{ v[NR] = $1 } END {
        printf "%d %d\n", v[int(NR * 0.50)], v[int(NR * 0.99)] }')
    printf '%-28s %14s   p50 %6d us   p99 %6d us\n' "$1" "$rps" "$p50" "$p99"
}

echo "h2load -n $calls -c 4 -m 16 (64 concurrent streams), one pre-encoded ShouldRateLimit"
for round in warm-up measured; do
    for server in floor tollgate-server; do
        port=18091
        if [ "$server" = tollgate-server ]; then port=18081; fi
        n="$calls"
        if [ "$round" = warm-up ]; then n=$((calls / 10)); fi
        load "$port" "$n" "$work/$server.log" >"$work/$server.out"
        if ! grep -q "status codes: $n 2xx" "$work/$server.out"; then
            cat "$work/$server.out" >&2
            echo "error: $server did not answer every call with 200" >&2
            exit 1
        fi
        if [ "$round" = measured ]; then
            summary "$server" "$work/$server.out" "$work/$server.log"
        fi
    done
done
count="$(curl -s http://127.0.0.1:18080/metrics 2>/dev/null |
    grep -E '^ratelimit_service_rate_limit_within_limit\{domain="bench"' | awk '{ print $2 }' || true)"
echo "tollgate-server within_limit: ${count:-?} (warm-up + measured calls, all charged)"

# The Redis store: the same limit as a tollgate file (an aligned fixed window, as the reference's).
redis_port=18379
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize no >"$work/redis.log" 2>&1 &
pids+=($!)
redis_limit_file "$redis_port" 1000000000 1s >"$work/redis.toml"
for _ in $(seq 100); do
    if redis-cli -p "$redis_port" ping >/dev/null 2>&1; then break; fi
    sleep 0.1
done
target/release/tollgate-server --config "$work/redis.toml" \
    --grpc-addr 127.0.0.1:18281 --http-addr 127.0.0.1:18280 2>"$work/server-redis.log" &
pids+=($!)
for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/18281") 2>/dev/null; then break; fi
    sleep 0.1
done

# One call watched: the EVALSHA it sends, with its arguments (MONITOR escapes bytes as \xHH).
redis-cli -p "$redis_port" MONITOR >"$work/monitor.txt" &
monitor=$!
sleep 0.3
h2load -n 1 -c 1 -H 'content-type: application/grpc' -H 'te: trailers' \
    -d "$work/body.bin" "http://127.0.0.1:18281$path" >/dev/null
sleep 0.3
kill "$monitor"
floor_args="$(python3 - "$work/monitor.txt" <<'PY'
import sys
ESCAPES = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b", '"': b'"', "\\": b"\\"}
def quoted(text):
    strings, i = [], 0
    while (i := text.find('"', i)) >= 0:
        value, i = bytearray(), i + 1
        while text[i] != '"':
            if text[i] == "\\" and text[i + 1] == "x":
                value.append(int(text[i + 2:i + 4], 16))
                i += 4
            elif text[i] == "\\":
                value += ESCAPES[text[i + 1]]
                i += 2
            else:
                value += text[i].encode()
                i += 1
        strings.append(bytes(value))
        i += 1
    return strings
for line in open(sys.argv[1], encoding="latin-1"):
    if '"EVALSHA"' in line:
        _, sha, _, key, *args = quoted(line[line.index('"EVALSHA"'):])
        print(sha.decode(), key.decode(), *(a.hex() for a in args))
        break
else:
    sys.exit("error: tollgate-server sent no EVALSHA")
PY
)"

echo
echo "with the Redis store (redis-server on 127.0.0.1:$redis_port), the same load"
for round in warm-up measured; do
    n="$calls"
    if [ "$round" = warm-up ]; then n=$((calls / 10)); fi
    # shellcheck disable=SC2086 # the captured call: SHA, KEY and each argument, one word each
    floor="$(target/release/examples/evalsha_floor "redis://127.0.0.1:$redis_port" "$n" 64 $floor_args)"
    load 18281 "$n" "$work/redis.log.h2" >"$work/redis.out"
    if ! grep -q "status codes: $n 2xx" "$work/redis.out"; then
        cat "$work/redis.out" >&2
        echo "error: tollgate-server (Redis) did not answer every call with 200" >&2
        exit 1
    fi
    if [ "$round" = measured ]; then
        read -r rps _ _ p50 _ _ p99 _ <<<"$floor"
        printf '%-28s %14s   p50 %6d us   p99 %6d us\n' "EVALSHA floor (redis client)" \
            "$rps req/s" "$p50" "$p99"
        summary "tollgate-server, Redis" "$work/redis.out" "$work/redis.log.h2"
    fi
done
