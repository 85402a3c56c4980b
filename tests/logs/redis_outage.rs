//! Redis outages against real `redis-server` processes: paused (SIGSTOP), killed, and restarted
//! on the same port, under each failure policy. For each: what the requests got, that once the
//! circuit breaker is open no request waits for Redis (its answer is ready at the first poll, and
//! Redis sees no call), the number of warning lines, the store-health gauge, and recovery with
//! no restart of the app.
//!
//! Also what a probe must be: after a restart on the same port the first probe after Redis is back
//! closes the breaker, and out of memory (every write refused, `PING` still answered) the probe
//! fails like the requests do, so the breaker stays open instead of flapping.
//!
//! The tests of this binary share the global `tracing` subscriber that counts the lines (the
//! breaker's probe logs from a background task, on any thread) and the global metrics recorder
//! (the health gauge has no labels), so they run one at a time.
//!
//! Nothing here sleeps to let something happen: a probe runs in the background, and the tests
//! wait for its answer (the line the breaker writes), sending nothing meanwhile. A request sent
//! while a probe ends would race it: on a busy machine it could reach Redis through the breaker
//! just closed and be counted there.

#![cfg(feature = "redis")]

use crate::support::redis_server;

use crate::support::log_lines;
use log_lines::Lines;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use metrics_util::debugging::{DebugValue, Snapshotter};
use tollgate::clock::ManualClock;
use tollgate::store::CircuitBreaker;
use tollgate::{FailurePolicy, Limit, RateLimitLayer, RedisStore, Rule};
use tower::{service_fn, Layer, Service, ServiceExt};

use super::ENGINE;
use crate::outage::{globals, one_at_a_time};
use redis_server::RedisServer;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

type Body = Full<Bytes>;

fn request() -> Request<Body> {
    let mut req = Request::get("/").body(Body::default()).unwrap();
    req.extensions_mut()
        .insert(SocketAddr::from(([10, 0, 0, 1], 40_000)));
    req
}

type App = tollgate::middleware::RateLimit<
    tower::util::ServiceFn<
        fn(Request<Body>) -> std::future::Ready<Result<Response<Body>, Infallible>>,
    >,
>;

fn ok(_req: Request<Body>) -> std::future::Ready<Result<Response<Body>, Infallible>> {
    std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(b"ok")))))
}

/// The store's timeout. Calls to a Redis that is up must never run out of it, even on a machine
/// busy with other builds (a call that did would be a failure the test did not cause); the
/// requests that meet a paused Redis wait for it together.
const TIMEOUT: Duration = Duration::from_secs(1);

/// How long a probe's answer may take to come (it has the store's time to connect).
const PROBE_ANSWER: Duration = Duration::from_secs(10);

/// The breaker's line when a probe closes it.
const CLOSED: &str = "rate-limit store answers again: circuit breaker closed";

/// The breaker's (debug) line when a probe fails.
const PROBE_FAILED: &str = "rate-limit store: probe failed";

/// The app: a global rule of 10 a day on Redis ([`TIMEOUT`]), the breaker on `clock` with its
/// defaults except one warning line per hour (so that the count does not depend on how many
/// recovery attempts the test makes).
async fn app(server: &RedisServer, clock: &ManualClock, policy: FailurePolicy) -> App {
    app_warning_every(server, clock, policy, Duration::from_secs(3_600)).await
}

/// [`app`] with one warning line per `warn_every`.
async fn app_warning_every(
    server: &RedisServer,
    clock: &ManualClock,
    policy: FailurePolicy,
    warn_every: Duration,
) -> App {
    let store = RedisStore::builder()
        .url(server.url())
        .timeout(TIMEOUT)
        .build()
        .await
        .unwrap();
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("global", Limit::per_day(10)))
        .store(store)
        .on_store_failure(policy)
        .circuit_breaker(
            CircuitBreaker::new()
                .clock(clock.clone())
                .warn_interval(warn_every),
        )
        .build()
        .unwrap();
    layer.layer(service_fn(ok as fn(_) -> _))
}

/// A request whose answer needs no waiting: ready at its first poll.
fn at_once(app: &App) -> Response<tollgate::middleware::ResponseBody<Body>> {
    let mut app = app.clone();
    let ready = app.ready().now_or_never().expect("ready").unwrap();
    ready
        .call(request())
        .now_or_never()
        .expect("answered without waiting for Redis")
        .unwrap()
}

