//! Configuration files: every field, every error message, tiers, allow and deny lists, reload
//! and file watching.
//!
//! Rate behaviour runs on tokio's paused time. The file-watch tests use real files and a short
//! poll interval; they wait for an outcome with a timeout and never assert on wall-clock rates.

#![cfg(feature = "config")]

#[allow(dead_code)]
#[path = "../../examples/server.rs"]
pub(crate) mod server;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tollgate::clock::{ManualClock, TokioClock};
use tollgate::config::Config;
use tollgate::config::ConfigFormat;
use tollgate::config::PlanName;
use tollgate::key::ForwardedHeader;
use tollgate::{
    AccessList, Cost, CountIf, FailurePolicy, Key, Limit, MemoryStore, MissingKey, Penalty, Queue,
    RateLimitLayer, Rule, Settle,
};
use tower::{service_fn, Layer, Service, ServiceExt};

use crate::support::oneshot;
#[cfg(feature = "redis")]
use crate::support::redis_server;
use oneshot::{send, Limited};

type Body = Full<Bytes>;

const LIMIT: Duration = Duration::from_secs(10);

fn toml(text: &str) -> RateLimitLayer {
    Config::parse(ConfigFormat::Toml, text)
        .and_then(|config| config.layer())
        .unwrap_or_else(|error| panic!("{error}"))
}

/// A layer from `text` whose memory store follows tokio's paused clock (the file cannot say so).
fn toml_paused(text: &str) -> RateLimitLayer {
    Config::parse(ConfigFormat::Toml, text)
        .and_then(|config| config.builder())
        .unwrap_or_else(|error| panic!("{error}"))
        .store(MemoryStore::with_clock(TokioClock::new()))
        .build()
        .unwrap()
}

fn yaml(text: &str) -> RateLimitLayer {
    Config::parse(ConfigFormat::Yaml, text)
        .and_then(|config| config.layer())
        .unwrap_or_else(|error| panic!("{error}"))
}

fn toml_error(text: &str) -> String {
    match Config::parse(ConfigFormat::Toml, text).and_then(|config| config.layer()) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(error) => error.to_string(),
    }
}

fn yaml_error(text: &str) -> String {
    match Config::parse(ConfigFormat::Yaml, text).and_then(|config| config.layer()) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(error) => error.to_string(),
    }
}

/// A layer's description without its store (whose clock differs between two layers).
fn described(layer: &RateLimitLayer) -> String {
    let text = format!("{layer:?}");
    let store = text.find(", store: ").expect("a store in the description");
    let responder = text.find(", responder: ").expect("a responder");
    format!("{}{}", &text[..store], &text[responder..])
}

fn service(
    layer: &RateLimitLayer,
) -> impl Service<
    Request<Body>,
    Response = Response<tollgate::middleware::ResponseBody<Body>>,
    Error = Infallible,
    Future: Send,
> + Clone {
    layer.layer(service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    }))
}

/// A request; `headers` are name-value pairs, `peer` the TCP peer's address.
fn request(method: Method, path: &str, headers: &[(&str, &str)], peer: &str) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let mut request = builder.body(Body::default()).unwrap();
    request
        .extensions_mut()
        .insert(SocketAddr::new(peer.parse().unwrap(), 40_000));
    request
}

fn get(path: &str, headers: &[(&str, &str)]) -> Request<Body> {
    request(Method::GET, path, headers, "192.0.2.1")
}

fn header<'a>(response: &'a Response<Bytes>, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

/// The statuses of `n` requests made by `make`.
async fn statuses<S: Limited<Body>>(
    service: &S,
    n: usize,
    make: impl Fn() -> Request<Body>,
) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(send(service, make()).await.status().as_u16());
    }
    out
}

fn code_block<'a>(markdown: &'a str, language: &str) -> &'a str {
    let fence = format!("```{language}\n");
    let start = markdown.find(&fence).expect("a code block") + fence.len();
    let end = start
        + markdown[start..]
            .find("\n```")
            .expect("a closed code block");
    &markdown[start..end]
}

const CONFIG_DOCS: &str = include_str!("../../src/config/CONFIG.md");

fn header_name(name: &'static str) -> HeaderName {
    HeaderName::from_static(name)
}

// ───────────────────────────── every field ─────────────────────────────

#[tokio::test]
async fn the_annotated_example_is_the_layer_built_in_code() {
    let from_file = toml(code_block(CONFIG_DOCS, "toml"));
    let api_key = || Key::header(header_name("x-api-key"));
    let minute = Duration::from_secs(60);
    let in_code = RateLimitLayer::builder()
        .shadow(false)
        .redact_keys(false)
        .store(MemoryStore::builder().max_keys(1_000_000).build())
        .on_store_failure(FailurePolicy::Open)
        .status(StatusCode::TOO_MANY_REQUESTS)
        .headers_on_allowed(true)
        .legacy_headers(false)
        .jitter(Duration::from_secs(1))
        .allow(AccessList::networks(
            Key::peer_ip(),
            [
                "10.20.0.0/16".parse().unwrap(),
                "192.0.2.10/32".parse().unwrap(),
            ],
        ))
        .deny(AccessList::keys(api_key(), ["leaked-key-123"]))
        .rule(
            Rule::new(
                "per-ip",
                Limit::token_bucket(60, minute).capacity(120).initial(60),
            )
            .key(
                Key::client_ip()
                    .try_trust(["10.0.0.0/8", "2001:db8::/32"])
                    .unwrap()
                    .trust_loopback()
                    .header(ForwardedHeader::XForwardedFor)
                    .ipv6_prefix(64)
                    .ipv4_prefix(32),
            ),
        )
        .rule(
            Rule::new(
                "login",
                Limit::fixed_window(5, Duration::from_secs(900)).aligned(),
            )
            .key(Key::client_ip())
            .methods([Method::POST])
            .path("/login")
            .path("/users/*/password")
            .on_missing_key(MissingKey::Reject)
            .block(Penalty::escalating(
                [minute, 10 * minute, 60 * minute],
                24 * 60 * minute,
            ))
            .count_if(CountIf::status([401, 403])),
        )
        .rule(
            Rule::new("greeter", Limit::token_bucket(5, minute))
                .key(Key::peer_ip())
                .grpc("/helloworld.Greeter/SayHello")
                .grpc("/acme.Admin/*"),
        )
        .rule(
            Rule::new(
                "llm-tokens",
                Limit::token_bucket(10_000, minute).pool(50_000, 100, Duration::from_secs(1)),
            )
            .key(Key::bearer())
            .path("/v1/chat")
            .cost(Cost::header(header_name("x-llm-tokens")).or(500))
            .shadow(true)
            .overridable(),
        )
        .rule(
            Rule::new("llm-spend", Limit::token_bucket(100_000, 60 * minute))
                .key(Key::bearer())
                .path("/v1/chat")
                .cost(Cost::header(header_name("x-llm-estimate")).or(1_000))
                .settle(Settle::header(header_name("x-tokens-used"))),
        )
        .rule(
            Rule::new("search", Limit::token_bucket(2_000, Duration::from_secs(1)))
                .path("/search")
                .lease(tollgate::algorithm::Lease::new(20, Duration::from_secs(1))),
        )
        .rule(
            Rule::new("upstream", Limit::per_second(5).capacity(1))
                .path("/proxy/*")
                .queue(Queue::burst(20).within(Duration::from_secs(10)).delay(5)),
        )
        .rule(
            Rule::new("api:free", Limit::token_bucket(60, minute))
                .key(api_key())
                .path("/api/*")
                .on_missing_key(MissingKey::RejectWith(StatusCode::UNAUTHORIZED))
                .when_described(
                    "plan \"free\", the default (requests whose key is not listed for another \
                     plan in `tiers.keys`)",
                    |_| true,
                ),
        )
        .rule(
            Rule::new(
                "api:pro",
                Limit::token_bucket(1_000, minute).capacity(2_000),
            )
            .key(api_key())
            .path("/api/*")
            .on_missing_key(MissingKey::RejectWith(StatusCode::UNAUTHORIZED))
            .when_described(
                "plan \"pro\" (requests whose key is the one listed for it in `tiers.keys`)",
                |_| true,
            ),
        )
        .build()
        .unwrap();
    assert_eq!(described(&from_file), described(&in_code));
}

#[tokio::test]
async fn top_offenders_sets_the_size_of_each_rules_list() {
    let rule = "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1m\"";
    for (setting, capacity) in [
        ("", 64),
        ("top_offenders = 2\n", 2),
        ("top_offenders = 0\n", 0),
    ] {
        let layer = toml(&format!("{setting}{rule}"));
        let top = layer.top_offenders("a").await.unwrap();
        assert_eq!(top.capacity, capacity, "{setting}");
    }
    assert!(toml_error(&format!("top_offenders = -1\n{rule}")).contains("top_offenders"));
}

#[tokio::test]
async fn redact_keys_with_a_secret_is_the_builders_secret() {
    let rule = "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1m\"\nkey = \"peer_ip\"";
    let secret = "0f7c2a9e4b1d83c6a5e09b7d2f4c1a8e";
    let redacted = |layer: RateLimitLayer| async move {
        let service = layer.layer(service_fn(|_: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Body::default()))
        }));
        for _ in 0..2 {
            let mut request = Request::new(Body::default());
            request
                .extensions_mut()
                .insert(SocketAddr::from(([203, 0, 113, 9], 1)));
            send(&service, request).await;
        }
        layer.top_offenders("a").await.unwrap().offenders[0]
            .key
            .clone()
    };
    let with_secret = format!("redact_keys = {{ secret = \"{secret}\" }}\n{rule}");
    let from_file = toml(&with_secret);
    let from_yaml = yaml(&format!(
        "redact_keys: {{ secret: \"{secret}\" }}\nrules:\n  - {{ name: a, rate: 1, period: 1m, key: peer_ip }}"
    ));
    let in_code = RateLimitLayer::builder()
        .rule(Rule::new("a", Limit::per_minute(1)).key(Key::peer_ip()))
        .redact_keys_secret(secret)
        .build()
        .unwrap();
    let per_process = toml(&format!("redact_keys = true\n{rule}"));
    let shown = redacted(from_file).await;
    assert!(shown.starts_with('#'), "{shown}");
    assert_eq!(shown, redacted(in_code).await);
    assert_eq!(shown, redacted(from_yaml).await);
    assert_ne!(shown, redacted(per_process).await);
    // A short secret is an error at its place; so is a table without one.
    let short = toml_error(&format!("redact_keys = {{ secret = \"hunter2\" }}\n{rule}"));
    assert!(short.starts_with("line 1, column 26:"), "{short}");
    assert!(short.contains("redact_keys.secret"), "{short}");
    assert!(short.contains("at least 16"), "{short}");
    let missing = toml_error(&format!("redact_keys = {{ key = \"{secret}\" }}\n{rule}"));
    assert!(missing.contains("redact_keys"), "{missing}");
    // The secret never shows in the configuration's `Debug`.
    let config = Config::parse(ConfigFormat::Toml, &with_secret).unwrap();
    assert!(!format!("{config:?}").contains(secret));
}

#[tokio::test]
async fn the_other_fields_are_the_layer_built_in_code() {
    let from_file = yaml(
        r#"
shadow: true
redact_keys: true
store: { kind: memory, max_keys: 500, on_failure: closed }
response: { status: 503, headers_on_allowed: false, legacy_headers: true, jitter: 250ms }
allow:
  - key: { header: x-partner }
    values: [acme]
deny:
  - key: { client_ip: { trust: [10.1.2.3], header: forwarded, ipv6_prefix: 48, ipv4_prefix: 24 } }
    networks: [203.0.113.0/24]
rules:
  - name: window
    algorithm: sliding_window
    limit: 100
    period: 1h30m
    aligned_at: 2h
    key: { cookie: session }
    on_missing_key: skip
    methods: [GET, HEAD]
  - name: log
    algorithm: sliding_log
    limit: 10
    period: 10s
    key: { first_of: [{ header: x-user }, bearer, peer_ip] }
    on_missing_key: { fallback: global }
    cost: 2
  - name: rollover
    algorithm: fixed_window
    limit: 10
    period: 1d
    capacity: 30
    aligned: false
    key: { client_ip: { header: x-real-ip } }
  - name: nginx
    rate: 2
    period: 1s
    queue: { burst: 4, nodelay: true }
    cost: { header: x-cost }
"#,
    );
    let in_code = RateLimitLayer::builder()
        .shadow(true)
        .redact_keys(true)
        .store(MemoryStore::builder().max_keys(500).build())
        .on_store_failure(FailurePolicy::Closed)
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .headers_on_allowed(false)
        .legacy_headers(true)
        .jitter(Duration::from_millis(250))
        .allow(AccessList::keys(
            Key::header(header_name("x-partner")),
            ["acme"],
        ))
        .deny(AccessList::networks(
            Key::client_ip()
                .try_trust(["10.1.2.3"])
                .unwrap()
                .header(ForwardedHeader::Forwarded)
                .ipv6_prefix(48)
                .ipv4_prefix(24),
            ["203.0.113.0/24".parse().unwrap()],
        ))
        .rule(
            Rule::new(
                "window",
                Limit::sliding_window(100, Duration::from_secs(5_400))
                    .aligned_at(Duration::from_secs(7_200)),
            )
            .key(Key::cookie("session"))
            .on_missing_key(MissingKey::Skip)
            .methods([Method::GET, Method::HEAD]),
        )
        .rule(
            Rule::new("log", Limit::sliding_log(10, Duration::from_secs(10)))
                .key(Key::first_of([
                    Key::header(header_name("x-user")),
                    Key::bearer(),
                    Key::peer_ip(),
                ]))
                .on_missing_key(MissingKey::Fallback(Key::global()))
                .cost(2),
        )
        .rule(
            Rule::new(
                "rollover",
                Limit::fixed_window(10, Duration::from_secs(86_400)).capacity(30),
            )
            .key(Key::client_ip().header(ForwardedHeader::XRealIp)),
        )
        .rule(
            Rule::new("nginx", Limit::per_second(2))
                .queue(Queue::burst(4).nodelay())
                .cost(Cost::header(header_name("x-cost"))),
        )
        .build()
        .unwrap();
    assert_eq!(described(&from_file), described(&in_code));
}

