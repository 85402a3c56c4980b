//! The answers the layer gives: the responses it writes itself (429, 400, 403, 503) and the fields
//! it adds to the inner service's responses, in the shape of the request's protocol.
//!
//! - `headers`: the `RateLimit`, `RateLimit-Policy`, `Retry-After` and legacy fields;
//! - `policies`: what is prepared once per rule set (each rule's items, the last 429s);
//! - `prepared`: ready-made copies of recent identical 429s;
//! - `grpc`: trailers-only gRPC answers, for requests whose `content-type` is gRPC's;
//! - this module: the `Responder`, which picks the shape and builds HTTP problem+json answers.
//!
//! It reads decisions and refusals; it never touches stores, keys or the Tower glue.

pub(crate) mod grpc;
pub(crate) mod headers;
mod policies;
mod prepared;

pub(crate) use policies::Policies;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Response, StatusCode};

use self::headers::{Legacy, RATELIMIT, RATELIMIT_POLICY};
use crate::engine::decision::Decision;
use crate::rules::set::Refusal;
use crate::store::StoreError;

use self::grpc::Code;
use crate::key::protocol::Protocol;

/// The problem type of draft-ietf-httpapi-ratelimit-headers for a denied request.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// Builds the rejection response of any request, HTTP or gRPC, from a [`Rejection`] (see
/// [`RateLimitLayerBuilder::on_rejection`](crate::RateLimitLayerBuilder::on_rejection)).
pub type RespondFn = dyn Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync;

/// A denied request, as a custom rejection hook sees it: the decision, the protocol the request
/// speaks, the wait, and the answer the layer would give.
///
/// ```
/// use tollgate::{Limit, RateLimitLayer};
/// use tollgate::key::Protocol;
///
/// let layer = RateLimitLayer::builder()
///     .rule(Limit::per_minute(60))
///     .on_rejection(|rejected| match rejected.protocol() {
///         Protocol::Http => http::Response::builder()
///             .status(429)
///             .body(bytes::Bytes::from_static(b"slow down"))
///             .unwrap(),
///         // RESOURCE_EXHAUSTED, with a message of our own.
///         _ => rejected.grpc(8, "slow down"),
///     })
///     .build()
///     .unwrap();
/// ```
pub struct Rejection<'a> {
    responder: &'a Responder,
    policies: &'a Policies,
    decision: &'a Decision,
    protocol: Protocol,
    wait: Duration,
}

impl Rejection<'_> {
    /// What the limiter decided: the rules, which of them denied, their numbers.
    pub fn decision(&self) -> &Decision {
        self.decision
    }

    /// The protocol of the request, and so of the answer its client expects.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// How long the client should wait (jitter included): what `Retry-After` and
    /// `grpc-retry-pushback-ms` say unless the response sets them.
    pub fn retry_after(&self) -> Duration {
        self.wait
    }

    /// The answer the layer gives without a hook: a `429` with problem+json for HTTP, a
    /// trailers-only `RESOURCE_EXHAUSTED` for gRPC; with every field.
    pub fn default_response(&self) -> Response<Bytes> {
        self.responder
            .build_denied(self.policies, self.decision, self.protocol, self.wait)
    }

    /// A trailers-only gRPC answer in the request's flavour (gRPC or gRPC-Web): HTTP `200`,
    /// `grpc-status: code` (a gRPC status code number, e.g. `tonic::Code::ResourceExhausted as
    /// i32`, 8) and `message`, percent-encoded and cut to 1 KiB. The layer adds
    /// `grpc-retry-pushback-ms` and the `RateLimit` fields.
    pub fn grpc(&self, code: i32, message: &str) -> Response<Bytes> {
        let protocol = match self.protocol {
            Protocol::Http => Protocol::Grpc,
            other => other,
        };
        grpc::trailers_only(protocol, code, message)
    }
}

impl fmt::Debug for Rejection<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejection")
            .field("decision", self.decision)
            .field("protocol", &self.protocol)
            .field("retry_after", &self.wait)
            .finish_non_exhaustive()
    }
}

/// How the layer answers and what it adds.
#[derive(Clone)]
pub(crate) struct Responder {
    pub(crate) status: StatusCode,
    pub(crate) on_allowed: bool,
    pub(crate) legacy: bool,
    pub(crate) jitter: Duration,
    pub(crate) rejection: Option<Arc<RespondFn>>,
    /// The words of the last fail-closed refusal.
    unavailable: Arc<ArcSwapOption<Unavailable>>,
}

/// What a fail-closed refusal says, for one wait. During an outage every refusal says the same
/// (the breaker's wait moves by the second), so the words are written once per wait, not per
/// request.
struct Unavailable {
    retry: u64,
    message: String,
    /// The HTTP problem+json body.
    body: Bytes,
}

