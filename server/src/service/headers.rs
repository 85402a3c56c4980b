//! The fields an answer asks Envoy to add to the client's response.
//!
//! draft-ietf-httpapi-ratelimit-headers-11, as the library's middleware writes them: one
//! Structured Field item per limit that applied, named by the limit,
//! `RateLimit-Policy: "edge.remote_address";q=3;w=60` and `RateLimit: "edge.remote_address";r=2;t=42`;
//! `Retry-After` (seconds) when over the limit. The legacy fields are the most restrictive
//! limit's, with `X-RateLimit-Reset` in seconds from now, as Envoy's own
//! `DRAFT_VERSION_03` fields count it.

use std::fmt::Write as _;
use std::time::Duration;

use tollgate::headers::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};

use super::decide::{Answer, Judged};
use super::protocol::HeaderValue;
use crate::tree::{Headers, LimitKind};

/// The fields for `answer` under a domain's `headers` setting.
pub(crate) fn response_headers(answer: &Answer<'_>, headers: Headers) -> Vec<HeaderValue> {
    let limited: Vec<&Judged<'_>> = answer
        .judged
        .iter()
        .filter(|j| {
            j.limit
                .as_ref()
                .is_some_and(|l| l.kind != LimitKind::Unlimited)
        })
        .collect();
    let mut fields = Vec::new();
    if limited.is_empty() || headers == Headers::Off {
        return fields;
    }
    let field = |name: &http::HeaderName, value: String| HeaderValue {
        key: name.as_str().to_owned(),
        value,
    };
    if matches!(headers, Headers::Draft | Headers::Both) {
        // One item per limit, for the first descriptor that reached it.
        let (mut policy, mut ratelimit) = (String::new(), String::new());
        for (n, j) in limited.iter().enumerate() {
            let Some(limit) = &j.limit else { continue };
            let same =
                |earlier: &&Judged<'_>| earlier.limit.is_some_and(|l| std::ptr::eq(l, *limit));
            if limited[..n].iter().any(same) {
                continue;
            }
            if !policy.is_empty() {
                policy.push_str(", ");
                ratelimit.push_str(", ");
            }
            let window = limit.unit.duration().as_secs();
            push_sf_string(&mut policy, &limit.name);
            let _ = write!(policy, ";q={};w={window}", limit.requests_per_unit);
            push_sf_string(&mut ratelimit, &limit.name);
            let _ = write!(ratelimit, ";r={};t={}", remaining(j), reset(j));
        }
        fields.push(field(&RATELIMIT_POLICY, policy));
        fields.push(field(&RATELIMIT, ratelimit));
    }
    if matches!(headers, Headers::Legacy | Headers::Both) {
        if let Some(tightest) = limited.iter().min_by_key(|j| remaining(j)) {
            let limit = tightest.limit.as_ref().map_or(0, |l| l.requests_per_unit);
            fields.push(field(&X_RATELIMIT_LIMIT, limit.to_string()));
            fields.push(field(
                &X_RATELIMIT_REMAINING,
                remaining(tightest).to_string(),
            ));
            fields.push(field(&X_RATELIMIT_RESET, reset(tightest).to_string()));
        }
    }
    if answer.over_limit() {
        let retry = limited
            .iter()
            .filter(|j| j.over && j.limit.as_ref().is_some_and(|l| !l.shadow))
            .map(|j| {
                j.outcome
                    .as_ref()
                    .and_then(|o| o.retry_after())
                    .map_or_else(|| reset(j), whole_seconds)
            })
            .max()
            .unwrap_or(1);
        fields.push(field(&http::header::RETRY_AFTER, retry.to_string()));
    }
    fields
}

fn remaining(j: &Judged<'_>) -> u64 {
    match &j.outcome {
        Some(o) if !j.over => o.remaining,
        _ => 0,
    }
}

/// Seconds until the limit's quota grows (rounded up).
fn reset(j: &Judged<'_>) -> u64 {
    match &j.outcome {
        Some(o) => whole_seconds(o.next_unit_in),
        None => j.limit.as_ref().map_or(1, |l| l.unit.duration().as_secs()),
    }
}

fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Appends `name` as a Structured Field string: quoted, `"` and `\` escaped, anything outside
/// printable ASCII (which sf-strings cannot hold) written as `?`.
fn push_sf_string(out: &mut String, name: &str) {
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
}
