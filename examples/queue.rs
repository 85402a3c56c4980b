//! Queue mode in front of an upstream with a hard cap: the upstream (simulated here) allows 5
//! requests in any one second. Instead of answering 429, the layer holds each request until its
//! slot, one every 250 ms, so clients only wait — until the queue would make them wait more than
//! 10 s.
//!
//! Why 250 ms and not 200: a request released on time can still reach the upstream late (the
//! scheduler on a busy machine, the network), and at exactly the cap one late call is enough for
//! six to land in one second. Paced at 4 per second, six calls span 1.25 s, so every call may
//! arrive up to 250 ms late and the upstream still never sees more than 5 in a second.
//!
//! ```text
//! cargo run --example queue
//! ```
//!
//! It listens on `127.0.0.1:3000` (set `ADDR` to change that) and prints `curl` lines to try.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{routing::get, Router};
use tokio::time::Instant;
use tollgate::clock::TokioClock;
use tollgate::{Limit, MemoryStore, Queue, RateLimitLayer, Rule};

/// The upstream's cap: at most this many calls in any one-second window.
pub(crate) const CAP: usize = 5;

/// A stand-in for a third-party API that refuses calls over its cap.
#[derive(Clone)]
pub(crate) struct Upstream {
    /// When each accepted call arrived, for the last second.
    recent: Arc<Mutex<VecDeque<Instant>>>,
    /// Every accepted call, for the tests.
    pub(crate) log: Arc<Mutex<Vec<Instant>>>,
    /// How late the n-th call reaches the upstream after the layer released it.
    lateness: Arc<dyn Fn(usize) -> Duration + Send + Sync>,
    calls: Arc<AtomicUsize>,
}

impl Default for Upstream {
    /// Calls arrive as soon as the machine runs them.
    fn default() -> Self {
        Upstream::with_lateness(|_| Duration::ZERO)
    }
}

impl Upstream {
    /// An upstream that the n-th call reaches `lateness(n)` after its release: the scheduling
    /// and network delays a real deployment adds, made explicit for the tests.
    pub(crate) fn with_lateness(
        lateness: impl Fn(usize) -> Duration + Send + Sync + 'static,
    ) -> Self {
        Upstream {
            recent: Arc::default(),
            log: Arc::default(),
            lateness: Arc::new(lateness),
            calls: Arc::default(),
        }
    }

    async fn call(&self) -> Result<&'static str, StatusCode> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let late = (self.lateness)(n);
        if !late.is_zero() {
            tokio::time::sleep(late).await;
        }
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
    // 4 per second with a capacity of 1: a leaky bucket that lets one request out every 250 ms.
    // One below the upstream's cap on purpose: the 50 ms of slack per call add up to 250 ms over
    // five calls, the lateness any one call may have (see the top of the file). Waiting is
    // bounded at 10 s (41 requests). The queue sleeps on tokio's clock; counting on the same
    // clock keeps the spacing exact to the microsecond (and lets tests pause time).
    let pace = RateLimitLayer::builder()
        .rule(
            Rule::new("upstream", Limit::per_second(CAP as u64 - 1).capacity(1))
                .queue(Queue::max_delay(Duration::from_secs(10))),
        )
        .store(MemoryStore::with_clock(TokioClock::new()))
        .build()
        .expect("a valid rule");
    Router::new()
        .route(
            "/",
            get(|State(upstream): State<Upstream>| async move { upstream.call().await }),
        )
        .route_layer(pace)
        .with_state(upstream)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}; try 20 requests at once (all 200, spaced 250 ms apart):");
    println!("  for i in $(seq 20); do curl -s -o /dev/null -w '%{{http_code}} %{{time_total}}s\\n' http://{addr}/ & done; wait");
    println!("  curl -si http://{addr}/ | grep -i tollgate-delay   # how long a request waited");
    let app = app(Upstream::default()).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await
}
