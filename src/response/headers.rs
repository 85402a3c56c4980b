//! The `RateLimit`, `RateLimit-Policy`, `Retry-After` and legacy `X-RateLimit-*` fields.
//!
//! Values follow draft-ietf-httpapi-ratelimit-headers-11: both fields are Structured Field lists
//! (RFC 9651) with one item per rule, the rule's name as an sf-string.
//! `RateLimit-Policy: "per-ip";q=60;w=60` names each quota (`q` units per `w` seconds);
//! `RateLimit: "per-ip";r=0;t=7` says what is left (`r`) and in how many seconds the quota grows
//! (`t`). A concurrency limit is a quota in the draft's `concurrent-requests` unit, with no window
//! and no time until it grows (a slot comes back when a response ends, not at a time):
//! `RateLimit-Policy: "llm";q=8;qu="concurrent-requests"` and `RateLimit: "llm";r=3`. A rule's
//! policy item never changes, so it is serialized once, when the layer is built; per request only
//! the integers of each `RateLimit` item are written.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::HeaderMap;

use crate::algorithm::{Algorithm, Outcome};
use crate::engine::decision::{Decision, RuleDecision};

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
    /// The start of the rule's `RateLimit` item up to its first number, e.g. `"per-ip";r=`.
    pub(crate) ratelimit_head: Box<[u8]>,
    /// The whole `RateLimit-Policy` item, e.g. `"per-ip";q=60;w=60`.
    pub(crate) policy: String,
    /// The rule name as the inside of a JSON string (escaped), for problem+json bodies.
    pub(crate) json_name: String,
    /// Whether the rule is a quota over time, with a window (`w`) and a time until it grows
    /// (`t`); a concurrency limit has neither.
    pub(crate) windowed: bool,
}

impl PolicyItem {
    /// `rule` is a validated rule's name: non-empty printable ASCII (`Rule::validate`), which is
    /// always a Structured Field string.
    pub(crate) fn new(rule: &str, algorithm: &Algorithm) -> Self {
        let name = sfv::StringRef::from_str(rule)
            .expect("a rule name is printable ASCII, checked when the rule is built");
        let windowed = !algorithm.is_concurrency();
        let q = sf_integer(algorithm.capacity());
        let policy = sfv::ItemSerializer::new().bare_item(name).parameter(Q, q);
        let policy = if windowed {
            policy.parameter(W, sf_integer(whole_seconds(algorithm.window())))
        } else {
            policy.parameter(QU, CONCURRENT_REQUESTS)
        }
        .finish();
        let name = sfv::ItemSerializer::new().bare_item(name).finish();
        let ratelimit_head = format!("{name};r=").into_bytes().into_boxed_slice();
        let quoted = serde_json::Value::from(rule).to_string();
        let json_name = quoted[1..quoted.len() - 1].to_owned();
        PolicyItem {
            name,
            ratelimit_head,
            policy,
            json_name,
            windowed,
        }
    }
}

// Checked at compile time.
const Q: &sfv::KeyRef = sfv::key_ref("q");
const W: &sfv::KeyRef = sfv::key_ref("w");
const QU: &sfv::KeyRef = sfv::key_ref("qu");
/// The draft's quota unit for requests in flight at once.
const CONCURRENT_REQUESTS: &sfv::StringRef = sfv::string_ref("concurrent-requests");

fn sf_integer(value: u64) -> sfv::Integer {
    sfv::integer(value.min(SF_INTEGER_MAX) as i64)
}

/// Whole seconds, rounded up: a client waiting this long is never early.
pub(crate) fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Joins items into one field value; none when there are no items.
pub(crate) fn join<'a>(items: impl IntoIterator<Item = &'a str>) -> Option<HeaderValue> {
    let mut value = String::new();
    for item in items {
        if !value.is_empty() {
            value.push_str(", ");
        }
        value.push_str(item);
    }
    if value.is_empty() {
        return None;
    }
    HeaderValue::from_str(&value).ok()
}

/// The `RateLimit` value for a decision.
pub(crate) fn ratelimit_value(items: &[PolicyItem], decision: &Decision) -> Option<HeaderValue> {
    match decision.rules() {
        [entry] => one_item(items.get(entry.index)?, &entry.outcome),
        all => items_value(items, all),
    }
}

