//! What operators rely on: shadow rules, allow and deny lists, rules selected per request,
//! reloading while traffic flows, and metrics (log events: tests/logging.rs).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::Full;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tollgate::{AccessList, Key, Limit, Penalty, Queue, RateLimitLayer, Rule};
use tower::{service_fn, Layer, Service, ServiceExt};

use crate::support::oneshot;
use oneshot::Limited;

use crate::support::metric;
use crate::support::paused;

type Body = Full<Bytes>;

fn ok_service(
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone
{
    service_fn(|_req: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::default())) })
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::default()).unwrap()
}

fn from(ip: &str, path: &str) -> Request<Body> {
    let mut req = get(path);
    req.extensions_mut()
        .insert(SocketAddr::new(ip.parse().unwrap(), 1));
    req
}

async fn status<S: Limited<Body>>(service: &S, req: Request<Body>) -> (StatusCode, Option<String>) {
    let response = service.clone().oneshot(req).await.unwrap();
    let fields = response
        .headers()
        .get("ratelimit")
        .map(|v| v.to_str().unwrap().to_owned());
    (response.status(), fields)
}

/// The value of counter `name` for `rule` in a snapshot.
fn counter(snapshotter: &Snapshotter, name: &str, rule: &str) -> u64 {
    match metric::of_rule(snapshotter, name, rule) {
        Some(DebugValue::Counter(n)) => n,
        _ => 0,
    }
}

/// Builds the layer with a recorder of its own, so counters are registered there.
fn with_recorder(build: impl FnOnce() -> RateLimitLayer) -> (RateLimitLayer, Snapshotter) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let layer = metrics::with_local_recorder(&recorder, build);
    (layer, snapshotter)
}

#[tokio::test(start_paused = true)]
async fn a_shadow_rule_counts_but_never_blocks_and_sends_no_fields() {
    let (layer, metrics) = with_recorder(|| {
        paused::builder()
            .rule(Rule::new("enforced", Limit::per_minute(100)))
            .rule(Rule::new("trial", Limit::per_minute(2)).shadow(true))
            .build()
            .unwrap()
    });
    let service = layer.layer(ok_service());
    for _ in 0..5 {
        let (code, fields) = status(&service, get("/")).await;
        assert_eq!(code, StatusCode::OK);
        let fields = fields.unwrap();
        assert!(fields.starts_with("\"enforced\""), "{fields}");
        assert!(!fields.contains("trial"), "{fields}");
    }
    assert_eq!(
        counter(&metrics, "tollgate_shadow_denied_total", "trial"),
        3
    );
    assert_eq!(counter(&metrics, "tollgate_allowed_total", "enforced"), 5);
    // A shadow rule is charged as usual (nginx's dry run counts too): its state shows 0 left.
    let peek = layer.limiter().check("trial", "", 0).await.unwrap();
    assert_eq!(peek.remaining, 0);
}

#[tokio::test(start_paused = true)]
async fn global_shadow_mode_blocks_nothing() {
    let (layer, metrics) = with_recorder(|| {
        paused::builder()
            .rule(Rule::new("new-limit", Limit::per_minute(1)))
            .shadow(true)
            .build()
            .unwrap()
    });
    let service = layer.layer(ok_service());
    for _ in 0..3 {
        assert_eq!(status(&service, get("/")).await, (StatusCode::OK, None));
    }
    assert_eq!(
        counter(&metrics, "tollgate_shadow_denied_total", "new-limit"),
        2
    );
    assert_eq!(counter(&metrics, "tollgate_denied_total", "new-limit"), 0);
}

