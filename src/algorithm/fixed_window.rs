use std::time::Duration;

use super::{
    calendar, duration, micros, window_containing, Micros, Mode, Outcome, ReserveBound, Verdict,
    WindowStart,
};

/// Fixed window: `limit` units per window of `period`; with a capacity above the limit, unused units
/// roll over into later windows (up to the capacity).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FixedWindow {
    limit: u64,
    /// The window length; for calendar months, the longest month (31 days).
    period: Micros,
    capacity: u64,
    start: WindowStart,
    /// Windows are calendar months at this offset east of UTC (µs), not `period`s.
    months: Option<i64>,
}

/// The longest calendar month, in µs.
const LONGEST_MONTH: Micros = 31 * 86_400_000_000;

/// The state of one key under a [`FixedWindow`].
///
/// It keeps how far the window is below full, not what is left, so that a limit chosen per
/// request (DESIGN §13) compares the window's count with the limit in force: 60 spent of 100,
/// read under 80, leaves 20. The balance under any capacity is `capacity − spent`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedWindowState {
    /// Start of the window the state was last updated in.
    pub window_start: Micros,
    /// Units spent in that window: without roll-over the window's count; with roll-over what
    /// the windows so far have not paid back (each new window pays `limit` units of it, never
    /// below 0). Above the capacity while reservations are owed.
    pub spent: u64,
}

impl FixedWindow {
    /// `limit` units per `period`, no roll-over, per-key window starts.
    pub fn new(limit: u64, period: Duration) -> Self {
        FixedWindow {
            limit,
            period: micros(period),
            capacity: limit,
            start: WindowStart::PerKey,
            months: None,
        }
    }

    /// `limit` units per calendar month, windows starting at midnight on the 1st at `utc_offset`
    /// µs east of UTC (negative: west). Months are the calendar's (28 to 31 days, leap years
    /// included), not 30-day periods.
    pub fn calendar_months(limit: u64, utc_offset: i64) -> Self {
        FixedWindow {
            limit,
            period: LONGEST_MONTH,
            capacity: limit,
            start: WindowStart::Aligned(Duration::ZERO),
            months: Some(utc_offset),
        }
    }

    /// For calendar-month windows: the offset east of UTC, in µs.
    pub fn months(&self) -> Option<i64> {
        self.months
    }

    /// Lets unused units roll over, up to `capacity` in one window.
    pub fn with_capacity(mut self, capacity: u64) -> Self {
        self.capacity = capacity;
        self
    }

    /// Sets where windows start.
    pub fn with_start(mut self, start: WindowStart) -> Self {
        self.start = start;
        self
    }

    /// Units granted per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length (for calendar months: 31 days, the longest).
    pub fn period(&self) -> Duration {
        duration(self.period)
    }

    /// The most units one window can hold.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Where windows start.
    pub fn start(&self) -> WindowStart {
        self.start
    }

    pub(crate) fn period_micros(&self) -> Micros {
        self.period
    }

    /// The capacity as a balance (a capacity past `i64::MAX` holds `i64::MAX`).
    fn full(&self) -> i64 {
        i64::try_from(self.capacity).unwrap_or(i64::MAX)
    }

    /// The signed balance of `state` under this window's capacity: `capacity − spent`.
    fn balance(&self, state: FixedWindowState) -> i128 {
        i128::from(self.capacity) - i128::from(state.spent)
    }

    /// The largest cost that can ever pass in `mode`. A reservation bounded by a wait can go
    /// furthest from a full window in its last microsecond: `m` more windows of `limit` units
    /// wait `(m − 1)·period + 1 µs`.
    pub fn max_cost(&self, mode: Mode) -> u64 {
        match mode {
            Mode::Reserve(bound) => {
                let by_units = bound
                    .max_units
                    .map_or(u64::MAX, |units| self.capacity.saturating_add(units));
                let by_wait = bound.max_wait.map_or(u64::MAX, |wait| {
                    let windows = match micros(wait) {
                        0 => 0,
                        wait => (wait - 1) / self.period.max(1) + 1,
                    };
                    self.capacity
                        .saturating_add(windows.saturating_mul(self.limit))
                });
                by_units.min(by_wait)
            }
            _ => self.capacity,
        }
    }

