//! The server's statistics, in Prometheus' text format on `/metrics`.
//!
//! Per domain and descriptor, the reference service's counters under its names (`total_hits`,
//! `over_limit`, `near_limit`, `within_limit`, `shadow_mode`, `total_negative_hits`, as its statsd exporter maps them:
//! `ratelimit_service_rate_limit_<name>{domain, key}`), so dashboards carry over; the decision
//! latency as a histogram; the store's failures and the configuration's reloads. Written by hand:
//! a few counters need no exporter.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use foldhash::HashMap;

use super::decide::Answer;
use crate::tree::Counts;

/// Series per (domain, key) kept at most; beyond, new keys are counted under one overflow key,
/// so `detailed_metric` on values chosen by clients cannot grow memory without bound.
pub const MAX_SERIES: usize = 10_000;
const OVERFLOW_KEY: &str = "_overflow";

/// Upper bounds of the latency histogram's buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0,
];

/// Every statistics key's counters, by domain then key. A configured limit looks its counters up
/// here once and keeps them (`Memo`); a `detailed_metric` limit looks up per call, by value.
#[derive(Debug, Default)]
struct Series {
    by_domain: HashMap<String, HashMap<String, Arc<Counts>>>,
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
}

/// The names of the reference's counters, in the order of [`Counts`].
const COUNTERS: [&str; 6] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
    "total_negative_hits",
];

/// Everything `/metrics` shows.
#[derive(Debug, Default)]
pub struct Stats {
    /// Counts by domain, then by statistics key.
    descriptors: Mutex<Series>,
    /// Decisions per latency bucket, each counted once (in the first bucket that holds it; the
    /// last slot is above every bound): two atomic additions per call, not one per bucket,
    /// on counters every worker thread shares. Made cumulative when rendered.
    latency_buckets: [AtomicU64; BUCKETS.len() + 1],
    latency_sum_micros: AtomicU64,
    store_errors: AtomicU64,
    /// Requests answered OK only because of the global shadow mode.
    global_shadow_mode: AtomicU64,
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
}

/// One call in flight, counted while it lives.
pub(crate) struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Stats {
    /// Counts one answered request.
    pub(crate) fn record(&self, answer: &Answer<'_>) {
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

    /// The counters of `key` in `domain`, created when new.
    fn series(&self, domain: &str, key: &str) -> Arc<Counts> {
        self.descriptors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .counts(domain, key)
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

    /// Counts a call in flight until the guard is dropped.
    pub(crate) fn in_flight(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(&self.in_flight)
    }

    /// Counts a request the global shadow mode let through.
    pub(crate) fn global_shadow_mode(&self) {
        self.global_shadow_mode.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failed store call.
    pub(crate) fn store_error(&self) {
        self.store_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a reload, applied or refused.
    pub(crate) fn reload(&self, applied: bool) {
        let counter = if applied {
            &self.reloads
        } else {
            &self.reload_failures
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection closed because the port had its most open.
    pub(crate) fn connection_refused(&self) {
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection closed for its silence.
    pub(crate) fn connection_timed_out(&self) {
        self.connections_timed_out.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failed TLS handshake.
    pub(crate) fn tls_handshake_failed(&self) {
        self.tls_handshake_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request answered `INVALID_ARGUMENT`.
    pub(crate) fn invalid_request(&self) {
        self.invalid_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Everything, in Prometheus' text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        {
            let series = self
                .descriptors
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut all: Vec<(&str, &str, &Arc<Counts>)> = series
                .by_domain
                .iter()
                .flat_map(|(domain, keys)| {
                    keys.iter().map(move |(k, c)| (domain.as_str(), &**k, c))
                })
                .collect();
            all.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
            for (i, name) in COUNTERS.iter().enumerate() {
                let metric = format!("ratelimit_service_rate_limit_{name}");
                let _ = writeln!(out, "# TYPE {metric} counter");
                for (domain, key, counts) in &all {
                    let value = counts[i].load(Ordering::Relaxed);
                    let (domain, descriptor) = (label(domain), label(key));
                    let _ = writeln!(
                        out,
                        "{metric}{{domain=\"{domain}\",key=\"{descriptor}\"}} {value}"
                    );
                }
            }
        }
        let histogram = "tollgate_server_decision_seconds";
        let _ = writeln!(out, "# TYPE {histogram} histogram");
        let mut count = 0;
        for (bound, in_bucket) in BUCKETS.iter().zip(&self.latency_buckets) {
            count += in_bucket.load(Ordering::Relaxed);
            let _ = writeln!(out, "{histogram}_bucket{{le=\"{bound}\"}} {count}");
        }
        count += self.latency_buckets[BUCKETS.len()].load(Ordering::Relaxed);
        let sum = self.latency_sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{histogram}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{histogram}_sum {sum}");
        let _ = writeln!(out, "{histogram}_count {count}");
        let gauge = "tollgate_server_calls_in_flight";
        let _ = writeln!(out, "# TYPE {gauge} gauge");
        let _ = writeln!(out, "{gauge} {}", self.in_flight.load(Ordering::Relaxed));
        for (name, value) in [
            // The reference's name (`ratelimit.service.global_shadow_mode`).
            (
                "ratelimit_service_global_shadow_mode",
                &self.global_shadow_mode,
            ),
            ("tollgate_server_store_errors_total", &self.store_errors),
            ("tollgate_server_config_reloads_total", &self.reloads),
            (
                "tollgate_server_config_reload_failures_total",
                &self.reload_failures,
            ),
            (
                "tollgate_server_invalid_requests_total",
                &self.invalid_requests,
            ),
            (
                "tollgate_server_connections_refused_total",
                &self.connections_refused,
            ),
            (
                "tollgate_server_connections_timed_out_total",
                &self.connections_timed_out,
            ),
            (
                "tollgate_server_tls_handshake_failures_total",
                &self.tls_handshake_failures,
            ),
        ] {
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
        }
        out
    }
}

/// A label value, escaped as the text format requires.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
