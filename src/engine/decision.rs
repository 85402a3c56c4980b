//! `Decision`: what the limiter decided for one request, for headers and for handlers.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use http::StatusCode;

use crate::algorithm::{Limit, Outcome, Verdict};
use crate::key::KeyValue;
use crate::rules::per_request::Applied;
use crate::rules::set::{Charges, Refusal};
use crate::store::{Outcomes, StoreError, StoreErrorKind};

/// What the limiter decided for a request: one entry per rule that applied.
///
/// The middleware puts it in an allowed request's extensions, so a handler can read it (with axum,
/// take `Decision` as an extractor, or `Extension<Decision>`), unless the layer was built with
/// [`decision_in_extensions(false)`](crate::RateLimitLayerBuilder::decision_in_extensions).
#[derive(Clone, Default)]
pub struct Decision {
    /// The plan the engine charged, answered: the answer is the plan itself, wrapped, so the
    /// middleware fills a decision's plan where the decision lies and moves it once, into the
    /// request's extensions (no entry is copied or converted on the way).
    pub(crate) plan: Plan,
}

/// A request's charges as its rules planned them: what the engine asks the store for
/// (`RuleSet::ask`), and where the store's outcomes are filled in. Only the engine writes it; a
/// handler reads it answered, as a [`Decision`].
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    // One entry inline: most requests meet one rule, and the decision is copied into the request's
    // extensions on every request, so each inline entry costs every request its 176 bytes.
    rules: SmallVec<[RuleDecision; 1]>,
    /// The gRPC method called (`/package.Service/Method`), for gRPC requests.
    grpc_method: Option<Arc<str>>,
}

impl std::fmt::Debug for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // As it read before the plan had a type of its own: the rules and the method.
        f.debug_struct("Decision")
            .field("rules", &self.plan.rules)
            .field("grpc_method", &self.plan.grpc_method)
            .finish()
    }
}

impl From<Plan> for Decision {
    #[inline]
    fn from(plan: Plan) -> Self {
        Decision { plan }
    }
}

/// A planned charge's outcome until the store answers; never seen outside the crate.
const PENDING: Outcome = Outcome::new(Verdict::Allowed, 0, 0);

/// One rule's part of a [`Decision`].
// Non-exhaustive: the middleware builds these; a field handlers read later is an addition.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RuleDecision {
    pub(crate) rule: Arc<str>,
    /// What the rule decided, with the numbers the headers carry.
    pub outcome: Outcome,
    /// The key the rule charged (e.g. to refund it later with the [`Limiter`](crate::Limiter)).
    pub key: KeyValue,
    /// The units the rule charged.
    pub cost: u64,
    pub(crate) index: usize,
    /// The limit this request was charged under, when the rule takes it from the request.
    pub(crate) applied: Option<Applied>,
}

impl RuleDecision {
    /// The rule's name.
    pub fn rule(&self) -> &str {
        &self.rule
    }
}

impl Plan {
    /// Adds a rule's charge; its outcome is filled in by [`Plan::answer`]. (The middleware
    /// builds the decision in place as the request goes through — rules, then the store — so it
    /// is moved once, into the request's extensions.)
    #[inline]
    pub(crate) fn add_charge(
        &mut self,
        index: usize,
        rule: Arc<str>,
        key: KeyValue,
        cost: u64,
        applied: Option<Applied>,
    ) {
        self.rules.push(RuleDecision {
            rule,
            outcome: PENDING,
            key,
            cost,
            index,
            applied,
        });
    }

    /// The planned charges, mutably (to replace a per-request limit that cannot work).
    pub(crate) fn rules_mut(&mut self) -> &mut [RuleDecision] {
        &mut self.rules
    }

    /// Keeps only the entries `keep` accepts.
    pub(crate) fn retain(&mut self, keep: impl FnMut(&mut RuleDecision) -> bool) {
        self.rules.retain(keep);
    }

    /// Whether some rule's limit came from the request.
    #[inline]
    pub(crate) fn has_applied(&self) -> bool {
        self.rules
            .iter()
            .any(|r| r.applied.is_some() || r.override_limit().is_some())
    }

    /// Every planned charge, in the layer's order.
    #[inline]
    pub(crate) fn rules(&self) -> &[RuleDecision] {
        &self.rules
    }

    /// The gRPC method the request calls, for gRPC requests.
    #[inline]
    pub(crate) fn grpc_method(&self) -> Option<&str> {
        self.grpc_method.as_deref()
    }

    /// Fills in the store's outcomes, one per planned charge, in order.
    pub(crate) fn answer(&mut self, outcomes: Outcomes) -> Result<(), StoreError> {
        if outcomes.len() != self.rules.len() {
            return Err(StoreError::new(
                StoreErrorKind::Protocol,
                format!("{} outcomes for {} rules", outcomes.len(), self.rules.len()),
            ));
        }
        for (entry, outcome) in self.rules.iter_mut().zip(outcomes) {
            entry.outcome = outcome;
        }
        Ok(())
    }

    /// Fills in the outcome of a decision with one charge.
    pub(crate) fn answer_one(&mut self, outcome: Outcome) {
        debug_assert_eq!(self.rules.len(), 1);
        if let Some(entry) = self.rules.first_mut() {
            entry.outcome = outcome;
        }
    }

    /// Records the gRPC method the request calls.
    pub(crate) fn set_grpc_method(&mut self, method: Arc<str>) {
        self.grpc_method = Some(method);
    }
}

impl Decision {
    /// For a gRPC (or gRPC-Web) request, the method it calls: its path,
    /// `/package.Service/Method`.
    #[inline]
    pub fn grpc_method(&self) -> Option<&str> {
        self.plan.grpc_method()
    }