    /// The state of a key never seen before: a full window. `offset` comes from
    /// [`WindowStart::offset`].
    pub fn fresh(&self, now: Micros, offset: Micros) -> FixedWindowState {
        let window_start = match self.months {
            None => window_containing(now, offset, self.period),
            Some(utc) => calendar::month_start(calendar::month_index(now, utc), utc),
        };
        FixedWindowState {
            window_start,
            spent: 0,
        }
    }

    /// The state rolled forward to the window that contains `now`: each window pays back
    /// `limit` units of what was spent, never below 0 (`min(v + r·k, C)` as a balance).
    fn roll(&self, state: FixedWindowState, now: Micros) -> FixedWindowState {
        let windows = self.windows_between(state.window_start, now);
        FixedWindowState {
            window_start: self.boundary(state.window_start, windows),
            spent: state
                .spent
                .saturating_sub(windows.saturating_mul(self.limit)),
        }
    }

    /// Wait until the balance reaches `units` (negative: a debt of that many), from a rolled
    /// state: the start of the first window that brings it there, `ts + p·ceil((units − v)/r) − now`.
    fn wait_for(&self, state: FixedWindowState, now: Micros, units: impl Into<i128>) -> Micros {
        let missing = units.into() - self.balance(state);
        if missing <= 0 {
            return 0;
        }
        let windows = (missing as u128).div_ceil(u128::from(self.limit.max(1)));
        // A window beyond the clock's range is "never".
        let windows = u64::try_from(windows).unwrap_or(u64::MAX);
        self.boundary(state.window_start, windows)
            .saturating_sub(now)
    }

    /// The start of the `k`-th window after the one starting at `window_start` (saturating at
    /// the clock's end).
    fn boundary(&self, window_start: Micros, k: u64) -> Micros {
        match self.months {
            None => window_start.saturating_add(k.saturating_mul(self.period)),
            Some(utc) => {
                // 10,000 years of months is past the clock's end already.
                let k = k.min(120_000) as i64;
                calendar::month_start(calendar::month_index(window_start, utc) + k, utc)
            }
        }
    }

    /// How many window starts lie in `(window_start, now]`.
    fn windows_between(&self, window_start: Micros, now: Micros) -> u64 {
        if now <= window_start {
            return 0;
        }
        match self.months {
            None => (now - window_start) / self.period.max(1),
            Some(utc) => {
                (calendar::month_index(now, utc) - calendar::month_index(window_start, utc)) as u64
            }
        }
    }

    /// The outcome of charging `cost` at `now`, without changing the state. In
    /// [`Mode::Reserve`] a cost that does not fit is reserved within the bound: the balance goes
    /// negative and the work may start at the first window that brings it back to zero.
    pub fn evaluate(&self, state: FixedWindowState, now: Micros, cost: u64, mode: Mode) -> Outcome {
        let rolled = self.roll(state, now);
        let owed = self.balance(rolled) - i128::from(cost);
        let after = FixedWindowState {
            spent: rolled.spent.saturating_add(cost),
            ..rolled
        };
        let verdict = if owed >= 0 {
            Verdict::Allowed
        } else {
            match mode {
                Mode::Reserve(bound) => {
                    let wait = self.wait_for(after, now, 0);
                    if within(owed, wait, bound) {
                        Verdict::Reserved {
                            wait: duration(wait),
                        }
                    } else {
                        Verdict::Denied {
                            retry_after: duration(self.wait_to_reserve(rolled, now, cost, bound)),
                        }
                    }
                }
                _ => Verdict::Denied {
                    retry_after: duration(self.wait_for(rolled, now, cost)),
                },
            }
        };
        let left = if verdict.is_admitted() { after } else { rolled };
        let balance = clamp(self.balance(left));
        let remaining = balance.max(0) as u64;
        let reset = if balance >= self.full() {
            Duration::ZERO
        } else {
            duration(self.wait_for(left, now, remaining + 1))
        };
        Outcome {
            verdict,
            limit: self.capacity,
            remaining,
            balance,
            next_unit_in: reset,
            full_in: duration(self.wait_for(left, now, self.capacity)),
            offence: false,
        }
    }

