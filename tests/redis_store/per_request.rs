//! Per-request limits on every store: the same requests through the memory store and through a
//! real `redis-server`, with the same exact answers. The Redis script receives a charge's
//! algorithm parameters with every call, so a per-request limit flows through, and a key whose
//! limit changes keeps its state there too.

#![cfg(feature = "redis")]

use crate::support::oneshot;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response};
use http_body_util::Full;
use tollgate::clock::ManualClock;
use tollgate::rules::LimitResolver;
use tollgate::store::Store;
use tollgate::{Key, Limit, MemoryStore, RateLimitLayer, RedisStore, Rule};
use tower::{service_fn, Layer};

use super::ENGINE;
use oneshot::{send, summary, Limited};

type Body = Full<Bytes>;

static API_KEY: HeaderName = HeaderName::from_static("x-api-key");

#[derive(Clone)]
struct Plan {
    per_minute: u64,
}

fn service(store: impl Store) -> impl Limited<Body> {
    let resolver = LimitResolver::new(|key| async move {
        let n = if key.as_bytes() == b"acme" { 3 } else { 0 };
        Ok::<_, Infallible>(
            (n > 0).then(|| Limit::fixed_window(n, Duration::from_secs(60)).aligned()),
        )
    })
    // No delay here: a generous bound, so a loaded machine cannot make it fall back.
    .timeout(Duration::from_secs(30));
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new("plan", Limit::per_minute(2))
                .key(Key::header(API_KEY.clone()))
                .limit_from_extension(|plan: &Plan| Some(Limit::per_minute(plan.per_minute))),
        )
        .rule(
            Rule::new(
                "lookup",
                Limit::fixed_window(1, Duration::from_secs(60)).aligned(),
            )
            .key(Key::header(API_KEY.clone()))
            .limit_from(resolver),
        )
        .store(store)
        .build()
        .expect("valid rules");
    layer.layer(service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::default()))
    }))
}

fn request(key: &str, per_minute: u64) -> Request<Body> {
    let mut request = Request::get("/")
        .header(&API_KEY, key)
        .body(Body::default())
        .unwrap();
    request.extensions_mut().insert(Plan { per_minute });
    request
}

/// Status, `RateLimit-Policy` and `RateLimit` of each step of one scenario.
async fn scenario(service: &impl Limited<Body>, clock: &ManualClock) -> Vec<String> {
    let mut seen = Vec::new();
    let mut step = |response: Response<Bytes>| seen.push(summary(&response));
    for plan in [10, 10, 10, 5, 10] {
        step(send(service, request("acme", plan)).await);
    }
    step(send(service, request("other", 10)).await);
    step(send(service, request("other", 10)).await);
    clock.advance(Duration::from_secs(60));
    step(send(service, request("acme", 2)).await);
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_request_limits_give_the_same_answers_on_redis_and_in_memory() {
    let server = ENGINE.server();
    let start = Duration::from_secs(1_750_000_020);

    let clock = ManualClock::new(start);
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let in_memory = scenario(&service(memory), &clock).await;

    let clock = ManualClock::new(start);
    let redis = RedisStore::builder()
        .url(server.url())
        .clock(clock.clone())
        .deny_cache(false)
        .build()
        .await
        .expect("connect");
    let on_redis = scenario(&service(redis), &clock).await;

    // The exact numbers: "plan" as in the memory tests (the moment a key was empty carries over
    // when its limit changes; a refused request charges no rule, which report their balance),
    // "lookup" 3 per aligned minute for acme, the rule's own 1 for a key the resolver does not
    // know (the clock starts on a minute boundary).
    let expected = [
        "200 | \"plan\";q=10;w=60, \"lookup\";q=3;w=60 | \"plan\";r=9;t=6, \"lookup\";r=2;t=60",
        "200 | \"plan\";q=10;w=60, \"lookup\";q=3;w=60 | \"plan\";r=8;t=6, \"lookup\";r=1;t=60",
        "200 | \"plan\";q=10;w=60, \"lookup\";q=3;w=60 | \"plan\";r=7;t=6, \"lookup\";r=0;t=60",
        "429 | \"plan\";q=5;w=60, \"lookup\";q=3;w=60 | \"plan\";r=3;t=6, \"lookup\";r=0;t=60",
        "429 | \"plan\";q=10;w=60, \"lookup\";q=3;w=60 | \"plan\";r=7;t=6, \"lookup\";r=0;t=60",
        "200 | \"plan\";q=10;w=60, \"lookup\";q=1;w=60 | \"plan\";r=9;t=6, \"lookup\";r=0;t=60",
        "429 | \"plan\";q=10;w=60, \"lookup\";q=1;w=60 | \"plan\";r=9;t=6, \"lookup\";r=0;t=60",
        "200 | \"plan\";q=2;w=60, \"lookup\";q=3;w=60 | \"plan\";r=1;t=30, \"lookup\";r=2;t=60",
    ];
    assert_eq!(in_memory, expected);
    assert_eq!(on_redis, expected);
}

/// A per-request limit the Redis store cannot count exactly (above 2^50 units) is refused like a
/// build-time one would be: the request is charged under the rule's own limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_redis_cannot_count_falls_back_to_the_rules_own() {
    let server = ENGINE.server();
    let clock = ManualClock::new(Duration::from_secs(1_750_000_020));
    let redis = RedisStore::builder()
        .url(server.url())
        .clock(clock.clone())
        .build()
        .await
        .expect("connect");
    let service = service(redis);
    let huge = send(&service, request("acme", 1 << 51)).await;
    assert_eq!(huge.status(), http::StatusCode::OK);
    let policy = huge.headers().get("ratelimit-policy").unwrap();
    assert_eq!(policy, "\"plan\";q=2;w=60, \"lookup\";q=3;w=60");
    // Counted in Redis under the rule's own 2 a minute.
    assert_eq!(
        huge.headers().get("ratelimit").unwrap(),
        "\"plan\";r=1;t=30, \"lookup\";r=2;t=60"
    );
}