/// The `RateLimit` value of any number of rules: their items joined.
fn items_value(items: &[PolicyItem], all: &[RuleDecision]) -> Option<HeaderValue> {
    if all.is_empty() {
        return None;
    }
    // The exact length first: a buffer of exactly its length becomes the value's `Bytes` without
    // a second allocation.
    let mut len = 2 * (all.len() - 1);
    for entry in all {
        let item = items.get(entry.index)?;
        let (r, t) = reported(&entry.outcome);
        len += item.name.len() + 3 + digits(r);
        if item.windowed {
            len += 3 + digits(t);
        }
    }
    let mut value = Vec::with_capacity(len);
    let mut buffer = itoa::Buffer::new();
    for (i, entry) in all.iter().enumerate() {
        if i > 0 {
            value.extend_from_slice(b", ");
        }
        let item = items.get(entry.index)?;
        let (r, t) = reported(&entry.outcome);
        value.extend_from_slice(item.name.as_bytes());
        value.extend_from_slice(b";r=");
        value.extend_from_slice(buffer.format(r).as_bytes());
        if item.windowed {
            value.extend_from_slice(b";t=");
            value.extend_from_slice(buffer.format(t).as_bytes());
        }
    }
    field_value(value)
}

/// The `RateLimit` value of a decision with one rule (most of them): the rule's prepared head,
/// then its numbers, in a buffer of exactly its length (its `Bytes` then take it without a
/// second allocation). The same bytes as [`items_value`] (tested), written in one pass:
/// measured, about 170 instructions fewer per response.
fn one_item(item: &PolicyItem, outcome: &Outcome) -> Option<HeaderValue> {
    let (r, t) = reported(outcome);
    let (mut r_digits, mut t_digits) = (itoa::Buffer::new(), itoa::Buffer::new());
    let r = r_digits.format(r).as_bytes();
    if !item.windowed {
        let mut value = Vec::with_capacity(item.ratelimit_head.len() + r.len());
        value.extend_from_slice(&item.ratelimit_head);
        value.extend_from_slice(r);
        return field_value(value);
    }
    let t = t_digits.format(t).as_bytes();
    let mut value = Vec::with_capacity(item.ratelimit_head.len() + r.len() + 3 + t.len());
    value.extend_from_slice(&item.ratelimit_head);
    value.extend_from_slice(r);
    value.extend_from_slice(b";t=");
    value.extend_from_slice(t);
    field_value(value)
}

/// A `RateLimit` value the layer wrote: sf-strings (visible ASCII), digits and separators.
fn field_value(value: Vec<u8>) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(value)).ok()
}

/// The `r` (units left) and `t` (whole seconds until the quota grows) a rule's `RateLimit` item
/// reports.
pub(crate) fn reported(outcome: &Outcome) -> (u64, u64) {
    (
        outcome.remaining.min(SF_INTEGER_MAX),
        whole_seconds(outcome.next_unit_in).min(SF_INTEGER_MAX),
    )
}

/// The number of decimal digits of `n`.
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |log| log as usize + 1)
}

/// `Retry-After` in whole seconds, rounded up, never 0.
pub(crate) fn retry_after_value(wait: Duration) -> HeaderValue {
    seconds_value(whole_seconds(wait).max(1))
}

/// `n` as a field value. Waits under a hundred seconds — most of them — point into a static table
/// instead of allocating: a flood of 429s is the moment every refusal should be cheap.
fn seconds_value(n: u64) -> HeaderValue {
    match TWO_DIGITS.get(n as usize) {
        Some(digits) => {
            let digits: &'static [u8] = if n < 10 { &digits[1..] } else { digits };
            HeaderValue::from_maybe_shared(bytes::Bytes::from_static(digits))
                .unwrap_or_else(|_| HeaderValue::from(n))
        }
        None => HeaderValue::from(n),
    }
}

/// `00` to `99`.
static TWO_DIGITS: [[u8; 2]; 100] = {
    let mut table = [[0u8; 2]; 100];
    let mut n = 0;
    while n < 100 {
        table[n] = [b'0' + (n / 10) as u8, b'0' + (n % 10) as u8];
        n += 1;
    }
    table
};

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

/// The legacy `X-RateLimit-*` figures of a decision's most restrictive rule: three numbers, so an
/// allowed response carries them to the inner service's response without a copy of the decision.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Legacy {
    limit: u64,
    remaining: u64,
    reset: Duration,
}

impl Legacy {
    /// The figures of the rule that binds hardest among the quotas over time (a concurrency
    /// limit has no reset to report).
    pub(crate) fn of(items: &[PolicyItem], decision: &Decision) -> Option<Legacy> {
        let windowed = |entry: &&RuleDecision| items.get(entry.index).is_some_and(|i| i.windowed);
        let entries = || decision.rules().iter().filter(windowed);
        let denied = entries().filter_map(|entry| entry.outcome.retry_after().map(|w| (w, entry)));
        denied
            .max_by_key(|(wait, _)| *wait)
            .map(|(_, entry)| entry)
            .or_else(|| entries().min_by_key(|entry| entry.outcome.remaining))
            .map(|entry| Legacy {
                limit: entry.outcome.limit,
                remaining: entry.outcome.remaining,
                reset: entry.outcome.next_unit_in,
            })
    }

