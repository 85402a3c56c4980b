//! What the limiter tells operators: `metrics` counters per rule, a store-latency histogram, and
//! `tracing` events for denials, delays, blocks, store errors and reloads.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `tollgate_allowed_total` | counter | `rule` |
//! | `tollgate_denied_total` | counter | `rule` |
//! | `tollgate_delayed_total` | counter | `rule` |
//! | `tollgate_shadow_denied_total` | counter | `rule` |
//! | `tollgate_blocked_total` | counter | `rule` (keys blocked by a rule's penalty) |
//! | `tollgate_store_errors_total` | counter | `rule` |
//! | `tollgate_store_latency_seconds` | histogram | — (stores that answer asynchronously) |
//! | `tollgate_store_healthy` | gauge | — (1 while a remote store answers, 0 while its circuit breaker is open) |
//! | `tollgate_top_offender_utilisation` | gauge | `rule` (how much of its limit the key the rule denied most has used, 0 to 1; set when the top list is read) |
//!
//! Counters and the histogram are registered when the layer is built (and again when a reload
//! brings new rules), so the application's metrics recorder must be installed before the layer is
//! built. The stage reads decisions and never changes them; the keys denied most are kept in
//! [`offenders`]. What it registers per rule set is a [`Meters`], which the middleware keeps beside
//! the rules it was made for. It never touches responses or the Tower glue.

pub(crate) mod offenders;
pub(crate) mod redact;

use std::fmt;
use std::sync::Arc;

use metrics::{Counter, Gauge, Histogram};

use self::offenders::TopKeys;
use self::redact::Redactor;
use crate::algorithm::{Outcome, Verdict};
use crate::engine::decision::RuleDecision;
use crate::key::KeyValue;
use crate::rules::set::RuleSet;

/// The observe stage's part of one rule set: each rule's counters and top-offender sketch, by
/// rule index, and the store-latency histogram.
pub(crate) struct Meters {
    pub(crate) rules: Box<[RuleMetrics]>,
    pub(crate) store_latency: Histogram,
}

impl Meters {
    /// Registers the metrics of each rule of `rules`, each with a top-offender sketch of
    /// `capacity` keys; a rule that keeps its name from `previous` (the rule set before a
    /// reload, with its meters) keeps its sketch, so its counts go on.
    pub(crate) fn of(
        rules: &RuleSet,
        capacity: usize,
        previous: Option<(&RuleSet, &Meters)>,
    ) -> Self {
        let rules = rules
            .rules
            .iter()
            .map(|rule| {
                let kept = previous.and_then(|(set, meters)| {
                    let (index, _) = set.find(&rule.name)?;
                    Some(meters.rules[index].offenders.clone())
                });
                RuleMetrics::new(
                    &rule.name,
                    kept.unwrap_or_else(|| Arc::new(TopKeys::new(capacity))),
                )
            })
            .collect();
        Meters {
            rules,
            store_latency: store_latency(),
        }
    }
}

/// One rule's counters.
pub(crate) struct RuleMetrics {
    allowed: Counter,
    denied: Counter,
    delayed: Counter,
    shadow_denied: Counter,
    blocked: Counter,
    store_errors: Counter,
    /// The keys the rule denied most; shared with the next rule set when a reload keeps the
    /// rule's name.
    pub(crate) offenders: Arc<TopKeys>,
    pub(crate) utilisation: Gauge,
}

impl RuleMetrics {
    fn new(rule: &str, offenders: Arc<TopKeys>) -> Self {
        describe();
        let rule = rule.to_owned();
        RuleMetrics {
            allowed: metrics::counter!("tollgate_allowed_total", "rule" => rule.clone()),
            denied: metrics::counter!("tollgate_denied_total", "rule" => rule.clone()),
            delayed: metrics::counter!("tollgate_delayed_total", "rule" => rule.clone()),
            shadow_denied: metrics::counter!("tollgate_shadow_denied_total", "rule" => rule.clone()),
            blocked: metrics::counter!("tollgate_blocked_total", "rule" => rule.clone()),
            store_errors: metrics::counter!("tollgate_store_errors_total", "rule" => rule.clone()),
            offenders,
            utilisation: metrics::gauge!("tollgate_top_offender_utilisation", "rule" => rule),
        }
    }

