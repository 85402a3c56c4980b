//! Queue mode with tokio's paused time: requests leave at exactly their reserved instants.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;
use tollgate::{Cost, Limit, Limiter, Queue, Rule};
use tower::{service_fn, Layer, Service, ServiceExt};

use crate::support::oneshot;
use oneshot::Limited;

use crate::support::paused;

use crate::support::calendar;
use crate::support::reservations;

type Body = Full<Bytes>;

/// When (since `start`) each request id reached the inner service.
type Arrivals = Arc<Mutex<Vec<(u32, Duration)>>>;

fn recording(
    start: Instant,
) -> (
    Arrivals,
    impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone,
) {
    let arrivals = Arrivals::default();
    let seen = arrivals.clone();
    let service = service_fn(move |req: Request<Body>| {
        let id = req.headers()["x-id"].to_str().unwrap().parse().unwrap();
        seen.lock().unwrap().push((id, start.elapsed()));
        async { Ok::<_, Infallible>(Response::new(Body::default())) }
    });
    (arrivals, service)
}

fn request(id: u32, cost: Option<u64>) -> Request<Body> {
    let mut req = Request::get("/")
        .header("x-id", id)
        .body(Body::default())
        .unwrap();
    if let Some(cost) = cost {
        req.headers_mut().insert("x-cost", HeaderValue::from(cost));
    }
    req
}

