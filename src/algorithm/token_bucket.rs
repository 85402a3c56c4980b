use std::time::Duration;

use super::{duration, mul_div_ceil, mul_div_floor, nanos, Mode, Nanos, Outcome, Verdict};

/// Token bucket with continuous refill: `rate` units per `period`, holding at most `capacity`.
///
/// The state is one number, the theoretical arrival time (GCRA's `tat`): the moment the bucket will
/// be full again. The bucket's debt at `now` is `tat - now` (never negative), and its balance is
/// `capacity - debt·rate/period`. Reservations let the balance go negative.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    rate: u64,
    period: Nanos,
    capacity: u64,
    initial: u64,
}

impl TokenBucket {
    /// `rate` units per `period`; capacity and initial balance both `rate`.
    ///
    /// Zero values are accepted here and rejected when the rule is validated, so that the error can
    /// name the rule.
    pub fn new(rate: u64, period: Duration) -> Self {
        TokenBucket {
            rate,
            period: nanos(period),
            capacity: rate,
            initial: rate,
        }
    }

    /// Sets the capacity (the largest burst). The initial balance follows unless set explicitly
    /// afterwards.
    pub fn with_capacity(mut self, capacity: u64) -> Self {
        self.capacity = capacity;
        self.initial = capacity;
        self
    }

    /// Sets the balance a key never seen before starts with (at most the capacity).
    pub fn with_initial(mut self, initial: u64) -> Self {
        self.initial = initial;
        self
    }

    /// Units added per period.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// The refill period.
    pub fn period(&self) -> Duration {
        duration(self.period)
    }

    /// The most units the bucket holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The balance of a key never seen before.
    pub fn initial(&self) -> u64 {
        self.initial
    }

    /// Time to refill from empty to full.
    pub fn refill_time(&self) -> Duration {
        duration(self.cost_nanos(self.capacity))
    }

    /// The largest cost that can ever pass in `mode`.
    pub fn max_cost(&self, mode: Mode) -> u64 {
        match mode {
            Mode::Reserve(bound) => match bound.max_units {
                Some(units) => self.capacity.saturating_add(units),
                None => u64::MAX,
            },
            _ => self.capacity,
        }
    }

    /// The time `units` take to refill, rounded up to the next nanosecond.
    pub(crate) fn cost_nanos(&self, units: u64) -> Nanos {
        mul_div_ceil(units, self.period, self.rate)
    }

    /// The state of a key never seen before, at `now`.
    pub fn fresh(&self, now: Nanos) -> Nanos {
        now.saturating_add(self.cost_nanos(self.capacity - self.initial.min(self.capacity)))
    }

    /// Whether `units` fit while the bucket owes `debt` nanoseconds: `debt·r + units·p ≤ C·p`.
    fn fits(&self, debt: Nanos, units: u64) -> bool {
        self.owed(debt) + u128::from(units) * u128::from(self.period) <= self.full()
    }

    /// The debt, in rate-scaled nanoseconds (`debt·r`), so comparisons stay exact.
    fn owed(&self, debt: Nanos) -> u128 {
        u128::from(debt) * u128::from(self.rate)
    }

    fn full(&self) -> u128 {
        u128::from(self.capacity) * u128::from(self.period)
    }

    /// Whole units available while owing `debt`.
    fn available(&self, debt: Nanos) -> u64 {
        let left = self.full().saturating_sub(self.owed(debt)) / u128::from(self.period);
        u64::try_from(left).unwrap_or(u64::MAX)
    }

    /// The smallest wait after which `units` (≤ capacity) fit: the smallest `w` with
    /// `(debt - w)·r ≤ (C - units)·p`.
    fn wait_for(&self, debt: Nanos, units: u64) -> Nanos {
        let slack = mul_div_floor(self.capacity.saturating_sub(units), self.period, self.rate);
        debt.saturating_sub(slack)
    }

    /// Time until one more whole unit is available; zero when full.
    fn reset(&self, debt: Nanos) -> Duration {
        let available = self.available(debt);
        if available >= self.capacity {
            Duration::ZERO
        } else {
            duration(self.wait_for(debt, available + 1))
        }
    }

    /// The outcome of charging `cost` at `now` to a bucket in `tat`, without changing it.
    ///
    /// The caller has checked `cost` against [`max_cost`](Self::max_cost).
    pub fn evaluate(&self, tat: Nanos, now: Nanos, cost: u64, mode: Mode) -> Outcome {
        let debt = tat.saturating_sub(now);
        let after = debt.saturating_add(self.cost_nanos(cost));
        let verdict = if self.fits(debt, cost) {
            Verdict::Allowed
        } else {
            match mode {
                Mode::Reserve(bound) if self.within(after, bound) => Verdict::Reserved {
                    wait: duration(self.wait_for(after, 0)),
                },
                _ => Verdict::Denied {
                    retry_after: duration(self.wait_for(debt, cost)),
                },
            }
        };
        let left = if verdict.is_admitted() { after } else { debt };
        Outcome {
            verdict,
            limit: self.capacity,
            remaining: self.available(left),
            reset: self.reset(left),
        }
    }

    fn within(&self, after: Nanos, bound: super::ReserveBound) -> bool {
        let units_ok = bound.max_units.is_none_or(|units| {
            self.owed(after)
                <= u128::from(self.capacity.saturating_add(units)) * u128::from(self.period)
        });
        let wait_ok = bound
            .max_wait
            .is_none_or(|max| self.wait_for(after, 0) <= nanos(max));
        units_ok && wait_ok
    }

    /// Applies an admitted charge: the new `tat`.
    pub fn commit(&self, tat: Nanos, now: Nanos, cost: u64) -> Nanos {
        tat.max(now).saturating_add(self.cost_nanos(cost))
    }

    /// Gives `units` back, never above capacity: the new `tat`.
    pub fn refund(&self, tat: Nanos, now: Nanos, units: u64) -> Nanos {
        tat.saturating_sub(self.cost_nanos(units)).max(now)
    }
}
