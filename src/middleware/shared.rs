//! What every service of one layer shares: the limiter, the responder, the failure policy and the
//! layer's switches. The layer builds it; the service, the decision and the future read it.

use crate::engine::limiter::Limiter;
use crate::response::Responder;
use crate::store::FailurePolicy;

/// What every service of one layer shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) limiter: Limiter,
    pub(crate) responder: Responder,
    pub(crate) failure: FailurePolicy,
    /// Every rule decides and records but none blocks.
    pub(crate) shadow_all: bool,
    /// Logs show a hash of each key instead of the key.
    pub(crate) redact_keys: bool,
    /// An allowed request carries its `Decision` in its extensions.
    pub(crate) decision_in_extensions: bool,
    /// A missing peer address is logged once per layer, not once per request.
    pub(crate) no_peer_logged: std::sync::atomic::AtomicBool,
    /// Whether the missing route of a path-parameter key was logged (once per layer).
    pub(crate) no_route_logged: std::sync::atomic::AtomicBool,
}
