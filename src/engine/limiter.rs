//! `Limiter`: a set of rules and the store behind them, usable with or without the middleware.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::Request;
use smallvec::SmallVec;

use super::ask::Answer;
use super::decision::{Decision, Ruling};
use super::ledger::Ledger;
use super::ledger::StoreRef;
use super::slot::{SlotGuard, Slots};
use crate::algorithm::error::ConfigError;
use crate::algorithm::{CostTooLarge, Limit, Mode, Outcome, ReserveBound};
use crate::key::KeyValue;
use crate::rules::rule::{MissingKey, Rule, RuleSummary};
use crate::rules::set::{AccessList, Route, RuleSet};
use crate::store::{
    BlockedKey, Charge, CircuitBreaker, Cursor, FailurePolicy, Guarded, MemoryStore, OverrideEntry,
    Page, Store, StoreError,
};

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

/// Builds a [`Limiter`].
#[derive(Debug, Default)]
pub struct LimiterBuilder {
    rules: Vec<Rule>,
    allow: Vec<AccessList>,
    deny: Vec<AccessList>,
    store: Option<Arc<dyn Store>>,
    memory: Option<MemoryStore>,
    failure: FailurePolicy,
    breaker: CircuitBreaker,
}

impl LimiterBuilder {
    /// Adds a rule. A request is charged by every rule whose scope it is in, all or nothing.
    pub fn rule(mut self, rule: impl Into<Rule>) -> Self {
        self.rules.push(rule.into());
        self
    }

    /// Adds every rule of `rules`, in order (as [`rule`](Self::rule) does each). A limiter may
    /// hold no rule at all: a service with nothing configured yet answers every call with
    /// [`LimitError::UnknownRule`] until [`with_rules`](Limiter::with_rules) gives it some.
    pub fn rules(mut self, rules: impl IntoIterator<Item = Rule>) -> Self {
        self.rules.extend(rules);
        self
    }

    /// The store (default: a new [`MemoryStore`]).
    pub fn store(mut self, store: impl Store) -> Self {
        self.memory = (&store as &dyn Any).downcast_ref::<MemoryStore>().cloned();
        self.store = Some(Arc::new(store));
        self
    }

    /// What a failing remote store's calls answer (default: [`FailurePolicy::Open`]): with
    /// [`FailurePolicy::Local`], a local [`MemoryStore`] decides with every limit scaled by the
    /// share; otherwise the store's error goes to the caller (the layer forwards or refuses by
    /// the same policy). It also words the breaker's warnings.
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// The circuit breaker put in front of a store that is not a [`MemoryStore`] (default:
    /// [`CircuitBreaker::new`]): after consecutive failures, calls are answered at once without
    /// waiting for the store's timeout, and the store is probed in the background until it
    /// answers again.
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = breaker;
        self
    }

    /// Requests matching `list` are never limited.
    pub fn allow(mut self, list: AccessList) -> Self {
        self.allow.push(list);
        self
    }

    /// Requests matching `list` are refused with `403 Forbidden`.
    pub fn deny(mut self, list: AccessList) -> Self {
        self.deny.push(list);
        self
    }

    /// Validates the rules and builds the limiter.
    pub fn build(self) -> Result<Limiter, ConfigError> {
        let rules = RuleSet::new(self.rules, self.allow, self.deny)?;
        self.failure.validate()?;
        let (store, memory) = match self.store {
            // The memory store cannot fail: only remote stores get the breaker.
            Some(store) if self.memory.is_none() => (
                Arc::new(Guarded::new(store, &self.breaker, self.failure)) as Arc<dyn Store>,
                None,
            ),
            Some(store) => (store, self.memory),
            None => {
                let memory = MemoryStore::new();
                (Arc::new(memory.clone()) as Arc<dyn Store>, Some(memory))
            }
        };
        rules.check_store(&*store)?;
        Ok(Limiter {
            inner: Arc::new(Inner {
                rules: ArcSwap::from_pointee(rules),
                ledger: Ledger::new(store, memory),
                failure: self.failure,
                followers: Mutex::new(Vec::new()),
            }),
        })
    }
}

