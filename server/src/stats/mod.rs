//! The server's statistics: one set of counters, written by the calls, read by two sinks.
//!
//! - [`prometheus`]: the text format on `/metrics`, read when scraped.
//! - [`statsd`]: lines pushed to a statsd server every flush interval, under the reference
//!   service's names, so Envoy Gateway's statsd-exporter mapping and the dashboards built on the
//!   reference carry over.
//! - [`exporter`]: the reference's Prometheus listener (`USE_PROMETHEUS`): those statsd names
//!   made series by a statsd-exporter mapping ([`mapper`]), read when scraped.
//!
//! Per domain and descriptor, the reference's counters (`total_hits`, `over_limit`,
//! `near_limit`, `within_limit`, `shadow_mode`); per call, its request count and response time;
//! the configuration's loads; the store's failures and refused requests. A call only adds to
//! atomic counters: no sink ever slows it.

pub mod exporter;
pub mod mapper;
pub mod prometheus;
pub mod statsd;

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use foldhash::HashMap;

use crate::service::decide::Answer;
use crate::tree::Counts;

/// Series per (domain, key) kept at most; beyond, new keys are counted under one overflow key,
/// so `detailed_metric` on values chosen by clients cannot grow memory without bound. Unknown
/// domains (counted as the reference's `domain_not_found`) share the bound.
pub const MAX_SERIES: usize = 10_000;
const OVERFLOW_KEY: &str = "_overflow";

/// Upper bounds of the latency histogram's buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0,
];

/// The names of the reference's counters, in the order of [`Counts`].
const COUNTERS: [&str; 6] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
    "total_negative_hits",
];

/// Every statistics key's counters, by domain then key. A configured limit looks its counters up
/// here once and keeps them (`Memo`); a `detailed_metric` limit looks up per call, by value.
#[derive(Debug, Default)]
struct Series {
    by_domain: HashMap<String, HashMap<String, Arc<Counts>>>,
    /// Calls' descriptors in domains no configuration has, by domain.
    not_found: HashMap<String, Arc<AtomicU64>>,
    len: usize,
}

impl Series {
    fn counts(&mut self, domain: &str, key: &str) -> Arc<Counts> {
        if !self.by_domain.contains_key(domain) {
            self.by_domain.insert(domain.to_owned(), HashMap::default());
        }
        let keys = self.by_domain.get_mut(domain).expect("inserted above");
        let key = if keys.contains_key(key) || self.len < MAX_SERIES {
            key
        } else {
            OVERFLOW_KEY
        };
        if !keys.contains_key(key) {
            self.len += 1;
            keys.insert(key.to_owned(), Arc::default());
        }
        keys[key].clone()
    }

    fn not_found(&mut self, domain: &str) -> Arc<AtomicU64> {
        if let Some(counter) = self.not_found.get(domain) {
            return counter.clone();
        }
        let domain = if self.len < MAX_SERIES {
            domain
        } else {
            OVERFLOW_KEY
        };
        let len = &mut self.len;
        self.not_found
            .entry(domain.to_owned())
            .or_insert_with(|| {
                *len += 1;
                Arc::default()
            })
            .clone()
    }

    /// Every (domain, key) series, sorted.
    fn all(&self) -> Vec<(&str, &str, &Arc<Counts>)> {
        let mut all: Vec<_> = self
            .by_domain
            .iter()
            .flat_map(|(domain, keys)| keys.iter().map(move |(k, c)| (domain.as_str(), &**k, c)))
            .collect();
        all.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        all
    }
}

