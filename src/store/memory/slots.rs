//! The states of every algorithm but the token bucket (whose entries are `spans`'): one kind of
//! slot per algorithm, evaluated and changed by the algorithms' own functions.

use super::spans::Spans;
use super::table::Expiring;
use super::PINNED;
use crate::algorithm::{
    Algorithm, BurstPoolState, FixedWindowState, Micros, Mode, Outcome, SlidingLogState,
    SlidingWindowState,
};

/// A state of any algorithm but the token bucket, with the moment it becomes idle.
pub(super) struct Timed {
    pub(super) state: Slot,
    pub(super) expires: Micros,
}

pub(super) enum Slot {
    Window(FixedWindowState),
    Sliding(SlidingWindowState),
    Pool(BurstPoolState),
    Log(Box<SlidingLogState>),
    /// A concurrency limit's slots taken.
    InFlight(u64),
}

impl Expiring for Timed {
    fn expires(&self, _: &Spans) -> Micros {
        self.expires
    }
}

/// What happens to a state: units charged or given back.
#[derive(Clone, Copy)]
pub(super) enum Change {
    Charge(u64),
    Refund(u64),
}

/// The outcome of charging `cost` at `now` to a key whose state under `algorithm` is `slot`.
pub(super) fn evaluate_slot(
    algorithm: &Algorithm,
    slot: &Slot,
    now: Micros,
    cost: u64,
    mode: Mode,
) -> Outcome {
    match (algorithm, slot) {
        (Algorithm::FixedWindow(a), Slot::Window(s)) => a.evaluate(*s, now, cost, mode),
        (Algorithm::SlidingWindow(a), Slot::Sliding(s)) => a.evaluate(*s, now, cost),
        (Algorithm::BurstPool(a), Slot::Pool(s)) => a.evaluate(*s, now, cost),
        (Algorithm::SlidingLog(a), Slot::Log(s)) => a.evaluate(s, now, cost),
        (Algorithm::Concurrency(a), Slot::InFlight(n)) => a.evaluate(*n, cost),
        _ => Outcome::unreachable(algorithm),
    }
}

/// Applies `change` to a non-bucket state in place; returns the state's new expiry.
pub(super) fn change_slot(
    algorithm: &Algorithm,
    slot: &mut Slot,
    now: Micros,
    change: Change,
) -> Micros {
    match (algorithm, slot) {
        (Algorithm::FixedWindow(a), Slot::Window(s)) => {
            *s = match change {
                Change::Charge(units) => a.commit(*s, now, units),
                Change::Refund(units) => a.refund(*s, now, units),
            };
            a.expires_at(*s)
        }
        (Algorithm::SlidingWindow(a), Slot::Sliding(s)) => {
            *s = match change {
                Change::Charge(units) => a.commit(*s, now, units),
                Change::Refund(units) => a.refund(*s, now, units),
            };
            a.expires_at(*s)
        }
        (Algorithm::BurstPool(a), Slot::Pool(s)) => {
            *s = match change {
                Change::Charge(units) => a.commit(*s, now, units),
                Change::Refund(units) => a.refund(*s, now, units),
            };
            a.expires_at(*s)
        }
        (Algorithm::SlidingLog(a), Slot::Log(s)) => {
            match change {
                Change::Charge(units) => a.commit(s, now, units),
                Change::Refund(units) => a.refund(s, now, units),
            }
            a.expires_at(s)
        }
        (Algorithm::Concurrency(a), Slot::InFlight(n)) => {
            *n = match change {
                Change::Charge(units) => a.commit(*n, units),
                Change::Refund(units) => a.refund(*n, units),
            };
            // Idle once every slot is back; never evicted while one is taken (forgetting a
            // taken slot would let one request too many in).
            if *n == 0 {
                now
            } else {
                PINNED
            }
        }
        // `update` gives every algorithm its own kind of slot.
        _ => now,
    }
}

pub(super) fn slot_matches(slot: &Slot, algorithm: &Algorithm) -> bool {
    matches!(
        (algorithm, slot),
        (Algorithm::FixedWindow(_), Slot::Window(_))
            | (Algorithm::SlidingWindow(_), Slot::Sliding(_))
            | (Algorithm::BurstPool(_), Slot::Pool(_))
            | (Algorithm::SlidingLog(_), Slot::Log(_))
            | (Algorithm::Concurrency(_), Slot::InFlight(_))
    )
}
