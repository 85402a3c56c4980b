use std::num::NonZeroU64;
use std::time::Duration;

use super::{duration, micros, Micros, Mode, Outcome, ReserveBound, Verdict};

/// Token bucket with continuous refill: `rate` units per `period`, holding at most `capacity`.
///
/// The state is one number, `empty_at`: the moment the bucket was (or, while reservations are owed,
/// will be) empty, in µs since the Unix epoch. It is GCRA's theoretical arrival time (the moment the
/// bucket is full again) less the capacity's span, and signed: a bucket already full at time zero
/// (a test clock) was empty before the epoch. The balance at `now` is
/// `min(capacity, (now − empty_at) / interval)`, negative while reservations are owed, and a charge
/// of `n` moves the state to `max(empty_at, now − capacity·interval) + n·interval`.
///
/// Nothing in the state depends on the capacity, so a key whose limit changes keeps
/// what it has, at most the new capacity: 40 of 100 left, then a capacity of 20, leaves 20 (an
/// idle key is full under the smaller limit, a larger capacity keeps the 40), and the time accrued
/// since the bucket was empty is read at the new rate (40 of 100 a minute, then 20 a minute with a
/// capacity of 20, leaves 8).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenBucket {
    rate: u64,
    period: Micros,
    capacity: u64,
    initial: u64,
    /// `period / rate` rounded up, computed once: see [`interval`](Self::interval). Never zero, so
    /// dividing by it needs no check.
    interval: NonZeroU64,
    /// `capacity` intervals (saturating): the debt of an empty bucket, which every decision
    /// compares with, computed once.
    full: Micros,
}

impl TokenBucket {
    /// `rate` units per `period`; capacity and initial balance both `rate`.
    ///
    /// Zero values are accepted here and rejected when the rule is validated, so that the error can
    /// name the rule.
    pub fn new(rate: u64, period: Duration) -> Self {
        let period = micros(period);
        let interval = NonZeroU64::new(period.div_ceil(rate.max(1))).unwrap_or(NonZeroU64::MIN);
        TokenBucket {
            rate,
            period,
            capacity: rate,
            initial: rate,
            interval,
            full: rate.saturating_mul(interval.get()),
        }
    }

    /// Sets the capacity (the largest burst). The initial balance follows unless set explicitly
    /// afterwards.
    pub fn with_capacity(mut self, capacity: u64) -> Self {
        self.capacity = capacity;
        self.initial = capacity;
        self.full = capacity.saturating_mul(self.interval.get());
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
        duration(self.cost_micros(self.capacity))
    }

    /// The largest cost that can ever pass in `mode`.
    pub fn max_cost(&self, mode: Mode) -> u64 {
        match mode {
            Mode::Reserve(bound) => {
                let by_units = bound
                    .max_units
                    .map_or(u64::MAX, |units| self.capacity.saturating_add(units));
                // From a full bucket, `n` units wait `(n − C)·T`.
                let by_wait = bound.max_wait.map_or(u64::MAX, |wait| {
                    self.capacity.saturating_add(micros(wait) / self.interval)
                });
                by_units.min(by_wait)
            }
            _ => self.capacity,
        }
    }

    /// The emission interval `T`: the time one unit takes to refill, `period / rate` rounded up to
    /// the next microsecond. Everything else is a whole number of `T`s, so a full bucket takes
    /// exactly `capacity` units at once, and rounding can only make the rate a hair slower, never
    /// faster (3 per second refills one unit every 333,334 µs).
    pub fn interval(&self) -> Micros {
        self.interval.get()
    }

    /// The time `units` take to refill.
    pub(crate) fn cost_micros(&self, units: u64) -> Micros {
        units.saturating_mul(self.interval())
    }

    /// The state of a key never seen before, at `now`: empty its initial balance's span ago.
    pub fn fresh(&self, now: Micros) -> i64 {
        self.owing(self.fresh_debt(), now)
    }

    /// The [`debt`](Self::debt) of a key never seen before: the capacity it misses.
    fn fresh_debt(&self) -> Micros {
        self.cost_micros(self.capacity - self.initial.min(self.capacity))
    }

    /// The capacity's span: the time to refill from empty, in µs (saturating).
    #[inline]
    pub(crate) fn full_span(&self) -> Micros {
        self.full
    }

