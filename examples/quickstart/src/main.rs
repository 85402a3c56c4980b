//! The smallest useful setup: every client IP may make 10 requests a minute, and only 2 of them
//! to `/expensive`.
//!
//! ```text
//! cargo run -p quickstart
//! ```
//!
//! It listens on `127.0.0.1:3000` (set `ADDR` to change that) and prints `curl` lines to try, in
//! order: each comment says what that line answers when the lines are run one after the other.

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

/// The `curl` lines printed at start-up, each followed by what it answers when they are run in
/// this order (`tests/it/examples.rs` runs them so). A token bucket of 10 a minute gives one
/// unit back every 6 s, one of 2 a minute every 30 s: a slower hand sees a few more 200s.
pub(crate) fn try_these(addr: SocketAddr) -> String {
    let codes = "curl -s -o /dev/null -w '%{http_code} '";
    format!(
        "\
  curl -i http://{addr}/
  # 200; RateLimit-Policy: \"per-ip\";q=10;w=60 and RateLimit: \"per-ip\";r=9;t=6
  for i in 1 2; do {codes} http://{addr}/expensive; done; echo
  # 200 200: /expensive takes 2 a minute, and each call pays per-ip too
  curl -i http://{addr}/expensive; echo
  # 429 (within 30 s): Retry-After, a problem+json body naming \"expensive\"; per-ip not charged
  for i in $(seq 12); do {codes} http://{addr}/; done; echo
  # 200 200 200 200 200 200 200 429 429 429 429 429: 10 a minute per IP, 3 spent above, one
  # back every 6 s
"
    )
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}; try, in this order:");
    print!("{}", try_these(addr));
    // `Key::peer_ip()` counts by the TCP peer, which axum hands over as `ConnectInfo<SocketAddr>`.
    let app = app().into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await
}