async fn send(app: &App) -> Response<tollgate::middleware::ResponseBody<Body>> {
    app.clone().oneshot(request()).await.unwrap()
}

/// `n` requests at once (while Redis is down, each waits for its failure together with the
/// others, not after them).
async fn send_together(
    app: &App,
    n: usize,
) -> Vec<Response<tollgate::middleware::ResponseBody<Body>>> {
    futures::future::join_all((0..n).map(|_| send(app))).await
}

/// Probes until one closes the breaker (each past the longest probe interval: it is due), at
/// most 5 times; then the answer of the next request, the first to reach Redis again.
async fn recover(
    app: &App,
    clock: &ManualClock,
    lines: &Lines,
    snapshotter: &Snapshotter,
) -> Response<tollgate::middleware::ResponseBody<Body>> {
    let mut sent = 0;
    let mut probed = Vec::new();
    while probed.last() != Some(&Probed::Closed) {
        assert!(probed.len() < 5, "no recovery: {probed:?}");
        probed.push(probe(app, clock, lines, snapshotter, 30, &mut sent).await);
    }
    send(app).await
}

fn healthy(snapshotter: &Snapshotter) -> f64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find_map(|(key, _, _, value)| match value {
            DebugValue::Gauge(v) if key.key().name() == "tollgate_store_healthy" => Some(v.0),
            _ => None,
        })
        .expect("the gauge is registered")
}

#[test]
fn outages_paused_killed_restarted_5_failures_open_the_breaker_then_100_requests_wait_for_nothing()
{
    let (lines, snapshotter) = globals();
    let _serial = one_at_a_time();
    runtime().block_on(async {
        paused_fail_closed(lines, snapshotter).await;
        killed_fail_open(lines, snapshotter).await;
        restarted_fail_to_local(lines, snapshotter).await;
    });
}

/// Paused Redis, fail closed: 5 requests time out (503), the breaker opens; 100 more get 503 at
/// once with `Retry-After: 1` (the next probe) and a plain message, and Redis receives none of
/// them. Two warning lines (the first failure, the opening), one more when it closes.
async fn paused_fail_closed(lines: &Lines, snapshotter: &Snapshotter) {
    let server = ENGINE.server();
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let app = app(&server, &clock, FailurePolicy::Closed).await;
    assert_eq!(send(&app).await.status(), StatusCode::OK);
    assert_eq!(healthy(snapshotter), 1.0);
    lines.take_warnings();
    server.pause();
    for response in send_together(&app, 5).await {
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()["retry-after"], "1");
    }
    assert_eq!(healthy(snapshotter), 0.0);
    for _ in 0..100 {
        let response = at_once(&app);
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()["retry-after"], "1");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body["detail"],
            "The rate limiter cannot decide right now; try again in 1 s."
        );
    }
    server.resume();
    // The first request and at most the 5 that timed out (sent, answered late): none of the 100.
    let calls = server.command_calls("evalsha");
    assert!(calls <= 6, "Redis saw {calls} calls");
    let warnings = lines.take_warnings();
    assert_eq!(warnings.len(), 2, "{warnings:#?}");
    assert!(
        warnings[0].contains("1 failed decision(s)"),
        "{}",
        warnings[0]
    );
    assert!(warnings[1].contains("opened after 5 consecutive failures"));
    assert!(warnings[1].contains("refused with 503 (fail closed)"));
    // Resumed: a probe closes the breaker; requests reach Redis again, no restart of the app.
    let response = recover(&app, &clock, lines, snapshotter).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(healthy(snapshotter), 1.0);
    let warnings = lines.take_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(
        warnings[0].contains("circuit breaker closed"),
        "{}",
        warnings[0]
    );
}

/// Killed Redis, fail open: every request is forwarded unlimited (no `RateLimit` field); after 5
/// failures the breaker opens and 100 requests are forwarded at once. Restarted on the same
/// port, the breaker closes by itself and Redis counts again.
async fn killed_fail_open(lines: &Lines, snapshotter: &Snapshotter) {
    let mut server = ENGINE.server();
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let app = app(&server, &clock, FailurePolicy::Open).await;
    let first = send(&app).await;
    assert_eq!(first.headers()["ratelimit"], "\"global\";r=9;t=8640");
    lines.take_warnings();
    server.kill();
    for response in send_together(&app, 5).await {
        assert_eq!(response.status(), StatusCode::OK);
        assert!(!response.headers().contains_key("ratelimit"));
    }
    for _ in 0..100 {
        let response = at_once(&app);
        assert_eq!(response.status(), StatusCode::OK);
        assert!(!response.headers().contains_key("ratelimit"));
    }
    assert_eq!(healthy(snapshotter), 0.0);
    let warnings = lines.take_warnings();
    assert_eq!(warnings.len(), 2, "{warnings:#?}");
    assert!(warnings[1].contains("forwarded unlimited (fail open)"));
    server.restart();
    let response = recover(&app, &clock, lines, snapshotter).await;
    // The restarted server is empty: a new count.
    assert_eq!(response.headers()["ratelimit"], "\"global\";r=9;t=8640");
    assert_eq!(healthy(snapshotter), 1.0);
    assert_eq!(lines.take_warnings().len(), 1);
}