    /// The time the bucket owes at `now`: how far it is from full under this limit,
    /// `empty_at + capacity·interval − now`, at least zero. Exact while times and refill spans
    /// stay below 2^63 µs (292,000 years); saturating beyond, never panicking.
    #[inline]
    pub(crate) fn debt(&self, empty_at: i64, now: Micros) -> Micros {
        biased(empty_at)
            .saturating_add(self.full)
            .saturating_sub(biased_now(now))
    }

    /// The state that owes `debt` at `now`: `now − capacity·interval + debt`.
    #[inline]
    fn owing(&self, debt: Micros, now: Micros) -> i64 {
        unbiased(
            biased_now(now)
                .saturating_sub(self.full)
                .saturating_add(debt),
        )
    }

    /// The moment the state equals a fresh key's, when fresh keys start full: the bucket is full
    /// again. A store may forget the key from then on.
    pub fn expires_at(&self, empty_at: i64) -> Micros {
        biased(empty_at)
            .saturating_add(self.full)
            .saturating_sub(BIAS)
    }

    /// `units` whole intervals. 64-bit arithmetic saturates only past 2^64 µs (584,000 years),
    /// where every comparison below still answers as it would exactly.
    #[inline]
    fn span(&self, units: u64) -> Micros {
        units.saturating_mul(self.interval.get())
    }

    /// Whole units available while owing `debt`.
    #[inline]
    fn available(&self, debt: Micros) -> u64 {
        let room = self.full.saturating_sub(debt);
        // A denied single unit leaves less than one interval of room: answer without the
        // division, the slowest step of a decision.
        if room < self.interval.get() {
            0
        } else {
            room / self.interval
        }
    }

    /// The signed balance while owing `debt`: `available` units, or minus the whole units owed
    /// beyond the capacity (rounded up: a part of a unit owed is a unit owed).
    #[inline]
    fn balance(&self, debt: Micros, available: u64) -> i64 {
        let span = self.full;
        if debt <= span {
            clamp(available)
        } else {
            -clamp((debt - span).div_ceil(self.interval.get()))
        }
    }

    /// The smallest wait after which `units` (≤ capacity) fit.
    #[inline]
    fn wait_for(&self, debt: Micros, units: u64) -> Micros {
        debt.saturating_sub(self.span(self.capacity.saturating_sub(units)))
    }

    /// Time until one more whole unit is available, given the units available now; zero when
    /// full.
    #[inline]
    fn reset(&self, debt: Micros, available: u64) -> Duration {
        if available >= self.capacity {
            Duration::ZERO
        } else {
            duration(self.wait_for(debt, available + 1))
        }
    }

    /// The outcome of charging `cost` at `now` to a bucket in state `empty_at`, without changing
    /// it.
    ///
    /// The caller has checked `cost` against [`max_cost`](Self::max_cost).
    // Always inlined, as `outcome` below: left to the compiler, the memory store's decision called
    // it out of line and copied its 80-byte outcome once more (22 instructions per request in
    // the layer, measured).
    #[inline(always)]
    pub fn evaluate(&self, empty_at: i64, now: Micros, cost: u64, mode: Mode) -> Outcome {
        self.evaluate_owing(self.debt(empty_at, now), cost, mode)
    }

    /// [`evaluate`](Self::evaluate) for a bucket that owes `debt` (its state read at its time).
    #[inline(always)]
    pub(crate) fn evaluate_owing(&self, debt: Micros, cost: u64, mode: Mode) -> Outcome {
        let after = debt.saturating_add(self.span(cost));
        if after <= self.full {
            return self.outcome(Verdict::Allowed, after);
        }
        match mode {
            Mode::Reserve(bound) => self.reserve(debt, after, cost, bound),
            _ => {
                let remaining = self.available(debt);
                let next_unit_in = self.reset(debt, remaining);
                // A denied cost is more than the units left (so fewer than the capacity): when it
                // is one more, the wait for it is the wait for the next unit, already computed.
                let retry_after = if cost == remaining + 1 {
                    next_unit_in
                } else {
                    duration(self.wait_for(debt, cost))
                };
                Outcome {
                    verdict: Verdict::Denied { retry_after },
                    limit: self.capacity,
                    remaining,
                    balance: self.balance(debt, remaining),
                    next_unit_in,
                    full_in: duration(debt),
                    offence: false,
                    overridden: None,
                }
            }
        }
    }

