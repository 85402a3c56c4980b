//! Concurrency slots: the guard that gives a request's slots back whatever way it
//! ends, and the first-come-first-served line of requests waiting for a slot in queue mode.
//!
//! A slot is taken by the store in the same atomic step as the request's other rules (it is a
//! charge of one unit under a [`Concurrency`](crate::algorithm::Concurrency) limit). From then
//! on a [`Slots`] guard owns it: the middleware moves the guard from the decision into the
//! response future and then into the response body, so the slot is given back when the body
//! ends or is dropped, when the service fails, or when the request's future is dropped — by the
//! guard's `Drop`, so no path can forget it. A request that waits for a slot holds a ticket in
//! one of the [`lines`](super::lines).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use smallvec::SmallVec;

use super::decision::{Decision, Plan};
use super::ledger::Ledger;
use super::lines::{LineOf, Waiter};
use crate::algorithm::Mode;
use crate::key::KeyValue;
use crate::rules::set::RuleSet;

/// The slots one request holds; each is given back (and the next waiter woken) when this is
/// dropped.
pub(crate) struct Slots {
    ledger: Ledger,
    rules: Arc<RuleSet>,
    held: SmallVec<[(usize, KeyValue); 1]>,
}

impl Slots {
    /// The slots an admitted decision took: its entries under concurrency rules; `None` when
    /// there are none (the rule set's flag spares other requests the look).
    #[inline]
    pub(crate) fn of(ledger: &Ledger, rules: &Arc<RuleSet>, decision: &Decision) -> Option<Self> {
        if !rules.slots {
            return None;
        }
        Self::taken(ledger, rules, decision)
    }

    fn taken(ledger: &Ledger, rules: &Arc<RuleSet>, decision: &Decision) -> Option<Self> {
        let held: SmallVec<[(usize, KeyValue); 1]> = decision
            .rules()
            .iter()
            .filter(|entry| entry.cost > 0 && rules.rules[entry.index].algorithm().is_concurrency())
            .map(|entry| (entry.index, entry.key.clone()))
            .collect();
        (!held.is_empty()).then(|| Slots {
            ledger: ledger.clone(),
            rules: rules.clone(),
            held,
        })
    }

    /// The one slot taken under rule `index` for `key` through the limiter handle.
    pub(crate) fn one(ledger: &Ledger, rules: Arc<RuleSet>, index: usize, key: KeyValue) -> Self {
        Slots {
            ledger: ledger.clone(),
            rules,
            held: smallvec::smallvec![(index, key)],
        }
    }
}

/// A concurrency slot taken with [`Limiter::acquire`](crate::Limiter::acquire): held until this is dropped, then given
/// back (and the first request waiting for a slot of the key on this instance woken).
#[derive(Debug)]
#[must_use = "the slot is given back as soon as this is dropped"]
pub struct SlotGuard {
    _slots: Slots,
}

impl SlotGuard {
    pub(crate) fn new(slots: Slots) -> Self {
        SlotGuard { _slots: slots }
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        for (index, key) in &self.held {
            self.ledger.release_slot_now(&self.rules, *index, key);
        }
    }
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("held", &self.held.len())
            .finish()
    }
}

/// A request's place in a line: it asks the store again each time it is woken, and leaves the
/// line when dropped (admitted, refused or cancelled).
pub(crate) struct Ticket {
    ledger: Ledger,
    line: LineOf,
    waiter: Arc<Waiter>,
    since: tokio::time::Instant,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Stores shared by several instances learn of slots given back elsewhere only by asking:
    /// the next look and the current interval.
    poll: Option<(Pin<Box<tokio::time::Sleep>>, Duration)>,
}

/// The first and the longest interval between looks at a shared store.
const FIRST_POLL: Duration = Duration::from_millis(50);
const LAST_POLL: Duration = Duration::from_millis(500);

/// What a waiting request learns.
pub(crate) enum Woken {
    /// A slot may be free: ask the store again.
    Retry,
    /// The wait reached the queue's `max_delay`.
    TimedOut,
}

