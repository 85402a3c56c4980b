//! The Redis store against real servers on loopback ports, once per engine: `redis::…` runs
//! `redis-server`, `valkey::…` runs `valkey-server` (`cargo test --test redis_store valkey`
//! selects Valkey's). One server, a Cluster, concurrency leases, quota leases, per-request limits,
//! per-key overrides, and the differential tests that keep the Lua script equal to the memory
//! store.

// The same test files are loaded once per engine, on purpose.
#![allow(clippy::duplicate_mod)]

use tollgate_test_support as support;

/// The differential tests' scenarios: the same requests on the memory store and on Redis.
use tollgate_test_support::differential;

/// The suite on `redis-server`.
#[path = "."]
mod redis {
    /// The engine this copy of the suite runs on.
    const ENGINE: crate::support::redis_server::Engine =
        crate::support::redis_server::Engine::Redis;

    mod blocks;
    mod cluster;
    mod concurrency;
    mod lease;
    mod overrides;
    mod per_request;
    mod sentinel;
    mod single;
    mod tls;
}

/// The same suite on `valkey-server` (Valkey 8, Debian's bookworm-backports).
#[path = "."]
mod valkey {
    /// The engine this copy of the suite runs on.
    const ENGINE: crate::support::redis_server::Engine =
        crate::support::redis_server::Engine::Valkey;

    mod blocks;
    mod cluster;
    mod concurrency;
    mod lease;
    mod overrides;
    mod per_request;
    mod sentinel;
    mod single;
    mod tls;
}