/// Why the limiter handle could not answer.
#[derive(Debug)]
#[non_exhaustive]
pub enum LimitError {
    /// No rule has that name.
    UnknownRule(String),
    /// The cost can never pass under the rule.
    CostTooLarge {
        /// The rule.
        rule: String,
        /// The cost and the most that fits.
        error: CostTooLarge,
    },
    /// The rule has no [`Queue`](crate::Queue) settings, so it cannot reserve.
    NotQueued(String),
    /// The rule's algorithm cannot reserve (only token buckets and fixed windows do).
    CannotReserve(String),
    /// One batch names the same rule and key twice.
    Repeated(String),
    /// A batch ([`Limiter::charge_all`], [`check_all`](Limiter::check_all),
    /// [`reserve_all`](Limiter::reserve_all)) names no rule: there is nothing to decide, and a
    /// decision that says "allowed" would be a limit that was never asked.
    EmptyBatch,
    /// The rule has no penalty ([`Rule::block`]), so its keys cannot be blocked.
    NoPenalty(String),
    /// The rule is not a concurrency limit, so it has no slots to acquire.
    NotConcurrent(String),
    /// The rule has no overrides ([`Rule::overridable`](crate::Rule::overridable)), so its
    /// keys cannot be given one.
    NotOverridable(String),
    /// An override that cannot be kept: a limit the rule cannot use, a key past
    /// [`MAX_KEY_LEN`](crate::key::MAX_KEY_LEN), a TTL of zero or of more than a year.
    BadOverride {
        /// The rule.
        rule: String,
        /// What is wrong, in words.
        reason: String,
    },
    /// A limit given with a charge ([`Limiter::charge_all_under`]) that the rule cannot use: a
    /// concurrency limit for a rate rule or the reverse, numbers the store cannot count.
    BadLimit {
        /// The rule.
        rule: String,
        /// What is wrong, in words.
        reason: String,
    },
    /// The store failed.
    Store(StoreError),
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitError::UnknownRule(name) => write!(f, "no rate-limit rule is named {name:?}"),
            LimitError::CostTooLarge { rule, error } => write!(f, "rule {rule:?}: {error}"),
            LimitError::NotQueued(name) => {
                write!(
                    f,
                    "rate-limit rule {name:?} has no queue settings: it cannot reserve"
                )
            }
            LimitError::CannotReserve(name) => write!(
                f,
                "rate-limit rule {name:?} cannot reserve: only token buckets and fixed windows do"
            ),
            LimitError::Repeated(name) => write!(
                f,
                "rate-limit rule {name:?} is charged twice for the same key in one batch"
            ),
            LimitError::NoPenalty(name) => write!(
                f,
                "rate-limit rule {name:?} has no penalty (block): its keys cannot be blocked"
            ),
            LimitError::NotConcurrent(name) => write!(
                f,
                "rate-limit rule {name:?} is not a concurrency limit: it has no slots to acquire"
            ),
            LimitError::NotOverridable(name) => write!(
                f,
                "rate-limit rule {name:?} has no overrides: build it with `overridable()` \
                 (`overrides = true` in a file) to give its keys limits of their own"
            ),
            LimitError::BadOverride { rule, reason } => {
                write!(
                    f,
                    "rate-limit rule {rule:?}: override refused, nothing written: {reason}"
                )
            }
            LimitError::BadLimit { rule, reason } => {
                write!(
                    f,
                    "rate-limit rule {rule:?}: the limit given cannot be used: {reason}"
                )
            }
            LimitError::EmptyBatch => {
                f.write_str("a batch of rate-limit charges names no rule: nothing to decide")
            }
            LimitError::Store(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for LimitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LimitError::Store(error) => Some(error),
            LimitError::CostTooLarge { error, .. } => Some(error),
            LimitError::UnknownRule(_)
            | LimitError::NotQueued(_)
            | LimitError::CannotReserve(_)
            | LimitError::Repeated(_)
            | LimitError::NoPenalty(_)
            | LimitError::NotConcurrent(_)
            | LimitError::NotOverridable(_)
            | LimitError::BadOverride { .. }
            | LimitError::BadLimit { .. }
            | LimitError::EmptyBatch => None,
        }
    }
}

impl From<StoreError> for LimitError {
    fn from(error: StoreError) -> Self {
        LimitError::Store(error)
    }
}