#[test]
fn toml_and_yaml_say_the_same() {
    let from_toml = toml(
        r#"
[[rules]]
name = "api"
period = "1m"
key = { header = "x-api-key" }
paths = ["/api/*"]
[rules.tiers]
from = { header = "x-plan" }
default = "free"
plans.free = { rate = 60 }
plans.pro = { rate = 1000, capacity = 50 }
"#,
    );
    let from_yaml = yaml(
        r#"
rules:
  - name: api
    period: 1m
    key: { header: x-api-key }
    paths: [/api/*]
    tiers:
      from: { header: x-plan }
      default: free
      plans:
        free: { rate: 60 }
        pro: { rate: 1000, capacity: 50 }
"#,
    );
    assert_eq!(described(&from_toml), described(&from_yaml));
    // Plans keep the file's order.
    assert_eq!(
        crate::rule_names(from_toml.limiter()),
        ["api:free", "api:pro"]
    );
}

#[test]
fn the_guides_example_loads() {
    let layer = toml(code_block(
        include_str!("../../src/guide/config.md"),
        "toml",
    ));
    assert_eq!(
        crate::rule_names(layer.limiter()),
        ["login", "api:free", "api:pro"]
    );
}

#[test]
fn the_documented_yaml_loads() {
    let layer = yaml(code_block(CONFIG_DOCS, "yaml"));
    assert_eq!(
        crate::rule_names(layer.limiter()),
        ["login", "api:free", "api:pro"]
    );
}

#[tokio::test(start_paused = true)]
async fn parsed_values_drive_the_limits() {
    let layer = toml_paused(
        r#"
[response]
legacy_headers = true

[[rules]]
name = "burst"
rate = 1
period = "1s"
capacity = 3
initial = 2
key = { header = "x-user" }
methods = ["POST"]
paths = ["/limited/*"]
cost = { header = "x-cost", default = 1 }
on_missing_key = { reject = 401 }
"#,
    );
    let service = service(&layer);
    let post = |cost: Option<&str>| {
        let mut headers = vec![("x-user", "u1")];
        if let Some(cost) = cost {
            headers.push(("x-cost", cost));
        }
        request(Method::POST, "/limited/a/b", &headers, "192.0.2.1")
    };
    // A new key starts with 2 of its 3 units; a request without the header costs 1.
    let first = send(&service, post(None)).await;
    assert_eq!(
        header(&first, "ratelimit-policy"),
        Some("\"burst\";q=3;w=3")
    );
    assert_eq!(header(&first, "ratelimit"), Some("\"burst\";r=1;t=1"));
    assert_eq!(header(&first, "x-ratelimit-remaining"), Some("1"));
    assert_eq!(send(&service, post(Some("2"))).await.status(), 429);
    assert_eq!(send(&service, post(Some("1"))).await.status(), 200);
    // Outside the scope: other methods and paths are not limited.
    let other = send(&service, get("/limited/a", &[("x-user", "u1")])).await;
    assert_eq!(other.status(), 200);
    assert_eq!(header(&other, "ratelimit"), None);
    let outside = request(Method::POST, "/limited", &[("x-user", "u1")], "192.0.2.1");
    assert_eq!(send(&service, outside).await.status(), 200);
    // Without the key: the configured status.
    let anonymous = request(Method::POST, "/limited/x", &[], "192.0.2.1");
    assert_eq!(send(&service, anonymous).await.status(), 401);
    // One unit a second comes back, up to the burst of 3.
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(
        statuses(&service, 4, || post(None)).await,
        [200, 200, 200, 429]
    );
}

#[tokio::test(start_paused = true)]
async fn grpc_scopes_name_methods_and_services() {
    let layer = toml_paused(
        r#"
[[rules]]
name = "greet"
rate = 1
period = "1m"
grpc = ["/helloworld.Greeter/SayHello", "/acme.Admin/*"]
"#,
    );
    let service = service(&layer);
    let call = |path: &str| {
        request(
            Method::POST,
            path,
            &[("content-type", "application/grpc")],
            "192.0.2.1",
        )
    };
    let first = send(&service, call("/helloworld.Greeter/SayHello")).await;
    assert_eq!(header(&first, "ratelimit"), Some("\"greet\";r=0;t=60"));
    let second = send(&service, call("/acme.Admin/Reset")).await;
    assert_eq!(second.status(), 200);
    assert_eq!(header(&second, "grpc-status"), Some("8"));
    // Outside the scope: other methods of the service, other services.
    for path in ["/helloworld.Greeter/SayBye", "/acme.Other/Reset"] {
        let other = send(&service, call(path)).await;
        assert_eq!(header(&other, "grpc-status"), None, "{path}");
        assert_eq!(header(&other, "ratelimit"), None, "{path}");
    }
}

#[tokio::test(start_paused = true)]
async fn queue_settings_delay_requests() {
    let layer = toml_paused(
        r#"
[[rules]]
name = "paced"
rate = 1
period = "1s"
queue = { burst = 2, max_delay = "5s" }
"#,
    );
    let service = service(&layer);
    assert_eq!(send(&service, get("/", &[])).await.status(), 200);
    let started = tokio::time::Instant::now();
    let delayed = send(&service, get("/", &[])).await;
    assert_eq!(delayed.status(), 200);
    assert_eq!(header(&delayed, "tollgate-delay"), Some("1"));
    assert_eq!(started.elapsed(), Duration::from_secs(1));
}

/// `capacity` sets a limit's capacity; `burst`, its spelling before 0.3, is refused with the
/// place and the right name (a queue's `burst` is the only meaning of the word now).
#[test]
fn capacity_sets_the_capacity_and_its_old_spelling_burst_says_so() {
    let new = toml("[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\ncapacity = 7");
    let in_code = RateLimitLayer::new(Rule::new("a", Limit::per_second(1).capacity(7)));
    assert_eq!(described(&new), described(&in_code));
    let old = "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nburst = 7";
    let error = Config::parse(ConfigFormat::Toml, old)
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        "line 5, column 1: rules[0].burst (rule \"a\"): unknown field (did you mean `capacity`? \
         `burst` was its name before 0.3)"
    );
    let plan = "[[rules]]\nname = \"a\"\nkey = { header = \"x-key\" }\n\
                [rules.tiers]\nkeys = { k = \"pro\" }\ndefault = \"pro\"\n\
                plans.pro = { rate = 1, burst = 7 }\n";
    let error = Config::parse(ConfigFormat::Toml, plan)
        .unwrap_err()
        .to_string();
    assert!(error.contains("did you mean `capacity`?"), "{error}");
}

/// Calendar windows from a file: `calendar = "month"` or `"week"` with a `utc_offset`, the same
/// limits as in code.
#[tokio::test]
async fn calendar_windows_from_a_file() {
    let text = r#"
[[rules]]
name = "plan"
algorithm = "fixed_window"
limit = 10_000
calendar = "month"
utc_offset = "+02:00"

[[rules]]
name = "weekly"
algorithm = "fixed_window"
limit = 5
calendar = "week"
utc_offset = "-05:30"
capacity = 10
"#;
    // 2024-02-29T21:59:59Z: one second before March in UTC+2.
    let clock = ManualClock::new(Duration::from_secs(1_709_243_999));
    let layer = Config::parse(ConfigFormat::Toml, text)
        .and_then(|config| config.builder())
        .unwrap()
        .store(MemoryStore::with_clock(clock.clone()))
        .build()
        .unwrap();
    let in_code = RateLimitLayer::builder()
        .rule(Rule::new("plan", Limit::calendar_month(10_000, 7_200)))
        .rule(Rule::new(
            "weekly",
            Limit::calendar_week(5, -19_800).capacity(10),
        ))
        .build()
        .unwrap();
    assert_eq!(described(&layer), described(&in_code));
    let limiter = layer.limiter();
    let out = limiter.charge("plan", "k", 10_000).await.unwrap();
    assert_eq!(out.next_unit_in, Duration::from_secs(1));
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        limiter.check("plan", "k", 0).await.unwrap().remaining,
        10_000
    );
}

/// Queue mode on a fixed window, from a file: DESIGN §2's waits (10 per minute, reserve 16 at the
/// window's start → 60 s; 5 more at +30 s → 90 s).
#[tokio::test]
async fn a_queued_fixed_window_from_a_file() {
    let text = r#"
[[rules]]
name = "quota"
algorithm = "fixed_window"
limit = 10
period = "1m"
aligned = true
queue = { burst = 11 }
"#;
    let clock = ManualClock::new(Duration::from_secs(1_750_000_020)); // a whole minute
    let layer = Config::parse(ConfigFormat::Toml, text)
        .and_then(|config| config.builder())
        .unwrap()
        .store(MemoryStore::with_clock(clock.clone()))
        .build()
        .unwrap();
    let in_code = RateLimitLayer::builder()
        .rule(
            Rule::new(
                "quota",
                Limit::fixed_window(10, Duration::from_secs(60)).aligned(),
            )
            .queue(Queue::burst(11)),
        )
        .build()
        .unwrap();
    assert_eq!(described(&layer), described(&in_code));
    let limiter = layer.limiter();
    let first = limiter.reserve("quota", "k", 16).await.unwrap();
    assert_eq!(first.wait(), Duration::from_secs(60));
    clock.advance(Duration::from_secs(30));
    let second = limiter.reserve("quota", "k", 5).await.unwrap();
    assert_eq!(second.wait(), Duration::from_secs(90));
}

#[tokio::test(start_paused = true)]
async fn shadow_rules_and_response_options() {
    let layer = toml(
        r#"
[response]
status = 503
headers_on_allowed = false

[[rules]]
name = "watched"
rate = 1
period = "1m"
shadow = true

[[rules]]
name = "enforced"
rate = 2
period = "1m"
"#,
    );
    let service = service(&layer);
    let first = send(&service, get("/", &[])).await;
    assert_eq!(first.status(), 200);
    assert_eq!(header(&first, "ratelimit"), None);
    // "watched" would deny the second request, but only records it.
    assert_eq!(statuses(&service, 2, || get("/", &[])).await, [200, 503]);
}

// ───────────────────────────── every error ─────────────────────────────

/// Every way a file can be wrong, with the message it gets: the place of the value (with the
/// line and column when the parser knows them) and what is wrong with it.
/// `{ path_param = "user" }`: the route's parameter as the handler sees it, every spelling of an
/// account one key.
#[tokio::test(start_paused = true)]
async fn a_path_parameter_key_from_a_file() {
    use axum::routing::post;
    let layer = toml_paused(
        "[[rules]]\nname = \"account\"\nrate = 2\nperiod = \"1m\"\nkey = { path_param = \"user\" }\n",
    );
    let app = axum::Router::new()
        .route("/login/{user}", post(|| async { "welcome" }))
        .route_layer(layer);
    let mut statuses = Vec::new();
    for path in [
        "/login/alice",
        "/login/%61lice",
        "/login/a%6Cice",
        "/login/bob",
    ] {
        let request = http::Request::post(path)
            .body(axum::body::Body::empty())
            .unwrap();
        statuses.push(
            app.clone()
                .oneshot(request)
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 429, 200]);
}

#[test]
fn every_error_names_its_place() {
    use ConfigFormat::{Toml, Yaml};
    let cases = [
        (Toml, "ratelimits = 1\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 1, column 1: ratelimits: unknown field (expected one of `shadow`, `redact_keys`, `top_offenders`, `store`, `response`, `allow`, `deny`, `rules`)"),
        (Toml, "[[rules]]\nname = \"a\"\nrat = 5", "line 3, column 1: rules[0].rat (rule \"a\"): unknown field (did you mean `rate`?)"),
        (Toml, "[settings]", "line 1, column 2: settings: unknown field (expected one of `shadow`, `redact_keys`, `top_offenders`, `store`, `response`, `allow`, `deny`, `rules`)"),
        (Toml, "[[rules]]\nrate = 5\nperiod = \"1s\"", "line 1, column 1: rules[0].name: is required"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = \"5\"\nperiod = \"1s\"", "line 3, column 8: rules[0].rate (rule \"a\"): expected a whole number (0 or more), found string \"5\""),
        (Toml, "[[rules]]\nname = \"a\"\nrate = -1\nperiod = \"1s\"", "line 3, column 8: rules[0].rate (rule \"a\"): expected a whole number (0 or more), found integer `-1`"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1.5\nperiod = \"1s\"", "line 3, column 8: rules[0].rate (rule \"a\"): expected a whole number (0 or more), found floating point `1.5`"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"leaky_bucket\"\nrate = 1\nperiod = \"1s\"", "line 3, column 13: rules[0].algorithm (rule \"a\"): unknown value \"leaky_bucket\" (expected one of `token_bucket`, `fixed_window`, `sliding_window`, `sliding_log`)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1 fortnight\"", "line 4, column 10: rules[0].period (rule \"a\"): invalid duration \"1 fortnight\" (expected e.g. \"500ms\", \"1m\", \"24h\", \"1h30m\")"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = 60", "line 4, column 10: rules[0].period (rule \"a\"): a duration needs a unit: write \"60s\" or \"60ms\""),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = \"peer-ip\"", "line 5, column 7: rules[0].key (rule \"a\"): unknown key source \"peer-ip\" (did you mean \"peer_ip\"?)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = { query = \"user\" }", "line 5, column 7: rules[0].key (rule \"a\"): unknown key source \"query\" (expected global, peer_ip, client_ip, bearer, header, cookie, path_param or first_of)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = { path_param = \"\" }", "line 5, column 22: rules[0].key.path_param (rule \"a\"): names no path parameter"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = { peer_ip = true }", "line 5, column 7: rules[0].key (rule \"a\"): the peer_ip key source takes no settings: write it as a plain string"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = \"header\"", "line 5, column 7: rules[0].key (rule \"a\"): the header key source needs a setting: a table with `header = ...`"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = { header = \"x-a\", cookie = \"b\" }", "line 5, column 7: rules[0].key (rule \"a\"): a key source is a table with exactly one entry (found another: `header`)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = {}", "line 5, column 7: rules[0].key (rule \"a\"): a key source cannot be an empty table"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = 7", "line 5, column 7: rules[0].key (rule \"a\"): expected a key source: a name such as \"peer_ip\", or a table such as { header = NAME }, found integer `7`"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = { header = \"x api\" }", "line 5, column 18: rules[0].key.header (rule \"a\"): invalid header name \"x api\""),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = { client_ip = { trust = [\"10.0.0/8\"] } }", "line 5, column 31: rules[0].key.client_ip.trust[0] (rule \"a\"): invalid network \"10.0.0/8\" (expected an address or a CIDR network such as \"10.0.0.0/8\")"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = { client_ip = { trus = [] } }", "line 5, column 23: rules[0].key.client_ip.trus (rule \"a\"): unknown field (did you mean `trust`?)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = { client_ip = { header = \"x-client-ip\" } }", "line 5, column 32: rules[0].key.client_ip.header (rule \"a\"): unknown value \"x-client-ip\" (expected one of `x-forwarded-for`, `forwarded`, `x-real-ip`)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = { client_ip = { ipv6_prefix = 0 } }", "line 5, column 37: rules[0].key.client_ip.ipv6_prefix (rule \"a\"): must be from 1 to 128"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = { client_ip = { ipv6_prefix = 129 } }", "line 5, column 37: rules[0].key.client_ip.ipv6_prefix (rule \"a\"): must be from 1 to 128"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = { client_ip = { ipv4_prefix = 33 } }", "line 5, column 37: rules[0].key.client_ip.ipv4_prefix (rule \"a\"): must be from 1 to 32"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = { cookie = \"\" }", "line 5, column 18: rules[0].key.cookie (rule \"a\"): names no cookie"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = { first_of = [] }", "line 5, column 20: rules[0].key.first_of (rule \"a\"): lists no key"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = { first_of = [\"peer_ip\", { client_ip = { ipv4_prefix = 40 } }] }", "line 5, column 62: rules[0].key.first_of[1].client_ip.ipv4_prefix (rule \"a\"): must be from 1 to 32"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\non_missing_key = \"ignore\"", "line 5, column 18: rules[0].on_missing_key (rule \"a\"): unknown action \"ignore\" (expected reject, skip, { reject = STATUS } or { fallback = KEY })"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\non_missing_key = { reject = 200 }", "line 5, column 29: rules[0].on_missing_key.reject (rule \"a\"): 200 is not a 4xx or 5xx status"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\non_missing_key = { reject = 1000 }", "line 5, column 29: rules[0].on_missing_key.reject (rule \"a\"): 1000 is not a 4xx or 5xx status"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nblock = \"0s\"", "line 5, column 9: rules[0].block (rule \"a\"): must be greater than zero (a block lasts at least 1 µs)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nblock = { escalate = [], forget_after = \"1h\" }", "line 5, column 22: rules[0].block.escalate (rule \"a\"): must list at least one duration"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nblock = { escalate = [\"1m\", \"-10m\"], forget_after = \"1h\" }", "line 5, column 29: rules[0].block.escalate[1] (rule \"a\"): invalid duration \"-10m\" (expected e.g. \"500ms\", \"1m\", \"24h\", \"1h30m\")"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nlease = { units = 0, ttl = \"1s\" }", "line 5, column 19: rules[0].lease.units (rule \"a\"): must be at least 1"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nlease = { units = 1, ttl = \"0s\" }", "line 5, column 28: rules[0].lease.ttl (rule \"a\"): must be more than 0 and at most 60 s (a change made elsewhere is seen at most one lease late)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nlease = { units = 2, ttl = \"1s\" }", "line 5, column 19: rules[0].lease.units (rule \"a\"): 2 exceeds the capacity (1): no lease could ever be granted whole"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 5\nperiod = \"1s\"\nlease = { units = 2, ttl = \"1s\" }\nblock = \"1m\"", "line 6, column 9: rules[0].block (rule \"a\"): not available on a rule with a lease: its charges are decided exactly"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"sliding_log\"\nlimit = 5\nperiod = \"1s\"\nlease = { units = 2, ttl = \"1s\" }", "line 6, column 9: rules[0].lease (rule \"a\"): only a token bucket, a fixed window or a sliding window can lease units"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 5\nperiod = \"1s\"\nlease = { units = 2 }", "line 5, column 9: rules[0].lease.ttl (rule \"a\"): is required"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\ncount_if = \"errors\"", "line 5, column 12: rules[0].count_if (rule \"a\"): unknown response class \"errors\" (expected failures, server_errors, successes or { status = [CODES] })"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\ncount_if = { status = [] }", "line 5, column 23: rules[0].count_if.status (rule \"a\"): lists no status: nothing would count"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\ncount_if = { status = [401, 1000] }", "line 5, column 29: rules[0].count_if.status[1] (rule \"a\"): 1000 is not an HTTP status"),
        (Toml, "[[rules]]\nname = \"a\"\nlimit = 1\nalgorithm = \"sliding_window\"\nperiod = \"1s\"\nsettle = { header = \"x-used\" }", "line 6, column 10: rules[0].settle (rule \"a\"): needs a token bucket or a fixed window: a settlement may leave a debt, which only they can hold"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nblock = 10", "line 5, column 9: rules[0].block (rule \"a\"): expected a duration such as \"10m\", or a table { escalate = [DURATIONS], forget_after = DURATION }, found integer `10`"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\non_missing_key = { drop = 1 }", "line 5, column 18: rules[0].on_missing_key (rule \"a\"): unknown action \"drop\" (expected reject or fallback)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\non_missing_key = { fallback = \"nobody\" }", "line 5, column 31: rules[0].on_missing_key.fallback (rule \"a\"): unknown key source \"nobody\" (expected global, peer_ip, client_ip, bearer, header, cookie, path_param or first_of)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\ncost = -1", "line 5, column 8: rules[0].cost (rule \"a\"): must not be negative (got -1)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\ncost = \"5\"", "line 5, column 8: rules[0].cost (rule \"a\"): expected a whole number of units or a table { header = NAME, default = UNITS }, found string \"5\""),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\ncost = { header = \"x-cost\", defualt = 1 }", "line 5, column 29: rules[0].cost.defualt (rule \"a\"): unknown field (did you mean `default`?)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\ncost = { default = 1 }", "line 5, column 8: rules[0].cost.header (rule \"a\"): is required"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nmethods = [\"get\"]", "line 5, column 12: rules[0].methods[0] (rule \"a\"): methods are case-sensitive: write \"GET\", not \"get\""),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nmethods = [\"GE T\"]", "line 5, column 12: rules[0].methods[0] (rule \"a\"): invalid method \"GE T\""),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\npaths = [\"login\"]", "line 5, column 10: rules[0].paths[0] (rule \"a\"): \"login\" does not start with '/'"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\ngrpc = [\"/helloworld.Greeter\"]", "line 5, column 9: rules[0].grpc[0] (rule \"a\"): \"/helloworld.Greeter\" names no method: write \"/package.Service/Method\" or \"/package.Service/*\""),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\ngrpc = [\"/pkg.S/Say*\"]", "line 5, column 9: rules[0].grpc[0] (rule \"a\"): \"/pkg.S/Say*\" has no valid method name (letters, digits and '_', or '*' for all): write \"/package.Service/Method\" or \"/package.Service/*\""),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nqueue = { size = 3 }", "line 5, column 11: rules[0].queue.size (rule \"a\"): unknown field (expected one of `burst`, `delay`, `nodelay`, `max_delay`)"),
        (Toml, "[store]\nkind = \"disk\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 2, column 8: store.kind: unknown value \"disk\" (expected one of `memory`, `redis`, `postgres`)"),
        (Toml, "[store]\nmax_keys = 10\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 1, column 1: store.kind: is required"),
        (Toml, "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\non_failure = { local = { share = 1.5 } }\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 4, column 34: store.on_failure.local.share: must be greater than 0 and at most 1, not 1.5"),
        (Toml, "[store]\nkind = \"memory\"\non_failure = \"half\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 3, column 14: store.on_failure: unknown value \"half\" (expected one of `open`, `closed`, `local`)"),
        (Toml, "[response]\ncolor = \"red\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 2, column 1: response.color: unknown field (expected one of `status`, `headers_on_allowed`, `legacy_headers`, `jitter`)"),
        (Toml, "x = = 1", "line 1, column 5: extra `=`, expected nothing"),
        (Toml, "rules = 5", "line 1, column 9: rules: expected a list, found integer `5`"),
        (Toml, "", "line 1, column 1: rules: is required"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n[rules.tiers]\ndefault = \"free\"\nkeys = {}\n[rules.tiers.plans.free]\nrat = 3", "line 9, column 1: rules[0].tiers.plans.free.rat (rule \"a\"): unknown field (did you mean `rate`?)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n[rules.tiers]\nkeys = {}\nplans.free = {}", "line 5, column 1: rules[0].tiers.default (rule \"a\"): is required"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n[rules.tiers]\nfrom = \"cookie\"\ndefault = \"free\"\nplans.free = {}", "line 6, column 8: rules[0].tiers.from (rule \"a\"): unknown plan source \"cookie\" (expected key, extension or header)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n[rules.tiers]\nfrom = \"header\"\ndefault = \"free\"\nplans.free = {}", "line 6, column 8: rules[0].tiers.from (rule \"a\"): a header source names the header: a table with `header = NAME`"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n[rules.tiers]\nfrom = { key = true }\ndefault = \"free\"\nplans.free = {}", "line 6, column 8: rules[0].tiers.from (rule \"a\"): this plan source takes no settings: write it as a plain string"),
        (Yaml, "rules:\n  - name: a\n    rate: 1\n    period: 1s\n    rate: 2", "line 2, column 5: rules[0].rate (rule \"a\"): is given twice"),
        (Yaml, "rules:\n  - name: a\n    period: 1m\n    tiers:\n      from: extension\n      default: free\n      plans:\n        free: {rate: 1}\n        free: {rate: 2}", "line 8, column 9: rules[0].tiers.plans (rule \"a\"): \"free\" appears twice"),
        (Yaml, "rules: [\n", "line 2, column 1: rules: did not find expected node content, while parsing a flow node"),
        (Yaml, "rules:\n  - name: a\n    rate: 1\n    period: 1s\n    aligned: yes", "line 5, column 14: rules[0].aligned (rule \"a\"): expected true or false, found string \"yes\""),
        (Yaml, "rules:\n  - name: a\n    rate: 1\n    period: 1s\n    key: {client_ip: {trust: [10.0.0/8]}}", "line 5, column 30: rules[0].key.client_ip.trust[0] (rule \"a\"): invalid network \"10.0.0/8\" (expected an address or a CIDR network such as \"10.0.0.0/8\")"),
        (Yaml, "rules:\n  - name: a\n    rate: 1\n    period: 1 fortnight", "line 4, column 13: rules[0].period (rule \"a\"): invalid duration \"1 fortnight\" (expected e.g. \"500ms\", \"1m\", \"24h\", \"1h30m\")"),
        (Yaml, "rules:\n  - name: a\n    rate: 1\n    period: 1s\n    key: {header: x-api-key, cookie: s}", "line 5, column 10: rules[0].key (rule \"a\"): a key source is a table with exactly one entry (found another: `cookie`)"),
        (Yaml, "---\nrules: []\n---\nrules: []", "deserializing from YAML containing more than one document is not supported"),
        (Yaml, "- a\n- b", "line 1, column 1: expected a table, found sequence"),
        (Toml, "rules = []", "line 1, column 9: rules: is empty: a layer without rules limits nothing (only a layer with a deny list may have no rules)"),
        (Toml, "rules = []\n[[allow]]\nkey = \"peer_ip\"\nnetworks = [\"10.0.0.0/8\"]", "line 1, column 9: rules: is empty: a layer without rules limits nothing (only a layer with a deny list may have no rules)"),
        (Toml, "[[rules]]\nname = \"a\"\nperiod = \"1s\"", "line 1, column 1: rules[0].rate (rule \"a\"): is required by a token_bucket"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1", "line 1, column 1: rules[0].period (rule \"a\"): is required by a token_bucket"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nperiod = \"1s\"", "line 1, column 1: rules[0].limit (rule \"a\"): is required by a fixed_window"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nrate = 5\nperiod = \"1s\"", "line 4, column 8: rules[0].rate (rule \"a\"): windows take `limit`, not `rate`"),
        (Toml, "[[rules]]\nname = \"a\"\nlimit = 5\nperiod = \"1s\"", "line 3, column 9: rules[0].limit (rule \"a\"): a token_bucket takes `rate`, not `limit`"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1s\"\ninitial = 1", "line 6, column 11: rules[0].initial (rule \"a\"): is not used by a fixed_window"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"sliding_window\"\nlimit = 5\nperiod = \"1s\"\npool = { capacity = 1, rate = 1, period = \"1s\" }", "line 6, column 8: rules[0].pool (rule \"a\"): is not used by a sliding_window"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 5\nperiod = \"1s\"\naligned = true", "line 5, column 11: rules[0].aligned (rule \"a\"): only windows are aligned"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 5\nperiod = \"1s\"\naligned_at = \"1h\"", "line 5, column 14: rules[0].aligned_at (rule \"a\"): only windows are aligned"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"sliding_log\"\nlimit = 5\nperiod = \"1s\"\naligned = true", "line 6, column 11: rules[0].aligned (rule \"a\"): a sliding_log has no windows to align"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1d\"\naligned = true\naligned_at = \"2h\"", "line 7, column 14: rules[0].aligned_at (rule \"a\"): give `aligned = true` or `aligned_at`, not both"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 0\nperiod = \"1s\"", "line 3, column 8: rules[0].rate (rule \"a\"): must be greater than 0"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"0s\"", "line 4, column 10: rules[0].period (rule \"a\"): must be at least 1 µs"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"sliding_window\"\nlimit = 0\nperiod = \"1s\"", "line 4, column 9: rules[0].limit (rule \"a\"): must be greater than 0"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"sliding_log\"\nlimit = 5\nperiod = \"0ms\"", "line 5, column 10: rules[0].period (rule \"a\"): must be at least 1 µs"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\npool = { capacity = 0, rate = 1, period = \"1s\" }", "line 5, column 21: rules[0].pool.capacity (rule \"a\"): must be greater than 0"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\npool = { capacity = 5, rate = 0, period = \"1s\" }", "line 5, column 31: rules[0].pool.rate (rule \"a\"): must be greater than 0"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\npool = { capacity = 5, rate = 1, period = \"0s\" }", "line 5, column 43: rules[0].pool.period (rule \"a\"): must be at least 1 µs"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\npool = { capacity = 5, rate = 1 }", "line 5, column 8: rules[0].pool.period (rule \"a\"): is required"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 10\nperiod = \"1s\"\ncost = 11", "line 5, column 8: rules[0].cost (rule \"a\"): 11 exceeds the capacity (10): no request could ever pass"),
        (Toml, "[[rules]]\nname = \"é\"\nrate = 1\nperiod = \"1s\"", "line 2, column 8: rules[0].name: must be non-empty printable ASCII (it is sent in headers)"),
        (Toml, "[[rules]]\nname = \"\"\nrate = 1\nperiod = \"1s\"", "line 2, column 8: rules[0].name: must be non-empty printable ASCII (it is sent in headers)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nqueue = { burst = 2, delay = 3 }", "line 5, column 30: rules[0].queue.delay (rule \"a\"): must be at most the burst (2)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 5\nperiod = \"1s\"\ncost = 4\nqueue = { burst = 3 }", "line 6, column 19: rules[0].queue.burst (rule \"a\"): lets 3 units wait, less than the cost (4): a request arriving at an empty bucket could never queue"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nqueue = { max_delay = \"0s\" }", "line 5, column 23: rules[0].queue.max_delay (rule \"a\"): must be greater than 0"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nqueue = {}", "line 5, column 9: rules[0].queue (rule \"a\"): needs a bound: a burst, a max_delay, or both"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nqueue = { burst = 2, delay = 1, nodelay = true }", "line 5, column 43: rules[0].queue.nodelay (rule \"a\"): give `delay` or `nodelay`, not both"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nqueue = { max_delay = \"1s\", nodelay = true }", "line 5, column 39: rules[0].queue.nodelay (rule \"a\"): needs a burst: nodelay lets the whole burst pass at once"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n[[rules]]\nname = \"a\"\nrate = 2\nperiod = \"1s\"", "line 6, column 8: rules[1].name: the rule name \"a\" is already used by rules[0].name (names are the rules' namespaces)"),
        (Toml, "[[rules]]\nname = \"api:free\"\nrate = 1\nperiod = \"1s\"\n[[rules]]\nname = \"api\"\nrate = 1\nperiod = \"1s\"\n[rules.tiers]\nfrom = \"extension\"\ndefault = \"free\"\nplans.free = {}", "line 12, column 14: rules[1].tiers.plans.free (rule \"api\"): the rule name \"api:free\" is already used by rules[0].name (names are the rules' namespaces)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n[rules.tiers]\nfrom = \"extension\"\ndefault = \"free\"\nplans = {}", "line 8, column 9: rules[0].tiers.plans (rule \"a\"): has no plans"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n[rules.tiers]\nfrom = \"extension\"\ndefault = \"free\"\nplans.\"pro plan\" = {}", "line 8, column 20: rules[0].tiers.plans.pro plan (rule \"a\"): a plan name is letters, digits, '-', '_' and '.'"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n[rules.tiers]\nfrom = \"extension\"\ndefault = \"gold\"\nplans.free = {}\nplans.pro = {}", "line 7, column 11: rules[0].tiers.default (rule \"a\"): \"gold\" is not a plan (plans: free, pro)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n[rules.tiers]\ndefault = \"free\"\nplans.free = {}", "line 5, column 1: rules[0].tiers.keys (rule \"a\"): is required when plans come from the key (`from = \"key\"`, the default): a table from key to plan"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n[rules.tiers]\nfrom = { header = \"x-plan\" }\nkeys = { k = \"free\" }\ndefault = \"free\"\nplans.free = {}", "line 7, column 8: rules[0].tiers.keys (rule \"a\"): is only used when plans come from the key (`from = \"key\"`)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n[rules.tiers]\nkeys = { k1 = \"free\", k2 = \"gold\" }\ndefault = \"free\"\nplans.free = {}", "line 6, column 28: rules[0].tiers.keys.k2 (rule \"a\"): \"gold\" is not a plan (plans: free)"),
        (Toml, "[[rules]]\nname = \"a\"\nperiod = \"1s\"\n[rules.tiers]\nfrom = \"extension\"\ndefault = \"free\"\nplans.free = { unlimited = true, rate = 5 }", "line 7, column 41: rules[0].tiers.plans.free.rate (rule \"a\"): an unlimited plan has no limit"),
        (Toml, "[[rules]]\nname = \"a\"\nperiod = \"1s\"\n[rules.tiers]\nfrom = \"extension\"\ndefault = \"free\"\nplans.free = { rate = 1 }\nplans.pro = {}", "line 8, column 13: rules[0].tiers.plans.pro.rate (rule \"a\"): is required by a token_bucket"),
        (Toml, "[[rules]]\nname = \"a\"\nperiod = \"1s\"\n[rules.tiers]\nfrom = \"extension\"\ndefault = \"free\"\nplans.free = { rate = 0 }", "line 7, column 23: rules[0].tiers.plans.free.rate (rule \"a\"): must be greater than 0"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 0\nperiod = \"1s\"\n[rules.tiers]\nfrom = \"extension\"\ndefault = \"free\"\nplans.free = {}", "line 3, column 8: rules[0].rate (rule \"a\"): must be greater than 0"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 5\nperiod = \"1s\"\ncost = 3\n[rules.tiers]\nfrom = \"extension\"\ndefault = \"free\"\nplans.free = { rate = 2 }", "line 5, column 8: rules[0].cost (rule \"a\"): 3 exceeds the capacity (2): no request could ever pass"),
        (Toml, "[[rules]]\nname = \"a\"\nperiod = \"1s\"\n[rules.tiers]\nfrom = \"extension\"\ndefault = \"free\"\nplans.free = { algorithm = \"fixed_window\", rate = 2 }", "line 7, column 51: rules[0].tiers.plans.free.rate (rule \"a\"): windows take `limit`, not `rate`"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n[[allow]]\nkey = \"peer_ip\"", "line 5, column 1: allow[0]: lists nothing: give `values`, `networks`, or both"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n[[allow]]\nkey = { header = \"x\" }\nnetworks = [\"10.0.0.0/8\"]", "line 7, column 12: allow[0].networks: need an IP key (peer_ip or client_ip)"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n[[deny]]\nkey = { header = \"x\" }\nvalues = [\"a\", \"\"]", "line 7, column 16: deny[0].values[1]: is empty (an empty key is a missing key)"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"sliding_window\"\nlimit = 5\nperiod = \"1s\"\ncapacity = 10", "line 6, column 12: rules[0].capacity (rule \"a\"): is not used by a sliding_window"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\ncapacity = 0", "line 5, column 12: rules[0].capacity (rule \"a\"): must be greater than 0"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\ncapacity = 5\ninitial = 6", "line 6, column 11: rules[0].initial (rule \"a\"): must be at most the capacity (5)"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1s\"\ncapacity = 4", "line 6, column 12: rules[0].capacity (rule \"a\"): must be at least the per-window limit (5)"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"sliding_window\"\nlimit = 5\nperiod = \"1s\"\nqueue = { burst = 1 }", "line 6, column 9: rules[0].queue (rule \"a\"): queue mode needs a token bucket (a queued token bucket is a leaky bucket), a fixed window or a concurrency limit"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1s\"\nqueue = { burst = 2, nodelay = true }", "line 6, column 9: rules[0].queue.delay (rule \"a\"): a fixed window lets no excess pass at once: raise its limit instead"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 5\ncalendar = \"month\"\nutc_offset = \"+19:00\"", "line 6, column 14: rules[0].utc_offset (rule \"a\"): invalid UTC offset \"+19:00\": write \"+02:00\", \"-05:30\" or \"Z\", within 18 hours"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 5\ncalendar = \"month\"\nperiod = \"30d\"", "line 6, column 10: rules[0].period (rule \"a\"): a calendar window follows the calendar"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"sliding_window\"\nlimit = 5\nperiod = \"1d\"\ncalendar = \"week\"", "line 6, column 12: rules[0].calendar (rule \"a\"): only a fixed_window follows the calendar"),
        (Toml, "[[rules]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1d\"\nutc_offset = \"Z\"", "line 6, column 14: rules[0].utc_offset (rule \"a\"): only a calendar window has a UTC offset"),
        (Toml, "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n[[deny]]\nvalues = [\"a\"]", "line 5, column 1: deny[0].key: is required"),
        (Toml, "[store]\nkind = \"memory\"\nurl = \"redis://x\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 3, column 7: store.url: is only used by the redis store"),
        (Toml, "[store]\nkind = \"memory\"\ntimeout = \"1s\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 3, column 11: store.timeout: is only used by the redis store"),
        (Toml, "[store]\nkind = \"memory\"\nmax_keys = 0\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 3, column 12: store.max_keys: must be greater than 0"),
        (Toml, "[store]\nkind = \"redis\"\nurl = \"redis://x\"\nmax_keys = 5\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 4, column 12: store.max_keys: is only used by the memory store"),
        (Toml, "[store]\nkind = \"redis\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 1, column 1: store.url: is required by the redis store"),
        (Toml, "[store]\nkind = \"redis\"\nurl = \"localhost:6379\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 3, column 7: store.url: \"localhost:6379\" is not a Redis URL (expected redis://host[:port][/db], rediss://..., redis+sentinel://host:port[,host:port...]/master, or unix:///path)"),
        (Toml, "[store]\nkind = \"redis\"\nurl = \"http://localhost:6379\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 3, column 7: store.url: unsupported scheme \"http\" (expected redis://host[:port][/db], rediss://..., redis+sentinel://host:port[,host:port...]/master, or unix:///path)"),
        (Toml, "[store]\nkind = \"redis\"\nurl = \"redis://:6379\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 3, column 7: store.url: \"redis://:6379\" has no host (expected redis://host[:port][/db], rediss://..., redis+sentinel://host:port[,host:port...]/master, or unix:///path)"),
        (Toml, "[store]\nkind = \"redis\"\nurl = \"redis://localhost:port\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 3, column 7: store.url: \"redis://localhost:port\" has an invalid port (expected redis://host[:port][/db], rediss://..., redis+sentinel://host:port[,host:port...]/master, or unix:///path)"),
        (Toml, "[store]\nkind = \"redis\"\nurl = \"redis://localhost/zero\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 3, column 7: store.url: \"redis://localhost/zero\": the path must be a database number (expected redis://host[:port][/db], rediss://..., redis+sentinel://host:port[,host:port...]/master, or unix:///path)"),
        (Toml, "[store]\nkind = \"redis\"\nurl = \"redis://[::1:6379\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 3, column 7: store.url: \"redis://[::1:6379\" has an unclosed '[' (expected redis://host[:port][/db], rediss://..., redis+sentinel://host:port[,host:port...]/master, or unix:///path)"),
        (Toml, "[store]\nkind = \"redis\"\nurl = \"unix://\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 3, column 7: store.url: \"unix://\" has no socket path (expected redis://host[:port][/db], rediss://..., redis+sentinel://host:port[,host:port...]/master, or unix:///path)"),
        (Toml, "[store]\nkind = \"redis\"\nurl = \"redis://x\"\ntimeout = \"0s\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 4, column 11: store.timeout: must be greater than 0"),
        (Toml, "[store]\nkind = \"redis\"\nurl = \"rediss://user:pw@[::1]:6380/2\"\ntimeout = \"50ms\"\non_failure = \"closed\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 2, column 8: store.kind: a Redis store connects asynchronously: build the layer with `Config::connect(..).await`"),
        (Toml, "[store]\nkind = \"redis\"\nurl = \"unix:///run/redis.sock\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 2, column 8: store.kind: a Redis store connects asynchronously: build the layer with `Config::connect(..).await`"),
        (Toml, "[response]\nstatus = 200\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 2, column 10: response.status: 200 is not a 4xx or 5xx status"),
        (Toml, "[response]\nstatus = 42\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 2, column 10: response.status: 42 is not a 4xx or 5xx status"),
        (Toml, "[response]\njitter = \"soon\"\n[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"", "line 2, column 10: response.jitter: invalid duration \"soon\" (expected e.g. \"500ms\", \"1m\", \"24h\", \"1h30m\")"),
    ];
    let mut wrong = Vec::new();
    for (format, text, expected) in cases {
        let got = match format {
            Toml => toml_error(text),
            Yaml => yaml_error(text),
        };
        if got != expected {
            wrong.push(format!(
                "{text:?}\n  expected: {expected}\n       got: {got}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Values checked after parsing are located like parse errors: file, line and column of the
/// value (of the table, when the value is missing), and the rule by its name.
#[test]
fn errors_found_after_parsing_have_a_line_a_column_and_the_rule_name() {
    let toml_text = "[[rules]]\nname = \"login\"\nrate = 5\nperiod = \"1m\"\n\n[[rules]]\nname = \"per-ip\"\nrate = 0\nperiod = \"1s\"\n";
    let error = Config::parse(ConfigFormat::Toml, toml_text)
        .and_then(|config| config.layer())
        .unwrap_err();
    assert_eq!(
        (error.path(), error.rule(), error.line(), error.column()),
        ("rules[1].rate", Some("per-ip"), Some(8), Some(8))
    );
    assert_eq!(
        error.to_string(),
        "line 8, column 8: rules[1].rate (rule \"per-ip\"): must be greater than 0"
    );
    let yaml_text = "rules:\n  - name: login\n    rate: 5\n    period: 1m\n  - name: per-ip\n    period: 1s\n    rate: 0\n";
    let error = Config::parse(ConfigFormat::Yaml, yaml_text)
        .and_then(|config| config.layer())
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "line 7, column 11: rules[1].rate (rule \"per-ip\"): must be greater than 0"
    );
    // A missing value: the rule's table is the place to add it.
    let error = yaml_error("rules:\n  - name: a\n    rate: 1\n  - name: b\n    period: 1s\n");
    assert_eq!(
        error,
        "line 2, column 5: rules[0].period (rule \"a\"): is required by a token_bucket"
    );
    // From a file, the file leads.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, toml_text).unwrap();
    let error = Config::read(&path)
        .and_then(|config| config.layer())
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{}:8:8: rules[1].rate (rule \"per-ip\"): must be greater than 0",
            path.display()
        )
    );
}

#[tokio::test(start_paused = true)]
async fn methods_are_standard_unless_an_extension_is_asked_for() {
    let rule = |methods: &str| {
        format!("[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nmethods = {methods}\n")
    };
    assert_eq!(
        toml_error(&rule("[\"GET\", \"POTS\"]")),
        "line 5, column 19: rules[0].methods[1] (rule \"a\"): unknown method \"POTS\" (did you \
         mean \"POST\"? an extension method is written { extension = \"POTS\" })"
    );
    assert_eq!(
        yaml_error("rules:\n  - name: a\n    rate: 1\n    period: 1s\n    methods: [PURGE]\n"),
        "line 5, column 15: rules[0].methods[0] (rule \"a\"): unknown method \"PURGE\" (expected one \
         of GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE, PATCH; an extension method is \
         written { extension = \"PURGE\" })"
    );
    assert_eq!(
        toml_error(&rule("[{ extension = \"GET\" }]")),
        "line 5, column 12: rules[0].methods[0] (rule \"a\"): \"GET\" is a standard method: write it as a plain string"
    );
    assert_eq!(
        toml_error(&rule("[{ extension = \"PUR GE\" }]")),
        "line 5, column 12: rules[0].methods[0] (rule \"a\"): invalid method \"PUR GE\""
    );
    assert_eq!(
        toml_error(&rule("[{ verb = \"PURGE\" }]")),
        "line 5, column 12: rules[0].methods[0] (rule \"a\"): unknown method form `verb` (expected a method name or { extension = NAME })"
    );
    // An extension asked for explicitly is limited; other methods are not.
    let layer = toml(&rule("[\"DELETE\", { extension = \"PURGE\" }]"));
    let service = service(&layer);
    let purge = || request(Method::from_bytes(b"PURGE").unwrap(), "/", &[], "192.0.2.1");
    assert_eq!(statuses(&service, 2, purge).await, [200, 429]);
    assert_eq!(
        statuses(&service, 3, || get("/", &[])).await,
        [200, 200, 200]
    );
}

/// A CDN's client-IP header from the file, honoured from its networks only.
#[tokio::test(start_paused = true)]
async fn cdn_headers_from_the_file_are_read_from_their_networks_only() {
    let toml_layer = toml_paused(
        r#"
[[rules]]
name = "per-client"
rate = 1
period = "1m"
key = { client_ip = { cdn = [{ header = "cf-connecting-ip", trust = ["173.245.48.0/20"] }, { header = "fly-client-ip", trust = ["10.0.0.0/8"] }] } }
"#,
    );
    let yaml_layer = Config::parse(ConfigFormat::Yaml,
        "rules:\n  - name: per-client\n    rate: 1\n    period: 1m\n    key:\n      client_ip:\n        cdn:\n          - { header: cf-connecting-ip, trust: [173.245.48.0/20] }\n          - { header: fly-client-ip, trust: [10.0.0.0/8] }\n").and_then(|config| config.builder())
    .unwrap()
    .store(MemoryStore::with_clock(TokioClock::new()))
    .build()
    .unwrap();
    for layer in [toml_layer, yaml_layer] {
        let service = service(&layer);
        let headers = [
            ("cf-connecting-ip", "198.51.100.7"),
            ("fly-client-ip", "198.51.100.8"),
        ];
        let via = |peer: &'static str| move || request(Method::GET, "/", &headers, peer);
        // Through Cloudflare: counted by CF-Connecting-IP (one each for two clients).
        assert_eq!(statuses(&service, 2, via("173.245.48.1")).await, [200, 429]);
        assert_eq!(statuses(&service, 1, via("10.1.2.3")).await, [200]);
        // A client sending both headers straight to the app cannot pick a key: it is itself.
        assert_eq!(statuses(&service, 2, via("203.0.113.66")).await, [200, 429]);
        assert_eq!(statuses(&service, 1, via("203.0.113.67")).await, [200]);
    }
    assert_eq!(
        toml_error("[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = { client_ip = { cdn = [{ header = \"cf-connecting-ip\", trust = [] }] } }"),
        "line 5, column 69: rules[0].key.client_ip.cdn[0].trust (rule \"a\"): is empty: a CDN header is honoured only from the networks trusted for it"
    );
    assert!(toml_error("[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\nkey = { client_ip = { cdn = [{ header = \"x-client-ip\", trust = [\"10.0.0.0/8\"] }] } }")
        .contains("rules[0].key.client_ip.cdn[0].header (rule \"a\"): unknown value \"x-client-ip\""));
}

// ───────────────────────────── tiers ─────────────────────────────

/// A tier's rule says in words which requests it is for (`RuleSummary::condition`), what
/// `tollgate check` prints; a key every request has (the global key) is never missing.
#[test]
fn tiers_say_which_requests_their_rules_are_for() {
    let layer = toml(
        r#"
[[rules]]
name = "api"
period = "1m"
key = { header = "x-api-key" }
[rules.tiers]
keys = { "k1" = "pro" }
default = "free"
plans.free = { rate = 60 }
plans.pro = { rate = 1000 }

[[rules]]
name = "by-header"
period = "1m"
[rules.tiers]
from = { header = "x-plan" }
default = "free"
plans.free = { rate = 10 }
plans.pro = { rate = 100 }
"#,
    );
    let rules = layer.limiter().rules_in_force();
    let conditions: Vec<(&str, bool, Option<&str>, bool)> = rules
        .iter()
        .map(|r| {
            (
                r.name.as_str(),
                r.conditional,
                r.condition.as_deref(),
                r.key.can_be_missing(),
            )
        })
        .collect();
    assert_eq!(
        conditions,
        [
            ("api:free", true, Some("plan \"free\", the default (requests whose key is not listed for another plan in `tiers.keys`)"), true),
            ("api:pro", true, Some("plan \"pro\" (requests whose key is the one listed for it in `tiers.keys`)"), true),
            ("by-header:free", true, Some("plan \"free\", the default (requests whose x-plan header is \"free\", names no other plan, or is absent)"), false),
            ("by-header:pro", true, Some("plan \"pro\" (requests whose x-plan header is \"pro\")"), false),
        ]
    );
    // In code: described or not.
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("a", Limit::per_second(1)).when(|_| true))
        .rule(Rule::new("b", Limit::per_second(1)).when_described("requests of the beta", |_| true))
        .build()
        .unwrap();
    let rules = layer.limiter().rules_in_force();
    assert_eq!(
        (rules[0].conditional, rules[0].condition.as_deref()),
        (true, None)
    );
    assert_eq!(rules[1].condition.as_deref(), Some("requests of the beta"));
}

#[tokio::test(start_paused = true)]
async fn tiers_from_the_key_table() {
    let layer = toml(
        r#"
[[rules]]
name = "api"
period = "1m"
key = { header = "x-api-key" }
on_missing_key = { reject = 401 }
[rules.tiers]
keys = { "k-pro" = "pro", "k-partner" = "partner" }
default = "free"
[rules.tiers.plans.free]
rate = 2
[rules.tiers.plans.pro]
rate = 5
[rules.tiers.plans.partner]
unlimited = true
"#,
    );
    assert_eq!(crate::rule_names(layer.limiter()), ["api:free", "api:pro"]);
    let service = service(&layer);
    let with_key = |key: &'static str| move || get("/", &[("x-api-key", key)]);
    assert_eq!(
        statuses(&service, 3, with_key("k-unknown")).await,
        [200, 200, 429]
    );
    assert_eq!(
        statuses(&service, 6, with_key("k-pro")).await,
        [200, 200, 200, 200, 200, 429]
    );
    let pro = send(&service, with_key("k-pro")()).await;
    assert_eq!(
        header(&pro, "ratelimit-policy"),
        Some("\"api:pro\";q=5;w=60")
    );
    // The partner plan has no rule: never limited by "api".
    assert!(statuses(&service, 20, with_key("k-partner"))
        .await
        .iter()
        .all(|s| *s == 200));
    assert_eq!(send(&service, get("/", &[])).await.status(), 401);
}

#[tokio::test(start_paused = true)]
async fn tiers_from_a_header_and_from_an_extension() {
    let by_header = toml(
        r#"
[[rules]]
name = "api"
period = "1m"
rate = 1
key = "peer_ip"
[rules.tiers]
from = { header = "x-plan" }
default = "basic"
plans.basic = {}
plans.gold = { rate = 3 }
"#,
    );
    let service = service(&by_header);
    let plan = |name: &'static str| move || get("/", &[("x-plan", name)]);
    assert_eq!(
        statuses(&service, 4, plan("gold")).await,
        [200, 200, 200, 429]
    );
    // An unknown plan is the default plan; so is no plan. Both count as "basic".
    assert_eq!(statuses(&service, 2, plan("platinum")).await, [200, 429]);
    assert_eq!(send(&service, get("/", &[])).await.status(), 429);

    let by_extension = toml(
        r#"
[[rules]]
name = "api"
period = "1m"
key = "peer_ip"
[rules.tiers]
from = "extension"
default = "free"
plans.free = { rate = 1 }
plans.pro = { rate = 2 }
"#,
    );
    let service = self::service(&by_extension);
    let as_plan = |plan: Option<&'static str>| {
        move || {
            let mut request = get("/", &[]);
            if let Some(plan) = plan {
                request.extensions_mut().insert(PlanName::new(plan));
            }
            request
        }
    };
    assert_eq!(
        statuses(&service, 3, as_plan(Some("pro"))).await,
        [200, 200, 429]
    );
    assert_eq!(statuses(&service, 2, as_plan(None)).await, [200, 429]);
}

// ───────────────────────────── allow and deny ─────────────────────────────

#[tokio::test(start_paused = true)]
async fn allow_and_deny_lists() {
    let layer = toml(
        r#"
[[allow]]
key = "peer_ip"
networks = ["10.0.0.0/8"]

[[allow]]
key = { header = "x-api-key" }
values = ["trusted"]

[[deny]]
key = { header = "x-api-key" }
values = ["leaked"]
networks = []

[[deny]]
key = { client_ip = { trust = ["10.0.0.0/8"] } }
networks = ["203.0.113.0/24"]

[[rules]]
name = "global"
rate = 1
period = "1h"
"#,
    );
    let service = service(&layer);
    let from = |peer: &'static str, headers: &'static [(&'static str, &'static str)]| {
        move || request(Method::GET, "/", headers, peer)
    };
    assert_eq!(
        statuses(&service, 2, from("192.0.2.1", &[])).await,
        [200, 429]
    );
    // Allowed: the monitoring network and a trusted key; no rule is charged.
    let allowed = send(&service, from("10.1.1.1", &[])()).await;
    assert_eq!(allowed.status(), 200);
    assert_eq!(header(&allowed, "ratelimit"), None);
    assert_eq!(
        statuses(&service, 3, from("192.0.2.9", &[("x-api-key", "trusted")])).await,
        [200, 200, 200]
    );
    // Denied, before anything is counted: the leaked key, and a network behind the proxy.
    assert_eq!(
        send(&service, from("192.0.2.9", &[("x-api-key", "leaked")])())
            .await
            .status(),
        403
    );
    let behind_proxy = from("10.9.9.9", &[("x-forwarded-for", "203.0.113.50")]);
    assert_eq!(send(&service, behind_proxy()).await.status(), 403);
}

// ───────────────────────────── reload ─────────────────────────────

const RELOAD_V1: &str = r#"
[[deny]]
key = { header = "x-api-key" }
values = ["old-leak"]

[[rules]]
name = "kept"
rate = 2
period = "1h"

[[rules]]
name = "changed"
rate = 5
period = "1h"
paths = ["/changed"]
"#;

const RELOAD_V2: &str = r#"
[[deny]]
key = { header = "x-api-key" }
values = ["new-leak"]

[[rules]]
name = "kept"
rate = 2
period = "1h"

[[rules]]
name = "added"
rate = 1
period = "1h"
paths = ["/added"]
"#;

#[tokio::test(start_paused = true)]
async fn reload_keeps_the_state_of_unchanged_rules_and_replaces_the_lists() {
    let layer = toml(RELOAD_V1);
    let service = service(&layer);
    assert_eq!(send(&service, get("/", &[])).await.status(), 200);
    assert_eq!(
        send(&service, get("/", &[("x-api-key", "old-leak")]))
            .await
            .status(),
        403
    );

    Config::parse(ConfigFormat::Toml, RELOAD_V2)
        .and_then(|config| config.reload(&layer))
        .unwrap();
    assert_eq!(crate::rule_names(layer.limiter()), ["kept", "added"]);
    // "kept" remembers its first request: one unit of two is left.
    let next = send(&service, get("/", &[])).await;
    assert_eq!(header(&next, "ratelimit"), Some("\"kept\";r=0;t=1800"));
    // The lists are the new file's.
    assert_eq!(
        send(&service, get("/", &[("x-api-key", "new-leak")]))
            .await
            .status(),
        403
    );
    assert_ne!(
        send(&service, get("/", &[("x-api-key", "old-leak")]))
            .await
            .status(),
        403
    );
}

#[tokio::test(start_paused = true)]
async fn an_invalid_reload_changes_nothing() {
    let layer = toml(RELOAD_V1);
    let broken = RELOAD_V2.replace("rate = 1\n", "rate = 0\n");
    let error = Config::parse(ConfigFormat::Toml, &broken)
        .and_then(|config| config.reload(&layer))
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "line 13, column 8: rules[1].rate (rule \"added\"): must be greater than 0"
    );
    let error = Config::parse(ConfigFormat::Toml, "[store]\nkind = \"memory\"\nmax_keys = 0\n[[rules]]\nname = \"x\"\nrate = 1\nperiod = \"1s\"\n").and_then(|config| config.reload(&layer))
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "line 3, column 12: store.max_keys: must be greater than 0"
    );
    assert_eq!(crate::rule_names(layer.limiter()), ["kept", "changed"]);
    let service = service(&layer);
    assert_eq!(
        send(&service, get("/", &[("x-api-key", "old-leak")]))
            .await
            .status(),
        403
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_fails_while_rules_are_swapped() {
    let generous = |extra: &str| {
        format!(
            "[[rules]]\nname = \"all\"\nrate = 1_000_000_000\nperiod = \"1s\"\n\n\
             [[rules]]\nname = \"{extra}\"\nrate = 1_000_000_000\nperiod = \"1s\"\n"
        )
    };
    let (a, b) = (generous("extra-a"), generous("extra-b"));
    let layer = toml(&a);
    let service = service(&layer);
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move {
                let mut failed = 0;
                for _ in 0..300 {
                    let response = service.clone().oneshot(get("/", &[])).await.unwrap();
                    if response.status() != StatusCode::OK {
                        failed += 1;
                    }
                }
                failed
            })
        })
        .collect();
    let reloads = async {
        for i in 0..300 {
            let text = if i % 2 == 0 { &b } else { &a };
            Config::parse(ConfigFormat::Toml, text)
                .and_then(|config| config.reload(&layer))
                .unwrap();
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(LIMIT, reloads).await.unwrap();
    for client in clients {
        let failed = tokio::time::timeout(LIMIT, client).await.unwrap().unwrap();
        assert_eq!(failed, 0);
    }
}

// ───────────────────────────── files and watching ─────────────────────────────

fn write(path: &Path, text: &str) {
    // Written beside and renamed into place, as editors do, so the watch never reads half a file.
    let temporary = path.with_extension("partial");
    std::fs::write(&temporary, text).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

/// Polls `condition` until it holds, for at most `LIMIT`.
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    tokio::time::timeout(LIMIT, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: not within {LIMIT:?}"));
}

#[tokio::test]
async fn the_watch_reloads_a_changed_file_and_keeps_the_rules_on_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    write(&path, RELOAD_V1);
    let layer = Config::read(&path)
        .and_then(|config| config.layer())
        .unwrap();
    let watch = Config::watch(&layer, &path, Duration::from_millis(20)).unwrap();
    assert!(watch.is_running());

    write(&path, RELOAD_V2);
    eventually("the new rules", || {
        crate::rule_names(layer.limiter()) == ["kept", "added"]
    })
    .await;

    assert_eq!(watch.problem(), None);

    // A bad file is reported and ignored; a later good one is loaded.
    write(
        &path,
        "[[rules]]\nname = \"kept\"\nrate = 0\nperiod = \"1s\"\n",
    );
    eventually("the bad file reported", || {
        watch.problem().is_some_and(|why| why.contains("rate"))
    })
    .await;
    assert_eq!(crate::rule_names(layer.limiter()), ["kept", "added"]);
    std::fs::remove_file(&path).unwrap();
    eventually("the missing file reported", || {
        watch.problem().is_some_and(|why| !why.contains("rate"))
    })
    .await;
    assert_eq!(crate::rule_names(layer.limiter()), ["kept", "added"]);
    write(&path, RELOAD_V1);
    eventually("the rules of the fixed file", || {
        crate::rule_names(layer.limiter()) == ["kept", "changed"]
    })
    .await;
    assert_eq!(watch.problem(), None);
    watch.stop();
}

#[tokio::test]
async fn the_watch_ends_with_the_layer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.yaml");
    write(&path, "rules:\n  - name: a\n    rate: 1\n    period: 1s\n");
    let layer = Config::read(&path)
        .and_then(|config| config.layer())
        .unwrap();
    let watch = Config::watch(&layer, &path, Duration::from_millis(10)).unwrap();
    drop(layer);
    eventually("the watch to end", || !watch.is_running()).await;
}

#[tokio::test]
async fn watch_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    write(
        &path,
        "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n",
    );
    let layer = Config::read(&path)
        .and_then(|config| config.layer())
        .unwrap();
    let error = Config::watch(
        &layer,
        dir.path().join("limits.ini"),
        Duration::from_secs(1),
    )
    .unwrap_err();
    assert!(error
        .to_string()
        .ends_with("limits.ini: unknown configuration format: name the file .toml, .yaml or .yml"));
    let error = Config::watch(&layer, &path, Duration::ZERO).unwrap_err();
    assert!(error
        .to_string()
        .ends_with("limits.toml: the watch interval must be greater than 0"));
    let missing = dir.path().join("missing.toml");
    let error = Config::watch(&layer, &missing, Duration::from_secs(1)).unwrap_err();
    assert!(error
        .to_string()
        .contains("missing.toml: cannot read the file: "));
}

/// A misspelt field or value: the rule by its name (wherever the table gives it), and the name
/// it is likely a misspelling of rather than every name the table takes.
#[test]
fn misspellings_name_the_rule_and_the_nearest_name() {
    use ConfigFormat::{Toml, Yaml};
    let two_rules = "[[rules]]\nname = \"login\"\nrate = 5\nperiod = \"1m\"\n\n[[rules]]\nname = \"api\"\nrat = 100\nperiod = \"1m\"\n";
    let cases = [
        (Toml, two_rules, "line 8, column 1: rules[1].rat (rule \"api\"): unknown field (did you mean `rate`?)"),
        (Yaml, "rules:\n  - name: login\n    rate: 5\n    period: 1m\n  - name: api\n    rat: 100\n    period: 1m\n", "line 6, column 5: rules[1].rat (rule \"api\"): unknown field (did you mean `rate`?)"),
        // The name written after the mistake.
        (Toml, "[[rules]]\nperod = \"1m\"\nname = \"api\"\nrate = 1", "line 2, column 1: rules[0].perod (rule \"api\"): unknown field (did you mean `period`?)"),
        (Yaml, "rules:\n  - capactiy: 5\n    name: api\n", "line 2, column 5: rules[0].capactiy (rule \"api\"): unknown field (did you mean `capacity`?)"),
        // No name: the index alone.
        (Toml, "[[rules]]\nrat = 1", "line 2, column 1: rules[0].rat: unknown field (did you mean `rate`?)"),
        (Toml, "[[rules]]\nname = \"api\"\nrate = 1\nperiod = \"1s\"\n[rules.tiers]\nfrom = \"extension\"\ndefault = \"free\"\n[rules.tiers.plans.free]\nunlimted = true", "line 9, column 1: rules[0].tiers.plans.free.unlimted (rule \"api\"): unknown field (did you mean `unlimited`?)"),
        (Toml, "[store]\nkind = \"memory\"\nmax_key = 5\n[[rules]]\nname = \"api\"\nrate = 1\nperiod = \"1s\"", "line 3, column 1: store.max_key: unknown field (did you mean `max_keys`?)"),
        // Nothing near: a long list is not repeated, a short one is.
        (Toml, "[[rules]]\nname = \"api\"\ncolour = \"red\"", "line 3, column 1: rules[0].colour (rule \"api\"): unknown field (none of this table's 27 fields is spelled like it; the configuration reference lists them)"),
        (Toml, "[[rules]]\nname = \"api\"\nrate = 1\nperiod = \"1s\"\nqueue = { size = 3 }", "line 5, column 11: rules[0].queue.size (rule \"api\"): unknown field (expected one of `burst`, `delay`, `nodelay`, `max_delay`)"),
        // Values.
        (Toml, "[[rules]]\nname = \"api\"\nalgorithm = \"sliding-window\"\nlimit = 5\nperiod = \"1m\"", "line 3, column 13: rules[0].algorithm (rule \"api\"): unknown value \"sliding-window\" (did you mean \"sliding_window\"?)"),
        (Yaml, "rules:\n  - name: api\n    algorithm: fixedwindow\n    limit: 5\n    period: 1m\n", "line 3, column 16: rules[0].algorithm (rule \"api\"): unknown value \"fixedwindow\" (did you mean \"fixed_window\"?)"),
        (Toml, "[[rules]]\nname = \"api\"\nalgorithm = \"leaky_bucket\"\nrate = 1\nperiod = \"1s\"", "line 3, column 13: rules[0].algorithm (rule \"api\"): unknown value \"leaky_bucket\" (expected one of `token_bucket`, `fixed_window`, `sliding_window`, `sliding_log`)"),
        (Toml, "[[rules]]\nname = \"api\"\nrate = 1\nperiod = \"1s\"\nkey = \"peerip\"", "line 5, column 7: rules[0].key (rule \"api\"): unknown key source \"peerip\" (did you mean \"peer_ip\"?)"),
        (Toml, "[[rules]]\nname = \"api\"\nrate = 1\nperiod = \"1s\"\nkey = { heder = \"x-api-key\" }", "line 5, column 7: rules[0].key (rule \"api\"): unknown key source \"heder\" (did you mean \"header\"?)"),
        (Toml, "[[rules]]\nname = \"api\"\nrate = 1\nperiod = \"1s\"\non_missing_key = \"skp\"", "line 5, column 18: rules[0].on_missing_key (rule \"api\"): unknown action \"skp\" (did you mean \"skip\"?)"),
        (Toml, "[[rules]]\nname = \"api\"\nrate = 1\nperiod = \"1s\"\ncount_if = \"failure\"", "line 5, column 12: rules[0].count_if (rule \"api\"): unknown response class \"failure\" (did you mean \"failures\"?)"),
        (Toml, "[[rules]]\nname = \"api\"\nrate = 1\nperiod = \"1s\"\n[rules.tiers]\nfrom = \"extention\"\ndefault = \"free\"\nplans.free = {}", "line 6, column 8: rules[0].tiers.from (rule \"api\"): unknown plan source \"extention\" (did you mean \"extension\"?)"),
        (Toml, "[[rules]]\nname = \"api\"\nrate = 1\nperiod = \"1s\"\nkey = { client_ip = { header = \"x-forwarded-fro\" } }", "line 5, column 32: rules[0].key.client_ip.header (rule \"api\"): unknown value \"x-forwarded-fro\" (did you mean \"x-forwarded-for\"?)"),
        (Toml, "[store]\nkind = \"rediss\"\n[[rules]]\nname = \"api\"\nrate = 1\nperiod = \"1s\"", "line 2, column 8: store.kind: unknown value \"rediss\" (did you mean \"redis\"?)"),
    ];
    let mut wrong = Vec::new();
    for (format, text, expected) in cases {
        let got = match format {
            Toml => toml_error(text),
            Yaml => yaml_error(text),
        };
        if got != expected {
            wrong.push(format!(
                "{text:?}\n  expected: {expected}\n       got: {got}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // From a file: the file, line and column lead.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.toml");
    write(&path, two_rules);
    let error = Config::read(&path)
        .and_then(|config| config.layer())
        .unwrap_err();
    assert_eq!(
        (error.path(), error.rule(), error.line(), error.column()),
        ("rules[1].rat", Some("api"), Some(8), Some(1))
    );
    assert_eq!(
        error.to_string(),
        format!(
            "{}:8:1: rules[1].rat (rule \"api\"): unknown field (did you mean `rate`?)",
            path.display()
        )
    );
}

/// YAML forbids tabs in indentation: the error gives the line and column of the tab and says
/// so, rather than the parser's view of where it was ("while scanning a plain scalar at ...").
#[test]
fn a_tab_in_yaml_indentation_is_named_at_the_tab() {
    let tab =
        "found a tab character: YAML does not allow tabs for indentation (indent with spaces)";
    let cases = [
        ("rules:\n  - name: a\n\trate: 1\n    period: 1s\n", 3, 1),
        (
            "rules:\n  - name: a\n    rate: 1\n    period: 1s\n\tkey: peer_ip\n",
            5,
            1,
        ),
        (
            "rules:\n  - name: a\n    rate: 1\n    period: 1s\n    key:\n  \t    header: x\n",
            6,
            3,
        ),
        (
            "rules:\n  - name: a\n    rate: 1\n    period: 1s\n    key:\n\t\theader: x\n",
            6,
            1,
        ),
        (
            "store:\n\tkind: memory\nrules:\n  - name: a\n    rate: 1\n    period: 1s\n",
            2,
            1,
        ),
        (
            "rules:\n  - name: a\n    rate: 1\n    period: 1s\n    methods:\n    - GET\n\t- POST\n",
            7,
            1,
        ),
        (
            "rules:\n  - name: a\n    rate: 1\n    period: 1s\n    paths:\n    \t- /x\n",
            6,
            5,
        ),
    ];
    for (text, line, column) in cases {
        assert_eq!(
            yaml_error(text),
            format!("line {line}, column {column}: {tab}"),
            "{text:?}"
        );
    }
    // A tab elsewhere (separating a value) is allowed.
    yaml("rules:\n  - name: a\n    rate:\t1\n    period: 1s\n");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.yaml");
    write(&path, "rules:\n  - name: a\n\trate: 1\n    period: 1s\n");
    let error = Config::read(&path)
        .and_then(|config| config.layer())
        .unwrap_err();
    assert_eq!(error.to_string(), format!("{}:3:1: {tab}", path.display()));
    assert_eq!((error.path(), error.rule()), ("", None));
}

#[test]
fn file_errors_name_the_file_and_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.toml");
    write(
        &path,
        "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n\n[[rules]]\nname = \"b\"\nrate = 1\nperiod = \"1 fortnight\"\n",
    );
    let error = Config::read(&path)
        .and_then(|config| config.layer())
        .unwrap_err();
    assert_eq!(error.file(), Some(path.as_path()));
    assert_eq!(error.path(), "rules[1].period");
    assert_eq!((error.line(), error.column()), (Some(9), Some(10)));
    assert_eq!(
        error.to_string(),
        format!(
            "{}:9:10: rules[1].period (rule \"b\"): invalid duration \"1 fortnight\" (expected e.g. \"500ms\", \"1m\", \"24h\", \"1h30m\")",
            path.display()
        )
    );

    write(
        &path,
        "[[rules]]\nname = \"a\"\nrate = 0\nperiod = \"1s\"\n",
    );
    let error = Config::read(&path)
        .and_then(|config| config.layer())
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{}:3:8: rules[0].rate (rule \"a\"): must be greater than 0",
            path.display()
        )
    );
    assert_eq!(error.rule(), Some("a"));
    // Reloading reports the file too, and keeps the rules.
    let layer = toml("[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n");
    let error = Config::read(&path)
        .and_then(|config| config.reload(&layer))
        .unwrap_err();
    assert_eq!(error.file(), Some(path.as_path()));
    assert_eq!(crate::rule_names(layer.limiter()), ["a"]);

    let yaml_path = dir.path().join("api.yml");
    write(
        &yaml_path,
        "rules:\n  - name: a\n    rate: 1\n    period: 1s\n    colour: red\n",
    );
    let error = Config::read(&yaml_path)
        .and_then(|config| config.layer())
        .unwrap_err();
    assert_eq!((error.line(), error.column()), (Some(5), Some(5)));
    assert_eq!(error.path(), "rules[0].colour");
    assert_eq!(error.rule(), Some("a"));
    assert_eq!(
        error.message(),
        "unknown field (none of this table's 27 fields is spelled like it; the configuration \
         reference lists them)"
    );

    let error = Config::read(dir.path().join("none.toml"))
        .and_then(|config| config.layer())
        .unwrap_err();
    assert!(error
        .to_string()
        .contains("none.toml: cannot read the file: "));
    assert!(std::error::Error::source(&error).is_some());
    // A file that is there but named for no format (a path that is not there is told so
    // first, above).
    std::fs::write(dir.path().join("limits.json"), "{}").unwrap();
    let error = Config::read(dir.path().join("limits.json"))
        .and_then(|config| config.layer())
        .unwrap_err();
    assert!(error.to_string().ends_with(
        "limits.json: unknown configuration format: name the file .toml, .yaml or .yml"
    ));
}

#[test]
fn formats_by_extension() {
    assert_eq!(ConfigFormat::from_path("a.toml"), Some(ConfigFormat::Toml));
    assert_eq!(ConfigFormat::from_path("a.YAML"), Some(ConfigFormat::Yaml));
    assert_eq!(
        ConfigFormat::from_path("dir/a.yml"),
        Some(ConfigFormat::Yaml)
    );
    assert_eq!(ConfigFormat::from_path("a.json"), None);
    assert_eq!(ConfigFormat::from_path("toml"), None);
}

// ───────────────────────────── the sample configs ─────────────────────────────

fn sample(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/configs")
        .join(name)
}

async fn call(app: &axum::Router, request: Request<axum::body::Body>) -> (StatusCode, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn app_request(method: Method, path: &str, headers: &[(&str, &str)]) -> Request<axum::body::Body> {
    let mut builder = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let mut request = builder.body(axum::body::Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(SocketAddr::from((
            [192, 0, 2, 7],
            5000,
        ))));
    request
}

#[tokio::test(start_paused = true)]
async fn the_public_api_sample_serves_its_plans_and_metrics() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let limits = Config::read(sample("public_api.toml"))
        .and_then(|config| config.layer())
        .unwrap();
    assert_eq!(
        crate::rule_names(limits.limiter()),
        ["per-ip", "api:free", "api:pro", "daily", "exports"]
    );
    let app = server::app(limits, metrics);

    let free = || app_request(Method::GET, "/v1/items", &[("x-api-key", "demo-free")]);
    for _ in 0..10 {
        assert_eq!(call(&app, free()).await.0, StatusCode::OK);
    }
    let (status, _) = call(&app, free()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let (status, body) = call(
        &app,
        app_request(Method::GET, "/v1/items", &[("x-api-key", "demo-pro")]),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("api:pro: 99 left"), "{body}");
    let (status, body) = call(
        &app,
        app_request(Method::GET, "/v1/items", &[("x-api-key", "demo-partner")]),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(!body.contains("api:"), "{body}");
    let no_key = app_request(Method::GET, "/v1/items", &[]);
    assert_eq!(call(&app, no_key).await.0, StatusCode::UNAUTHORIZED);
    let leaked = app_request(Method::GET, "/v1/items", &[("x-api-key", "demo-leaked")]);
    assert_eq!(call(&app, leaked).await.0, StatusCode::FORBIDDEN);

    let (status, text) = call(&app, app_request(Method::GET, "/metrics", &[])).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        text.contains("tollgate_denied_total{rule=\"api:free\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("tollgate_allowed_total{rule=\"api:pro\"} 1"),
        "{text}"
    );
    // The sample redacts keys: the free key denied once is listed by its hash.
    let (status, text) = call(&app, app_request(Method::GET, "/_tollgate/top", &[])).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!text.contains("demo-free"), "{text}");
    let top: serde_json::Value = serde_json::from_str(&text).unwrap();
    let free = top["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|rule| rule["rule"] == "api:free")
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(free["denials"], 1, "{text}");
    let key = free["offenders"][0]["key"].as_str().unwrap();
    assert!(key.starts_with('#') && key.len() == 17, "{text}");
}

/// The method, path and headers of a `curl -i [-X METHOD] http://ADDR/PATH [-H 'NAME: VALUE']...`
/// line.
fn curl_request(line: &str, addr: SocketAddr) -> Request<axum::body::Body> {
    let mut parts = line.split(" -H '");
    let command = parts.next().unwrap();
    let method = command.split_once(" -X ").map_or(Method::GET, |(_, rest)| {
        rest.split(' ').next().unwrap().parse().unwrap()
    });
    let url = format!("http://{addr}");
    let path = command
        .split_whitespace()
        .find_map(|word| word.strip_prefix(&url))
        .unwrap_or_else(|| panic!("no {url} in {line}"));
    let headers: Vec<(&str, &str)> = parts
        .map(|header| header.trim_end_matches('\'').split_once(": ").unwrap())
        .collect();
    app_request(method, path, &headers)
}

/// The sample server prints `curl` lines made from the file it loaded, each with the rules that
/// count it (issue 39: it printed the public API sample's lines whatever file it loaded). Each
/// line of two different files, sent to a server of that file, is counted by those rules.
#[tokio::test]
async fn the_sample_server_prints_lines_made_from_the_file_it_loaded() {
    let addr: SocketAddr = "127.0.0.1:3000".parse().unwrap();
    let mut texts = Vec::new();
    for name in ["public_api.toml", "login_protection.yaml"] {
        let config = Config::read(sample(name)).unwrap();
        let probes = server::probes(&config).await.unwrap();
        let text = server::try_lines(addr, &probes);
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let app = server::app(config.layer().unwrap(), recorder.handle());
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        let mut tried = 0;
        for pair in lines.windows(2) {
            let Some(counted_by) = pair[1].strip_prefix("# counted by ") else {
                continue;
            };
            let (status, body) = call(&app, curl_request(pair[0], addr)).await;
            assert_eq!(status, StatusCode::OK, "{}: {body}", pair[0]);
            // The answer lists the enforced rules that applied (`  NAME: N left`), or says none
            // did.
            let said: Vec<&str> = counted_by
                .split(", ")
                .filter(|rule| !rule.ends_with(" (shadow)"))
                .collect();
            let answered: Vec<&str> = match body.lines().nth(1) {
                Some("  no rule applied") => Vec::new(),
                _ => body
                    .lines()
                    .skip(1)
                    .filter_map(|line| Some(line.trim().rsplit_once(": ")?.0))
                    .collect(),
            };
            assert_eq!(answered, said, "{}: {body}\n{text}", pair[0]);
            tried += 1;
        }
        assert!(tried >= 2, "{name}:\n{text}");
        texts.push(text);
    }
    let [public_api, login] = &texts[..] else {
        unreachable!()
    };
    assert!(
        public_api.contains("curl -i http://127.0.0.1:3000/v1/demo -H 'x-api-key: demo'\n"),
        "{public_api}"
    );
    assert!(
        public_api.contains("# counted by per-ip, api:free, daily, exports\n"),
        "{public_api}"
    );
    assert!(
        login.contains("curl -i -X POST http://127.0.0.1:3000/login\n"),
        "{login}"
    );
    assert!(login.contains("password-reset (shadow)"), "{login}");
    assert!(!login.contains("x-api-key"), "{login}");
}

/// `/_tollgate/top` lists each rule's most denied keys with their counts, and `/metrics` the
/// utilisation gauge it reads.
#[tokio::test(start_paused = true)]
async fn the_sample_server_serves_the_keys_each_rule_denied_most() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let limits = toml_paused(
        "[[rules]]\nname = \"per-key\"\nrate = 2\nperiod = \"1m\"\nkey = { header = \"x-api-key\" }\n\
         [[rules]]\nname = \"roomy\"\nrate = 100\nperiod = \"1m\"",
    );
    let app = server::app(limits, metrics);
    let as_key = |key| app_request(Method::GET, "/", &[("x-api-key", key)]);
    let mut denied = 0;
    for key in ["alice", "alice", "bob", "alice", "alice", "bob", "alice"] {
        if call(&app, as_key(key)).await.0 == StatusCode::TOO_MANY_REQUESTS {
            denied += 1;
        }
    }
    assert_eq!(denied, 3);

    let response = app
        .clone()
        .oneshot(app_request(Method::GET, "/_tollgate/top", &[]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/json");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    // As the example's doc shows it.
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.starts_with(
            r#"{"rules":[{"capacity":64,"denials":3,"guaranteed_above":0,"offenders":[{"denied":3,"error":0,"key":"alice"}],"rule":"per-key","utilisation":1.0}"#
        ),
        "{text}"
    );
    let top: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        top,
        serde_json::json!({ "rules": [
            {
                "rule": "per-key", "denials": 3, "capacity": 64, "guaranteed_above": 0,
                "utilisation": 1.0,
                "offenders": [{ "key": "alice", "denied": 3, "error": 0 }],
            },
            {
                "rule": "roomy", "denials": 0, "capacity": 64, "guaranteed_above": 0,
                "utilisation": null, "offenders": [],
            },
        ]})
    );
    let (_, text) = call(&app, app_request(Method::GET, "/metrics", &[])).await;
    assert!(
        text.contains("tollgate_top_offender_utilisation{rule=\"per-key\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("tollgate_top_offender_utilisation{rule=\"roomy\"} 0\n"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_login_protection_sample_slows_down_guessing() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let limits = Config::read(sample("login_protection.yaml"))
        .and_then(|config| config.layer())
        .unwrap();
    assert_eq!(
        crate::rule_names(limits.limiter()),
        [
            "login-per-ip",
            "login-per-device",
            "signup-per-ip",
            "signup-all",
            "password-reset"
        ]
    );
    let app = server::app(limits, recorder.handle());
    // Successful logins never count against the address; failed ones (the sample server
    // answers `?status=401` with 401) do, and the sixth failure blocks it for a minute.
    let login = || app_request(Method::POST, "/login", &[]);
    let failed = || app_request(Method::POST, "/login?status=401", &[]);
    for _ in 0..3 {
        assert_eq!(call(&app, login()).await.0, StatusCode::OK);
    }
    for _ in 0..5 {
        assert_eq!(call(&app, failed()).await.0, StatusCode::UNAUTHORIZED);
    }
    let blocked = app.clone().oneshot(login()).await.unwrap();
    assert_eq!(blocked.status(), StatusCode::TOO_MANY_REQUESTS);
    // The block's minute, plus the sample's jitter of up to two seconds.
    let retry: u64 = blocked.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((60..=62).contains(&retry), "Retry-After: {retry}");
    // Reading the login page is not limited.
    assert_eq!(
        call(&app, app_request(Method::GET, "/login", &[])).await.0,
        StatusCode::OK
    );
    // Three sign-ups a day from one address.
    let signup = || app_request(Method::POST, "/signup", &[]);
    for _ in 0..3 {
        assert_eq!(call(&app, signup()).await.0, StatusCode::OK);
    }
    assert_eq!(call(&app, signup()).await.0, StatusCode::TOO_MANY_REQUESTS);
    // The attacking network is refused.
    let mut attacker = app_request(Method::POST, "/login", &[]);
    attacker
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(SocketAddr::from((
            [203, 0, 113, 9],
            1,
        ))));
    assert_eq!(call(&app, attacker).await.0, StatusCode::FORBIDDEN);
}

/// The `server` example on a loopback port, answering requests written byte for byte (a path
/// sent as it is, as `curl --path-as-is` sends it); each answer's status line and headers.
struct AsIs {
    addr: SocketAddr,
}

impl AsIs {
    async fn serve(sample_file: &str) -> AsIs {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let limits = Config::read(sample(sample_file))
            .and_then(|config| config.layer())
            .unwrap();
        let app = server::app(limits, recorder.handle())
            .into_make_service_with_connect_info::<SocketAddr>();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        AsIs { addr }
    }

    /// `method target` with `headers`; the status and the response head.
    async fn send(&self, method: &str, target: &str, headers: &[&str]) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut head = format!("{method} {target} HTTP/1.1\r\nhost: localhost\r\n");
        for header in headers {
            head.push_str(header);
            head.push_str("\r\n");
        }
        head.push_str("content-length: 0\r\nconnection: close\r\n\r\n");
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(self.addr).await.unwrap();
            stream.write_all(head.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            stream.read_to_end(&mut answer).await.unwrap();
            answer
        };
        let answer = tokio::time::timeout(LIMIT, exchange)
            .await
            .unwrap_or_else(|_| panic!("{method} {target} took longer than {LIMIT:?}"));
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let status = answer
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {answer:?}"));
        let head = answer
            .split("\r\n\r\n")
            .next()
            .unwrap()
            .to_ascii_lowercase();
        (status, head)
    }
}

/// Issue 39: a path scope matches the path as routers and proxies read it, so the spellings of
/// `/login` with dot segments (RFC 3986 §5.2.4), repeated slashes or encoded dots, sent as they
/// are, meet the rule like `/login` itself.
#[tokio::test]
async fn the_login_protection_sample_counts_every_spelling_of_login() {
    let server = AsIs::serve("login_protection.yaml").await;
    // Five failed logins through five spellings: each is counted (the block comes at the sixth).
    for path in ["/login", "/./login", "/login/.", "/x/../login", "//login"] {
        let (status, _) = server
            .send("POST", &format!("{path}?status=401"), &[])
            .await;
        assert_eq!(status, 401, "{path}");
    }
    let (status, _) = server.send("POST", "/login?status=401", &[]).await;
    assert_eq!(status, 429, "the sixth failure blocks the address");
    // Blocked: no spelling reaches the handler.
    for path in [
        "/login",
        "/./login",
        "/login/.",
        "/x/../login",
        "/../login",
        "/%2e/login",
        "/x/%2E%2e/login",
        "/%2e/%6Cogin/",
        "//x//..//login",
    ] {
        let (status, head) = server
            .send("POST", &format!("{path}?status=401"), &[])
            .await;
        assert_eq!(status, 429, "{path}: {head}");
        assert!(head.contains("\"login-per-ip\";r=0"), "{path}: {head}");
    }
    // Paths that only look alike stay out of the scope.
    for path in [
        "/login/../x",
        "/x/./login",
        "/.../login",
        "/login/x/%2e%2e%2fy",
    ] {
        let (status, _) = server.send("POST", path, &[]).await;
        assert_eq!(status, 200, "{path}");
    }
}

/// The same for a rule with a cost: `/v1/./exports` pays what `/v1/exports` pays.
#[tokio::test]
async fn the_public_api_sample_charges_exports_under_every_spelling() {
    let server = AsIs::serve("public_api.toml").await;
    let key = ["x-api-key: demo-pro"];
    let mut left = 100;
    for path in [
        "/v1/exports",
        "/v1/./exports",
        "/v2/../v1/exports",
        "/v1/%2e/exports",
    ] {
        let (status, head) = server.send("POST", path, &key).await;
        left -= 10;
        assert_eq!(status, 200, "{path}: {head}");
        assert!(
            head.contains(&format!("\"exports\";r={left}")),
            "{path}: {head}"
        );
    }
    // A GET is out of the rule's methods, whatever its spelling.
    let (_, head) = server.send("GET", "/v1/./exports", &key).await;
    assert!(!head.contains("\"exports\""), "{head}");
}

#[tokio::test(start_paused = true)]
async fn the_sample_server_answers_as_its_query_says() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let limits = Config::parse(
        ConfigFormat::Toml,
        "[[rules]]\nname = \"all\"\nrate = 100\nperiod = \"1s\"",
    )
    .and_then(|config| config.layer())
    .unwrap();
    let app = server::app(limits, recorder.handle());
    let path = "/x?status=418&header=x-tokens-used:1200&header=x-b:2&delay=250ms";
    let started = tokio::time::Instant::now();
    let response = app
        .clone()
        .oneshot(app_request(Method::GET, path, &[]))
        .await
        .unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(250));
    assert_eq!(response.status(), StatusCode::IM_A_TEAPOT);
    assert_eq!(response.headers()["x-tokens-used"], "1200");
    assert_eq!(response.headers()["x-b"], "2");
    for bad in [
        "/x?status=99",
        "/x?delay=5h",
        "/x?delay=fast",
        "/x?header=nocolon",
    ] {
        let (status, why) = call(&app, app_request(Method::GET, bad, &[])).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {why}");
    }
}

/// The `server` example loads a file that names a Redis store (the async loader connects it) and
/// limits through that Redis: two copies of the app share one budget.
#[cfg(feature = "redis")]
#[tokio::test]
async fn the_server_example_serves_the_redis_sample_through_redis() {
    let redis = redis_server::RedisServer::start();
    let text = std::fs::read_to_string(sample("redis.toml"))
        .unwrap()
        .replace("redis://127.0.0.1:6379", &redis.url());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, text).unwrap();

    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let (first, _watch) = server::load(&path).await.unwrap_or_else(|e| panic!("{e}"));
    let (second, _watch2) = server::load(&path).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(crate::rule_names(first.limiter()), ["per-ip", "search"]);
    let apps = [
        server::app(first, recorder.handle()),
        server::app(second, recorder.handle()),
    ];
    let search = || app_request(Method::GET, "/search", &[]);
    for i in 0..10 {
        let (status, body) = call(&apps[i % 2], search()).await;
        assert_eq!(status, StatusCode::OK, "request {i}: {body}");
    }
    for app in &apps {
        assert_eq!(call(app, search()).await.0, StatusCode::TOO_MANY_REQUESTS);
    }
    assert!(redis.command_calls("evalsha") > 0, "decided in Redis");
}

/// The `server` sample over a real socket: requests are served with the peer's address (the
/// per-IP rule reads it), and a connection that trickles a request head or sends nothing is
/// closed once its time is up (slowloris holds nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_sample_closes_slow_and_silent_connections() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let limits = Config::read(sample("public_api.toml"))
        .and_then(|config| config.layer())
        .unwrap();
    let app = server::app(limits, recorder.handle());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server::serve(listener, app, Duration::from_millis(200)));

    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut trickling = tokio::net::TcpStream::connect(addr).await.unwrap();
    trickling
        .write_all(b"GET /v1/items HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();

    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    client
        .write_all(b"GET /v1/items HTTP/1.1\r\nHost: x\r\nx-api-key: demo-free\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    client.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("ratelimit: \"per-ip\""),
        "{answer}"
    );

    for stream in [&mut silent, &mut trickling] {
        let mut rest = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "a silent connection stayed open");
        // Closed without a response: no request ever came.
        assert!(
            !String::from_utf8_lossy(&rest).contains(" 200 "),
            "{rest:?}"
        );
    }
}

/// A front end of its own (tollgate-server) takes a configuration's rules, or a limiter with no
/// layer, and replaces the limiter whole on the same store.
#[tokio::test]
async fn a_limiter_of_a_file_may_hold_no_rule_and_is_replaced_on_its_store() {
    use tollgate::LimitError;

    let tiered = "[[rules]]\nname = \"api\"\nrate = 1\nperiod = \"1m\"\nkey = { header = \"x-key\" }\n[rules.tiers]\ndefault = \"free\"\nkeys = { k1 = \"pro\" }\nplans.free = { rate = 1 }\nplans.pro = { rate = 10 }\n";
    let config = Config::parse(ConfigFormat::Toml, tiered).unwrap();
    let names: Vec<String> = config.rules().unwrap().iter().map(Rule::name).collect();
    assert_eq!(names, ["api:free", "api:pro"]);

    // No rule at all: a limiter (not a layer) holds none, and says so of every call.
    let empty = Config::parse(
        ConfigFormat::Toml,
        "rules = []\n[store]\nkind = \"memory\"\n",
    )
    .unwrap();
    assert!(empty.rules().unwrap().is_empty());
    assert!(empty.layer().is_err());
    let limiter = empty.limiter().unwrap();
    assert!(crate::rule_names(&limiter).is_empty());
    assert!(matches!(
        limiter.charge("api", "k", 1).await,
        Err(LimitError::UnknownRule(_))
    ));
    // A Redis store connects: only `connect_limiter` builds it.
    let redis = "rules = []\n[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n";
    let error = Config::parse(ConfigFormat::Toml, redis)
        .unwrap()
        .limiter()
        .unwrap_err();
    assert_eq!(error.path(), "store.kind");

    // The next rules on the same store keep the counts of the names they keep.
    let day = Duration::from_secs(86_400);
    let first = limiter
        .with_rules([Rule::new("api", Limit::fixed_window(3, day).aligned())])
        .unwrap();
    first.charge("api", "k", 2).await.unwrap();
    let next = first
        .with_rules([Rule::new("api", Limit::fixed_window(5, day).aligned())])
        .unwrap();
    assert_eq!(next.check("api", "k", 0).await.unwrap().remaining, 3);
    assert_eq!(first.check("api", "k", 0).await.unwrap().remaining, 1);
    // Invalid rules leave nothing half-built: the error names the rule and the field.
    let error = next
        .with_rules([Rule::new("api", Limit::fixed_window(0, day))])
        .unwrap_err();
    assert_eq!((error.rule(), error.field()), ("api", "limit"));
}
