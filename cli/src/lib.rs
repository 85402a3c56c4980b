//! The `tollgate` command: check a rate-limit configuration, replay access logs through it, and
//! simulate traffic against it — on the library's public API only, so it runs exactly what a
//! deployed layer runs.
//!
//! The way a line travels: [`log`] (a format's line → [`log::Entry`]) → [`run`] (time spread
//! over shared seconds, the manual clock set, the request decided by the limiter) → [`stats`]
//! (counts per rule, key and second) → text, JSON, or [`report`] (HTML and SVG). [`simulate`]
//! makes entries instead of reading them; [`check`] only loads and describes.

pub mod check;
pub mod descriptors;
pub mod log;
mod ready;
pub mod replay;
pub mod report;
pub mod run;
pub mod simulate;
pub mod stats;
pub mod time;
