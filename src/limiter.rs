//! `Limiter`: a set of rules and the store behind them, usable with or without the middleware.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::Request;

use crate::algorithm::{CostTooLarge, Mode, Outcome};
use crate::decision::{Decision, Ruling};
use crate::error::ConfigError;
use crate::key::KeyValue;
use crate::rule::{MissingKey, Rule, RuleSummary};
use crate::ruleset::{AccessList, Answer, Route, RuleSet, StoreRef};
use crate::store::{Charge, MemoryStore, Store, StoreError};

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
    store: Arc<dyn Store>,
    /// The same store when it is the memory store, held by its type: requests then reach its
    /// decision without a virtual call, and the compiler can build it into the request path.
    memory: Option<MemoryStore>,
}

/// Builds a [`Limiter`].
#[derive(Debug, Default)]
pub struct LimiterBuilder {
    rules: Vec<Rule>,
    allow: Vec<AccessList>,
    deny: Vec<AccessList>,
    store: Option<Arc<dyn Store>>,
    memory: Option<MemoryStore>,
}

impl LimiterBuilder {
    /// Adds a rule. A request is charged by every rule whose scope it is in, all or nothing.
    pub fn rule(mut self, rule: impl Into<Rule>) -> Self {
        self.rules.push(rule.into());
        self
    }

    /// The store (default: a new [`MemoryStore`]).
    pub fn store(mut self, store: impl Store) -> Self {
        self.memory = (&store as &dyn Any).downcast_ref::<MemoryStore>().cloned();
        self.store = Some(Arc::new(store));
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
        let (store, memory) = match self.store {
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
                store,
                memory,
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
            LimitError::Store(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for LimitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LimitError::Store(error) => Some(error),
            LimitError::CostTooLarge { error, .. } => Some(error),
            LimitError::UnknownRule(_) | LimitError::NotQueued(_) => None,
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

    /// The names of the rules in force, in order.
    pub fn rule_names(&self) -> Vec<String> {
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
        self.inner.rules.store(Arc::new(rules));
        tracing::info!(rules = ?self.rule_names(), "rate limit: rules reloaded");
        Ok(())
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
        &*self.inner.store
    }

    /// The store, by type when it is the memory store.
    #[inline]
    pub(crate) fn store_ref(&self) -> StoreRef<'_> {
        match &self.inner.memory {
            Some(memory) => StoreRef::Memory(memory),
            None => StoreRef::Dyn(&*self.inner.store),
        }
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
        let outcome = self.one(rule, key.as_ref(), cost, None).await?;
        Ok(Reservation {
            outcome,
            at: tokio::time::Instant::now(),
            limiter: self.clone(),
            rule: rule.to_owned(),
            key: KeyValue::new(key.as_ref()),
            cost,
        })
    }

    /// Gives `units` back to `key` under `rule` (never above the capacity), e.g. when work that was
    /// charged for did not happen.
    pub async fn refund(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
        units: u64,
    ) -> Result<(), LimitError> {
        let key = KeyValue::new(key.as_ref());
        let pending = {
            let rules = self.rules();
            let (index, _) = rules.find(rule).ok_or_else(|| unknown(rule))?;
            let charge = Charge {
                mode: Mode::Charge,
                ..rules.charge(index, &key, units)
            };
            self.store().refund(&charge)
        };
        Ok(pending.await?)
    }

    /// Forgets `key` under `rule`: its next request is treated as a new key's.
    pub async fn reset(&self, rule: &str, key: impl AsRef<[u8]>) -> Result<(), LimitError> {
        let key = KeyValue::new(key.as_ref());
        let pending = {
            let rules = self.rules();
            let (_, compiled) = rules.find(rule).ok_or_else(|| unknown(rule))?;
            self.store()
                .reset(&compiled.name, compiled.algorithm(), key.as_bytes())
        };
        Ok(pending.await?)
    }

    /// Runs one request through the rules as the middleware does — deny and allow lists, the rules
    /// whose scope it is in, their keys and costs, one atomic charge of the store — and returns
    /// what they decided, without a Tower service, a response or a queue-mode wait. For tools that
    /// replay traffic through a configuration (the `tollgate` command) and for tests.
    ///
    /// Shadow rules are charged apart from the enforced ones, as in the middleware; the layer's
    /// own `shadow` switch (every rule in shadow mode) is a layer setting and is not applied.
    /// Nothing is recorded in metrics or logs.
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::{Key, Limit, Limiter, Ruling};
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
        let (mut enforced, mut shadow) = (Decision::default(), Decision::default());
        let answers = {
            let rules = self.rules();
            match rules.route(request, false, &mut enforced, &mut shadow) {
                Ok(Route::Planned) => {}
                Ok(Route::Allowed) => return Ok(Ruling::Allowed),
                Err(refusal) => return Ok(refusal.into()),
            }
            let ask = |plan: &mut Decision| {
                if plan.rules().is_empty() {
                    Answer::Now(Ok(()))
                } else {
                    rules.ask(self.store_ref(), plan)
                }
            };
            [ask(&mut enforced), ask(&mut shadow)]
        };
        let [for_enforced, for_shadow] = answers;
        for (answer, plan) in [(for_enforced, &mut enforced), (for_shadow, &mut shadow)] {
            match answer {
                Answer::Now(result) => result?,
                Answer::Later(pending) => plan.answer(pending.await?)?,
            }
        }
        Ok(Ruling::Decided { enforced, shadow })
    }

    /// Decides one charge; a `mode` of `None` uses the rule's own.
    async fn one(
        &self,
        rule: &str,
        key: &[u8],
        cost: u64,
        mode: Option<Mode>,
    ) -> Result<Outcome, LimitError> {
        let key = KeyValue::new(key);
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
                ..rules.charge(index, &key, cost)
            };
            self.store_ref().apply_one(&charge)
        };
        Ok(pending.await?)
    }

    /// Gives back what one request was charged, without waiting: used when a queued request is
    /// dropped (its client went away). A store that needs I/O finishes the refund on the current
    /// tokio runtime.
    pub(crate) fn refund_now(&self, rules: &RuleSet, charged: &[(usize, KeyValue, u64)]) {
        for (index, key, cost) in charged {
            if *index >= rules.rules.len() {
                continue;
            }
            if let Err(pending) = self
                .store()
                .refund(&rules.charge(*index, key, *cost))
                .into_ready()
            {
                match tokio::runtime::Handle::try_current() {
                    Ok(runtime) => {
                        runtime.spawn(async move {
                            if let Err(error) = pending.await {
                                tracing::warn!(%error, "refund of a cancelled queued request failed");
                            }
                        });
                    }
                    Err(_) => tracing::warn!("no runtime to refund a cancelled queued request"),
                }
            }
        }
    }
}

