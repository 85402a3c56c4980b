//! The circuit breaker in front of a remote store: its settings ([`CircuitBreaker`]), the state
//! machine that opens after consecutive failures, the probes with backoff that close it, and the
//! store's health gauge.
//!
//! The breaker stands in front of a remote store inside the [`Limiter`](crate::Limiter) (a
//! [`MemoryStore`](crate::MemoryStore) never gets one: it cannot fail, and its requests pay
//! nothing for this module). Closed, it lets every call through and counts consecutive
//! failures. After [`failures`](CircuitBreaker::failures) of them it opens: calls are answered at
//! once with a [`CircuitOpen`](StoreErrorKind::CircuitOpen) error (or by the local fallback)
//! without touching the store, so no request waits for the store's timeout. While open, the first
//! call after each probe time starts one probe in the background ([`Store::probe`]: a call that
//! fails when requests fail, on a connection as the store is now); the probe interval doubles
//! after each failed probe, up to a maximum. The first probe that succeeds closes the breaker.
//!
//! A breaker that opens again within the longest probe interval of closing is still in the same
//! outage (the store answers probes but fails requests): it goes on doubling the interval from
//! the one that closed it, instead of probing after the first interval again, and tells its
//! reopenings and closings on the warning interval instead of with lines of their own. The
//! interval starts over at the first only once the store has stayed healthy that long.
//!
//! The breaker only says whether a call may reach the store and hears how it went: the calls
//! themselves and the local fallback are the wrapper's, the lines' wording and counts are the
//! warnings'.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::policy::FailurePolicy;
use super::warnings::Warnings;
use crate::algorithm::{duration, micros, Micros};
use crate::clock::{Clock, SystemClock};
use crate::store::{Store, StoreError, StoreErrorKind};

/// Settings of the circuit breaker in front of a remote store (see
/// [`LimiterBuilder::circuit_breaker`](crate::engine::LimiterBuilder::circuit_breaker)).
///
/// Defaults: opens after 5 consecutive failures; first probe 1 s after opening, then every 2, 4,
/// … up to 30 s; at most one warning line per 10 s.
///
/// A probe asks the store what a request asks ([`Store::probe`]; the Redis store charges a key
/// of its own through the same script, on a connection opened again if the last one failed), so
/// a store that fails requests fails its probes too: `PING` would still answer while Redis,
/// out of memory, refuses every charge.
///
/// The probe interval starts over at the first one only once the store has stayed healthy for
/// the longest interval (30 s by default) after the breaker closed. A breaker that opens again
/// sooner (a probe succeeded, but requests still fail) takes the doubling up where it stopped,
/// so such a store is probed at most once per longest interval in the end rather than every
/// second; that reopening and the closings after it are counted in the warning line of the
/// interval rather than written one line each.
#[derive(Clone, Debug)]
#[must_use]
pub struct CircuitBreaker {
    failures: u32,
    first_probe: Duration,
    max_probe: Duration,
    warn_every: Duration,
    clock: Option<Arc<dyn Clock>>,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker {
            failures: 5,
            first_probe: Duration::from_secs(1),
            max_probe: Duration::from_secs(30),
            warn_every: Duration::from_secs(10),
            clock: None,
        }
    }
}

impl CircuitBreaker {
    /// The default settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens after this many consecutive failures (default 5; at least 1).
    pub fn failures(mut self, failures: u32) -> Self {
        self.failures = failures.max(1);
        self
    }

    /// The first probe comes `first` after the breaker opens; each failed probe doubles the
    /// interval, up to `max` (defaults 1 s and 30 s). Opening again within `max` of closing
    /// doubles the interval that closed it instead of starting over at `first`.
    pub fn probe_interval(mut self, first: Duration, max: Duration) -> Self {
        self.first_probe = first;
        self.max_probe = max.max(first);
        self
    }