/// Redis restarted under fail to local with a share of 0.5: while it is down, the instance
/// grants 5 of the 10 on its own (then 429); once the breaker closes, Redis decides again.
async fn restarted_fail_to_local(lines: &Lines, snapshotter: &Snapshotter) {
    let mut server = ENGINE.server();
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let app = app(&server, &clock, FailurePolicy::Local { share: 0.5 }).await;
    assert_eq!(send(&app).await.status(), StatusCode::OK);
    lines.take_warnings();
    server.kill();
    let mut statuses: Vec<u16> = send_together(&app, 5)
        .await
        .iter()
        .map(|response| response.status().as_u16())
        .collect();
    for _ in 0..5 {
        statuses.push(at_once(&app).status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429, 429, 429]);
    let warnings = lines.take_warnings();
    assert_eq!(warnings.len(), 2, "{warnings:#?}");
    assert!(warnings[1].contains("decided locally with 0.5 of each limit"));
    server.restart();
    let response = recover(&app, &clock, lines, snapshotter).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["ratelimit"], "\"global\";r=9;t=8640");
    assert_eq!(healthy(snapshotter), 1.0);
    assert_eq!(lines.take_warnings().len(), 1);
}

/// What the breaker made of a probe.
#[derive(Debug, PartialEq)]
enum Probed {
    /// It closed: requests reach Redis again.
    Closed,
    /// It stays open, and probes again this many seconds later.
    Failed(u64),
}

/// One probe and its answer: moves the breaker's clock `due` seconds on, to its next probe
/// time, and sends one request, which the open breaker answers by its failure policy and which
/// starts the probe in the background (counted in `sent`). Then it waits for the breaker's
/// answer to the probe, sending nothing meanwhile: the line saying it closed (then the gauge,
/// set right after the line), or the probe's failure line with the next interval.
async fn probe(
    app: &App,
    clock: &ManualClock,
    lines: &Lines,
    snapshotter: &Snapshotter,
    due: u64,
    sent: &mut u64,
) -> Probed {
    assert_eq!(healthy(snapshotter), 0.0, "the breaker is open");
    let mark = lines.mark();
    clock.advance(Duration::from_secs(due));
    send(app).await;
    *sent += 1;
    let answer = lines
        .wait_for(mark, PROBE_ANSWER, |line| {
            line.contains(CLOSED) || line.contains(PROBE_FAILED)
        })
        .await
        .unwrap_or_else(|| panic!("no answer to the probe within {PROBE_ANSWER:?}"));
    if answer.contains(PROBE_FAILED) {
        let next: u64 = answer
            .split("next_probe_ms=")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("no next_probe_ms in {answer}"));
        return Probed::Failed(next / 1_000);
    }
    // The breaker writes the line, opens the way to Redis, then sets the gauge.
    let deadline = std::time::Instant::now() + PROBE_ANSWER;
    while healthy(snapshotter) != 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the gauge never read 1: {answer}"
        );
        tokio::task::yield_now().await;
    }
    Probed::Closed
}

/// The count of a warning line saying "… N failed decision(s) since the last warning …".
fn failed_in(line: &str) -> u64 {
    let before = line
        .split(" failed decision(s) since the last warning")
        .next()
        .filter(|before| before.len() < line.len())
        .unwrap_or_else(|| panic!("not a count: {line}"));
    before
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a count: {line}"))
}

