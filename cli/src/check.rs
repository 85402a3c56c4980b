//! `tollgate check`: the configuration as the layer would build it, in plain words.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use tollgate::algorithm::{Algorithm, TokenBucket, WindowStart};
use tollgate::config::Config;
use tollgate::rules::RuleSummary;
use tollgate::{Cost, Key, MemoryStore, MissingKey};
use tollgate_server::tree::LimitKind;

/// Loads `path` as the layer would (every value checked, a Redis store's URL checked but not
/// connected to) and describes its rules. A configuration of `tollgate-server` (a reference
/// service's YAML, a directory of them, or a file with a `domain`) is read as the server reads
/// it, and its domains' descriptors are listed with the rule each one is charged under.
pub fn check(path: &Path) -> Result<String, Box<dyn std::error::Error>> {
    if tollgate_server::load::is_server_config(path) {
        return check_server(path);
    }
    let config = Config::read(path)?;
    let layer = config.layer_with_store(MemoryStore::new())?;
    let mut out = describe_rules(path, layer.limiter(), "");
    describe_exemptions(&mut out, &layer, &config.unlimited_plans());
    Ok(out)
}

fn describe_rules(path: &Path, limiter: &tollgate::Limiter, extra: &str) -> String {
    let mut rules = limiter.rules_in_force();
    // The rules of the limits descriptors bring are tollgate-server's, not the user's.
    rules.retain(|rule| {
        !rule
            .name
            .starts_with(tollgate_server::plan::OVERRIDE_RULE_PREFIX)
    });
    let mut out = format!("{}: OK, {} rule(s){extra}\n", path.display(), rules.len());
    for rule in &rules {
        let mut described = describe(rule);
        if !extra.is_empty() {
            // tollgate-server charges each rule under its descriptors' values, not a request's key.
            described = described.replace(&counted_by(&rule.key), ", per descriptor value");
        }
        let _ = writeln!(out, "- {described}");
    }
    out
}

fn check_server(path: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let loaded = tollgate_server::load::load(path)?;
    if loaded.is_empty() {
        let nothing = tollgate_server::load::nothing_configured(path);
        return Err(format!("{nothing}: tollgate-server would answer every call OK").into());
    }
    let limiter = loaded.limiter_with_store(MemoryStore::new())?;
    let domains = loaded.domains.sorted();
    let mut out = describe_rules(path, &limiter, &format!(", {} domain(s)", domains.len()));
    for (name, domain) in domains {
        let _ = writeln!(out, "domain {name:?}:");
        for limit in domain.limits() {
            let charged = match &limit.kind {
                LimitKind::Rule(rule) => format!("rule {rule:?}"),
                LimitKind::Unlimited => "unlimited".to_owned(),
                LimitKind::Blocked => "always over the limit (0 per unit)".to_owned(),
            };
            let mut notes = String::new();
            if limit.shadow {
                notes.push_str(", shadow mode");
            }
            if limit.quota {
                notes.push_str(", quota mode");
            }
            if !limit.replaces.is_empty() {
                let _ = write!(notes, ", replaces {:?}", limit.replaces);
            }
            let _ = writeln!(out, "  - {}: {charged}{notes}", limit.stat_key);
        }
    }
    Ok(out)
}

