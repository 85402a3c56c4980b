//! Layers whose memory store follows tokio's clock, so `tokio::time::pause()` and `advance()`
//! drive the limiter in these tests.

#![allow(dead_code)]

use tollgate::clock::TokioClock;
use tollgate::{MemoryStore, RateLimitLayer, RateLimitLayerBuilder, Rule};

pub(crate) fn store() -> MemoryStore {
    MemoryStore::with_clock(TokioClock::new())
}

pub(crate) fn builder() -> RateLimitLayerBuilder {
    RateLimitLayer::builder().store(store())
}

pub(crate) fn layer(rule: impl Into<Rule>) -> RateLimitLayer {
    builder().rule(rule).build().expect("valid rule")
}