#[tokio::test(start_paused = true)]
async fn allow_and_deny_lists() {
    let api_key = || Key::header(HeaderName::from_static("x-api-key"));
    let layer = paused::builder()
        .rule(Rule::new("per-ip", Limit::per_minute(1)).key(Key::peer_ip()))
        .allow(AccessList::networks(
            Key::peer_ip(),
            ["10.20.0.0/16".parse().unwrap()],
        ))
        .allow(AccessList::networks(
            Key::peer_ip(),
            ["2001:db8:aa::/48".parse().unwrap()],
        ))
        .deny(AccessList::keys(api_key(), ["leaked"]))
        .build()
        .unwrap();
    let service = layer.layer(ok_service());
    for _ in 0..3 {
        assert_eq!(
            status(&service, from("10.20.3.4", "/")).await,
            (StatusCode::OK, None)
        );
        assert_eq!(
            status(&service, from("2001:db8:aa:1::5", "/")).await,
            (StatusCode::OK, None)
        );
    }
    assert_eq!(
        status(&service, from("192.0.2.1", "/")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        status(&service, from("192.0.2.1", "/")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    let mut banned = from("10.20.3.4", "/");
    banned
        .headers_mut()
        .insert("x-api-key", "leaked".parse().unwrap());
    let response = service.clone().oneshot(banned).await.unwrap();
    assert_eq!(
        response.status(),
        StatusCode::FORBIDDEN,
        "deny wins over allow"
    );
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
}

#[tokio::test(start_paused = true)]
async fn rules_selected_per_request_make_tiers() {
    let plan_is = |plan: &'static str| {
        move |head: &tollgate::key::RequestHead<'_>| {
            head.headers.get("x-plan").is_some_and(|v| v == plan)
        }
    };
    let layer = paused::builder()
        .rule(Rule::new("free", Limit::per_minute(2)).when(plan_is("free")))
        .rule(Rule::new("pro", Limit::per_minute(5)).when(plan_is("pro")))
        .build()
        .unwrap();
    let service = layer.layer(ok_service());
    let on = |plan: &str| {
        let mut req = get("/");
        req.headers_mut().insert("x-plan", plan.parse().unwrap());
        req
    };
    let count_ok = |plan: &'static str| {
        let service = service.clone();
        async move {
            let mut ok = 0;
            for _ in 0..10 {
                if status(&service, on(plan)).await.0 == StatusCode::OK {
                    ok += 1;
                }
            }
            ok
        }
    };
    assert_eq!(count_ok("free").await, 2);
    assert_eq!(count_ok("pro").await, 5);
    assert_eq!(
        status(&service, get("/")).await,
        (StatusCode::OK, None),
        "no plan, no rule"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloading_under_load_fails_no_request_and_keeps_unchanged_rules() {
    let kept = || Rule::new("kept", Limit::per_day(300));
    let layer = paused::builder().rule(kept()).build().unwrap();
    let service = layer.layer(ok_service());
    let served = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (service, served) = (service.clone(), served.clone());
            tokio::spawn(async move {
                let mut odd = Vec::new();
                for _ in 0..250 {
                    let response = service.clone().oneshot(get("/")).await.unwrap();
                    match response.status() {
                        StatusCode::OK => {
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                        StatusCode::TOO_MANY_REQUESTS => {}
                        other => odd.push(other),
                    }
                    tokio::task::yield_now().await;
                }
                odd
            })
        })
        .collect();
    let reloader = {
        let layer = layer.clone();
        tokio::spawn(async move {
            for i in 0..200u64 {
                // Alternate a second rule in and out; "kept" stays as it is.
                let rules = if i % 2 == 0 {
                    vec![
                        kept(),
                        Rule::new("extra", Limit::per_day(1_000_000)).path("/other"),
                    ]
                } else {
                    vec![kept()]
                };
                layer.reload(rules).unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    for client in clients {
        assert_eq!(
            client.await.unwrap(),
            Vec::<StatusCode>::new(),
            "only 200 and 429"
        );
    }
    reloader.await.unwrap();
    // 1000 requests against a budget of 300 that no reload reset.
    assert_eq!(served.load(Ordering::Relaxed), 300);
    // A reload that cannot work changes nothing.
    assert!(layer
        .reload([Rule::new("kept", Limit::per_day(0))])
        .is_err());
    assert_eq!(crate::rule_names(layer.limiter()), ["kept"]);
}

#[tokio::test(start_paused = true)]
async fn counters_for_allowed_denied_and_delayed() {
    let (layer, metrics) = with_recorder(|| {
        paused::builder()
            .rule(Rule::new("queued", Limit::per_second(1)).queue(Queue::burst(1)))
            .build()
            .unwrap()
    });
    let service = layer.layer(ok_service());
    let tasks: Vec<_> = (0..3)
        .map(|_| tokio::spawn(service.clone().oneshot(get("/"))))
        .collect();
    let mut codes = Vec::new();
    for task in tasks {
        codes.push(task.await.unwrap().unwrap().status());
    }
    assert_eq!(codes.iter().filter(|c| **c == StatusCode::OK).count(), 2);
    assert_eq!(counter(&metrics, "tollgate_allowed_total", "queued"), 2);
    assert_eq!(counter(&metrics, "tollgate_delayed_total", "queued"), 1);
    assert_eq!(counter(&metrics, "tollgate_denied_total", "queued"), 1);
}

use crate::support::stores;

#[tokio::test(start_paused = true)]
async fn store_errors_and_store_latency_are_measured() {
    let recorder = DebuggingRecorder::new();
    let metrics = recorder.snapshotter();
    let (broken, slow) = metrics::with_local_recorder(&recorder, || {
        let broken = paused::builder()
            .rule(Rule::new("down", Limit::per_minute(5)))
            .store(stores::Broken)
            .build()
            .unwrap();
        let slow = paused::builder()
            .rule(Rule::new("remote", Limit::per_minute(5)))
            .store(stores::Slow::default())
            .build()
            .unwrap();
        (broken.layer(ok_service()), slow.layer(ok_service()))
    });
    assert_eq!(
        status(&broken, get("/")).await.0,
        StatusCode::OK,
        "fails open"
    );
    assert_eq!(counter(&metrics, "tollgate_store_errors_total", "down"), 1);
    // The histogram is recorded where the request completes, under the same recorder.
    let latencies = metrics::with_local_recorder(&recorder, || {
        let slow = slow.clone();
        tokio::spawn(async move { status(&slow, get("/")).await })
    });
    assert_eq!(latencies.await.unwrap().0, StatusCode::OK);
    let recorded: Vec<f64> = metrics
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "tollgate_store_latency_seconds")
        .flat_map(|(.., value)| match value {
            DebugValue::Histogram(values) => values.into_iter().map(|v| v.into_inner()).collect(),
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(
        recorded,
        [0.005],
        "the slow store answers after 5 ms of paused time"
    );
}

/// A penalty through the layer: the offence and the requests during the block get `429` with
/// `Retry-After` = what is left of the block; one block is one count of `tollgate_blocked_total`.
#[tokio::test(start_paused = true)]
async fn a_blocked_key_gets_the_rest_of_its_block_as_retry_after_and_is_counted_once() {
    let (layer, metrics) = with_recorder(|| {
        paused::builder()
            .rule(
                Rule::new("login", Limit::per_minute(2))
                    .key(Key::peer_ip())
                    .block(Penalty::fixed(std::time::Duration::from_secs(600))),
            )
            .build()
            .unwrap()
    });
    let service = layer.layer(ok_service());
    let retry_after = |response: &Response<tollgate::middleware::ResponseBody<Body>>| {
        response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let send = |ip: &str| service.clone().oneshot(from(ip, "/login"));
    for _ in 0..2 {
        assert_eq!(send("192.0.2.1").await.unwrap().status(), StatusCode::OK);
    }
    let offence = send("192.0.2.1").await.unwrap();
    assert_eq!(offence.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&offence).as_deref(), Some("600"));
    tokio::time::advance(std::time::Duration::from_millis(250_500)).await;
    let during = send("192.0.2.1").await.unwrap();
    assert_eq!(during.status(), StatusCode::TOO_MANY_REQUESTS);
    // 349.5 s left, rounded up.
    assert_eq!(retry_after(&during).as_deref(), Some("350"));
    assert_eq!(
        during.headers().get("ratelimit").unwrap(),
        "\"login\";r=0;t=350"
    );
    assert_eq!(send("192.0.2.2").await.unwrap().status(), StatusCode::OK);
    tokio::time::advance(std::time::Duration::from_millis(349_500)).await;
    assert_eq!(send("192.0.2.1").await.unwrap().status(), StatusCode::OK);
    assert_eq!(counter(&metrics, "tollgate_blocked_total", "login"), 1);
    assert_eq!(counter(&metrics, "tollgate_denied_total", "login"), 2);
}

/// A layer built on a given limiter uses that limiter's rules, store and lists: the layer's
/// builder has no setter for them (`RateLimitLayer::from_limiter`'s doc shows that one does not
/// compile), and keeps the layer's own settings.
#[test]
fn a_given_limiters_layer_takes_the_layers_own_settings() {
    let limiter = || {
        tollgate::Limiter::builder()
            .rule(Rule::new("shared", Limit::per_minute(10)))
            .build()
            .unwrap()
    };
    let builder = || RateLimitLayer::from_limiter(limiter());
    // The layer's own settings stay the layer's.
    assert!(builder()
        .redact_keys(true)
        .top_offenders(8)
        .jitter(std::time::Duration::from_secs(1))
        .build()
        .is_ok());
}
