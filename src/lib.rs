// The crate's front page on docs.rs: an overview, the first example and the features, linking the
// guide's chapters (`guide`), whose examples run as doc tests.
#![doc = include_str!("lib.md")]
#![forbid(unsafe_code)]
// On docs.rs, every item that needs a feature carries a badge naming it.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The root holds what a user writes in a first week; everything else is in the module of its
// stage (ARCHITECTURE.md), one path per item.
pub mod algorithm;
pub mod clock;
#[cfg(feature = "config")]
pub mod config;
pub mod engine;
// The guide's chapters on docs.rs (`tollgate::guide::…`): pages of markdown only, built by rustdoc
// and run as doc tests, never compiled into a program.
#[cfg(any(doc, doctest))]
pub mod guide;
pub mod key;
pub mod middleware;
mod observe;
mod response;
pub mod rules;
pub mod store;

/// The Redis store's fast-path scripts, for the workspace's Redis bench alone (feature `bench`):
/// it sends them to Redis directly, as they are and with one line changed, to measure what each
/// guarantee costs. The text comes from here rather than from the bench compiling the store's
/// script module itself, so that the library's files are compiled by the library only and the
/// bench still measures exactly the scripts the store sends. Not part of the API.
#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod __bench {
    /// A token bucket's charge of one key on the server's time.
    pub const BUCKET_NOW: &str = crate::store::redis::BUCKET_NOW;
    /// A fixed window's charge of one key.
    pub const FIXED: &str = crate::store::redis::FIXED;
    /// A sliding window's charge of one key.
    pub const SLIDING: &str = crate::store::redis::SLIDING;
}

pub use algorithm::error::ConfigError;
pub use algorithm::limit::Limit;
pub use algorithm::penalty::Penalty;
pub use engine::decision::Decision;
pub use engine::limiter::{LimitError, Limiter};
pub use key::client_ip::ClientIp;
pub use key::extract::Key;
pub use middleware::layer::{RateLimitLayer, RateLimitLayerBuilder};
pub use rules::cost::Cost;
pub use rules::queue::Queue;
pub use rules::rule::{MissingKey, Rule};
pub use rules::set::AccessList;
pub use rules::settle::{CountIf, Settle};
pub use store::failure::FailurePolicy;
pub use store::memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use store::postgres::PostgresStore;
#[cfg(feature = "redis")]
pub use store::redis::RedisStore;

/// The names of the fields and values the layer writes: the `RateLimit` fields of
/// draft-ietf-httpapi-ratelimit-headers, the legacy `X-RateLimit-*` ones, gRPC's pushback, and the
/// problem type of a refusal.
pub mod headers {
    pub use crate::response::grpc::GRPC_RETRY_PUSHBACK_MS;
    pub use crate::response::headers::{
        RATELIMIT, RATELIMIT_POLICY, TOLLGATE_DELAY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
        X_RATELIMIT_RESET,
    };
    pub use crate::response::QUOTA_EXCEEDED;
}

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
