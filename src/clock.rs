//! Where `now` comes from.
//!
//! Algorithms take time as an argument; stores ask a [`Clock`]. The default [`SystemClock`] is
//! anchored to the Unix epoch (windows can align to UTC minutes or midnight) but advances with a
//! monotonic clock, so a wall-clock jump never refills or drains a bucket. It reads tokio's
//! `Instant`, so under `tokio::time::pause()` the limiter and queue-mode sleeps share one paused
//! timeline. [`ManualClock`] is for tests that set time by hand.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::algorithm::{micros, Micros};

/// A source of time in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> Micros;
}

/// Unix-anchored monotonic time (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    anchor_unix: Micros,
    anchor: tokio::time::Instant,
}

impl SystemClock {
    /// Anchors the clock to the current wall-clock time.
    pub fn new() -> Self {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        SystemClock {
            anchor_unix: micros(unix),
            anchor: tokio::time::Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.anchor);
        self.anchor_unix.saturating_add(micros(elapsed))
    }
}

/// A clock that moves only when told to; clones share the same time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock at `start` after the Unix epoch.
    pub fn new(start: Duration) -> Self {
        ManualClock(Arc::new(AtomicU64::new(micros(start))))
    }

    /// Moves time forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(micros(by), Ordering::SeqCst);
    }

    /// Sets the time (it may go backwards; algorithms treat an earlier `now` as no time passing).
    pub fn set(&self, at: Duration) {
        self.0.store(micros(at), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_clones_share_time() {
        let clock = ManualClock::new(Duration::from_secs(10));
        let other = clock.clone();
        clock.advance(Duration::from_millis(5));
        assert_eq!(other.now(), 10_005_000);
    }

    #[tokio::test(start_paused = true)]
    async fn system_clock_follows_paused_tokio_time() {
        let clock = SystemClock::new();
        let before = clock.now();
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(clock.now() - before, 3_000_000);
    }
}
