#!/usr/bin/env bash
# What tollgate's guarantees and features cost, measured by taking each out of a scratch copy of
# the tree and counting instructions under callgrind (bench/NOTES.md, "What the fields row's gap
# is"; BENCHMARKS.md quotes the totals). The patches in `bench/experiments/` each remove one; none of them is fit to ship:
#
#   without-span        bucket entries hold only the empty moment: the store can no longer tell
#                       when a key is full again, so it cannot forget it
#   without-saturation  plain additions and multiplications in the token bucket (wrong at absurd
#                       times or limits); the floors stay
#   without-clock       the counter's time as read, not held to the latest handed out
#   without-digest      the key's hash without its rule's digest (one store for all rules' keys)
#   without-reset-field the memory decision read for what tower_governor's fields carry (limit
#                       and units left, or limit and wait), not for `RateLimit`'s `t` (seconds
#                       until more quota), which tollgate's layer writes on every response
#   without-response-body  the inner body passed through: no concurrency slot or gRPC settlement
#                       held to the body's end (the layer's own 429s need a body type that takes
#                       `Bytes`)
#   without-text-key    the peer-IP key as the address's four bytes, not its text: a key would no
#                       longer read the same in every store, in the logs and the offender lists
#   without-meters      no per-rule counters (and no events) for allowed requests
#   without-reload      the rules the layer was built with, never replaced by a reload
#   without-routing     the first rule alone: no allow or deny lists, scopes, costs, shadow rules
#                       or gRPC method
#   without-plan        no plan: the first rule's key goes straight to the store and an allowed
#                       request straight to the inner service (several rules could no longer be
#                       decided in one step, nor a `Decision` made); applies on top of all the
#                       patches above, so it is counted in the last row only
#
# Memory decisions are counted as `./scripts/decision_instructions.sh` counts them (one codegen
# unit, hot key); requests in process as `./scripts/layer_instructions.sh` does (the release
# profile). The patches apply to the commit they were made at and fail loudly on a tree that has
# moved on. Takes about a quarter of an hour: every variant is a build of its own.
#
#   ./scripts/guarantee_costs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/counted.sh
need_valgrind

root=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A copy of the committed tree with the named patches applied.
tree() {
    rm -rf "$work/tree"
    mkdir "$work/tree"
    git archive HEAD | tar -x -C "$work/tree"
    # `git archive` dates every file at the commit: older than a build of another variant left
    # in the target directory, which cargo would then take for this tree's. Dated now, each
    # variant is built from its own sources.
    find "$work/tree" -type f -exec touch {} +
    local patch
    for patch in "$@"; do
        (cd "$work/tree" && git apply "$root/bench/experiments/without-$patch.patch")
    done
}

# One row of the memory-decision table: the limiter `fields` read for its fields, then `whole`
# (the whole outcome, or governor's verdict), allowed and denied, hot key.
decision_row() {
    local name=$1 fields=$2 whole=$3 path
    local examples="$root/target/experiments-one-unit/release/examples"
    printf '| %s |' "$name"
    for path in allowed denied; do
        printf ' %s |' "$(counted 1000000 "$examples/fields_instructions" "$fields" hot "$path" 1000000)"
    done
    for path in allowed denied; do
        printf ' %s |' "$(counted 1000000 "$examples/decision_instructions" "$whole" hot "$path" 1000000)"
    done
    printf '\n'
}

printf '| memory decision, one codegen unit, hot key | fields, allowed | fields, denied | whole, allowed | whole, denied |\n'
printf '|---|---:|---:|---:|---:|\n'
for variant in "" span saturation clock digest "span saturation clock digest" reset-field \
    "span saturation clock digest reset-field"; do
    # shellcheck disable=SC2086
    tree $variant
    (cd "$work/tree" && CARGO_TARGET_DIR="$root/target/experiments-one-unit" \
        CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 cargo build --release -p tollgate-bench \
        --example fields_instructions --example decision_instructions >/dev/null 2>&1)
    decision_row "${variant:-as committed}" tollgate tollgate
    if [ -z "$variant" ]; then
        # The peer, from the same build: its fields, then its verdict alone.
        decision_row "governor + foldhash" governor governor_foldhash
    fi
done

printf '\n| in process, release profile | bare axum | fields off | fields off, no `Decision` in the extensions | fields on | fields on, no `Decision` |\n'
printf '|---|---:|---:|---:|---:|---:|\n'
layer_features="text-key meters reload routing"
for variant in "" response-body "span saturation clock digest" \
    "response-body span saturation clock digest" text-key meters reload routing \
    "response-body span saturation clock digest $layer_features" \
    "response-body span saturation clock digest $layer_features plan"; do
    # shellcheck disable=SC2086
    tree $variant
    (cd "$work/tree" && CARGO_TARGET_DIR="$root/target/experiments" cargo build --release \
        -p tollgate-bench --example layer_instructions >/dev/null 2>&1)
    layer="$root/target/experiments/release/examples/layer_instructions"
    printf '| %s |' "${variant:-as committed}"
    for server in bare tollgate-allowed-noheaders tollgate-allowed-nothing \
        tollgate-allowed-headers tollgate-allowed-headers-nodecision; do
        printf ' %s |' "$(counted 20000 "$layer" "$server" 20000)"
    done
    printf '\n'
    if [ -z "$variant" ]; then
        # The peer, from the same build: its rows have no `Decision` to leave out.
        printf '| tower_governor | %s | %s | | %s | |\n' "$(counted 20000 "$layer" bare 20000)" \
            "$(counted 20000 "$layer" tower_governor-allowed 20000)" \
            "$(counted 20000 "$layer" tower_governor-allowed-headers 20000)"
    fi
done
