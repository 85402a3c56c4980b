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
/// It keeps how far a window is below full, not what is left, so that a limit chosen per
/// request compares the window's count with the limit in force: 60 spent of 100,
/// read under 80, leaves 20. A count above a lowered capacity is forgiven when its window ends.
///
/// A reservation that reaches into later windows moves `window_start` to the window its last
/// unit is paid from, with `spent` what is spent there: the windows before it are held, under
/// any limit, as a bucket's reservation holds the time until it is paid. That is how a
/// reservation's debt outlives its window while a count above a lowered limit does not, with no
/// more bytes per key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedWindowState {
    /// Start of the window the state counts in: the window it was last updated in, or a later
    /// one that a reservation holds.
    pub window_start: Micros,
    /// Units spent in that window: without roll-over the window's count; with roll-over what
    /// the windows so far have not paid back (each new window pays `limit` units of it, never
    /// below 0). At most the capacity, unless the capacity in force is below the one that
    /// charged it.
    pub spent: u64,
}

/// A state read at a time: the window that contains the time, and the state's own window,
/// `ahead` windows later while a reservation holds the windows in between.
#[derive(Clone, Copy, Debug)]
struct Rolled {
    /// Start of the window containing the time (on the state's grid of windows).
    start: Micros,
    /// Units spent in the state's window.
    spent: u64,
    /// Windows from `start` to the state's window: 0 unless a reservation holds windows ahead.
    ahead: u64,
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

    /// The units a rolled state holds, seen from its `start`: its window's count and every
    /// window a reservation holds before it.
    fn held(&self, r: Rolled) -> i128 {
        i128::from(r.spent) + i128::from(r.ahead) * i128::from(self.limit.max(1))
    }

    /// The signed balance of a rolled state under this window's capacity.
    fn balance(&self, r: Rolled) -> i128 {
        i128::from(self.capacity) - self.held(r)
    }

    /// Whether the state's window counts more than the capacity in force (the limit was
    /// lowered): what is above it is forgiven when that window ends.
    fn over(&self, r: Rolled) -> bool {
        r.spent > self.capacity
    }

    /// The state as the windows after its own read it: a count above the capacity forgiven.
    fn forgiven(&self, r: Rolled) -> Rolled {
        Rolled {
            spent: r.spent.min(self.capacity),
            ..r
        }
    }

    /// The state holding `held` units seen from the window at `start`: in that window when they
    /// fit, otherwise in the window that pays the last of them (a reservation), at most `most`
    /// windows ahead.
    fn settle(&self, start: Micros, held: i128, most: u64) -> Rolled {
        let (capacity, limit) = (i128::from(self.capacity), i128::from(self.limit.max(1)));
        let held = held.max(0);
        let ahead = if held <= capacity {
            0
        } else {
            u64::try_from((held - capacity + limit - 1) / limit)
                .unwrap_or(u64::MAX)
                .min(most)
        };
        Rolled {
            start,
            spent: u64::try_from((held - i128::from(ahead) * limit).max(0)).unwrap_or(u64::MAX),
            ahead,
        }
    }

    /// A rolled state after a charge of `cost`. A charge of 0 changes nothing; any other is
    /// counted after an over-counted window, which it does not keep from being forgiven.
    fn charged(&self, r: Rolled, cost: u64) -> Rolled {
        if cost == 0 {
            return r;
        }
        self.settle(
            r.start,
            self.held(self.forgiven(r)) + i128::from(cost),
            u64::MAX,
        )
    }

