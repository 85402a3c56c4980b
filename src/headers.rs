//! The `RateLimit`, `RateLimit-Policy`, `Retry-After` and legacy `X-RateLimit-*` fields.
//!
//! Values follow draft-ietf-httpapi-ratelimit-headers-11: both fields are Structured Field lists
//! (RFC 9651) with one item per rule, the rule's name as an sf-string.
//! `RateLimit-Policy: "per-ip";q=60;w=60` names each quota (`q` units per `w` seconds);
//! `RateLimit: "per-ip";r=0;t=7` says what is left (`r`) and in how many seconds the quota grows
//! (`t`). A rule's policy item never changes, so it is serialized once, when the layer is built;
//! per request only the two integers of each `RateLimit` item are written.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::HeaderMap;

use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::ConfigError;

/// `RateLimit-Policy`.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// Legacy `X-RateLimit-Limit`.
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// Legacy `X-RateLimit-Remaining`.
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// Legacy `X-RateLimit-Reset` (Unix seconds).
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// `Tollgate-Delay`: how long a queued request waited before reaching the service, in seconds
/// with millisecond precision (a Structured Field decimal, e.g. `1.5`).
pub static TOLLGATE_DELAY: HeaderName = HeaderName::from_static("tollgate-delay");

/// Structured Field integers have at most 15 digits.
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// A rule's pre-serialized pieces.
#[derive(Clone, Debug)]
pub(crate) struct PolicyItem {
    /// The rule name as an sf-string, e.g. `"per-ip"`.
    pub(crate) name: String,
    /// The whole `RateLimit-Policy` item, e.g. `"per-ip";q=60;w=60`.
    pub(crate) policy: String,
    /// The rule name as the inside of a JSON string (escaped), for problem+json bodies.
    pub(crate) json_name: String,
}

impl PolicyItem {
    pub(crate) fn new(rule: &str, algorithm: &Algorithm) -> Result<Self, ConfigError> {
        let name = sfv::StringRef::from_str(rule).map_err(|e| {
            ConfigError::new(
                rule,
                "name",
                format!("is not a valid Structured Field string: {e}"),
            )
        })?;
        let q = sf_integer(algorithm.capacity());
        let w = sf_integer(whole_seconds(algorithm.window()));
        let policy = sfv::ItemSerializer::new()
            .bare_item(name)
            .parameter(Q, q)
            .parameter(W, w)
            .finish();
        let name = sfv::ItemSerializer::new().bare_item(name).finish();
        let quoted = serde_json::Value::from(rule).to_string();
        let json_name = quoted[1..quoted.len() - 1].to_owned();
        Ok(PolicyItem {
            name,
            policy,
            json_name,
        })
    }
}

// Checked at compile time.
const Q: &sfv::KeyRef = sfv::key_ref("q");
const W: &sfv::KeyRef = sfv::key_ref("w");

fn sf_integer(value: u64) -> sfv::Integer {
    sfv::integer(value.min(SF_INTEGER_MAX) as i64)
}

/// Whole seconds, rounded up: a client waiting this long is never early.
pub(crate) fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Joins items into one field value.
pub(crate) fn join<'a>(items: impl IntoIterator<Item = &'a str>) -> Option<HeaderValue> {
    let mut value = String::new();
    for item in items {
        if !value.is_empty() {
            value.push_str(", ");
        }
        value.push_str(item);
    }
    HeaderValue::from_str(&value).ok()
}

/// The `RateLimit` value for a decision.
pub(crate) fn ratelimit_value(items: &[PolicyItem], decision: &Decision) -> Option<HeaderValue> {
    let mut value = Vec::with_capacity(40 * decision.rules().len());
    let mut numbers = itoa::Buffer::new();
    for (i, entry) in decision.rules().iter().enumerate() {
        if i > 0 {
            value.extend_from_slice(b", ");
        }
        value.extend_from_slice(items.get(entry.index)?.name.as_bytes());
        value.extend_from_slice(b";r=");
        value.extend_from_slice(
            numbers
                .format(entry.outcome.remaining.min(SF_INTEGER_MAX))
                .as_bytes(),
        );
        value.extend_from_slice(b";t=");
        let t = whole_seconds(entry.outcome.reset).min(SF_INTEGER_MAX);
        value.extend_from_slice(numbers.format(t).as_bytes());
    }
    HeaderValue::from_maybe_shared(bytes::Bytes::from(value)).ok()
}

/// `Retry-After` in whole seconds, rounded up, never 0.
pub(crate) fn retry_after_value(wait: Duration) -> HeaderValue {
    HeaderValue::from(whole_seconds(wait).max(1))
}

/// Adds `Retry-After` to `headers`.
pub(crate) fn insert_retry_after(headers: &mut HeaderMap, wait: Duration) {
    headers.insert(RETRY_AFTER, retry_after_value(wait));
}

/// Adds `Tollgate-Delay` for a request that waited in the queue.
pub(crate) fn insert_delay(headers: &mut HeaderMap, wait: Duration) {
    let millis = wait.as_millis().max(1);
    let value = format!("{}.{:03}", millis / 1000, millis % 1000);
    let value = value.trim_end_matches('0').trim_end_matches('.');
    if let Ok(value) = HeaderValue::from_str(value) {
        headers.insert(TOLLGATE_DELAY.clone(), value);
    }
}

/// Adds the legacy `X-RateLimit-*` fields for the most restrictive rule of the decision.
pub(crate) fn insert_legacy(headers: &mut HeaderMap, decision: &Decision) {
    let Some(entry) = decision.most_restrictive() else {
        return;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let reset_at = whole_seconds(now + entry.outcome.reset);
    headers.insert(
        X_RATELIMIT_LIMIT.clone(),
        HeaderValue::from(entry.outcome.limit),
    );
    headers.insert(
        X_RATELIMIT_REMAINING.clone(),
        HeaderValue::from(entry.outcome.remaining),
    );
    headers.insert(X_RATELIMIT_RESET.clone(), HeaderValue::from(reset_at));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{FixedWindow, TokenBucket};

    #[test]
    fn policy_items_are_structured_fields() {
        let bucket = Algorithm::TokenBucket(TokenBucket::new(60, Duration::from_secs(60)));
        let item = PolicyItem::new("per-ip", &bucket).unwrap();
        assert_eq!(item.name, "\"per-ip\"");
        assert_eq!(item.policy, "\"per-ip\";q=60;w=60");
        let window = Algorithm::FixedWindow(FixedWindow::new(1000, Duration::from_millis(1500)));
        let quoted = PolicyItem::new("say \"hi\"", &window).unwrap();
        assert_eq!(quoted.policy, r#""say \"hi\"";q=1000;w=2"#);
        let parsed: sfv::List = sfv::Parser::new(&quoted.policy).parse().unwrap();
        assert_eq!(parsed.len(), 1);
    }

    #[test]
    fn names_that_cannot_be_sent_are_config_errors() {
        let bucket = Algorithm::TokenBucket(TokenBucket::new(1, Duration::from_secs(1)));
        let err = PolicyItem::new("tab\there", &bucket).unwrap_err();
        assert_eq!(err.field(), "name");
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        assert_eq!(retry_after_value(Duration::ZERO), "1");
        assert_eq!(retry_after_value(Duration::from_nanos(1)), "1");
        assert_eq!(retry_after_value(Duration::from_secs(1)), "1");
        assert_eq!(retry_after_value(Duration::from_millis(1001)), "2");
        assert_eq!(retry_after_value(Duration::from_secs(7)), "7");
    }
}