/// One rule in a sentence.
pub fn describe(rule: &RuleSummary) -> String {
    let mut text = format!("{:?}: {}", rule.name, algorithm(&rule.algorithm));
    text.push_str(&counted_by(&rule.key));
    if let Some(cost) = cost(&rule.cost) {
        let _ = write!(text, ", {cost}");
    }
    if !rule.methods.is_empty() {
        let methods: Vec<&str> = rule.methods.iter().map(|m| m.as_str()).collect();
        let _ = write!(text, ", for {} requests", methods.join("/"));
    }
    if !rule.paths.is_empty() {
        let _ = write!(text, ", on {}", rule.paths.join(" or "));
    }
    match (&rule.condition, rule.conditional) {
        (Some(condition), _) => {
            let _ = write!(text, ", only for {condition}");
        }
        (None, true) => {
            text.push_str(", only for requests that meet a further condition set in code");
        }
        (None, false) => {}
    }
    // A key every request has (one global key, the peer's address) is never missing: what the
    // rule does without it would never happen.
    if rule.key.can_be_missing() {
        let without = without(&rule.key.describe());
        let _ = match &rule.missing_key {
            MissingKey::Skip => write!(text, "; {without} pass"),
            MissingKey::Fallback(key) => {
                write!(text, "; {without} count per {}", key_words(&key.describe()))
            }
            MissingKey::Reject => write!(text, "; {without} are refused (400 Bad Request)"),
            MissingKey::RejectWith(status) => write!(text, "; {without} are refused ({status})"),
        };
    }
    if let Some(queue) = &rule.queue {
        text.push_str("; over the limit, requests wait their turn (queue) instead of a 429");
        match (queue.max_units, queue.max_wait) {
            (Some(units), Some(wait)) => {
                let _ = write!(
                    text,
                    " (at most {units} units waiting, none longer than {})",
                    duration(wait)
                );
            }
            (Some(units), None) => {
                let _ = write!(text, " (at most {units} units waiting)");
            }
            (None, Some(wait)) => {
                let _ = write!(text, " (none waits longer than {})", duration(wait));
            }
            (None, None) => text.push_str(" (unbounded)"),
        }
    }
    if let Some(count_if) = &rule.count_if {
        let _ = write!(
            text,
            "; only {} keep their charge (the others get it back)",
            responses(&count_if.describe())
        );
    }
    if let Some(settle) = &rule.settle {
        let _ = match settle.describe().split_once(':') {
            Some(("header", name)) => write!(
                text,
                "; the real cost is read from the response's {name} header and the difference \
                 charged or given back"
            ),
            _ => write!(
                text,
                "; the real cost is read from the response by the application and the difference \
                 charged or given back"
            ),
        };
    }
    if let Some(penalty) = &rule.penalty {
        let blocks: Vec<String> = penalty.durations().iter().map(|d| duration(*d)).collect();
        let _ = match blocks.as_slice() {
            [one] => write!(text, "; a key it denies is blocked for {one}"),
            _ => write!(
                text,
                "; a key it denies is blocked for {} (the last repeats; offences forgotten \
                 after {} without one)",
                blocks.join(", then "),
                duration(penalty.forget_after())
            ),
        };
    }
    if rule.shadow {
        text.push_str(" [shadow: recorded, never blocks]");
    }
    text
}

/// The responses a `count_if` keeps charged, in words, from its short description.
fn responses(described: &str) -> String {
    match described.split_once(':') {
        Some(("status", statuses)) => {
            format!("responses with status {}", statuses.replace(',', " or "))
        }
        _ => match described {
            "failures" => "failed responses (HTTP 400 or above, or a gRPC error)".into(),
            "server-errors" => "server errors (HTTP 5xx, or a gRPC server-side error)".into(),
            "successes" => "successful responses (HTTP below 400, or gRPC OK)".into(),
            _ => "responses the application's predicate picks".into(),
        },
    }
}

