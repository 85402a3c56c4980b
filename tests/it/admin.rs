//! The `server` example's admin API (`/_tollgate/blocks/…`, `/_tollgate/overrides/…`): off without
//! an address, refused to start without a token, every request refused without the bearer token,
//! the blocks of the example's limiter listed, read and lifted through it, and overrides set,
//! read, listed and removed (on the memory store here; on Redis and
//! Valkey, across two instances, in `tests/redis_store/blocks.rs`).

#![cfg(feature = "config")]

use std::time::Duration;

use axum::body::Body;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt;
use tollgate::clock::ManualClock;
use tollgate::config::{Config, ConfigFormat};
use tollgate::{MemoryStore, RateLimitLayer};
use tower::ServiceExt;

use crate::config::server;

const TOKEN: &str = "0123456789abcdef-admin";
const MINUTE: Duration = Duration::from_secs(60);

const RULES: &str = "[[rules]]\nname = \"login\"\nrate = 1\nperiod = \"1m\"\n\
                     key = { header = \"x-user\" }\nblock = \"10m\"\n\
                     [[rules]]\nname = \"plain\"\nrate = 100\nperiod = \"1m\"\n\
                     [[rules]]\nname = \"api\"\nrate = 100\nperiod = \"1m\"\n\
                     key = { header = \"x-user\" }\noverrides = true";

fn layer(clock: &ManualClock) -> RateLimitLayer {
    Config::parse(ConfigFormat::Toml, RULES)
        .and_then(|config| config.builder())
        .unwrap_or_else(|error| panic!("{error}"))
        .store(MemoryStore::with_clock(clock.clone()))
        .build()
        .unwrap()
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        assert_eq!(
            self.headers["content-type"], "application/json",
            "{}",
            self.body
        );
        serde_json::from_str(&self.body).unwrap()
    }
}

async fn send(router: &axum::Router, method: Method, path: &str, token: Option<&str>) -> Answer {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    exchange(router, request.body(Body::empty()).unwrap()).await
}

/// The router's answer to `request`, its body read.
async fn exchange(router: &axum::Router, request: Request<Body>) -> Answer {
    let response = router.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

async fn as_admin(router: &axum::Router, method: Method, path: &str) -> Answer {
    send(router, method, path, Some(TOKEN)).await
}

/// A request of the limited app as user `user`.
async fn login(app: &axum::Router, user: &str) -> StatusCode {
    let mut request = Request::builder()
        .uri("/login")
        .header("x-user", user)
        .body(Body::empty())
        .unwrap();
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from((
            [192, 0, 2, 7],
            5000,
        ))));
    app.clone().oneshot(request).await.unwrap().status()
}

#[test]
fn the_admin_api_is_off_without_an_address_and_refuses_to_start_without_a_token() {
    let some = |s: &str| Some(s.to_owned());
    assert!(server::Admin::from_env(None, some(TOKEN))
        .unwrap()
        .is_none());
    assert!(server::Admin::from_env(some(""), None).unwrap().is_none());
    let missing = server::Admin::from_env(some("127.0.0.1:3001"), None).unwrap_err();
    assert!(missing.contains("TOLLGATE_ADMIN_TOKEN is not"), "{missing}");
    let short = server::Admin::from_env(some("127.0.0.1:3001"), some("hunter2")).unwrap_err();
    assert!(short.contains("at least 16 characters"), "{short}");
    let on = server::Admin::from_env(some("127.0.0.1:3001"), some(TOKEN))
        .unwrap()
        .unwrap();
    assert_eq!(
        (on.addr.as_str(), on.token.as_str()),
        ("127.0.0.1:3001", TOKEN)
    );
}

#[tokio::test]
async fn every_request_without_the_bearer_token_is_refused() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let limits = layer(&clock);
    limits
        .limiter()
        .block("login", "mallory", MINUTE)
        .await
        .unwrap();
    let admin = server::admin(limits.limiter().clone(), TOKEN);
    let paths = [
        "/_tollgate/blocks/login",
        "/_tollgate/blocks/login/mallory",
        "/_tollgate/elsewhere",
        "/_tollgate/overrides/api",
        "/_tollgate/overrides/api/mallory",
    ];
    for path in paths {
        for (token, header) in [
            (None, None),
            (Some("0123456789abcdef-wrong"), None),
            (Some(""), None),
            (None, Some(format!("Basic {TOKEN}"))),
            (None, Some(TOKEN.to_owned())),
        ] {
            for method in [Method::GET, Method::DELETE, Method::PUT] {
                let mut request = Request::builder().method(method.clone()).uri(path);
                if let Some(token) = token {
                    request = request.header("authorization", format!("Bearer {token}"));
                }
                if let Some(header) = &header {
                    request = request.header("authorization", header);
                }
                let answer = exchange(&admin, request.body(Body::empty()).unwrap()).await;
                assert_eq!(
                    answer.status,
                    StatusCode::UNAUTHORIZED,
                    "{method} {path} {token:?} {header:?}"
                );
                assert_eq!(
                    answer.headers["www-authenticate"],
                    "Bearer realm=\"tollgate-admin\""
                );
            }
        }
    }
    // Nothing was lifted or set by the refused DELETEs and PUTs.
    assert_eq!(
        limits
            .limiter()
            .override_of("api", "mallory")
            .await
            .unwrap(),
        None
    );
    assert!(limits
        .limiter()
        .blocked("login", "mallory")
        .await
        .unwrap()
        .is_some());
    // The right token, in any case of the scheme's name.
    let listed = as_admin(&admin, Method::GET, paths[0]).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    let request = Request::builder()
        .uri(paths[1])
        .header("authorization", format!("bearer {TOKEN}"));
    let lowercase = exchange(&admin, request.body(Body::empty()).unwrap()).await;
    assert_eq!(lowercase.status, StatusCode::OK, "{}", lowercase.body);
    let elsewhere = as_admin(&admin, Method::GET, paths[2]).await;
    assert_eq!(elsewhere.status, StatusCode::NOT_FOUND);
    assert!(elsewhere.json()["error"].is_string());
}

