//! What happens when a remote store fails: the failure policy, the circuit breaker in front of the
//! store, the local fallback, and warnings bounded to one line per interval.
//!
//! The breaker wraps a remote store inside the [`Limiter`](crate::Limiter) (a [`MemoryStore`] is
//! never wrapped: it cannot fail, and its requests pay nothing for this module). Closed, it
//! passes every call through and counts consecutive failures. After
//! [`failures`](CircuitBreaker::failures) of them it opens: calls are answered at once with a
//! [`CircuitOpen`](StoreErrorKind::CircuitOpen) error (or by the local fallback) without touching
//! the store, so no request waits for the store's timeout. While open, the first call after each
//! probe time starts one probe in the background ([`Store::probe`]: a call that fails when
//! requests fail, on a connection as the store is now); the probe interval doubles after each
//! failed probe, up to a maximum. The first probe that succeeds closes the breaker.
//!
//! A breaker that opens again within the longest probe interval of closing is still in the same
//! outage (the store answers probes but fails requests): it goes on doubling the interval from
//! the one that closed it, instead of probing after the first interval again, and tells its
//! reopenings and closings on the warning interval instead of with lines of their own. The
//! interval starts over at the first only once the store has stayed healthy that long.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use smallvec::SmallVec;

use super::{Charge, MemoryStore, Outcomes, Store, StoreError, StoreErrorKind, StoreFuture};
use crate::algorithm::error::ConfigError;
use crate::algorithm::{
    duration, micros, Algorithm, BurstPool, Concurrency, FixedWindow, Micros, Mode, Penalty,
    SlidingLog, SlidingWindow, TokenBucket,
};
use crate::clock::{Clock, SystemClock};

/// What the layer does when its store fails, times out, or its circuit breaker is open.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum FailurePolicy {
    /// Forward the request without limiting it (default). A limiter outage then degrades
    /// protection instead of taking the whole service down with it.
    #[default]
    Open,
    /// Answer `503 Service Unavailable` with a plain problem+json message and a `Retry-After`
    /// (the breaker's next probe; gRPC requests: `UNAVAILABLE` with `grpc-retry-pushback-ms`):
    /// for limits that guard something that must never be overrun
    /// (a paid upstream with a hard cap).
    Closed,
    /// Decide with an in-process [`MemoryStore`] holding the same rules, each limit scaled by
    /// `share` (e.g. `0.25` for one instance of four), until the shared store answers again; then
    /// the shared store decides again by itself. The local counts start empty and are not merged
    /// back. `share` must be in `(0, 1]`; scaled numbers are rounded down, to at least 1.
    Local {
        /// The fraction of each limit this instance may grant on its own.
        share: f64,
    },
}

impl FailurePolicy {
    /// Checks the share of [`Local`](Self::Local).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        match *self {
            FailurePolicy::Local { share } if !(share > 0.0 && share <= 1.0) => {
                Err(ConfigError::new(
                    "on_store_failure",
                    "share",
                    format!("the local share must be greater than 0 and at most 1, not {share}"),
                ))
            }
            _ => Ok(()),
        }
    }

    fn what_happens(&self) -> String {
        match self {
            FailurePolicy::Open => "requests are forwarded unlimited (fail open)".to_owned(),
            FailurePolicy::Closed => "requests are refused with 503 (fail closed)".to_owned(),
            FailurePolicy::Local { share } => {
                format!("requests are decided locally with {share} of each limit (fail to local)")
            }
        }
    }
}

/// Settings of the circuit breaker in front of a remote store (see
/// [`LimiterBuilder::circuit_breaker`](crate::LimiterBuilder::circuit_breaker)).
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

/// A remote store behind the circuit breaker, with the local fallback of
/// [`FailurePolicy::Local`].
pub(crate) struct Guarded {
    store: Arc<dyn Store>,
    breaker: Arc<Breaker>,
    local: Option<Local>,
}

#[derive(Clone)]
struct Local {
    store: MemoryStore,
    share: f64,
}

