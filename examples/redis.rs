//! The quickstart's app with its limits in Redis: run two copies on two ports and they share one
//! limit per client IP.
//!
//! ```text
//! redis-server --port 6379 &
//! ADDR=127.0.0.1:3000 cargo run --example redis --features redis &
//! ADDR=127.0.0.1:3001 cargo run --example redis --features redis &
//! for port in 3000 3001 3000 3001 3000 3001; do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:$port/expensive; done; echo
//! ```
//!
//! The last line prints `200 200 429 429 429 429`: `/expensive` allows two calls a minute per IP,
//! counted across both copies. Redis comes from `REDIS_URL` (default `redis://127.0.0.1:6379`).
//!
//! Each copy logs what the layer does: every denial (at debug level), and what happens when Redis
//! fails. Pause Redis (`kill -STOP $(pidof redis-server)`) and keep calling: the first failures
//! wait the 100 ms timeout and are forwarded (fail open), the fifth opens the circuit breaker —
//! one warning says so — and from then on requests are forwarded at once, with one warning line
//! per 10 s counting the failed decisions. Resume it (`kill -CONT …`): within the probe interval
//! (1 s, doubling up to 30 s) a warning says the breaker closed, and Redis counts again.

use std::net::SocketAddr;

use axum::{routing::get, Router};
use tollgate::{FailurePolicy, Key, Limit, RateLimitLayer, RedisStore, Rule};

/// The quickstart's rules, with the store passed in: the only difference from a one-instance app.
pub(crate) fn app(store: RedisStore) -> Router {
    let limits = RateLimitLayer::builder()
        .rule(Rule::new("per-ip", Limit::per_minute(10)).key(Key::peer_ip()))
        .rule(
            Rule::new("expensive", Limit::per_minute(2))
                .key(Key::peer_ip())
                .path("/expensive"),
        )
        .store(store)
        // The default, spelled out: a Redis outage weakens the limits instead of taking the app
        // down. `FailurePolicy::Local { share: 0.5 }` would keep half of each limit per copy.
        .on_store_failure(FailurePolicy::Open)
        .build()
        .expect("the rules are valid");
    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/expensive", get(|| async { "an expensive answer\n" }))
        .route_layer(limits)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // What the layer does: denials at debug level; the store's failures and the breaker at warn.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .init();
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let store = RedisStore::connect(&redis).await?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}, limits in {redis}; try:");
    println!("  curl -i http://{addr}/expensive   # the third call within a minute, on any copy, gets 429");
    let app = app(store).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
