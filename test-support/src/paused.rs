//! Layers whose memory store follows tokio's clock, so `tokio::time::pause()` and `advance()`
//! drive the limiter in these tests.

use tollgate::clock::TokioClock;
use tollgate::{MemoryStore, RateLimitLayer, RateLimitLayerBuilder, Rule};

/// A memory store on tokio's clock.
pub fn store() -> MemoryStore {
    MemoryStore::with_clock(TokioClock::new())
}

/// A layer builder whose store is on tokio's clock.
pub fn builder() -> RateLimitLayerBuilder {
    RateLimitLayer::builder().store(store())
}

/// A layer of one rule whose store is on tokio's clock.
pub fn layer(rule: impl Into<Rule>) -> RateLimitLayer {
    builder().rule(rule).build().expect("valid rule")
}