struct Breaker {
    store: Arc<dyn Store>,
    threshold: u32,
    first_probe: Duration,
    max_probe: Duration,
    warn_every: Micros,
    clock: Arc<dyn Clock>,
    policy: FailurePolicy,
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
#[derive(Default)]
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
    /// Failed decisions since the breaker opened (for the line that says it closed).
    failed_while_open: u64,
    /// Failed decisions since the last warning line, the times the breaker opened again soon
    /// after closing since then, and when that line was written.
    unreported: u64,
    reopened: u64,
    last_warning: Option<Micros>,
}

impl Guarded {
    pub(crate) fn new(
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
        Guarded {
            breaker: Arc::new(Breaker {
                store: store.clone(),
                threshold: config.failures,
                first_probe: config.first_probe,
                max_probe: config.max_probe,
                warn_every: micros(config.warn_every),
                clock,
                policy,
                open: AtomicBool::new(false),
                failures: AtomicU32::new(0),
                untold_close: AtomicBool::new(false),
                cold: Mutex::new(Cold::default()),
                healthy,
            }),
            local: match policy {
                FailurePolicy::Local { share } => Some(Local {
                    store: MemoryStore::new(),
                    share,
                }),
                _ => None,
            },
            store,
        }
    }

    /// The answer for `batch` when the store failed with `error` (or was not asked).
    fn fallback(&self, batch: &[Charge<'_>], error: StoreError) -> StoreFuture<Outcomes> {
        match &self.local {
            Some(local) => StoreFuture::ready(Ok(local.decide(batch))),
            None => StoreFuture::ready(Err(error)),
        }
    }
}

impl Local {
    /// The same batch against the local store, every limit scaled by the share.
    fn decide(&self, batch: &[Charge<'_>]) -> Outcomes {
        let scaled: SmallVec<[Algorithm; 2]> = batch
            .iter()
            .map(|c| scale(c.algorithm, self.share))
            .collect();
        let charges: SmallVec<[Charge<'_>; 2]> = batch
            .iter()
            .zip(&scaled)
            .map(|(charge, algorithm)| Charge {
                algorithm,
                // A cost above the scaled limit is denied by the algorithm, never charged.
                ..*charge
            })
            .collect();
        match self.store.apply(&charges).into_ready() {
            Ok(Ok(outcomes)) => outcomes,
            // The memory store answers at once and never fails; should it, deny rather than
            // admit unlimited.
            _ => batch
                .iter()
                .map(|c| crate::algorithm::Outcome {
                    verdict: crate::algorithm::Verdict::Denied {
                        retry_after: Duration::from_secs(1),
                    },
                    limit: c.algorithm.capacity(),
                    remaining: 0,
                    balance: 0,
                    next_unit_in: Duration::from_secs(1),
                    full_in: Duration::from_secs(1),
                    offence: false,
                })
                .collect(),
        }
    }
}

/// A charge whose borrowed parts are owned, to decide it locally after an await.
struct OwnedCharge {
    rule: Box<str>,
    algorithm: Algorithm,
    key: Box<[u8]>,
    cost: u64,
    mode: Mode,
    penalty: Option<Penalty>,
}

impl OwnedCharge {
    fn new(charge: &Charge<'_>) -> Self {
        OwnedCharge {
            rule: charge.rule.into(),
            algorithm: charge.algorithm.clone(),
            key: charge.key.into(),
            cost: charge.cost,
            mode: charge.mode,
            penalty: charge.penalty.cloned(),
        }
    }

    fn charge(&self) -> Charge<'_> {
        Charge {
            rule: &self.rule,
            algorithm: &self.algorithm,
            key: &self.key,
            cost: self.cost,
            mode: self.mode,
            penalty: self.penalty.as_ref(),
        }
    }
}

impl Breaker {
    fn now(&self) -> Micros {
        self.clock.now()
    }

    fn cold(&self) -> std::sync::MutexGuard<'_, Cold> {
        self.cold.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The store answered.
    #[inline]
    fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.untold_close.load(Ordering::Relaxed) {
            self.tell_close();
        }
    }

