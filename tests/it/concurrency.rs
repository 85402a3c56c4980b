//! Concurrency limits (DESIGN §12) on the memory store: exactly `n` requests of a key in flight,
//! slots held to the end of the response body and given back on every other way out, all or
//! nothing with the request's other rules, and queue mode's line of waiters.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use tollgate::config::Config;
use tollgate::middleware::ResponseBody;
use tollgate::{Key, Limit, LimitError, Limiter, Penalty, Queue, RateLimitLayer, Rule};
use tower::{service_fn, Layer, Service, ServiceExt};

use crate::support::paused;
use crate::support::stores;
use crate::support::streams;

use streams::{called, end, streaming, Open, Streaming};

fn request(key: &str, id: u32) -> Request<Full<Bytes>> {
    Request::get("/v1/chat")
        .header("x-api-key", key)
        .header("x-id", id)
        .body(Full::default())
        .unwrap()
}

fn header<B>(response: &Response<B>, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

async fn free_slots(limiter: &Limiter, rule: &str, key: &str) -> u64 {
    limiter.check(rule, key, 0).await.unwrap().remaining
}

const API_KEY: http::HeaderName = http::HeaderName::from_static("x-api-key");

fn llm(n: u64) -> Rule {
    Rule::new("llm", Limit::concurrent(n)).key(Key::header(API_KEY))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_n_in_flight_under_1000_concurrent_requests() {
    let layer = RateLimitLayer::new(llm(8));
    let (open, app) = streaming(&layer);
    let tasks: Vec<_> = (0..1000)
        .map(|id| {
            let app = app.clone();
            tokio::spawn(async move { app.oneshot(request("alice", id)).await.unwrap() })
        })
        .collect();
    let mut admitted = Vec::new();
    let mut denied = 0;
    for task in tasks {
        let response = task.await.unwrap();
        match response.status() {
            StatusCode::OK => admitted.push(response),
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(header(&response, "retry-after").as_deref(), Some("1"));
                denied += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    // Every body is still open: exactly 8 reached the service, the other 992 were refused.
    assert_eq!((admitted.len(), denied), (8, 992));
    assert_eq!(called(&open).len(), 8);
    let limiter = layer.limiter();
    assert_eq!(free_slots(limiter, "llm", "alice").await, 0);
    assert_eq!(free_slots(limiter, "llm", "bob").await, 8);

    // One body ends: one slot comes back, and exactly one more request gets in.
    end(&open, called(&open)[0]);
    let ended = admitted
        .iter_mut()
        .position(|response| {
            // Only the ended body answers at once (with its end); the others wait for frames.
            futures::FutureExt::now_or_never(response.body_mut().frame()).is_some()
        })
        .expect("the ended body");
    admitted.remove(ended);
    assert_eq!(free_slots(limiter, "llm", "alice").await, 1);
    let next = app.clone().oneshot(request("alice", 1000)).await.unwrap();
    assert_eq!(next.status(), StatusCode::OK);
    let refused = app.clone().oneshot(request("alice", 1001)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);

    // Every body ends (dropped): every slot comes back.
    drop((admitted, next));
    open.lock().unwrap().clear();
    assert_eq!(free_slots(limiter, "llm", "alice").await, 8);
}

#[tokio::test]
async fn a_streaming_body_holds_its_slot_to_its_end() {
    let layer = RateLimitLayer::new(llm(1));
    let (open, app) = streaming(&layer);
    let response = app.clone().oneshot(request("alice", 1)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let sender = open.lock().unwrap()[0].1.clone();
    for chunk in ["Once", " upon", " a time"] {
        sender
            .unbounded_send(Ok(Frame::data(Bytes::from(chunk))))
            .unwrap();
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), chunk);
        // Mid-stream, the slot is still taken.
        let refused = app.clone().oneshot(request("alice", 2)).await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    drop(sender);
    end(&open, 1);
    assert!(body.frame().await.is_none());
    // The body has ended (the value itself still lives): its slot is back.
    let next = app.clone().oneshot(request("alice", 3)).await.unwrap();
    assert_eq!(next.status(), StatusCode::OK);
    drop(body);
}

#[tokio::test]
async fn a_dropped_body_gives_its_slot_back() {
    let layer = RateLimitLayer::new(llm(1));
    let (_open, app) = streaming(&layer);
    let response = app.clone().oneshot(request("alice", 1)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let refused = app.clone().oneshot(request("alice", 2)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // The client went away before reading anything: the server drops the body.
    drop(response);
    let next = app.clone().oneshot(request("alice", 3)).await.unwrap();
    assert_eq!(next.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_dropped_request_or_a_failed_service_gives_its_slot_back() {
    let layer = RateLimitLayer::new(llm(1));
    // The service answers request 1 never, fails request 2, and answers the others.
    let service = service_fn(|req: Request<Full<Bytes>>| async move {
        match req.headers()["x-id"].to_str().unwrap() {
            "1" => std::future::pending().await,
            "2" => Err("the model crashed"),
            _ => Ok(Response::new(Full::<Bytes>::default())),
        }
    });
    let mut app = layer.layer(service);
    let mut call = Box::pin(app.ready().await.unwrap().call(request("alice", 1)));
    assert!(futures::poll!(call.as_mut()).is_pending());
    let refused = app.clone().oneshot(request("alice", 9)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // The client hangs up while the service still works on it.
    drop(call);
    let failed = app.clone().oneshot(request("alice", 2)).await;
    assert_eq!(failed.unwrap_err(), "the model crashed");
    let next = app.clone().oneshot(request("alice", 3)).await.unwrap();
    assert_eq!(next.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_denial_names_the_rule_says_one_second_and_counts_slots_in_the_drafts_concurrency_unit() {
    let layer = RateLimitLayer::builder()
        .rule(llm(1))
        .rule(Rule::new("rpm", Limit::per_minute(100)).key(Key::header(API_KEY)))
        .build()
        .unwrap();
    let (_open, app) = streaming(&layer);
    let held = app.clone().oneshot(request("alice", 1)).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    // The concurrency rule's quota is in the draft's `concurrent-requests` unit, with no window
    // and no time until it grows: a slot comes back when a response ends.
    assert_eq!(
        header(&held, "ratelimit-policy").as_deref(),
        Some("\"llm\";q=1;qu=\"concurrent-requests\", \"rpm\";q=100;w=60")
    );
    assert_eq!(
        header(&held, "ratelimit").as_deref(),
        Some("\"llm\";r=0, \"rpm\";r=99;t=1")
    );

    let refused = app.clone().oneshot(request("alice", 2)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "retry-after").as_deref(), Some("1"));
    assert_eq!(
        header(&refused, "ratelimit-policy").as_deref(),
        Some("\"llm\";q=1;qu=\"concurrent-requests\", \"rpm\";q=100;w=60")
    );
    assert_eq!(
        header(&refused, "ratelimit").as_deref(),
        Some("\"llm\";r=0, \"rpm\";r=99;t=1")
    );
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["violated-policies"], serde_json::json!(["llm"]));
    assert_eq!(
        problem["detail"],
        "Rate limit exceeded (llm); retry in 1 s."
    );

    // A layer with the concurrency rule alone: its item alone, the slots left before and after.
    let alone = RateLimitLayer::new(llm(2));
    let (_open, app) = streaming(&alone);
    let policy = "\"llm\";q=2;qu=\"concurrent-requests\"";
    let first = app.clone().oneshot(request("alice", 1)).await.unwrap();
    assert_eq!(header(&first, "ratelimit-policy").as_deref(), Some(policy));
    assert_eq!(header(&first, "ratelimit").as_deref(), Some("\"llm\";r=1"));
    let second = app.clone().oneshot(request("alice", 2)).await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(header(&second, "ratelimit").as_deref(), Some("\"llm\";r=0"));
    let refused = app.clone().oneshot(request("alice", 3)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&refused, "ratelimit-policy").as_deref(),
        Some(policy)
    );
    assert_eq!(
        header(&refused, "ratelimit").as_deref(),
        Some("\"llm\";r=0")
    );
    // The policy parses as the draft's Structured Field list, the unit a String.
    let parsed: sfv::List = sfv::Parser::new(policy).parse().unwrap();
    let sfv::ListEntry::Item(item) = &parsed[0] else {
        panic!("an item")
    };
    assert_eq!(
        item.params.get("qu"),
        Some(&sfv::BareItem::String(
            sfv::String::from_string("concurrent-requests".to_owned()).unwrap()
        ))
    );

    // Nor legacy `X-RateLimit-*` fields: a slot has no reset to report.
    let legacy = RateLimitLayer::builder()
        .rule(llm(1))
        .legacy_headers(true)
        .build()
        .unwrap();
    let (_legacy_open, legacy_app) = streaming(&legacy);
    let first = legacy_app
        .clone()
        .oneshot(request("alice", 1))
        .await
        .unwrap();
    let second = legacy_app
        .clone()
        .oneshot(request("alice", 2))
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    for response in [&first, &second] {
        assert!(header(response, "x-ratelimit-limit").is_none());
        assert!(header(response, "x-ratelimit-reset").is_none());
    }
    drop(first);

    // A gRPC call is told in gRPC's words.
    let grpc = Request::post("/llm.Chat/Complete")
        .header("x-api-key", "alice")
        .header("content-type", "application/grpc")
        .body(Full::default())
        .unwrap();
    let refused = app.clone().oneshot(grpc).await.unwrap();
    assert_eq!(refused.status(), StatusCode::OK);
    assert_eq!(header(&refused, "grpc-status").as_deref(), Some("8"));
    assert_eq!(
        header(&refused, "grpc-retry-pushback-ms").as_deref(),
        Some("1000")
    );
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn a_slot_is_taken_all_or_nothing_with_the_other_rules() {
    let layer = paused::builder()
        .rule(llm(1))
        .rule(Rule::new("daily", Limit::per_day(2)).key(Key::header(API_KEY)))
        .build()
        .unwrap();
    let limiter = layer.limiter().clone();
    let (open, app) = streaming(&layer);
    let a = app.clone().oneshot(request("alice", 1)).await.unwrap();
    assert_eq!(a.status(), StatusCode::OK);
    assert_eq!(free_slots(&limiter, "daily", "alice").await, 1);

    // Denied for lack of a slot: the daily quota is not charged.
    let b = app.clone().oneshot(request("alice", 2)).await.unwrap();
    assert_eq!(b.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(free_slots(&limiter, "daily", "alice").await, 1);

    drop(a);
    end(&open, 1);
    let c = app.clone().oneshot(request("alice", 3)).await.unwrap();
    assert_eq!(c.status(), StatusCode::OK);
    assert_eq!(free_slots(&limiter, "daily", "alice").await, 0);
    drop(c);

    // Denied by the daily quota: no slot is taken.
    let d = app.clone().oneshot(request("alice", 4)).await.unwrap();
    assert_eq!(d.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = d.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["violated-policies"], serde_json::json!(["daily"]));
    assert_eq!(free_slots(&limiter, "llm", "alice").await, 1);
}

/// Spawns request `id` and lets it run until it waits (the runtime has one thread).
async fn spawn_request<S>(app: &S, id: u32) -> tokio::task::JoinHandle<(StatusCode, Option<String>)>
where
    S: Service<
            Request<Full<Bytes>>,
            Response = Response<ResponseBody<Streaming>>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let app = app.clone();
    let task = tokio::spawn(async move {
        let response = app.oneshot(request("alice", id)).await.unwrap();
        let status = response.status();
        let delay = header(&response, "tollgate-delay");
        // Read to the end: the body (and its slot) lasts until the test ends it.
        response.into_body().collect().await.unwrap();
        (status, delay)
    });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    task
}

#[tokio::test(start_paused = true)]
async fn queued_requests_wait_for_a_slot_first_come_first_served() {
    let layer = paused::layer(llm(1).queue(Queue::burst(3)));
    let (open, app) = streaming(&layer);
    let a = spawn_request(&app, 1).await;
    let b = spawn_request(&app, 2).await;
    let c = spawn_request(&app, 3).await;
    let d = spawn_request(&app, 4).await;
    assert_eq!(called(&open), [1]);
    // Three wait (the burst): the fourth is refused at once.
    let e = spawn_request(&app, 5).await;
    let (status, _) = e.await.unwrap();
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);

    tokio::time::sleep(Duration::from_secs(2)).await;
    end(&open, 1);
    let (status, delay) = a.await.unwrap();
    assert_eq!((status, delay), (StatusCode::OK, None));
    tokio::task::yield_now().await;
    assert_eq!(called(&open), [2]);
    // A newcomer queues behind those already waiting, though it arrives as a slot frees and
    // runs before the first in line has looked.
    end(&open, 2);
    let f = spawn_request(&app, 6).await;
    assert_eq!(called(&open), [3]);
    for (id, next) in [(3, 4), (4, 6)] {
        end(&open, id);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(called(&open), [next]);
    }
    end(&open, 6);
    // B waited the two seconds A held its slot, and says so.
    assert_eq!(b.await.unwrap(), (StatusCode::OK, Some("2".to_owned())));
    for task in [c, d, f] {
        assert_eq!(task.await.unwrap().0, StatusCode::OK);
    }
}

#[tokio::test(start_paused = true)]
async fn a_newcomer_refused_by_a_full_line_is_told_only_of_the_rule_it_waited_for() {
    // It joined the line without asking the store: it has nothing true to say of `rpm`.
    let rpm = Rule::new("rpm", Limit::per_minute(100)).key(Key::header(API_KEY));
    let layer = paused::builder()
        .rule(rpm)
        .rule(llm(1).queue(Queue::burst(1)))
        .build()
        .unwrap();
    let (open, app) = streaming(&layer);
    let _holds = spawn_request(&app, 1).await;
    let _waits = spawn_request(&app, 2).await;
    assert_eq!(called(&open), [1]);
    let refused = app.clone().oneshot(request("alice", 3)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "retry-after").as_deref(), Some("1"));
    assert_eq!(
        header(&refused, "ratelimit").as_deref(),
        Some("\"llm\";r=0")
    );
    assert_eq!(
        header(&refused, "ratelimit-policy").as_deref(),
        Some("\"llm\";q=1;qu=\"concurrent-requests\"")
    );
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["violated-policies"], serde_json::json!(["llm"]));
    // Only the request that got in was charged by `rpm`.
    let limiter = layer.limiter();
    assert_eq!(
        limiter.check("rpm", "alice", 0).await.unwrap().remaining,
        99
    );
}

#[tokio::test(start_paused = true)]
async fn a_slot_freed_by_another_instance_is_found_by_looking_again_50_ms_then_doubling_to_500() {
    // Two instances share one store, as two app hosts share Redis (the store answers in 5 ms, as
    // a networked one does): nothing wakes a line when the other instance gives a slot back, so
    // the first in line asks again 50 ms after it joined, then 100, 200, 400, 500, 500 ms later.
    let shared = paused::store();
    let instance = || {
        RateLimitLayer::builder()
            .store(stores::Slow(shared.clone()))
            // Bounded, so that a slot never found is a 429, not a test that hangs.
            .rule(llm(1).queue(Queue::burst(4).within(Duration::from_secs(10))))
            .build()
            .unwrap()
    };
    let (one, two) = (instance(), instance());
    let (_, first) = streaming(&one);
    let (_, second) = streaming(&two);
    let ms = Duration::from_millis;
    let freed_at = |after: u64| {
        let first = first.clone();
        let second = second.clone();
        async move {
            let holder = first.oneshot(request("alice", 1)).await.unwrap();
            assert_eq!(holder.status(), StatusCode::OK);
            let start = tokio::time::Instant::now();
            let waiter = tokio::spawn(second.oneshot(request("alice", 2)));
            tokio::time::sleep(ms(after)).await;
            drop(holder);
            let response = waiter.await.unwrap().unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            start.elapsed()
        }
    };
    // It joins the line when the store's first answer comes (5 ms), so it looks at 55, 155, 355,
    // 755, 1,255 and 1,755 ms, and is admitted 5 ms after the look that finds the slot.
    assert_eq!(freed_at(400).await, ms(760));
    assert_eq!(freed_at(1_300).await, ms(1_760));
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_waits_no_longer_than_max_delay() {
    let layer = paused::layer(llm(1).queue(Queue::max_delay(Duration::from_secs(5))));
    let (open, app) = streaming(&layer);
    let _a = spawn_request(&app, 1).await;
    let b = spawn_request(&app, 2).await;
    tokio::time::sleep(Duration::from_millis(4_999)).await;
    assert!(!b.is_finished());
    tokio::time::sleep(Duration::from_millis(2)).await;
    let (status, _) = b.await.unwrap();
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(called(&open), [1]);
}

#[tokio::test]
async fn the_limiter_acquires_a_slot_as_a_guard() {
    let limiter = Limiter::builder()
        .rule(Rule::new("exports", Limit::concurrent(2)))
        .rule(Rule::new("rpm", Limit::per_minute(5)))
        .build()
        .unwrap();
    let first = limiter.acquire("exports", "acme").await.unwrap().unwrap();
    let second = limiter.acquire("exports", "acme").await.unwrap().unwrap();
    assert!(limiter.acquire("exports", "acme").await.unwrap().is_none());
    drop(first);
    let third = limiter.acquire("exports", "acme").await.unwrap();
    assert!(third.is_some());
    drop((second, third));
    assert_eq!(free_slots(&limiter, "exports", "acme").await, 2);
    // A reset forgets the slots taken; giving them back afterwards frees nothing twice.
    let held = limiter.acquire("exports", "acme").await.unwrap();
    let other = limiter.acquire("exports", "acme").await.unwrap();
    assert!(held.is_some() && other.is_some());
    limiter.reset("exports", "acme").await.unwrap();
    assert_eq!(free_slots(&limiter, "exports", "acme").await, 2);
    drop((held, other));
    assert_eq!(free_slots(&limiter, "exports", "acme").await, 2);
    assert!(matches!(
        limiter.acquire("rpm", "acme").await,
        Err(LimitError::NotConcurrent(rule)) if rule == "rpm"
    ));
}

#[test]
fn rules_that_cannot_work_are_errors_naming_the_rule_and_the_field() {
    let error = |rule: Rule| match RateLimitLayer::builder().rule(rule).build() {
        Ok(_) => panic!("accepted"),
        Err(error) => error.to_string(),
    };
    assert_eq!(
        error(Rule::new("llm", Limit::concurrent(0))),
        "rule \"llm\": concurrent: must be greater than 0"
    );
    assert_eq!(
        error(Rule::new("llm", Limit::concurrent(4)).cost(2)),
        "rule \"llm\": cost: a concurrency rule takes one slot per request: it has no cost"
    );
    assert_eq!(
        error(Rule::new("llm", Limit::concurrent(4)).queue(Queue::burst(4).delay(1))),
        "rule \"llm\": queue.delay: a concurrency rule lets no excess pass at once: raise \
         `concurrent` instead"
    );
    assert_eq!(
        error(Rule::new("llm", Limit::concurrent(4)).shadow(true)),
        "rule \"llm\": shadow: not available on a concurrency rule"
    );
    assert_eq!(
        error(
            Rule::new("llm", Limit::concurrent(4)).block(Penalty::fixed(Duration::from_secs(60)))
        ),
        "rule \"llm\": block: not available on a concurrency rule"
    );
}

/// A customer's plan, put in the request's extensions by an auth layer.
#[derive(Clone)]
struct InFlight(u64);

fn on_plan(key: &str, id: u32, slots: u64) -> Request<Full<Bytes>> {
    let mut request = request(key, id);
    request.extensions_mut().insert(InFlight(slots));
    request
}

#[tokio::test]
async fn each_customer_has_the_number_of_slots_its_plan_gives() {
    let rule = llm(1).limit_from_extension(|plan: &InFlight| Some(Limit::concurrent(plan.0)));
    let layer = RateLimitLayer::new(rule);
    let (open, app) = streaming(&layer);
    let mut held = Vec::new();
    let mut statuses = Vec::new();
    for id in 0..4 {
        let response = app.clone().oneshot(on_plan("big", id, 3)).await.unwrap();
        statuses.push(response.status());
        held.push(response);
    }
    // Without a plan, the rule's own limit: one in flight.
    for id in 10..12 {
        let response = app.clone().oneshot(request("small", id)).await.unwrap();
        statuses.push(response.status());
        held.push(response);
    }
    let (ok, over) = (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(statuses, [ok, ok, ok, over, ok, over]);
    assert_eq!(called(&open), [0, 1, 2, 10]);
    // One of the big customer's bodies ends: one slot of its three comes back.
    held.remove(1);
    let next = app.clone().oneshot(on_plan("big", 4, 3)).await.unwrap();
    assert_eq!(next.status(), StatusCode::OK);
    let full = app.clone().oneshot(on_plan("big", 5, 3)).await.unwrap();
    assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_limit_of_the_other_kind_falls_back_to_the_rule_s_own() {
    // A plan that gives a rate rule a number of slots, or a concurrency rule a quota over time,
    // cannot work (a slot taken by a rate rule would never be given back): the rule's own limit
    // applies.
    let rate = Rule::new("api", Limit::per_minute(2))
        .key(Key::header(API_KEY))
        .limit_from_extension(|plan: &InFlight| Some(Limit::concurrent(plan.0)));
    let layer = RateLimitLayer::new(rate);
    let (_open, app) = streaming(&layer);
    let mut statuses = Vec::new();
    for id in 0..3 {
        let response = app
            .clone()
            .oneshot(on_plan("alice", id, 100))
            .await
            .unwrap();
        assert_eq!(
            header(&response, "ratelimit-policy").as_deref(),
            Some("\"api\";q=2;w=60")
        );
        statuses.push(response.status());
    }
    let (ok, over) = (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(statuses, [ok, ok, over]);

    let slots = llm(1).limit_from_extension(|_: &InFlight| Some(Limit::per_minute(100)));
    let layer = RateLimitLayer::new(slots);
    let (_open, app) = streaming(&layer);
    let first = app.clone().oneshot(on_plan("alice", 0, 0)).await.unwrap();
    let second = app.clone().oneshot(on_plan("alice", 1, 0)).await.unwrap();
    assert_eq!(
        (first.status(), second.status()),
        (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS)
    );
}

#[tokio::test]
async fn the_layer_s_shadow_switch_leaves_concurrency_rules_out() {
    let layer = RateLimitLayer::builder()
        .rule(llm(1))
        .shadow(true)
        .build()
        .unwrap();
    let (open, app) = streaming(&layer);
    let first = app.clone().oneshot(request("alice", 1)).await.unwrap();
    let second = app.clone().oneshot(request("alice", 2)).await.unwrap();
    assert_eq!(
        (first.status(), second.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    assert_eq!(called(&open), [1, 2]);
    // Nothing was counted: no slot was ever taken.
    assert_eq!(free_slots(layer.limiter(), "llm", "alice").await, 1);
}

#[cfg(feature = "config")]
#[tokio::test]
async fn the_documented_concurrency_rule_loads() {
    use tollgate::config::ConfigFormat;

    let docs = include_str!("../../src/config/CONFIG.md");
    let start = docs
        .find("```toml\n[[rules]]\nname = \"in-flight\"")
        .expect("the example")
        + 8;
    let text = &docs[start..start + docs[start..].find("```").unwrap()];
    let layer = Config::parse(ConfigFormat::Toml, text)
        .and_then(|config| config.layer())
        .unwrap();
    let rule = &layer.limiter().rules_in_force()[0];
    assert_eq!(rule.algorithm, *Limit::concurrent(8).algorithm());
    assert!(rule.queue.is_some());
}

#[cfg(feature = "config")]
#[tokio::test]
async fn concurrent_in_a_config_file() {
    use tollgate::config::ConfigFormat;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    let write = |text: &str| std::fs::write(&path, text).unwrap();
    let error = |path: &std::path::Path| {
        Config::read(path)
            .and_then(|config| config.layer())
            .unwrap_err()
    };

    write("[[rules]]\nname = \"llm\"\nconcurrent = 0\nkey = { header = \"x-api-key\" }\n");
    assert_eq!(
        error(&path).to_string(),
        format!(
            "{}:3:14: rules[0].concurrent (rule \"llm\"): must be greater than 0",
            path.display()
        )
    );
    write("[[rules]]\nname = \"llm\"\nconcurrent = 8\nrate = 5\nperiod = \"1s\"\n");
    assert_eq!(
        error(&path).to_string(),
        format!(
            "{}:4:8: rules[0].rate (rule \"llm\"): a concurrency rule (`concurrent`) counts \
             requests in flight, not units over time: it takes no rate, limit, period or algorithm",
            path.display()
        )
    );
    write("[[rules]]\nname = \"llm\"\nalgorithm = \"fixed_window\"\nconcurrent = 8\n");
    assert_eq!(error(&path).path(), "rules[0].algorithm");
    write("[[rules]]\nname = \"llm\"\nconcurrent = 8\ncost = 2\n");
    assert_eq!(
        error(&path).to_string(),
        format!(
            "{}:4:8: rules[0].cost (rule \"llm\"): a concurrency rule takes one slot per request: \
             it has no cost",
            path.display()
        )
    );

    // The lease of a slot is the Redis store's.
    write(
        "[store]\nkind = \"memory\"\nlease = \"30s\"\n[[rules]]\nname = \"llm\"\nconcurrent = 8\n",
    );
    assert_eq!(
        error(&path).to_string(),
        format!(
            "{}:3:9: store.lease: is only used by the redis store",
            path.display()
        )
    );

    // The file's rule is the rule built in code.
    let yaml = "rules:\n  - name: llm\n    concurrent: 2\n    key: { header: x-api-key }\n    \
                queue: { burst: 4, max_delay: 30s }\n";
    let layer = Config::parse(ConfigFormat::Yaml, yaml)
        .and_then(|config| config.layer())
        .unwrap();
    let rules = layer.limiter().rules_in_force();
    assert_eq!(
        rules[0].algorithm,
        *llm(2).limit().algorithm(),
        "{:?}",
        rules[0]
    );
    assert!(rules[0].queue.is_some());
    let (open, app) = streaming(&layer);
    for id in 1..=2 {
        let response = app.clone().oneshot(request("alice", id)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    assert_eq!(called(&open), [1, 2]);
}

#[tokio::test]
async fn each_plan_of_a_config_file_has_its_own_number_of_slots() {
    use tollgate::config::ConfigFormat;
    use tollgate::config::PlanName;

    let toml = r#"
[[rules]]
name = "in-flight"
concurrent = 1
key = { header = "x-api-key" }

[rules.tiers]
from = "extension"
default = "free"

[rules.tiers.plans.free]

[rules.tiers.plans.pro]
concurrent = 3
"#;
    let layer = Config::parse(ConfigFormat::Toml, toml)
        .and_then(|config| config.layer())
        .unwrap();
    let (open, app) = streaming(&layer);
    let on = |plan: &str, key: &str, id| {
        let mut request = request(key, id);
        request.extensions_mut().insert(PlanName::new(plan));
        request
    };
    let mut held = Vec::new();
    let mut statuses = Vec::new();
    for (plan, key, id) in [
        ("pro", "big", 1),
        ("pro", "big", 2),
        ("pro", "big", 3),
        ("pro", "big", 4),
        ("free", "small", 5),
        ("free", "small", 6),
    ] {
        let response = app.clone().oneshot(on(plan, key, id)).await.unwrap();
        statuses.push(response.status());
        held.push(response);
    }
    let (ok, over) = (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(statuses, [ok, ok, ok, over, ok, over]);
    assert_eq!(called(&open), [1, 2, 3, 5]);
}

/// One HTTP/1.1 connection to `addr`: the request sender (the connection runs in a task that
/// ends when the sender is dropped).
async fn connect(
    addr: std::net::SocketAddr,
) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    sender
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_real_connection_a_stream_holds_its_slot_to_its_last_chunk() {
    use axum::routing::get;

    let layer = RateLimitLayer::new(llm(1));
    let open = Open::default();
    let seen = open.clone();
    let app = axum::Router::new()
        .route(
            "/v1/chat",
            get(move |headers: http::HeaderMap| {
                let seen = seen.clone();
                async move {
                    let id = headers["x-id"].to_str().unwrap().parse().unwrap();
                    let (tx, rx) = mpsc::unbounded();
                    seen.lock().unwrap().push((id, tx));
                    axum::body::Body::new(StreamBody::new(rx))
                }
            }),
        )
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    // A streams: one chunk arrives; the slot is still taken.
    let mut a = connect(addr).await;
    let response = a.send_request(request("alice", 1)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    open.lock().unwrap()[0]
        .1
        .unbounded_send(Ok(Frame::data(Bytes::from("Once"))))
        .unwrap();
    let chunk = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(chunk, "Once");
    let mut b = connect(addr).await;
    let refused = b.send_request(request("alice", 2)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);

    // A's stream ends: by the time its client has read the end, the slot is back.
    end(&open, 1);
    assert!(body.collect().await.is_ok());
    let mut c = connect(addr).await;
    let response = c.send_request(request("alice", 3)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    // C's client hangs up mid-stream: the server drops the body, and the slot comes back.
    drop((c, response));
    let sender = open.lock().unwrap()[0].1.clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        // (The server learns of the closed connection when it next writes.)
        let _ = sender.unbounded_send(Ok(Frame::data(Bytes::from("…"))));
        let mut d = connect(addr).await;
        let response = d.send_request(request("alice", 4)).await.unwrap();
        if response.status() == StatusCode::OK {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the slot never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
