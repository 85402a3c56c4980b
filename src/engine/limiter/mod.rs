//! `Limiter`: a set of rules and the store behind them, usable with or without the middleware.
//!
//! One file per job: the builder, the errors, the key API, the batch API, reloads, and the
//! operators' blocks and overrides; the request API (`decide`) and the handle itself are here.

mod admin;
mod batch;
mod builder;
mod error;
mod keys;
mod reload;

use crate::engine::ask;
use std::fmt;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use http::Request;

use super::ask::Answer;
use super::decision::{Decision, Plan, Ruling};
use super::ledger::Ledger;
use super::ledger::StoreRef;
use super::slot::Slots;
use crate::key::KeyValue;
use crate::rules::rule::{MissingKey, RuleSummary};
use crate::rules::set::{AccessList, Route, RuleSet};
use crate::store::{FailurePolicy, Store};

pub use builder::LimiterBuilder;
pub use error::LimitError;
pub use keys::Reservation;

/// Rules and their store: what the middleware asks for every request, and a handle for code outside
/// it — a handler that resets the failed-login count after a good login, a job that checks its
/// budget.
///
/// Clones share the same rules and store. A [`RateLimitLayer`](crate::RateLimitLayer) hands out its
/// limiter with [`limiter()`](crate::RateLimitLayer::limiter).
///
/// ```
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate::{Limit, Limiter, Rule};
///
/// let limiter = Limiter::builder()
///     .rule(Rule::new("failed-logins", Limit::per_hour(5)))
///     .build()?;
/// let outcome = limiter.charge("failed-logins", "alice", 1).await?;
/// assert_eq!(outcome.remaining, 4);
/// limiter.reset("failed-logins", "alice").await?; // a good login forgets the failures
/// // A check reports what a charge would leave; cost 0 just looks.
/// assert_eq!(limiter.check("failed-logins", "alice", 0).await?.remaining, 5);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

struct Inner {
    rules: ArcSwap<RuleSet>,
    /// The store, and the lines of requests waiting for its slots.
    ledger: Ledger,
    failure: FailurePolicy,
    /// Told of each new rule set in order, under this lock (see [`Limiter::follow_rules`]).
    followers: Mutex<Vec<Follower>>,
}

/// Prepares what a later stage keeps per rule set, given the set now in force; answers `false`
/// once it is no longer needed (its layer was dropped).
pub(crate) type Follower = Box<dyn Fn(&Arc<RuleSet>) -> bool + Send + Sync>;

