//! Per-key overrides: a key of an overridable rule charged under a limit of its own
//! for a while, kept in the store so every instance sees it on its next decision, and listed a
//! page at a time (a [`Page`](super::Page) walked with a [`Cursor`](super::Cursor), as blocks are).

use std::time::Duration;

use crate::algorithm::Limit;
use crate::key::KeyValue;

/// One key's override, as [`Limiter::overrides`](crate::Limiter::overrides) lists it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct OverrideEntry {
    /// The key.
    pub key: KeyValue,
    /// The limit the key is charged under instead of its rule's.
    pub limit: Limit,
    /// How long the override has left.
    pub expires_in: Duration,
}

/// The most a page of overrides holds, whatever size is asked for.
pub(crate) const MAX_OVERRIDE_PAGE: usize = 1_000;
