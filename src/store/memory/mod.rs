//! The in-memory store: sharded tables of tiny per-key states.
//!
//! Each key's state lives in one shard, a spinlocked `HashMap` chosen by the key's hash. A request
//! locks the shards of all its keys in one global order (so batches never deadlock), decides every
//! rule, commits all or nothing, and unlocks: a lock is held only for that arithmetic, never across
//! an await. (A concurrent map such as DashMap gives no way to hold several shards at once in a
//! fixed order, which all-or-nothing batches need, hence this small table of its own.)
//!
//! Token-bucket states are a single `u64` (the moment the bucket was empty, and in 7 of its bits
//! the refill span it was written under, for the sweep: see `spans`) in a table of their own, so a
//! tracked key costs about as much memory as in governor's keyed limiter; the other algorithms
//! share a second table.
//!
//! Keys are identified by a 64-bit hash of `(rule, key)`, seeded at random per store so nobody can
//! aim a collision at another client's key.
//!
//! The rooms: `builder` (bounds and clock), `clock`, `table` (the sharded tables and their
//! sweep), `spans` (a bucket's one-word entry), `slots` (the other algorithms' states), `blocks`
//! (a penalty's blocks) and `listing` (a page of them), `overrides`, `locked` (the shards a batch
//! holds), `cell` (one charge on its key) and `decide` (a batch, all or nothing).

mod blocks;
mod builder;
mod cell;
mod clock;
mod decide;
mod listing;
mod locked;
mod overrides;
mod slots;
mod spans;
mod table;

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use super::{
    BlockedKey, Charge, Cursor, Outcomes, OverrideEntry, Page, RuleName, Store, StoreFuture,
};
use crate::algorithm::error::ConfigError;
use crate::algorithm::{Algorithm, Limit, Micros, Outcome, Penalty};
use crate::clock::Clock;
#[cfg(doc)]
use crate::key::MAX_KEY_LEN;
use blocks::BlockEntry;
pub use builder::MemoryStoreBuilder;
use clock::StoreClock;
use overrides::Overrides;
use slots::Timed;
use spans::{BucketEntry, Spans};
use table::{table_of, Table, Which};

/// The expiry of a state that must never be forgotten: a concurrency limit's taken slots.
const PINNED: Micros = Micros::MAX;
/// The default bound on tracked keys per table.
const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The default store: in process, no setup.
///
/// Clones share the same state. Idle keys — those whose state has become equal to a new key's, so
/// forgetting them changes no decision — are dropped as the tables grow, with no background task.
/// (A token bucket is idle once full under the limit that last charged it; a larger limit that a
/// later request brings finds a dropped key new, as the Redis store does once the key expired.)
///
/// # Memory bound
/// At most [`max_keys`](MemoryStoreBuilder::max_keys) keys are tracked per table (token buckets in
/// one, the other algorithms in the other; default one million). When a shard reaches its share of
/// the bound it first drops idle keys; if it is still full, it forgets the eighth of its keys that
/// are closest to being idle — those the limiter restricts least, so a flood of new keys cannot
/// free a key that is currently being held back much. Those forgotten keys start again as new
/// keys, which may let them through a little early; memory never grows past the bound, except
/// by the keys of [concurrency limits](crate::Limit::concurrent) with slots taken: those are
/// never forgotten (that would admit one request too many), and there are at most as many of
/// them as requests in flight.
///
/// The blocks of rules with a penalty are a third table under the same bound; each of its
/// entries also keeps its key's bytes (at most [`MAX_KEY_LEN`]: longer keys are kept as their
/// digest), so that [`Limiter::blocks`](crate::Limiter::blocks) can list them.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    clock: StoreClock,
    hasher: foldhash::fast::RandomState,
    /// The refill spans the bucket entries name.
    spans: Arc<Spans>,
    buckets: Table<BucketEntry>,
    others: Table<Timed>,
    /// The blocks of rules with a penalty, beside the counters (only those rules look here).
    blocks: Table<BlockEntry>,
    /// Per-key overrides by rule and key, with their expiry (only overridable rules look here).
    overrides: Mutex<Overrides>,
    /// How many overrides `overrides` holds: a charge finds none without taking the lock.
    overridden: AtomicUsize,
}

