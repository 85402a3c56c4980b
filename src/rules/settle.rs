//! Once the response is known: counting by outcome and settling the real cost.
//!
//! A rule with [`count_if`](crate::Rule::count_if) or [`settle`](crate::Rule::settle) is charged
//! when the request arrives, like any rule — so concurrent requests can never get past the limit
//! — and corrected when the response head (or, for gRPC, the trailers) is seen: a response the
//! predicate does not count gets its charge back; a settled rule is charged the difference
//! between the real cost and the estimate, or given it back. The correction goes to the store
//! without the response waiting for it.
//!
//! Owns: the predicates, reading a real cost, and [`Settlement`], what a forwarded request
//! carries until its response is known. Knows nothing of the stores' arithmetic.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::{HeaderMap, HeaderName, StatusCode};

use crate::rules::cost::parse_units;

/// What the predicates and settlements of a rule see of a response.
#[derive(Debug)]
pub struct ResponseHead<'a> {
    /// The HTTP status.
    pub status: StatusCode,
    /// The response's header fields; for a gRPC status that came in the trailers, the trailers.
    pub headers: &'a HeaderMap,
    /// The gRPC status code (`grpc-status`), when the response carries one.
    pub grpc_status: Option<u32>,
}

/// Which responses a rule counts: the others get their charge back (see
/// [`Rule::count_if`](crate::Rule::count_if)).
///
/// The classes read the gRPC status when the response has one, the HTTP status otherwise.
#[derive(Clone)]
pub struct CountIf(Matcher);

#[derive(Clone)]
enum Matcher {
    Statuses(Box<[u16]>),
    Failures,
    ServerErrors,
    Successes,
    Custom(Arc<dyn Fn(&ResponseHead<'_>) -> bool + Send + Sync>),
}

/// gRPC codes that mean the server, not the caller, failed: UNKNOWN, DEADLINE_EXCEEDED,
/// UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS.
const GRPC_SERVER_ERRORS: [u32; 6] = [2, 4, 12, 13, 14, 15];

impl CountIf {
    /// Counts responses with one of these HTTP statuses (e.g. `[401, 403]`: failed logins).
    pub fn status(statuses: impl IntoIterator<Item = u16>) -> CountIf {
        CountIf(Matcher::Statuses(statuses.into_iter().collect()))
    }

    /// A short human-readable name, for tools that describe rules (`tollgate check`):
    /// `status:401,403`, `failures`, `server-errors`, `successes`, or `fn` for a predicate of
    /// the application's.
    pub fn describe(&self) -> String {
        match &self.0 {
            Matcher::Statuses(statuses) => {
                let listed: Vec<String> = statuses.iter().map(u16::to_string).collect();
                format!("status:{}", listed.join(","))
            }
            Matcher::Failures => "failures".into(),
            Matcher::ServerErrors => "server-errors".into(),
            Matcher::Successes => "successes".into(),
            Matcher::Custom(_) => "fn".into(),
        }
    }

    /// Counts failures: HTTP status 400 or above, or a gRPC status other than OK.
    pub fn failures() -> CountIf {
        CountIf(Matcher::Failures)
    }

    /// Counts server errors: HTTP 5xx, or the gRPC codes a server failure gives (UNKNOWN,
    /// DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS).
    pub fn server_errors() -> CountIf {
        CountIf(Matcher::ServerErrors)
    }

    /// Counts successes: HTTP status below 400 with no gRPC status other than OK.
    pub fn successes() -> CountIf {
        CountIf(Matcher::Successes)
    }

    /// Counts the responses for which `predicate` holds.
    pub fn when<F>(predicate: F) -> CountIf
    where
        F: Fn(&ResponseHead<'_>) -> bool + Send + Sync + 'static,
    {
        CountIf(Matcher::Custom(Arc::new(predicate)))
    }

    /// Whether the response counts.
    pub fn matches(&self, head: &ResponseHead<'_>) -> bool {
        let failed = match head.grpc_status {
            Some(code) => code != 0,
            None => head.status.as_u16() >= 400,
        };
        match &self.0 {
            Matcher::Statuses(statuses) => statuses.contains(&head.status.as_u16()),
            Matcher::Failures => failed,
            Matcher::ServerErrors => match head.grpc_status {
                Some(code) => GRPC_SERVER_ERRORS.contains(&code),
                None => head.status.is_server_error(),
            },
            Matcher::Successes => !failed,
            Matcher::Custom(predicate) => predicate(head),
        }
    }
}

impl fmt::Debug for CountIf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Matcher::Statuses(statuses) => f.debug_tuple("status").field(statuses).finish(),
            Matcher::Failures => f.write_str("failures"),
            Matcher::ServerErrors => f.write_str("server_errors"),
            Matcher::Successes => f.write_str("successes"),
            Matcher::Custom(_) => f.write_str("when(..)"),
        }
    }
}

