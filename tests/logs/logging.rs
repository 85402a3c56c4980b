//! The layer's log events. Alone in this test binary on purpose: `tracing` caches per call site
//! whether anyone listens, and a test on another thread hitting the same call site while this
//! one installs its subscriber can cache "nobody" and swallow the events it checks.

use crate::support::log_lines;
use log_lines::Lines;

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tollgate::{Key, Limit, Penalty, RateLimitLayer, Rule};
use tower::{service_fn, Layer};

use crate::support::paused;

use crate::support::oneshot;
use oneshot::send;

type Body = Full<Bytes>;

fn from(ip: &str, path: &str, grpc: bool) -> Request<Body> {
    let mut req = match grpc {
        true => Request::post(path).header("content-type", "application/grpc"),
        false => Request::get(path),
    }
    .body(Body::default())
    .unwrap();
    req.extensions_mut()
        .insert(SocketAddr::new(ip.parse().unwrap(), 1));
    req
}

/// A layer of one request a minute per client IP (keys redacted or not), and an app behind it.
fn one_per_minute_per_ip(redact: bool) -> (RateLimitLayer, impl oneshot::Limited<Body>) {
    let layer = paused::builder()
        .rule(Rule::new("per-ip", Limit::per_minute(1)).key(Key::peer_ip()))
        .redact_keys(redact)
        .build()
        .unwrap();
    let service = layer.layer(service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::default()))
    }));
    (layer, service)
}

async fn denial_log(redact: bool, path: &str, grpc: bool) -> String {
    let lines = Lines::default();
    let _guard = lines.listen(tracing::Level::DEBUG);
    let (_layer, service) = one_per_minute_per_ip(redact);
    send(&service, from("198.51.100.7", path, grpc)).await;
    send(&service, from("198.51.100.7", path, grpc)).await;
    lines.text()
}

#[tokio::test(start_paused = true)]
async fn denials_are_logged_with_rule_and_key_which_can_be_redacted() {
    let plain = denial_log(false, "/", false).await;
    assert!(plain.contains("rate limit: denied"), "{plain}");
    assert!(plain.contains("rule=per-ip"), "{plain}");
    assert!(plain.contains("key=198.51.100.7"), "{plain}");
    assert!(!plain.contains("grpc_method"), "{plain}");
    // A gRPC call's events name its method.
    let grpc = denial_log(false, "/helloworld.Greeter/SayHello", true).await;
    assert!(grpc.contains("rate limit: denied"), "{grpc}");
    assert!(
        grpc.contains("grpc_method=\"/helloworld.Greeter/SayHello\""),
        "{grpc}"
    );
    let redacted = denial_log(true, "/", false).await;
    assert!(redacted.contains("rate limit: denied"), "{redacted}");
    assert!(!redacted.contains("198.51.100.7"), "{redacted}");
    assert!(redacted.contains("key=#"), "{redacted}");
}

/// A shadow rule's plan is made only when one applies: its events still name the gRPC method,
/// beside an enforced rule's that has none to report.
#[tokio::test(start_paused = true)]
async fn a_shadow_rule_s_events_name_the_grpc_method() {
    let lines = Lines::default();
    let _guard = lines.listen(tracing::Level::DEBUG);
    let layer = paused::builder()
        .rule(Rule::new("enforced", Limit::per_minute(10)).key(Key::peer_ip()))
        .rule(
            Rule::new("trial", Limit::per_minute(1))
                .key(Key::peer_ip())
                .shadow(true),
        )
        .build()
        .unwrap();
    let service = layer.layer(service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::default()))
    }));
    let method = "/helloworld.Greeter/SayHello";
    for _ in 0..2 {
        let response = send(&service, from("198.51.100.7", method, true)).await;
        assert_eq!(response.status(), 200, "a shadow rule never blocks");
    }
    let logged = lines.text();
    let would_deny = logged
        .lines()
        .filter(|line| line.contains("rate limit: shadow rule would deny"))
        .collect::<Vec<_>>();
    assert_eq!(would_deny.len(), 1, "{logged}");
    assert!(would_deny[0].contains("rule=trial"), "{logged}");
    assert!(
        would_deny[0].contains(&format!("grpc_method=\"{method}\"")),
        "{logged}"
    );
    assert!(!logged.contains("rate limit: denied"), "{logged}");
}

/// An operator who finds a hashed key in the top list can find its denials in the logs.
#[tokio::test(start_paused = true)]
async fn top_offenders_show_the_hash_the_logs_show() {
    let lines = Lines::default();
    let _guard = lines.listen(tracing::Level::DEBUG);
    let (layer, service) = one_per_minute_per_ip(true);
    for _ in 0..3 {
        send(&service, from("198.51.100.7", "/", false)).await;
    }
    let top = layer.top_offenders("per-ip").await.unwrap();
    let key = &top.offenders[0].key;
    assert!(key.starts_with('#'), "{key}");
    let logged = lines.text();
    assert!(!logged.contains("198.51.100.7"), "{logged}");
    let denials = logged
        .lines()
        .filter(|line| line.contains("rate limit: denied"))
        .collect::<Vec<_>>();
    assert_eq!(denials.len(), 2, "{logged}");
    for line in denials {
        assert!(
            line.contains(&format!("key={key}")),
            "{line} (top list: {key})"
        );
    }
}

