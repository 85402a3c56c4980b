//! The `request` target: arbitrary method, path and headers through a layer with several scoped
//! rules, three times in a row.
//!
//! Input: the first line is `METHOD PATH` (an invalid method is `GET`, an invalid path `/`);
//! `@peer ADDR` sets the TCP peer (default `10.0.0.1`, a trusted proxy; unparsable: none);
//! every other line is a header `name: value` (an invalid name is left out).
//!
//! The layer: a login rule (fixed window, client IP behind `10.0.0.0/8`, `POST /login`), an API
//! rule (token bucket keyed by `x-api-key`, falling back to the peer), an LLM rule (cost from
//! `x-llm-tokens`), an app rule (sliding window keyed by the `sid` cookie, skipped without it), an
//! admin rule (sliding log keyed by bearer token, `401` without it), a burst-pool rule for `PUT`
//! and `DELETE` (first of `x-user` and the `Forwarded` client), a queued rule (`/slow/*`, cost
//! from `x-cost`), a shadow rule, an allow list and a deny list.
//!
//! Checked: nothing panics; every answer is one the layer can give (200 from the service, 400,
//! 401, 403, 429, and 500 when there is no peer address for a peer-IP key), the service runs
//! exactly for the 200s, a 429 carries `Retry-After` of at least one second and a problem+json
//! body, and the layer's headers are well-formed.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use tollgate::clock::ManualClock;
use tollgate::key::ForwardedHeader;
use tollgate::{
    AccessList, Cost, Key, Limit, MemoryStore, MissingKey, Queue, RateLimitLayer, Rule,
};
use tower::{service_fn, Layer, ServiceExt};

/// How many times the request is sent.
const SENDS: usize = 3;

fn header(name: &'static str) -> HeaderName {
    HeaderName::from_static(name)
}

/// The layer under test, with a fresh store on a fixed manual clock.
fn layer() -> RateLimitLayer {
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let proxies = || {
        Key::client_ip()
            .try_trust(["10.0.0.0/8", "2001:db8::/32"])
            .unwrap()
            .trust_loopback()
    };
    RateLimitLayer::builder()
        .store(MemoryStore::builder().clock(clock).shards(4).build())
        .rule(
            Rule::new("login", Limit::fixed_window(2, Duration::from_secs(900)))
                .key(proxies())
                .methods([Method::POST])
                .path("/login"),
        )
        .rule(
            Rule::new("api", Limit::per_minute(100).capacity(2))
                .key(Key::header(header("x-api-key")))
                .path("/api/*")
                .on_missing_key(MissingKey::Fallback(Key::peer_ip())),
        )
        .rule(
            Rule::new("llm", Limit::per_minute(10_000))
                .path("/v1/*")
                .cost(Cost::header(header("x-llm-tokens"))),
        )
        .rule(
            Rule::new("app", Limit::sliding_window(2, Duration::from_secs(60)))
                .key(Key::cookie("sid"))
                .path("/app/*")
                .path("/users/*/avatar")
                .on_missing_key(MissingKey::Skip),
        )
        .rule(
            Rule::new("admin", Limit::sliding_log(2, Duration::from_secs(10)))
                .key(Key::bearer())
                .path("/admin/*")
                .on_missing_key(MissingKey::RejectWith(StatusCode::UNAUTHORIZED)),
        )
        .rule(
            Rule::new(
                "pool",
                Limit::per_second(1).pool(2, 1, Duration::from_secs(1)),
            )
            .key(Key::first_of([
                Key::header(header("x-user")),
                proxies().header(ForwardedHeader::Forwarded).into(),
            ]))
            .methods([Method::PUT, Method::DELETE]),
        )
        .rule(
            Rule::new("upstream", Limit::per_second(5).capacity(1))
                .path("/slow/*")
                .cost(Cost::header(header("x-cost")).or(1))
                .queue(Queue::max_delay(Duration::from_secs(2))),
        )
        .rule(Rule::new("everyone", Limit::per_second(1)).shadow(true))
        .allow(AccessList::keys(
            Key::header(header("x-api-key")),
            ["admin-key"],
        ))
        .deny(AccessList::networks(
            proxies().header(ForwardedHeader::XRealIp),
            ["192.0.2.0/24".parse().unwrap()],
        ))
        .legacy_headers(true)
        .build()
        .expect("the fuzzed layer is valid")
}

