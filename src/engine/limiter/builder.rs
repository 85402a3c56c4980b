//! `LimiterBuilder`: the rules, lists and store a limiter is built from.

use crate::engine::ask;
use std::any::Any;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::{Inner, Limiter};
use crate::algorithm::error::ConfigError;
use crate::engine::ledger::Ledger;
use crate::rules::rule::Rule;
use crate::rules::set::{AccessList, RuleSet};
use crate::store::{CircuitBreaker, FailurePolicy, Guarded, MemoryStore, Store};

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
    /// [`LimitError::UnknownRule`](crate::LimitError::UnknownRule) until
    /// [`with_rules`](Limiter::with_rules) gives it some.
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
        ask::check_store(&rules, &*store)?;
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