/// One request over a real connection; the status and the body.
async fn get(addr: SocketAddr) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    let status = reply[9..12].parse().unwrap();
    let body = reply.split_once("\r\n\r\n").unwrap().1.to_owned();
    (status, body)
}

#[tokio::test]
async fn serving_without_connect_info_is_a_500_and_one_logged_error() {
    use axum::{routing::get as route_get, Router};
    use tollgate::{MissingKey, RateLimitLayer};

    let lines = Lines::default();
    // The current-thread runtime serves on this thread, where the subscriber is installed.
    let _guard = lines.listen(tracing::Level::DEBUG);
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("per-ip", Limit::per_minute(100)).key(Key::peer_ip()))
        // Skipping would silently turn this limit off: the missing peer is not the request's.
        .rule(
            Rule::new("clients", Limit::per_minute(100))
                .key(Key::client_ip().trust_loopback())
                .on_missing_key(MissingKey::Skip),
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", route_get(|| async { "hello" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // The mistake under test: `app` served as is, without `into_make_service_with_connect_info`.
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    for _ in 0..20 {
        let (status, body) = get(addr).await;
        assert_eq!(status, 500, "{body}");
        assert!(body.contains("The server is misconfigured"), "{body}");
        assert!(!body.contains("this request has none"), "{body}");
    }
    server.abort();
    let text = lines.text();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "{text}");
    assert!(
        errors[0].contains("into_make_service_with_connect_info"),
        "{text}"
    );
    assert!(errors[0].contains("per-ip"), "{text}");
}

/// A path-parameter key in a layer around the whole router runs before routing: nothing to read,
/// the server's fault. Every request is a 500, and one error names the fix.
#[tokio::test]
async fn a_path_parameter_key_before_routing_is_a_500_and_one_logged_error() {
    use axum::{routing::post, Router};
    use tower::ServiceExt;

    let lines = Lines::default();
    let _guard = lines.listen(tracing::Level::DEBUG);
    let account = Rule::new("account", Limit::per_minute(100)).key(Key::path_param("user"));
    let router = Router::new().route("/login/{user}", post(|| async { "welcome" }));
    // The mistake under test: the layer wraps the router instead of being added to it.
    let app = RateLimitLayer::new(account).layer(router);
    for _ in 0..5 {
        let request = Request::post("/login/alice")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), 500);
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap()
            .to_bytes();
        let text = std::str::from_utf8(&body).unwrap();
        assert!(text.contains("The server is misconfigured"), "{text}");
    }
    let text = lines.text();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "{text}");
    assert!(errors[0].contains("Router::layer"), "{text}");
    assert!(errors[0].contains("account"), "{text}");
}

async fn block_log(redact: bool) -> String {
    let lines = Lines::default();
    let _guard = lines.listen(tracing::Level::INFO);
    let layer = paused::builder()
        .rule(
            Rule::new("login", Limit::per_minute(1))
                .key(Key::peer_ip())
                .block(Penalty::fixed(std::time::Duration::from_secs(90))),
        )
        .redact_keys(redact)
        .build()
        .unwrap();
    let service = layer.layer(service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::default()))
    }));
    for _ in 0..3 {
        send(&service, from("198.51.100.7", "/", false)).await;
    }
    lines.text()
}

#[tokio::test(start_paused = true)]
async fn a_block_is_logged_once_at_info_with_a_redactable_key() {
    let plain = block_log(false).await;
    assert_eq!(
        plain.matches("rate limit: key blocked").count(),
        1,
        "{plain}"
    );
    assert!(plain.contains("rule=login"), "{plain}");
    assert!(plain.contains("key=198.51.100.7"), "{plain}");
    assert!(plain.contains("blocked_ms=90000"), "{plain}");
    let redacted = block_log(true).await;
    assert!(redacted.contains("rate limit: key blocked"), "{redacted}");
    assert!(!redacted.contains("198.51.100.7"), "{redacted}");
    assert!(redacted.contains("key=#"), "{redacted}");
}

#[tokio::test(start_paused = true)]
async fn a_bad_settlement_value_is_logged_once_per_rule() {
    let lines = Lines::default();
    let _guard = lines.listen(tracing::Level::WARN);
    let layer = paused::builder()
        .rule(
            Rule::new("tokens", Limit::per_minute(1_000))
                .cost(10)
                .settle(tollgate::Settle::header(http::HeaderName::from_static(
                    "x-tokens-used",
                ))),
        )
        .build()
        .unwrap();
    let service = layer.layer(service_fn(|_req: Request<Body>| async {
        let mut response = Response::new(Body::default());
        response
            .headers_mut()
            .insert("x-tokens-used", http::HeaderValue::from_static("-5"));
        Ok::<_, Infallible>(response)
    }));
    for _ in 0..3 {
        send(&service, from("198.51.100.7", "/", false)).await;
    }
    let text = lines.text();
    assert_eq!(text.matches("rate limit: settlement").count(), 1, "{text}");
    assert!(
        text.contains("x-tokens-used: \"-5\" is not a whole number"),
        "{text}"
    );
    assert!(text.contains("the estimate stays charged"), "{text}");
    // The estimate stayed charged three times.
    let left = layer.limiter().check("tokens", "", 0).await.unwrap();
    assert_eq!(left.remaining, 970);
}
