//! The engine: a request's plan → the store → a [`Decision`](decision::Decision). The public
//! [`Limiter`](limiter::Limiter) handle (check, charge, reserve, refund, reset, block, acquire),
//! reservations, concurrency slots and the lines that wait for them, settlements, and the ledger
//! through which whatever a decided request leaves behind reaches the store.
//!
//! It reads the rules, keys, algorithms and stores above it; it never touches responses,
//! metrics or Tower.
//!
//! [`Limiter`](crate::Limiter), [`Decision`](crate::Decision) and
//! [`LimitError`](crate::LimitError) are at the crate's root; this module holds the limiter's
//! builder and the parts of its answers.

pub(crate) mod ask;
pub(crate) mod charge;
pub(crate) mod decision;
pub(crate) mod ledger;
pub(crate) mod limiter;
pub(crate) mod lines;
pub(crate) mod settlement;
pub(crate) mod slot;

pub use decision::{RuleDecision, Ruling};
pub use limiter::{LimiterBuilder, Reservation};
pub use slot::SlotGuard;
