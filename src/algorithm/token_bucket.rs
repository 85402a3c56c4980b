use std::time::Duration;

use super::{duration, nanos, Mode, Nanos, Outcome, Verdict};

/// Token bucket with continuous refill: `rate` units per `period`, holding at most `capacity`.
///
/// The state is one number, the theoretical arrival time (GCRA's `tat`): the moment the bucket will
/// be full again. The bucket's debt at `now` is `tat - now` (never negative), and its balance is
/// `capacity - debt / interval`. Reservations let the balance go negative.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    rate: u64,
    period: Nanos,
    capacity: u64,
    initial: u64,
    /// `period / rate` rounded up, computed once: see [`interval`](Self::interval).
    interval: Nanos,
}

impl TokenBucket {
    /// `rate` units per `period`; capacity and initial balance both `rate`.
    ///
    /// Zero values are accepted here and rejected when the rule is validated, so that the error can
    /// name the rule.
    pub fn new(rate: u64, period: Duration) -> Self {
        let period = nanos(period);
        TokenBucket {
            rate,
            period,
            capacity: rate,
            initial: rate,
            interval: period.div_ceil(rate.max(1)).max(1),
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

    /// The emission interval `T`: the time one unit takes to refill, `period / rate` rounded up to
    /// the next nanosecond. Everything else is a whole number of `T`s, so a full bucket takes
    /// exactly `capacity` units at once, and rounding can only make the rate a hair slower, never
    /// faster (3 per second refills one unit every 333,333,334 ns).
    pub fn interval(&self) -> Nanos {
        self.interval
    }

    /// The time `units` take to refill.
    pub(crate) fn cost_nanos(&self, units: u64) -> Nanos {
        units.saturating_mul(self.interval())
    }

    /// The state of a key never seen before, at `now`.
    pub fn fresh(&self, now: Nanos) -> Nanos {
        now.saturating_add(self.cost_nanos(self.capacity - self.initial.min(self.capacity)))
    }

    /// `units` whole intervals, exact.
    fn span(&self, units: u64) -> u128 {
        u128::from(units) * u128::from(self.interval())
    }

    /// Whether `units` fit while the bucket owes `debt` nanoseconds of refill.
    fn fits(&self, debt: Nanos, units: u64) -> bool {
        u128::from(debt) + self.span(units) <= self.span(self.capacity)
    }

    /// Whole units available while owing `debt`.
    fn available(&self, debt: Nanos) -> u64 {
        let left =
            self.span(self.capacity).saturating_sub(u128::from(debt)) / u128::from(self.interval());
        u64::try_from(left).unwrap_or(u64::MAX)
    }

    /// The smallest wait after which `units` (≤ capacity) fit.
    fn wait_for(&self, debt: Nanos, units: u64) -> Nanos {
        let slack = self.span(self.capacity.saturating_sub(units));
        u64::try_from(u128::from(debt).saturating_sub(slack)).unwrap_or(u64::MAX)
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
            u128::from(after) <= self.span(self.capacity.saturating_add(units))
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
