//! The failure policy: what a request gets when its store fails, and how to say it in a line.
//!
//! Only the choice and its check live here; the breaker, its lines and the local store that
//! carry it out read it, and it reads none of them.

use crate::algorithm::error::ConfigError;

/// What the layer does when its store fails, times out, or its circuit breaker is open.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum FailurePolicy {
    /// Forward the request without limiting it (default). A limiter outage then degrades
    /// protection instead of taking the whole service down with it.
    #[default]
    Open,
    /// Answer `503 Service Unavailable` with a plain problem+json message and a `Retry-After`
    /// (the breaker's next probe; gRPC requests: `UNAVAILABLE` with `grpc-retry-pushback-ms`):
    /// for limits that guard something that must never be overrun
    /// (a paid upstream with a hard cap).
    Closed,
    /// Decide with an in-process [`MemoryStore`](crate::MemoryStore) holding the same rules, each
    /// limit scaled by `share` (e.g. `0.25` for one instance of four), until the shared store
    /// answers again; then the shared store decides again by itself. The local counts start empty
    /// and are not merged back. `share` must be in `(0, 1]`; scaled numbers are rounded down, to
    /// at least 1.
    Local {
        /// The fraction of each limit this instance may grant on its own.
        share: f64,
    },
}

impl FailurePolicy {
    /// Checks the share of [`Local`](Self::Local).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        match *self {
            FailurePolicy::Local { share } if !(share > 0.0 && share <= 1.0) => {
                Err(ConfigError::new(
                    "on_store_failure",
                    "share",
                    format!("the local share must be greater than 0 and at most 1, not {share}"),
                ))
            }
            _ => Ok(()),
        }
    }

    /// What requests get under this policy, as the warning lines say it.
    pub(super) fn what_happens(&self) -> String {
        match self {
            FailurePolicy::Open => "requests are forwarded unlimited (fail open)".to_owned(),
            FailurePolicy::Closed => "requests are refused with 503 (fail closed)".to_owned(),
            FailurePolicy::Local { share } => {
                format!("requests are decided locally with {share} of each limit (fail to local)")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_outside_0_to_1_is_refused() {
        for share in [0.0, -1.0, 1.5, f64::NAN] {
            let error = FailurePolicy::Local { share }.validate().unwrap_err();
            assert_eq!(error.field(), "share");
        }
        assert!(FailurePolicy::Local { share: 1.0 }.validate().is_ok());
    }
}