    /// At most one warning line per `every` while the store fails, with the number of failed
    /// decisions since the last line (default 10 s). Besides, the breaker's opening and its
    /// closing each get a line of their own, except when it opens again within the longest probe
    /// interval of closing: that line then counts the reopenings, and a closing after them is
    /// told once a line is due.
    pub fn warn_interval(mut self, every: Duration) -> Self {
        self.warn_every = every;
        self
    }

    /// **For tests**: the breaker's time (probe times, warning intervals) comes from `clock`.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }
}

/// The breaker's state, shared by the wrapper and its probes.
pub(super) struct Breaker {
    store: Arc<dyn Store>,
    threshold: u32,
    first_probe: Duration,
    max_probe: Duration,
    clock: Arc<dyn Clock>,
    /// The hot path's one read: whether calls skip the store.
    open: AtomicBool,
    /// Consecutive failures while closed.
    failures: AtomicU32,
    /// The breaker closed, and no line has said so yet (see [`Breaker::probed`]).
    untold_close: AtomicBool,
    cold: Mutex<Cold>,
    healthy: metrics::Gauge,
}

/// The breaker's rarely touched state.
struct Cold {
    next_probe: Micros,
    /// The interval before the next probe, or of the probe that closed the breaker.
    backoff: Duration,
    probing: bool,
    /// When the breaker opened after being healthy (a reopening soon after closing keeps it).
    opened_at: Micros,
    /// When the breaker last closed: opening again within `max_probe` of it is the same outage.
    closed_at: Option<Micros>,
    /// The breaker opened again soon after closing in this outage: the store answers probes but
    /// fails requests, and its closings wait for the warning interval like the failures.
    flapping: bool,
    /// The lines' counts, under the same lock.
    warnings: Warnings,
}

impl Breaker {
    /// A closed breaker in front of `store`; its lines say what `policy` does meanwhile.
    pub(super) fn new(
        store: Arc<dyn Store>,
        config: &CircuitBreaker,
        policy: FailurePolicy,
    ) -> Self {
        describe();
        let healthy = metrics::gauge!("tollgate_store_healthy");
        healthy.set(1.0);
        let clock = config
            .clock
            .clone()
            .unwrap_or_else(|| Arc::new(SystemClock::new()));
        Breaker {
            store,
            threshold: config.failures,
            first_probe: config.first_probe,
            max_probe: config.max_probe,
            clock,
            open: AtomicBool::new(false),
            failures: AtomicU32::new(0),
            untold_close: AtomicBool::new(false),
            cold: Mutex::new(Cold {
                next_probe: 0,
                backoff: Duration::ZERO,
                probing: false,
                opened_at: 0,
                closed_at: None,
                flapping: false,
                warnings: Warnings::new(config.warn_every, policy),
            }),
            healthy,
        }
    }

    /// Whether calls skip the store.
    #[inline]
    pub(super) fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    fn now(&self) -> Micros {
        self.clock.now()
    }

