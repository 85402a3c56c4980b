# Sourced by scripts/bench_server.sh, scripts/limitador_bench.sh and scripts/server_instructions.sh:
# the benchmark's one limit and one request, written into the directory "$work"; and
# `redis_limit_file`, the same limit in a tollgate file whose counts are in Redis.
#
# The limit: domain "bench", one descriptor remote_address, 1,000,000,000 a second (a reference
# fixed window, so every call is charged and allowed: the whole decision, never a shortcut).
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

# The benchmark's limit as a tollgate file with the Redis store at port $1: LIMIT per PERIOD ($2,
# $3; an aligned fixed window, as the reference's own).
redis_limit_file() { # port limit period
    cat <<TOML
domain = "bench"

[store]
kind = "redis"
url = "redis://127.0.0.1:$1"

[[rules]]
name = "bench.remote_address"
algorithm = "fixed_window"
limit = $2
period = "$3"
aligned = true
descriptors = [{ key = "remote_address" }]
TOML
}