impl Unavailable {
    fn new(retry: u64) -> Self {
        let message = format!("The rate limiter cannot decide right now; try again in {retry} s.");
        let body = serde_json::json!({
            "type": "about:blank",
            "title": "Service Unavailable",
            "status": StatusCode::SERVICE_UNAVAILABLE.as_u16(),
            "detail": message,
        });
        Unavailable {
            retry,
            body: Bytes::from(body.to_string()),
            message,
        }
    }
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
            unavailable: Arc::default(),
        }
    }

    fn policy(policies: &Policies, decision: &Decision) -> Option<HeaderValue> {
        if decision.plan.has_applied() {
            return per_request_policy(policies, decision);
        }
        if decision.rules().len() == policies.items.len() {
            return policies.all_rules.clone();
        }
        let items = decision
            .rules()
            .iter()
            .filter_map(|r| policies.items.get(r.index));
        headers::join(items.map(|i| i.policy.as_str()))
    }

    /// Adds the `RateLimit` fields to a rejection. A response the user built keeps any field it
    /// set; the default rejection is the layer's own and has none yet, so it appends directly.
    fn insert_fields(
        &self,
        policies: &Policies,
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
        if let Some(policy) = Self::policy(policies, decision) {
            add(&RATELIMIT_POLICY, policy);
        }
        if let Some(value) = headers::ratelimit_value(&policies.items, decision) {
            add(&RATELIMIT, value);
        }
        if self.legacy {
            if let Some(legacy) = Legacy::of(&policies.items, decision) {
                legacy.insert(headers);
            }
        }
    }

    /// The fields for an allowed response, if the layer sends them. (The check is inlined: with
    /// the fields off it costs no call.)
    #[inline]
    pub(crate) fn allowed(
        &self,
        policies: &Policies,
        decision: &Decision,
    ) -> Option<AllowedHeaders> {
        if !self.on_allowed || decision.rules().is_empty() {
            return None;
        }
        self.allowed_fields(policies, decision)
    }

    fn allowed_fields(&self, policies: &Policies, decision: &Decision) -> Option<AllowedHeaders> {
        Some(AllowedHeaders {
            policy: Self::policy(policies, decision)?,
            ratelimit: headers::ratelimit_value(&policies.items, decision)?,
            legacy: self
                .legacy
                .then(|| Legacy::of(&policies.items, decision))
                .flatten(),
        })
    }

    /// The response to a denied request, in the shape of its protocol.
    pub(crate) fn denied(
        &self,
        policies: &Policies,
        decision: &Decision,
        protocol: Protocol,
    ) -> Response<Bytes> {
        let wait = decision.retry_after().unwrap_or_default() + self.jitter();
        if let Some(hook) = &self.rejection {
            let rejected = Rejection {
                responder: self,
                policies,
                decision,
                protocol,
                wait,
            };
            let mut response = hook(&rejected);
            self.complete(policies, decision, protocol, wait, &mut response, false);
            return response;
        }
        // (A per-request limit's policy is not in the fingerprint: such refusals are built.)
        if protocol == Protocol::Http && !self.legacy && !decision.plan.has_applied() {
            let retry_seconds = headers::whole_seconds(wait).max(1);
            return policies
                .prepared
                .get_or_build(self.status, retry_seconds, decision, || {
                    self.build_denied(policies, decision, protocol, wait)
                });
        }
        self.build_denied(policies, decision, protocol, wait)
    }

    /// The layer's own answer to a denied request, with every field.
    fn build_denied(
        &self,
        policies: &Policies,
        decision: &Decision,
        protocol: Protocol,
        wait: Duration,
    ) -> Response<Bytes> {
        let mut response = if protocol.is_grpc() {
            let message = grpc_quota_exceeded(decision, headers::whole_seconds(wait).max(1));
            grpc::trailers_only(protocol, Code::ResourceExhausted as i32, &message)
        } else {
            let body = quota_exceeded(
                policies,
                decision,
                self.status,
                headers::whole_seconds(wait).max(1),
            );
            problem(self.status, body)
        };
        self.complete(policies, decision, protocol, wait, &mut response, true);
        response
    }

    /// Adds the wait (`Retry-After`, or `grpc-retry-pushback-ms` for gRPC) and the `RateLimit`
    /// fields to a rejection; to a user's (`own` false), only those it does not set itself.
    fn complete(
        &self,
        policies: &Policies,
        decision: &Decision,
        protocol: Protocol,
        wait: Duration,
        response: &mut Response<Bytes>,
        own: bool,
    ) {
        let headers = response.headers_mut();
        if protocol.is_grpc() {
            if own || !headers.contains_key(&grpc::GRPC_RETRY_PUSHBACK_MS) {
                headers.insert(
                    grpc::GRPC_RETRY_PUSHBACK_MS.clone(),
                    grpc::pushback_value(wait),
                );
            }
        } else if own || !headers.contains_key(http::header::RETRY_AFTER) {
            headers::insert_retry_after(headers, wait);
        }
        self.insert_fields(policies, headers, decision, own);
    }

    fn jitter(&self) -> Duration {
        if self.jitter.is_zero() {
            Duration::ZERO
        } else {
            self.jitter.mul_f64(fastrand::f64())
        }
    }

    /// The response to a request refused before the store was asked.
    pub(crate) fn refused(&self, refusal: &Refusal, protocol: Protocol) -> Response<Bytes> {
        let (status, detail) = refusal_detail(refusal);
        if protocol.is_grpc() {
            return grpc::trailers_only(protocol, Code::of_status(status) as i32, &detail);
        }
        let body = serde_json::json!({
            "type": "about:blank",
            "title": status.canonical_reason().unwrap_or("Error"),
            "status": status.as_u16(),
            "detail": detail,
        });
        problem(status, Bytes::from(body.to_string()))
    }

    /// The response when the store failed and the layer fails closed: a plain message, and the
    /// wait until the circuit breaker's next probe (whole seconds, rounded up, at least 1; 1 s
    /// when the breaker is still closed, as the next request asks the store again) as
    /// `Retry-After`, or for gRPC as `UNAVAILABLE` with `grpc-retry-pushback-ms`.
    pub(crate) fn unavailable_in(&self, error: &StoreError, protocol: Protocol) -> Response<Bytes> {
        let retry = unavailable_retry_after(error);
        let words = match self.unavailable.load_full() {
            Some(words) if words.retry == retry => words,
            _ => {
                let fresh = Arc::new(Unavailable::new(retry));
                self.unavailable.store(Some(fresh.clone()));
                fresh
            }
        };
        if protocol.is_grpc() {
            let message = &words.message;
            let mut response = grpc::trailers_only(protocol, Code::Unavailable as i32, message);
            response.headers_mut().insert(
                grpc::GRPC_RETRY_PUSHBACK_MS.clone(),
                grpc::pushback_value(Duration::from_secs(retry)),
            );
            return response;
        }
        let mut response = problem(StatusCode::SERVICE_UNAVAILABLE, words.body.clone());
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from(retry));
        response
    }
}

