//! The layer as users meet it: a tower service, answered through `oneshot`, with tokio's paused
//! time driving the limiter's clock.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::{Cost, Decision, FailurePolicy, Key, Limit, MissingKey, RateLimitLayer, Rule};
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

use crate::support::stores;
use stores::{Broken, Slow};

use crate::support::oneshot;
use oneshot::send;

use crate::support::paused;

type Body = Full<Bytes>;

/// An inner service that counts its calls and answers 200 "ok".
fn counting() -> (
    Arc<AtomicUsize>,
    impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let service = service_fn(move |_req: Request<Body>| {
        seen.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))) }
    });
    (calls, service)
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::default()).unwrap()
}

fn from(ip: &str, mut req: Request<Body>) -> Request<Body> {
    req.extensions_mut()
        .insert(SocketAddr::new(ip.parse().unwrap(), 40_000));
    req
}

fn header<'a>(response: &'a Response<Bytes>, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

/// The body of a response the layer wrote, which states its length (so a router need not add it).
fn json(response: &Response<Bytes>) -> serde_json::Value {
    let length = response.body().len().to_string();
    assert_eq!(header(response, "content-length"), Some(length.as_str()));
    serde_json::from_slice(response.body()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn allows_then_denies_with_exact_headers_then_refills() {
    let (calls, inner) = counting();
    let service = paused::layer(Rule::new("global", Limit::per_second(2))).layer(inner);

    let first = send(&service, get("/")).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        header(&first, "ratelimit-policy"),
        Some("\"global\";q=2;w=1")
    );
    assert_eq!(header(&first, "ratelimit"), Some("\"global\";r=1;t=1"));
    let second = send(&service, get("/")).await;
    assert_eq!(header(&second, "ratelimit"), Some("\"global\";r=0;t=1"));

    let denied = send(&service, get("/")).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "retry-after"), Some("1"));
    assert_eq!(header(&denied, "ratelimit"), Some("\"global\";r=0;t=1"));
    assert_eq!(
        header(&denied, "ratelimit-policy"),
        Some("\"global\";q=2;w=1")
    );
    assert_eq!(
        header(&denied, "content-type"),
        Some("application/problem+json")
    );
    let body = json(&denied);
    assert_eq!(body["type"], tollgate::headers::QUOTA_EXCEEDED);
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], serde_json::json!(["global"]));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "a denied request never reaches the inner service"
    );

    // One unit refills every 500 ms.
    tokio::time::advance(Duration::from_millis(499)).await;
    assert_eq!(
        send(&service, get("/")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(send(&service, get("/")).await.status(), StatusCode::OK);
}

/// Everything a client reads of a response the layer wrote: status, fields, body.
fn seen(response: &Response<Bytes>) -> (StatusCode, Vec<(String, String)>, Bytes) {
    let fields = response
        .headers()
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_owned()))
        .collect();
    (response.status(), fields, response.body().clone())
}

/// A flood's refusals are answered with copies of the last ones written (the response stage's
/// prepared 429s, DESIGN §1): a copy says exactly what a fresh one would, and a refusal that
/// differs (another wait, another client) is never answered with a copy of the wrong one.
#[tokio::test(start_paused = true)]
async fn repeated_refusals_are_exact_copies_and_differing_ones_are_not() {
    let (_, inner) = counting();
    let service = paused::builder()
        .rule(Rule::new("per-client", Limit::per_minute(1)).key(Key::peer_ip()))
        .build()
        .unwrap()
        .layer(inner);
    let ask = |ip: &'static str| send(&service, from(ip, get("/")));

    assert_eq!(ask("10.0.0.1").await.status(), StatusCode::OK);
    let first = seen(&ask("10.0.0.1").await);
    assert_eq!(first.0, StatusCode::TOO_MANY_REQUESTS);
    let field = |seen: &(StatusCode, Vec<(String, String)>, Bytes), name: &str| {
        let found = seen.1.iter().find(|(n, _)| n == name);
        found.map(|(_, value)| value.clone())
    };
    assert_eq!(field(&first, "retry-after").as_deref(), Some("60"));
    for _ in 0..3 {
        assert_eq!(seen(&ask("10.0.0.1").await), first, "a copy is exact");
    }

    // Twenty seconds on, the same client waits forty: not the kept copy.
    tokio::time::advance(Duration::from_secs(20)).await;
    let later = seen(&ask("10.0.0.1").await);
    assert_eq!(field(&later, "retry-after").as_deref(), Some("40"));
    assert_eq!(
        field(&later, "ratelimit").as_deref(),
        Some("\"per-client\";r=0;t=40")
    );
    assert_eq!(seen(&ask("10.0.0.1").await), later);

    // Another client, refused with its own wait, then both again: each its own answer.
    assert_eq!(ask("10.0.0.2").await.status(), StatusCode::OK);
    tokio::time::advance(Duration::from_secs(5)).await;
    let other = seen(&ask("10.0.0.2").await);
    assert_eq!(field(&other, "retry-after").as_deref(), Some("55"));
    let first_again = seen(&ask("10.0.0.1").await);
    assert_eq!(field(&first_again, "retry-after").as_deref(), Some("35"));
    assert_eq!(seen(&ask("10.0.0.2").await), other);
}

