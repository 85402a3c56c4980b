//! The fields an answer asks Envoy to add to the client's response.
//!
//! draft-ietf-httpapi-ratelimit-headers-11, as the library's middleware writes them: one
//! Structured Field item per limit that applied, named by the limit,
//! `RateLimit-Policy: "edge.remote_address";q=3;w=60` and `RateLimit: "edge.remote_address";r=2;t=42`;
//! `Retry-After` (seconds) when over the limit. The legacy fields are the most restrictive
//! limit's, with `X-RateLimit-Reset` in seconds from now, as Envoy's own
//! `DRAFT_VERSION_03` fields count it. And, when asked, the reference service's own three fields
//! (`RateLimit-Limit`, `-Remaining`, `-Reset` by default) beside them.

use std::fmt::Write as _;
use std::time::Duration;

use tollgate::headers::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};

use super::decide::{until_window_end, Answer, Judged};
use super::protocol::{code, DescriptorStatus, HeaderValue};
use super::ReferenceHeaders;
use crate::tree::{Headers, LimitKind, Policy};

/// The fields for `answer` under its domain's `headers` setting.
pub(crate) fn response_headers(answer: &Answer<'_>) -> Vec<HeaderValue> {
    let headers = answer.headers;
    // Shadow limits are counted and reported to operators (statistics, logs), never to
    // clients: they are not enforced.
    let limited = || {
        answer
            .judged
            .iter()
            .filter_map(|j| match j.limit.as_deref() {
                Some(limit) if limit.kind != LimitKind::Unlimited && !limit.shadow => {
                    Some((j, limit))
                }
                _ => None,
            })
    };
    if limited().next().is_none() || headers == Headers::Off {
        return Vec::new();
    }
    let mut fields = Vec::with_capacity(6);
    let field = |name: &http::HeaderName, value: String| HeaderValue {
        key: name.as_str().to_owned(),
        value,
    };
    if matches!(headers, Headers::Draft | Headers::Both) {
        // One item per limit, for the first descriptor that reached it. The policy item and the
        // quoted name are the limit's own, written once (`Memo`); per call, only two numbers.
        // Sized for the usual answer, one limit: no string grows.
        let (mut policy, mut ratelimit) = (String::with_capacity(96), String::with_capacity(96));
        let mut numbers = itoa::Buffer::new();
        for (n, (j, limit)) in limited().enumerate() {
            if limited()
                .take(n)
                .any(|(_, earlier)| std::ptr::eq(earlier, limit))
            {
                continue;
            }
            if !policy.is_empty() {
                policy.push_str(", ");
                ratelimit.push_str(", ");
            }
            policy.push_str(limit.memo.policy_item.get_or_init(|| {
                let mut item = sf_string(&limit.name);
                let Policy {
                    quota,
                    window_seconds,
                } = limit.policy;
                let _ = write!(item, ";q={quota};w={window_seconds}");
                item
            }));
            ratelimit.push_str(limit.memo.sf_name.get_or_init(|| sf_string(&limit.name)));
            ratelimit.push_str(";r=");
            ratelimit.push_str(numbers.format(remaining(j)));
            ratelimit.push_str(";t=");
            ratelimit.push_str(numbers.format(reset(j)));
        }
        fields.push(field(&RATELIMIT_POLICY, policy));
        fields.push(field(&RATELIMIT, ratelimit));
    }
    if matches!(headers, Headers::Legacy | Headers::Both) {
        if let Some((tightest, limit)) = limited().min_by_key(|(j, _)| remaining(j)) {
            fields.push(field(
                &X_RATELIMIT_LIMIT,
                limit.requests_per_unit.to_string(),
            ));
            fields.push(field(
                &X_RATELIMIT_REMAINING,
                remaining(tightest).to_string(),
            ));
            fields.push(field(&X_RATELIMIT_RESET, reset(tightest).to_string()));
        }
    }
    // A cost that can never fit is refused whatever the wait: no `Retry-After` for it (the
    // layer answers such a request 400), only for limits that a later moment lets through.
    let retry = limited()
        .filter(|(j, _)| j.over && !j.unfit)
        .map(|(j, _)| {
            j.outcome
                .as_ref()
                .and_then(|o| o.retry_after())
                .map_or_else(|| reset(j), whole_seconds)
                .max(1)
        })
        .max();
    if let Some(retry) = retry {
        fields.push(field(&http::header::RETRY_AFTER, retry.to_string()));
    }
    fields
}

/// The reference's three fields (`LIMIT_RESPONSE_HEADERS_ENABLED`) for the descriptor closest
/// to its limit, as it picks it: the one with the fewest units left among those with a limit (the
/// first of equals), except that a descriptor over an enforced limit that is not a quota limit
/// takes the place (the last such). Its `requests_per_unit`, what is left, and the seconds until
/// it resets.
pub(crate) fn reference_headers(
    answer: &Answer<'_>,
    statuses: &[DescriptorStatus],
    names: &ReferenceHeaders,
) -> Vec<HeaderValue> {
    let mut closest: Option<&DescriptorStatus> = None;
    let mut fewest = u32::MAX;
    for (j, status) in answer.judged.iter().zip(statuses) {
        if status.current_limit.is_some() && status.limit_remaining < fewest {
            closest = Some(status);
            fewest = status.limit_remaining;
        }
        if status.code == code::OVER_LIMIT && !j.quota {
            closest = Some(status);
            fewest = 0;
        }
    }
    let Some(status) = closest else {
        return Vec::new();
    };
    let limit = status
        .current_limit
        .as_ref()
        .map_or(0, |limit| limit.requests_per_unit);
    let reset = status.duration_until_reset.map_or(0, |d| {
        let whole = u64::try_from(d.seconds).unwrap_or(0);
        whole + u64::from(d.nanos > 0)
    });
    let field = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
    };
    vec![
        field(&names.limit, limit.to_string()),
        field(&names.remaining, status.limit_remaining.to_string()),
        field(&names.reset, reset.to_string()),
    ]
}

/// The units left: none once over the limit, except for a cost that can never fit, which
/// charged nothing and leaves the key's count as it is.
fn remaining(j: &Judged<'_>) -> u64 {
    match &j.outcome {
        Some(o) if !j.over || j.unfit => o.remaining,
        _ => 0,
    }
}

/// Seconds until the limit's quota grows (rounded up); for a key with nothing to grow (full, or
/// refused a cost it can never hold), until its window renews.
fn reset(j: &Judged<'_>) -> u64 {
    match (&j.outcome, j.limit.as_deref()) {
        (Some(o), Some(limit)) if j.unfit && o.next_unit_in.is_zero() => {
            whole_seconds(until_window_end(limit))
        }
        (Some(o), _) => whole_seconds(o.next_unit_in),
        (None, limit) => limit.map_or(1, |l| l.unit.duration().as_secs()),
    }
}

fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// `name` as a Structured Field string: quoted, `"` and `\` escaped, anything outside printable
/// ASCII (which sf-strings cannot hold) written as `?`.
fn sf_string(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}
