//! The key API: check, charge, reserve, refund or reset one key of one rule, hold a concurrency
//! slot, and the `Reservation` a reserve answers.

use crate::engine::charge;
use std::time::Duration;

use super::{unknown, LimitError, Limiter};
use crate::algorithm::{Mode, Outcome, ReserveBound};
use crate::engine::decision::Decision;
use crate::engine::slot::{SlotGuard, Slots};
use crate::key::KeyValue;
use crate::store::Charge;

impl Limiter {
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
    pub(super) async fn reservation<K: AsRef<[u8]>>(
        &self,
        charge: [(&str, K); 1],
        cost: u64,
        mode: Option<Mode>,
    ) -> Result<Reservation, LimitError> {
        let [(rule, key)] = charge;
        let decision = self.many([(rule, key, cost, None)], mode).await?;
        Ok(Reservation::new(decision, self))
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
                ..charge::charge(&rules, index, &key, units)
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
            ..charge::charge(&rules, index, &key, 1)
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
                read_overrides: compiled.overridable,
                ..charge::charge(&rules, index, &key, cost)
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
    pub(super) fn new(decision: Decision, limiter: &Limiter) -> Self {
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
