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

use std::any::Any;
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use spinning_top::guard::SpinlockGuard;
use spinning_top::Spinlock;

use smallvec::SmallVec;

use super::{
    BlockedKey, Charge, Cursor, Outcomes, OverrideEntry, Page, RuleName, Store, StoreFuture,
};
use crate::algorithm::{
    duration, micros, Algorithm, Block, BurstPoolState, FixedWindowState, Limit, Micros, Mode,
    Outcome, Penalty, SlidingLogState, SlidingWindowState, TokenBucket, Verdict,
};
use crate::clock::{Clock, Latest, SystemClock};
use crate::key::KeyValue;
#[cfg(doc)]
use crate::key::MAX_KEY_LEN;

mod listing;
mod spans;
use spans::{BucketEntry, Spans};

/// The expiry of a state that must never be forgotten: a concurrency limit's taken slots.
const PINNED: Micros = Micros::MAX;
/// The default bound on tracked keys per table.
const DEFAULT_MAX_KEYS: usize = 1_000_000;
/// A shard is swept for idle keys when it has grown past twice its size after the last sweep, and
/// never below this many keys.
const MIN_SWEEP: usize = 64;

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

/// Overrides by rule name, then key: the limit (shared, so that an outcome decided under it
/// carries it without allocating) and when it ends.
type Overrides = BTreeMap<String, BTreeMap<Vec<u8>, (Arc<Limit>, Micros)>>;

/// Builds a [`MemoryStore`].
#[derive(Debug)]
pub struct MemoryStoreBuilder {
    /// `None` for the system clock, made only when the store is built: its calibration takes
    /// up to 200 ms, which a store given its own clock (a replay's) should not spend.
    clock: Option<StoreClock>,
    max_keys: usize,
    shards: usize,
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

    /// The overrides, held. A lock poisoned by a panic elsewhere is taken all the same, as this
    /// store's other locks are: the maps stay valid whatever a panic interrupted.
    fn override_table(&self) -> std::sync::MutexGuard<'_, Overrides> {
        self.inner
            .overrides
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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

/// The store's clock. The default system clock is called directly, so its read inlines into the
/// decision; any other clock goes through its trait object.
///
/// Either way the store never reads a time earlier than one it read before: the system clock
/// sees to that itself, and any other clock (a test's manual clock, your own) is held to the
/// latest time read. So no algorithm is handed a `now` before a key's stored time — a clock
/// that steps back reads as standing still — which the buckets, keeping only the moment they were
/// empty, could not tell from time not yet refilled.
#[derive(Clone)]
enum StoreClock {
    System(SystemClock),
    Custom(Arc<dyn Clock>, Arc<Latest>),
}

impl StoreClock {
    fn new(clock: impl Clock) -> Self {
        match (&clock as &dyn Any).downcast_ref::<SystemClock>() {
            Some(system) => StoreClock::System(system.clone()),
            None => StoreClock::Custom(Arc::new(clock), Arc::default()),
        }
    }

