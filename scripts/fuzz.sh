#!/usr/bin/env bash
# Fuzzes one target for a bounded time: ./scripts/fuzz.sh TARGET SECONDS
#
# TARGET is keys, config or request (fuzz/fuzz_targets/). Installs cargo-fuzz if it is missing.
# cargo-fuzz needs nightly-only flags; RUSTC_BOOTSTRAP=1 lets a stable toolchain accept them.
# Debug assertions (and so overflow checks) are on. The committed seeds in fuzz/corpus/TARGET are
# read but never written: new inputs go to fuzz/target/corpus/TARGET, crashes to
# fuzz/artifacts/TARGET. To keep a crash as a regression input, fix it, then copy the file into
# fuzz/corpus/TARGET (`cargo test --test it fuzz_corpus` replays it from then on).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -ne 2 ]; then
    echo "usage: $0 TARGET SECONDS   (targets: keys, config, request)" >&2
    exit 2
fi
target=$1
seconds=$2

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

scratch=fuzz/target/corpus/$target
mkdir -p "$scratch"
RUSTC_BOOTSTRAP=1 cargo fuzz run --debug-assertions "$target" "$scratch" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=16384