/// Every count the sinks show.
#[derive(Debug, Default)]
pub struct Stats {
    /// Counts by domain, then by statistics key.
    descriptors: Mutex<Series>,
    /// Decisions per latency bucket, each counted once (in the first bucket that holds it; the
    /// last slot is above every bound): two atomic additions per call, not one per bucket,
    /// on counters every worker thread shares. Made cumulative when rendered.
    latency_buckets: [AtomicU64; BUCKETS.len() + 1],
    latency_sum_micros: AtomicU64,
    /// `ShouldRateLimit` calls received, answered or not.
    requests: AtomicU64,
    /// Each call's time in whole milliseconds, kept for the statsd sink's timer (none without
    /// one).
    response_times: Option<ResponseTimes>,
    /// Each call's time as the mapped Prometheus listener shows it (none without one, or when
    /// its mapping drops the timer).
    observed: Option<exporter::Observations>,
    store_errors: AtomicU64,
    /// Requests answered OK only because of the global shadow mode.
    global_shadow_mode: AtomicU64,
    /// Configurations put in force: the first one and every reload applied.
    config_loads: AtomicU64,
    reloads: AtomicU64,
    reload_failures: AtomicU64,
    invalid_requests: AtomicU64,
    in_flight: AtomicU64,
    /// Connections closed as soon as accepted: the port had its most open.
    connections_refused: AtomicU64,
    /// Connections closed because their request head or HTTP/2 preface did not come in time.
    connections_timed_out: AtomicU64,
    /// gRPC connections whose TLS handshake failed (no or an untrusted client certificate).
    tls_handshake_failures: AtomicU64,
    /// Statsd lines the sink could not send (its buffer full, its server unreachable).
    statsd_dropped: AtomicU64,
}

/// One call in flight, counted while it lives; its time is taken when it ends.
pub(crate) struct Call<'a> {
    stats: &'a Stats,
    started: quanta::Instant,
}