/// Seconds a fail-closed refusal asks the client to wait (see [`Responder::unavailable_in`]).
fn unavailable_retry_after(error: &StoreError) -> u64 {
    error
        .retry_after()
        .map_or(1, |wait| {
            wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
        })
        .max(1)
}

/// The status and the sentence that explain a refusal, whatever the protocol.
fn refusal_detail(refusal: &Refusal) -> (StatusCode, String) {
    match refusal {
        Refusal::MissingKey { rule, key, status } => (
            *status,
            format!(
                "Rate-limit rule \"{rule}\" counts requests by {key}, and this request has none."
            ),
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
        Refusal::NoPeer { rule, key } => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "The server is misconfigured: rate-limit rule \"{rule}\" counts requests by {key}, \
                 and the server does not pass the client's address on to it."
            ),
        ),
        Refusal::NoRoute { rule, key } => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "The server is misconfigured: rate-limit rule \"{rule}\" counts requests by {key}, \
                 and it runs before the router has matched a route."
            ),
        ),
        Refusal::BadKey { rule, key } => (
            StatusCode::BAD_REQUEST,
            format!(
                "Rate-limit rule \"{rule}\" counts requests by {key}, and this request's value is \
                 not valid UTF-8 once percent-decoded."
            ),
        ),
    }
}

/// The `grpc-message` of a denial: the rules that denied and the wait.
fn grpc_quota_exceeded(decision: &Decision, retry_seconds: u64) -> String {
    let mut message = String::from("Rate limit exceeded (");
    let violated = decision.rules().iter().filter(|r| !r.outcome.is_allowed());
    for (i, entry) in violated.enumerate() {
        if i > 0 {
            message.push_str(", ");
        }
        message.push_str(&entry.rule);
    }
    message.push_str("); retry in ");
    message.push_str(itoa::Buffer::new().format(retry_seconds));
    message.push_str(" s.");
    message
}

/// The problem+json body of a denial, written directly: names are escaped once when the rules are
/// built, so a flood of 429s costs one allocation each.
fn quota_exceeded(
    policies: &Policies,
    decision: &Decision,
    status: StatusCode,
    retry_seconds: u64,
) -> Bytes {
    let violated = || {
        decision
            .rules()
            .iter()
            .filter(|r| !r.outcome.is_allowed())
            .filter_map(|r| policies.items.get(r.index))
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

/// `RateLimit-Policy` when some rule's limit came from the request: that limit's item.
fn per_request_policy(policies: &Policies, decision: &Decision) -> Option<HeaderValue> {
    let mut items: Vec<std::borrow::Cow<'_, str>> = Vec::with_capacity(decision.rules().len());
    for entry in decision.rules() {
        match entry.limit() {
            Some(limit) => items.push(
                headers::PolicyItem::new(&entry.rule, limit.algorithm())
                    .policy
                    .into(),
            ),
            None => items.push(policies.items.get(entry.index)?.policy.as_str().into()),
        }
    }
    headers::join(items.iter().map(|item| item.as_ref()))
}
