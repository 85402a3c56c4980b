//! The statistics in Prometheus' text format, as `/metrics` serves them.
//!
//! The reference's per-descriptor counters under the names its statsd exporter maps them to
//! (`ratelimit_service_rate_limit_<name>{domain, key}`), so dashboards carry over; the decision
//! latency as a histogram; the store's failures, the configuration's reloads and the
//! connections refused. Written by hand: a few counters need no exporter.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use super::{Stats, BUCKETS, COUNTERS};

/// Everything, in Prometheus' text format.
pub fn render(stats: &Stats) -> String {
    let mut out = String::new();
    {
        let series = stats.lock();
        let all = series.all();
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
    for (bound, in_bucket) in BUCKETS.iter().zip(&stats.latency_buckets) {
        count += in_bucket.load(Ordering::Relaxed);
        let _ = writeln!(out, "{histogram}_bucket{{le=\"{bound}\"}} {count}");
    }
    count += stats.latency_buckets[BUCKETS.len()].load(Ordering::Relaxed);
    let sum = stats.latency_sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
    let _ = writeln!(out, "{histogram}_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{histogram}_sum {sum}");
    let _ = writeln!(out, "{histogram}_count {count}");
    let gauge = "tollgate_server_calls_in_flight";
    let _ = writeln!(out, "# TYPE {gauge} gauge");
    let _ = writeln!(out, "{gauge} {}", stats.in_flight.load(Ordering::Relaxed));
    for (name, value) in [
        // The reference's name (`ratelimit.service.global_shadow_mode`).
        (
            "ratelimit_service_global_shadow_mode",
            &stats.global_shadow_mode,
        ),
        ("tollgate_server_store_errors_total", &stats.store_errors),
        ("tollgate_server_config_reloads_total", &stats.reloads),
        (
            "tollgate_server_config_reload_failures_total",
            &stats.reload_failures,
        ),
        (
            "tollgate_server_invalid_requests_total",
            &stats.invalid_requests,
        ),
        (
            "tollgate_server_connections_refused_total",
            &stats.connections_refused,
        ),
        (
            "tollgate_server_connections_timed_out_total",
            &stats.connections_timed_out,
        ),
        (
            "tollgate_server_tls_handshake_failures_total",
            &stats.tls_handshake_failures,
        ),
        (
            "tollgate_server_statsd_lines_dropped_total",
            &stats.statsd_dropped,
        ),
    ] {
        let _ = writeln!(out, "# TYPE {name} counter");
        let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
    }
    out
}

/// A label value, escaped as the text format requires.
pub(super) fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
