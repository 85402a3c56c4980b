#!/usr/bin/env bash
# tollgate-server against limitador-server (Kuadrant's rate-limit service for Envoy, in Rust), in
# the same run on this machine: the benchmark's request (scripts/server_request.sh) over h2c at 64
# concurrent streams, memory storage on both sides, one limit on remote_address. Two cases:
# every call allowed (1,000,000,000 per second) and every call denied (10 per hour). Not a test:
# figures for BENCHMARKS.md.
#
#   LIMITADOR_SRC=path/to/limitador ./scripts/limitador_bench.sh [CALLS] [ROUNDS]
#       (default 200000 calls per round, 4 rounds; BUSY=N runs N busy loops beside the servers,
#       for the "machine busy" rows; STORE=redis keeps both servers' counts in one redis-server
#       started here; LIMITADOR_BIN=path uses a limitador-server built already)
#
# LIMITADOR_SRC is a local copy (a clone) of github.com/Kuadrant/limitador. It is copied into
# target/limitador, bench/limitador-redis-only.patch is applied (what it changes and why is at the
# top of that file: the Redis storage only, no RocksDB), and limitador-server is built with the
# upstream release profile. The first build takes about ten minutes on two cores.
#
# Per round, the servers alternate (allowed, then denied; which server goes first alternates
# too), each started fresh and warmed up with a tenth of the calls. FLOOR=1 adds the protocol's
# floor (server/examples/constant_answer.rs, a tonic server answering a constant) to the allowed
# rounds, for its system time per call beside tollgate-server's. Printed per server and case: calls
# per second, p50 and p99 latency (h2load's per-request log), and the server's user and system
# CPU time per call (from /proc: what the kernel does for each answer shows in the system time),
# then the medians over the rounds. With INSTRUCTIONS=1, first the user-space instructions per
# call under callgrind (20,000 calls after 2,000), which the machine's load cannot move; with
# SYSCALLS=1, the system calls and context switches per call (perf stat).
#
# Installs h2load (nghttp2-client), curl, protoc (protobuf-compiler: limitador's build needs it),
# libssl-dev, valgrind and perf (linux-perf) from Debian's packages when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
calls="${1:-200000}"
rounds="${2:-4}"
busy="${BUSY:-0}"

if [ -z "${LIMITADOR_BIN:-}" ] &&
    { [ -z "${LIMITADOR_SRC:-}" ] || [ ! -f "$LIMITADOR_SRC/limitador-server/Cargo.toml" ]; }; then
    echo "error: LIMITADOR_SRC must name a copy of github.com/Kuadrant/limitador" >&2
    exit 1
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
for tool in h2load:nghttp2-client protoc:protobuf-compiler valgrind:valgrind curl:curl perf:linux-perf; do
    if ! command -v "${tool%%:*}" >/dev/null; then
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${tool##*:}" >/dev/null
    fi
done
if ! dpkg -s libssl-dev >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq libssl-dev pkg-config >/dev/null
fi

# limitador-server: the copy is refreshed when the source differs, and built once (or
# LIMITADOR_BIN names a limitador-server built this way already).
copy=target/limitador
limitador="${LIMITADOR_BIN:-$copy/target/release/limitador-server}"
if [ -z "${LIMITADOR_BIN:-}" ] && ! diff -rq -x target -x .git "$LIMITADOR_SRC" "$copy.src" >/dev/null 2>&1; then
    rm -rf "$copy" "$copy.src"
    mkdir -p "$copy" "$copy.src"
    tar -C "$LIMITADOR_SRC" --exclude=./target --exclude=./.git -cf - . | tar -C "$copy.src" -xf -
    tar -C "$copy.src" -cf - . | tar -C "$copy" -xf -
    patch -d "$copy" -p1 -s <bench/limitador-redis-only.patch
fi
if [ -z "${LIMITADOR_BIN:-}" ]; then
    cargo build --release -q --manifest-path "$copy/limitador-server/Cargo.toml"
fi
cargo build --release -q -p tollgate-server --bin tollgate-server --example constant_answer

. scripts/lib/scratch.sh

# The request, and tollgate-server's limit (bench.yaml); the denied case and limitador's limits
# are the same limits written for each.
. scripts/server_request.sh
sed 's/unit: second, requests_per_unit: 1000000000/unit: hour, requests_per_unit: 10/' \
    "$work/bench.yaml" >"$work/denied.yaml"
limitador_limits() { # max_value seconds
    cat <<YAML
- namespace: bench
  max_value: $1
  seconds: $2
  conditions: []
  variables: ["descriptors[0]['remote_address']"]
YAML
}
limitador_limits 1000000000 1 >"$work/allowed-limitador.yaml"
limitador_limits 10 3600 >"$work/denied-limitador.yaml"

# STORE=redis: both servers keep their counts in one redis-server started here (emptied before
# each server starts), tollgate-server from a tollgate file with the same limits.
store="${STORE:-memory}"
limitador_storage=(memory)
if [ "$store" = redis ]; then
    redis_port=18379
    redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
        --daemonize no >"$work/redis.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do
        if redis-cli -p "$redis_port" ping >/dev/null 2>&1; then break; fi
        sleep 0.1
    done
    limitador_storage=(redis "redis://127.0.0.1:$redis_port")
    redis_limit_file "$redis_port" 1000000000 1s >"$work/bench.toml"
    redis_limit_file "$redis_port" 10 1h >"$work/denied.toml"
fi

start() { # server case port
    case "$1" in
    tollgate-server)
        local file="$work/bench.yaml"
        if [ "$2" = denied ]; then file="$work/denied.yaml"; fi
        if [ "$store" = redis ]; then
            redis-cli -p "$redis_port" FLUSHALL >/dev/null
            file="${file%.yaml}.toml"
        fi
        target/release/tollgate-server --config "$file" --grpc-addr "127.0.0.1:$3" \
            --http-addr "127.0.0.1:$(($3 + 1))" 2>"$work/server.log" &
        ;;
    limitador-server)
        if [ "$store" = redis ]; then redis-cli -p "$redis_port" FLUSHALL >/dev/null; fi
        "$limitador" --rls-ip 127.0.0.1 --rls-port "$3" --http-ip 127.0.0.1 \
            --http-port "$(($3 + 1))" "$work/$2-limitador.yaml" "${limitador_storage[@]}" \
            2>"$work/server.log" >/dev/null &
        ;;
    floor)
        target/release/examples/constant_answer "127.0.0.1:$3" 2>"$work/server.log" &
        ;;
    esac
    server=$!
    pids+=("$server")
    for _ in $(seq 300); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$3") 2>/dev/null; then return; fi
        sleep 0.1
    done
    cat "$work/server.log" >&2
    echo "error: $1 did not start" >&2
    exit 1
}
stop() {
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
}