/// The answer to [`Limiter::reserve`].
#[derive(Debug)]
#[must_use = "a granted reservation holds units until it is used or cancelled"]
pub struct Reservation {
    outcome: Outcome,
    at: tokio::time::Instant,
    limiter: Limiter,
    rule: String,
    key: KeyValue,
    cost: u64,
}

impl Reservation {
    /// Whether the units were set aside (now or for later).
    pub fn is_granted(&self) -> bool {
        self.outcome.is_allowed()
    }

    /// How long after the reservation the work may start (zero when it may start now).
    pub fn wait(&self) -> Duration {
        match self.outcome.verdict {
            crate::Verdict::Reserved { wait } => wait,
            _ => Duration::ZERO,
        }
    }

    /// For a denied reservation: when the same reservation would be accepted.
    pub fn retry_after(&self) -> Option<Duration> {
        self.outcome.retry_after()
    }

    /// The full outcome.
    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    /// Sleeps until the reserved slot (returns at once when granted now or denied).
    pub async fn ready(&self) {
        if self.is_granted() {
            tokio::time::sleep_until(self.at + self.wait()).await;
        }
    }

    /// Gives the units back (e.g. the work was called off). Does nothing for a denied reservation.
    pub async fn cancel(self) -> Result<(), LimitError> {
        if !self.is_granted() {
            return Ok(());
        }
        self.limiter.refund(&self.rule, &self.key, self.cost).await
    }
}

fn unknown(rule: &str) -> LimitError {
    LimitError::UnknownRule(rule.to_owned())
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("rules", &*self.inner.rules.load())
            .field("store", &self.inner.store)
            .finish()
    }
}