#[tokio::test(start_paused = true)]
async fn clones_of_layer_and_service_share_one_budget() {
    let (_, inner) = counting();
    let layer = paused::layer(Limit::per_minute(3));
    let a = layer.layer(inner.clone());
    let b = layer.clone().layer(inner);
    let c = a.clone();
    let statuses = [
        send(&a, get("/")).await.status(),
        send(&b, get("/")).await.status(),
        send(&c, get("/")).await.status(),
        send(&b, get("/")).await.status(),
    ];
    assert_eq!(statuses[..3], [StatusCode::OK; 3]);
    assert_eq!(statuses[3], StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(start_paused = true)]
async fn poll_ready_is_the_inner_services() {
    let (mut mock, mut handle) = tower_test::mock::spawn_layer::<Request<Body>, Response<Body>, _>(
        paused::layer(Limit::per_second(1)),
    );
    handle.allow(0);
    assert!(mock.poll_ready().is_pending());
    handle.allow(1);
    assert!(mock.poll_ready().is_ready());
}

#[tokio::test(start_paused = true)]
async fn keys_separate_clients() {
    let (_, inner) = counting();
    let service = paused::layer(Limit::per_minute(1).key(Key::peer_ip())).layer(inner);
    assert_eq!(
        send(&service, from("192.0.2.1", get("/"))).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&service, from("192.0.2.2", get("/"))).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&service, from("192.0.2.1", get("/"))).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // IPv6 clients are grouped per /64: another address in the same /64 shares the budget.
    assert_eq!(
        send(&service, from("2001:db8::1", get("/"))).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&service, from("2001:db8::ffff", get("/")))
            .await
            .status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(start_paused = true)]