/// The request an input describes (without a body).
fn parse(data: &[u8]) -> http::request::Parts {
    let mut lines = super::lines(data);
    let first = lines.next().unwrap_or_default();
    let (method, path) = match first.iter().position(|b| *b == b' ') {
        Some(space) => (&first[..space], &first[space + 1..]),
        None => (first, &b"/"[..]),
    };
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method = Method::from_bytes(method).unwrap_or(Method::GET);
    parts.uri = Uri::try_from(path).unwrap_or_else(|_| Uri::from_static("/"));
    let mut peer = Some(IpAddr::from([10, 0, 0, 1]));
    for line in lines {
        if let Some((name, argument)) = super::setting(line) {
            if name == b"peer" {
                peer = argument
                    .parse::<SocketAddr>()
                    .map(|addr| addr.ip())
                    .or_else(|_| argument.parse::<IpAddr>())
                    .ok();
            }
            continue;
        }
        let colon = line.iter().position(|b| *b == b':').unwrap_or(line.len());
        let Ok(name) = HeaderName::from_bytes(&line[..colon]) else {
            continue;
        };
        let value = line.get(colon + 1..).unwrap_or_default();
        parts.headers.append(name, super::header_value(value));
    }
    if let Some(peer) = peer {
        parts.extensions.insert(SocketAddr::new(peer, 40_000));
    }
    parts
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let parts = parse(data);
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let inner = service_fn(move |_: Request<Full<Bytes>>| {
        seen.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))) }
    });
    let layer = layer();
    let service = layer.layer(inner);
    super::runtime().block_on(async {
        for _ in 0..SENDS {
            let mut request = Request::new(Full::new(Bytes::new()));
            *request.method_mut() = parts.method.clone();
            *request.uri_mut() = parts.uri.clone();
            *request.headers_mut() = parts.headers.clone();
            if let Some(peer) = parts.extensions.get::<SocketAddr>() {
                request.extensions_mut().insert(*peer);
            }
            for rule in layer.limiter().rules_in_force() {
                let _ = layer.limiter().key_for(&rule.name, &request);
            }
            let before = calls.load(Ordering::SeqCst);
            let has_peer = request.extensions().get::<SocketAddr>().is_some();
            let response = service.clone().oneshot(request).await.unwrap();
            let called = calls.load(Ordering::SeqCst) > before;
            check(response, called, has_peer).await;
        }
    });
}

async fn check(
    response: Response<tollgate::middleware::ResponseBody<Full<Bytes>>>,
    called: bool,
    has_peer: bool,
) {
    let (parts, body) = response.into_parts();
    let status = parts.status;
    assert!(
        [200, 400, 401, 403, 429].contains(&status.as_u16())
            // A peer-address key on a server that passes no peer on: its misconfiguration.
            || (status == StatusCode::INTERNAL_SERVER_ERROR && !has_peer),
        "unexpected status {status}"
    );
    assert_eq!(called, status == StatusCode::OK, "{status}");
    for name in [
        "ratelimit",
        "ratelimit-policy",
        "retry-after",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        for value in parts.headers.get_all(name) {
            assert!(value.to_str().is_ok(), "{name}: {value:?}");
        }
    }
    let body = body.collect().await.unwrap().to_bytes();
    if status == StatusCode::TOO_MANY_REQUESTS {
        let retry_after: u64 = parts.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .expect("Retry-After in whole seconds");
        assert!(retry_after >= 1);
        let problem: serde_json::Value =
            serde_json::from_slice(&body).expect("a problem+json body");
        assert_eq!(problem["status"], 429);
    }
}
