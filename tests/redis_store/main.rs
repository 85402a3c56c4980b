//! The Redis store against real `redis-server` processes on loopback ports: one server, a Cluster,
//! concurrency leases and per-request limits, and the differential tests that keep the Lua script
//! equal to the memory store.

#[path = "../support/mod.rs"]
mod support;

mod cluster;
mod concurrency;
mod per_request;
mod single;
