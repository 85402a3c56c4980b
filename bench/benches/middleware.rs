//! The middleware's cost per request: a trivial `service_fn` bare, then behind `RateLimitLayer`.
//!
//! Each iteration sends one request through `ready().await` + `call(..).await` on a current-thread
//! tokio runtime (`block_on` per request) and drops the response. Requests are built outside the
//! measurement (`iter_batched`), so the difference to `bare` is what the layer adds: planning the
//! rules, deriving the key, the store decision, and the `RateLimit` headers or the 429 answer.
//!
//! - `bare`: the service alone.
//! - `global_allowed`: one global token-bucket rule of `u32::MAX` per second (never denied), with
//!   the default `RateLimit` / `RateLimit-Policy` headers on the response.
//! - `global_denied`: one global rule of one per hour, already spent: every request is answered
//!   `429` with `Retry-After` and a problem+json body, and the service is not called.
//! - `peer_ip_allowed`: like `global_allowed`, keyed by the peer IP, read from a `SocketAddr` in the
//!   request extensions.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::runtime::Runtime;
use tollgate::{Key, Limit, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

const NEVER_DENIED: u64 = u32::MAX as u64;

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(40)
}

async fn hello(_request: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hello"))))
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
}

fn plain_request() -> Request<()> {
    Request::new(())
}

fn peer_request() -> Request<()> {
    let mut request = Request::new(());
    let peer: SocketAddr = ([203, 0, 113, 7], 49152).into();
    request.extensions_mut().insert(peer);
    request
}

/// One request through `service`, on `rt`; the response is dropped inside the measurement.
fn send<S, B>(rt: &Runtime, service: &mut S, request: Request<()>) -> StatusCode
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    rt.block_on(async {
        let ready = service.ready().await.expect("the service is always ready");
        ready.call(request).await.expect("infallible").status()
    })
}

/// Benchmarks `service` under `name`, after checking the answer to a first request.
fn bench<S, B>(
    c: &mut Criterion,
    name: &str,
    mut service: S,
    request: fn() -> Request<()>,
    expect: StatusCode,
) where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let rt = runtime();
    assert_eq!(send(&rt, &mut service, request()), expect, "{name}");
    c.bench_function(&format!("middleware/{name}"), |b| {
        b.iter_batched(
            request,
            |request| send(&rt, &mut service, request),
            BatchSize::SmallInput,
        )
    });
}

/// The layered service answers `200` with `RateLimit` headers (or `429`), as expected.
fn check_headers(layer: &RateLimitLayer, request: fn() -> Request<()>, expect: StatusCode) {
    let rt = runtime();
    let response = rt
        .block_on(layer.layer(tower::service_fn(hello)).oneshot(request()))
        .expect("infallible");
    assert_eq!(response.status(), expect);
    let header = if expect == StatusCode::OK {
        tollgate::headers::RATELIMIT.clone()
    } else {
        http::header::RETRY_AFTER
    };
    assert!(
        response.headers().contains_key(&header),
        "{header} missing: {response:?}"
    );
}

fn middleware(c: &mut Criterion) {
    bench(
        c,
        "bare",
        tower::service_fn(hello),
        plain_request,
        StatusCode::OK,
    );

    let allowed = RateLimitLayer::new(Limit::per_second(NEVER_DENIED));
    check_headers(&allowed, plain_request, StatusCode::OK);
    bench(
        c,
        "global_allowed",
        allowed.layer(tower::service_fn(hello)),
        plain_request,
        StatusCode::OK,
    );

    // The first request spends the only unit; every later one is denied.
    let denied = RateLimitLayer::new(Limit::per_hour(1));
    check_headers(&denied, plain_request, StatusCode::OK);
    check_headers(&denied, plain_request, StatusCode::TOO_MANY_REQUESTS);
    bench(
        c,
        "global_denied",
        denied.layer(tower::service_fn(hello)),
        plain_request,
        StatusCode::TOO_MANY_REQUESTS,
    );

    let peer = RateLimitLayer::new(Limit::per_second(NEVER_DENIED).key(Key::peer_ip()));
    check_headers(&peer, peer_request, StatusCode::OK);
    let key = peer
        .limiter()
        .rules_in_force()
        .first()
        .and_then(|rule| {
            peer.limiter()
                .key_for(&rule.name, &peer_request())
                .ok()
                .flatten()
        })
        .expect("the peer address is the key");
    assert_eq!(key.as_bytes(), b"203.0.113.7");
    bench(
        c,
        "peer_ip_allowed",
        peer.layer(tower::service_fn(hello)),
        peer_request,
        StatusCode::OK,
    );
}

criterion_group! {
    name = benches;
    config = config();
    targets = middleware
}
criterion_main!(benches);