impl MemoryStore {
    /// A store with the system clock and default bounds.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A store reading time from `clock` (e.g. [`TokioClock`](crate::clock::TokioClock) in tests that
    /// pause tokio's time), with default bounds.
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::builder().clock(clock).build()
    }

    /// Configures a store.
    pub fn builder() -> MemoryStoreBuilder {
        let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
        MemoryStoreBuilder {
            clock: None,
            max_keys: DEFAULT_MAX_KEYS,
            shards: (cpus * 8).clamp(16, 1024).next_power_of_two(),
        }
    }

    /// Decides one charge now: what [`Store::apply_one`] answers, without the future around it
    /// (the memory store never waits). The call the middleware makes for a request under one
    /// rule; a program deciding in its own loop, as with governor's `check_key`, can make it
    /// too.
    ///
    /// ```
    /// use tollgate::algorithm::{Algorithm, TokenBucket};
    /// use tollgate::store::{Charge, RuleName};
    /// use tollgate::MemoryStore;
    /// use std::time::Duration;
    ///
    /// let store = MemoryStore::new();
    /// let limit = Algorithm::TokenBucket(TokenBucket::new(2, Duration::from_secs(1)));
    /// let charge = Charge::new(RuleName::new("per-user"), &limit, b"alice", 1);
    /// assert_eq!(store.decide(&charge).remaining, 1);
    /// assert_eq!(store.decide(&charge).remaining, 0);
    /// assert!(!store.decide(&charge).is_allowed());
    /// ```
    #[inline]
    pub fn decide(&self, charge: &Charge<'_>) -> Outcome {
        self.decide_one(charge)
    }

    /// The number of keys currently tracked.
    pub fn len(&self) -> usize {
        self.inner.buckets.len() + self.inner.others.len() + self.inner.blocks.len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The current time of the store's clock.
    #[inline]
    pub fn now(&self) -> Micros {
        self.inner.clock.now()
    }

    /// The key's hash in its rule's namespace: the rule's digest, computed once per rule, and
    /// the key's bytes (a fixed-width digest first needs no separator).
    #[inline]
    fn hash(&self, rule: RuleName<'_>, key: &[u8]) -> u64 {
        let mut h = self.inner.hasher.build_hasher();
        h.write_u64(rule.digest());
        h.write(key);
        h.finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.len())
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

impl Store for MemoryStore {
    fn apply(&self, batch: &[Charge<'_>]) -> StoreFuture<Outcomes> {
        StoreFuture::ready(Ok(self.apply_now(batch)))
    }

    #[inline]
    fn apply_one(&self, charge: &Charge<'_>) -> StoreFuture<Outcome> {
        StoreFuture::ready(Ok(self.decide_one(charge)))
    }

    fn refund(&self, charge: &Charge<'_>) -> StoreFuture<()> {
        self.refund_now(charge);
        StoreFuture::ready(Ok(()))
    }

    fn reset(&self, rule: &str, algorithm: &Algorithm, key: &[u8]) -> StoreFuture<()> {
        let hash = self.hash(RuleName::new(rule), key);
        match table_of(algorithm) {
            Which::Buckets => self.inner.buckets.shard(hash).map.remove(&hash).map(drop),
            Which::Others => self.inner.others.shard(hash).map.remove(&hash).map(drop),
            Which::Blocks => None,
        };
        self.inner.blocks.shard(hash).map.remove(&hash);
        StoreFuture::ready(Ok(()))
    }

    fn set_override(
        &self,
        rule: &str,
        key: &[u8],
        limit: Option<(&Limit, std::time::Duration)>,
    ) -> StoreFuture<()> {
        self.set_override_now(rule, key, limit);
        StoreFuture::ready(Ok(()))
    }

    fn overrides(
        &self,
        rule: &str,
        cursor: Option<&Cursor>,
        count: usize,
    ) -> StoreFuture<Page<OverrideEntry>> {
        StoreFuture::ready(self.list_overrides(rule, cursor, count))
    }

    fn override_of(&self, rule: &str, key: &[u8]) -> StoreFuture<Option<OverrideEntry>> {
        StoreFuture::ready(Ok(self.override_now(rule, key)))
    }

    fn validate_overrides(&self, _rule: &str) -> Result<(), ConfigError> {
        Ok(())
    }

    fn set_block(
        &self,
        rule: &str,
        penalty: &Penalty,
        key: &[u8],
        block: Option<std::time::Duration>,
    ) -> StoreFuture<()> {
        self.set_block_now(rule, penalty, key, block);
        StoreFuture::ready(Ok(()))
    }

    fn blocks(&self, rule: &str, cursor: Option<&Cursor>) -> StoreFuture<Page<BlockedKey>> {
        StoreFuture::ready(self.list_blocks(rule, cursor))
    }

    fn block_of(&self, rule: &str, key: &[u8]) -> StoreFuture<Option<BlockedKey>> {
        StoreFuture::ready(Ok(self.block_now(rule, key)))
    }
}

#[cfg(test)]
mod tests;
