//! The rules: what each [`Rule`](crate::Rule) counts (its limit, key, cost and scope; queue,
//! penalty, count-if, settle and per-request limits), and the `RuleSet` in force —
//! the compiled rules and the allow and deny lists — which routes a request to its plan: which
//! rules apply, with which keys and costs.
//!
//! It reads the algorithms and the request's head (keys); it never touches stores, the engine,
//! responses or Tower.
//!
//! [`Rule`](crate::Rule) and what a rule says in its first week ([`Cost`](crate::Cost),
//! [`Queue`](crate::Queue), [`MissingKey`](crate::MissingKey), [`CountIf`](crate::CountIf),
//! [`Settle`](crate::Settle), [`AccessList`](crate::AccessList)) are at the crate's root; this
//! module holds the rest: a rule's summary, per-request limits, the response head that settling
//! reads, and the error of a cost that cannot be read.

pub(crate) mod cost;
pub(crate) mod path;
pub(crate) mod per_request;
pub(crate) mod queue;
pub(crate) mod rule;
pub(crate) mod set;
pub(crate) mod settle;

pub use cost::CostError;
pub use per_request::LimitResolver;
pub use rule::RuleSummary;
pub use settle::ResponseHead;
