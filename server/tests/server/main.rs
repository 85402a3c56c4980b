//! `tollgate-server` as Envoy meets it: a real server process, a real gRPC client.
//!
//! One test binary, one module per topic.

// Items shared between the modules are `pub`, as in the repository's other test support.
#![allow(unreachable_pub)]

mod admin;
mod bad_input;
use tollgate_test_support::certificates;
mod environment;
mod later_fields;
mod numbers;
mod operations;
mod postgres;
use tollgate_test_support::postgres_server;
mod prometheus;
mod readme;
mod redis;
use tollgate_test_support::redis_server;
mod reload;
mod statsd;
mod support;
mod tls;
mod xds;