async fn a_missing_peer_address_is_the_servers_500_not_the_clients_400() {
    let (calls, inner) = counting();
    let service = paused::layer(Limit::per_minute(1).key(Key::peer_ip())).layer(inner);
    let response = send(&service, get("/")).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        header(&response, "content-type"),
        Some("application/problem+json")
    );
    let detail = json(&response)["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("peer-ip"), "{detail}");
    assert!(detail.contains("server is misconfigured"), "{detail}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

fn api_key() -> HeaderName {
    HeaderName::from_static("x-api-key")
}

fn with_key(value: &[u8], mut req: Request<Body>) -> Request<Body> {
    req.headers_mut()
        .insert(api_key(), HeaderValue::from_bytes(value).unwrap());
    req
}

#[tokio::test(start_paused = true)]
async fn missing_key_policies() {
    let (_, inner) = counting();
    let reject = paused::layer(
        Rule::new("api", Limit::per_minute(1))
            .key(Key::header(api_key()))
            .on_missing_key(MissingKey::RejectWith(StatusCode::UNAUTHORIZED)),
    )
    .layer(inner.clone());
    assert_eq!(
        send(&reject, get("/")).await.status(),
        StatusCode::UNAUTHORIZED
    );

    let skip = paused::layer(
        Rule::new("api", Limit::per_minute(1))
            .key(Key::header(api_key()))
            .on_missing_key(MissingKey::Skip),
    )
    .layer(inner.clone());
    for _ in 0..3 {
        let response = send(&skip, get("/")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(header(&response, "ratelimit"), None, "no rule applied");
    }

    let fallback = paused::layer(
        Rule::new("api", Limit::per_minute(1))
            .key(Key::header(api_key()))
            .on_missing_key(MissingKey::Fallback(Key::peer_ip())),
    )
    .layer(inner);
    assert_eq!(
        send(&fallback, from("192.0.2.9", get("/"))).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&fallback, from("192.0.2.9", get("/"))).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // The fallback key and the header key don't share state.
    assert_eq!(
        send(&fallback, with_key(b"k1", from("192.0.2.9", get("/"))))
            .await
            .status(),
        StatusCode::OK
    );
}

#[tokio::test(start_paused = true)]
async fn oversized_and_non_utf8_keys_are_bounded() {
    let (_, inner) = counting();
    let layer = paused::layer(Rule::new("api", Limit::per_minute(1)).key(Key::header(api_key())));
    let service = layer.layer(inner);
    let huge = vec![b'a'; 1 << 20];
    assert_eq!(
        send(&service, with_key(&huge, get("/"))).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&service, with_key(&huge, get("/"))).await.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the same 1 MB key maps to the same (hashed) key"
    );
    let key = layer
        .limiter()
        .key_for("api", &with_key(&huge, get("/")))
        .unwrap()
        .unwrap();
    assert!(key.as_bytes().len() <= tollgate::key::MAX_KEY_LEN);
    assert_eq!(
        send(&service, with_key(b"\xff\xfe", get("/")))
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&service, with_key(b"\xff\xfe", get("/")))
            .await
            .status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(start_paused = true)]
async fn forwarding_headers_count_only_from_trusted_proxies() {
    let (_, inner) = counting();
    let key = Key::client_ip().try_trust(["10.0.0.0/8"]).unwrap();
    let service = paused::layer(Limit::per_minute(1).key(key)).layer(inner);
    let forwarded = |peer: &str, xff: &str| {
        let mut req = from(peer, get("/"));
        req.headers_mut()
            .insert("x-forwarded-for", HeaderValue::from_str(xff).unwrap());
        req
    };
    // Behind the trusted proxy, the client is the rightmost untrusted address.
    assert_eq!(
        send(&service, forwarded("10.0.0.1", "203.0.113.5, 10.0.0.7"))
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&service, forwarded("10.0.0.2", "198.51.100.1, 203.0.113.5"))
            .await
            .status(),
        StatusCode::TOO_MANY_REQUESTS,
        "same client through another proxy; the spoofed left entry is ignored"
    );
    // A client talking directly cannot pick its identity with the header.
    assert_eq!(
        send(&service, forwarded("192.0.2.50", "203.0.113.99"))
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&service, forwarded("192.0.2.50", "203.0.113.100"))
            .await
            .status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Garbage from the proxy falls back to the proxy's address.
    assert_eq!(
        send(&service, forwarded("10.9.9.9", "not an ip"))
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&service, forwarded("10.9.9.9", "%%%")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

fn tokens() -> HeaderName {
    HeaderName::from_static("x-llm-tokens")
}

fn costing(units: &str) -> Request<Body> {
    let mut req = get("/v1/chat");
    req.headers_mut()
        .insert(tokens(), HeaderValue::from_str(units).unwrap());
    req
}

#[tokio::test(start_paused = true)]
async fn cost_from_a_header() {
    let (_, inner) = counting();
    let layer =
        paused::layer(Rule::new("tokens", Limit::per_minute(1_000)).cost(Cost::header(tokens())));
    let service = layer.layer(inner);
    let ok = send(&service, costing("600")).await;
    assert_eq!(header(&ok, "ratelimit"), Some("\"tokens\";r=400;t=1"));
    let denied = send(&service, costing("500")).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // 100 more tokens take 6 s at 1000/min.
    assert_eq!(header(&denied, "retry-after"), Some("6"));
    assert_eq!(
        send(&service, costing("400")).await.status(),
        StatusCode::OK
    );

    for bad in ["", "abc", "-5", "1e3", "99999999999999999999999"] {
        let response = send(&service, costing(bad)).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{bad:?}");
    }
    let missing = send(&service, get("/v1/chat")).await;
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    let too_big = send(&service, costing("1001")).await;
    assert_eq!(too_big.status(), StatusCode::BAD_REQUEST);
    assert!(json(&too_big)["detail"]
        .as_str()
        .unwrap()
        .contains("can never pass"));
}

#[tokio::test(start_paused = true)]
async fn rules_are_scoped_and_charged_all_or_nothing() {
    let (_, inner) = counting();
    let layer = paused::builder()
        .rule(
            Rule::new("login", Limit::per_minute(2))
                .methods([Method::POST])
                .path("/login"),
        )
        .rule(Rule::new("api", Limit::per_minute(3)).path("/api/*"))
        .rule(Rule::new("all", Limit::per_minute(4)))
        .build()
        .unwrap();
    let service = layer.layer(inner);
    let post_login = || Request::post("/login").body(Body::default()).unwrap();

    let first = send(&service, post_login()).await;
    assert_eq!(
        header(&first, "ratelimit-policy"),
        Some("\"login\";q=2;w=60, \"all\";q=4;w=60")
    );
    assert_eq!(
        header(&first, "ratelimit"),
        Some("\"login\";r=1;t=30, \"all\";r=3;t=15")
    );
    assert_eq!(send(&service, post_login()).await.status(), StatusCode::OK);
    let denied = send(&service, post_login()).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        json(&denied)["violated-policies"],
        serde_json::json!(["login"])
    );
    // The denied login charged nothing to "all": two units are still there.
    let api = send(&service, get("/api/v1/items")).await;
    assert_eq!(
        header(&api, "ratelimit"),
        Some("\"api\";r=2;t=20, \"all\";r=1;t=15")
    );
    // GET /login is outside the login rule's scope.
    assert_eq!(send(&service, get("/login")).await.status(), StatusCode::OK);
    let exhausted = send(&service, get("/api/v1/items")).await;
    assert_eq!(
        json(&exhausted)["violated-policies"],
        serde_json::json!(["all"])
    );
}

#[tokio::test(start_paused = true)]
async fn response_options() {
    let (_, inner) = counting();
    let quiet = paused::builder()
        .rule(Limit::per_minute(1))
        .headers_on_allowed(false)
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .build()
        .unwrap()
        .layer(inner.clone());
    let allowed = send(&quiet, get("/")).await;
    assert_eq!(header(&allowed, "ratelimit"), None);
    let denied = send(&quiet, get("/")).await;
    assert_eq!(denied.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        header(&denied, "ratelimit").is_some(),
        "denials always explain themselves"
    );

    let legacy = paused::builder()
        .rule(Limit::per_minute(10))
        .legacy_headers(true)
        .build()
        .unwrap()
        .layer(inner.clone());
    let response = send(&legacy, get("/")).await;
    assert_eq!(header(&response, "x-ratelimit-limit"), Some("10"));
    assert_eq!(header(&response, "x-ratelimit-remaining"), Some("9"));
    let reset: u64 = header(&response, "x-ratelimit-reset")
        .unwrap()
        .parse()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        (now..=now + 7).contains(&reset),
        "{reset} is a Unix time about 6 s ahead"
    );

    let custom = paused::builder()
        .rule(Rule::new("one", Limit::per_minute(1)))
        .on_rejection(|rejected| {
            let mut response = Response::new(Bytes::from(format!(
                "slow down: {:?}",
                rejected.decision().retry_after()
            )));
            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            response
        })
        .build()
        .unwrap()
        .layer(inner);
    send(&custom, get("/")).await;
    let denied = send(&custom, get("/")).await;
    assert_eq!(denied.body(), &Bytes::from("slow down: Some(60s)"));
    assert_eq!(header(&denied, "retry-after"), Some("60"));
}

#[tokio::test(start_paused = true)]
async fn jitter_spreads_retry_after_within_its_bound() {
    let (_, inner) = counting();
    let service = paused::builder()
        .rule(Limit::per_minute(1))
        .jitter(Duration::from_secs(10))
        .build()
        .unwrap()
        .layer(inner);
    send(&service, get("/")).await;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..50 {
        let denied = send(&service, get("/")).await;
        let secs: u64 = header(&denied, "retry-after").unwrap().parse().unwrap();
        assert!((60..=70).contains(&secs), "{secs}");
        seen.insert(secs);
    }
    assert!(seen.len() > 1, "jitter varies the value");
}

#[tokio::test(start_paused = true)]
async fn handlers_read_the_decision() {
    let service = ServiceBuilder::new()
        .layer(paused::layer(Rule::new("g", Limit::per_minute(5))))
        .service(service_fn(|req: Request<Body>| async move {
            let decision = req.extensions().get::<Decision>().cloned().unwrap();
            let text = format!("{} left", decision.remaining().unwrap());
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text))))
        }));
    assert_eq!(
        send(&service, get("/")).await.body(),
        &Bytes::from("4 left")
    );
}

