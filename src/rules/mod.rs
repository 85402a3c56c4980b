//! The rules: what each [`Rule`](rule::Rule) counts (its limit, key, cost and scope; queue,
//! penalty, count-if, settle and per-request limits), and the [`RuleSet`](set::RuleSet) in force —
//! the compiled rules and the allow and deny lists — which routes a request to its plan: which
//! rules apply, with which keys and costs.
//!
//! It reads the algorithms and the request's head (keys); it never touches stores, the engine,
//! responses or Tower.

pub(crate) mod cost;
pub(crate) mod per_request;
pub(crate) mod queue;
pub(crate) mod rule;
pub(crate) mod set;
pub(crate) mod settle;
