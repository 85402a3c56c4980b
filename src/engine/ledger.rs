//! What a request leaves behind for the store once it has been decided: units to give back (a
//! queued request dropped, a response its rule does not count), a settlement's difference to
//! charge, a concurrency slot to give back and the next in line to wake. Each is done without
//! waiting: the memory store at once, a store that needs I/O on the current tokio runtime (or a
//! warning when there is none). Holds, settlements and slots talk to this, never to the
//! [`Limiter`](super::limiter::Limiter) handle.

use crate::engine::charge;
use std::sync::Arc;

use super::decision::RuleDecision;
use super::lines::Lines;
use crate::algorithm::{Mode, Outcome, ReserveBound};
use crate::key::KeyValue;
use crate::rules::set::RuleSet;
use crate::store::{Charge, MemoryStore, Store, StoreError, StoreFuture};

/// The store a plan goes to: the memory store by its type (its decision can then be compiled
/// into the request path), any other through its trait object.
#[derive(Clone, Copy)]
pub(crate) enum StoreRef<'a> {
    Memory(&'a MemoryStore),
    Dyn(&'a dyn Store),
}

impl<'a> StoreRef<'a> {
    /// [`Store::apply_one`], called by type when the store is the memory store.
    #[inline]
    pub(crate) fn apply_one(self, charge: &Charge<'_>) -> StoreFuture<Outcome> {
        match self {
            StoreRef::Memory(memory) => memory.apply_one(charge),
            StoreRef::Dyn(store) => store.apply_one(charge),
        }
    }

    /// [`apply_one`](Self::apply_one) with the answer taken when it is ready: the memory
    /// store's decision is returned as it is, never wrapped in a future and taken out again
    /// (the compiler did not always see through that, and copied the outcome twice).
    #[inline]
    pub(crate) fn decide_one(
        self,
        charge: &Charge<'_>,
    ) -> Result<Result<Outcome, StoreError>, StoreFuture<Outcome>> {
        match self {
            StoreRef::Memory(memory) => Ok(Ok(memory.decide(charge))),
            StoreRef::Dyn(store) => store.apply_one(charge).into_ready(),
        }
    }

    pub(crate) fn as_dyn(self) -> &'a dyn Store {
        match self {
            StoreRef::Memory(memory) => memory,
            StoreRef::Dyn(store) => store,
        }
    }
}

/// The store behind a limiter, and the lines of requests waiting for its slots on this instance.
/// Cheap to clone.
#[derive(Clone)]
pub(crate) struct Ledger(Arc<Books>);

struct Books {
    store: Arc<dyn Store>,
    /// The same store when it is the memory store, held by its type: requests then reach its
    /// decision without a virtual call, and the compiler can build it into the request path.
    memory: Option<MemoryStore>,
    /// Requests waiting for a concurrency slot, on this instance.
    lines: Lines,
}

impl Ledger {
    pub(crate) fn new(store: Arc<dyn Store>, memory: Option<MemoryStore>) -> Ledger {
        Ledger(Arc::new(Books {
            store,
            memory,
            lines: Lines::default(),
        }))
    }

    pub(crate) fn store(&self) -> &dyn Store {
        &*self.0.store
    }

    /// The store, by type when it is the memory store.
    #[inline]
    pub(crate) fn store_ref(&self) -> StoreRef<'_> {
        match &self.0.memory {
            Some(memory) => StoreRef::Memory(memory),
            None => StoreRef::Dyn(&*self.0.store),
        }
    }

    /// The requests waiting for a concurrency slot on this instance.
    pub(crate) fn lines(&self) -> &Lines {
        &self.0.lines
    }

    /// Whether the store is this process's memory store (every slot given back is seen here).
    pub(crate) fn is_memory(&self) -> bool {
        self.0.memory.is_some()
    }

    /// Gives back what one request was charged: used when a queued request is dropped (its
    /// client went away) or its response is not counted.
    pub(crate) fn refund_now(&self, rules: &RuleSet, charged: &[(usize, KeyValue, u64)]) {
        for (index, key, cost) in charged {
            if *index < rules.rules.len() {
                self.refund_charge_now(&charge::charge(rules, *index, key, *cost));
            }
        }
    }

    /// [`refund_now`](Self::refund_now) for a queued request's decided entries: a per-request
    /// limit's units go back under the limit they were charged under.
    pub(crate) fn refund_decided_now(&self, rules: &RuleSet, charged: &[RuleDecision]) {
        for entry in charged {
            if entry.index < rules.rules.len() {
                self.refund_charge_now(&charge::charge_of(rules, entry));
            }
        }
    }

    fn refund_charge_now(&self, charge: &Charge<'_>) {
        if let Err(pending) = self.store().refund(charge).into_ready() {
            spawn_or_warn(pending, "giving back a request's units", || {});
        }
    }

    /// Charges `units` more to `key` under a settled rule, into debt if need be: a settlement
    /// after the response has left.
    pub(crate) fn owe_now(&self, rules: &RuleSet, index: usize, key: &KeyValue, units: u64) {
        if index >= rules.rules.len() {
            return;
        }
        let charge = Charge {
            mode: Mode::Reserve(ReserveBound::default()),
            penalty: None,
            ..charge::charge(rules, index, key, units)
        };
        if let Err(pending) = self.store_ref().apply_one(&charge).into_ready() {
            spawn_or_warn(pending, "charging a settlement", || {});
        }
    }

    /// Gives back the slot one request held under concurrency rule `index`, then wakes the first
    /// request waiting for a slot of the key on this instance. (Without a runtime, the store's
    /// lease — Redis — gives the slot back when it expires.)
    pub(crate) fn release_slot_now(&self, rules: &RuleSet, index: usize, key: &KeyValue) {
        let Some(rule) = rules.rules.get(index) else {
            return;
        };
        let charge = Charge {
            mode: Mode::Charge,
            ..charge::charge(rules, index, key, 1)
        };
        match self.store().refund(&charge).into_ready() {
            Ok(result) => {
                if let Err(error) = result {
                    tracing::warn!(%error, rule = %rule.name, "rate limit: giving a slot back failed");
                }
                self.lines().wake(&rule.name, key);
            }
            Err(pending) => {
                let (ledger, name, key) = (self.clone(), rule.name.clone(), key.clone());
                spawn_or_warn(pending, "giving a slot back", move || {
                    ledger.lines().wake(&name, &key);
                });
            }
        }
    }
}

/// Finishes a store call that needs I/O on the current tokio runtime, then runs `after`; warns
/// when the call fails, or when there is no runtime to finish it on.
fn spawn_or_warn<T: Send + 'static>(
    pending: StoreFuture<T>,
    what: &'static str,
    after: impl FnOnce() + Send + 'static,
) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(async move {
                let result: Result<T, StoreError> = pending.await;
                if let Err(error) = result {
                    tracing::warn!(%error, "rate limit: {what} failed");
                }
                after();
            });
        }
        Err(_) => tracing::warn!("rate limit: no tokio runtime for {what}"),
    }
}