    #[inline]
    fn now(&self) -> Micros {
        match self {
            StoreClock::System(clock) => clock.now(),
            StoreClock::Custom(clock, latest) => latest.at_least(clock.now()),
        }
    }
}

impl fmt::Debug for StoreClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreClock::System(clock) => clock.fmt(f),
            StoreClock::Custom(clock, _) => clock.fmt(f),
        }
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
        let now = self.now();
        let hash = self.hash(charge.rule, charge.key);
        let mut locked = Locked::lock(&self.inner, [(table_of(charge.algorithm), hash)]);
        let cell = Cell::new(charge, hash, now);
        cell.refund(&mut locked, charge.cost);
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
        let now = self.now();
        let mut table = self.override_table();
        // Expired overrides go whenever one is set: the table never holds more than were set
        // within the longest TTL.
        for keys in table.values_mut() {
            keys.retain(|_, (_, until)| *until > now);
        }
        table.retain(|_, keys| !keys.is_empty());
        match limit {
            Some((limit, ttl)) => {
                let until = now.saturating_add(micros(ttl));
                table
                    .entry(rule.to_owned())
                    .or_default()
                    .insert(key.to_vec(), (Arc::new(limit.clone()), until));
            }
            None => {
                if let Some(keys) = table.get_mut(rule) {
                    keys.remove(key);
                }
            }
        }
        let count = table.values().map(BTreeMap::len).sum();
        self.inner.overridden.store(count, Ordering::Release);
        StoreFuture::ready(Ok(()))
    }

    fn overrides(
        &self,
        rule: &str,
        cursor: Option<&Cursor>,
        count: usize,
    ) -> StoreFuture<Page<OverrideEntry>> {
        use std::ops::Bound;
        let now = self.now();
        let table = self.override_table();
        let mut page = Page::new(Vec::new(), None);
        let Some(keys) = table.get(rule) else {
            return StoreFuture::ready(Ok(page));
        };
        // The cursor is the last key of the previous page, `o` and its bytes in hex.
        let after = match cursor.map(|cursor| cursor.key_after('o')) {
            Some(Some(key)) => Some(key),
            Some(None) => {
                return StoreFuture::ready(Err(crate::store::StoreError::new(
                    crate::store::StoreErrorKind::BadCursor,
                    "not a cursor of this memory store's override listings",
                )))
            }
            None => None,
        };
        let from = match &after {
            Some(key) => Bound::Excluded(key.as_slice()),
            None => Bound::Unbounded,
        };
        let count = count.clamp(1, super::MAX_OVERRIDE_PAGE);
        let mut live = keys
            .range::<[u8], _>((from, Bound::Unbounded))
            .filter(|(_, (_, until))| *until > now);
        for (key, (limit, until)) in live.by_ref().take(count) {
            page.items.push(OverrideEntry {
                key: crate::key::KeyValue::new(key),
                limit: Limit::clone(limit),
                expires_in: duration(until - now),
            });
        }
        if live.next().is_some() {
            page.next = page
                .items
                .last()
                .map(|last| Cursor::after_key('o', last.key.as_bytes()));
        }
        StoreFuture::ready(Ok(page))
    }

    fn override_of(&self, rule: &str, key: &[u8]) -> StoreFuture<Option<OverrideEntry>> {
        let now = self.now();
        let table = self.override_table();
        let entry = table
            .get(rule)
            .and_then(|keys| keys.get(key))
            .filter(|(_, until)| *until > now)
            .map(|(limit, until)| OverrideEntry {
                key: crate::key::KeyValue::new(key),
                limit: Limit::clone(limit),
                expires_in: duration(until - now),
            });
        StoreFuture::ready(Ok(entry))
    }

    fn validate_overrides(&self, _rule: &str) -> Result<(), crate::algorithm::error::ConfigError> {
        Ok(())
    }

    fn set_block(
        &self,
        rule: &str,
        penalty: &Penalty,
        key: &[u8],
        block: Option<std::time::Duration>,
    ) -> StoreFuture<()> {
        let hash = self.hash(RuleName::new(rule), key);
        let mut shard = self.inner.blocks.shard(hash);
        match block {
            None => {
                shard.map.remove(&hash);
            }
            Some(d) => {
                let now = self.now();
                let offences = shard.map.get(&hash).map_or(0, |b| b.block.offences);
                let block = Block {
                    until: now.saturating_add(crate::algorithm::micros(d)),
                    offences,
                };
                let expires = penalty.forgotten_at(&block);
                shard.set_block(hash, RuleName::new(rule), key, block, expires, now);
            }
        }
        StoreFuture::ready(Ok(()))
    }

    fn blocks(&self, rule: &str, cursor: Option<&Cursor>) -> StoreFuture<Page<BlockedKey>> {
        StoreFuture::ready(self.list_blocks(rule, cursor))
    }

    fn block_of(&self, rule: &str, key: &[u8]) -> StoreFuture<Option<BlockedKey>> {
        StoreFuture::ready(Ok(self.block_now(rule, key)))
    }
}

