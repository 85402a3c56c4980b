use std::time::Duration;

use super::{Outcome, Verdict};

/// A concurrency limit: at most `max` requests of a key in flight at once.
///
/// Not a quota over time: a slot is taken when a request is admitted and given back when its
/// response ends, however long that takes. The state is the number of slots taken; a charge of
/// `cost` takes `cost` slots (the middleware always takes one per request).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Concurrency {
    max: u64,
}

/// What a denied request is told to wait: no estimate of when a slot frees is better than one
/// second (a response's length is unknown).
pub const SLOT_RETRY_AFTER: Duration = Duration::from_secs(1);

impl Concurrency {
    /// At most `max` in flight at once.
    pub fn new(max: u64) -> Self {
        Concurrency { max }
    }

    /// The most slots a key may hold at once.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The outcome of taking `cost` slots when `taken` are taken, without changing anything.
    pub fn evaluate(&self, taken: u64, cost: u64) -> Outcome {
        let free = self.max.saturating_sub(taken);
        let (verdict, remaining) = if cost <= free {
            (Verdict::Allowed, free - cost)
        } else {
            (
                Verdict::Denied {
                    retry_after: SLOT_RETRY_AFTER,
                },
                free,
            )
        };
        Outcome {
            verdict,
            limit: self.max,
            remaining,
            balance: i64::try_from(remaining).unwrap_or(i64::MAX),
            // Slots come back when responses end, not with time.
            next_unit_in: Duration::ZERO,
            full_in: Duration::ZERO,
            offence: false,
            overridden: None,
        }
    }

    /// The slots taken after an admitted charge of `cost`.
    pub fn commit(&self, taken: u64, cost: u64) -> u64 {
        taken.saturating_add(cost)
    }

    /// The slots taken after `units` are given back (never below zero: a release of a slot the
    /// store no longer counts — the key was reset — changes nothing).
    pub fn refund(&self, taken: u64, units: u64) -> u64 {
        taken.saturating_sub(units)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_counted_exactly() {
        let c = Concurrency::new(2);
        assert_eq!(c.evaluate(0, 1).remaining, 1);
        assert!(c.evaluate(1, 1).is_allowed());
        assert_eq!(c.evaluate(1, 1).remaining, 0);
        let denied = c.evaluate(2, 1);
        assert_eq!(denied.retry_after(), Some(Duration::from_secs(1)));
        assert_eq!(denied.remaining, 0);
        assert_eq!(c.commit(1, 1), 2);
        assert_eq!(c.refund(2, 1), 1);
        assert_eq!(c.refund(0, 1), 0);
        // A check (cost 0) always fits and reports the free slots.
        assert_eq!(c.evaluate(2, 0).verdict, Verdict::Allowed);
    }
}
