//! `LimitError`: why the limiter handle could not answer.

use std::fmt;

use crate::algorithm::CostTooLarge;
use crate::store::StoreError;

/// Why the limiter handle could not answer.
#[derive(Debug)]
#[non_exhaustive]
pub enum LimitError {
    /// No rule has that name.
    UnknownRule(String),
    /// The cost can never pass under the rule.
    CostTooLarge {
        /// The rule.
        rule: String,
        /// The cost and the most that fits.
        error: CostTooLarge,
    },
    /// The rule has no [`Queue`](crate::Queue) settings, so it cannot reserve.
    NotQueued(String),
    /// The rule's algorithm cannot reserve (only token buckets and fixed windows do).
    CannotReserve(String),
    /// One batch names the same rule and key twice.
    Repeated(String),
    /// A batch ([`Limiter::charge_all`](crate::Limiter::charge_all),
    /// [`check_all`](crate::Limiter::check_all), [`reserve_all`](crate::Limiter::reserve_all))
    /// names no rule: there is nothing to decide, and a decision that says "allowed" would be a
    /// limit that was never asked.
    EmptyBatch,
    /// The rule has no penalty ([`Rule::block`](crate::Rule::block)), so its keys cannot be
    /// blocked.
    NoPenalty(String),
    /// The rule is not a concurrency limit, so it has no slots to acquire.
    NotConcurrent(String),
    /// The rule has no overrides ([`Rule::overridable`](crate::Rule::overridable)), so its
    /// keys cannot be given one.
    NotOverridable(String),
    /// An override that cannot be kept: a limit the rule cannot use, a key past
    /// [`MAX_KEY_LEN`](crate::key::MAX_KEY_LEN), a TTL of zero or of more than a year.
    BadOverride {
        /// The rule.
        rule: String,
        /// What is wrong, in words.
        reason: String,
    },
    /// A limit given with a charge ([`Limiter::charge_all_under`](crate::Limiter::charge_all_under)) that the rule cannot use: a
    /// concurrency limit for a rate rule or the reverse, numbers the store cannot count.
    BadLimit {
        /// The rule.
        rule: String,
        /// What is wrong, in words.
        reason: String,
    },
    /// The store failed.
    Store(StoreError),
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitError::UnknownRule(name) => write!(f, "no rate-limit rule is named {name:?}"),
            LimitError::CostTooLarge { rule, error } => write!(f, "rule {rule:?}: {error}"),
            LimitError::NotQueued(name) => {
                write!(
                    f,
                    "rate-limit rule {name:?} has no queue settings: it cannot reserve"
                )
            }
            LimitError::CannotReserve(name) => write!(
                f,
                "rate-limit rule {name:?} cannot reserve: only token buckets and fixed windows do"
            ),
            LimitError::Repeated(name) => write!(
                f,
                "rate-limit rule {name:?} is charged twice for the same key in one batch"
            ),
            LimitError::NoPenalty(name) => write!(
                f,
                "rate-limit rule {name:?} has no penalty (block): its keys cannot be blocked"
            ),
            LimitError::NotConcurrent(name) => write!(
                f,
                "rate-limit rule {name:?} is not a concurrency limit: it has no slots to acquire"
            ),
            LimitError::NotOverridable(name) => write!(
                f,
                "rate-limit rule {name:?} has no overrides: build it with `overridable()` \
                 (`overrides = true` in a file) to give its keys limits of their own"
            ),
            LimitError::BadOverride { rule, reason } => {
                write!(
                    f,
                    "rate-limit rule {rule:?}: override refused, nothing written: {reason}"
                )
            }
            LimitError::BadLimit { rule, reason } => {
                write!(
                    f,
                    "rate-limit rule {rule:?}: the limit given cannot be used: {reason}"
                )
            }
            LimitError::EmptyBatch => {
                f.write_str("a batch of rate-limit charges names no rule: nothing to decide")
            }
            LimitError::Store(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for LimitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LimitError::Store(error) => Some(error),
            LimitError::CostTooLarge { error, .. } => Some(error),
            LimitError::UnknownRule(_)
            | LimitError::NotQueued(_)
            | LimitError::CannotReserve(_)
            | LimitError::Repeated(_)
            | LimitError::NoPenalty(_)
            | LimitError::NotConcurrent(_)
            | LimitError::NotOverridable(_)
            | LimitError::BadOverride { .. }
            | LimitError::BadLimit { .. }
            | LimitError::EmptyBatch => None,
        }
    }
}

impl From<StoreError> for LimitError {
    fn from(error: StoreError) -> Self {
        LimitError::Store(error)
    }
}
