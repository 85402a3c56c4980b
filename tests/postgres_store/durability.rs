//! The database crashes, stops and starts again: no acknowledged charge is lost, and while it
//! is away requests get the failure policy's answers, quickly, until it is back.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use http::{HeaderName, Request, Response, StatusCode};
use tollgate::clock::ManualClock;
use tollgate::store::CircuitBreaker;
use tollgate::{
    FailurePolicy, Key, Limit, LimitError, Limiter, PostgresStore, RateLimitLayer, Rule,
};
use tower::{service_fn, Layer, ServiceExt};

use crate::support::postgres_server::PgServer;

const START: Duration = Duration::from_secs(1_750_000_000);

async fn store(server: &PgServer, clock: &ManualClock) -> PostgresStore {
    PostgresStore::builder()
        .url(server.url())
        .clock(clock.clone())
        .create_schema(true)
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap()
}

fn quota(store: PostgresStore) -> Limiter {
    Limiter::builder()
        .rule(Rule::new("quota", Limit::per_day(1_000)))
        .store(store)
        .build()
        .unwrap()
}

/// Killed (SIGKILL, a crash) and started again, the database holds every charge it
/// acknowledged; the store that was running finds it again by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_of_the_database_loses_no_acknowledged_charge() {
    let mut server = PgServer::start().await;
    let clock = ManualClock::new(START);
    let running = quota(store(&server, &clock).await);
    for cost in [1, 5, 31] {
        assert!(running
            .charge("quota", "tenant", cost)
            .await
            .unwrap()
            .is_allowed());
    }
    server.kill();
    server.restart().await;
    // A new instance reads the balance from the database.
    let fresh = quota(store(&server, &clock).await);
    assert_eq!(
        fresh.check("quota", "tenant", 0).await.unwrap().remaining,
        963
    );
    // The running one's connections died with the server: bounded wait for new ones.
    let deadline = Instant::now() + Duration::from_secs(10);
    let outcome = loop {
        match running.charge("quota", "tenant", 3).await {
            Ok(outcome) => break outcome,
            Err(LimitError::Store(error)) => {
                assert!(Instant::now() < deadline, "no recovery: {error}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(other) => panic!("{other}"),
        }
    };
    assert_eq!(outcome.remaining, 960);
}

/// Stopped under traffic, the layer answers by its failure policy (`while_down`) within the
/// store's timeout, and once the database is back (the circuit breaker's probe finds it)
/// requests are charged to it again, on the counts from before the stop.
async fn stopped_under_traffic(policy: FailurePolicy, while_down: StatusCode) {
    let mut server = PgServer::start().await;
    let clock = ManualClock::new(START);
    let quick = PostgresStore::builder()
        .url(server.url())
        .clock(clock.clone())
        .create_schema(true)
        .timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let tenant = HeaderName::from_static("x-tenant");
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("api", Limit::per_day(1_000)).key(Key::header(tenant.clone())))
        .store(quick)
        .on_store_failure(policy)
        .circuit_breaker(
            CircuitBreaker::new()
                .failures(2)
                .probe_interval(Duration::from_millis(20), Duration::from_millis(200)),
        )
        .build()
        .unwrap();
    let service = layer.layer(service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    let call = || {
        let request = Request::builder()
            .header(&tenant, "acme")
            .body(String::new())
            .unwrap();
        let service = service.clone();
        async move { service.oneshot(request).await.unwrap().status() }
    };
    for _ in 0..3 {
        assert_eq!(call().await, StatusCode::OK);
    }
    server.stop();
    for _ in 0..10 {
        let asked = Instant::now();
        assert_eq!(call().await, while_down, "{policy:?}");
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "{:?}",
            asked.elapsed()
        );
    }
    server.restart().await;
    // The database's own count, read by another instance after each request: the first request
    // it moves is the first the store decided again.
    let check = Limiter::builder()
        .rule(Rule::new("api", Limit::per_day(1_000)))
        .store(store(&server, &clock).await)
        .build()
        .unwrap();
    let remaining = || async { check.check("api", "acme", 0).await.unwrap().remaining };
    // Nothing lost, nothing charged while the store was away.
    assert_eq!(remaining().await, 997);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = call().await;
        if remaining().await < 997 {
            assert_eq!(status, StatusCode::OK);
            break;
        }
        assert_eq!(status, while_down, "{policy:?}");
        assert!(Instant::now() < deadline, "the store did not come back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(remaining().await, 996);
    assert_eq!(call().await, StatusCode::OK);
    assert_eq!(remaining().await, 995);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_under_traffic_failing_closed_answers_503_and_recovers() {
    stopped_under_traffic(FailurePolicy::Closed, StatusCode::SERVICE_UNAVAILABLE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_under_traffic_failing_open_forwards_and_recovers() {
    stopped_under_traffic(FailurePolicy::Open, StatusCode::OK).await;
}

/// The local fallback decides meanwhile with half the limit in memory (500 of 1,000: the ten
/// requests fit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_under_traffic_failing_to_local_limits_decides_in_memory_and_recovers() {
    stopped_under_traffic(FailurePolicy::Local { share: 0.5 }, StatusCode::OK).await;
}