impl Limiter {
    /// Configures a limiter.
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder::default()
    }

    /// The rules in force, in order, as validated: their algorithms, keys, costs and scopes.
    pub fn rules_in_force(&self) -> Vec<RuleSummary> {
        self.rules().rules.iter().map(|r| r.summary()).collect()
    }

    /// The allow lists in force: requests they match are forwarded, never limited.
    pub fn allow_lists(&self) -> Vec<AccessList> {
        self.rules().allow().to_vec()
    }

    /// The deny lists in force: requests they match are refused with `403 Forbidden`.
    pub fn deny_lists(&self) -> Vec<AccessList> {
        self.rules().deny().to_vec()
    }

    /// The failure policy this limiter's store was built with.
    pub(crate) fn failure_policy(&self) -> FailurePolicy {
        self.inner.failure
    }

    /// The rules in force; a guard, cheap to take, not to be held across an await.
    #[inline]
    pub(crate) fn rules(&self) -> arc_swap::Guard<Arc<RuleSet>> {
        self.inner.rules.load()
    }

    pub(crate) fn store(&self) -> &dyn Store {
        self.inner.ledger.store()
    }

    /// What requests leave behind for the store once decided goes through this.
    pub(crate) fn ledger(&self) -> &Ledger {
        &self.inner.ledger
    }

    /// The store, by type when it is the memory store.
    #[inline]
    pub(crate) fn store_ref(&self) -> StoreRef<'_> {
        self.inner.ledger.store_ref()
    }

    /// The key `rule` derives from `request` (what the middleware would charge), if present.
    pub fn key_for<B>(
        &self,
        rule: &str,
        request: &Request<B>,
    ) -> Result<Option<KeyValue>, LimitError> {
        let rules = self.rules();
        let rule = rules.find(rule).ok_or_else(|| unknown(rule))?.1;
        Ok(rule
            .key
            .extract(request)
            .or_else(|| match &rule.missing_key {
                MissingKey::Fallback(key) => key.extract(request),
                _ => None,
            }))
    }

    /// Runs one request through the rules as the middleware does — deny and allow lists, the rules
    /// whose scope it is in, their keys and costs, one atomic charge of the store — and returns
    /// what they decided, without a Tower service, a response or a queue-mode wait. For tools that
    /// replay traffic through a configuration (the `tollgate` command) and for tests. With no
    /// response to hold it, a concurrency rule's slot is given back as soon as it is decided.
    ///
    /// Shadow rules are charged apart from the enforced ones, as in the middleware; the layer's
    /// own `shadow` switch (every rule in shadow mode) is a layer setting and is not applied.
    /// Nothing is recorded in metrics or logs.
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::{Key, Limit, Limiter};
    /// use tollgate::engine::Ruling;
    ///
    /// let limiter = Limiter::builder().rule(Limit::per_minute(1).key(Key::peer_ip())).build()?;
    /// let mut request = http::Request::new(());
    /// request.extensions_mut().insert("192.0.2.1:5000".parse::<std::net::SocketAddr>()?);
    /// let Ruling::Decided { enforced, .. } = limiter.decide(&request).await? else { panic!() };
    /// assert!(enforced.is_allowed());
    /// let Ruling::Decided { enforced, .. } = limiter.decide(&request).await? else { panic!() };
    /// assert!(!enforced.is_allowed());
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn decide<B>(&self, request: &Request<B>) -> Result<Ruling, LimitError> {
        // The ruling is made first and its decisions filled where they lie: each is hundreds of
        // bytes, which a replay would otherwise move several times for every line it reads.
        let mut ruling = Ruling::Decided {
            enforced: Decision::default(),
            shadow: Decision::default(),
        };
        let Ruling::Decided { enforced, shadow } = &mut ruling else {
            unreachable!("made just above")
        };
        let (for_enforced, for_shadow) = {
            let rules = self.rules();
            let mut shadow_plan = None;
            match rules.route(request, false, &mut enforced.plan, &mut shadow_plan) {
                Ok(Route::Planned) => {}
                Ok(Route::Allowed) => return Ok(Ruling::Allowed),
                Err(refusal) => return Ok(refusal.into()),
            }
            if let Some(plan) = shadow_plan {
                shadow.plan = plan;
            }
            let ask = |plan: &mut Plan| {
                if plan.rules().is_empty() {
                    Answer::Now(Ok(()))
                } else {
                    ask::ask_store(&rules, self.ledger(), plan)
                }
            };
            (ask(&mut enforced.plan), ask(&mut shadow.plan))
        };
        match for_enforced {
            Answer::Now(result) => result?,
            Answer::Later(pending) => enforced.plan.answer(pending.await?)?,
        }
        match for_shadow {
            Answer::Now(result) => result?,
            Answer::Later(pending) => shadow.plan.answer(pending.await?)?,
        }
        if enforced.is_allowed() {
            // No response holds a concurrency slot here: it is given back at once.
            let rules = arc_swap::Guard::into_inner(self.rules());
            drop(Slots::of(self.ledger(), &rules, enforced));
        }
        Ok(ruling)
    }
}

fn unknown(rule: &str) -> LimitError {
    LimitError::UnknownRule(rule.to_owned())
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("rules", &*self.inner.rules.load())
            .field("store", &self.inner.ledger.store())
            .finish()
    }
}