    /// Counts an enforced rule's answer for `key`.
    #[inline]
    pub(crate) fn record(&self, outcome: &Outcome, key: &KeyValue) {
        if outcome.offence {
            self.blocked.increment(1);
        }
        match outcome.verdict {
            Verdict::Allowed => self.allowed.increment(1),
            Verdict::Reserved { .. } => {
                self.allowed.increment(1);
                self.delayed.increment(1);
            }
            Verdict::Denied { .. } => {
                self.denied.increment(1);
                self.offenders.record(key);
            }
        }
    }

    /// Counts a shadow rule's answer: a denial is recorded, never enforced.
    pub(crate) fn record_shadow(&self, verdict: Verdict, key: &KeyValue) {
        if let Verdict::Denied { .. } = verdict {
            self.shadow_denied.increment(1);
            self.offenders.record(key);
        }
    }

    pub(crate) fn store_error(&self) {
        self.store_errors.increment(1);
    }
}

fn describe() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        metrics::describe_counter!(
            "tollgate_allowed_total",
            "Requests a rule let through (now or after a queue wait)."
        );
        metrics::describe_counter!("tollgate_denied_total", "Requests a rule refused.");
        metrics::describe_counter!(
            "tollgate_delayed_total",
            "Requests a rule held in its queue before letting them through."
        );
        metrics::describe_counter!(
            "tollgate_shadow_denied_total",
            "Requests a shadow rule would have refused."
        );
        metrics::describe_counter!(
            "tollgate_blocked_total",
            "Keys a rule blocked under its penalty (one per block, not per denied request)."
        );
        metrics::describe_counter!(
            "tollgate_store_errors_total",
            "Store failures while deciding a rule."
        );
        metrics::describe_gauge!(
            "tollgate_top_offender_utilisation",
            "How much of its limit the key a rule denied most has used (0 to 1), read from the \
             store when the rule's top offenders are read."
        );
        metrics::describe_histogram!(
            "tollgate_store_latency_seconds",
            metrics::Unit::Seconds,
            "Time a networked store took to decide a request."
        );
    });
}

/// The store-latency histogram, registered with the rules like the counters.
fn store_latency() -> Histogram {
    describe();
    metrics::histogram!("tollgate_store_latency_seconds")
}

/// A key as it appears in logs: the key itself, or with redaction a keyed hash that still lets
/// an operator correlate events of one key (see [`redact`]).
pub(crate) struct LoggedKey<'a> {
    key: &'a KeyValue,
    redact: Option<&'a Redactor>,
}

impl<'a> LoggedKey<'a> {
    pub(crate) fn new(key: &'a KeyValue, redact: Option<&'a Redactor>) -> Self {
        LoggedKey { key, redact }
    }
}

impl fmt::Display for LoggedKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.redact {
            Some(redactor) => redactor.redact(self.key.as_bytes()).fmt(f),
            None => self.key.fmt(f),
        }
    }
}

/// Emits the event for one rule's answer to a request.
/// (`grpc_method` is logged for gRPC requests only: a `None` field is left out.)
/// An allowed request logs nothing: told apart here, inlined, so it costs no call.
#[inline]
pub(crate) fn event(
    entry: &RuleDecision,
    grpc_method: Option<&str>,
    shadow: bool,
    redact: Option<&Redactor>,
) {
    if let Verdict::Allowed = entry.outcome.verdict {
        return;
    }
    logged_event(entry, grpc_method, shadow, redact);
}

fn logged_event(
    entry: &RuleDecision,
    grpc_method: Option<&str>,
    shadow: bool,
    redact: Option<&Redactor>,
) {
    let key = LoggedKey::new(&entry.key, redact);
    match entry.outcome.verdict {
        Verdict::Denied { retry_after } if shadow => tracing::info!(
            rule = %entry.rule, key = %key, retry_after_ms = retry_after.as_millis() as u64,
            grpc_method, "rate limit: shadow rule would deny"
        ),
        Verdict::Denied { retry_after } if entry.outcome.offence => tracing::info!(
            rule = %entry.rule, key = %key, blocked_ms = retry_after.as_millis() as u64,
            "rate limit: key blocked"
        ),
        Verdict::Denied { retry_after } => tracing::debug!(
            rule = %entry.rule, key = %key, retry_after_ms = retry_after.as_millis() as u64,
            grpc_method, "rate limit: denied"
        ),
        Verdict::Reserved { wait } => tracing::debug!(
            rule = %entry.rule, key = %key, wait_ms = wait.as_millis() as u64,
            grpc_method, "rate limit: delayed in queue"
        ),
        Verdict::Allowed => {}
    }
}