path=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
load() { # port calls [log]
    h2load -n "$2" -c 4 -m 16 ${3:+--log-file="$3"} \
        -H 'content-type: application/grpc' -H 'te: trailers' \
        -d "$work/body.bin" "http://127.0.0.1:$1$path" >"$work/h2load.out"
    if ! grep -q "status codes: $2 2xx" "$work/h2load.out"; then
        cat "$work/h2load.out" >&2
        echo "error: not every call was answered with 200" >&2
        exit 1
    fi
}
# Each server's answer is checked after its warm-up: OK when allowed, OVER_LIMIT when denied (grpcurl-free: the
# answer's first field is the overall code, 1 OK or 2 OVER_LIMIT, as bytes 0x08 0x01/0x02 after
# the 5-byte gRPC frame header).
check_answer() { # port case
    local want=01
    if [ "$2" = denied ]; then want=02; fi
    local got
    got="$(curl -s --http2-prior-knowledge -H 'content-type: application/grpc' -H 'te: trailers' \
        --data-binary @"$work/body.bin" "http://127.0.0.1:$1$path" | od -An -tx1 -j5 -N2 | tr -d ' ')"
    if [ "$got" != "08$want" ]; then
        echo "error: expected answer code $want on port $1, got '$got'" >&2
        exit 1
    fi
}

busy_pids=()
for _ in $(seq "$busy"); do
    sh -c 'while :; do :; done' &
    busy_pids+=($!)
    pids+=($!)
done

if [ "${INSTRUCTIONS:-0}" = 1 ]; then
    echo "user-space instructions per call (callgrind, 20,000 calls after 2,000)"
    for case in allowed denied; do
        for name in tollgate-server limitador-server; do
            port=18301
            case "$name" in
            tollgate-server)
                file="$work/bench.yaml"
                if [ "$case" = denied ]; then file="$work/denied.yaml"; fi
                valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
                    target/release/tollgate-server --config "$file" \
                    --grpc-addr "127.0.0.1:$port" --http-addr "127.0.0.1:$((port + 1))" \
                    >/dev/null 2>&1 &
                ;;
            limitador-server)
                valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" "$limitador" \
                    --rls-ip 127.0.0.1 --rls-port "$port" --http-ip 127.0.0.1 \
                    --http-port "$((port + 1))" "$work/$case-limitador.yaml" memory \
                    >/dev/null 2>&1 &
                ;;
            esac
            server=$!
            pids+=("$server")
            for _ in $(seq 600); do
                if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
                sleep 0.2
            done
            load "$port" 2000
            callgrind_control -z "$server" >/dev/null 2>&1
            load "$port" 20000
            callgrind_control -d "$server" >/dev/null 2>&1
            kill -9 "$server"
            wait "$server" 2>/dev/null || true
            total="$(callgrind_annotate "$work/cg.out.1" 2>/dev/null |
                awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')"
            printf '  %-16s %-8s %8d\n' "$name" "$case" $((total / 20000))
            rm -f "$work"/cg.out*
        done
    done
    echo
fi

