//! The responses the layer writes itself (429, 400, 503) and the fields it adds to the inner
//! service's responses.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Response, StatusCode};

use crate::decision::Decision;
use crate::headers::{self, Legacy, RATELIMIT, RATELIMIT_POLICY};
use crate::prepared::Fingerprint;
use crate::ruleset::{Refusal, RuleSet};
use crate::store::StoreError;

/// The problem type of draft-ietf-httpapi-ratelimit-headers for a denied request.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// Builds the rejection response from the decision (replaces the default problem+json 429). The
/// layer still adds `Retry-After` and the `RateLimit` fields unless the response sets them.
pub type RejectionFn = dyn Fn(&Decision) -> Response<Bytes> + Send + Sync;

/// How the layer answers and what it adds.
#[derive(Clone)]
pub(crate) struct Responder {
    pub(crate) status: StatusCode,
    pub(crate) on_allowed: bool,
    pub(crate) legacy: bool,
    pub(crate) jitter: Duration,
    pub(crate) rejection: Option<Arc<RejectionFn>>,
}

/// The fields to add to an allowed response, prepared before the inner service runs.
#[derive(Debug)]
pub(crate) struct AllowedHeaders {
    policy: HeaderValue,
    ratelimit: HeaderValue,
    legacy: Option<Legacy>,
}

impl AllowedHeaders {
    /// Appends rather than replaces: with stacked layers (an outer `layer` and an inner
    /// `route_layer`) each adds its items, and several field lines of a Structured Field list are
    /// one list (RFC 9651 §3.1).
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        headers.append(RATELIMIT_POLICY.clone(), self.policy);
        headers.append(RATELIMIT.clone(), self.ratelimit);
        if let Some(legacy) = self.legacy {
            legacy.insert(headers);
        }
    }
}

impl Responder {
    pub(crate) fn new() -> Self {
        Responder {
            status: StatusCode::TOO_MANY_REQUESTS,
            on_allowed: true,
            legacy: false,
            jitter: Duration::ZERO,
            rejection: None,
        }
    }

    fn policy(rules: &RuleSet, decision: &Decision) -> Option<HeaderValue> {
        if decision.rules().len() == rules.items.len() {
            return rules.all_rules_policy.clone();
        }
        let items = decision
            .rules()
            .iter()
            .filter_map(|r| rules.items.get(r.index));
        headers::join(items.map(|i| i.policy.as_str()))
    }

    /// Adds the `RateLimit` fields to a rejection. A response the user built keeps any field it
    /// set; the default rejection is the layer's own and has none yet, so it appends directly.
    fn insert_fields(
        &self,
        rules: &RuleSet,
        headers: &mut HeaderMap,
        decision: &Decision,
        own: bool,
    ) {
        let mut add = |name: &HeaderName, value: HeaderValue| {
            if own {
                headers.append(name.clone(), value);
            } else {
                headers.entry(name.clone()).or_insert(value);
            }
        };
        if let Some(policy) = Self::policy(rules, decision) {
            add(&RATELIMIT_POLICY, policy);
        }
        if let Some(value) = headers::ratelimit_value(&rules.items, decision) {
            add(&RATELIMIT, value);
        }
        if self.legacy {
            if let Some(legacy) = Legacy::of(decision) {
                legacy.insert(headers);
            }
        }
    }

    /// The fields for an allowed response, if the layer sends them.
    pub(crate) fn allowed(&self, rules: &RuleSet, decision: &Decision) -> Option<AllowedHeaders> {
        if !self.on_allowed || decision.rules().is_empty() {
            return None;
        }
        Some(AllowedHeaders {
            policy: Self::policy(rules, decision)?,
            ratelimit: headers::ratelimit_value(&rules.items, decision)?,
            legacy: self.legacy.then(|| Legacy::of(decision)).flatten(),
        })
    }

    /// The response to a denied request.
    pub(crate) fn denied(&self, rules: &RuleSet, decision: &Decision) -> Response<Bytes> {
        let wait = decision.retry_after().unwrap_or_default() + self.jitter();
        if self.rejection.is_none() && !self.legacy {
            let retry_seconds = headers::whole_seconds(wait).max(1);
            let fingerprint = Fingerprint::of(self.status, retry_seconds, decision);
            return rules
                .prepared
                .get_or_build(fingerprint, || self.build_denied(rules, decision, wait));
        }
        self.build_denied(rules, decision, wait)
    }

    fn build_denied(
        &self,
        rules: &RuleSet,
        decision: &Decision,
        wait: Duration,
    ) -> Response<Bytes> {
        let mut response = match &self.rejection {
            Some(build) => build(decision),
            None => {
                let body = quota_exceeded(
                    rules,
                    decision,
                    self.status,
                    headers::whole_seconds(wait).max(1),
                );
                problem(self.status, body)
            }
        };
        let own = self.rejection.is_none();
        let headers = response.headers_mut();
        if own || !headers.contains_key(http::header::RETRY_AFTER) {
            headers::insert_retry_after(headers, wait);
        }
        self.insert_fields(rules, headers, decision, own);
        response
    }

