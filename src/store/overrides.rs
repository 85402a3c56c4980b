//! Per-key overrides (DESIGN §19): a key of an overridable rule charged under a limit of its own
//! for a while, kept in the store so every instance sees it on its next decision, and listed a
//! page at a time.

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

/// One page of a rule's overrides, and where the next page starts (`None`: this was the last).
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct OverridePage {
    /// The overrides of this page, at most the page size asked for.
    pub entries: Vec<OverrideEntry>,
    /// Pass it to the next call for the following page.
    pub next: Option<OverrideCursor>,
}

/// Where a listing of overrides goes on: opaque, given by one page for the next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverrideCursor(pub(crate) Vec<u8>);

impl OverrideCursor {
    /// A cursor from its bytes, as a store made it.
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Self {
        OverrideCursor(bytes.into())
    }

    /// The cursor's bytes (to hand over, e.g., in an admin API's query string).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The most a page of overrides holds, whatever size is asked for.
pub const MAX_OVERRIDE_PAGE: usize = 1_000;
