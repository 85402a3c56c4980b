#!/usr/bin/env bash
# tollgate-server's user-space instructions per ShouldRateLimit call, under callgrind, against the
# protocol's floor (server/examples/constant_answer.rs) driven by the same client: the figure
# this shared machine's load cannot move. Also prints where tollgate-server's extra instructions
# go: the library's engine (the store's decision and the limiter's batch) and the server's own
# stages, each as instructions per call (inclusive).
#
#   ./scripts/server_instructions.sh [CALLS]     (default 20000, after 2000 unmeasured)
#
# The request is the one of scripts/bench_server.sh: domain "bench", one descriptor
# remote_address=10.0.0.1, under a reference-form limit of 1,000,000,000 per second, so every call
# is matched, charged in the memory store and allowed. h2load sends it at 64 concurrent streams.
# Two more rows of tollgate-server in the same run: every call denied (the same descriptor under
# 10 per hour), and TLS on the gRPC port (started as a deployment starts the reference: its
# environment, GRPC_SERVER_USE_TLS with a certificate made here by openssl; h2load speaks h2 over
# TLS). And the floor once more behind what tollgate-server puts around its method (its health
# service beside, a timeout per call: `constant_answer --server-stack`), so that the two differ
# by the method alone. Installs valgrind, h2load (nghttp2-client) and openssl from Debian's packages when
# they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
calls="${1:-20000}"

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
for tool in valgrind:valgrind h2load:nghttp2-client openssl:openssl; do
    if ! command -v "${tool%%:*}" >/dev/null; then
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${tool##*:}" >/dev/null
    fi
done

cargo build --release -q -p tollgate-server --bin tollgate-server --example constant_answer
work="$(mktemp -d)"
server=""
cleanup() {
    if [ -n "$server" ]; then kill -9 "$server" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

# The limit and the request (bench.yaml, body.bin), shared with the other server bench.
. scripts/server_request.sh

path=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
scheme=http
load() { # port calls
    h2load -n "$2" -c 4 -m 16 -H 'content-type: application/grpc' -H 'te: trailers' \
        -d "$work/body.bin" "$scheme://127.0.0.1:$1$path" >"$work/h2load.out"
    if ! grep -q "status codes: $2 2xx" "$work/h2load.out"; then
        cat "$work/h2load.out" >&2
        echo "error: not every call was answered with 200" >&2
        exit 1
    fi
}
server_env=()
# Runs one server under callgrind, with the variables of server_env: unmeasured calls, the
# counters zeroed, the measured calls, the counters dumped.
measure() { # name port command...
    local name="$1" port="$2"
    shift 2
    env "${server_env[@]}" valgrind --tool=callgrind --callgrind-out-file="$work/$name.out" "$@" \
        >/dev/null 2>&1 &
    server=$!
    for _ in $(seq 300); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
        sleep 0.2
    done
    load "$port" $((calls / 10))
    # Under the server's variables too: valgrind names its control pipe after HOST and USER.
    env "${server_env[@]}" callgrind_control -z "$server" >/dev/null 2>&1
    load "$port" "$calls"
    env "${server_env[@]}" callgrind_control -d "$server" >/dev/null 2>&1
    # The dump is written when callgrind_control returns; the server is no longer needed.
    kill -9 "$server"
    wait "$server" 2>/dev/null || true
    server=""
}

measure floor 18191 target/release/examples/constant_answer 127.0.0.1:18191
measure server 18181 target/release/tollgate-server --config "$work/bench.yaml" \
    --grpc-addr 127.0.0.1:18181 --http-addr 127.0.0.1:18180
# The floor behind what tollgate-server puts around its method too (the health service, a
# timeout per call): where the rest of the difference is the decision's.
measure floor_stack 18192 target/release/examples/constant_answer 127.0.0.1:18192 --server-stack

# Every call denied: the same descriptor under 10 per hour (the first 10 of the unmeasured calls
# pass).
sed 's/unit: second, requests_per_unit: 1000000000/unit: hour, requests_per_unit: 10/' \
    "$work/bench.yaml" >"$work/denied.yaml"
measure denied 18171 target/release/tollgate-server --config "$work/denied.yaml" \
    --grpc-addr 127.0.0.1:18171 --http-addr 127.0.0.1:18170

# TLS on the gRPC port, started from the reference's environment (the ConfigMap layout).
mkdir -p "$work/runtime/ratelimit/config"
cp "$work/bench.yaml" "$work/runtime/ratelimit/config/bench.yaml"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1 \
    -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
scheme=https
server_env=(RUNTIME_ROOT="$work/runtime" RUNTIME_SUBDIRECTORY=ratelimit BACKEND_TYPE=memory
    USE_STATSD=false GRPC_HOST=127.0.0.1 GRPC_PORT=18161 HOST=127.0.0.1 PORT=18160
    GRPC_SERVER_USE_TLS=true GRPC_SERVER_TLS_CERT="$work/cert.pem"
    GRPC_SERVER_TLS_KEY="$work/key.pem")
measure tls 18161 target/release/tollgate-server
scheme=http
server_env=()

total() { callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'; }
floor=$(total "$work/floor.out.1")
tollgate=$(total "$work/server.out.1")
floor_stack=$(total "$work/floor_stack.out.1")
denied=$(total "$work/denied.out.1")
tls=$(total "$work/tls.out.1")
echo "h2load -n $calls -c 4 -m 16 (64 concurrent streams), one pre-encoded ShouldRateLimit"
printf '| server | instructions per call | vs floor |\n|---|---:|---:|\n'
printf '| floor (constant answer) | %d | 100 %% |\n' $((floor / calls))
printf '| floor behind the server'"'"'s stack (health service, timeout per call) | %d | %d %% |\n' \
    $((floor_stack / calls)) $((100 * floor_stack / floor))
printf '| tollgate-server, memory store | %d | %d %% |\n' $((tollgate / calls)) \
    $((100 * tollgate / floor))
printf '| tollgate-server, every call denied | %d | %d %% |\n' $((denied / calls)) \
    $((100 * denied / floor))
printf '| tollgate-server, TLS on the gRPC port (the floor without) | %d | %d %% |\n' \
    $((tls / calls)) $((100 * tls / floor))
printf 'calls per CPU-second, tollgate-server against the floor: %d %%; against the floor behind its stack: %d %%\n' \
    $((100 * floor / tollgate)) $((100 * floor_stack / tollgate))

# Inclusive instructions per call of the named functions (callgrind attributes an inlined
# function to its caller: these are the functions left standing in the release build).
echo
echo "tollgate-server, inclusive instructions per call:"
callgrind_annotate --inclusive=yes --threshold=100 "$work/server.out.1" 2>/dev/null |
    awk -v calls="$calls" '
        function show(label, pattern) {
            for (i = 1; i <= n; i++) if (name[i] ~ pattern) { printf "  %-58s %8.0f\n", label, cost[i] / calls; return }
        }
        $1 ~ /^[0-9,]+$/ && /\?\?\?:/ {
            c = $1; gsub(",", "", c); n++; cost[n] = c; name[n] = $0
        }
        END {
            show("the call (decision, statistics, answer)", "tollgate_server::service::grpc::should_rate_limit::\\{\\{closure")
            show("  the engine: the memory store deciding the batch", "MemoryStore as tollgate::store::Store>::apply")
            show("  the engine: the outcomes read into a decision", "tollgate::engine::decision::Plan::answer")
            show("  the engine: the rule found", "tollgate::rules::set::RuleSet::find")
            show("  the request checked", "tollgate_server::service::decide::validate")
            show("  descriptors matched, charges planned", "tollgate_server::plan::RequestCharges::new")
            show("  the answer: statuses, fields, statistics", "tollgate_server::service::grpc::respond")
            show("    the RateLimit fields", "tollgate_server::service::headers::response_headers")
            show("    the statistics", "tollgate_server::stats::Stats::record")
        }'
