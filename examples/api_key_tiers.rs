//! Plans keyed by API key: `free` keys may make 5 requests a minute, `pro` keys 100, and a request
//! without a key gets `401 Unauthorized`.
//!
//! ```text
//! cargo run --example api_key_tiers
//! ```
//!
//! It listens on `127.0.0.1:3000` (set `ADDR` to change that) and prints `curl` lines to try.

use std::net::SocketAddr;

use axum::http::{HeaderName, StatusCode};
use axum::{routing::get, Router};
use tollgate::{Decision, Key, Limit, MissingKey, RateLimitLayer, Rule};

static API_KEY: HeaderName = HeaderName::from_static("x-api-key");

#[derive(Clone, Copy, PartialEq, Eq)]
enum Plan {
    Free,
    Pro,
}

/// The plan of an API key. A real service looks it up (and caches it: this runs per request).
fn plan_of(api_key: &[u8]) -> Plan {
    if api_key.starts_with(b"pro_") {
        Plan::Pro
    } else {
        Plan::Free
    }
}

/// The API key if it is on `plan`. For any other key this is missing, and the plan's rule skips
/// the request: so each plan's rule counts only its own customers.
fn key_on(plan: Plan) -> Key {
    Key::from_fn(move |head| {
        let key = head.headers.get(&API_KEY)?.as_bytes();
        (plan_of(key) == plan).then(|| String::from_utf8_lossy(key).into_owned())
    })
}

pub(crate) fn app() -> Router {
    let limits = RateLimitLayer::builder()
        // Every key, whatever its plan, at most 10 a second; this rule also turns away requests
        // without a key.
        .rule(
            Rule::new("per-key", Limit::per_second(10))
                .key(Key::header(API_KEY.clone()))
                .on_missing_key(MissingKey::RejectWith(StatusCode::UNAUTHORIZED)),
        )
        .rule(
            Rule::new("free", Limit::per_minute(5))
                .key(key_on(Plan::Free))
                .on_missing_key(MissingKey::Skip),
        )
        .rule(
            Rule::new("pro", Limit::per_minute(100))
                .key(key_on(Plan::Pro))
                .on_missing_key(MissingKey::Skip),
        )
        .build()
        .expect("the rules are valid");
    Router::new().route("/", get(hello)).route_layer(limits)
}

async fn hello(decision: Decision) -> String {
    // Exactly one plan's rule applied: the customer's.
    match ["free", "pro"]
        .into_iter()
        .find_map(|plan| decision.rule(plan))
    {
        Some(plan) => {
            let left = plan.outcome.remaining;
            let noun = if left == 1 { "request" } else { "requests" };
            format!("hello, {} customer: {left} {noun} left\n", plan.rule())
        }
        None => "hello\n".to_owned(),
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}; try:");
    println!("  curl -i http://{addr}/                          # 401: no key");
    println!("  for i in $(seq 6); do curl -s -H 'x-api-key: free_alice' http://{addr}/; done");
    println!("  curl -i -H 'x-api-key: pro_bob' http://{addr}/");
    let app = app().into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await
}