    /// The state to store for a rolled one.
    fn stored(&self, r: Rolled) -> FixedWindowState {
        FixedWindowState {
            window_start: self.boundary(r.start, r.ahead),
            spent: r.spent,
        }
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

    /// The state read at `now`. Each window after the state's pays back `limit` units of what
    /// it counts, never below 0 (`min(v + r·k, C)` as a balance), from at most the capacity:
    /// a count above a lowered capacity is forgiven when its window ends. A state whose window
    /// starts after `now`'s is a reservation's, which holds the windows before it (an earlier
    /// `now` from a clock that stepped back reads the same: never more admitted).
    fn roll(&self, state: FixedWindowState, now: Micros) -> Rolled {
        let ws = state.window_start;
        if now >= ws {
            let windows = self.windows_between(ws, now);
            if windows == 0 {
                return Rolled {
                    start: ws,
                    spent: state.spent,
                    ahead: 0,
                };
            }
            return Rolled {
                start: self.boundary(ws, windows),
                spent: state
                    .spent
                    .min(self.capacity)
                    .saturating_sub(windows.saturating_mul(self.limit)),
                ahead: 0,
            };
        }
        let (start, ahead) = match self.months {
            None => {
                let period = self.period.max(1);
                // Within the first windows after the epoch, the first window on the grid.
                let ahead = (ws - now).div_ceil(period).min(ws / period);
                (ws - ahead * period, ahead)
            }
            Some(utc) => {
                let index = calendar::month_index(now, utc);
                let ahead = (calendar::month_index(ws, utc) - index).max(0) as u64;
                (calendar::month_start(index, utc), ahead)
            }
        };
        Rolled {
            start,
            spent: state.spent,
            ahead,
        }
    }

    /// Wait until the balance reaches `units` (negative: a debt of that many), from a rolled
    /// state: the start of the first window that brings it there, `ts + p·ceil((units − v)/r) −
    /// now`, a window after an over-counted one reading it as full.
    fn wait_for(&self, r: Rolled, now: Micros, units: impl Into<i128>) -> Micros {
        let units = units.into();
        let limit = self.limit.max(1);
        let windows = |r: Rolled| {
            let missing = units - self.balance(r);
            if missing <= 0 {
                return 0;
            }
            // In 64 bits whenever it fits, as it does but under absurd limits: a 128-bit
            // division is a library call that costs a fifth of the whole decision.
            match u64::try_from(missing) {
                Ok(missing) => missing.div_ceil(limit),
                // A window beyond the clock's range is "never".
                Err(_) => {
                    let limit = i128::from(limit);
                    u64::try_from((missing + limit - 1) / limit).unwrap_or(u64::MAX)
                }
            }
        };
        let mut k = windows(r);
        if k == 0 {
            return 0;
        }
        if k > r.ahead && self.over(r) {
            k = windows(self.forgiven(r)).max(r.ahead + 1);
        }
        self.boundary(r.start, k).saturating_sub(now)
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
    /// negative and the work may start at the first window that brings it back to zero. A
    /// window counting more than a lowered capacity denies for the rest of it, and a
    /// reservation then waits for the windows after it, which do not owe what it counted above.
    pub fn evaluate(&self, state: FixedWindowState, now: Micros, cost: u64, mode: Mode) -> Outcome {
        let rolled = self.roll(state, now);
        let after = self.charged(rolled, cost);
        let verdict = if self.balance(rolled) >= i128::from(cost) {
            Verdict::Allowed
        } else {
            match mode {
                Mode::Reserve(bound) => {
                    let wait = self.wait_for(after, now, 0);
                    if within(self.balance(after), wait, bound) {
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
            overridden: None,
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
    /// A reservation reads an over-counted window as full (see [`evaluate`](Self::evaluate)).
    fn wait_to_reserve(
        &self,
        rolled: Rolled,
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
        let reads = if cost == 0 {
            rolled
        } else {
            self.forgiven(rolled)
        };
        let units_ok = at(bound.max_units.map_or(0, |units| {
            self.wait_for(reads, now, i128::from(cost) - i128::from(units))
        }));
        let accepted = match bound.max_wait {
            None => units_ok,
            Some(max_wait) => {
                let max_wait = micros(max_wait);
                let full = at(self.wait_for(reads, now, self.capacity));
                let slot = at(self.wait_for(reads, now, cost));
                let first = units_ok.max(slot.saturating_sub(max_wait));
                if first < full {
                    first
                } else {
                    // From a full window, the slot is `m` windows after the current one's
                    // start. Windows of different lengths (months) may need a few tries.
                    let m = (cost - cost.min(self.capacity)).div_ceil(self.limit.max(1));
                    let mut t = units_ok.max(full);
                    let mut start =
                        self.boundary(reads.start, self.windows_between(reads.start, t));
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
        self.stored(self.charged(self.roll(state, now), cost))
    }

    /// Gives `units` back, never above capacity: from the last window a reservation holds
    /// first, so that its windows are free again.
    pub fn refund(&self, state: FixedWindowState, now: Micros, units: u64) -> FixedWindowState {
        let rolled = self.roll(state, now);
        let held = self.held(rolled) - i128::from(units);
        self.stored(self.settle(rolled.start, held, rolled.ahead))
    }

    /// The moment the state becomes equal to a fresh key's (a full window).
    pub fn expires_at(&self, state: FixedWindowState) -> Micros {
        let at = state.window_start;
        at.saturating_add(self.wait_for(self.roll(state, at), at, self.capacity))
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
