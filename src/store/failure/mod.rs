//! What happens when a remote store fails: the failure policy, the circuit breaker in front of the
//! store, its warnings bounded to one line per interval, and the local fallback.
//!
//! One job per file, read one way (each file uses only those above it):
//! - `policy`: [`FailurePolicy`], what a request gets while the store fails;
//! - `warnings`: the breaker's lines, at most one per interval, with counts;
//! - `breaker`: [`CircuitBreaker`]'s settings and the state machine that opens, probes and closes;
//! - `fallback`: the in-process store deciding with a share of each limit;
//! - `guarded`: the store wrapper routing each call through the breaker to the store or the
//!   fallback.
//!
//! Nothing here knows rules, HTTP or the responses a failure turns into (the `503` of fail closed
//! is the response stage's).

mod breaker;
mod fallback;
mod guarded;
mod policy;
mod warnings;

pub use breaker::CircuitBreaker;
pub(crate) use guarded::Guarded;
pub use policy::FailurePolicy;
