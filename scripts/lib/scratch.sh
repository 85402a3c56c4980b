# Sourced by the scripts that start servers (`bench_server.sh`, `limitador_bench.sh`): a scratch
# folder `$work`, and `$pids`, the processes a script starts; both are gone when it exits.
work="$(mktemp -d)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