    fn cold(&self) -> MutexGuard<'_, Cold> {
        self.cold.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The store answered.
    #[inline]
    pub(super) fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.untold_close.load(Ordering::Relaxed) {
            self.tell_close();
        }
    }

    /// The store failed a call: count it, open after `threshold` in a row, warn at most once per
    /// interval.
    pub(super) fn failed(&self, error: &StoreError) {
        let now = self.now();
        let failures = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        let mut cold = self.cold();
        if failures >= self.threshold && !self.open.load(Ordering::Relaxed) {
            let untold_close = self.untold_close.swap(false, Ordering::Relaxed);
            let again = cold
                .closed_at
                .is_some_and(|closed| now.saturating_sub(closed) < micros(self.max_probe));
            if again {
                // The closing was no recovery: the line counting reopenings tells it.
                // The same outage: the backoff goes on from the interval that closed the
                // breaker, and no line of its own.
                cold.backoff = (cold.backoff * 2).min(self.max_probe);
                cold.flapping = true;
                cold.warnings.reopened_soon();
            } else {
                if untold_close {
                    // A closing long ago that no line has told yet (no call succeeded since).
                    cold.closed_line(now);
                }
                cold.backoff = self.first_probe;
                cold.opened_at = now;
                cold.flapping = false;
                cold.warnings.opened(now, error, failures, self.first_probe);
            }
            cold.next_probe = now.saturating_add(micros(cold.backoff));
            self.open.store(true, Ordering::Relaxed);
            self.healthy.set(0.0);
        }
        cold.warnings
            .failed(now, self.open.load(Ordering::Relaxed), error);
    }

    /// A call while open: answered without the store. Starts a probe when one is due.
    pub(super) fn refused(self: &Arc<Self>) -> StoreError {
        let now = self.now();
        let mut cold = self.cold();
        if !cold.probing && now >= cold.next_probe {
            cold.probing = true;
            self.probe(&mut cold, now);
        }
        let wait = duration(cold.next_probe.saturating_sub(now)).max(if cold.probing {
            cold.backoff
        } else {
            Duration::ZERO
        });
        let error = StoreError::new(
            StoreErrorKind::CircuitOpen,
            "the store failed repeatedly and is not asked until it answers a probe",
        )
        .with_retry_after(wait);
        cold.warnings
            .failed(now, self.open.load(Ordering::Relaxed), &error);
        error
    }

    /// The line saying the breaker closed, when it was left for later and one is due.
    #[cold]
    fn tell_close(&self) {
        let now = self.now();
        let mut cold = self.cold();
        if self.untold_close.load(Ordering::Relaxed) && cold.warnings.due(now) {
            self.untold_close.store(false, Ordering::Relaxed);
            cold.closed_line(now);
        }
    }

    /// Starts a probe in the background (a caller holds `cold`).
    fn probe(self: &Arc<Self>, cold: &mut Cold, now: Micros) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to probe from: the next call past the probe time tries again.
            cold.probing = false;
            cold.next_probe = now.saturating_add(micros(cold.backoff));
            return;
        };
        let probe = self.store.probe();
        let breaker = self.clone();
        runtime.spawn(async move {
            let result = probe.await;
            breaker.probed(result);
        });
    }

    /// A probe's answer: close, or wait longer before the next one.
    fn probed(&self, result: Result<(), StoreError>) {
        let now = self.now();
        let mut cold = self.cold();
        cold.probing = false;
        match result {
            Ok(()) => {
                cold.closed_at = Some(now);
                if cold.flapping {
                    // Flapping: the next failures will likely open it again, and the line
                    // counting those tells this closing too. Only if the store keeps answering is
                    // it told on its own, by a call that succeeds once a line is due.
                    self.untold_close.store(true, Ordering::Relaxed);
                } else {
                    cold.closed_line(now);
                }
                // Last: whoever sees the gauge or the calls go through also sees the line.
                self.failures.store(0, Ordering::Relaxed);
                self.open.store(false, Ordering::Relaxed);
                self.healthy.set(1.0);
            }
            Err(error) => {
                cold.backoff = (cold.backoff * 2).min(self.max_probe);
                cold.next_probe = now.saturating_add(micros(cold.backoff));
                tracing::debug!(%error, next_probe_ms = cold.backoff.as_millis() as u64, "rate-limit store: probe failed");
            }
        }
    }
}

impl Cold {
    /// The line saying the breaker closed, and how long the store failed.
    fn closed_line(&mut self, now: Micros) {
        let closed = self.closed_at.unwrap_or(now);
        let down = duration(closed.saturating_sub(self.opened_at));
        self.warnings.closed(now, down);
    }
}

/// What the tests read.
#[cfg(test)]
impl Breaker {
    /// The warning lines' counts.
    pub(super) fn warnings<R>(&self, read: impl FnOnce(&Warnings) -> R) -> R {
        read(&self.cold().warnings)
    }

    /// Whether a closing waits for its line.
    pub(super) fn untold_close(&self) -> bool {
        self.untold_close.load(Ordering::Relaxed)
    }
}

fn describe() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        metrics::describe_gauge!(
            "tollgate_store_healthy",
            "1 while the remote store answers, 0 while its circuit breaker is open."
        );
    });
}