impl Ticket {
    /// The line a denied decision should wait in: the first rule that denied it, if that rule is
    /// a queued concurrency rule and every other denial is one too (a rule over time that
    /// denies is not helped by waiting for a slot).
    pub(crate) fn line_for(rules: &RuleSet, decision: &Decision) -> Option<(usize, KeyValue)> {
        if !rules.slots {
            return None;
        }
        let mut denied = decision.rules().iter().filter(|e| !e.outcome.is_allowed());
        let first = denied.next()?;
        let queued = |index: usize| {
            let rule = &rules.rules[index];
            rule.algorithm().is_concurrency() && matches!(rule.mode, Mode::Reserve(_))
        };
        (queued(first.index) && denied.all(|e| queued(e.index)))
            .then(|| (first.index, first.key.clone()))
    }

    /// A newcomer whose planned slot rules already have a line: it joins the line instead of
    /// asking the store, so it cannot pass those already waiting.
    #[inline]
    pub(crate) fn behind(
        ledger: &Ledger,
        rules: &RuleSet,
        plan: &Plan,
    ) -> Option<(usize, KeyValue)> {
        if !rules.slots {
            return None;
        }
        Self::busy_line(ledger, rules, plan)
    }

    fn busy_line(ledger: &Ledger, rules: &RuleSet, plan: &Plan) -> Option<(usize, KeyValue)> {
        plan.rules()
            .iter()
            .find(|e| {
                let rule = &rules.rules[e.index];
                rule.algorithm().is_concurrency()
                    && matches!(rule.mode, Mode::Reserve(_))
                    && ledger.lines().busy(&rule.name, &e.key)
            })
            .map(|e| (e.index, e.key.clone()))
    }

    /// Joins the line of `(index, key)`; `None` when the queue's `burst` already wait (the
    /// request is then denied). A ticket first in line is woken at once: the slot it waits for
    /// may have been given back between its denial and its joining.
    pub(crate) fn join(
        ledger: &Ledger,
        rules: &RuleSet,
        index: usize,
        key: KeyValue,
    ) -> Option<Ticket> {
        let rule = &rules.rules[index];
        let Mode::Reserve(bound) = rule.mode else {
            return None;
        };
        let line = (rule.name.clone(), key);
        let waiter = Arc::new(Waiter::default());
        let first = ledger.lines().join(&line, &waiter, bound.max_units)?;
        if first {
            waiter.wake();
        }
        let poll =
            (!ledger.is_memory()).then(|| (Box::pin(tokio::time::sleep(FIRST_POLL)), FIRST_POLL));
        Some(Ticket {
            ledger: ledger.clone(),
            line,
            waiter,
            since: tokio::time::Instant::now(),
            deadline: bound
                .max_wait
                .map(|wait| Box::pin(tokio::time::sleep(wait))),
            poll,
        })
    }

    /// How long the request has waited.
    pub(crate) fn waited(&self) -> Duration {
        self.since.elapsed()
    }

    /// Whether this ticket waits in the line of `(index, key)`.
    pub(crate) fn waits_for(&self, rules: &RuleSet, index: usize, key: &KeyValue) -> bool {
        rules
            .rules
            .get(index)
            .is_some_and(|rule| rule.name == self.line.0)
            && self.line.1 == *key
    }

    /// Waits until the ticket is woken, its poll interval passes, or its deadline.
    pub(crate) fn poll_woken(&mut self, cx: &mut Context<'_>) -> Poll<Woken> {
        if let Some(deadline) = &mut self.deadline {
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Woken::TimedOut);
            }
        }
        if self.waiter.poll_woken(cx).is_ready() {
            return Poll::Ready(Woken::Retry);
        }
        if let Some((sleep, every)) = &mut self.poll {
            while sleep.as_mut().poll(cx).is_ready() {
                *every = (*every * 2).min(LAST_POLL);
                let next = tokio::time::Instant::now() + *every;
                sleep.as_mut().reset(next);
                // Only the first in line looks: the others would pass it.
                if self.ledger.lines().is_first(&self.line, &self.waiter) {
                    return Poll::Ready(Woken::Retry);
                }
            }
        }
        Poll::Pending
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.ledger.lines().leave(&self.line, &self.waiter);
    }
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("rule", &self.line.0)
            .finish_non_exhaustive()
    }
}
