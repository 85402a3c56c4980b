//! The smallest useful setup: every client IP may make 10 requests a minute, and only 2 of them
//! to `/expensive`.
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! It listens on `127.0.0.1:3000` (set `ADDR` to change that) and prints `curl` lines to try.

use std::net::SocketAddr;

use axum::{routing::get, Router};
use tollgate::{Key, Limit, RateLimitLayer, Rule};

/// One layer, two rules. A request pays every rule whose scope it is in, all or nothing: a call to
/// `/expensive` pays `per-ip` and `expensive`, and when either says no, neither is charged.
pub(crate) fn app() -> Router {
    let limits = RateLimitLayer::builder()
        .rule(Rule::new("per-ip", Limit::per_minute(10)).key(Key::peer_ip()))
        .rule(
            Rule::new("expensive", Limit::per_minute(2))
                .key(Key::peer_ip())
                .path("/expensive"),
        )
        .build()
        .expect("the rules are valid");
    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/expensive", get(|| async { "an expensive answer\n" }))
        // `route_layer`, not `layer`: a request for an unknown path gets its 404 without paying.
        .route_layer(limits)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}; try:");
    println!("  curl -i http://{addr}/            # RateLimit-Policy and RateLimit headers");
    println!("  for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}} ' http://{addr}/; done; echo");
    println!("  curl -i http://{addr}/expensive   # the third call within a minute gets 429");
    // `Key::peer_ip()` counts by the TCP peer, which axum hands over as `ConnectInfo<SocketAddr>`.
    let app = app().into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await
}
