use std::collections::VecDeque;
use std::time::Duration;

use super::{duration, micros, Micros, Outcome, Verdict};

/// Sliding window log (exact): every admitted charge is kept with its time for one period; a cost
/// fits when the units admitted in the last period plus the cost stay within the limit.
///
/// Exact, but memory per key grows with the limit (one entry per admitted instant); prefer
/// [`SlidingWindow`](super::SlidingWindow) for large limits.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlidingLog {
    limit: u64,
    period: Micros,
}

/// The admitted charges of one key inside the last period, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlidingLogState {
    entries: VecDeque<(Micros, u64)>,
}

impl SlidingLogState {
    /// The admitted `(time, units)` entries, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = (Micros, u64)> + '_ {
        self.entries.iter().copied()
    }

    /// Builds a state from `(time, units)` entries, oldest first.
    pub fn from_entries(entries: impl IntoIterator<Item = (Micros, u64)>) -> Self {
        SlidingLogState {
            entries: entries.into_iter().collect(),
        }
    }
}

impl SlidingLog {
    /// `limit` units in any sliding `period`.
    pub fn new(limit: u64, period: Duration) -> Self {
        SlidingLog {
            limit,
            period: micros(period),
        }
    }

    /// Units per sliding period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The sliding period.
    pub fn period(&self) -> Duration {
        duration(self.period)
    }

    /// Entries admitted at `at` still count at `now` while `at + period > now`.
    fn live<'a>(
        &self,
        state: &'a SlidingLogState,
        now: Micros,
    ) -> impl Iterator<Item = (Micros, u64)> + 'a {
        let period = self.period;
        state
            .entries
            .iter()
            .copied()
            .filter(move |&(at, _)| at.saturating_add(period) > now)
    }

    fn used(&self, state: &SlidingLogState, now: Micros) -> u64 {
        self.live(state, now)
            .fold(0, |sum, (_, units)| sum.saturating_add(units))
    }

    /// Smallest wait until `units` (≤ limit) fit, with `extra` (a charge being admitted now)
    /// counted after the logged entries: the moment enough of the oldest entries have left.
    fn wait_for(&self, state: &SlidingLogState, now: Micros, extra: u64, units: u64) -> Micros {
        let allowed = self.limit - units;
        let mut still = self.used(state, now).saturating_add(extra);
        let pending = (extra > 0).then_some((now, extra));
        for (at, n) in self.live(state, now).chain(pending) {
            if still <= allowed {
                break;
            }
            still -= n;
            if still <= allowed {
                // Saturating: with a period beyond any clock the entry never leaves.
                return at.saturating_add(self.period).saturating_sub(now);
            }
        }
        0
    }

    /// `now`, or the newest entry's time if `now` is earlier (a clock that stepped back): the
    /// time in between counts as none, so entries stay in time order and none lingers longer.
    fn not_before_newest(state: &SlidingLogState, now: Micros) -> Micros {
        state.entries.back().map_or(now, |&(at, _)| now.max(at))
    }

    /// The outcome of charging `cost` at `now`, without changing the state.
    pub fn evaluate(&self, state: &SlidingLogState, now: Micros, cost: u64) -> Outcome {
        let now = Self::not_before_newest(state, now);
        let used = self.used(state, now);
        // Checked, not saturating: with a limit of `u64::MAX` a saturated sum would always fit.
        let fits = used
            .checked_add(cost)
            .is_some_and(|total| total <= self.limit);
        let (verdict, charged) = if fits {
            (Verdict::Allowed, cost)
        } else {
            let retry_after = duration(self.wait_for(state, now, 0, cost));
            (Verdict::Denied { retry_after }, 0)
        };
        // `used` may exceed the limit for a log kept while the limit was lowered.
        let remaining = self.limit.saturating_sub(used.saturating_add(charged));
        let reset = if remaining >= self.limit {
            Duration::ZERO
        } else {
            duration(self.wait_for(state, now, charged, remaining + 1))
        };
        Outcome {
            verdict,
            limit: self.limit,
            remaining,
            balance: i64::try_from(remaining).unwrap_or(i64::MAX),
            next_unit_in: reset,
            full_in: duration(self.wait_for(state, now, charged, self.limit)),
            offence: false,
            overridden: None,
        }
    }

    /// Applies an allowed charge, dropping entries that left the window.
    pub fn commit(&self, state: &mut SlidingLogState, now: Micros, cost: u64) {
        let now = Self::not_before_newest(state, now);
        self.prune(state, now);
        if cost == 0 {
            return;
        }
        match state.entries.back_mut() {
            Some((at, units)) if *at == now => *units += cost,
            _ => state.entries.push_back((now, cost)),
        }
    }

    /// Gives `units` back, newest entries first.
    pub fn refund(&self, state: &mut SlidingLogState, now: Micros, mut units: u64) {
        let now = Self::not_before_newest(state, now);
        self.prune(state, now);
        while units > 0 {
            let Some((_, last)) = state.entries.back_mut() else {
                break;
            };
            let take = units.min(*last);
            *last -= take;
            units -= take;
            if *last == 0 {
                state.entries.pop_back();
            }
        }
    }

    fn prune(&self, state: &mut SlidingLogState, now: Micros) {
        while let Some(&(at, _)) = state.entries.front() {
            if at.saturating_add(self.period) > now {
                break;
            }
            state.entries.pop_front();
        }
    }

    /// The moment the newest entry leaves the window (the state then equals a fresh key's).
    pub fn expires_at(&self, state: &SlidingLogState) -> Micros {
        state
            .entries
            .back()
            .map_or(0, |&(at, _)| at.saturating_add(self.period))
    }
}
