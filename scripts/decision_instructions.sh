#!/usr/bin/env bash
# Counts the instructions of one in-memory decision under callgrind, tollgate's `MemoryStore`
# beside governor's keyed limiter, in the four scenarios of `bench/benches/store.rs` (one key or
# 100,000; allowed or denied), read two ways:
#
# - what each layer reads for its fields (tollgate's are on by default): tollgate's units left
#   and time to the next unit, and a denial's wait (`fields_instructions tollgate`), against
#   governor with the middleware tower_governor's `use_headers()` installs, read as that layer
#   reads it: quota and units left, and a denial's wait (`fields_instructions governor`);
# - the whole outcome (`decision_instructions tollgate`: every field, what the layer keeps in the
#   `Decision`) against governor's verdict alone (`governor`, `governor_foldhash`: `check_key`
#   read with `is_ok`, what tower_governor's layer reads without headers).
#
#   ./scripts/decision_instructions.sh
#
# Built with one codegen unit (its own target directory): with the release profile's sixteen, the
# count depends on how the compiler happens to split each example into units — governor's fields
# row read from 238 to 272 in builds whose allowed path did the same work (one moved only where
# the counting loop was written), governor's verdict 175 where one unit gives 154. One unit gives
# each limiter the compiler's whole view of the binary, and the counts stop moving with the
# layout; they repeat to a tenth of an instruction from run to run. Installs valgrind from Debian's packages
# when it is missing; the first build takes about four minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/counted.sh
need_valgrind

decisions=1000000
export CARGO_TARGET_DIR=target/one-unit CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1
cargo build --release -p tollgate-bench --example decision_instructions \
    --example fields_instructions >/dev/null 2>&1
examples=target/one-unit/release/examples

printf '| limiter, read | hot allowed | hot denied | 100k allowed | 100k denied |\n'
printf '|---|---:|---:|---:|---:|\n'
row() {
    local name=$1
    shift
    printf '| %s |' "$name"
    for keys in hot 100k; do
        for path in allowed denied; do
            printf ' %s |' "$(counted "$decisions" "$@" "$keys" "$path" "$decisions")"
        done
    done
    printf '\n'
}
row "tollgate, the layer's fields" "$examples/fields_instructions" tollgate
row "governor + foldhash, tower_governor's fields" "$examples/fields_instructions" governor
row "tollgate, the whole outcome" "$examples/decision_instructions" tollgate
row "governor + foldhash, the verdict" "$examples/decision_instructions" governor_foldhash
row "governor (SipHash), the verdict" "$examples/decision_instructions" governor