/// A key the app's penalty blocked is listed, read and lifted through the admin API; bad
/// requests are clear errors that change nothing.
#[tokio::test]
async fn blocks_are_listed_read_and_lifted_through_the_admin_api() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let limits = layer(&clock);
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let app = server::app(limits.clone(), recorder.handle());
    let admin = server::admin(limits.limiter().clone(), TOKEN);
    assert_eq!(login(&app, "alice").await, StatusCode::OK);
    assert_eq!(login(&app, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    limits
        .limiter()
        .block("login", "a b/c", 2 * MINUTE)
        .await
        .unwrap();
    clock.advance(MINUTE);

    let listed = as_admin(&admin, Method::GET, "/_tollgate/blocks/login").await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    let mut body = listed.json();
    body["blocks"]
        .as_array_mut()
        .unwrap()
        .sort_by_key(|b| b["key"].as_str().unwrap().to_owned());
    assert_eq!(
        body,
        serde_json::json!({
            "rule": "login",
            "blocks": [
                { "key": "a b/c", "remaining_ms": 60_000, "offences": 0 },
                { "key": "alice", "remaining_ms": 540_000, "offences": 1 },
            ],
            "next": null,
        })
    );
    // Keys in paths are percent-decoded.
    let one = as_admin(&admin, Method::GET, "/_tollgate/blocks/login/a%20b%2Fc").await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.body);
    assert_eq!(
        one.json(),
        serde_json::json!({ "key": "a b/c", "remaining_ms": 60_000, "offences": 0 })
    );
    let lifted = as_admin(&admin, Method::DELETE, "/_tollgate/blocks/login/alice").await;
    assert_eq!(lifted.status, StatusCode::NO_CONTENT);
    let gone = as_admin(&admin, Method::GET, "/_tollgate/blocks/login/alice").await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(gone.json()["error"], "the key is not blocked");
    // The app's next decision admits alice (a unit came back during the minute).
    assert_eq!(login(&app, "alice").await, StatusCode::OK);

    // Bad requests: clear errors, nothing written.
    let unknown = as_admin(&admin, Method::GET, "/_tollgate/blocks/nope").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(
        unknown.json()["error"],
        "no rate-limit rule is named \"nope\""
    );
    let unknown = as_admin(&admin, Method::DELETE, "/_tollgate/blocks/nope/alice").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let plain = as_admin(&admin, Method::GET, "/_tollgate/blocks/plain").await;
    assert_eq!(plain.status, StatusCode::NOT_FOUND);
    assert!(
        plain.json()["error"]
            .as_str()
            .unwrap()
            .contains("no penalty"),
        "{}",
        plain.body
    );
    let long = format!("/_tollgate/blocks/login/{}", "a".repeat(129));
    let too_long = as_admin(&admin, Method::DELETE, &long).await;
    assert_eq!(too_long.status, StatusCode::BAD_REQUEST);
    assert!(
        too_long.json()["error"]
            .as_str()
            .unwrap()
            .contains("over the bound of 128"),
        "{}",
        too_long.body
    );
    let bad_cursor = as_admin(&admin, Method::GET, "/_tollgate/blocks/login?cursor=zz").await;
    assert_eq!(bad_cursor.status, StatusCode::BAD_REQUEST);
    assert!(bad_cursor.json()["error"].is_string());
    assert!(limits
        .limiter()
        .blocked("login", "a b/c")
        .await
        .unwrap()
        .is_some());
}