/// Sends all requests at the same instant; returns each one's status and `Tollgate-Delay`.
async fn burst<S>(service: &S, requests: Vec<Request<Body>>) -> Vec<(StatusCode, Option<String>)>
where
    S: Limited<Body> + Send + 'static,
    S::Future: Send,
{
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|req| {
            let service = service.clone();
            tokio::spawn(async move {
                let response = service.oneshot(req).await.unwrap();
                let delay = response
                    .headers()
                    .get("tollgate-delay")
                    .map(|v| v.to_str().unwrap().to_owned());
                (response.status(), delay)
            })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

fn secs(list: &[u64]) -> Vec<Duration> {
    list.iter().map(|&s| Duration::from_secs(s)).collect()
}

fn arrival_times(arrivals: &Arrivals) -> Vec<Duration> {
    let mut times: Vec<_> = arrivals.lock().unwrap().iter().map(|&(_, at)| at).collect();
    times.sort();
    times
}

/// nginx `limit_req rate=1r/s burst=5` with seven simultaneous requests.
#[tokio::test(start_paused = true)]
async fn nginx_burst_five() {
    let (arrivals, inner) = recording(Instant::now());
    let layer = paused::layer(Rule::new("r", Limit::per_second(1)).queue(Queue::burst(5)));
    let results = burst(
        &layer.layer(inner),
        (0..7).map(|i| request(i, None)).collect(),
    )
    .await;
    let statuses: Vec<_> = results.iter().map(|r| r.0).collect();
    assert_eq!(statuses[..6], [StatusCode::OK; 6]);
    assert_eq!(statuses[6], StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(arrival_times(&arrivals), secs(&[0, 1, 2, 3, 4, 5]));
    let delays: Vec<_> = results.iter().map(|r| r.1.as_deref()).collect();
    assert_eq!(
        delays,
        [
            None,
            Some("1"),
            Some("2"),
            Some("3"),
            Some("4"),
            Some("5"),
            None
        ]
    );
}

/// `burst=5 delay=2`: three pass at once, three are spaced, one is rejected.
#[tokio::test(start_paused = true)]
async fn nginx_burst_five_delay_two() {
    let (arrivals, inner) = recording(Instant::now());
    let layer = paused::layer(Rule::new("r", Limit::per_second(1)).queue(Queue::burst(5).delay(2)));
    let results = burst(
        &layer.layer(inner),
        (0..7).map(|i| request(i, None)).collect(),
    )
    .await;
    assert_eq!(results.iter().filter(|r| r.0 == StatusCode::OK).count(), 6);
    assert_eq!(arrival_times(&arrivals), secs(&[0, 0, 0, 1, 2, 3]));
}

/// `burst=5 nodelay`: six pass at once, one is rejected, and the slots refill at the rate.
#[tokio::test(start_paused = true)]
async fn nginx_burst_five_nodelay() {
    let start = Instant::now();
    let (arrivals, inner) = recording(start);
    let layer =
        paused::layer(Rule::new("r", Limit::per_second(1)).queue(Queue::burst(5).nodelay()));
    let service = layer.layer(inner);
    let results = burst(&service, (0..7).map(|i| request(i, None)).collect()).await;
    assert_eq!(results.iter().filter(|r| r.0 == StatusCode::OK).count(), 6);
    assert_eq!(arrival_times(&arrivals), secs(&[0; 6]));
    assert_eq!(results[6].0, StatusCode::TOO_MANY_REQUESTS);
    tokio::time::advance(Duration::from_secs(1)).await;
    let after = burst(&service, (7..9).map(|i| request(i, None)).collect()).await;
    assert_eq!(
        after.iter().map(|r| r.0).collect::<Vec<_>>(),
        [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]
    );
}

#[tokio::test(start_paused = true)]
async fn requests_leave_at_the_rate_and_the_bound_rejects_the_rest() {
    let (arrivals, inner) = recording(Instant::now());
    // 4 per second: one every 250 ms once the burst of 4 is spent; at most 8 may wait.
    let layer = paused::layer(Rule::new("r", Limit::per_second(4)).queue(Queue::burst(8)));
    let results = burst(
        &layer.layer(inner),
        (0..15).map(|i| request(i, None)).collect(),
    )
    .await;
    assert_eq!(results.iter().filter(|r| r.0 == StatusCode::OK).count(), 12);
    let expected: Vec<Duration> = [0, 0, 0, 0, 250, 500, 750, 1000, 1250, 1500, 1750, 2000]
        .iter()
        .map(|&ms| Duration::from_millis(ms))
        .collect();
    assert_eq!(arrival_times(&arrivals), expected);
    // The rejected ones are told when they could queue again: one slot frees every 250 ms.
    let denied = results
        .iter()
        .filter(|r| r.0 == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!(denied, 3);
}

#[tokio::test(start_paused = true)]
async fn max_delay_bounds_the_wait() {
    let (arrivals, inner) = recording(Instant::now());
    let layer = paused::layer(
        Rule::new("r", Limit::per_second(2)).queue(Queue::max_delay(Duration::from_millis(1_000))),
    );
    let results = burst(
        &layer.layer(inner),
        (0..6).map(|i| request(i, None)).collect(),
    )
    .await;
    // Two at once, then waits of 500 ms and 1 s; a third would wait 1.5 s.
    assert_eq!(results.iter().filter(|r| r.0 == StatusCode::OK).count(), 4);
    assert_eq!(
        arrival_times(&arrivals),
        [0, 0, 500, 1000].map(Duration::from_millis).to_vec()
    );
}

#[tokio::test(start_paused = true)]
async fn a_large_request_keeps_its_place_among_small_ones() {
    let (arrivals, inner) = recording(Instant::now());
    let layer = paused::layer(
        Rule::new("tokens", Limit::per_second(10))
            .cost(Cost::header(HeaderName::from_static("x-cost")))
            .queue(Queue::burst(100)),
    );
    let service = layer.layer(inner);
    // Drain the bucket, then queue: small, large, small, small — in this order.
    let costs = [10, 1, 8, 1, 1];
    let sent: Vec<_> = costs
        .iter()
        .enumerate()
        .map(|(i, &c)| request(i as u32, Some(c)))
        .collect();
    let results = burst(&service, sent).await;
    assert!(results.iter().all(|r| r.0 == StatusCode::OK));
    let mut order: Vec<(u32, Duration)> = arrivals.lock().unwrap().clone();
    order.sort_by_key(|&(id, at)| (at, id));
    let ids: Vec<u32> = order.iter().map(|&(id, _)| id).collect();
    assert_eq!(ids, [0, 1, 2, 3, 4], "first in, first out");
    // 10 units per second = one unit per 100 ms; each request leaves when its last unit is paid.
    let times: Vec<Duration> = order.iter().map(|&(_, at)| at).collect();
    assert_eq!(
        times,
        [0, 100, 900, 1000, 1100]
            .map(Duration::from_millis)
            .to_vec()
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_request_gives_its_slot_back() {
    let (arrivals, inner) = recording(Instant::now());
    let layer = paused::layer(Rule::new("r", Limit::per_second(1)).queue(Queue::burst(3)));
    let service = layer.layer(inner);
    assert_eq!(
        burst(&service, vec![request(0, None)]).await[0].0,
        StatusCode::OK
    );
    // Request 1 queues for the 1 s slot; its client goes away after 100 ms.
    let waiting = tokio::spawn(service.clone().oneshot(request(1, None)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    // The next request gets the 1 s slot the cancelled one had, not the 2 s slot after it.
    let results = burst(&service, vec![request(2, None)]).await;
    assert_eq!(results[0].1.as_deref(), Some("0.9"));
    let times = arrival_times(&arrivals);
    assert_eq!(times, [0, 1000].map(Duration::from_millis).to_vec());
    // And the limiter agrees: nothing is owed beyond that one slot.
    let outcome = layer.limiter().check("r", "", 0).await.unwrap();
    assert_eq!(outcome.remaining, 0);
    assert!(outcome.is_allowed());
}

#[tokio::test(start_paused = true)]
async fn reservations_for_jobs() {
    let limiter = Limiter::builder()
        .store(paused::store())
        .rule(
            Rule::new("llm", Limit::per_minute(6_000))
                .queue(Queue::max_delay(Duration::from_secs(60))),
        )
        .rule(Rule::new("plain", Limit::per_minute(10)))
        .build()
        .unwrap();
    let first = limiter.reserve("llm", "tenant", 6_000).await.unwrap();
    assert!(first.is_granted());
    assert_eq!(first.wait(), Duration::ZERO);
    let second = limiter.reserve("llm", "tenant", 3_000).await.unwrap();
    assert_eq!(second.wait(), Duration::from_secs(30));
    let too_far = limiter.reserve("llm", "tenant", 4_000).await.unwrap();
    assert!(!too_far.is_granted());
    // It could queue once its wait fits in 60 s: after 10 s.
    assert_eq!(too_far.retry_after(), Some(Duration::from_secs(10)));

    let started = Instant::now();
    second.ready().await;
    assert_eq!(started.elapsed(), Duration::from_secs(30));

    let third = limiter.reserve("llm", "tenant", 3_000).await.unwrap();
    assert_eq!(third.wait(), Duration::from_secs(30));
    third.cancel().await.unwrap();
    assert_eq!(
        limiter
            .reserve("llm", "tenant", 3_000)
            .await
            .unwrap()
            .wait(),
        Duration::from_secs(30)
    );

    assert!(matches!(
        limiter.reserve("plain", "k", 1).await,
        Err(tollgate::LimitError::NotQueued(_))
    ));
}

#[tokio::test]
async fn fixed_window_reservations_have_the_exact_waits_of_the_design() {
    let clock = tollgate::clock::ManualClock::new(reservations::W);
    let mut builder = Limiter::builder().store(tollgate::MemoryStore::with_clock(clock.clone()));
    for rule in reservations::rules() {
        builder = builder.rule(rule);
    }
    let limiter = builder.build().unwrap();
    reservations::example(&limiter, &clock).await;
    reservations::several_rules(&limiter).await;
}

#[tokio::test]
async fn calendar_windows_follow_the_calendar() {
    let clock = tollgate::clock::ManualClock::new(calendar::START);
    let mut builder = Limiter::builder().store(tollgate::MemoryStore::with_clock(clock.clone()));
    for rule in calendar::rules() {
        builder = builder.rule(rule);
    }
    calendar::scenario(&builder.build().unwrap(), &clock).await;
}

/// Queue mode on a fixed window: 10 per minute, up to 11 units owed. The window starts when the
/// test does (aligned to the clock's first reading).
#[tokio::test(start_paused = true)]
async fn a_queued_fixed_window_holds_requests_until_the_window_that_pays_them_back() {
    use tollgate::clock::Clock;
    let clock = tollgate::clock::TokioClock::new();
    let start = Duration::from_micros(clock.now());
    let rule = Rule::new(
        "fw",
        Limit::fixed_window(10, Duration::from_secs(60)).aligned_at(start),
    )
    .queue(Queue::burst(11));
    let layer = tollgate::RateLimitLayer::builder()
        .store(tollgate::MemoryStore::with_clock(clock))
        .rule(rule)
        .build()
        .unwrap();
    let (arrivals, inner) = recording(Instant::now());
    let service = layer.layer(inner);
    // 16 at the window's start: 10 pass, 6 wait for the next window.
    let first = tokio::spawn({
        let service = service.clone();
        async move { burst(&service, (0..16).map(|id| request(id, None)).collect()).await }
    });
    tokio::time::sleep(Duration::from_secs(30)).await;
    // At +30 s, six more: the next window's 10 units pay for the first 4 of them too (the debt
    // goes from 6 to 10), so they wait 30 s; the 5th owes 11 and waits for the window after
    // (+120 s); the 6th would owe 12, past the bound, and is told it could queue at +60 s.
    let second = burst(&service, (16..22).map(|id| request(id, None)).collect()).await;
    let answers: Vec<_> = second
        .iter()
        .map(|(status, delay)| (status.as_u16(), delay.as_deref()))
        .collect();
    assert_eq!(
        answers,
        [
            (200, Some("30")),
            (200, Some("30")),
            (200, Some("30")),
            (200, Some("30")),
            (200, Some("90")),
            (429, None)
        ]
    );
    let first = first.await.unwrap();
    assert!(first.iter().all(|(status, _)| *status == StatusCode::OK));
    let delays: Vec<_> = first.iter().map(|(_, delay)| delay.as_deref()).collect();
    let mut expected = vec![None; 10];
    expected.extend(vec![Some("60"); 6]);
    assert_eq!(delays, expected);
    let mut want = vec![Duration::ZERO; 10];
    want.extend([Duration::from_secs(60); 10]);
    want.push(Duration::from_secs(120));
    assert_eq!(arrival_times(&arrivals), want);
}

#[test]
fn queue_settings_that_cannot_work_are_build_errors() {
    let error = |rule: Rule| {
        paused::builder()
            .rule(rule)
            .build()
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        error(Rule::new("w", Limit::sliding_window(5, Duration::from_secs(1))).queue(Queue::burst(3))),
        "rule \"w\": queue: queue mode needs a token bucket (a queued token bucket is a leaky bucket), a fixed window or a concurrency limit"
    );
    assert_eq!(
        error(Rule::new("w", Limit::fixed_window(5, Duration::from_secs(1))).queue(Queue::burst(3).delay(1))),
        "rule \"w\": queue.delay: a fixed window lets no excess pass at once: raise its limit instead"
    );
    assert_eq!(
        error(Rule::new("q", Limit::per_second(5)).queue(Queue::burst(2).delay(3))),
        "rule \"q\": queue.delay: must be at most the burst (2)"
    );
    assert_eq!(
        error(Rule::new("q", Limit::per_second(5)).cost(4).queue(Queue::burst(3))),
        "rule \"q\": queue.burst: lets 3 units wait, less than the cost (4): a request arriving at an empty bucket could never queue"
    );
    assert_eq!(
        error(Rule::new("q", Limit::per_second(5)).queue(Queue::default())),
        "rule \"q\": queue: needs a bound: a burst, a max_delay, or both"
    );
}
