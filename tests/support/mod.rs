//! Helpers shared by the test binaries: stores with frozen or paused clocks, real Redis servers,
//! request drivers, log capture. Each binary uses some of them.

#![allow(dead_code, unreachable_pub)]

pub mod calendar;
pub mod certificates;
#[cfg(any(feature = "redis", feature = "postgres"))]
pub mod differential;
pub mod hammer;
pub mod log_lines;
pub mod metric;
pub mod oneshot;
pub mod pages;
pub mod paused;
#[cfg(feature = "postgres")]
pub mod postgres_server;
pub mod redis_server;
pub mod reservations;
pub mod stores;
pub mod streams;