/// Redis killed, then started again on the same port: a probe while it is down fails, and the
/// first probe after it is back closes the breaker (no second, doubled wait while Redis is
/// ready and requests go unlimited).
#[test]
fn restarted_on_the_same_port_the_first_probe_after_redis_is_back_closes_the_breaker() {
    let (lines, snapshotter) = globals();
    let _serial = one_at_a_time();
    runtime().block_on(async {
        let mut server = ENGINE.server();
        let clock = ManualClock::new(Duration::from_secs(1_000));
        let app = app(&server, &clock, FailurePolicy::Closed).await;
        assert_eq!(send(&app).await.status(), StatusCode::OK);
        server.kill();
        for response in send_together(&app, 5).await {
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        }
        assert_eq!(healthy(snapshotter), 0.0);
        let mut sent = 0;
        assert_eq!(
            probe(&app, &clock, lines, snapshotter, 1, &mut sent).await,
            Probed::Failed(2)
        );
        // Redis stays down for 2 s, longer than the Redis client's own attempts to reconnect
        // take (well under a second), as in a real outage: the first probe after it is back
        // meets the failure the client kept from its last attempt. This is the outage's length,
        // not a wait for something to happen: were the client still trying when Redis comes
        // back (a very busy machine), it would connect by itself, and the probe would close the
        // breaker all the same.
        tokio::time::sleep(Duration::from_secs(2)).await;
        lines.take_warnings();
        server.restart();
        assert_eq!(
            probe(&app, &clock, lines, snapshotter, 2, &mut sent).await,
            Probed::Closed
        );
        // Redis decides again (restarted empty: a new count).
        let response = send(&app).await;
        assert_eq!(response.headers()["ratelimit"], "\"global\";r=9;t=8640");
        let warnings = lines.take_warnings();
        assert_eq!(warnings.len(), 1, "{warnings:#?}");
        assert!(warnings[0].contains("circuit breaker closed after 3.0 s"));
    });
}

/// Redis out of memory (`maxmemory` below what it uses, `noeviction`): every charge is refused
/// with `OOM`, while `PING` still answers. The probe charges like a request, so it fails too: the
/// breaker stays open and probes at 1, 2, 4, 8, 16 s, each probe a write Redis refuses, and the
/// warnings stay at one line per 10 s, each with its count.
#[test]
fn out_of_memory_the_probe_is_refused_like_a_charge_and_the_breaker_stays_open() {
    let (lines, snapshotter) = globals();
    let _serial = one_at_a_time();
    runtime().block_on(async {
        let server = ENGINE.server_with(&["--maxmemory-policy", "noeviction"]);
        let clock = ManualClock::new(Duration::from_secs(1_000));
        let every = Duration::from_secs(10);
        let app = app_warning_every(&server, &clock, FailurePolicy::Closed, every).await;
        assert_eq!(send(&app).await.status(), StatusCode::OK);
        lines.take_warnings();
        server.run("CONFIG SET maxmemory 1");
        assert!(server.run("SET filler 1").starts_with("-OOM"));
        assert!(server.run("PING").starts_with("+PONG"));
        // A charge is one `PSETEX` in the script: Redis counts those it refuses.
        let refused_writes = || redis_server::command_stat(server.port, "psetex", 7);
        let mut failed = 0;
        for _ in 0..5 {
            let response = send(&app).await;
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            failed += 1;
        }
        assert_eq!(healthy(snapshotter), 0.0);
        assert_eq!(refused_writes(), 5);
        for (due, next) in [(1, 2), (2, 4), (4, 8), (8, 16), (16, 30)] {
            for _ in 0..10 {
                let response = at_once(&app);
                assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
                assert_eq!(response.headers()["retry-after"], due.to_string().as_str());
                failed += 1;
            }
            assert_eq!(
                probe(&app, &clock, lines, snapshotter, due, &mut failed).await,
                Probed::Failed(next)
            );
        }
        // Five probes reached Redis, each a write it refused; no request did.
        assert_eq!(refused_writes(), 5 + 5);
        // 10 s after the last line, one more: every failed decision is in some line's count.
        clock.advance(every);
        at_once(&app);
        failed += 1;
        let warnings = lines.take_warnings();
        // The first failure, the opening, then one line per 10 s (at 15, 31 and 41 s).
        assert_eq!(warnings.len(), 5, "{warnings:#?}");
        assert_eq!(failed_in(&warnings[0]), 1, "{}", warnings[0]);
        assert!(warnings[1].contains("opened after 5 consecutive failures"));
        let counted: u64 = warnings[2..].iter().map(|line| failed_in(line)).sum();
        assert_eq!(counted, failed - 1, "{warnings:#?}");
        assert_eq!(healthy(snapshotter), 0.0);
    });
}
