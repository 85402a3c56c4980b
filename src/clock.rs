//! Where `now` comes from.
//!
//! Algorithms take time as an argument; stores ask a [`Clock`]. Every clock here is anchored to
//! the Unix epoch (windows can align to UTC minutes or midnight) but advances monotonically, so a
//! wall-clock jump never refills or drains a bucket.
//!
//! Monotonic means per clock, not only per core: time-stamp counters can disagree between cores,
//! and a VM can migrate to a host whose counter is behind (governor #299 denies requests early
//! for exactly this reason). [`SystemClock`] therefore never hands out less than the latest value
//! it handed out, on any thread, and the memory store holds every other clock to the same rule.
//!
//! - [`SystemClock`] (the default) reads the CPU's time-stamp counter through `quanta`, as
//!   governor does: about 10 ns a read, against about 30 ns for the operating system's clock on a
//!   typical VM — a third of a whole in-memory decision.
//! - [`TokioClock`] follows tokio's clock, including `tokio::time::pause()`: use it in tests that
//!   pause time, so that the limiter and queue-mode sleeps share one paused timeline.
//! - [`ManualClock`] is for tests that set time by hand.

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

/// The latest time handed out, so that a reading that went backwards is answered with it.
#[derive(Debug, Default)]
pub(crate) struct Latest(AtomicU64);

impl Latest {
    /// `now`, or the latest time handed out if that is later.
    #[inline]
    pub(crate) fn at_least(&self, now: Micros) -> Micros {
        // A plain load first: within one microsecond (most calls under load) nothing is written,
        // so threads reading the clock do not take turns owning its cache line. Relaxed: this one
        // value is the only thing ordered, and `fetch_max` is atomic on it.
        let latest = self.0.load(Ordering::Relaxed);
        if now <= latest {
            return latest;
        }
        now.max(self.0.fetch_max(now, Ordering::Relaxed))
    }
}

/// Unix-anchored monotonic time from the time-stamp counter (see the module docs): never less
/// than the latest time it handed out, shared by its clones.
#[derive(Clone, Debug)]
pub struct SystemClock {
    anchor_unix: Micros,
    anchor: u64,
    /// Microseconds per counter tick, as a 64.64 fixed-point fraction: `quanta`'s calibration
    /// turned into one multiplication (instead of its conversion to nanoseconds and a division).
    micros_per_tick: u64,
    counter: quanta::Clock,
    latest: Arc<Latest>,
}

impl SystemClock {
    /// Anchors the clock to the current wall-clock time.
    pub fn new() -> Self {
        let counter = quanta::Clock::new();
        // 2^40 ticks (minutes of a GHz counter) measured in nanoseconds: the fraction is exact to
        // a few parts in 10^12, far below the calibration's own error.
        let nanos = u128::from(counter.delta_as_nanos(0, 1 << 40));
        SystemClock {
            anchor_unix: unix_now(),
            anchor: counter.raw(),
            micros_per_tick: u64::try_from((nanos << 24) / 1_000).unwrap_or(u64::MAX),
            counter,
            latest: Arc::default(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Micros {
        let ticks = self.counter.raw().saturating_sub(self.anchor);
        let elapsed = (u128::from(ticks) * u128::from(self.micros_per_tick)) >> 64;
        self.latest
            .at_least(self.anchor_unix.saturating_add(elapsed as u64))
    }
}

/// Unix-anchored time that follows tokio's clock, paused or not (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    anchor_unix: Micros,
    anchor: tokio::time::Instant,
}

impl TokioClock {
    /// Anchors the clock to the current wall-clock time and tokio's current instant.
    pub fn new() -> Self {
        TokioClock {
            anchor_unix: unix_now(),
            anchor: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Micros {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.anchor);
        self.anchor_unix.saturating_add(micros(elapsed))
    }
}

fn unix_now() -> Micros {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    micros(since_epoch)
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

    /// Sets the time. It may go backwards, as a real clock can: the memory store then answers
    /// as if no time had passed until the clock is past the latest time it read.
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

    #[test]
    fn system_clock_is_unix_time_and_moves_forward() {
        let clock = SystemClock::new();
        let first = clock.now();
        assert!(
            first.abs_diff(unix_now()) < 1_000_000,
            "within a second of the wall clock"
        );
        std::thread::sleep(Duration::from_millis(2));
        assert!(clock.now() >= first + 2_000);
    }

    #[test]
    fn latest_never_goes_back_across_threads() {
        let latest = Arc::new(Latest::default());
        assert_eq!(latest.at_least(50), 50);
        assert_eq!(latest.at_least(40), 50, "an earlier reading is the latest");
        assert_eq!(latest.at_least(60), 60);
        // Threads reading times that go up and down: each sees a non-decreasing sequence, never
        // below what any thread was handed before it read.
        let threads: Vec<_> = (0..4u64)
            .map(|i| {
                let latest = latest.clone();
                std::thread::spawn(move || {
                    let mut previous = 0;
                    for n in 0..10_000u64 {
                        let reading = 1_000 + (n * 7 + i * 13) % 997;
                        let got = latest.at_least(reading);
                        assert!(got >= reading && got >= previous);
                        previous = got;
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(latest.at_least(0), 1_996);
    }

    #[test]
    fn system_clock_clones_share_the_floor() {
        let clock = SystemClock::new();
        let ahead = clock.latest.at_least(clock.now() + 60_000_000);
        let clone = clock.clone();
        // A counter a minute behind the latest reading (another core, a migrated VM) reads as
        // the latest, on every clone.
        assert_eq!(clone.now(), ahead);
        assert_eq!(clock.now(), ahead);
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_tokio_time() {
        let clock = TokioClock::new();
        let before = clock.now();
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(clock.now() - before, 3_000_000);
    }
}
