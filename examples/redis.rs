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

use std::net::SocketAddr;

use axum::{routing::get, Router};
use tollgate::{Key, Limit, RateLimitLayer, RedisStore, Rule};

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
        .build()
        .expect("the rules are valid");
    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/expensive", get(|| async { "an expensive answer\n" }))
        .route_layer(limits)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
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