/// Where a rule reads what a request really cost (see [`Rule::settle`](crate::Rule::settle)).
///
/// # Bad values
/// A header that is missing, not a whole number, negative or past `u64::MAX` settles nothing
/// (the rule a request's [`Cost::header`](crate::Cost::header) reads by): the estimate stays
/// charged, and the rule logs a warning the first time. A value above the rule's capacity (e.g.
/// a runaway `x-tokens-used: 1000000000`) is capped at the capacity, logged the same way. Never a
/// panic.
#[derive(Clone)]
pub struct Settle {
    from: Source,
    warned: Arc<AtomicBool>,
}

/// A closure reading the real cost.
type ReadCost = Arc<dyn Fn(&ResponseHead<'_>) -> Option<u64> + Send + Sync>;

#[derive(Clone)]
enum Source {
    Header(HeaderName),
    Custom(ReadCost),
}

impl Settle {
    /// The real cost is the whole number in the response header `name` (e.g. `x-tokens-used`).
    pub fn header(name: HeaderName) -> Settle {
        Settle {
            from: Source::Header(name),
            warned: Arc::default(),
        }
    }

    /// The real cost is what `read` finds in the response (`None`: keep the estimate).
    pub fn with<F>(read: F) -> Settle
    where
        F: Fn(&ResponseHead<'_>) -> Option<u64> + Send + Sync + 'static,
    {
        Settle {
            from: Source::Custom(Arc::new(read)),
            warned: Arc::default(),
        }
    }

    /// A short human-readable name, for tools that describe rules (`tollgate check`):
    /// `header:x-tokens-used`, or `fn` for a closure of the application's.
    pub fn describe(&self) -> String {
        match &self.from {
            Source::Header(name) => format!("header:{name}"),
            Source::Custom(_) => "fn".into(),
        }
    }

    /// The real cost, capped at `capacity`; `None` keeps the estimate.
    pub(crate) fn real_cost(
        &self,
        rule: &str,
        head: &ResponseHead<'_>,
        capacity: u64,
    ) -> Option<u64> {
        let read = match &self.from {
            Source::Header(name) => match head.headers.get(name) {
                None => Err(format!("no {name} header")),
                Some(value) => parse_units(value.as_bytes())
                    .ok_or_else(|| format!("{name}: {value:?} is not a whole number")),
            },
            Source::Custom(read) => read(head).ok_or_else(|| "no real cost".to_owned()),
        };
        match read {
            Ok(units) if units > capacity => {
                self.warn_once(
                    rule,
                    &format!("real cost {units} capped at the capacity {capacity}"),
                );
                Some(capacity)
            }
            Ok(units) => Some(units),
            Err(why) => {
                self.warn_once(rule, &format!("{why}; the estimate stays charged"));
                None
            }
        }
    }

    fn warn_once(&self, rule: &str, what: &str) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                rule,
                "rate limit: settlement: {what} (logged once per rule)"
            );
        }
    }
}

impl fmt::Debug for Settle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.from {
            Source::Header(name) => f.debug_tuple("header").field(name).finish(),
            Source::Custom(_) => f.write_str("with(..)"),
        }
    }
}

pub(crate) fn grpc_status(headers: &HeaderMap) -> Option<u32> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(status: u16, grpc: Option<u32>, headers: &HeaderMap) -> ResponseHead<'_> {
        ResponseHead {
            status: StatusCode::from_u16(status).unwrap(),
            headers,
            grpc_status: grpc,
        }
    }

    #[test]
    fn classes_read_the_grpc_status_when_there_is_one() {
        let none = HeaderMap::new();
        let failures = CountIf::failures();
        assert!(failures.matches(&head(401, None, &none)));
        assert!(!failures.matches(&head(302, None, &none)));
        assert!(failures.matches(&head(200, Some(16), &none)));
        assert!(!failures.matches(&head(200, Some(0), &none)));
        let server = CountIf::server_errors();
        assert!(server.matches(&head(503, None, &none)));
        assert!(!server.matches(&head(404, None, &none)));
        assert!(server.matches(&head(200, Some(14), &none)));
        assert!(!server.matches(&head(200, Some(16), &none)));
        assert!(CountIf::successes().matches(&head(204, None, &none)));
        assert!(!CountIf::successes().matches(&head(200, Some(7), &none)));
        let logins = CountIf::status([401, 403]);
        assert!(logins.matches(&head(403, None, &none)));
        assert!(!logins.matches(&head(400, None, &none)));
    }

    #[test]
    fn real_costs_read_whole_numbers_cap_large_ones_and_keep_the_estimate_otherwise() {
        let settle = Settle::header(HeaderName::from_static("x-tokens-used"));
        let cost = |value: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(value) = value {
                headers.insert("x-tokens-used", value.parse().unwrap());
            }
            settle.real_cost("llm", &head(200, None, &headers), 10_000)
        };
        assert_eq!(cost(Some("1234")), Some(1234));
        assert_eq!(cost(Some(" 7 ")), Some(7));
        // Past `u64` a number is refused, as a request's cost is: the estimate stays charged.
        assert_eq!(cost(Some("99999999999999999999999")), None);
        assert_eq!(cost(Some("10001")), Some(10_000));
        assert_eq!(cost(Some("-5")), None);
        assert_eq!(cost(Some("12.5")), None);
        assert_eq!(cost(Some("lots")), None);
        assert_eq!(cost(Some("")), None);
        assert_eq!(cost(None), None);
    }
}