    fn jitter(&self) -> Duration {
        if self.jitter.is_zero() {
            Duration::ZERO
        } else {
            self.jitter.mul_f64(fastrand::f64())
        }
    }

    /// The response to a request refused before the store was asked.
    pub(crate) fn refused(&self, refusal: &Refusal) -> Response<Bytes> {
        let (status, detail) = match refusal {
            Refusal::MissingKey { rule, key, status } => (
                *status,
                format!("Rate-limit rule \"{rule}\" counts requests by {key}, and this request has none."),
            ),
            Refusal::BadCost { rule, error } => (
                StatusCode::BAD_REQUEST,
                format!("Rate-limit rule \"{rule}\": {error}."),
            ),
            Refusal::CostTooLarge { rule, error } => (
                StatusCode::BAD_REQUEST,
                format!("Rate-limit rule \"{rule}\": {error}."),
            ),
            Refusal::Denied { list } => (
                StatusCode::FORBIDDEN,
                format!("This client is on a deny list ({list})."),
            ),
        };
        let body = serde_json::json!({
            "type": "about:blank",
            "title": status.canonical_reason().unwrap_or("Error"),
            "status": status.as_u16(),
            "detail": detail,
        });
        problem(status, Bytes::from(body.to_string()))
    }

    /// The response when the store failed and the layer fails closed: a plain message, and
    /// `Retry-After` (whole seconds, rounded up, at least 1) until the circuit breaker's next
    /// probe, or 1 s when the breaker is still closed (the next request asks the store again).
    /// The gRPC answer branches on [`unavailable_retry_after`](Self::unavailable_retry_after).
    pub(crate) fn unavailable(&self, error: &StoreError) -> Response<Bytes> {
        let status = StatusCode::SERVICE_UNAVAILABLE;
        let retry = Self::unavailable_retry_after(error);
        let body = serde_json::json!({
            "type": "about:blank",
            "title": "Service Unavailable",
            "status": status.as_u16(),
            "detail": format!(
                "The rate limiter cannot decide right now; try again in {retry} s."
            ),
        });
        let mut response = problem(status, Bytes::from(body.to_string()));
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, http::HeaderValue::from(retry));
        response
    }

    /// Seconds a fail-closed refusal asks the client to wait (see [`unavailable`](Self::unavailable)).
    pub(crate) fn unavailable_retry_after(error: &StoreError) -> u64 {
        error
            .retry_after()
            .map_or(1, |wait| {
                wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
            })
            .max(1)
    }
}

/// The problem+json body of a denial, written directly: names are escaped once when the rules are
/// built, so a flood of 429s costs one allocation each.
fn quota_exceeded(
    rules: &RuleSet,
    decision: &Decision,
    status: StatusCode,
    retry_seconds: u64,
) -> Bytes {
    let violated = || {
        decision
            .rules()
            .iter()
            .filter(|r| !r.outcome.is_allowed())
            .filter_map(|r| rules.items.get(r.index))
    };
    let mut numbers = itoa::Buffer::new();
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":\"");
    body.push_str(QUOTA_EXCEEDED);
    body.push_str("\",\"title\":\"Too Many Requests\",\"status\":");
    body.push_str(numbers.format(status.as_u16()));
    body.push_str(",\"detail\":\"Rate limit exceeded (");
    for (i, item) in violated().enumerate() {
        if i > 0 {
            body.push_str(", ");
        }
        body.push_str(&item.json_name);
    }
    body.push_str("); retry in ");
    body.push_str(numbers.format(retry_seconds));
    body.push_str(" s.\",\"violated-policies\":[");
    for (i, item) in violated().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push('"');
        body.push_str(&item.json_name);
        body.push('"');
    }
    body.push_str("]}");
    // Trimmed to its length first (a shrink in place): `Bytes` then takes the allocation over as
    // it is, where a buffer with spare capacity would cost it a second allocation.
    Bytes::from(body.into_bytes().into_boxed_slice())
}

const PROBLEM_JSON: &str = "application/problem+json";

/// A problem+json response. `Content-Length` is set here, with the other fields: a server or
/// router that adds it later (axum does, from the body's size) would grow the header map of every
/// prepared copy.
fn problem(status: StatusCode, body: Bytes) -> Response<Bytes> {
    let length = HeaderValue::from(body.len());
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    headers.insert(CONTENT_LENGTH, length);
    response
}

impl fmt::Debug for Responder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Responder")
            .field("status", &self.status)
            .field("on_allowed", &self.on_allowed)
            .field("legacy", &self.legacy)
            .field("jitter", &self.jitter)
            .field("custom_rejection", &self.rejection.is_some())
            .finish()
    }
}
