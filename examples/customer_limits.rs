//! Limits that follow the customer: each API key's quota is looked up in a "database" (here an
//! in-memory table behind an async function that takes 50 ms, like a query), cached for a
//! minute, and applied to that key's requests. Keys the database does not know get the rule's
//! own limit of 5 a minute; if the database fails or is slow, so does everyone, until it answers.
//!
//! ```text
//! cargo run --example customer_limits
//! ```
//!
//! It listens on `127.0.0.1:3000` (set `ADDR` to change that) and prints `curl` lines to try:
//! `RateLimit-Policy` on each response shows the quota that applied to that key.

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{HeaderName, StatusCode};
use axum::{routing::get, Router};
use tollgate::rules::LimitResolver;
use tollgate::{Decision, Key, Limit, MissingKey, RateLimitLayer, Rule};

static API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The customers' plans: requests per minute by API key.
const CUSTOMERS: &[(&str, u64)] = &[("acme", 100), ("globex", 20)];

/// A customer's quota, as a database would give it: after a round trip, `None` for a key it does
/// not know.
async fn quota_of(api_key: &[u8]) -> Result<Option<u64>, std::io::Error> {
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(CUSTOMERS
        .iter()
        .find(|(key, _)| key.as_bytes() == api_key)
        .map(|(_, per_minute)| *per_minute))
}

pub(crate) fn app() -> Router {
    let per_customer = LimitResolver::new(|api_key| async move {
        let quota = quota_of(api_key.as_bytes()).await?;
        Ok::<_, std::io::Error>(quota.map(Limit::per_minute))
    })
    .ttl(Duration::from_secs(60))
    .timeout(Duration::from_millis(500));
    let limits = RateLimitLayer::builder()
        .rule(
            Rule::new("per-customer", Limit::per_minute(5))
                .key(Key::header(API_KEY.clone()))
                .on_missing_key(MissingKey::RejectWith(StatusCode::UNAUTHORIZED))
                .limit_from(per_customer),
        )
        .build()
        .expect("the rule is valid");
    Router::new().route("/", get(hello)).route_layer(limits)
}

async fn hello(decision: Decision) -> String {
    let Some(rule) = decision.rule("per-customer") else {
        return "hello\n".to_owned();
    };
    let plan = match rule.limit() {
        Some(limit) => format!("your plan: {} a minute", limit.algorithm().capacity()),
        None => "the default plan".to_owned(),
    };
    format!("hello; {plan}; {} requests left\n", rule.outcome.remaining)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}; try:");
    println!("  curl -i -H 'x-api-key: acme' http://{addr}/     # 100 a minute");
    println!("  curl -i -H 'x-api-key: globex' http://{addr}/   # 20 a minute");
    println!("  for i in $(seq 6); do curl -s -H 'x-api-key: someone' http://{addr}/; done");
    let app = app().into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await
}
