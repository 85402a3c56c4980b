//! `MemoryStoreBuilder`: a memory store's clock and bounds.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use super::clock::StoreClock;
use super::spans::Spans;
use super::table::Table;
use super::{Inner, MemoryStore};
use crate::clock::{Clock, SystemClock};

/// Builds a [`MemoryStore`].
#[derive(Debug)]
pub struct MemoryStoreBuilder {
    /// `None` for the system clock, made only when the store is built: its calibration takes
    /// up to 200 ms, which a store given its own clock (a replay's) should not spend.
    pub(super) clock: Option<StoreClock>,
    pub(super) max_keys: usize,
    pub(super) shards: usize,
}

impl MemoryStoreBuilder {
    /// The clock to read time from (default: [`SystemClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(StoreClock::new(clock));
        self
    }

    /// The most keys tracked per table (default one million); see [`MemoryStore`].
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// The number of shards (rounded up to a power of two; default eight per CPU, at least 16).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.clamp(1, 1 << 16).next_power_of_two();
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore {
        let per_shard = self.max_keys.div_ceil(self.shards);
        let spans = Arc::new(Spans::new());
        MemoryStore {
            inner: Arc::new(Inner {
                clock: self
                    .clock
                    .unwrap_or_else(|| StoreClock::System(SystemClock::new())),
                hasher: foldhash::fast::RandomState::default(),
                buckets: Table::new(self.shards, per_shard, &spans),
                others: Table::new(self.shards, per_shard, &spans),
                blocks: Table::new(self.shards, per_shard, &spans),
                overrides: Mutex::default(),
                overridden: AtomicUsize::new(0),
                spans,
            }),
        }
    }
}
