//! `Limiter`: a set of rules and the store behind them, usable with or without the middleware.

use std::fmt;
use std::sync::Arc;

use http::{Request, StatusCode};
use smallvec::SmallVec;

use crate::algorithm::{CostTooLarge, Mode, Outcome};
use crate::cost::CostError;
use crate::error::ConfigError;
use crate::key::{KeyValue, RequestHead};
use crate::rule::{CompiledRule, MissingKey, Rule};
use crate::store::{Charge, MemoryStore, Outcomes, Store, StoreError};

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
    rules: Box<[CompiledRule]>,
    store: Arc<dyn Store>,
}

/// Builds a [`Limiter`].
#[derive(Debug, Default)]
pub struct LimiterBuilder {
    rules: Vec<Rule>,
    store: Option<Arc<dyn Store>>,
}

impl LimiterBuilder {
    /// Adds a rule. A request is charged by every rule whose scope it is in, all or nothing.
    pub fn rule(mut self, rule: impl Into<Rule>) -> Self {
        self.rules.push(rule.into());
        self
    }

    /// The store (default: a new [`MemoryStore`]).
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// Validates the rules and builds the limiter.
    pub fn build(self) -> Result<Limiter, ConfigError> {
        let mut rules: Vec<CompiledRule> = Vec::with_capacity(self.rules.len());
        for rule in self.rules {
            let rule = rule.compile()?;
            if rules.iter().any(|r| r.name == rule.name) {
                return Err(ConfigError::new(
                    &rule.name,
                    "name",
                    "another rule has the same name (names are the rules' namespaces)",
                ));
            }
            rules.push(rule);
        }
        let store = self.store.unwrap_or_else(|| Arc::new(MemoryStore::new()));
        for rule in &rules {
            store.validate(&rule.name, rule.algorithm())?;
        }
        Ok(Limiter {
            inner: Arc::new(Inner {
                rules: rules.into_boxed_slice(),
                store,
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
    /// The store failed.
    Store(StoreError),
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitError::UnknownRule(name) => write!(f, "no rate-limit rule is named {name:?}"),
            LimitError::CostTooLarge { rule, error } => write!(f, "rule {rule:?}: {error}"),
            LimitError::Store(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for LimitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LimitError::Store(error) => Some(error),
            LimitError::CostTooLarge { error, .. } => Some(error),
            LimitError::UnknownRule(_) => None,
        }
    }
}

impl From<StoreError> for LimitError {
    fn from(error: StoreError) -> Self {
        LimitError::Store(error)
    }
}

/// One rule's charge for a request: which rule, which key, how much.
#[derive(Debug)]
pub(crate) struct Planned {
    pub(crate) rule: usize,
    pub(crate) key: KeyValue,
    pub(crate) cost: u64,
}

/// The charges of one request.
pub(crate) type Plan = SmallVec<[Planned; 2]>;

/// A request refused before the store is asked.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The rule's key is missing and the rule rejects such requests.
    MissingKey {
        rule: Arc<str>,
        key: String,
        status: StatusCode,
    },
    /// The request's cost could not be read.
    BadCost { rule: Arc<str>, error: CostError },
    /// The request's cost can never pass.
    CostTooLarge { rule: Arc<str>, error: CostTooLarge },
}

impl Limiter {
    /// Configures a limiter.
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder::default()
    }

    /// The names of the rules, in order.
    pub fn rule_names(&self) -> impl Iterator<Item = &str> {
        self.inner.rules.iter().map(|r| &*r.name)
    }

    pub(crate) fn rules(&self) -> &[CompiledRule] {
        &self.inner.rules
    }

    pub(crate) fn store(&self) -> &dyn Store {
        &*self.inner.store
    }

    /// The key `rule` derives from `request` (what the middleware would charge), if present.
    pub fn key_for<B>(
        &self,
        rule: &str,
        request: &Request<B>,
    ) -> Result<Option<KeyValue>, LimitError> {
        let rule = self.rule(rule)?.1;
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
        self.one(rule, key.as_ref(), cost, Mode::Check).await
    }

    /// Charges `cost` to `key` under `rule` if it fits now; the outcome says whether it did.
    pub async fn charge(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
        cost: u64,
    ) -> Result<Outcome, LimitError> {
        self.one(rule, key.as_ref(), cost, Mode::Charge).await
    }

    /// Gives `units` back to `key` under `rule` (never above the capacity), e.g. when work that was
    /// charged for did not happen.
    pub async fn refund(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
        units: u64,
    ) -> Result<(), LimitError> {
        let (_, compiled) = self.rule(rule)?;
        let key = KeyValue::new(key.as_ref());
        let charge = Charge {
            rule: &compiled.name,
            algorithm: compiled.algorithm(),
            key: key.as_bytes(),
            cost: units,
            mode: Mode::Charge,
        };
        Ok(self.store().refund(&charge).await?)
    }

    /// Forgets `key` under `rule`: its next request is treated as a new key's.
    pub async fn reset(&self, rule: &str, key: impl AsRef<[u8]>) -> Result<(), LimitError> {
        let (_, compiled) = self.rule(rule)?;
        let key = KeyValue::new(key.as_ref());
        Ok(self
            .store()
            .reset(&compiled.name, compiled.algorithm(), key.as_bytes())
            .await?)
    }

    fn rule(&self, name: &str) -> Result<(usize, &CompiledRule), LimitError> {
        self.inner
            .rules
            .iter()
            .enumerate()
            .find(|(_, r)| &*r.name == name)
            .ok_or_else(|| LimitError::UnknownRule(name.to_owned()))
    }

    async fn one(
        &self,
        rule: &str,
        key: &[u8],
        cost: u64,
        mode: Mode,
    ) -> Result<Outcome, LimitError> {
        let (_, compiled) = self.rule(rule)?;
        compiled
            .algorithm()
            .check_cost(cost, mode)
            .map_err(|error| LimitError::CostTooLarge {
                rule: rule.to_owned(),
                error,
            })?;
        let key = KeyValue::new(key);
        let charge = Charge {
            rule: &compiled.name,
            algorithm: compiled.algorithm(),
            key: key.as_bytes(),
            cost,
            mode,
        };
        let outcomes = self.store().apply(&[charge]).await?;
        outcomes.first().copied().ok_or_else(|| {
            StoreError::new(crate::store::StoreErrorKind::Protocol, "no outcome").into()
        })
    }

    /// The charges a request makes: which rules apply, with which key and cost.
    pub(crate) fn plan<B>(&self, request: &Request<B>) -> Result<Plan, Refusal> {
        let head = RequestHead::of(request);
        let mut plan = Plan::new();
        for (index, rule) in self.inner.rules.iter().enumerate() {
            if !rule.applies_to(&head) {
                continue;
            }
            let key = match rule.key.extract(request) {
                Some(key) => key,
                None => match &rule.missing_key {
                    MissingKey::Skip => continue,
                    MissingKey::Fallback(fallback) => match fallback.extract(request) {
                        Some(key) => key,
                        None => return Err(missing(rule, StatusCode::BAD_REQUEST)),
                    },
                    MissingKey::Reject => return Err(missing(rule, StatusCode::BAD_REQUEST)),
                    MissingKey::RejectWith(status) => return Err(missing(rule, *status)),
                },
            };
            let cost = rule.cost.of(&head).map_err(|error| Refusal::BadCost {
                rule: rule.name.clone(),
                error,
            })?;
            rule.algorithm()
                .check_cost(cost, rule.mode)
                .map_err(|error| Refusal::CostTooLarge {
                    rule: rule.name.clone(),
                    error,
                })?;
            plan.push(Planned {
                rule: index,
                key,
                cost,
            });
        }
        Ok(plan)
    }

    /// The store's view of a plan.
    pub(crate) fn charges<'a>(&'a self, plan: &'a Plan) -> SmallVec<[Charge<'a>; 2]> {
        plan.iter()
            .map(|p| {
                let rule = &self.inner.rules[p.rule];
                Charge {
                    rule: &rule.name,
                    algorithm: rule.algorithm(),
                    key: p.key.as_bytes(),
                    cost: p.cost,
                    mode: rule.mode,
                }
            })
            .collect()
    }

    /// Asks the store for a plan's outcomes.
    pub(crate) fn apply(&self, plan: &Plan) -> crate::store::StoreFuture<Outcomes> {
        self.store().apply(&self.charges(plan))
    }
}

fn missing(rule: &CompiledRule, status: StatusCode) -> Refusal {
    Refusal::MissingKey {
        rule: rule.name.clone(),
        key: rule.key.describe(),
        status,
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("rules", &self.inner.rules)
            .field("store", &self.inner.store)
            .finish()
    }
}