    /// Every rule that applied, in the layer's order.
    #[inline]
    pub fn rules(&self) -> &[RuleDecision] {
        self.plan.rules()
    }

    /// The entry of the rule named `name`, if it applied.
    ///
    /// (See [`RuleDecision::limit`] for the limit a per-request rule applied.)
    pub fn rule(&self, name: &str) -> Option<&RuleDecision> {
        self.rules().iter().find(|r| &*r.rule == name)
    }

    /// Whether the request passes (now or after a queue-mode wait).
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.rules().iter().all(|r| r.outcome.verdict.is_admitted())
    }

    /// For a denied request: when the request could pass, the longest wait over the rules that
    /// denied it.
    pub fn retry_after(&self) -> Option<Duration> {
        self.rules()
            .iter()
            .filter_map(|r| match r.outcome.verdict {
                Verdict::Denied { retry_after } => Some(retry_after),
                _ => None,
            })
            .max()
    }

    /// For a request admitted in queue mode: how long it waits for its slot (zero otherwise).
    #[inline]
    pub fn wait(&self) -> Duration {
        self.rules()
            .iter()
            .filter_map(|r| match r.outcome.verdict {
                Verdict::Reserved { wait } => Some(wait),
                _ => None,
            })
            .max()
            .unwrap_or_default()
    }

    /// The fewest units left over the rules (`None` when no rule applied).
    pub fn remaining(&self) -> Option<u64> {
        self.rules().iter().map(|r| r.outcome.remaining).min()
    }
}

impl RuleDecision {
    /// The limit this request was charged under, when the rule takes its limit from the request
    /// ([`Rule::limit_from`](crate::Rule::limit_from),
    /// [`Rule::limit_from_extension`](crate::Rule::limit_from_extension)); `None` when the rule's
    /// own limit applied.
    ///
    /// For a rule with overrides ([`Rule::overridable`](crate::Rule::overridable)), the key's
    /// override when the store charged under one: it takes precedence over the request's.
    pub fn limit(&self) -> Option<&crate::algorithm::Limit> {
        self.override_limit()
            .or_else(|| self.applied.as_ref().and_then(|cell| cell.get()?.as_ref()))
    }

    fn override_limit(&self) -> Option<&Limit> {
        self.outcome.override_limit()
    }
}

/// What the rules make of one request: the answer of [`Limiter::decide`](crate::Limiter::decide).
// `Decided` is the usual answer: boxing it would allocate for every request to spare the rare
// list and refusal answers a few hundred bytes.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Ruling {
    /// On an allow list: forwarded without being counted.
    Allowed,
    /// Counted: what the enforced rules decided (empty when none applied), and what the shadow
    /// rules would have (recorded, never blocking).
    Decided {
        /// The rules that block.
        enforced: Decision,
        /// The rules in shadow mode.
        shadow: Decision,
    },
    /// Answered before anything was counted: a deny list, a missing key, a cost that cannot be
    /// read or could never pass.
    Refused {
        /// The status the layer answers with (`403` for a deny list, `400` or the rule's status
        /// for a missing key, `400` for a bad cost).
        status: StatusCode,
        /// The rule that refused it (`None` for a deny list).
        rule: Option<Arc<str>>,
        /// Why, in words.
        reason: String,
    },
}

#[cfg(feature = "axum")]
mod extract {
    use axum::extract::FromRequestParts;
    use http::request::Parts;
    use http::StatusCode;

    use super::Decision;

    /// Reads the decision the layer left in the request's extensions.
    impl<S: Send + Sync> FromRequestParts<S> for Decision {
        type Rejection = (StatusCode, &'static str);

        async fn from_request_parts(
            parts: &mut Parts,
            _state: &S,
        ) -> Result<Self, Self::Rejection> {
            parts.extensions.get::<Decision>().cloned().ok_or((
                StatusCode::INTERNAL_SERVER_ERROR,
                "no rate-limit decision: is a RateLimitLayer applied to this route, without \
                 `decision_in_extensions(false)`?",
            ))
        }
    }
}

impl From<Refusal> for Ruling {
    fn from(refusal: Refusal) -> Self {
        let (status, rule, reason) = match refusal {
            Refusal::MissingKey { rule, key, status } => (
                status,
                Some(rule),
                format!("no key: the rule counts by {key}"),
            ),
            Refusal::BadCost { rule, error } => {
                (StatusCode::BAD_REQUEST, Some(rule), error.to_string())
            }
            Refusal::CostTooLarge { rule, error } => {
                (StatusCode::BAD_REQUEST, Some(rule), error.to_string())
            }
            Refusal::NoPeer { rule, key } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                Some(rule),
                format!("no peer address: the rule counts by {key}"),
            ),
            Refusal::NoRoute { rule, key } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                Some(rule),
                format!("no route matched yet: the rule counts by {key}"),
            ),
            Refusal::BadKey { rule, key } => (
                StatusCode::BAD_REQUEST,
                Some(rule),
                format!("unreadable key: the rule counts by {key}, not UTF-8 once decoded"),
            ),
            Refusal::Denied { list } => (
                StatusCode::FORBIDDEN,
                None,
                format!("on a deny list ({list})"),
            ),
        };
        Ruling::Refused {
            status,
            rule,
            reason,
        }
    }
}

impl Charges for Plan {
    #[inline]
    fn push(
        &mut self,
        index: usize,
        rule: Arc<str>,
        key: KeyValue,
        cost: u64,
        applied: Option<Applied>,
    ) {
        self.add_charge(index, rule, key, cost, applied);
    }

    #[inline]
    fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    fn set_grpc_method(&mut self, method: Arc<str>) {
        Plan::set_grpc_method(self, method);
    }
}