impl Limiter {
    /// Configures a limiter.
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder::default()
    }

    /// The names of the rules in force, in order (for the reload's log line; callers read
    /// [`rules_in_force`](Self::rules_in_force)).
    fn rule_names(&self) -> Vec<String> {
        self.inner
            .rules
            .load()
            .rules
            .iter()
            .map(|r| r.name.to_string())
            .collect()
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

    /// Replaces the rules (and allow and deny lists) atomically: requests in flight finish with
    /// the rules they started with, the next ones use the new set. State lives in the store under
    /// each rule's name, so rules that keep their name keep their counts.
    /// The store may still refuse a rule it cannot decide exactly; then nothing changes.
    fn replace(&self, rules: RuleSet) -> Result<(), ConfigError> {
        rules.check_store(self.store())?;
        let rules = Arc::new(rules);
        {
            // Under the followers' lock: two reloads at once reach every follower in the order
            // they took effect.
            let mut followers = self.followers();
            self.inner.rules.store(rules.clone());
            followers.retain(|follow| follow(&rules));
        }
        tracing::info!(rules = ?self.rule_names(), "rate limit: rules reloaded");
        Ok(())
    }

    /// Has `follow` told of the rule set in force now and of every one that replaces it, in
    /// order, until it answers `false`. The layer keeps what its response and observe stages
    /// prepare per rule set this way (the limiter knows nothing of them).
    pub(crate) fn follow_rules(&self, follow: Follower) {
        let mut followers = self.followers();
        if follow(&self.inner.rules.load_full()) {
            followers.push(follow);
        }
    }

    fn followers(&self) -> std::sync::MutexGuard<'_, Vec<Follower>> {
        // A follower that panicked left the list whole: nothing to repair.
        self.inner
            .followers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A limiter deciding under `rules` (validated first), with this limiter's store — its
    /// counts, its circuit breaker, the requests waiting for its slots — its failure policy and
    /// its allow and deny lists. This limiter is left as it is: calls in flight on it finish
    /// under its rules. Rules that keep their name keep their counts, as with
    /// [`reload`](Self::reload).
    ///
    /// For a front end that keeps state of its own beside the rules (`tollgate-server`'s
    /// descriptor trees) and replaces both as one value, so that a call never sees the rules
    /// of one configuration with the state of another.
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tollgate::{Limit, Limiter, Rule};
    ///
    /// let minute = Duration::from_secs(60);
    /// let two = Rule::new("api", Limit::fixed_window(2, minute));
    /// let before = Limiter::builder().rule(two).build()?;
    /// before.charge("api", "alice", 1).await?;
    /// let after = before.with_rules([Rule::new("api", Limit::fixed_window(5, minute))])?;
    /// // Same store, same name: alice's count is kept.
    /// assert_eq!(after.check("api", "alice", 0).await?.remaining, 4);
    /// assert_eq!(before.check("api", "alice", 0).await?.remaining, 1);
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub fn with_rules(
        &self,
        rules: impl IntoIterator<Item = Rule>,
    ) -> Result<Limiter, ConfigError> {
        let next = {
            let current = self.rules();
            RuleSet::new(
                rules.into_iter().collect(),
                current.allow().to_vec(),
                current.deny().to_vec(),
            )?
        };
        next.check_store(self.store())?;
        Ok(Limiter {
            inner: Arc::new(Inner {
                rules: ArcSwap::from_pointee(next),
                ledger: self.inner.ledger.clone(),
                failure: self.inner.failure,
                followers: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Replaces the rules with `rules` (validated first: on error nothing changes).
    pub fn reload(&self, rules: impl IntoIterator<Item = Rule>) -> Result<(), ConfigError> {
        let current = self.inner.rules.load();
        let next = RuleSet::new(
            rules.into_iter().collect(),
            current.allow().to_vec(),
            current.deny().to_vec(),
        )?;
        self.replace(next)
    }

    /// Replaces the rules and the allow and deny lists together, e.g. from a configuration file
    /// that was edited (validated first: on error nothing changes). [`reload`](Self::reload)
    /// keeps the lists in force.
    pub fn reload_with_lists(
        &self,
        rules: impl IntoIterator<Item = Rule>,
        allow: impl IntoIterator<Item = AccessList>,
        deny: impl IntoIterator<Item = AccessList>,
    ) -> Result<(), ConfigError> {
        let next = RuleSet::new(
            rules.into_iter().collect(),
            allow.into_iter().collect(),
            deny.into_iter().collect(),
        )?;
        self.replace(next)
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

    /// The outcome charging `cost` to `key` under `rule` would have, with nothing charged.
    pub async fn check(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
        cost: u64,
    ) -> Result<Outcome, LimitError> {
        self.one(rule, key.as_ref(), cost, Some(Mode::Check)).await
    }

    /// Charges `cost` to `key` under `rule` if it fits now; the outcome says whether it did.
    pub async fn charge(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
        cost: u64,
    ) -> Result<Outcome, LimitError> {
        self.one(rule, key.as_ref(), cost, Some(Mode::Charge)).await
    }

    /// Reserves `cost` units for `key` under a queued `rule`: granted now, granted after a wait
    /// (the units are already set aside, so the work should start then), or denied when the
    /// reservation would pass the queue's bound.
    ///
    /// For jobs that schedule work when the budget allows it, e.g. an LLM call that needs 4,000
    /// tokens: `limiter.reserve("llm", tenant, 4_000).await?`, then
    /// [`ready`](Reservation::ready)`.await` and call.
    pub async fn reserve(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
        cost: u64,
    ) -> Result<Reservation, LimitError> {
        let queued = {
            let rules = self.rules();
            let (_, compiled) = rules.find(rule).ok_or_else(|| unknown(rule))?;
            matches!(compiled.mode, Mode::Reserve(_))
        };
        if !queued {
            return Err(LimitError::NotQueued(rule.to_owned()));
        }
        self.reservation([(rule, key)], cost, None).await
    }

    /// Reserves `cost` units for `key` under `rule` with **no bound**: the reservation is always
    /// granted, now or after a wait however long, and the units are set aside at once (Convex's
    /// plain `reserve`). For callers that schedule the work themselves and decide what a wait is
    /// worth: look at [`wait`](Reservation::wait), and [`cancel`](Reservation::cancel) what will
    /// not run. Works on every token-bucket and fixed-window rule, queued or not; the rule's
    /// queue bound, if it has one, does not apply. Everyone after this reservation waits behind
    /// it: a large unbounded reservation delays every later request of the key.
    ///
    /// A `RedisStore` counts exactly up to 2^50 µs (35 years) ahead, and denies a reservation
    /// that would reach further.
    pub async fn reserve_unbounded(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
        cost: u64,
    ) -> Result<Reservation, LimitError> {
        let reserves = {
            let rules = self.rules();
            let (_, compiled) = rules.find(rule).ok_or_else(|| unknown(rule))?;
            compiled.algorithm().reserves()
        };
        if !reserves {
            return Err(LimitError::CannotReserve(rule.to_owned()));
        }
        let mode = Mode::Reserve(ReserveBound::default());
        self.reservation([(rule, key)], cost, Some(mode)).await
    }

    /// A reservation of `cost` for one key under one rule.
    async fn reservation<K: AsRef<[u8]>>(
        &self,
        charge: [(&str, K); 1],
        cost: u64,
        mode: Option<Mode>,
    ) -> Result<Reservation, LimitError> {
        let [(rule, key)] = charge;
        let decision = self.many([(rule, key, cost, None)], mode).await?;
        Ok(Reservation::new(decision, self))
    }

    /// Charges several rules at once, all or nothing, as the middleware charges the rules of a
    /// request: each `(rule, key, cost)` is admitted, or none is charged, and the
    /// [`Decision`] holds every rule's outcome (a denial's `retry_after` is the longest). A batch
    /// that names no rule is [`LimitError::EmptyBatch`], for this call and the other two batch
    /// calls alike.
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::{Limit, Limiter, Rule};
    ///
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::new("per-user", Limit::per_minute(10)))
    ///     .rule(Rule::new("global", Limit::per_minute(15)))
    ///     .build()?;
    /// let first = limiter.charge_all([("per-user", "alice", 10), ("global", "", 10)]).await?;
    /// assert!(first.is_allowed());
    /// // Bob fits his own limit but not the global one: neither is charged.
    /// let bob = limiter.charge_all([("per-user", "bob", 6), ("global", "", 6)]).await?;
    /// assert!(!bob.is_allowed());
    /// assert_eq!(limiter.check("per-user", "bob", 0).await?.remaining, 10);
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn charge_all<R, K>(
        &self,
        charges: impl IntoIterator<Item = (R, K, u64)>,
    ) -> Result<Decision, LimitError>
    where
        R: AsRef<str>,
        K: AsRef<[u8]>,
    {
        let charges = charges.into_iter().map(|(r, k, c)| (r, k, c, None));
        self.many(charges, Some(Mode::Charge)).await
    }

    /// The decision [`charge_all`](Self::charge_all) would make, with nothing charged.
    pub async fn check_all<R, K>(
        &self,
        charges: impl IntoIterator<Item = (R, K, u64)>,
    ) -> Result<Decision, LimitError>
    where
        R: AsRef<str>,
        K: AsRef<[u8]>,
    {
        let charges = charges.into_iter().map(|(r, k, c)| (r, k, c, None));
        self.many(charges, Some(Mode::Check)).await
    }

    /// [`charge_all`](Self::charge_all), each charge decided under the limit given with it
    /// (`None`: the rule's own), as a rule whose limit comes from the request is decided
    /// ([`Rule::limit_from`](crate::Rule::limit_from)): the key's state is the rule's, read under
    /// the limit given (a window keeps its count and compares it with the limit). For
    /// services whose callers bring a limit with each request, e.g. Envoy's descriptor `limit`
    /// override: one rule per period, the number per request. A limit the rule cannot use is
    /// [`LimitError::BadLimit`], nothing charged.
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tollgate::{Limit, Limiter, Rule};
    ///
    /// let day = Duration::from_secs(86_400);
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::new("per-day", Limit::fixed_window(u64::from(u32::MAX), day)))
    ///     .build()?;
    /// let ten = Some(Limit::fixed_window(10, day));
    /// let first = limiter.charge_all_under([("per-day", "acme", 8, ten.clone())]).await?;
    /// assert_eq!(first.rules()[0].outcome.remaining, 2);
    /// // The same key under a limit of 20 keeps its count of 8.
    /// let twenty = Some(Limit::fixed_window(20, day));
    /// let next = limiter.charge_all_under([("per-day", "acme", 1, twenty)]).await?;
    /// assert_eq!(next.rules()[0].outcome.remaining, 11);
    /// // A concurrency limit cannot decide a rate rule's charge.
    /// let slots = Some(Limit::concurrent(2));
    /// let refused = limiter.charge_all_under([("per-day", "acme", 1, slots)]).await;
    /// assert!(matches!(refused, Err(tollgate::LimitError::BadLimit { .. })));
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn charge_all_under<R, K>(
        &self,
        charges: impl IntoIterator<Item = (R, K, u64, Option<Limit>)>,
    ) -> Result<Decision, LimitError>
    where
        R: AsRef<str>,
        K: AsRef<[u8]>,
    {
        self.many(charges, Some(Mode::Charge)).await
    }

    /// The decision [`charge_all_under`](Self::charge_all_under) would make, with nothing
    /// charged.
    pub async fn check_all_under<R, K>(
        &self,
        charges: impl IntoIterator<Item = (R, K, u64, Option<Limit>)>,
    ) -> Result<Decision, LimitError>
    where
        R: AsRef<str>,
        K: AsRef<[u8]>,
    {
        self.many(charges, Some(Mode::Check)).await
    }

    /// Charges several rules at once, all or nothing, each in its own mode, exactly as the
    /// middleware does: a queued rule reserves within its queue's bound, any other rule charges
    /// only what fits now. The reservation's [`wait`](Reservation::wait) is the longest of the
    /// rules'; [`cancel`](Reservation::cancel) gives every rule its units back.
    pub async fn reserve_all<R, K>(
        &self,
        charges: impl IntoIterator<Item = (R, K, u64)>,
    ) -> Result<Reservation, LimitError>
    where
        R: AsRef<str>,
        K: AsRef<[u8]>,
    {
        let charges = charges.into_iter().map(|(r, k, c)| (r, k, c, None));
        let decision = self.many(charges, None).await?;
        Ok(Reservation::new(decision, self))
    }

    /// Decides a batch in one atomic step of the store; a `mode` of `None` uses each rule's own,
    /// a limit of `None` each rule's own.
    async fn many<R, K>(
        &self,
        charges: impl IntoIterator<Item = (R, K, u64, Option<Limit>)>,
        mode: Option<Mode>,
    ) -> Result<Decision, LimitError>
    where
        R: AsRef<str>,
        K: AsRef<[u8]>,
    {
        let mut decision = Decision::default();
        let mut modes: SmallVec<[Mode; 2]> = SmallVec::new();
        let pending = {
            let rules = self.rules();
            for (rule, key, cost, limit) in charges {
                let rule = rule.as_ref();
                let (index, compiled) = rules.find(rule).ok_or_else(|| unknown(rule))?;
                let mode = mode.unwrap_or(compiled.mode);
                if let Some(limit) = &limit {
                    super::ask::usable(rule, compiled.algorithm(), limit, None, self.store())
                        .map_err(|reason| LimitError::BadLimit {
                            rule: rule.to_owned(),
                            reason,
                        })?;
                }
                let algorithm = limit
                    .as_ref()
                    .map_or(compiled.algorithm(), Limit::algorithm);
                algorithm
                    .check_cost(cost, mode)
                    .map_err(|error| LimitError::CostTooLarge {
                        rule: rule.to_owned(),
                        error,
                    })?;
                let key = KeyValue::new(key.as_ref());
                // One key charged twice in one atomic step would be judged twice against the
                // same balance.
                if decision
                    .rules()
                    .iter()
                    .any(|r| r.index == index && r.key == key)
                {
                    return Err(LimitError::Repeated(rule.to_owned()));
                }
                let applied = limit.map(|limit| Arc::new(std::sync::OnceLock::from(Some(limit))));
                decision.plan(index, compiled.name.clone(), key, cost, applied);
                modes.push(mode);
            }
            if decision.rules().is_empty() {
                return Err(LimitError::EmptyBatch);
            }
            let batch: SmallVec<[Charge<'_>; 2]> = decision
                .rules()
                .iter()
                .zip(&modes)
                .map(|(r, &mode)| Charge {
                    mode,
                    // Under the limit given with the charge, if any.
                    ..rules.charge_of(r)
                })
                .collect();
            self.store().apply(&batch)
        };
        decision.answer(pending.await?)?;
        Ok(decision)
    }

    /// Gives `units` back to `key` under `rule` (never above the capacity), e.g. when work that was
    /// charged for did not happen. Under a concurrency rule, gives back `units` slots taken with
    /// [`charge`](Self::charge) (a slot taken with [`acquire`](Self::acquire) is given back by
    /// its guard).
    pub async fn refund(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
        units: u64,
    ) -> Result<(), LimitError> {
        let key = KeyValue::new(key.as_ref());
        let (pending, slots) = {
            let rules = self.rules();
            let (index, compiled) = rules.find(rule).ok_or_else(|| unknown(rule))?;
            let charge = Charge {
                mode: Mode::Charge,
                ..rules.charge(index, &key, units)
            };
            let slots = compiled.algorithm().is_concurrency();
            (
                self.store().refund(&charge),
                slots.then(|| compiled.name.clone()),
            )
        };
        pending.await?;
        if let Some(name) = slots {
            // A slot given back by hand lets the first waiter of the key in, as any other.
            self.ledger().lines().wake(&name, &key);
        }
        Ok(())
    }

    /// Forgets `key` under `rule`: its next request is treated as a new key's. Under a
    /// concurrency rule, the slots taken are forgotten: requests still in flight no longer count
    /// (every slot is free at once).
    pub async fn reset(&self, rule: &str, key: impl AsRef<[u8]>) -> Result<(), LimitError> {
        let key = KeyValue::new(key.as_ref());
        let (pending, slots) = {
            let rules = self.rules();
            let (_, compiled) = rules.find(rule).ok_or_else(|| unknown(rule))?;
            let slots = compiled.algorithm().is_concurrency();
            let pending = self
                .store()
                .reset(&compiled.name, compiled.algorithm(), key.as_bytes());
            (pending, slots.then(|| compiled.name.clone()))
        };
        pending.await?;
        if let Some(name) = slots {
            self.ledger().lines().wake(&name, &key);
        }
        Ok(())
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
            match rules.route(request, false, enforced, &mut shadow_plan) {
                Ok(Route::Planned) => {}
                Ok(Route::Allowed) => return Ok(Ruling::Allowed),
                Err(refusal) => return Ok(refusal.into()),
            }
            if let Some(plan) = shadow_plan {
                *shadow = plan;
            }
            let ask = |plan: &mut Decision| {
                if plan.rules().is_empty() {
                    Answer::Now(Ok(()))
                } else {
                    rules.ask(self.ledger(), plan)
                }
            };
            (ask(enforced), ask(shadow))
        };
        match for_enforced {
            Answer::Now(result) => result?,
            Answer::Later(pending) => enforced.answer(pending.await?)?,
        }
        match for_shadow {
            Answer::Now(result) => result?,
            Answer::Later(pending) => shadow.answer(pending.await?)?,
        }
        if enforced.is_allowed() {
            // No response holds a concurrency slot here: it is given back at once.
            let rules = arc_swap::Guard::into_inner(self.rules());
            drop(Slots::of(self.ledger(), &rules, enforced));
        }
        Ok(ruling)
    }

    /// Blocks `key` under `rule` for `d` from now, e.g. an admin action or an IP caught stuffing
    /// credentials: every request of the key under the rule is denied until then, with
    /// `Retry-After` = what is left of the block. A block already in force is replaced; the
    /// key's offence count is kept. The rule must have a penalty ([`Rule::block`]): only such rules read blocks, so the others pay nothing for them.
    pub async fn block(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
        d: Duration,
    ) -> Result<(), LimitError> {
        self.set_block(rule, key.as_ref(), Some(d)).await
    }

    /// Lifts the block of `key` under `rule`, if any, and forgets its offences (the next denial
    /// blocks for the first duration again). The counters are left as they are.
    pub async fn unblock(&self, rule: &str, key: impl AsRef<[u8]>) -> Result<(), LimitError> {
        self.set_block(rule, key.as_ref(), None).await
    }

    async fn set_block(
        &self,
        rule: &str,
        key: &[u8],
        block: Option<Duration>,
    ) -> Result<(), LimitError> {
        let key = KeyValue::new(key);
        let pending = {
            let rules = self.rules();
            let (_, compiled) = rules.find(rule).ok_or_else(|| unknown(rule))?;
            let penalty = compiled
                .penalty
                .as_ref()
                .ok_or_else(|| LimitError::NoPenalty(rule.to_owned()))?;
            self.store()
                .set_block(&compiled.name, penalty, key.as_bytes(), block)
        };
        Ok(pending.await?)
    }

    /// Gives `key` under `rule` the limit `limit` for `ttl` from now (a customer raised tenfold
    /// for a day, Upstash's `setDynamicLimit`), replacing any override the key has. It is kept
    /// in the store, so every instance charges the key under it from its next decision; it
    /// takes precedence over the rule's own limit and over one the request brings, is
    /// reported in `RateLimit-Policy`, and the key's state carries over as for any limit
    /// change. The rule must be [`overridable`](crate::Rule::overridable).
    ///
    /// Refused with nothing written: an unknown rule, a rule without overrides, a limit the
    /// rule cannot use (a zero rate or period, another family: a rate for a concurrency rule
    /// or the reverse, numbers the store cannot count), a key longer than
    /// [`MAX_KEY_LEN`](crate::key::MAX_KEY_LEN), a TTL of zero or longer than a year.
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tollgate::{Limit, Limiter, Rule};
    ///
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::new("api", Limit::per_minute(1)).overridable())
    ///     .build()?;
    /// let day = Duration::from_secs(86_400);
    /// limiter.set_override("api", "acme", Limit::per_minute(10), day).await?;
    /// for _ in 0..10 {
    ///     assert!(limiter.charge("api", "acme", 1).await?.is_allowed());
    /// }
    /// assert!(!limiter.charge("api", "acme", 1).await?.is_allowed());
    /// let page = limiter.overrides("api", None).await?;
    /// assert_eq!(page.items[0].key.as_bytes(), b"acme");
    /// limiter.clear_override("api", "acme").await?;
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn set_override(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
        limit: Limit,
        ttl: Duration,
    ) -> Result<(), LimitError> {
        const YEAR: Duration = Duration::from_secs(366 * 86_400);
        let key = key.as_ref();
        let pending = {
            let rules = self.rules();
            let (_, compiled) = overridable(&rules, rule)?;
            let bad = |reason: String| LimitError::BadOverride {
                rule: rule.to_owned(),
                reason,
            };
            if key.len() > crate::key::MAX_KEY_LEN {
                return Err(bad(format!(
                    "a key of {} bytes is longer than {} (MAX_KEY_LEN)",
                    key.len(),
                    crate::key::MAX_KEY_LEN
                )));
            }
            if ttl.is_zero() || ttl > YEAR {
                return Err(bad(format!(
                    "a TTL of {ttl:?} is not between 1 µs and a year"
                )));
            }
            let store = self.store();
            super::ask::usable(&compiled.name, compiled.algorithm(), &limit, None, store)
                .map_err(bad)?;
            self.store()
                .set_override(&compiled.name, key, Some((&limit, ttl)))
        };
        Ok(pending.await?)
    }

    /// Removes the override of `key` under `rule`, if any: its next decision is under the
    /// rule's own limit (or one the request brings), its state carried over.
    pub async fn clear_override(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
    ) -> Result<(), LimitError> {
        let pending = {
            let rules = self.rules();
            let (_, compiled) = overridable(&rules, rule)?;
            self.store()
                .set_override(&compiled.name, key.as_ref(), None)
        };
        Ok(pending.await?)
    }

    /// One page of `rule`'s overrides in force (key, limit, time left), at most 100, from
    /// `cursor` on (`None`: from the start); the page's `next` is the cursor of the following
    /// page, `None` after the last. Overrides set or ending during a listing may or may not be
    /// in it; none is listed twice.
    pub async fn overrides(
        &self,
        rule: &str,
        cursor: Option<Cursor>,
    ) -> Result<Page<OverrideEntry>, LimitError> {
        let pending = {
            let rules = self.rules();
            let (_, compiled) = overridable(&rules, rule)?;
            self.store().overrides(&compiled.name, cursor.as_ref(), 100)
        };
        Ok(pending.await?)
    }

    /// The override of `key` under `rule` in force now (its limit and the time it has left), or
    /// `None`. The errors are those of [`overrides`](Self::overrides).
    pub async fn override_of(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<OverrideEntry>, LimitError> {
        let pending = {
            let rules = self.rules();
            let (_, compiled) = overridable(&rules, rule)?;
            self.store().override_of(&compiled.name, key.as_ref())
        };
        Ok(pending.await?)
    }

    /// One page of the keys blocked now under `rule` — by its penalty or by
    /// [`block`](Self::block), through any instance sharing the store — with what is left of
    /// each block by the store's clock. Start with `None`, then give back each page's
    /// [`next`](Page::next) until it is `None`: each call reads a bounded part of the store (at
    /// most 100 keys on the memory store; one `SCAN` step of one node on Redis, never `KEYS`),
    /// so a page may be empty before the end. A key blocked during the whole walk is listed;
    /// one blocked or unblocked meanwhile may or may not be.
    ///
    /// Errors: [`UnknownRule`](LimitError::UnknownRule), [`NoPenalty`](LimitError::NoPenalty)
    /// for a rule that cannot block keys, and the store's errors — among them a cursor the store
    /// did not make ([`StoreErrorKind::BadCursor`](crate::store::StoreErrorKind::BadCursor)), or
    /// a custom store that cannot list blocks (the [`Store::blocks`] default).
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tollgate::{Limit, Limiter, Penalty, Rule};
    ///
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::new("login", Limit::per_minute(5)).block(Penalty::fixed(Duration::from_secs(600))))
    ///     .build()?;
    /// limiter.block("login", "203.0.113.9", Duration::from_secs(60)).await?;
    /// let mut blocked = Vec::new();
    /// let mut cursor = None;
    /// loop {
    ///     let page = limiter.blocks("login", cursor).await?;
    ///     blocked.extend(page.items);
    ///     match page.next {
    ///         Some(next) => cursor = Some(next),
    ///         None => break,
    ///     }
    /// }
    /// assert_eq!(blocked.len(), 1);
    /// assert_eq!(blocked[0].key, b"203.0.113.9");
    /// assert!(blocked[0].remaining <= Duration::from_secs(60));
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn blocks(
        &self,
        rule: &str,
        cursor: Option<Cursor>,
    ) -> Result<Page<BlockedKey>, LimitError> {
        let pending = {
            let rules = self.rules();
            let name = penalised(&rules, rule)?;
            self.store().blocks(name, cursor.as_ref())
        };
        Ok(pending.await?)
    }

    /// The block of `key` under `rule` if the key is blocked now (with what is left of it, by
    /// the store's clock), or `None`. The errors are those of [`blocks`](Self::blocks).
    pub async fn blocked(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<BlockedKey>, LimitError> {
        let key = KeyValue::new(key.as_ref());
        let pending = {
            let rules = self.rules();
            let name = penalised(&rules, rule)?;
            self.store().block_of(name, key.as_bytes())
        };
        Ok(pending.await?)
    }

    /// Takes a slot of `key` under the concurrency rule `rule` ([`Limit::concurrent`]) if one is
    /// free, in the same store as the middleware's: the slot is held until the guard is dropped.
    /// `Ok(None)` when every slot is taken. For work outside a request — a background job that
    /// must not run more than `n` at once per customer.
    ///
    /// [`Limit::concurrent`]: crate::Limit::concurrent
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::{Limit, Limiter, Rule};
    ///
    /// let limiter = Limiter::builder().rule(Rule::new("exports", Limit::concurrent(1))).build()?;
    /// let slot = limiter.acquire("exports", "customer-42").await?.expect("a free slot");
    /// assert!(limiter.acquire("exports", "customer-42").await?.is_none());
    /// drop(slot);
    /// assert!(limiter.acquire("exports", "customer-42").await?.is_some());
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn acquire(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<SlotGuard>, LimitError> {
        let key = KeyValue::new(key.as_ref());
        let (rules, index) = {
            let rules = arc_swap::Guard::into_inner(self.rules());
            let (index, compiled) = rules.find(rule).ok_or_else(|| unknown(rule))?;
            if !compiled.algorithm().is_concurrency() {
                return Err(LimitError::NotConcurrent(rule.to_owned()));
            }
            (rules, index)
        };
        let pending = self.store().apply_one(&Charge {
            mode: Mode::Charge,
            ..rules.charge(index, &key, 1)
        });
        let outcome = pending.await?;
        Ok(outcome
            .is_allowed()
            .then(|| SlotGuard::new(Slots::one(self.ledger(), rules, index, key))))
    }

    /// Decides one charge; a `mode` of `None` uses the rule's own.
    pub(crate) async fn one(
        &self,
        rule: &str,
        key: &[u8],
        cost: u64,
        mode: Option<Mode>,
    ) -> Result<Outcome, LimitError> {
        let key = KeyValue::new(key);
        // Where the store puts the key's override, for a rule with overrides.
        let slot = Arc::new(std::sync::OnceLock::new());
        let pending = {
            let rules = self.rules();
            let (index, compiled) = rules.find(rule).ok_or_else(|| unknown(rule))?;
            let mode = mode.unwrap_or(compiled.mode);
            compiled
                .algorithm()
                .check_cost(cost, mode)
                .map_err(|error| LimitError::CostTooLarge {
                    rule: rule.to_owned(),
                    error,
                })?;
            let charge = Charge {
                mode,
                overrides: compiled.overridable.then_some(&slot),
                ..rules.charge(index, &key, cost)
            };
            self.store_ref().apply_one(&charge)
        };
        Ok(pending.await?)
    }
}

/// The answer to [`Limiter::reserve`], [`Limiter::reserve_unbounded`] and
/// [`Limiter::reserve_all`].
#[derive(Debug)]
#[must_use = "a granted reservation holds units until it is used or cancelled"]
pub struct Reservation {
    decision: Decision,
    at: tokio::time::Instant,
    limiter: Limiter,
}

impl Reservation {
    fn new(decision: Decision, limiter: &Limiter) -> Self {
        Reservation {
            decision,
            at: tokio::time::Instant::now(),
            limiter: limiter.clone(),
        }
    }

    /// Whether the units were set aside (now or for later), under every rule.
    pub fn is_granted(&self) -> bool {
        self.decision.is_allowed()
    }

    /// How long after the reservation the work may start (zero when it may start now): the
    /// longest wait over the rules.
    pub fn wait(&self) -> Duration {
        self.decision.wait()
    }

    /// For a denied reservation: when the same reservation would be accepted.
    pub fn retry_after(&self) -> Option<Duration> {
        self.decision.retry_after()
    }

    /// The outcome of the first rule (the only one for [`Limiter::reserve`]).
    pub fn outcome(&self) -> &Outcome {
        &self.decision.rules()[0].outcome
    }

    /// Every rule's outcome.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// Sleeps until the reserved slot (returns at once when granted now or denied).
    pub async fn ready(&self) {
        if self.is_granted() {
            tokio::time::sleep_until(self.at + self.wait()).await;
        }
    }

    /// Gives the units back under every rule (e.g. the work was called off). Does nothing for a
    /// denied reservation.
    pub async fn cancel(self) -> Result<(), LimitError> {
        if !self.is_granted() {
            return Ok(());
        }
        for entry in self.decision.rules() {
            self.limiter
                .refund(&entry.rule, &entry.key, entry.cost)
                .await?;
        }
        Ok(())
    }
}

fn unknown(rule: &str) -> LimitError {
    LimitError::UnknownRule(rule.to_owned())
}

/// The rule named `rule`, if it has overrides.
fn overridable<'r>(
    rules: &'r RuleSet,
    rule: &str,
) -> Result<(usize, &'r crate::rules::rule::CompiledRule), LimitError> {
    let (index, compiled) = rules.find(rule).ok_or_else(|| unknown(rule))?;
    if !compiled.overridable {
        return Err(LimitError::NotOverridable(rule.to_owned()));
    }
    Ok((index, compiled))
}

/// The name of `rule` as its store knows it, if it has a penalty (only such rules keep blocks).
fn penalised<'r>(rules: &'r RuleSet, rule: &str) -> Result<&'r str, LimitError> {
    let (_, compiled) = rules.find(rule).ok_or_else(|| unknown(rule))?;
    match compiled.penalty {
        Some(_) => Ok(&compiled.name),
        None => Err(LimitError::NoPenalty(rule.to_owned())),
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("rules", &*self.inner.rules.load())
            .field("store", &self.inner.ledger.store())
            .finish()
    }
}
