#!/usr/bin/env bash
# Every check, as CI runs it: format, lints on all targets and features, all tests (unit,
# integration, examples, benches in test mode) and the doc tests.
#
# The Redis store's tests run real `redis-server` and `valkey-server` processes (and `redis-cli`,
# `redis-benchmark`, `valkey-cli`), the Postgres store's a real `postgres`: they are installed
# from Debian's packages when missing, and a failed install stops here.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
apt_install() {
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@"
}

step "redis-server, redis-cli and redis-benchmark (Debian packages redis-server, redis-tools)"
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null ||
    ! command -v redis-benchmark >/dev/null; then
    if ! { $sudo apt-get update -qq && apt_install redis-server redis-tools; }; then
        echo "error: could not install redis-server and redis-tools from Debian's packages;" \
            "the Redis store's tests need them" >&2
        exit 1
    fi
fi
redis-server --version

# The Redis store's tests run once more on Valkey. Debian 12 ships it in bookworm-backports
# (later releases in main): the backports source is added when the package is not found.
step "valkey-server and valkey-cli (Debian package valkey-server; on Debian 12 from backports)"
if ! command -v valkey-server >/dev/null || ! command -v valkey-cli >/dev/null; then
    $sudo apt-get update -qq || true
    if ! apt_install valkey-server; then
        . /etc/os-release
        backports="${VERSION_CODENAME:-bookworm}-backports"
        echo "deb http://deb.debian.org/debian $backports main" |
            $sudo tee "/etc/apt/sources.list.d/$backports.list" >/dev/null
        if ! { $sudo apt-get update -qq && apt_install -t "$backports" valkey-server; }; then
            echo "error: could not install valkey-server from Debian's packages ($backports);" \
                "the Redis store's tests run on Valkey too and need it" >&2
            exit 1
        fi
    fi
fi
valkey-server --version

# The Postgres store's tests run a real `postgres` (made by `initdb` in a temporary directory).
# Debian's `postgresql` package puts both in /usr/lib/postgresql/<version>/bin, off PATH.
step "initdb and postgres (Debian package postgresql)"
pg_bin() { command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }
if ! pg_bin; then
    if ! { $sudo apt-get update -qq && apt_install postgresql; }; then
        echo "error: could not install postgresql from Debian's packages;" \
            "the Postgres store's tests need it" >&2
        exit 1
    fi
fi
"$( (command -v initdb || ls /usr/lib/postgresql/*/bin/initdb) | tail -n 1)" --version

step "format"
cargo fmt --all -- --check

step "clippy (all targets, all features, warnings are errors)"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "clippy without default features, and with only the redis, the postgres or the tonic feature"
cargo clippy -p tollgate --lib --no-default-features -- -D warnings
cargo clippy -p tollgate --lib --no-default-features --features redis -- -D warnings
cargo clippy -p tollgate --lib --no-default-features --features postgres -- -D warnings
cargo clippy -p tollgate --lib --no-default-features --features tonic -- -D warnings

step "clippy on tollgate-server's library without its service (what the tollgate command links)"
cargo clippy -p tollgate-server --lib --no-default-features -- -D warnings

# --workspace: the library, the benchmarks (bench/), the `tollgate` command (cli/) and
# `tollgate-server` (server/: its one integration-test binary runs real server processes, two of
# them on a real redis-server).
# The integration tests include the fuzz corpora's replay and the quick soak. Every example of
# examples/ is compiled into the integration tests (`#[path]`) and driven there, over a socket,
# by a real client; as programs of their own they hold no test, so they are not linked again
# here (clippy above compiles every one of them, the bench member's included). The quickstart is a
# package of its own (examples/quickstart/, so that its first build skips the dev-dependencies):
# `--bins` builds it, `tests/it/examples.rs` drives its app.
step "tests (lib, bins, integration, the examples inside them; the bench member's benches once each)"
cargo test --workspace --lib --bins --tests --benches --all-features

step "doc tests"
cargo test --workspace --doc --all-features

# The docs, every feature on, warnings (broken links, missing docs) as errors. They reuse the
# dependencies the lints checked; docs.rs's own build (`--cfg docsrs`, nightly) only adds the
# feature badges, and emulating it took a second build of every dependency.
step "docs (all features, without warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc -p tollgate --no-deps --all-features
RUSTDOCFLAGS="-D warnings" cargo doc -p tollgate-cli --no-deps
RUSTDOCFLAGS="-D warnings" cargo doc -p tollgate-server --no-deps