/// The allow and deny lists in force, and the plans of tiered rules that limit nothing: a line
/// each.
fn describe_exemptions(
    out: &mut String,
    layer: &tollgate::RateLimitLayer,
    unlimited: &[tollgate::config::UnlimitedPlan],
) {
    let limiter = layer.limiter();
    let lists = |list: &tollgate::AccessList| {
        let key = key_words(&list.key().describe());
        let mut what = Vec::new();
        if list.listed_values() > 0 {
            what.push(format!(
                "is one of {} listed value(s)",
                list.listed_values()
            ));
        }
        if !list.listed_networks().is_empty() {
            let networks: Vec<String> = list
                .listed_networks()
                .iter()
                .map(ToString::to_string)
                .collect();
            what.push(format!("is inside {}", networks.join(", ")));
        }
        format!("requests whose {key} {}", what.join(" or "))
    };
    for list in limiter.allow_lists() {
        let _ = writeln!(out, "- allow list: {} are never limited", lists(&list));
    }
    for list in limiter.deny_lists() {
        let _ = writeln!(
            out,
            "- deny list: {} are refused (403 Forbidden)",
            lists(&list)
        );
    }
    for plan in unlimited {
        let _ = writeln!(
            out,
            "- {:?}: unlimited for {}: never limited by this rule",
            plan.rule, plan.condition
        );
    }
}

/// What the rule counts by, as the clause after the algorithm.
fn counted_by(key: &Key) -> String {
    match key.describe().as_str() {
        "global" => ", one count shared by every request (a global key)".into(),
        described => format!(", per {}", key_words(described)),
    }
}

/// A key in words, from its short description (`peer-ip`, `header:x-api-key`,
/// `first-of(header:x-api-key,client-ip)`).
fn key_words(described: &str) -> String {
    if let Some(keys) = described
        .strip_prefix("first-of(")
        .and_then(|rest| rest.strip_suffix(')'))
    {
        let words: Vec<String> = split_top_level(keys).into_iter().map(key_words).collect();
        return words.join(", else ");
    }
    match described.split_once(':') {
        Some(("header", name)) => format!("{name} header value"),
        Some(("cookie", name)) => format!("{name} cookie value"),
        Some(("path-param", name)) => format!("route's {name} path parameter (percent-decoded)"),
        Some(("extension", type_name)) => {
            format!("{type_name} the application puts in the request (an extension)")
        }
        _ => match described {
            "global" => "one global key".into(),
            "peer-ip" => "peer IP address".into(),
            "client-ip" => "client IP address (behind trusted proxies)".into(),
            "bearer" => "bearer token (its SHA-256, never the token)".into(),
            "fn" => "key the application computes".into(),
            other => other.into(),
        },
    }
}

/// The requests without a key, in words.
fn without(described: &str) -> String {
    if described.starts_with("first-of(") {
        return "requests with none of these".into();
    }
    match described.split_once(':') {
        Some(("header", name)) => format!("requests without the {name} header"),
        Some(("cookie", name)) => format!("requests without the {name} cookie"),
        Some(("path-param", name)) => format!("requests whose route has no {name} parameter"),
        Some(("extension", type_name)) => format!("requests without the {type_name} extension"),
        _ => match described {
            "bearer" => "requests without a bearer token".into(),
            "fn" => "requests the application computes no key for".into(),
            _ => "requests without the key".into(),
        },
    }
}

/// The parts of `a,b(c,d),e<f,g>` split at the commas outside brackets.
fn split_top_level(list: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (at, c) in list.char_indices() {
        match c {
            '(' | '<' => depth += 1,
            ')' | '>' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&list[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    parts.push(&list[start..]);
    parts
}

/// What one request costs, when it is not the usual one unit.
fn cost(cost: &Cost) -> Option<String> {
    if let Some(units) = cost.as_fixed() {
        return match units {
            0 => Some("requests cost nothing (they are checked, never charged)".into()),
            1 => None,
            units => Some(format!("each request costs {units} units")),
        };
    }
    if let Some(name) = cost.header_name() {
        return Some(match cost.header_default() {
            Some(units) => format!(
                "each request costs the units its {name} header says ({units} when it has none)"
            ),
            None => format!(
                "each request costs the units its {name} header says (a request without it is \
                 refused with 400 Bad Request)"
            ),
        });
    }
    Some(
        "each request costs the units the application computes for it (a request it computes \
         none for is refused with 400 Bad Request)"
            .into(),
    )
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
        // An algorithm added later is described by its debug form until it has words here.
        other => format!("{other:?}"),
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