impl Call<'_> {
    /// The time since the call came in.
    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        self.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        if self.stats.response_times.is_none() && self.stats.observed.is_none() {
            // No sink keeps each call's time: the clock is not read again.
            return;
        }
        let elapsed = self.started.elapsed();
        if let Some(times) = &self.stats.response_times {
            if !times.record(elapsed) {
                self.stats.statsd_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(observed) = &self.stats.observed {
            // Whole milliseconds, as the reference times its calls.
            observed.record(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
        }
    }
}

impl Stats {
    /// Statistics that also keep each call's time for a statsd sink (`statsd`), and for the
    /// mapped Prometheus listener in `observed`.
    pub(crate) fn new(statsd: bool, observed: Option<exporter::Observations>) -> Stats {
        Stats {
            response_times: statsd.then(ResponseTimes::default),
            observed,
            ..Stats::default()
        }
    }

    /// The service-wide counters under the reference's statsd names.
    fn totals(&self) -> [(&'static str, &AtomicU64); 6] {
        [
            (
                "ratelimit.service.global_shadow_mode",
                &self.global_shadow_mode,
            ),
            ("ratelimit.service.config_load_success", &self.config_loads),
            ("ratelimit.service.config_load_error", &self.reload_failures),
            (
                "ratelimit.service.call.should_rate_limit.redis_error",
                &self.store_errors,
            ),
            (
                "ratelimit.service.call.should_rate_limit.service_error",
                &self.invalid_requests,
            ),
            (
                "ratelimit_server.ShouldRateLimit.total_requests",
                &self.requests,
            ),
        ]
    }

    /// Counts one answered request.
    pub(crate) fn record(&self, answer: &Answer<'_>) {
        if answer.unknown_domain {
            // As the reference: once per descriptor looked up in a domain it does not have.
            let counter = self.lock().not_found(answer.domain);
            counter.fetch_add(answer.judged.len() as u64, Ordering::Relaxed);
            return;
        }
        for judged in &answer.judged {
            let Some(limit) = judged.limit.as_deref() else {
                continue;
            };
            let detailed;
            // Keyed by the values (`detailed_metric`, `value_to_metric`) or a limit the request
            // brought: looked up per call.
            let per_call = limit.detailed_metric || matches!(judged.stat_key, Cow::Owned(_));
            let counts: &Counts = if per_call {
                detailed = self.series(answer.domain, &judged.stat_key);
                &detailed
            } else {
                limit
                    .memo
                    .counts
                    .get_or_init(|| self.series(answer.domain, &limit.stat_key))
            };
            let add = |counter: usize| counts[counter].fetch_add(judged.cost, Ordering::Relaxed);
            if judged.negative {
                add(5);
                continue;
            }
            add(0);
            if judged.over {
                add(1);
                if limit.shadow {
                    add(4);
                }
            } else {
                add(3);
            }
            if judged.near {
                add(2);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Series> {
        self.descriptors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The counters of `key` in `domain`, created when new.
    fn series(&self, domain: &str, key: &str) -> Arc<Counts> {
        self.lock().counts(domain, key)
    }

    /// Counts one decision's latency.
    pub(crate) fn latency(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let bucket = BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(BUCKETS.len());
        self.latency_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.latency_sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Counts a `ShouldRateLimit` call, in flight until the guard is dropped, when its time is
    /// taken (whatever the answer, as the reference times every call).
    pub(crate) fn call(&self) -> Call<'_> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Call {
            stats: self,
            started: quanta::Instant::now(),
        }
    }

    /// Counts a failed store call.
    pub(crate) fn store_error(&self) {
        self.store_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts the configuration the server started with.
    pub(crate) fn loaded(&self) {
        self.config_loads.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a reload, applied or refused.
    pub(crate) fn reload(&self, applied: bool) {
        if applied {
            self.config_loads.fetch_add(1, Ordering::Relaxed);
            self.reloads.fetch_add(1, Ordering::Relaxed);
        } else {
            self.reload_failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a connection closed because the port had its most open.
    pub(crate) fn connection_refused(&self) {
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection closed for its silence.
    pub(crate) fn connection_timed_out(&self) {
        self.connections_timed_out.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request the global shadow mode let through.
    pub(crate) fn global_shadow_mode(&self) {
        self.global_shadow_mode.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failed TLS handshake.
    pub(crate) fn tls_handshake_failed(&self) {
        self.tls_handshake_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request answered `INVALID_ARGUMENT`.
    pub(crate) fn invalid_request(&self) {
        self.invalid_requests.fetch_add(1, Ordering::Relaxed);
    }
}

/// Calls' times in whole milliseconds (the reference's unit for its `response_time` timer),
/// counted per millisecond until the statsd sink takes them: one atomic addition per call,
/// however many calls come between two flushes.
#[derive(Debug)]
struct ResponseTimes {
    /// Calls that took `i` milliseconds, for `i` below [`EXACT_MS`].
    by_ms: Box<[AtomicU64]>,
    /// The slower ones, each kept (at most [`MAX_SLOW`] between two flushes).
    slow: Mutex<Vec<u64>>,
}

/// Times below this many milliseconds are counted in place.
const EXACT_MS: usize = 2048;
/// Slower calls kept between two flushes at most; beyond, dropped and counted as such.
const MAX_SLOW: usize = 4096;

impl Default for ResponseTimes {
    fn default() -> ResponseTimes {
        ResponseTimes {
            by_ms: (0..EXACT_MS).map(|_| AtomicU64::new(0)).collect(),
            slow: Mutex::new(Vec::new()),
        }
    }
}

impl ResponseTimes {
    /// Keeps one call's time; false when it had to be dropped.
    fn record(&self, elapsed: Duration) -> bool {
        let ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        if let Some(counter) = self.by_ms.get(ms as usize) {
            counter.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let mut slow = self.slow.lock().unwrap_or_else(PoisonError::into_inner);
        let room = slow.len() < MAX_SLOW;
        if room {
            slow.push(ms);
        }
        room
    }

    /// Takes every time recorded so far: `each(milliseconds, calls)`.
    fn take(&self, mut each: impl FnMut(u64, u64)) {
        for (ms, counter) in self.by_ms.iter().enumerate() {
            if counter.load(Ordering::Relaxed) != 0 {
                each(ms as u64, counter.swap(0, Ordering::Relaxed));
            }
        }
        let slow = std::mem::take(&mut *self.slow.lock().unwrap_or_else(PoisonError::into_inner));
        for ms in slow {
            each(ms, 1);
        }
    }
}
