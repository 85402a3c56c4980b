//! `tollgate-server`: the rate-limit service of Envoy's protocol
//! (`envoy.service.ratelimit.v3.RateLimitService`) on tollgate's engine.
//!
//! This library is the part of the server that tools share: the two forms of configuration
//! ([`load`]) and how a request's descriptors find their limits ([`tree`]). The service itself
//! (feature `service`, on by default) is the `tollgate-server` binary's: gRPC, HTTP, and its
//! statistics (`stats`: Prometheus on `/metrics`, statsd), and the configuration's other
//! sources (`source`: an xDS management server).

mod document;
pub mod load;
pub mod plan;
pub mod reference;
pub mod tree;
pub mod unit;

#[cfg(feature = "service")]
pub mod service;
#[cfg(feature = "service")]
pub mod settings;
#[cfg(feature = "service")]
pub mod source;
#[cfg(feature = "service")]
pub mod stats;
