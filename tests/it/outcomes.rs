//! Counting by outcome and settling the real cost (DESIGN §11), through the layer, with exact
//! numbers: concurrent failed logins, successes that never count, gRPC statuses in trailers,
//! settlements into debt, and responses that never come.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tollgate::algorithm::Verdict;
use tollgate::clock::TokioClock;
use tollgate::{CountIf, Key, Limit, Limiter, MemoryStore, RateLimitLayer, Rule, Settle};
use tower::{service_fn, Layer, Service, ServiceExt};

#[cfg(feature = "redis")]
use crate::support::redis_server;

type Body = Full<Bytes>;

fn request(user: &str) -> Request<Body> {
    Request::post("/login")
        .header("x-user", user)
        .body(Body::default())
        .unwrap()
}

fn login_rule() -> Rule {
    Rule::new("failed-logins", Limit::per_hour(5))
        .key(Key::header(HeaderName::from_static("x-user")))
        .count_if(CountIf::status([401, 403]))
}

/// An inner service answering with the status in the request's `x-status` (default 200).
fn answering(
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone
{
    service_fn(|req: Request<Body>| async move {
        let status = req
            .headers()
            .get("x-status")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(200);
        let mut response = Response::new(Body::default());
        *response.status_mut() = StatusCode::from_u16(status).unwrap();
        if let Some(used) = req.headers().get("x-use") {
            response.headers_mut().insert("x-tokens-used", used.clone());
        }
        Ok::<_, Infallible>(response)
    })
}

fn with_status(mut req: Request<Body>, status: u16) -> Request<Body> {
    req.headers_mut()
        .insert("x-status", HeaderValue::from(status));
    req
}

async fn remaining(limiter: &Limiter, rule: &str, key: &str) -> u64 {
    limiter.check(rule, key, 0).await.unwrap().remaining
}

/// 100 attempts in flight at once, every one failing: exactly the limit reaches the handler.
async fn hundred_concurrent_failures(layer: RateLimitLayer) {
    let entered = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Notify::new());
    let (seen, gate) = (entered.clone(), release.clone());
    let service = layer.layer(service_fn(move |_req: Request<Body>| {
        let (seen, gate) = (seen.clone(), gate.clone());
        async move {
            let wait = gate.notified();
            seen.fetch_add(1, Ordering::SeqCst);
            wait.await;
            let mut response = Response::new(Body::default());
            *response.status_mut() = StatusCode::UNAUTHORIZED;
            Ok::<_, Infallible>(response)
        }
    }));
    let denied = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let (service, denied) = (service.clone(), denied.clone());
            tokio::spawn(async move {
                let response = service.oneshot(request("alice")).await.unwrap();
                if response.status() == StatusCode::TOO_MANY_REQUESTS {
                    denied.fetch_add(1, Ordering::SeqCst);
                }
                response.status()
            })
        })
        .collect();
    // Every attempt is decided (denied, or waiting in the handler) before any response exists.
    while entered.load(Ordering::SeqCst) + denied.load(Ordering::SeqCst) < 100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(entered.load(Ordering::SeqCst), 5);
    release.notify_waiters();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    let count = |status| statuses.iter().filter(|&&s| s == status).count();
    assert_eq!(count(StatusCode::UNAUTHORIZED), 5);
    assert_eq!(count(StatusCode::TOO_MANY_REQUESTS), 95);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_concurrent_failed_logins_admit_exactly_the_limit() {
    let layer = RateLimitLayer::builder()
        .rule(login_rule())
        .build()
        .unwrap();
    hundred_concurrent_failures(layer).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_concurrent_failed_logins_admit_exactly_the_limit_on_redis() {
    let server = redis_server::RedisServer::start();
    for cache in [false, true] {
        let store = tollgate::RedisStore::builder()
            .url(server.url())
            .prefix(format!("c{cache}"))
            .deny_cache(cache)
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        let layer = RateLimitLayer::builder()
            .rule(login_rule())
            .store(store)
            .build()
            .unwrap();
        hundred_concurrent_failures(layer).await;
    }
}

#[tokio::test(start_paused = true)]
async fn successful_logins_never_count_failed_ones_do() {
    let layer = RateLimitLayer::builder()
        .rule(login_rule())
        .store(MemoryStore::with_clock(TokioClock::new()))
        .build()
        .unwrap();
    let limiter = layer.limiter().clone();
    let service = layer.layer(answering());
    for _ in 0..50 {
        let response = service.clone().oneshot(request("bob")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        // Charged on arrival (the field says 4 left), given back with the response.
        assert_eq!(
            response.headers().get("ratelimit").unwrap(),
            "\"failed-logins\";r=4;t=720"
        );
        assert_eq!(remaining(&limiter, "failed-logins", "bob").await, 5);
    }
    // Other failures (a 500, a 400) do not match [401, 403] either.
    for status in [500, 400] {
        let response = service
            .clone()
            .oneshot(with_status(request("bob"), status))
            .await;
        assert_eq!(response.unwrap().status().as_u16(), status);
    }
    assert_eq!(remaining(&limiter, "failed-logins", "bob").await, 5);
    for (i, status) in [401, 403, 401, 401, 403].into_iter().enumerate() {
        let response = service
            .clone()
            .oneshot(with_status(request("bob"), status))
            .await;
        assert_eq!(response.unwrap().status().as_u16(), status);
        assert_eq!(
            remaining(&limiter, "failed-logins", "bob").await,
            4 - i as u64
        );
    }
    let denied = service.clone().oneshot(request("bob")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// A gRPC-like answer: status 200, `application/grpc`, and `grpc-status` in the trailers.
fn grpc(status: u32) -> Response<http_body_util::combinators::BoxBody<Bytes, Infallible>> {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from(status));
    let body = Full::new(Bytes::from_static(b"\0\0\0\0\0"))
        .with_trailers(async move { Some(Ok(trailers)) })
        .boxed();
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    response
}

#[tokio::test(start_paused = true)]
async fn grpc_statuses_are_read_from_the_trailers_when_the_body_ends() {
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("calls", Limit::per_hour(3)).count_if(CountIf::failures()))
        .store(MemoryStore::with_clock(TokioClock::new()))
        .build()
        .unwrap();
    let limiter = layer.limiter().clone();
    let service = layer.layer(service_fn(|req: Request<Body>| async move {
        let code = req
            .headers()
            .get("x-grpc")
            .unwrap()
            .to_str()
            .unwrap()
            .parse();
        Ok::<_, Infallible>(grpc(code.unwrap()))
    }));
    let call = |code: u32| {
        let request = Request::post("/pkg.Svc/Call")
            .header("x-grpc", code)
            .body(Body::default())
            .unwrap();
        service.clone().oneshot(request)
    };
    // OK: charged until the trailers say OK, then given back.
    let response = call(0).await.unwrap();
    assert_eq!(
        remaining(&limiter, "calls", "").await,
        2,
        "not settled before the end"
    );
    let trailers = response.into_body().collect().await.unwrap();
    assert_eq!(trailers.trailers().unwrap()["grpc-status"], "0");
    assert_eq!(remaining(&limiter, "calls", "").await, 3);
    // UNAUTHENTICATED (16) counts.
    call(16).await.unwrap().into_body().collect().await.unwrap();
    assert_eq!(remaining(&limiter, "calls", "").await, 2);
    // A trailers-only answer (grpc-status in the head) is settled at once.
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("calls", Limit::per_hour(3)).count_if(CountIf::failures()))
        .store(MemoryStore::with_clock(TokioClock::new()))
        .build()
        .unwrap();
    let limiter = layer.limiter().clone();
    let service = layer.layer(service_fn(|_req: Request<Body>| async {
        let mut response = Response::new(Body::default());
        response
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/grpc"));
        response
            .headers_mut()
            .insert("grpc-status", HeaderValue::from(0));
        Ok::<_, Infallible>(response)
    }));
    let _head = service.oneshot(request("x")).await.unwrap();
    assert_eq!(remaining(&limiter, "calls", "").await, 3);
}

fn llm_layer() -> RateLimitLayer {
    RateLimitLayer::builder()
        .rule(
            Rule::new("tokens", Limit::per_minute(1_000))
                .cost(100)
                .settle(Settle::header(HeaderName::from_static("x-tokens-used"))),
        )
        .store(MemoryStore::with_clock(TokioClock::new()))
        .build()
        .unwrap()
}

fn using(tokens: &str) -> Request<Body> {
    Request::post("/v1/chat")
        .header("x-use", tokens)
        .body(Body::default())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_settlement_into_debt_denies_the_next_requests_for_exactly_the_debt() {
    let layer = llm_layer();
    let limiter = layer.limiter().clone();
    let service = layer.layer(answering());
    let send = |req| service.clone().oneshot(req);
    // Estimate 100, used 500: 400 more charged after the response.
    assert_eq!(send(using("500")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(remaining(&limiter, "tokens", "").await, 500);
    // Used less than the estimate: the difference comes back.
    assert_eq!(send(using("40")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(remaining(&limiter, "tokens", "").await, 460);
    // Estimate 100 (360 left), used 1000: a debt of 540 tokens (60 ms each: 32.4 s).
    assert_eq!(send(using("1000")).await.unwrap().status(), StatusCode::OK);
    let next = limiter.check("tokens", "", 100).await.unwrap();
    assert_eq!(next.remaining, 0);
    // The next request waits for the debt and its own 100 tokens: (540 + 100) × 60 ms.
    let denied = send(using("100")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "39");
    assert_eq!(
        limiter.check("tokens", "", 100).await.unwrap().verdict,
        Verdict::Denied {
            retry_after: Duration::from_millis(38_400)
        }
    );
    tokio::time::advance(Duration::from_millis(38_399)).await;
    assert_eq!(
        send(using("100")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(send(using("100")).await.unwrap().status(), StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn bad_settlement_values_keep_the_estimate_and_large_ones_are_capped() {
    let layer = llm_layer();
    let limiter = layer.limiter().clone();
    let service = layer.layer(answering());
    // A number past `u64` is refused like a request's cost of the same value, not guessed.
    for bad in ["-5", "12.5", "lots", "99999999999999999999999999"] {
        let response = service.clone().oneshot(using(bad)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    // No header at all: the estimate stays too.
    let plain = Request::post("/v1/chat").body(Body::default()).unwrap();
    service.clone().oneshot(plain).await.unwrap();
    assert_eq!(remaining(&limiter, "tokens", "").await, 500);
    tokio::time::advance(Duration::from_secs(60)).await;
    // The largest whole number: capped at the capacity, so the whole bucket and no more.
    service
        .clone()
        .oneshot(using("18446744073709551615"))
        .await
        .unwrap();
    let after = limiter.check("tokens", "", 0).await.unwrap();
    assert_eq!(after.remaining, 0);
    assert_eq!(after.next_unit_in, Duration::from_millis(60));
}

#[tokio::test(start_paused = true)]
async fn a_response_that_never_comes_keeps_its_charge() {
    let layer = RateLimitLayer::builder()
        .rule(login_rule())
        .rule(
            Rule::new("tokens", Limit::per_minute(1_000))
                .cost(100)
                .settle(Settle::header(HeaderName::from_static("x-tokens-used"))),
        )
        .store(MemoryStore::with_clock(TokioClock::new()))
        .build()
        .unwrap();
    let limiter = layer.limiter().clone();
    let mut service = layer.layer(service_fn(|_req: Request<Body>| async {
        std::future::pending::<()>().await;
        Ok::<_, Infallible>(Response::new(Body::default()))
    }));
    // The client goes away while the handler runs: the future is dropped.
    let pending = service.ready().await.unwrap().call(request("carol"));
    assert!(tokio::time::timeout(Duration::from_secs(1), pending)
        .await
        .is_err());
    // The failed-login count keeps the attempt; the estimate stays charged.
    assert_eq!(remaining(&limiter, "failed-logins", "carol").await, 4);
    assert_eq!(remaining(&limiter, "tokens", "").await, 916);
}

#[test]
fn settling_needs_an_algorithm_that_can_owe() {
    let error = RateLimitLayer::builder()
        .rule(
            Rule::new("w", Limit::sliding_window(10, Duration::from_secs(60)))
                .settle(Settle::header(HeaderName::from_static("x-used"))),
        )
        .build()
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "rule \"w\": settle: needs a token bucket or a fixed window: a settlement may leave a debt, which only they can hold"
    );
}

/// Waits (a bounded number of scheduler turns, never a timed sleep) until a settlement made in
/// the background has reached the store.
#[cfg(feature = "redis")]
async fn settled(limiter: &Limiter, rule: &str, key: &str, expected: u64) {
    for _ in 0..10_000 {
        if remaining(limiter, rule, key).await == expected {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!(
        "{rule}: {} left, expected {expected}",
        remaining(limiter, rule, key).await
    );
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_and_refunds_by_outcome_on_redis() {
    let server = redis_server::RedisServer::start();
    let clock = tollgate::clock::ManualClock::new(Duration::from_secs(1_750_000_000));
    for cache in [false, true] {
        let store = tollgate::RedisStore::builder()
            .url(server.url())
            .prefix(format!("s{cache}"))
            .clock(clock.clone())
            .deny_cache(cache)
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        let layer = RateLimitLayer::builder()
            .rule(
                Rule::new("tokens", Limit::per_minute(1_000))
                    .cost(100)
                    .settle(Settle::header(HeaderName::from_static("x-tokens-used"))),
            )
            .rule(login_rule())
            .store(store)
            .build()
            .unwrap();
        let limiter = layer.limiter().clone();
        let service = layer.layer(answering());
        let send = |req| service.clone().oneshot(req);
        let chat = |tokens: &str| {
            Request::post("/v1/chat")
                .header("x-use", tokens)
                .header("x-user", "dave")
                .body(Body::default())
                .unwrap()
        };
        assert_eq!(send(chat("500")).await.unwrap().status(), StatusCode::OK);
        settled(&limiter, "tokens", "", 500).await;
        // Successful: the failed-login rule (which every request here meets) gave it back.
        settled(&limiter, "failed-logins", "dave", 5).await;
        assert_eq!(send(chat("40")).await.unwrap().status(), StatusCode::OK);
        settled(&limiter, "tokens", "", 460).await;
        assert_eq!(send(chat("1000")).await.unwrap().status(), StatusCode::OK);
        for _ in 0..10_000 {
            let check = limiter.check("tokens", "", 100).await.unwrap();
            if check.verdict
                == (Verdict::Denied {
                    retry_after: Duration::from_millis(38_400),
                })
            {
                break;
            }
            tokio::task::yield_now().await;
        }
        let denied = send(chat("100")).await.unwrap();
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(denied.headers()["retry-after"], "39");
        clock.advance(Duration::from_millis(38_399));
        assert_eq!(
            send(chat("100")).await.unwrap().status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        clock.advance(Duration::from_millis(1));
        assert_eq!(send(chat("100")).await.unwrap().status(), StatusCode::OK);
        // A failed attempt keeps its charge.
        clock.advance(Duration::from_secs(60));
        let failed = send(with_status(chat("100"), 401)).await.unwrap();
        assert_eq!(failed.status(), StatusCode::UNAUTHORIZED);
        // (The successful requests' refunds reach Redis in the background.)
        settled(&limiter, "failed-logins", "dave", 4).await;
        clock.advance(Duration::from_secs(3600));
    }
}
