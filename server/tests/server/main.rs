//! `tollgate-server` as Envoy meets it: a real server process, a real gRPC client.
//!
//! One test binary, one module per topic.

// Items shared between the modules are `pub`, as in the repository's other test support.
#![allow(unreachable_pub)]

mod bad_input;
mod numbers;
mod operations;
mod readme;
mod redis;
mod reload;
mod statsd;
mod support;