/// Hundreds of blocks come a page at a time, each page's `next` given back as `?cursor=`.
#[tokio::test]
async fn the_admin_listing_walks_pages_with_the_cursor() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let limits = layer(&clock);
    let admin = server::admin(limits.limiter().clone(), TOKEN);
    for i in 0..250 {
        limits
            .limiter()
            .block("login", format!("user-{i}"), MINUTE)
            .await
            .unwrap();
    }
    let mut keys = std::collections::HashSet::new();
    let mut path = "/_tollgate/blocks/login".to_owned();
    let mut pages = 0;
    loop {
        let page = as_admin(&admin, Method::GET, &path).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        let body = page.json();
        let blocks = body["blocks"].as_array().unwrap();
        assert!(blocks.len() <= 100);
        for block in blocks {
            assert!(keys.insert(block["key"].as_str().unwrap().to_owned()));
        }
        pages += 1;
        match body["next"].as_str() {
            Some(next) => path = format!("/_tollgate/blocks/login?cursor={next}"),
            None => break,
        }
    }
    assert!(pages >= 3, "{pages} pages");
    assert_eq!(keys.len(), 250);
}

async fn put(router: &axum::Router, path: &str, body: &str) -> Answer {
    let request = Request::builder()
        .method(Method::PUT)
        .uri(path)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    exchange(router, request).await
}

/// A customer raised for an hour through the admin API: the app charges the key under the
/// override at once, the API reads and lists it, and removing it brings the rule's limit back;
/// every bad request is a clear error that writes nothing.
#[tokio::test]
async fn overrides_are_set_read_listed_and_removed_through_the_admin_api() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let limits = layer(&clock);
    let limiter = limits.limiter().clone();
    let admin = server::admin(limiter.clone(), TOKEN);
    let path = "/_tollgate/overrides/api/acme";

    let set = put(
        &admin,
        path,
        r#"{"limit": {"rate": 2, "period": "1m"}, "ttl_seconds": 3600}"#,
    )
    .await;
    assert_eq!(set.status, StatusCode::NO_CONTENT, "{}", set.body);
    let allowed: Vec<bool> = [
        limiter.charge("api", "acme", 1).await.unwrap().is_allowed(),
        limiter.charge("api", "acme", 1).await.unwrap().is_allowed(),
        limiter.charge("api", "acme", 1).await.unwrap().is_allowed(),
    ]
    .into();
    assert_eq!(allowed, [true, true, false], "2 a minute for acme");

    clock.advance(MINUTE);
    let read = as_admin(&admin, Method::GET, path).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    assert_eq!(
        read.json(),
        serde_json::json!({"key": "acme", "quota": 2, "window_ms": 60_000, "expires_in_ms": 3_540_000})
    );
    let listed = as_admin(&admin, Method::GET, "/_tollgate/overrides/api").await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    assert_eq!(listed.json()["overrides"][0]["key"], "acme");
    assert_eq!(listed.json()["next"], serde_json::Value::Null);

    // Bad requests: refused, clearly, and nothing written.
    let bad = [
        (
            r#"{"limit": {"rate": 0, "period": "1m"}, "ttl_seconds": 60}"#,
            StatusCode::BAD_REQUEST,
            "limit.rate",
        ),
        (
            r#"{"limit": {"rate": 5, "period": "1m", "paths": ["/x"]}, "ttl_seconds": 60}"#,
            StatusCode::BAD_REQUEST,
            "limit.paths: not a field of a limit",
        ),
        (
            r#"{"limit": {"rate": 5, "period": "1m"}, "ttl_seconds": 0}"#,
            StatusCode::BAD_REQUEST,
            "TTL",
        ),
        (
            r#"{"limit": {"rate": 5, "period": "1m"}}"#,
            StatusCode::BAD_REQUEST,
            "ttl_seconds",
        ),
        ("not json", StatusCode::BAD_REQUEST, ""),
    ];
    for (body, status, says) in bad {
        let answer = put(&admin, "/_tollgate/overrides/api/beta", body).await;
        assert_eq!(answer.status, status, "{body}: {}", answer.body);
        assert!(answer.body.contains(says), "{body}: {}", answer.body);
    }
    let elsewhere = [
        ("/_tollgate/overrides/nope/beta", StatusCode::NOT_FOUND),
        ("/_tollgate/overrides/login/beta", StatusCode::NOT_FOUND),
    ];
    for (other, status) in elsewhere {
        let answer = put(
            &admin,
            other,
            r#"{"limit": {"rate": 5, "period": "1m"}, "ttl_seconds": 60}"#,
        )
        .await;
        assert_eq!(answer.status, status, "{other}: {}", answer.body);
        assert!(answer.json()["error"].is_string());
    }
    assert_eq!(limiter.override_of("api", "beta").await.unwrap(), None);
    assert_eq!(
        as_admin(&admin, Method::GET, "/_tollgate/overrides/api/beta")
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    let removed = as_admin(&admin, Method::DELETE, path).await;
    assert_eq!(removed.status, StatusCode::NO_CONTENT, "{}", removed.body);
    assert_eq!(
        as_admin(&admin, Method::GET, path).await.status,
        StatusCode::NOT_FOUND
    );
    // Back to the rule's 100 a minute, the key's count carried over (DESIGN §13).
    assert!(limiter.charge("api", "acme", 1).await.unwrap().is_allowed());
}