/// What an auth layer put in the request: the customer's tier, 10 a minute with this capacity.
#[derive(Clone)]
struct Tier {
    capacity: u64,
}

fn tiered_service(store: impl Store) -> impl Limited<Body> {
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new("customer", Limit::per_minute(10))
                .key(Key::header(API_KEY.clone()))
                .limit_from_extension(|tier: &Tier| {
                    Some(Limit::per_minute(10).capacity(tier.capacity))
                }),
        )
        .store(store)
        .build()
        .expect("valid rules");
    layer.layer(service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::default()))
    }))
}

/// Status, `RateLimit-Policy` and `RateLimit` of customer A's requests: 60 spent of 100, then
/// 21 under a capacity of 20.
async fn downgrade(service: &impl Limited<Body>) -> Vec<String> {
    let mut seen = Vec::new();
    for capacity in [100; 60].into_iter().chain([20; 21]) {
        let mut request = Request::get("/")
            .header(&API_KEY, "customer-a")
            .body(Body::default())
            .unwrap();
        request.extensions_mut().insert(Tier { capacity });
        seen.push(summary(&send(service, request).await));
    }
    seen
}

/// Issue 24 (DESIGN §13) on a real `redis-server` and in memory: 10 a minute with a capacity of
/// 100, customer A spends 60; handed a capacity of 20, A has 20 at once (not 0 for four
/// minutes), then is refused until the next unit, 6 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgraded_customer_has_what_fits_at_once_on_redis_and_in_memory() {
    let server = ENGINE.server();
    let start = Duration::from_secs(1_750_000_020);
    let clock = ManualClock::new(start);
    let memory = MemoryStore::builder().clock(clock).build();
    let in_memory = downgrade(&tiered_service(memory)).await;
    let redis = RedisStore::builder()
        .url(server.url())
        .clock(ManualClock::new(start))
        .build()
        .await
        .expect("connect");
    let on_redis = downgrade(&tiered_service(redis)).await;

    let spent = (40..100)
        .rev()
        .map(|left| format!("200 | \"customer\";q=100;w=600 | \"customer\";r={left};t=6"));
    let downgraded = (0..20)
        .rev()
        .map(|left| format!("200 | \"customer\";q=20;w=120 | \"customer\";r={left};t=6"));
    let refused = "429 | \"customer\";q=20;w=120 | \"customer\";r=0;t=6".to_owned();
    let expected: Vec<String> = spent
        .chain(downgraded)
        .chain(std::iter::once(refused))
        .collect();
    assert_eq!(in_memory, expected);
    assert_eq!(on_redis, expected);
}
