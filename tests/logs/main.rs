//! The tests that count log events, apart from the others on purpose: `tracing` caches per call
//! site whether anyone listens, and a test on another thread that hits the same call site with no
//! subscriber installed can cache "nobody" and swallow the events these tests check. Every test
//! here installs its own subscriber first.

#[path = "../support/mod.rs"]
mod support;

mod logging;
mod per_request_logging;
mod redis_outage;