impl MemoryStore {
    /// Decides a batch against the current time; see [`Store::apply`].
    fn apply_now(&self, batch: &[Charge<'_>]) -> Outcomes {
        match batch {
            [charge] => Outcomes::from(self.decide_one(charge)),
            _ if batch.iter().any(|c| c.read_overrides) => self.overridden(batch),
            _ => self.apply_batch(batch),
        }
    }

    /// A charge with a penalty or whose rule has overrides.
    #[cold]
    fn special_one(&self, charge: &Charge<'_>) -> Outcome {
        if charge.read_overrides {
            let outcomes = self.overridden(std::slice::from_ref(charge));
            return outcomes.into_iter().next().expect("one outcome per charge");
        }
        penalised_one(self, charge)
    }

    /// A batch with charges of overridable rules: each such key's override in force replaces
    /// its charge's limit (unless the cost could never pass under it: then the rule's own
    /// decides, as for a per-request limit), and comes back with the charge's outcome.
    fn overridden(&self, batch: &[Charge<'_>]) -> Outcomes {
        let found: SmallVec<[Option<Arc<Limit>>; 2]> =
            if self.inner.overridden.load(Ordering::Acquire) == 0 {
                batch.iter().map(|_| None).collect()
            } else {
                let now = self.now();
                let table = self.override_table();
                batch
                    .iter()
                    .map(|c| {
                        if !c.read_overrides {
                            return None;
                        }
                        let (limit, until) = table.get(c.rule.as_str())?.get(c.key)?;
                        let fits = c.cost <= limit.algorithm().max_cost(c.mode);
                        (*until > now && fits).then(|| limit.clone())
                    })
                    .collect()
            };
        let charges: SmallVec<[Charge<'_>; 2]> = batch
            .iter()
            .zip(&found)
            .map(|(c, limit)| Charge {
                algorithm: limit.as_deref().map_or(c.algorithm, Limit::algorithm),
                read_overrides: false,
                ..*c
            })
            .collect();
        let mut outcomes = self.apply_now(&charges);
        drop(charges);
        for (outcome, limit) in outcomes.iter_mut().zip(found) {
            outcome.overridden = limit;
        }
        outcomes
    }

    /// Any batch: lock every shard involved in order, decide all, commit all or nothing.
    fn apply_batch(&self, batch: &[Charge<'_>]) -> Outcomes {
        let now = self.now();
        let cells: SmallVec<[Cell<'_, '_>; 2]> = batch
            .iter()
            .map(|charge| Cell::new(charge, self.hash(charge.rule, charge.key), now))
            .collect();
        let blocks = cells
            .iter()
            .filter(|c| c.charge.penalty.is_some())
            .map(|c| (Which::Blocks, c.hash));
        let mut locked = Locked::lock(
            &self.inner,
            cells.iter().map(|c| (c.table, c.hash)).chain(blocks),
        );
        // A blocked key is denied without looking at its counters.
        let blocked: SmallVec<[Option<Block>; 2]> = cells
            .iter()
            .map(|c| {
                c.charge.penalty?;
                let block = locked.blocks(c.hash).map.get(&c.hash)?.block;
                Some(block)
            })
            .collect();
        let mut outcomes: Outcomes = cells
            .iter()
            .zip(&blocked)
            .map(|(c, block)| match block {
                Some(block) if block.until > now => {
                    Penalty::blocked(block.until, now, c.charge.algorithm.capacity())
                }
                _ => c.evaluate(&mut locked, c.charge.cost),
            })
            .collect();
        if outcomes.iter().all(|o| o.verdict.is_admitted()) {
            for cell in cells.iter().filter(|c| c.charge.mode != Mode::Check) {
                cell.commit(&mut locked);
            }
        } else {
            // All or nothing: report what the admitted rules have left, uncharged.
            for ((cell, outcome), block) in cells.iter().zip(outcomes.iter_mut()).zip(&blocked) {
                if outcome.verdict.is_admitted() {
                    let peek = cell.evaluate(&mut locked, 0);
                    *outcome = Outcome {
                        verdict: Verdict::Allowed,
                        ..peek
                    };
                } else if let Some(penalty) = cell.charge.penalty {
                    if offends(cell.charge) && block.is_none_or(|b| b.until <= now) {
                        let block = penalty.offend(*block, now);
                        let expires = penalty.forgotten_at(&block);
                        let (rule, key) = (cell.charge.rule, cell.charge.key);
                        locked
                            .blocks(cell.hash)
                            .set_block(cell.hash, rule, key, block, expires, now);
                        *outcome = Penalty::punish(outcome.clone(), block.until, now);
                    }
                }
            }
        }
        outcomes
    }

    /// [`apply_batch`](Self::apply_batch) for a batch of one charge, the usual case: the same
    /// decision, without collecting cells, sorting shards or searching the held guards.
    #[inline]
    fn decide_one(&self, charge: &Charge<'_>) -> Outcome {
        if charge.penalty.is_some() || charge.read_overrides {
            return self.special_one(charge);
        }
        let now = self.now();
        let hash = self.hash(charge.rule, charge.key);
        if let Algorithm::TokenBucket(tb) = charge.algorithm {
            return self.apply_bucket(tb, charge, hash, now);
        }
        let cell = Cell::new(charge, hash, now);
        let mut locked = Locked::one(&self.inner, cell.table, cell.hash);
        // A denied charge changes nothing; an admitted one is committed unless it only looks.
        let outcome = cell.charge_alone(&mut locked);
        drop(locked);
        outcome
    }

    /// One token-bucket charge: what `Cell::evaluate` and `Cell::commit` do, with one lookup of the
    /// key instead of three. Only the verdict is decided while the shard is held; the outcome
    /// (units left, waits) is a pure function of the state seen and is built after the shard is
    /// released, so threads on one hot shard wait for each other as briefly as possible.
    #[inline]
    fn apply_bucket(
        &self,
        tb: &TokenBucket,
        charge: &Charge<'_>,
        hash: u64,
        now: Micros,
    ) -> Outcome {
        let (cost, mode) = (charge.cost, charge.mode);
        let charges = |empty_at: i64| mode != Mode::Check && tb.admits(empty_at, now, cost, mode);
        // Outside the lock: the code of the span a written entry records.
        let code = self.inner.spans.code(tb.full_span());
        let seen = {
            let mut shard = self.inner.buckets.shard(hash);
            match shard.map.get_mut(&hash) {
                Some(entry) => {
                    let seen = entry.empty_at();
                    if charges(seen) {
                        *entry = BucketEntry::new(tb.commit(seen, now, cost), code);
                    }
                    seen
                }
                None => {
                    let seen = tb.fresh(now);
                    if charges(seen) {
                        let entry = BucketEntry::new(tb.commit(seen, now, cost), code);
                        shard.put(hash, entry, now);
                    }
                    seen
                }
            }
        };
        tb.evaluate(seen, now, cost, mode)
    }
}

/// A charge under a rule with a penalty: the batch path, which also holds the key's block.
#[cold]
fn penalised_one(store: &MemoryStore, charge: &Charge<'_>) -> Outcome {
    store
        .apply_batch(std::slice::from_ref(charge))
        .pop()
        .unwrap_or_else(|| unreachable_outcome(charge.algorithm))
}

/// Whether a denial of this charge is an offence: a real charge, not a look.
fn offends(charge: &Charge<'_>) -> bool {
    charge.mode != Mode::Check && charge.cost > 0
}

/// Which table a state lives in.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Which {
    Buckets,
    Others,
    Blocks,
}

/// A key's block, with the moment it is forgotten, and whose it is: the rule's digest and the
/// key's bytes (at most [`MAX_KEY_LEN`]), so that the blocks of a rule can be listed.
struct BlockEntry {
    block: Block,
    expires: Micros,
    rule: u64,
    key: Box<[u8]>,
}

impl ShardMap<BlockEntry> {
    /// Stores the block of `(rule, key)`, whose hash is `hash`; the key's bytes are copied only
    /// when it had no entry.
    fn set_block(
        &mut self,
        hash: u64,
        rule: RuleName<'_>,
        key: &[u8],
        block: Block,
        expires: Micros,
        now: Micros,
    ) {
        if let Some(entry) = self.map.get_mut(&hash) {
            (entry.block, entry.expires) = (block, expires);
            return;
        }
        let entry = BlockEntry {
            block,
            expires,
            rule: rule.digest(),
            key: KeyValue::new(key).as_bytes().into(),
        };
        self.put(hash, entry, now);
    }
}

impl Expiring for BlockEntry {
    fn expires(&self, _: &Spans) -> Micros {
        self.expires
    }
}

fn table_of(algorithm: &Algorithm) -> Which {
    match algorithm {
        Algorithm::TokenBucket(_) => Which::Buckets,
        _ => Which::Others,
    }
}

/// A state of any algorithm but the token bucket, with the moment it becomes idle.
struct Timed {
    state: Slot,
    expires: Micros,
}

enum Slot {
    Window(FixedWindowState),
    Sliding(SlidingWindowState),
    Pool(BurstPoolState),
    Log(Box<SlidingLogState>),
    /// A concurrency limit's slots taken.
    InFlight(u64),
}

/// What the sweeper needs to know about a state.
trait Expiring {
    /// The moment the state equals a fresh key's (a bucket entry reads its span in `spans`).
    fn expires(&self, spans: &Spans) -> Micros;
}

impl Expiring for BucketEntry {
    fn expires(&self, spans: &Spans) -> Micros {
        self.idle_at(spans)
    }
}

impl Expiring for Timed {
    fn expires(&self, _: &Spans) -> Micros {
        self.expires
    }
}

/// One charge bound to its key's hash and the time of the batch.
struct Cell<'c, 'a> {
    charge: &'c Charge<'a>,
    hash: u64,
    table: Which,
    now: Micros,
}

impl<'c, 'a> Cell<'c, 'a> {
    fn new(charge: &'c Charge<'a>, hash: u64, now: Micros) -> Self {
        Cell {
            charge,
            hash,
            table: table_of(charge.algorithm),
            now,
        }
    }

    fn window_offset(&self, period: Micros, start: crate::algorithm::WindowStart) -> Micros {
        start.offset(period, &self.charge.rule, self.charge.key)
    }

    /// The state of a key never seen before.
    fn fresh(&self) -> Slot {
        let now = self.now;
        match self.charge.algorithm {
            Algorithm::FixedWindow(a) => {
                Slot::Window(a.fresh(now, self.window_offset(a.period_micros(), a.start())))
            }
            Algorithm::SlidingWindow(a) => {
                Slot::Sliding(a.fresh(now, self.window_offset(a.period_micros(), a.start())))
            }
            Algorithm::BurstPool(a) => Slot::Pool(a.fresh(now)),
            Algorithm::Concurrency(_) => Slot::InFlight(0),
            Algorithm::SlidingLog(_) | Algorithm::TokenBucket(_) => Slot::Log(Box::default()),
        }
    }

    /// The outcome of charging `cost` now, without changing anything.
    fn evaluate(&self, locked: &mut Locked<'_>, cost: u64) -> Outcome {
        let (now, mode) = (self.now, self.charge.mode);
        match self.charge.algorithm {
            Algorithm::TokenBucket(tb) => {
                let entry = locked.buckets(self.hash).map.get(&self.hash).copied();
                let empty_at = entry.map_or_else(|| tb.fresh(now), BucketEntry::empty_at);
                tb.evaluate(empty_at, now, cost, mode)
            }
            algorithm => {
                let shard = locked.others(self.hash);
                let stored = shard.map.get(&self.hash).map(|t| &t.state);
                let fresh;
                let slot = match stored {
                    Some(slot) if slot_matches(slot, algorithm) => slot,
                    _ => {
                        fresh = self.fresh();
                        &fresh
                    }
                };
                evaluate_slot(algorithm, slot, now, cost, mode)
            }
        }
    }

    /// [`evaluate`](Self::evaluate), then [`commit`](Self::commit) when admitted and the mode
    /// charges: a charge decided alone (not a bucket's, which has its own path), with one lookup
    /// of a key that exists instead of three (the batch needs the two steps apart).
    fn charge_alone(&self, locked: &mut Locked<'_>) -> Outcome {
        let algorithm = self.charge.algorithm;
        let (now, cost, mode) = (self.now, self.charge.cost, self.charge.mode);
        let charges = |outcome: &Outcome| outcome.verdict.is_admitted() && mode != Mode::Check;
        {
            let shard = locked.others(self.hash);
            if let Some(timed) = shard.map.get_mut(&self.hash) {
                if slot_matches(&timed.state, algorithm) {
                    let outcome = evaluate_slot(algorithm, &timed.state, now, cost, mode);
                    if charges(&outcome) {
                        timed.expires =
                            change_slot(algorithm, &mut timed.state, now, Change::Charge(cost));
                    }
                    return outcome;
                }
            }
        }
        let outcome = self.evaluate(locked, cost);
        if charges(&outcome) {
            self.commit(locked);
        }
        outcome
    }

    /// Charges the cost (the batch was admitted).
    fn commit(&self, locked: &mut Locked<'_>) {
        let (now, cost) = (self.now, self.charge.cost);
        match self.charge.algorithm {
            Algorithm::TokenBucket(tb) => {
                let shard = locked.buckets(self.hash);
                let code = shard.spans.code(tb.full_span());
                let empty_at = shard
                    .map
                    .get(&self.hash)
                    .map_or_else(|| tb.fresh(now), |entry| entry.empty_at());
                let entry = BucketEntry::new(tb.commit(empty_at, now, cost), code);
                shard.put(self.hash, entry, now);
            }
            algorithm => self.update(locked, |slot| {
                change_slot(algorithm, slot, now, Change::Charge(cost))
            }),
        }
    }

    /// Gives units back.
    fn refund(&self, locked: &mut Locked<'_>, units: u64) {
        let now = self.now;
        match self.charge.algorithm {
            Algorithm::TokenBucket(tb) => {
                let shard = locked.buckets(self.hash);
                let code = shard.spans.code(tb.full_span());
                if let Some(entry) = shard.map.get_mut(&self.hash) {
                    *entry = BucketEntry::new(tb.refund(entry.empty_at(), now, units), code);
                }
            }
            algorithm => self.update(locked, |slot| {
                change_slot(algorithm, slot, now, Change::Refund(units))
            }),
        }
    }

    /// Changes the key's non-bucket state in place (creating it fresh if needed); `change` returns
    /// the state's new expiry.
    fn update(&self, locked: &mut Locked<'_>, change: impl FnOnce(&mut Slot) -> Micros) {
        let algorithm = self.charge.algorithm;
        let shard = locked.others(self.hash);
        if !shard.map.contains_key(&self.hash) {
            shard.make_room(self.now);
        }
        let timed = shard.map.entry(self.hash).or_insert_with(|| Timed {
            state: self.fresh(),
            expires: 0,
        });
        if !slot_matches(&timed.state, algorithm) {
            // A rule changed its algorithm under the same name: start over.
            timed.state = self.fresh();
        }
        timed.expires = change(&mut timed.state);
    }
}

/// What happens to a state: units charged or given back.
#[derive(Clone, Copy)]
enum Change {
    Charge(u64),
    Refund(u64),
}

/// The outcome of charging `cost` at `now` to a key whose state under `algorithm` is `slot`.
fn evaluate_slot(
    algorithm: &Algorithm,
    slot: &Slot,
    now: Micros,
    cost: u64,
    mode: Mode,
) -> Outcome {
    match (algorithm, slot) {
        (Algorithm::FixedWindow(a), Slot::Window(s)) => a.evaluate(*s, now, cost, mode),
        (Algorithm::SlidingWindow(a), Slot::Sliding(s)) => a.evaluate(*s, now, cost),
        (Algorithm::BurstPool(a), Slot::Pool(s)) => a.evaluate(*s, now, cost),
        (Algorithm::SlidingLog(a), Slot::Log(s)) => a.evaluate(s, now, cost),
        (Algorithm::Concurrency(a), Slot::InFlight(n)) => a.evaluate(*n, cost),
        _ => unreachable_outcome(algorithm),
    }
}

/// Applies `change` to a non-bucket state in place; returns the state's new expiry.
fn change_slot(algorithm: &Algorithm, slot: &mut Slot, now: Micros, change: Change) -> Micros {
    match (algorithm, slot) {
        (Algorithm::FixedWindow(a), Slot::Window(s)) => {
            *s = match change {
                Change::Charge(units) => a.commit(*s, now, units),
                Change::Refund(units) => a.refund(*s, now, units),
            };
            a.expires_at(*s)
        }
        (Algorithm::SlidingWindow(a), Slot::Sliding(s)) => {
            *s = match change {
                Change::Charge(units) => a.commit(*s, now, units),
                Change::Refund(units) => a.refund(*s, now, units),
            };
            a.expires_at(*s)
        }
        (Algorithm::BurstPool(a), Slot::Pool(s)) => {
            *s = match change {
                Change::Charge(units) => a.commit(*s, now, units),
                Change::Refund(units) => a.refund(*s, now, units),
            };
            a.expires_at(*s)
        }
        (Algorithm::SlidingLog(a), Slot::Log(s)) => {
            match change {
                Change::Charge(units) => a.commit(s, now, units),
                Change::Refund(units) => a.refund(s, now, units),
            }
            a.expires_at(s)
        }
        (Algorithm::Concurrency(a), Slot::InFlight(n)) => {
            *n = match change {
                Change::Charge(units) => a.commit(*n, units),
                Change::Refund(units) => a.refund(*n, units),
            };
            // Idle once every slot is back; never evicted while one is taken (forgetting a
            // taken slot would let one request too many in).
            if *n == 0 {
                now
            } else {
                PINNED
            }
        }
        // `update` gives every algorithm its own kind of slot.
        _ => now,
    }
}

fn slot_matches(slot: &Slot, algorithm: &Algorithm) -> bool {
    matches!(
        (algorithm, slot),
        (Algorithm::FixedWindow(_), Slot::Window(_))
            | (Algorithm::SlidingWindow(_), Slot::Sliding(_))
            | (Algorithm::BurstPool(_), Slot::Pool(_))
            | (Algorithm::SlidingLog(_), Slot::Log(_))
            | (Algorithm::Concurrency(_), Slot::InFlight(_))
    )
}

/// `fresh` always builds the variant `slot_matches` accepts, so this is never reached; answering
/// "denied" keeps even a broken invariant on the safe side instead of panicking.
fn unreachable_outcome(algorithm: &Algorithm) -> Outcome {
    Outcome {
        verdict: Verdict::Denied {
            retry_after: algorithm.window(),
        },
        limit: algorithm.capacity(),
        remaining: 0,
        balance: 0,
        next_unit_in: algorithm.window(),
        full_in: algorithm.window(),
        offence: false,
        overridden: None,
    }
}

/// The shards one batch holds, locked in (table, shard index) order.
struct Locked<'s> {
    mask: usize,
    buckets: SmallVec<[(usize, SpinlockGuard<'s, ShardMap<BucketEntry>>); 2]>,
    others: SmallVec<[(usize, SpinlockGuard<'s, ShardMap<Timed>>); 2]>,
    blocks: SmallVec<[(usize, SpinlockGuard<'s, ShardMap<BlockEntry>>); 1]>,
}

impl<'s> Locked<'s> {
    fn lock(inner: &'s Inner, keys: impl IntoIterator<Item = (Which, u64)>) -> Self {
        let mask = inner.buckets.mask;
        let mut order: SmallVec<[(Which, usize); 4]> = keys
            .into_iter()
            .map(|(which, hash)| (which, shard_index(hash, mask)))
            .collect();
        order.sort_unstable();
        order.dedup();
        let mut locked = Locked {
            mask,
            buckets: SmallVec::new(),
            others: SmallVec::new(),
            blocks: SmallVec::new(),
        };
        for (which, index) in order {
            locked.hold(inner, which, index);
        }
        locked
    }

    /// Holds the one shard of a single key.
    fn one(inner: &'s Inner, which: Which, hash: u64) -> Self {
        let mask = inner.buckets.mask;
        let index = shard_index(hash, mask);
        let mut locked = Locked {
            mask,
            buckets: SmallVec::new(),
            others: SmallVec::new(),
            blocks: SmallVec::new(),
        };
        locked.hold(inner, which, index);
        locked
    }

    fn hold(&mut self, inner: &'s Inner, which: Which, index: usize) {
        match which {
            Which::Buckets => self.buckets.push((index, inner.buckets.lock(index))),
            Which::Others => self.others.push((index, inner.others.lock(index))),
            Which::Blocks => self.blocks.push((index, inner.blocks.lock(index))),
        }
    }

    fn blocks(&mut self, hash: u64) -> &mut ShardMap<BlockEntry> {
        let index = shard_index(hash, self.mask);
        find(&mut self.blocks, index)
    }

    fn buckets(&mut self, hash: u64) -> &mut ShardMap<BucketEntry> {
        let index = shard_index(hash, self.mask);
        find(&mut self.buckets, index)
    }

    fn others(&mut self, hash: u64) -> &mut ShardMap<Timed> {
        let index = shard_index(hash, self.mask);
        find(&mut self.others, index)
    }
}

fn find<'a, 's, S>(
    guards: &'a mut [(usize, SpinlockGuard<'s, ShardMap<S>>)],
    index: usize,
) -> &'a mut ShardMap<S> {
    // Every cell's shard was locked in `Locked::lock`.
    let position = guards.iter().position(|(i, _)| *i == index).unwrap_or(0);
    &mut guards[position].1
}

/// Shard selection uses the hash's upper-middle bits: the map inside the shard uses the low bits for
/// the bucket and the top seven for its tags. `mask` is the shard count less one (a power of two).
#[inline]
fn shard_index(hash: u64, mask: usize) -> usize {
    ((hash >> 32) as usize) & mask
}

/// Keys are already hashes: the map uses them as they are.
#[derive(Default, Clone, Copy)]
struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used by `u64` keys; fold anything else so nothing is lost.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

struct Table<S> {
    shards: Box<[Shard<S>]>,
    /// The shard count (a power of two) less one, kept so that picking a shard is one `and`.
    mask: usize,
}

/// Cache-line aligned, so neighbouring shards' locks don't share a line.
///
/// The lock is a spinlock: it is held only for a few nanoseconds of arithmetic (and, rarely, for
/// a sweep of one shard), and its release is a plain store where a sleeping mutex's is a second
/// atomic read-modify-write (about 5 ns, a quarter of a decision). A waiter spins briefly, then
/// yields its thread, so a holder that was preempted gets the CPU back.
#[repr(align(128))]
struct Shard<S>(Spinlock<ShardMap<S>>);

struct ShardMap<S> {
    map: HashMap<u64, S, BuildHasherDefault<PreHashed>>,
    sweep_at: usize,
    max: usize,
    /// The store's refill spans, which a bucket entry's expiry reads.
    spans: Arc<Spans>,
}

impl<S: Expiring> Table<S> {
    fn new(shards: usize, max_per_shard: usize, spans: &Arc<Spans>) -> Self {
        let shards: Box<[Shard<S>]> = (0..shards)
            .map(|_| {
                Shard(Spinlock::new(ShardMap {
                    map: HashMap::default(),
                    sweep_at: MIN_SWEEP.min(max_per_shard),
                    max: max_per_shard,
                    spans: spans.clone(),
                }))
            })
            .collect();
        Table {
            mask: shards.len() - 1,
            shards,
        }
    }

    #[inline]
    fn lock(&self, index: usize) -> SpinlockGuard<'_, ShardMap<S>> {
        let lock = &self.shards[index].0;
        match lock.try_lock() {
            Some(guard) => guard,
            None => lock_contended(lock),
        }
    }

    #[inline]
    fn shard(&self, hash: u64) -> SpinlockGuard<'_, ShardMap<S>> {
        self.lock(shard_index(hash, self.mask))
    }

    fn len(&self) -> usize {
        (0..self.shards.len()).map(|i| self.lock(i).map.len()).sum()
    }
}

/// Waits for a shard held by another thread: watch the lock with plain loads (the line stays
/// shared instead of bouncing between cores), retry when it looks free, and after a short spin
/// yield the thread on each round.
#[cold]
fn lock_contended<T>(lock: &Spinlock<T>) -> SpinlockGuard<'_, T> {
    const SPINS: u32 = 100;
    let mut spins = 0;
    loop {
        while lock.is_locked() {
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if let Some(guard) = lock.try_lock() {
            return guard;
        }
    }
}

impl<S: Expiring> ShardMap<S> {
    /// Stores a state, making room first if the key is new.
    fn put(&mut self, hash: u64, state: S, now: Micros) {
        if let Some(slot) = self.map.get_mut(&hash) {
            *slot = state;
            return;
        }
        self.make_room(now);
        self.map.insert(hash, state);
    }

    /// Called before a new key goes in: drops idle keys when the shard has grown enough, and
    /// evicts the least-limited keys when it is at its bound.
    fn make_room(&mut self, now: Micros) {
        if self.map.len() < self.sweep_at {
            return;
        }
        let spans = &*self.spans;
        self.map.retain(|_, state| state.expires(spans) > now);
        if self.map.len() >= self.max {
            self.evict_least_limited();
        }
        if self.map.capacity() > 4 * self.map.len().max(MIN_SWEEP) {
            self.map.shrink_to(2 * self.map.len());
        }
        self.sweep_at = (2 * self.map.len()).clamp(MIN_SWEEP.min(self.max), self.max);
    }

    /// Forgets the eighth of the keys that become idle soonest.
    fn evict_least_limited(&mut self) {
        let count = (self.map.len() / 8).max(1);
        let spans = &*self.spans;
        let mut expiries: Vec<Micros> = self.map.values().map(|s| s.expires(spans)).collect();
        let (below, &mut cutoff, _) = expiries.select_nth_unstable(count - 1);
        let strictly_below = below.iter().filter(|&&e| e < cutoff).count();
        let mut at_cutoff = count - strictly_below;
        self.map.retain(|_, state| {
            let expires = state.expires(spans);
            if expires == PINNED {
                true
            } else if expires < cutoff {
                false
            } else if expires == cutoff && at_cutoff > 0 {
                at_cutoff -= 1;
                false
            } else {
                true
            }
        });
    }
}

#[cfg(test)]
mod tests;
