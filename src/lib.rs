//! Rate limiting for Tower services: axum, hyper, tonic, anything that is a
//! `tower::Service<http::Request<B>>`.
//!
//! One [`RateLimitLayer`] wraps a service. For every request it finds the [`Rule`]s that apply,
//! derives each rule's [`Key`] (user id, API key, client IP, session, or one global key), charges
//! all of them in one atomic step in a [`Store`], and then forwards the request with
//! `RateLimit` / `RateLimit-Policy` fields on the response, or answers `429 Too Many Requests` with
//! `Retry-After` and a problem+json body.
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::{routing::get, Router};
//! use tollgate::{Key, Limit, RateLimitLayer};
//!
//! #[tokio::main]
//! async fn main() -> std::io::Result<()> {
//!     let app = Router::new()
//!         .route("/", get(|| async { "hello" }))
//!         .layer(RateLimitLayer::new(Limit::per_minute(60).key(Key::peer_ip())));
//!     let listener = tokio::net::TcpListener::bind("0.0.0.0:3000").await?;
//!     // Peer-IP and client-IP keys need the connection's address: serve with connect info.
//!     // Without it, requests under such a rule get a 500 and the error is logged once.
//!     axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
//! }
//! ```
//!
//! A gRPC call (`content-type: application/grpc…`) gets the same decisions in gRPC's shape: a
//! trailers-only response with `grpc-status: 8` (`RESOURCE_EXHAUSTED`), a `grpc-message` naming the
//! rules and the wait, and `grpc-retry-pushback-ms`; refusals map to their codes (see
//! [`Protocol`]). So one layer can sit on a `tonic::transport::Server`, in front of tonic services
//! and axum routes alike:
//!
//! ```
//! use tollgate::{Key, Limit, RateLimitLayer, Rule};
//!
//! let limits = RateLimitLayer::new(
//!     Rule::new("greeter", Limit::per_minute(5))
//!         .key(Key::peer_ip())
//!         .grpc("/helloworld.Greeter/*"),
//! );
//! let server = tonic::transport::Server::builder().layer(limits);
//! ```
//!
//! Cargo features: `axum` (default: axum's `ConnectInfo` as the peer address, the [`Decision`]
//! extractor), `tonic` (tonic's `TcpConnectInfo` as the peer address), `config` (rules from a TOML
//! or YAML file), `redis` (`RedisStore`).
//!
//! The way a request travels, one module per step:
//!
//! | step | module |
//! |---|---|
//! | which rules apply, with which key and cost | [`rule`](Rule), [`key`](Key), [`Cost`] |
//! | one atomic charge of every rule | [`store`] ([`MemoryStore`]) using the pure [`algorithm`]s |
//! | forward with headers, or answer 429 (HTTP) or `RESOURCE_EXHAUSTED` (gRPC) | [`RateLimit`] service, `response` |
//!
//! The README describes how to pick an algorithm, keys behind proxies, and the headers.

#![forbid(unsafe_code)]
// On docs.rs, every item that needs a feature carries a badge naming it.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod algorithm;
mod body;
mod clock;
#[cfg(feature = "config")]
pub mod config;
mod cost;
mod decision;
mod error;
mod future;
mod key;
mod layer;
mod limit;
mod limiter;
mod observe;
mod queue;
mod response;
mod rule;
mod ruleset;
mod service;
pub mod store;

pub use algorithm::{Outcome, Verdict};
pub use body::ResponseBody;
pub use clock::{Clock, ManualClock, SystemClock, TokioClock};
#[cfg(feature = "config")]
pub use config::{ConfigFileError, ConfigFormat, ConfigWatch, Plan};
pub use cost::{Cost, CostError};
pub use decision::{Decision, RuleDecision, Ruling};
pub use error::ConfigError;
pub use future::ResponseFuture;
pub use key::{CdnHeader, ClientIp, ForwardedHeader, Key, KeyValue, RequestHead, MAX_KEY_LEN};
pub use layer::{FailurePolicy, RateLimitLayer, RateLimitLayerBuilder};
pub use limit::Limit;
pub use limiter::{LimitError, Limiter, LimiterBuilder, Reservation};
pub use queue::Queue;
pub use response::grpc::{Protocol, GRPC_RETRY_PUSHBACK_MS};
pub use response::headers::{
    RATELIMIT, RATELIMIT_POLICY, TOLLGATE_DELAY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
    X_RATELIMIT_RESET,
};
pub use response::{Rejection, RejectionFn, RespondFn, QUOTA_EXCEEDED};
pub use rule::{MissingKey, Rule, RuleSummary};
pub use ruleset::AccessList;
pub use service::RateLimit;
#[cfg(feature = "redis")]
pub use store::RedisStore;
pub use store::{MemoryStore, Store};

/// The README's examples, compiled and run as doc tests so they cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