    /// Adds the fields; the reset moment is reckoned from the wall clock when they are written.
    pub(crate) fn insert(self, headers: &mut HeaderMap) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        let reset_at = whole_seconds(now + self.reset);
        headers.insert(X_RATELIMIT_LIMIT.clone(), HeaderValue::from(self.limit));
        headers.insert(
            X_RATELIMIT_REMAINING.clone(),
            HeaderValue::from(self.remaining),
        );
        headers.insert(X_RATELIMIT_RESET.clone(), HeaderValue::from(reset_at));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{FixedWindow, TokenBucket};

    #[test]
    fn policy_items_are_structured_fields() {
        let bucket = Algorithm::TokenBucket(TokenBucket::new(60, Duration::from_secs(60)));
        let item = PolicyItem::new("per-ip", &bucket);
        assert_eq!(item.name, "\"per-ip\"");
        assert_eq!(item.policy, "\"per-ip\";q=60;w=60");
        let window = Algorithm::FixedWindow(FixedWindow::new(1000, Duration::from_millis(1500)));
        let quoted = PolicyItem::new("say \"hi\"", &window);
        assert_eq!(quoted.policy, r#""say \"hi\"";q=1000;w=2"#);
        let parsed: sfv::List = sfv::Parser::new(&quoted.policy).parse().unwrap();
        assert_eq!(parsed.len(), 1);
    }

    #[test]
    fn one_rule_values_match_the_general_writer() {
        let bucket = Algorithm::TokenBucket(TokenBucket::new(60, Duration::from_secs(60)));
        let items = [PolicyItem::new("per \"ip\"", &bucket)];
        let cases = [
            (0, Duration::ZERO, r#""per \"ip\"";r=0;t=0"#),
            (9, Duration::from_millis(1), r#""per \"ip\"";r=9;t=1"#),
            (10, Duration::from_millis(1500), r#""per \"ip\"";r=10;t=2"#),
            (
                u64::MAX,
                Duration::from_secs(u64::MAX),
                r#""per \"ip\"";r=999999999999999;t=999999999999999"#,
            ),
        ];
        for (remaining, next_unit_in, expected) in cases {
            let mut decision = Decision::default();
            decision.plan.add_charge(
                0,
                "per \"ip\"".into(),
                crate::key::KeyValue::new(b"k"),
                1,
                None,
            );
            decision.plan.answer_one(Outcome {
                verdict: crate::algorithm::Verdict::Allowed,
                limit: 60,
                remaining,
                balance: 0,
                next_unit_in,
                full_in: next_unit_in,
                offence: false,
                overridden: None,
            });
            let one = ratelimit_value(&items, &decision).unwrap();
            assert_eq!(one, expected);
            assert_eq!(Some(one), items_value(&items, decision.rules()));
        }
    }

    #[test]
    fn concurrency_limits_are_quotas_in_the_drafts_concurrent_requests_unit() {
        let slots = Algorithm::Concurrency(crate::algorithm::Concurrency::new(8));
        let item = PolicyItem::new("llm", &slots);
        assert_eq!(item.policy, "\"llm\";q=8;qu=\"concurrent-requests\"");
        let mut decision = Decision::default();
        decision
            .plan
            .add_charge(0, "llm".into(), crate::key::KeyValue::new(b"k"), 1, None);
        decision.plan.answer_one(Outcome {
            verdict: crate::algorithm::Verdict::Allowed,
            limit: 8,
            remaining: 3,
            balance: 3,
            next_unit_in: Duration::ZERO,
            full_in: Duration::ZERO,
            offence: false,
            overridden: None,
        });
        let items = [item];
        let one = ratelimit_value(&items, &decision).unwrap();
        assert_eq!(one, "\"llm\";r=3");
        assert_eq!(Some(one), items_value(&items, decision.rules()));
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        assert_eq!(retry_after_value(Duration::ZERO), "1");
        assert_eq!(retry_after_value(Duration::from_nanos(1)), "1");
        assert_eq!(retry_after_value(Duration::from_secs(1)), "1");
        assert_eq!(retry_after_value(Duration::from_millis(1001)), "2");
        assert_eq!(retry_after_value(Duration::from_secs(7)), "7");
        assert_eq!(retry_after_value(Duration::from_secs(10)), "10");
        assert_eq!(retry_after_value(Duration::from_millis(98_500)), "99");
        assert_eq!(retry_after_value(Duration::from_secs(100)), "100");
        assert_eq!(retry_after_value(Duration::from_secs(3600)), "3600");
    }
}
