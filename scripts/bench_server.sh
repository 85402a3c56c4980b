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

cargo build --release -q -p tollgate-server --bin tollgate-server --example constant_answer
work="$(mktemp -d)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
YAML

# The request, length-prefixed as gRPC frames a message: RateLimitRequest { domain: "bench",
# descriptors: [{ entries: [{ key: "remote_address", value: "10.0.0.1" }] }] }.
python3 - "$work/body.bin" <<'PY'
import struct, sys
def field(number, payload):
    return bytes([number << 3 | 2, len(payload)]) + payload
entry = field(1, b"remote_address") + field(2, b"10.0.0.1")
request = field(1, b"bench") + field(2, field(1, entry))
open(sys.argv[1], "wb").write(b"\0" + struct.pack(">I", len(request)) + request)
PY

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
