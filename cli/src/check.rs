//! `tollgate check`: the configuration as the layer would build it, in plain words.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use tollgate::algorithm::{Algorithm, TokenBucket, WindowStart};
use tollgate::config::ConfigFileError;
use tollgate::{MemoryStore, MissingKey, RateLimitLayer, RuleSummary};

/// Loads `path` as the layer would (every value checked, a Redis store's URL checked but not
/// connected to) and describes its rules.
pub fn check(path: &Path) -> Result<String, ConfigFileError> {
    let layer = RateLimitLayer::from_config_file_with_store(path, MemoryStore::new())?;
    let rules = layer.limiter().rules_in_force();
    let mut out = format!("{}: OK, {} rule(s)\n", path.display(), rules.len());
    for rule in &rules {
        let _ = writeln!(out, "- {}", describe(rule));
    }
    Ok(out)
}

/// One rule in a sentence.
pub fn describe(rule: &RuleSummary) -> String {
    let mut text = format!("{:?}: {}", rule.name, algorithm(&rule.algorithm));
    let _ = write!(text, ", per {}", key(&rule.key.describe()));
    match rule.cost.as_fixed() {
        Some(1) => {}
        Some(units) => {
            let _ = write!(text, ", each request costs {units}");
        }
        None => {
            let _ = write!(text, ", each request costs {:?}", rule.cost);
        }
    }
    if !rule.methods.is_empty() {
        let methods: Vec<&str> = rule.methods.iter().map(|m| m.as_str()).collect();
        let _ = write!(text, ", for {} requests", methods.join("/"));
    }
    if !rule.paths.is_empty() {
        let _ = write!(text, ", on {}", rule.paths.join(" or "));
    }
    if rule.conditional {
        text.push_str(", only for requests that meet a further condition (such as a tier's plan)");
    }
    text.push_str(match &rule.missing_key {
        MissingKey::Skip => "; requests without the key pass",
        MissingKey::Fallback(_) => "; requests without the key count by a fallback key",
        MissingKey::RejectWith(_) | MissingKey::Reject => "; requests without the key are refused",
    });
    if rule.queued {
        text.push_str("; over the limit, requests wait their turn (queue) instead of a 429");
    }
    if rule.shadow {
        text.push_str(" [shadow: recorded, never blocks]");
    }
    text
}

fn key(described: &str) -> String {
    match described {
        "global" => "everyone together (one global key)".into(),
        "peer-ip" => "peer IP address".into(),
        "client-ip" => "client IP (behind trusted proxies)".into(),
        other => other.into(),
    }
}

fn algorithm(algorithm: &Algorithm) -> String {
    match algorithm {
        Algorithm::TokenBucket(tb) => bucket(tb),
        Algorithm::FixedWindow(w) => {
            let mut text = format!("fixed window, {} per {}", w.limit(), duration(w.period()));
            if w.capacity() > w.limit() {
                let _ = write!(text, " (unused units roll over, up to {})", w.capacity());
            }
            text + start(w.start())
        }
        Algorithm::SlidingWindow(w) => {
            format!(
                "sliding window, {} per {} (weighted by the previous window)",
                w.limit(),
                duration(w.period())
            ) + start(w.start())
        }
        Algorithm::SlidingLog(w) => {
            format!("sliding log, {} in any {}", w.limit(), duration(w.period()))
        }
        Algorithm::BurstPool(p) => format!(
            "{}, then a shared pool: {}",
            bucket(p.steady()),
            bucket(p.pool())
        ),
        Algorithm::Concurrency(c) => format!(
            "at most {} in flight at once (a slot is held until the response ends)",
            c.max()
        ),
    }
}

fn bucket(tb: &TokenBucket) -> String {
    let mut text = format!(
        "token bucket, {} per {}, bursts up to {}",
        tb.rate(),
        duration(tb.period()),
        tb.capacity()
    );
    if tb.initial() != tb.capacity() {
        let _ = write!(text, " (starting with {})", tb.initial());
    }
    text
}

fn start(start: WindowStart) -> &'static str {
    match start {
        WindowStart::PerKey => "",
        WindowStart::Aligned(_) => ", windows aligned to the clock",
    }
}

/// `1s`, `1m`, `1h30m`, `250ms`.
pub fn duration(d: Duration) -> String {
    let micros = d.as_micros();
    if micros % 1_000_000 != 0 {
        return if micros % 1000 == 0 {
            format!("{}ms", micros / 1000)
        } else {
            format!("{micros}µs")
        };
    }
    let mut seconds = d.as_secs();
    let mut text = String::new();
    for (unit, name) in [(86_400, "d"), (3600, "h"), (60, "m"), (1, "s")] {
        if seconds >= unit {
            let _ = write!(text, "{}{name}", seconds / unit);
            seconds %= unit;
        }
    }
    if text.is_empty() {
        text.push_str("0s");
    }
    text
}
