//! Queue mode in front of an upstream with a hard cap: the upstream (simulated here) allows 5
//! requests per second. Instead of answering 429, the layer holds each request until its slot, one
//! every 200 ms, so clients only wait — until the queue would make them wait more than 10 s.
//!
//! ```text
//! cargo run --example queue
//! ```
//!
//! It listens on `127.0.0.1:3000` (set `ADDR` to change that) and prints `curl` lines to try.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{routing::get, Router};
use tokio::time::Instant;
use tollgate::{Limit, MemoryStore, Queue, RateLimitLayer, Rule, TokioClock};

/// The upstream's cap: at most this many calls in any one-second window.
pub(crate) const CAP: usize = 5;

/// A stand-in for a third-party API that refuses calls over its cap.
#[derive(Clone, Default)]
pub(crate) struct Upstream {
    /// When each accepted call arrived, for the last second.
    recent: Arc<Mutex<VecDeque<Instant>>>,
    /// Every accepted call, for the tests.
    pub(crate) log: Arc<Mutex<Vec<Instant>>>,
}

impl Upstream {
    fn call(&self) -> Result<&'static str, StatusCode> {
        let now = Instant::now();
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        while recent
            .front()
            .is_some_and(|&at| now - at >= Duration::from_secs(1))
        {
            recent.pop_front();
        }
        if recent.len() >= CAP {
            return Err(StatusCode::TOO_MANY_REQUESTS);
        }
        recent.push_back(now);
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(now);
        Ok("upstream says hi\n")
    }
}

pub(crate) fn app(upstream: Upstream) -> Router {
    // 5 per second with a capacity of 1: a leaky bucket that lets one request out every 200 ms,
    // so no one-second window ever sees more than 5. Waiting is bounded at 10 s (50 requests).
    // The queue sleeps on tokio's clock; counting on the same clock keeps the spacing exact to the
    // microsecond (and lets tests pause time).
    let pace = RateLimitLayer::builder()
        .rule(
            Rule::new("upstream", Limit::per_second(5).capacity(1))
                .queue(Queue::max_delay(Duration::from_secs(10))),
        )
        .store(MemoryStore::with_clock(TokioClock::new()))
        .build()
        .expect("a valid rule");
    Router::new()
        .route(
            "/",
            get(|State(upstream): State<Upstream>| async move { upstream.call() }),
        )
        .route_layer(pace)
        .with_state(upstream)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}; try 20 requests at once (all 200, spaced 200 ms apart):");
    println!("  for i in $(seq 20); do curl -s -o /dev/null -w '%{{http_code}} %{{time_total}}s\\n' http://{addr}/ & done; wait");
    println!("  curl -si http://{addr}/ | grep -i tollgate-delay   # how long a request waited");
    let app = app(Upstream::default()).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await
}
