use std::time::Duration;

use super::{duration, micros, window_containing, Micros, Outcome, Verdict, WindowStart};

/// Fixed window: `limit` units per window of `period`; with a capacity above the limit, unused units
/// roll over into later windows (up to the capacity).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FixedWindow {
    limit: u64,
    period: Micros,
    capacity: u64,
    start: WindowStart,
}

/// The state of one key under a [`FixedWindow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedWindowState {
    /// Start of the window the state was last updated in.
    pub window_start: Micros,
    /// Units left in that window.
    pub remaining: u64,
}

impl FixedWindow {
    /// `limit` units per `period`, no roll-over, per-key window starts.
    pub fn new(limit: u64, period: Duration) -> Self {
        FixedWindow {
            limit,
            period: micros(period),
            capacity: limit,
            start: WindowStart::PerKey,
        }
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

    /// The window length.
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

    /// The state of a key never seen before: a full window. `offset` comes from
    /// [`WindowStart::offset`].
    pub fn fresh(&self, now: Micros, offset: Micros) -> FixedWindowState {
        FixedWindowState {
            window_start: window_containing(now, offset, self.period),
            remaining: self.capacity,
        }
    }

    /// The state rolled forward to the window that contains `now`.
    fn roll(&self, state: FixedWindowState, now: Micros) -> FixedWindowState {
        let windows = now.saturating_sub(state.window_start) / self.period;
        let granted = u128::from(windows) * u128::from(self.limit) + u128::from(state.remaining);
        FixedWindowState {
            window_start: state.window_start + windows * self.period,
            remaining: granted.min(u128::from(self.capacity)) as u64,
        }
    }

    /// Wait until `units` fit, from a rolled state.
    fn wait_for(&self, state: FixedWindowState, now: Micros, units: u64) -> Micros {
        if state.remaining >= units {
            return 0;
        }
        let windows = (units - state.remaining).div_ceil(self.limit);
        // Saturating: a window end beyond the clock's range is "never".
        state
            .window_start
            .saturating_add(windows.saturating_mul(self.period))
            .saturating_sub(now)
    }

    /// The outcome of charging `cost` at `now`, without changing the state.
    pub fn evaluate(&self, state: FixedWindowState, now: Micros, cost: u64) -> Outcome {
        let rolled = self.roll(state, now);
        let (verdict, left) = if rolled.remaining >= cost {
            let left = FixedWindowState {
                remaining: rolled.remaining - cost,
                ..rolled
            };
            (Verdict::Allowed, left)
        } else {
            let retry_after = duration(self.wait_for(rolled, now, cost));
            (Verdict::Denied { retry_after }, rolled)
        };
        let reset = if left.remaining >= self.capacity {
            Duration::ZERO
        } else {
            duration(self.wait_for(left, now, left.remaining + 1))
        };
        Outcome {
            verdict,
            limit: self.capacity,
            remaining: left.remaining,
            reset,
            offence: false,
        }
    }

    /// Applies an allowed charge.
    pub fn commit(&self, state: FixedWindowState, now: Micros, cost: u64) -> FixedWindowState {
        let rolled = self.roll(state, now);
        FixedWindowState {
            remaining: rolled.remaining.saturating_sub(cost),
            ..rolled
        }
    }

    /// Gives `units` back, never above capacity.
    pub fn refund(&self, state: FixedWindowState, now: Micros, units: u64) -> FixedWindowState {
        let rolled = self.roll(state, now);
        FixedWindowState {
            remaining: rolled.remaining.saturating_add(units).min(self.capacity),
            ..rolled
        }
    }

    /// The moment the state becomes equal to a fresh key's (a full window).
    pub fn expires_at(&self, state: FixedWindowState) -> Micros {
        let missing = self.capacity.saturating_sub(state.remaining);
        state
            .window_start
            .saturating_add(missing.div_ceil(self.limit).saturating_mul(self.period))
    }
}
