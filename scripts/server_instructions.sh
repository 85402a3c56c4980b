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
# Installs valgrind and h2load (nghttp2-client) from Debian's packages when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
calls="${1:-20000}"

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
for tool in valgrind:valgrind h2load:nghttp2-client; do
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
load() { # port calls
    h2load -n "$2" -c 4 -m 16 -H 'content-type: application/grpc' -H 'te: trailers' \
        -d "$work/body.bin" "http://127.0.0.1:$1$path" >"$work/h2load.out"
    if ! grep -q "status codes: $2 2xx" "$work/h2load.out"; then
        cat "$work/h2load.out" >&2
        echo "error: not every call was answered with 200" >&2
        exit 1
    fi
}
# Runs one server under callgrind: unmeasured calls, the counters zeroed, the measured calls,
# the counters dumped.
measure() { # name port command...
    local name="$1" port="$2"
    shift 2
    valgrind --tool=callgrind --callgrind-out-file="$work/$name.out" "$@" >/dev/null 2>&1 &
    server=$!
    for _ in $(seq 300); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
        sleep 0.2
    done
    load "$port" $((calls / 10))
    callgrind_control -z "$server" >/dev/null 2>&1
    load "$port" "$calls"
    callgrind_control -d "$server" >/dev/null 2>&1
    # The dump is written when callgrind_control returns; the server is no longer needed.
    kill -9 "$server"
    wait "$server" 2>/dev/null || true
    server=""
}

measure floor 18191 target/release/examples/constant_answer 127.0.0.1:18191
measure server 18181 target/release/tollgate-server --config "$work/bench.yaml" \
    --grpc-addr 127.0.0.1:18181 --http-addr 127.0.0.1:18180

total() { callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'; }
floor=$(total "$work/floor.out.1")
tollgate=$(total "$work/server.out.1")
echo "h2load -n $calls -c 4 -m 16 (64 concurrent streams), one pre-encoded ShouldRateLimit"
printf '| server | instructions per call | vs floor |\n|---|---:|---:|\n'
printf '| floor (constant answer) | %d | 100 %% |\n' $((floor / calls))
printf '| tollgate-server, memory store | %d | %d %% |\n' $((tollgate / calls)) \
    $((100 * tollgate / floor))
printf 'calls per CPU-second, tollgate-server against the floor: %d %%\n' $((100 * floor / tollgate))

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
            show("the call (decision, statistics, answer)", "ShouldRateLimit as tonic::server::service::UnaryService.*call::\\{\\{closure")
            show("  the engine: the memory store deciding the batch", "MemoryStore as tollgate::store::Store>::apply")
            show("  the engine: the outcomes read into a decision", "tollgate::engine::decision::Decision::answer")
            show("  the engine: the rule found", "tollgate::rules::set::RuleSet::find")
            show("  the request checked", "tollgate_server::service::decide::validate")
            show("  descriptors matched, charges planned", "tollgate_server::plan::Plan::new")
            show("  the answer: statuses, fields, statistics", "tollgate_server::service::grpc::respond")
            show("    the RateLimit fields", "tollgate_server::service::headers::response_headers")
            show("    the statistics", "tollgate_server::service::stats::Stats::record")
        }'