if [ "${SYSCALLS:-0}" = 1 ]; then
    # What the kernel is asked per call: system calls and context switches of each server, and
    # of the protocol's floor (server/examples/constant_answer.rs: tonic's defaults), over 40,000
    # allowed calls (perf's syscall tracepoints; perf from Debian's linux-perf).
    events=syscalls:sys_enter_writev,syscalls:sys_enter_recvfrom,syscalls:sys_enter_futex
    events="$events,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_sched_yield,context-switches"
    echo "per 1,000 calls (perf stat over 40,000 allowed calls)"
    printf '  %-16s %8s %9s %7s %11s %12s %17s\n' server writev recvfrom futex epoll_wait \
        sched_yield context-switches
    for name in floor tollgate-server limitador-server; do
        start "$name" allowed 18251
        load 18251 4000
        perf stat -x, -e "$events" -p "$server" -o "$work/perf.csv" &
        perf=$!
        sleep 0.5
        load 18251 40000
        kill -INT "$perf"
        wait "$perf" 2>/dev/null || true
        stop
        awk -F, -v s="$name" '$3 != "" { v[$3] = $1 } END {
            printf "  %-16s %8.0f %9.0f %7.0f %11.0f %12.0f %17.0f\n", s,
                v["syscalls:sys_enter_writev"] / 40, v["syscalls:sys_enter_recvfrom"] / 40,
                v["syscalls:sys_enter_futex"] / 40, v["syscalls:sys_enter_epoll_wait"] / 40,
                v["syscalls:sys_enter_sched_yield"] / 40, v["context-switches"] / 40 }' \
            "$work/perf.csv"
    done
    echo
fi

if [ "$rounds" = 0 ]; then exit 0; fi
tick="$(getconf CLK_TCK)"
cpu() { awk '{ print $14, $15 }' "/proc/$1/stat"; }
echo "h2load -n $calls -c 4 -m 16 (64 concurrent streams), $rounds rounds, store: $store," \
    "busy loops: $busy," \
    "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-5s %-16s %-8s %12s %9s %9s %12s %12s\n' round server case "calls/s" "p50 us" \
    "p99 us" "user us/call" "sys us/call"
# Each round and case alternates which server goes first: on this machine a run's tail latency
# drifts with time (both servers' p99 fell round after round in one run), so a fixed order would
# give the second server the better tail.
order() { # round case
    if [ $((($1 + $2) % 2)) -eq 1 ]; then
        echo tollgate-server limitador-server
    else
        echo limitador-server tollgate-server
    fi
    if [ "${FLOOR:-0}" = 1 ] && [ "$2" = 0 ]; then echo floor; fi
}
for round in $(seq "$rounds"); do
    for case in allowed denied; do
        for name in $(order "$round" "$([ "$case" = allowed ] && echo 0 || echo 1)"); do
            port=18201
            start "$name" "$case" "$port"
            load "$port" $((calls / 10))
            check_answer "$port" "$case"
            read -r user0 sys0 < <(cpu "$server")
            load "$port" "$calls" "$work/latency.log"
            read -r user1 sys1 < <(cpu "$server")
            stop
            rps="$(grep -oE 'finished in [0-9.]+[a-z]+, [0-9.]+ req/s' "$work/h2load.out" |
                grep -oE '[0-9.]+ req/s' | cut -d' ' -f1)"
            read -r p50 p99 < <(cut -f3 "$work/latency.log" | sort -n | awk '{ v[NR] = $1 }
                END { printf "%d %d\n", v[int(NR * 0.50)], v[int(NR * 0.99)] }')
            user=$(awk -v t="$((user1 - user0))" -v k="$tick" -v n="$calls" \
                'BEGIN { printf "%.2f", t / k * 1e6 / n }')
            sys=$(awk -v t="$((sys1 - sys0))" -v k="$tick" -v n="$calls" \
                'BEGIN { printf "%.2f", t / k * 1e6 / n }')
            printf '%-5s %-16s %-8s %12.0f %9d %9d %12s %12s\n' "$round" "$name" "$case" "$rps" \
                "$p50" "$p99" "$user" "$sys" | tee -a "$work/rows"
        done
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "medians over the rounds"
printf '%-16s %-8s %12s %9s %9s %12s %12s\n' server case "calls/s" "p50 us" "p99 us" \
    "user us/call" "sys us/call"
for case in allowed denied; do
    for name in tollgate-server limitador-server floor; do
        if ! awk -v s="$name" -v c="$case" '$2 == s && $3 == c { found = 1 } END { exit !found }' \
            "$work/rows"; then
            continue
        fi
        awk -v s="$name" -v c="$case" '$2 == s && $3 == c' "$work/rows" |
            awk -v s="$name" -v c="$case" '
                { for (i = 4; i <= 8; i++) v[i, NR] = $i; n = NR }
                function median(i,   a, j, k, t) {
                    for (j = 1; j <= n; j++) a[j] = v[i, j]
                    for (j = 1; j <= n; j++) for (k = j + 1; k <= n; k++)
                        if (a[k] + 0 < a[j] + 0) { t = a[j]; a[j] = a[k]; a[k] = t }
                    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
                }
                END { printf "%-16s %-8s %12.0f %9.0f %9.0f %12.2f %12.2f\n", s, c,
                    median(4), median(5), median(6), median(7), median(8) }'
    done
done
