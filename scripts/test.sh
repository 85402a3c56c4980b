#!/usr/bin/env bash
# Every check, as CI runs it: format, lints on all targets and features, all tests (unit,
# integration, examples, benches in test mode) and the doc tests.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "format"
cargo fmt --all -- --check

step "clippy (all targets, all features, warnings are errors)"
cargo clippy --all-targets --all-features -- -D warnings

step "clippy without default features"
cargo clippy --lib --no-default-features -- -D warnings

# The integration tests include the fuzz corpora's replay and the quick soak.
step "tests (lib, integration, examples, benches once each)"
cargo test --all-targets --all-features

step "doc tests"
cargo test --doc --all-features
