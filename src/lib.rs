// The crate's front page on docs.rs is its guide: how to pick an algorithm, keys behind proxies,
// the headers, queue mode, gRPC, Redis and the configuration file, with examples that run as doc
// tests.
#![doc = include_str!("lib.md")]
#![forbid(unsafe_code)]
// On docs.rs, every item that needs a feature carries a badge naming it.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod algorithm;
mod clock;
#[cfg(feature = "config")]
pub mod config;
mod engine;
mod key;
mod middleware;
mod observe;
mod response;
mod rules;
pub mod store;

pub use algorithm::error::ConfigError;
pub use algorithm::Limit;
pub use algorithm::{Outcome, Penalty, Verdict};
pub use clock::{Clock, ManualClock, SystemClock, TokioClock};
#[cfg(feature = "config")]
pub use config::{ConfigFileError, ConfigFormat, ConfigWatch, Plan};
pub use engine::decision::{Decision, RuleDecision, Ruling};
pub use engine::limiter::{LimitError, Limiter, LimiterBuilder, Reservation};
pub use engine::slot::SlotGuard;
pub use key::protocol::Protocol;
pub use key::{CdnHeader, ClientIp, ForwardedHeader, Key, KeyValue, RequestHead, MAX_KEY_LEN};
pub use middleware::body::ResponseBody;
pub use middleware::future::ResponseFuture;
pub use middleware::layer::{RateLimitLayer, RateLimitLayerBuilder};
pub use middleware::service::RateLimit;
pub use observe::offenders::{Offender, TopOffenders};
pub use response::grpc::GRPC_RETRY_PUSHBACK_MS;
pub use response::headers::{
    RATELIMIT, RATELIMIT_POLICY, TOLLGATE_DELAY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
    X_RATELIMIT_RESET,
};
pub use response::{Rejection, RespondFn, QUOTA_EXCEEDED};
pub use rules::cost::{Cost, CostError};
pub use rules::per_request::LimitResolver;
pub use rules::queue::Queue;
pub use rules::rule::{MissingKey, Rule, RuleSummary};
pub use rules::set::AccessList;
pub use rules::settle::{CountIf, ResponseHead, Settle};
#[cfg(feature = "redis")]
pub use store::RedisStore;
pub use store::{CircuitBreaker, FailurePolicy, MemoryStore, Store};

/// The README's examples, compiled and run as doc tests so they cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
