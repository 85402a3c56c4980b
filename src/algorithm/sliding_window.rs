use std::time::Duration;

use super::{duration, micros, window_containing, Micros, Outcome, Verdict, WindowStart};

/// Sliding window counter (the approximation Cloudflare and Upstash use): the previous window's
/// count weighted by how much of it still overlaps the sliding period, plus the current count.
///
/// `estimate = previous·(1 − elapsed/period) + current`; a cost `n` fits when
/// `estimate + n ≤ limit`. Denied requests are not counted.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlidingWindow {
    limit: u64,
    period: Micros,
    start: WindowStart,
}

/// The state of one key under a [`SlidingWindow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingWindowState {
    /// Start of the current window.
    pub window_start: Micros,
    /// Units admitted in the current window.
    pub current: u64,
    /// Units admitted in the window before it.
    pub previous: u64,
}

impl SlidingWindow {
    /// `limit` units per sliding `period`.
    pub fn new(limit: u64, period: Duration) -> Self {
        SlidingWindow {
            limit,
            period: micros(period),
            start: WindowStart::PerKey,
        }
    }

    /// Sets where the underlying fixed windows start.
    pub fn with_start(mut self, start: WindowStart) -> Self {
        self.start = start;
        self
    }

    /// Units per sliding period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The sliding period.
    pub fn period(&self) -> Duration {
        duration(self.period)
    }

    /// Where the underlying windows start.
    pub fn start(&self) -> WindowStart {
        self.start
    }

    pub(crate) fn period_micros(&self) -> Micros {
        self.period
    }

    /// The state of a key never seen before.
    pub fn fresh(&self, now: Micros, offset: Micros) -> SlidingWindowState {
        SlidingWindowState {
            window_start: window_containing(now, offset, self.period),
            current: 0,
            previous: 0,
        }
    }

    /// The state in the window containing `now`. A window that has ended weighs at most the
    /// limit in force: a count above a lowered limit is forgiven when its window
    /// ends, and slides out as a full window's would.
    fn roll(&self, state: SlidingWindowState, now: Micros) -> SlidingWindowState {
        let windows = now.saturating_sub(state.window_start) / self.period;
        let window_start = state.window_start + windows * self.period;
        match windows {
            0 => SlidingWindowState {
                previous: state.previous.min(self.limit),
                ..state
            },
            1 => SlidingWindowState {
                window_start,
                current: 0,
                previous: state.current.min(self.limit),
            },
            _ => SlidingWindowState {
                window_start,
                current: 0,
                previous: 0,
            },
        }
    }

    /// `estimate·period`, exact.
    fn weighted(&self, state: SlidingWindowState, now: Micros) -> u128 {
        // Before the window starts (this clock behind another instance's), the previous count
        // weighs fully.
        let left = u128::from(self.period - now.saturating_sub(state.window_start));
        u128::from(state.previous) * left + u128::from(state.current) * u128::from(self.period)
    }

    fn fits(&self, state: SlidingWindowState, now: Micros, units: u64) -> bool {
        let p = u128::from(self.period);
        self.weighted(state, now) + u128::from(units) * p <= u128::from(self.limit) * p
    }

    /// Smallest wait until `units` (≤ limit) fit, from a rolled state.
    fn wait_for(&self, state: SlidingWindowState, now: Micros, units: u64) -> Micros {
        if self.fits(state, now, units) {
            return 0;
        }
        let p = u128::from(self.period);
        // Later in this window, as the previous window's weight decays.
        if state.previous > 0 {
            if let Some(room) = self.limit.checked_sub(state.current.saturating_add(units)) {
                // Need previous·(p − e) ≤ room·p, i.e. e ≥ p − floor(room·p / previous).
                let keep = (u128::from(room) * p / u128::from(state.previous)).min(p);
                let at = state.window_start.saturating_add((p - keep) as u64);
                if at < state.window_start.saturating_add(self.period) {
                    return at.saturating_sub(now);
                }
            }
        }
        // Early in the next window, where the current count becomes the previous one.
        // Saturating: a window end beyond the clock's range is "never".
        let next = state.window_start.saturating_add(self.period);
        // Weighing at most the limit once its window has ended (see `roll`).
        let current = state.current.min(self.limit);
        let into = if current == 0 {
            0
        } else {
            let room = u128::from(self.limit - units);
            let keep = (room * p / u128::from(current)).min(p);
            (p - keep) as u64
        };
        next.saturating_add(into).saturating_sub(now)
    }

    fn remaining(&self, state: SlidingWindowState, now: Micros) -> u64 {
        let p = u128::from(self.period);
        let free = (u128::from(self.limit) * p).saturating_sub(self.weighted(state, now)) / p;
        free as u64
    }

    /// The outcome of charging `cost` at `now`, without changing the state.
    pub fn evaluate(&self, state: SlidingWindowState, now: Micros, cost: u64) -> Outcome {
        let rolled = self.roll(state, now);
        let (verdict, left) = if self.fits(rolled, now, cost) {
            let left = SlidingWindowState {
                current: rolled.current + cost,
                ..rolled
            };
            (Verdict::Allowed, left)
        } else {
            let retry_after = duration(self.wait_for(rolled, now, cost));
            (Verdict::Denied { retry_after }, rolled)
        };
        let remaining = self.remaining(left, now);
        let reset = if remaining >= self.limit {
            Duration::ZERO
        } else {
            duration(self.wait_for(left, now, remaining + 1))
        };
        Outcome {
            verdict,
            limit: self.limit,
            remaining,
            balance: i64::try_from(remaining).unwrap_or(i64::MAX),
            next_unit_in: reset,
            full_in: duration(self.wait_for(left, now, self.limit)),
            offence: false,
            overridden: None,
        }
    }

    /// Applies an allowed charge.
    pub fn commit(&self, state: SlidingWindowState, now: Micros, cost: u64) -> SlidingWindowState {
        let rolled = self.roll(state, now);
        SlidingWindowState {
            current: rolled.current.saturating_add(cost),
            ..rolled
        }
    }

    /// Gives `units` back: from the current window first, then the previous one.
    pub fn refund(&self, state: SlidingWindowState, now: Micros, units: u64) -> SlidingWindowState {
        let rolled = self.roll(state, now);
        let from_current = units.min(rolled.current);
        SlidingWindowState {
            window_start: rolled.window_start,
            current: rolled.current - from_current,
            previous: rolled.previous.saturating_sub(units - from_current),
        }
    }

    /// The moment the state becomes equal to a fresh key's: neither count weighs any more.
    pub fn expires_at(&self, state: SlidingWindowState) -> Micros {
        let windows: u64 = if state.current > 0 {
            2
        } else if state.previous > 0 {
            1
        } else {
            0
        };
        state
            .window_start
            .saturating_add(windows.saturating_mul(self.period))
    }
}