    /// The store failed a call: count it, open after `threshold` in a row, warn at most once per
    /// interval.
    fn failed(&self, error: &StoreError) {
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
                cold.reopened += 1;
            } else {
                if untold_close {
                    // A closing long ago that no line has told yet (no call succeeded since).
                    self.closed_line(&mut cold, now);
                }
                cold.backoff = self.first_probe;
                cold.opened_at = now;
                cold.failed_while_open = 0;
                cold.flapping = false;
                cold.reopened = 0;
                cold.last_warning = Some(now);
                tracing::warn!(
                    %error,
                    failures,
                    next_probe_ms = self.first_probe.as_millis() as u64,
                    "rate-limit store: circuit breaker opened after {failures} consecutive \
                     failures; the store is not asked until it answers a probe, and {}",
                    self.policy.what_happens()
                );
            }
            cold.next_probe = now.saturating_add(micros(cold.backoff));
            self.open.store(true, Ordering::Relaxed);
            self.healthy.set(0.0);
        }
        self.report(&mut cold, now, error);
    }

    /// A call while open: answered without the store. Starts a probe when one is due.
    fn refused(self: &Arc<Self>) -> StoreError {
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
        self.report(&mut cold, now, &error);
        error
    }

    /// Whether a warning line may be written: one per interval.
    fn due(&self, cold: &Cold, now: Micros) -> bool {
        cold.last_warning
            .is_none_or(|last| now.saturating_sub(last) >= self.warn_every)
    }

    /// One warning line per interval, with the failures since the last one.
    fn report(&self, cold: &mut Cold, now: Micros, error: &StoreError) {
        cold.unreported += 1;
        if self.open.load(Ordering::Relaxed) {
            cold.failed_while_open += 1;
        }
        if self.due(cold, now) {
            let failed = std::mem::take(&mut cold.unreported);
            let reopened = std::mem::take(&mut cold.reopened);
            cold.last_warning = Some(now);
            let flaps = match reopened {
                0 => String::new(),
                n => format!(
                    "; the circuit breaker closed after a successful probe and opened again {n} \
                     time(s) (the store answers probes but fails requests)"
                ),
            };
            tracing::warn!(
                %error,
                failed,
                reopened,
                "rate-limit store failing: {failed} failed decision(s) since the last \
                 warning{flaps}; {}",
                self.policy.what_happens()
            );
        }
    }

    /// The line saying the breaker closed, when it was left for later and one is due.
    #[cold]
    fn tell_close(&self) {
        let now = self.now();
        let mut cold = self.cold();
        if self.untold_close.load(Ordering::Relaxed) && self.due(&cold, now) {
            self.untold_close.store(false, Ordering::Relaxed);
            self.closed_line(&mut cold, now);
        }
    }

    /// The line saying the breaker closed, and how long the store failed.
    fn closed_line(&self, cold: &mut Cold, now: Micros) {
        let closed = cold.closed_at.unwrap_or(now);
        let down = duration(closed.saturating_sub(cold.opened_at));
        let reopened = std::mem::take(&mut cold.reopened);
        let flaps = match reopened {
            0 => String::new(),
            n => format!(" (it had closed and opened again {n} time(s) since the last warning)"),
        };
        cold.unreported = 0;
        cold.last_warning = Some(now);
        tracing::warn!(
            failed = cold.failed_while_open,
            down_ms = down.as_millis() as u64,
            reopened,
            "rate-limit store answers again: circuit breaker closed after {:.1} s and {} failed \
             decision(s){flaps}; the shared store decides again",
            down.as_secs_f64(),
            cold.failed_while_open
        );
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
                    self.closed_line(&mut cold, now);
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

impl Store for Guarded {
    fn apply(&self, batch: &[Charge<'_>]) -> StoreFuture<Outcomes> {
        let breaker = &self.breaker;
        if breaker.open.load(Ordering::Relaxed) {
            let error = breaker.refused();
            return self.fallback(batch, error);
        }
        match self.store.apply(batch).into_ready() {
            Ok(Ok(outcomes)) => {
                breaker.succeeded();
                StoreFuture::ready(Ok(outcomes))
            }
            Ok(Err(error)) => {
                breaker.failed(&error);
                self.fallback(batch, error)
            }
            Err(pending) => {
                let breaker = breaker.clone();
                // Only the local fallback needs the batch after the store's answer.
                let local = self.local.clone().map(|local| {
                    let owned: SmallVec<[OwnedCharge; 2]> =
                        batch.iter().map(OwnedCharge::new).collect();
                    (local, owned)
                });
                StoreFuture::pending(async move {
                    match pending.await {
                        Ok(outcomes) => {
                            breaker.succeeded();
                            Ok(outcomes)
                        }
                        Err(error) => {
                            breaker.failed(&error);
                            match local {
                                Some((local, owned)) => {
                                    let batch: SmallVec<[Charge<'_>; 2]> =
                                        owned.iter().map(OwnedCharge::charge).collect();
                                    Ok(local.decide(&batch))
                                }
                                None => Err(error),
                            }
                        }
                    }
                })
            }
        }
    }

    fn refund(&self, charge: &Charge<'_>) -> StoreFuture<()> {
        if charge.algorithm.is_concurrency() {
            // A slot given back leaves the books whatever the breaker says: the remote store
            // would go on renewing a lease it still counts as held. It may have been taken by
            // the local fallback instead (giving back one it does not hold changes nothing).
            if let Some(local) = &self.local {
                let _ = local.store.refund(charge).into_ready();
            }
            return self.store.refund(charge);
        }
        if self.breaker.open.load(Ordering::Relaxed) {
            return StoreFuture::ready(Err(self.breaker.refused()));
        }
        self.store.refund(charge)
    }

    fn reset(&self, rule: &str, algorithm: &Algorithm, key: &[u8]) -> StoreFuture<()> {
        if self.breaker.open.load(Ordering::Relaxed) {
            return StoreFuture::ready(Err(self.breaker.refused()));
        }
        self.store.reset(rule, algorithm, key)
    }

    fn set_block(
        &self,
        rule: &str,
        penalty: &Penalty,
        key: &[u8],
        block: Option<Duration>,
    ) -> StoreFuture<()> {
        if self.breaker.open.load(Ordering::Relaxed) {
            return StoreFuture::ready(Err(self.breaker.refused()));
        }
        self.store.set_block(rule, penalty, key, block)
    }

    fn validate(&self, rule: &str, algorithm: &Algorithm) -> Result<(), ConfigError> {
        self.store.validate(rule, algorithm)
    }

    fn validate_penalty(&self, rule: &str, penalty: &Penalty) -> Result<(), ConfigError> {
        self.store.validate_penalty(rule, penalty)
    }

    fn probe(&self) -> StoreFuture<()> {
        self.store.probe()
    }
}

impl fmt::Debug for Guarded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guarded")
            .field("store", &self.store)
            .field("open", &self.breaker.open.load(Ordering::Relaxed))
            .field("policy", &self.breaker.policy)
            .finish_non_exhaustive()
    }
}

/// `algorithm` with every count scaled by `share` (rounded down, at least 1; an initial balance
/// of 0 stays 0); times unchanged.
fn scale(algorithm: &Algorithm, share: f64) -> Algorithm {
    let part = |n: u64| ((n as f64 * share).floor() as u64).max(1);
    let bucket = |tb: &TokenBucket| {
        let initial = match tb.initial() {
            0 => 0,
            n => part(n).min(part(tb.capacity())),
        };
        TokenBucket::new(part(tb.rate()), tb.period())
            .with_capacity(part(tb.capacity()))
            .with_initial(initial)
    };
    match algorithm {
        Algorithm::TokenBucket(tb) => Algorithm::TokenBucket(bucket(tb)),
        Algorithm::BurstPool(p) => {
            Algorithm::BurstPool(BurstPool::new(bucket(p.steady()), bucket(p.pool())))
        }
        Algorithm::FixedWindow(w) => {
            // A calendar month stays one: its windows are not `period`s.
            let window = match w.months() {
                Some(utc_offset) => FixedWindow::calendar_months(part(w.limit()), utc_offset),
                None => FixedWindow::new(part(w.limit()), w.period()),
            };
            Algorithm::FixedWindow(
                window
                    .with_capacity(part(w.capacity()))
                    .with_start(w.start()),
            )
        }
        Algorithm::SlidingWindow(w) => Algorithm::SlidingWindow(
            SlidingWindow::new(part(w.limit()), w.period()).with_start(w.start()),
        ),
        Algorithm::SlidingLog(w) => {
            Algorithm::SlidingLog(SlidingLog::new(part(w.limit()), w.period()))
        }
        Algorithm::Concurrency(c) => Algorithm::Concurrency(Concurrency::new(part(c.max()))),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Verdict;
    use crate::clock::ManualClock;

    #[test]
    fn fail_to_local_keeps_a_calendar_month_a_calendar_month() {
        let month = Algorithm::FixedWindow(FixedWindow::calendar_months(10, 3_600_000_000));
        let Algorithm::FixedWindow(scaled) = scale(&month, 0.5) else {
            panic!("not a fixed window: {month:?}");
        };
        assert_eq!(scaled.months(), Some(3_600_000_000));
        assert_eq!((scaled.limit(), scaled.capacity()), (5, 5));
    }

    /// A store that fails while `down` is set (its probes too, unless `answers_probes` is set)
    /// and counts the calls that reach it.
    #[derive(Debug, Default)]
    struct Flaky {
        down: AtomicBool,
        answers_probes: AtomicBool,
        calls: AtomicU32,
        memory: MemoryStore,
    }

    impl Store for Flaky {
        fn apply(&self, batch: &[Charge<'_>]) -> StoreFuture<Outcomes> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.down.load(Ordering::Relaxed) {
                return StoreFuture::ready(Err(StoreError::new(StoreErrorKind::Timeout, "late")));
            }
            self.memory.apply(batch)
        }
        fn refund(&self, charge: &Charge<'_>) -> StoreFuture<()> {
            self.memory.refund(charge)
        }
        fn reset(&self, rule: &str, algorithm: &Algorithm, key: &[u8]) -> StoreFuture<()> {
            self.memory.reset(rule, algorithm, key)
        }
        fn probe(&self) -> StoreFuture<()> {
            if self.down.load(Ordering::Relaxed) && !self.answers_probes.load(Ordering::Relaxed) {
                return StoreFuture::ready(Err(StoreError::new(StoreErrorKind::Timeout, "late")));
            }
            StoreFuture::ready(Ok(()))
        }
    }

    /// A store that fails when told to, behind a default breaker on a manual clock.
    fn flaky_behind_a_breaker(policy: FailurePolicy) -> (ManualClock, Arc<Flaky>, Guarded) {
        let clock = ManualClock::new(Duration::from_secs(1_000));
        let flaky = Arc::new(Flaky::default());
        let guarded = Guarded::new(
            flaky.clone(),
            &CircuitBreaker::new().clock(clock.clone()),
            policy,
        );
        (clock, flaky, guarded)
    }

    fn apply(guarded: &Guarded, algorithm: &Algorithm) -> Result<Outcomes, StoreError> {
        let charge = Charge {
            rule: "r",
            algorithm,
            key: b"k",
            cost: 1,
            mode: Mode::Charge,
            penalty: None,
        };
        guarded
            .apply(&[charge])
            .into_ready()
            .expect("the breaker and the test store answer at once")
    }

    #[tokio::test]
    async fn opens_after_5_failures_skips_the_store_probes_with_backoff_and_closes() {
        let (clock, flaky, guarded) = flaky_behind_a_breaker(FailurePolicy::Open);
        let algorithm = Algorithm::TokenBucket(TokenBucket::new(100, Duration::from_secs(1)));
        flaky.down.store(true, Ordering::Relaxed);
        for _ in 0..5 {
            assert_eq!(
                apply(&guarded, &algorithm).unwrap_err().kind(),
                StoreErrorKind::Timeout
            );
        }
        // Open: 100 calls, none reaches the store; each says when the next probe is.
        for _ in 0..100 {
            let error = apply(&guarded, &algorithm).unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::CircuitOpen);
            assert_eq!(error.retry_after(), Some(Duration::from_secs(1)));
        }
        assert_eq!(flaky.calls.load(Ordering::Relaxed), 5);
        // The probe (in the background) fails: the next comes 2 s later.
        clock.advance(Duration::from_secs(1));
        apply(&guarded, &algorithm).unwrap_err();
        tokio::task::yield_now().await;
        assert_eq!(
            apply(&guarded, &algorithm).unwrap_err().retry_after(),
            Some(Duration::from_secs(2))
        );
        // The store is back: the next probe closes the breaker, and calls reach the store.
        flaky.down.store(false, Ordering::Relaxed);
        clock.advance(Duration::from_secs(2));
        apply(&guarded, &algorithm).unwrap_err();
        tokio::task::yield_now().await;
        assert!(apply(&guarded, &algorithm).is_ok());
        assert_eq!(flaky.calls.load(Ordering::Relaxed), 6);
    }

    #[tokio::test]
    async fn a_slot_given_back_during_an_outage_leaves_the_books_of_both_stores() {
        let (_, flaky, guarded) = flaky_behind_a_breaker(FailurePolicy::Local { share: 0.5 });
        let slots = Algorithm::Concurrency(Concurrency::new(4));
        let release = Charge {
            rule: "r",
            algorithm: &slots,
            key: b"k",
            cost: 1,
            mode: Mode::Charge,
            penalty: None,
        };
        // One slot taken in the shared store, then the store goes down and the breaker opens.
        assert!(apply(&guarded, &slots).unwrap()[0].is_allowed());
        flaky.down.store(true, Ordering::Relaxed);
        for _ in 0..5 {
            apply(&guarded, &slots).unwrap();
        }
        // The local fallback holds half of the four: the five above took both, and three were
        // denied.
        assert!(!apply(&guarded, &slots).unwrap()[0].is_allowed());
        // Both come back to the local store though the breaker is open, and the shared store
        // is told of the one it holds.
        for _ in 0..2 {
            guarded.refund(&release).into_ready().unwrap().unwrap();
        }
        assert!(apply(&guarded, &slots).unwrap()[0].is_allowed());
        flaky.down.store(false, Ordering::Relaxed);
        let check = Charge {
            mode: Mode::Check,
            cost: 0,
            ..release
        };
        let left = flaky
            .memory
            .apply_one(&check)
            .into_ready()
            .unwrap()
            .unwrap();
        assert_eq!(left.remaining, 4);
    }

    #[tokio::test]
    async fn fail_to_local_decides_with_the_scaled_limit_and_returns_to_the_store() {
        let (clock, flaky, guarded) = flaky_behind_a_breaker(FailurePolicy::Local { share: 0.5 });
        let algorithm = Algorithm::TokenBucket(TokenBucket::new(10, Duration::from_secs(3_600)));
        flaky.down.store(true, Ordering::Relaxed);
        let verdicts: Vec<bool> = (0..8)
            .map(|_| {
                apply(&guarded, &algorithm).unwrap()[0]
                    .verdict
                    .is_admitted()
            })
            .collect();
        // Half of 10 locally: 5 admitted, then denied.
        assert_eq!(
            verdicts,
            [true, true, true, true, true, false, false, false]
        );
        assert!(matches!(
            apply(&guarded, &algorithm).unwrap()[0].verdict,
            Verdict::Denied { .. }
        ));
        flaky.down.store(false, Ordering::Relaxed);
        clock.advance(Duration::from_secs(1));
        apply(&guarded, &algorithm).unwrap();
        tokio::task::yield_now().await;
        // The shared store again: its own count (untouched while it was down).
        assert_eq!(apply(&guarded, &algorithm).unwrap()[0].remaining, 9);
    }

    #[tokio::test]
    async fn one_warning_line_per_interval_counts_the_failures_since_the_last() {
        let clock = ManualClock::new(Duration::from_secs(1_000));
        let flaky = Arc::new(Flaky::default());
        let guarded = Guarded::new(
            flaky.clone(),
            &CircuitBreaker::new()
                .clock(clock.clone())
                .warn_interval(Duration::from_secs(10)),
            FailurePolicy::Open,
        );
        let algorithm = Algorithm::TokenBucket(TokenBucket::new(100, Duration::from_secs(1)));
        flaky.down.store(true, Ordering::Relaxed);
        let lines = || {
            let cold = guarded.breaker.cold();
            (cold.last_warning, cold.unreported)
        };
        // The first failure is reported at once; 104 more within 10 s are only counted.
        for _ in 0..105 {
            apply(&guarded, &algorithm).unwrap_err();
        }
        assert_eq!(lines(), (Some(1_000_000_000), 104));
        clock.advance(Duration::from_secs(9));
        apply(&guarded, &algorithm).unwrap_err();
        assert_eq!(lines(), (Some(1_000_000_000), 105));
        // 10 s after the last line: one line saying 106, and the count starts again.
        clock.advance(Duration::from_secs(1));
        apply(&guarded, &algorithm).unwrap_err();
        assert_eq!(lines(), (Some(1_010_000_000), 0));
    }

    /// The store answers probes but fails every request: each probe closes the breaker and five
    /// failures open it again. The backoff holds across these cycles (1, 2, 4, … 30 s between
    /// probes, not 1 s each time), and the warnings stay at one line per 10 s, counting the
    /// reopenings; once the store has answered for 30 s, a new outage is probed after 1 s again.
    #[tokio::test]
    async fn a_breaker_that_opens_again_soon_after_closing_keeps_its_backoff_and_its_warning_interval(
    ) {
        let (clock, flaky, guarded) = flaky_behind_a_breaker(FailurePolicy::Open);
        let algorithm = Algorithm::TokenBucket(TokenBucket::new(100, Duration::from_secs(1)));
        let breaker = &guarded.breaker;
        let is_open = || breaker.open.load(Ordering::Relaxed);
        flaky.down.store(true, Ordering::Relaxed);
        flaky.answers_probes.store(true, Ordering::Relaxed);
        for _ in 0..5 {
            apply(&guarded, &algorithm).unwrap_err();
        }
        assert!(is_open());
        let start = clock.now();
        let mut intervals = Vec::new();
        let mut lines = vec![breaker.cold().last_warning];
        while clock.now() - start < 200_000_000 {
            let wait = apply(&guarded, &algorithm)
                .unwrap_err()
                .retry_after()
                .unwrap();
            intervals.push(wait.as_secs());
            clock.advance(wait);
            apply(&guarded, &algorithm).unwrap_err();
            tokio::task::yield_now().await;
            assert!(!is_open(), "the probe closed it");
            for _ in 0..5 {
                let error = apply(&guarded, &algorithm).unwrap_err();
                assert_eq!(error.kind(), StoreErrorKind::Timeout);
            }
            assert!(is_open(), "five failures opened it again");
            let last = breaker.cold().last_warning;
            if lines.last() != Some(&last) {
                lines.push(last);
            }
        }
        assert_eq!(intervals, [1, 2, 4, 8, 16, 30, 30, 30, 30, 30, 30]);
        // The first failure and the opening at the start, the first closing 1 s later (a
        // recovery, for all the breaker knew), then one line per 10 s at most.
        let lines: Vec<u64> = lines
            .into_iter()
            .map(|at| (at.unwrap() - start) / 1_000_000)
            .collect();
        assert_eq!(lines, [0, 1, 15, 31, 61, 91, 121, 151, 181, 211]);
        // Each line counted the reopenings before it; the one after the last waits for the next.
        assert_eq!(breaker.cold().reopened, 1);
        // The store answers again. The call that starts the probe fails (the breaker is open)
        // and its line is due: the closing waits for the next, written by a call that succeeds.
        flaky.down.store(false, Ordering::Relaxed);
        clock.advance(Duration::from_secs(30));
        apply(&guarded, &algorithm).unwrap_err();
        tokio::task::yield_now().await;
        assert!(!is_open());
        assert_eq!(breaker.cold().last_warning, Some(clock.now()));
        assert!(apply(&guarded, &algorithm).is_ok());
        assert!(breaker.untold_close.load(Ordering::Relaxed));
        clock.advance(Duration::from_secs(10));
        assert!(apply(&guarded, &algorithm).is_ok());
        assert!(!breaker.untold_close.load(Ordering::Relaxed));
        assert_eq!(breaker.cold().last_warning, Some(clock.now()));
        // Healthy for the longest interval (30 s) since it closed: the next outage starts over
        // at 1 s.
        clock.advance(Duration::from_secs(20));
        flaky.down.store(true, Ordering::Relaxed);
        flaky.answers_probes.store(false, Ordering::Relaxed);
        for _ in 0..5 {
            apply(&guarded, &algorithm).unwrap_err();
        }
        let error = apply(&guarded, &algorithm).unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::CircuitOpen);
        assert_eq!(error.retry_after(), Some(Duration::from_secs(1)));
    }

    #[test]
    fn a_share_outside_0_to_1_is_refused() {
        for share in [0.0, -1.0, 1.5, f64::NAN] {
            let error = FailurePolicy::Local { share }.validate().unwrap_err();
            assert_eq!(error.field(), "share");
        }
        assert!(FailurePolicy::Local { share: 1.0 }.validate().is_ok());
    }
}