    /// For a reservation past its bound: the smallest wait after which it would be accepted into
    /// the queue, never later than the moment the cost fits outright.
    ///
    /// The unit bound is met once the balance reaches `cost − max_units`, and stays met. The wait
    /// bound is not monotone: while the window refills without reaching its capacity, the
    /// reservation's slot stays at the same window start `F`, so it is met from `F − max_wait`
    /// on; once the window is full, the slot moves on with every window (`m` windows after the
    /// current one's start), so it is met only in the last `p − (m·p − max_wait)` µs of a window.
    fn wait_to_reserve(
        &self,
        rolled: FixedWindowState,
        now: Micros,
        cost: u64,
        bound: ReserveBound,
    ) -> Micros {
        let at = |wait: Micros| now.saturating_add(wait);
        let fits = if cost <= self.capacity {
            at(self.wait_for(rolled, now, cost))
        } else {
            Micros::MAX
        };
        let units_ok = at(bound.max_units.map_or(0, |units| {
            self.wait_for(rolled, now, i128::from(cost) - i128::from(units))
        }));
        let accepted = match bound.max_wait {
            None => units_ok,
            Some(max_wait) => {
                let max_wait = micros(max_wait);
                let full = at(self.wait_for(rolled, now, self.capacity));
                let slot = at(self.wait_for(rolled, now, cost));
                let first = units_ok.max(slot.saturating_sub(max_wait));
                if first < full {
                    first
                } else {
                    // From a full window, the slot is `m` windows after the current one's
                    // start. Windows of different lengths (months) may need a few tries.
                    let m = (cost - cost.min(self.capacity)).div_ceil(self.limit.max(1));
                    let mut t = units_ok.max(full);
                    let mut start = self.boundary(
                        rolled.window_start,
                        self.windows_between(rolled.window_start, t),
                    );
                    let mut accepted = Micros::MAX;
                    for _ in 0..24 {
                        let next = self.boundary(start, 1);
                        let at = t.max(self.boundary(start, m).saturating_sub(max_wait));
                        if at < next {
                            accepted = at;
                            break;
                        }
                        (start, t) = (next, next);
                    }
                    accepted
                }
            }
        };
        accepted.min(fits).saturating_sub(now)
    }

    /// Applies an admitted (allowed or reserved) charge.
    pub fn commit(&self, state: FixedWindowState, now: Micros, cost: u64) -> FixedWindowState {
        let rolled = self.roll(state, now);
        FixedWindowState {
            spent: rolled.spent.saturating_add(cost),
            ..rolled
        }
    }

    /// Gives `units` back, never above capacity.
    pub fn refund(&self, state: FixedWindowState, now: Micros, units: u64) -> FixedWindowState {
        let rolled = self.roll(state, now);
        FixedWindowState {
            spent: rolled.spent.saturating_sub(units),
            ..rolled
        }
    }

    /// The moment the state becomes equal to a fresh key's (a full window).
    pub fn expires_at(&self, state: FixedWindowState) -> Micros {
        state
            .window_start
            .saturating_add(self.wait_for(state, state.window_start, self.capacity))
    }
}

/// Whether a reservation leaving the balance at `owed` (negative) and waiting `wait` µs stays
/// within `bound`.
fn within(owed: i128, wait: Micros, bound: ReserveBound) -> bool {
    bound
        .max_units
        .is_none_or(|units| -owed <= i128::from(units))
        && bound.max_wait.is_none_or(|max| wait <= micros(max))
}

fn clamp(balance: i128) -> i64 {
    balance.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}