#[tokio::test(start_paused = true)]
async fn a_layer_built_without_the_decision_in_extensions_still_limits_and_answers_fields() {
    let service = paused::builder()
        .rule(Rule::new("g", Limit::per_minute(2)))
        .decision_in_extensions(false)
        .build()
        .unwrap()
        .layer(service_fn(|req: Request<Body>| async move {
            let seen = req.extensions().get::<Decision>().is_some();
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(seen.to_string()))))
        }));
    let first = send(&service, get("/")).await;
    assert_eq!(first.body(), &Bytes::from("false"));
    assert_eq!(header(&first, "ratelimit"), Some(r#""g";r=1;t=30"#));
    send(&service, get("/")).await;
    let denied = send(&service, get("/")).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "ratelimit"), Some(r#""g";r=0;t=30"#));
}

#[tokio::test(start_paused = true)]
async fn a_failing_store_fails_open_by_default_or_closed_on_request() {
    let (calls, inner) = counting();
    let open = paused::builder()
        .rule(Limit::per_minute(1))
        .store(Broken)
        .build()
        .unwrap()
        .layer(inner.clone());
    for _ in 0..3 {
        let response = send(&open, get("/")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(header(&response, "ratelimit"), None);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    let closed = paused::builder()
        .rule(Limit::per_minute(1))
        .store(Broken)
        .on_store_failure(FailurePolicy::Closed)
        .build()
        .unwrap()
        .layer(inner);
    let response = send(&closed, get("/")).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        header(&response, "content-type"),
        Some("application/problem+json")
    );
    assert_eq!(json(&response)["status"], 503);
    // Issue 13, bug 5: a plain message (no Debug text) and a `Retry-After`.
    assert_eq!(header(&response, "retry-after"), Some("1"));
    assert_eq!(
        json(&response)["detail"],
        "The rate limiter cannot decide right now; try again in 1 s."
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn an_asynchronous_store_gives_the_same_answers() {
    let (calls, inner) = counting();
    let service = paused::builder()
        .rule(Rule::new("g", Limit::per_second(2)))
        .store(Slow::default())
        .build()
        .unwrap()
        .layer(inner);
    let ok = send(&service, get("/")).await;
    assert_eq!(header(&ok, "ratelimit"), Some("\"g\";r=1;t=1"));
    assert_eq!(send(&service, get("/")).await.status(), StatusCode::OK);
    assert_eq!(
        send(&service, get("/")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_on_one_key_admit_exactly_the_limit() {
    let (calls, inner) = counting();
    // A day-long budget: nothing refills while the test runs, whatever the wall clock does.
    let service = paused::layer(Limit::per_day(100)).layer(inner);
    let tasks: Vec<_> = (0..500)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move { service.oneshot(get("/")).await.unwrap().status() })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        if task.await.unwrap() == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, 100);
    assert_eq!(calls.load(Ordering::SeqCst), 100);
}

#[test]
fn unworkable_rules_are_build_errors() {
    let err = paused::builder()
        .rule(Rule::new("llm", Limit::per_minute(100)).cost(500))
        .build()
        .unwrap_err();
    assert_eq!(err.rule(), "llm");
    assert_eq!(err.field(), "cost");
    let dup = paused::builder()
        .rule(Rule::new("a", Limit::per_second(1)))
        .rule(Rule::new("a", Limit::per_second(2)))
        .build()
        .unwrap_err();
    assert_eq!(dup.field(), "name");
    let panic =
        std::panic::catch_unwind(|| RateLimitLayer::new(Rule::new("zero", Limit::per_second(0))));
    let message = *panic.unwrap_err().downcast::<String>().unwrap();
    assert_eq!(
        message,
        "invalid rate-limit rule: rule \"zero\": rate: must be greater than 0"
    );
}

#[tokio::test(start_paused = true)]
async fn the_problem_body_is_valid_json_whatever_the_rule_names() {
    let (_, inner) = counting();
    let name = r#"say "hi" \ there"#;
    let service = paused::builder()
        .rule(Rule::new(name, Limit::per_minute(1)))
        .rule(Rule::new("plain", Limit::per_minute(1)))
        .build()
        .unwrap()
        .layer(inner);
    send(&service, get("/")).await;
    let denied = send(&service, get("/")).await;
    assert_eq!(
        json(&denied),
        serde_json::json!({
            "type": tollgate::headers::QUOTA_EXCEEDED,
            "title": "Too Many Requests",
            "status": 429,
            "detail": format!("Rate limit exceeded ({name}, plain); retry in 60 s."),
            "violated-policies": [name, "plain"],
        })
    );
    let policy = header(&denied, "ratelimit-policy").unwrap();
    let list: sfv::List = sfv::Parser::new(policy).parse().unwrap();
    assert_eq!(list.len(), 2);
}

/// Refusals alike are answered from a prepared copy (the layer keeps its last few default 429s):
/// the copy must be the same response, and a refusal that differs in any number must not get it.
#[tokio::test(start_paused = true)]
async fn prepared_refusals_are_exact_copies_and_follow_the_clock() {
    let (_, inner) = counting();
    let rule = Rule::new("per-ip", Limit::per_minute(1)).key(Key::peer_ip());
    let service = paused::layer(rule).layer(inner);
    let parts = |r: &Response<Bytes>| (r.status(), r.headers().clone(), r.body().clone());

    assert_eq!(
        send(&service, from("192.0.2.1", get("/"))).await.status(),
        StatusCode::OK
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(
        send(&service, from("192.0.2.2", get("/"))).await.status(),
        StatusCode::OK
    );

    // Two clients refused alternately, with different waits: each gets its own numbers, and a
    // repeat is identical to the first refusal of its kind.
    let first_x = send(&service, from("192.0.2.1", get("/"))).await;
    let first_y = send(&service, from("192.0.2.2", get("/"))).await;
    for _ in 0..3 {
        let x = send(&service, from("192.0.2.1", get("/"))).await;
        let y = send(&service, from("192.0.2.2", get("/"))).await;
        assert_eq!(parts(&x), parts(&first_x));
        assert_eq!(parts(&y), parts(&first_y));
    }
    assert_eq!(first_x.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&first_x, "retry-after"), Some("50"));
    assert_eq!(header(&first_x, "ratelimit"), Some("\"per-ip\";r=0;t=50"));
    assert_eq!(
        header(&first_x, "ratelimit-policy"),
        Some("\"per-ip\";q=1;w=60")
    );
    assert_eq!(
        json(&first_x)["detail"],
        "Rate limit exceeded (per-ip); retry in 50 s."
    );
    assert_eq!(header(&first_y, "retry-after"), Some("60"));
    assert_eq!(header(&first_y, "ratelimit"), Some("\"per-ip\";r=0;t=60"));

    // Time moves on: the next refusal says so.
    tokio::time::advance(Duration::from_millis(1500)).await;
    let later = send(&service, from("192.0.2.1", get("/"))).await;
    assert_eq!(header(&later, "retry-after"), Some("49"));
    assert_eq!(header(&later, "ratelimit"), Some("\"per-ip\";r=0;t=49"));
    assert_eq!(
        json(&later)["detail"],
        "Rate limit exceeded (per-ip); retry in 49 s."
    );
}

/// A response future polled again after it completed panics (as tower-http's do): a caller's
/// bug is loud, never a request that hangs.
#[tokio::test(start_paused = true)]
#[should_panic(expected = "ResponseFuture polled after it completed")]
async fn a_future_polled_after_it_completed_panics() {
    use std::future::Future as _;
    let (_, inner) = counting();
    let mut service = RateLimitLayer::new(Limit::per_minute(1).key(Key::global())).layer(inner);
    let first = service.ready().await.unwrap().call(get("/")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    // The second is refused by the layer itself.
    let mut refused = Box::pin(service.ready().await.unwrap().call(get("/")));
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    match refused.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(Ok(response)) => {
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS)
        }
        other => panic!("the refusal is ready at once: {:?}", other.is_ready()),
    }
    let _ = refused.as_mut().poll(&mut cx);
}
