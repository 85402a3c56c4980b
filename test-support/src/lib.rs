//! Helpers shared by the test binaries of the workspace (the library's, tollgate-server's) and by
//! the Redis bench: stores with frozen or paused clocks, real Redis and Postgres servers, the differential scenarios, request drivers, log
//! capture. Each binary uses some of them; a crate of its own (not published) so that each is
//! compiled once, not once per binary that includes it.

pub mod calendar;
pub mod certificates;
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