    /// The outcome of a verdict that leaves the bucket owing `left`.
    // Always inlined: a store's decision builds the outcome in place this way (the allowed path
    // and a plain denial are the ones a store's caller waits for on every request).
    #[inline(always)]
    fn outcome(&self, verdict: Verdict, left: Micros) -> Outcome {
        let remaining = self.available(left);
        Outcome {
            verdict,
            limit: self.capacity,
            remaining,
            balance: self.balance(left, remaining),
            next_unit_in: self.reset(left, remaining),
            full_in: duration(left),
            offence: false,
            overridden: None,
        }
    }

    /// A reservation that does not fit now: reserved within its bound, denied past it.
    #[inline(never)]
    fn reserve(&self, debt: Micros, after: Micros, cost: u64, bound: ReserveBound) -> Outcome {
        if self.within(after, bound) {
            let wait = duration(self.wait_for(after, 0));
            self.outcome(Verdict::Reserved { wait }, after)
        } else {
            let retry_after = duration(self.wait_to_reserve(debt, cost, bound));
            self.outcome(Verdict::Denied { retry_after }, debt)
        }
    }

    /// Whether charging `cost` at `now` is admitted (allowed or reserved): the verdict of
    /// [`evaluate`](Self::evaluate) alone. A store decides this while it holds the key and
    /// builds the full outcome, a pure function of the same state, after letting go.
    #[inline]
    pub(crate) fn admits(&self, empty_at: i64, now: Micros, cost: u64, mode: Mode) -> bool {
        let after = self.debt(empty_at, now).saturating_add(self.span(cost));
        after <= self.full || matches!(mode, Mode::Reserve(bound) if self.within(after, bound))
    }

    /// For a reservation past its bound: the smallest wait after which it would be accepted into
    /// the queue (never later than the moment the cost fits outright).
    fn wait_to_reserve(&self, debt: Micros, cost: u64, bound: ReserveBound) -> Micros {
        let after = debt.saturating_add(self.span(cost));
        let by_units = bound.max_units.map_or(0, |units| {
            after.saturating_sub(self.span(self.capacity.saturating_add(units)))
        });
        let by_wait = bound.max_wait.map_or(0, |wait| {
            after.saturating_sub(self.full.saturating_add(micros(wait)))
        });
        by_units.max(by_wait).min(self.wait_for(debt, cost))
    }

    fn within(&self, after: Micros, bound: ReserveBound) -> bool {
        let units_ok = bound
            .max_units
            .is_none_or(|units| after <= self.span(self.capacity.saturating_add(units)));
        let wait_ok = bound
            .max_wait
            .is_none_or(|max| self.wait_for(after, 0) <= micros(max));
        units_ok && wait_ok
    }

    /// Applies an admitted charge: the new state,
    /// `max(empty_at, now − capacity·interval) + cost·interval`.
    #[inline]
    pub fn commit(&self, empty_at: i64, now: Micros, cost: u64) -> i64 {
        let debt = self.debt(empty_at, now);
        self.owing(debt.saturating_add(self.cost_micros(cost)), now)
    }

    /// Gives `units` back, never above capacity: the new state,
    /// `max(empty_at − units·interval, now − capacity·interval)`.
    pub fn refund(&self, empty_at: i64, now: Micros, units: u64) -> i64 {
        let debt = self.debt(empty_at, now);
        self.owing(debt.saturating_sub(self.cost_micros(units)), now)
    }
}

// Bias: the state's arithmetic runs on `empty_at + 2^63` as a `u64`, exact before the epoch too.
const BIAS: u64 = 1 << 63;

#[inline]
fn biased(empty_at: i64) -> u64 {
    (empty_at as u64) ^ BIAS
}

#[inline]
fn unbiased(biased: u64) -> i64 {
    (biased ^ BIAS) as i64
}

#[inline]
fn biased_now(now: Micros) -> u64 {
    now.saturating_add(BIAS)
}

fn clamp(units: u64) -> i64 {
    i64::try_from(units).unwrap_or(i64::MAX)
}
