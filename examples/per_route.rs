//! Several rules in one layer, each scoped by path and method, and a handler reading what is left
//! of its quota through the `Decision` extractor.
//!
//! ```text
//! cargo run --example per_route
//! ```
//!
//! It listens on `127.0.0.1:3000` (set `ADDR` to change that) and prints `curl` lines to try.

use std::fmt::Write as _;
use std::net::SocketAddr;

use axum::{http::Method, routing::get, Router};
use tollgate::{Decision, Key, Limit, RateLimitLayer, Rule};

pub(crate) fn app() -> Router {
    // As if behind a reverse proxy on this host: a request from a loopback peer is counted by the
    // address the proxy appended to `X-Forwarded-For`, any other by its peer address.
    let client_ip = Key::client_ip().trust_loopback();
    let limits = RateLimitLayer::builder()
        .rule(
            Rule::new("login", Limit::per_minute(5))
                .key(client_ip.clone())
                .methods([Method::POST])
                .path("/login"),
        )
        .rule(
            Rule::new("api", Limit::per_minute(100))
                .key(client_ip)
                .path("/api/*"),
        )
        // No key: one budget shared by every request, a ceiling for the whole service.
        .rule(Rule::new("global", Limit::per_second(1000)))
        .build()
        .expect("the rules are valid");
    Router::new()
        .route("/", get(quota))
        .route("/login", get(quota).post(|| async { "welcome\n" }))
        .route("/api/{*rest}", get(quota))
        .route_layer(limits)
}

/// Lists every rule that applied to this request and what it has left.
async fn quota(decision: Decision) -> String {
    let mut out = String::new();
    for rule in decision.rules() {
        let _ = writeln!(out, "{}: {} left", rule.rule(), rule.outcome.remaining);
    }
    out
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}; try:");
    println!("  curl -i http://{addr}/api/v1/things   # api and global");
    println!("  curl -i http://{addr}/login            # GET: global only");
    println!("  for i in $(seq 6); do curl -s -X POST http://{addr}/login; done");
    println!("  curl -i -X POST -H 'X-Forwarded-For: 203.0.113.9' http://{addr}/login   # another client");
    let app = app().into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await
}
