//! Limits kept in a transactional database: the crate's algorithms decide in Rust, the database
//! keeps each key's state in a row and makes the step atomic with a conditional write.
//!
//! [`TransactionalStore`] is the [`Store`](super::Store); a [`TransactionalBackend`] is the
//! database under it, three calls long: read rows with their versions, write rows if their
//! versions are unchanged, remove idle rows. `PostgresStore` (feature `postgres`) is this store on
//! a Postgres backend.
//!
//! - `rows`: a state, a block, an override as a row's bytes;
//! - `decide`: a batch decided over the rows read, with the algorithms' own functions;
//! - this file: the trait, the retry loop, the store.

mod decide;
mod rows;

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use self::decide::{Owned, Plan};
use self::rows::State;
use super::{
    BlockedKey, Charge, Cursor, Outcomes, OverrideEntry, Page, Store, StoreError, StoreErrorKind,
    StoreFuture,
};
use crate::algorithm::error::ConfigError;
use crate::algorithm::{duration, micros, Algorithm, Block, Limit, Micros, Mode, Penalty};
use crate::clock::{Clock, Latest};
use crate::key::KeyValue;

/// Which of a key's rows: its counter state, its block, its override.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum RowKind {
    /// The key's counter state under its rule's algorithm.
    Counter,
    /// The key's block under its rule's penalty.
    Block,
    /// The key's override of its rule's limit.
    Override,
}

impl RowKind {
    /// A small number for the kind, for a column: 0, 1, 2.
    pub fn code(self) -> i16 {
        match self {
            RowKind::Counter => 0,
            RowKind::Block => 1,
            RowKind::Override => 2,
        }
    }
}

/// The name of a row: its kind, its rule, and its key's bytes (a key longer than
/// [`MAX_KEY_LEN`](crate::key::MAX_KEY_LEN) is the digest that replaced it).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub struct RowKey {
    /// Which row of the key.
    pub kind: RowKind,
    /// The rule's name.
    pub rule: String,
    /// The key's bytes.
    pub key: Vec<u8>,
}

impl RowKey {
    /// The row of `kind` for `key` under `rule`.
    pub fn new(kind: RowKind, rule: &str, key: &[u8]) -> Self {
        RowKey {
            kind,
            rule: rule.to_owned(),
            key: decide::stored_key(key),
        }
    }
}

/// A row as read: its version, its bytes, and the moment it becomes idle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// Changes whenever the row is written; never 0 (0 names a row that does not exist).
    pub version: u64,
    /// The state, opaque to the backend.
    pub state: Vec<u8>,
    /// From this moment (µs since the Unix epoch) the row holds nothing a decision needs: it may
    /// be removed.
    pub expires_at: Micros,
}

/// What a [`read`](TransactionalBackend::read) found: the rows, in the order of the keys asked
/// (`None` where there is none), the backend's time, and what the backend hands its
/// [`write`](TransactionalBackend::write) (a transaction it holds open, or nothing).
#[derive(Debug)]
pub struct Snapshot<S> {
    /// One entry per key read.
    pub rows: Vec<Option<Row>>,
    /// The database's clock when the rows were read (µs since the Unix epoch), so that app
    /// hosts whose clocks disagree decide by one clock; `None` to use the store's own.
    pub now: Option<Micros>,
    /// Passed to the write that follows this read.
    pub step: S,
}

/// One row to write, if its version is still the one read.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Write {
    /// The row.
    pub key: RowKey,
    /// The version read: the write happens only if the row still has it (0: only if the row
    /// still does not exist).
    pub version: u64,
    /// The new bytes and expiry, or `None` to remove the row.
    pub row: Option<(Vec<u8>, Micros)>,
}

impl Write {
    fn put(key: RowKey, read: Option<&Row>, state: Vec<u8>, expires_at: Micros) -> Self {
        Write {
            key,
            version: read.map_or(0, |r| r.version),
            row: Some((state, expires_at)),
        }
    }

    fn delete(key: RowKey, read: Option<&Row>) -> Self {
        Write {
            key,
            version: read.map_or(0, |r| r.version),
            row: None,
        }
    }
}

/// A database under a [`TransactionalStore`]: rows of opaque bytes with a version each.
///
/// The store reads the rows of a request's keys, decides every rule in Rust, and asks the
/// backend to write the changed rows **only if none changed since the read**, all of them or
/// none; when another instance wrote first, the store reads again (a bounded number of times,
/// then it answers with an error and the failure policy decides). So a backend needs nothing
/// but a conditional write over several rows: a transaction (SQL), `TransactWriteItems` with a
/// condition per item (DynamoDB), a `WATCH`/`MULTI` (Redis-like stores).
///
/// A backend may also hold the rows' locks from the read to the write (`SELECT … FOR UPDATE`):
/// the [`Step`](TransactionalBackend::Step) is then the open transaction, and its write still
/// checks the versions (a row that did not exist could not be locked).
///
/// # A worked example: rows in a `HashMap`
/// ```
/// use std::collections::HashMap;
/// use std::sync::Mutex;
/// use tollgate::algorithm::state::Micros;
/// use tollgate::store::{Row, RowKey, Snapshot, StoreError, TransactionalBackend, Write};
///
/// #[derive(Debug, Default)]
/// struct Rows {
///     rows: Mutex<HashMap<RowKey, Row>>,
///     next_version: Mutex<u64>,
/// }
///
/// impl TransactionalBackend for Rows {
///     type Step = ();
///
///     async fn read(&self, keys: &[RowKey]) -> Result<Snapshot<()>, StoreError> {
///         let rows = self.rows.lock().unwrap();
///         let rows = keys.iter().map(|key| rows.get(key).cloned()).collect();
///         Ok(Snapshot { rows, now: None, step: () })
///     }
///
///     async fn write(&self, _: (), writes: &[Write]) -> Result<bool, StoreError> {
///         let mut rows = self.rows.lock().unwrap();
///         let unchanged = writes.iter().all(|w| {
///             rows.get(&w.key).map_or(0, |row| row.version) == w.version
///         });
///         if !unchanged {
///             return Ok(false); // another writer came first: the store reads again
///         }
///         let mut version = self.next_version.lock().unwrap();
///         for w in writes {
///             match &w.row {
///                 Some((state, expires_at)) => {
///                     *version += 1;
///                     let row = Row { version: *version, state: state.clone(), expires_at: *expires_at };
///                     rows.insert(w.key.clone(), row);
///                 }
///                 None => {
///                     rows.remove(&w.key);
///                 }
///             }
///         }
///         Ok(true)
///     }
///
///     async fn remove_idle(&self, now: Micros, limit: usize) -> Result<u64, StoreError> {
///         let mut rows = self.rows.lock().unwrap();
///         let idle: Vec<RowKey> = rows
///             .iter()
///             .filter(|(_, row)| row.expires_at < now)
///             .map(|(key, _)| key.clone())
///             .take(limit)
///             .collect();
///         for key in &idle {
///             rows.remove(key);
///         }
///         Ok(idle.len() as u64)
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use tollgate::{Limit, Limiter, Rule};
/// use tollgate::store::TransactionalStore;
///
/// let store = TransactionalStore::new(Rows::default());
/// let limiter = Limiter::builder()
///     .rule(Rule::new("per-user", Limit::per_minute(2)))
///     .store(store)
///     .build()
///     .unwrap();
/// assert!(limiter.charge("per-user", "alice", 1).await.unwrap().is_allowed());
/// assert!(limiter.charge("per-user", "alice", 1).await.unwrap().is_allowed());
/// assert!(!limiter.charge("per-user", "alice", 1).await.unwrap().is_allowed());
/// # });
/// ```
pub trait TransactionalBackend: Send + Sync + fmt::Debug + 'static {
    /// What a read hands to the write after it: `()` for a backend that checks versions only,
    /// an open transaction for one that holds the rows' locks in between. Dropping it without
    /// a write must release whatever it holds.
    type Step: Send + 'static;

    /// The rows of `keys`, in their order, with their versions.
    fn read(
        &self,
        keys: &[RowKey],
    ) -> impl Future<Output = Result<Snapshot<Self::Step>, StoreError>> + Send;

    /// Writes every row of `writes` if each still has the version read, atomically: all or
    /// none. `Ok(true)` when written, `Ok(false)` when a row had changed (nothing written).
    /// A new row version must differ from every version the row had recently (a counter, a
    /// random number), so that a row removed and written again is never taken for the one
    /// read. `writes` may be empty: the step ends with nothing to write.
    fn write(
        &self,
        step: Self::Step,
        writes: &[Write],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Removes up to `limit` rows whose [`expires_at`](Row::expires_at) is before `now`, without
    /// looking at the others (an index on the expiry); how many were removed.
    fn remove_idle(
        &self,
        now: Micros,
        limit: usize,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Up to `limit` rows of `kind` under `rule` whose keys sort after `after` (from the first
    /// when `None`), in key order, for listing blocks and overrides. The default answers that
    /// the backend cannot list.
    fn list(
        &self,
        kind: RowKind,
        rule: &str,
        after: Option<&[u8]>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(Vec<u8>, Row)>, StoreError>> + Send {
        let _ = (kind, rule, after, limit);
        async {
            Err(StoreError::new(
                StoreErrorKind::Config,
                "this backend cannot list its rows",
            ))
        }
    }
}

/// A [`Store`] over a [`TransactionalBackend`]: every decision the memory store's, made in Rust
/// over the rows read, and written back conditionally.
///
/// # What it keeps
/// Every algorithm but concurrency limits, with reservations, refunds, settlements (debt),
/// limits chosen per request, penalties (blocks) and per-key overrides. A
/// [concurrency limit](crate::Limit::concurrent) needs a slot given back when a response ends,
/// and a lease that expires when an instance dies: the memory and Redis stores keep those;
/// building a limiter with such a rule on this store is an error naming the rule. Quota leases
/// ([`Rule::lease`](crate::Rule::lease)) are ignored: every decision is exact.
///
/// # How a request is decided
/// One read of every row the request needs (the counters, and the blocks and overrides of the
/// rules that have them), the batch decided at the backend's time, then one conditional write
/// of the rows that changed. A denial or a check writes nothing. When another writer changed a
/// row in between, the step starts again after a short random wait (doubling with each loss), at
/// most [`retries`](Self::retries) more times (default 8); then the request gets an error of kind
/// `Contention`, answered by the failure policy.
///
/// # Idle rows
/// Every row carries the moment it becomes idle (a full bucket, a past window, a forgiven
/// offence, an ended override). Every 1024th write, the store asks the backend to remove up to
/// 1000 idle rows in the background; [`remove_idle`](Self::remove_idle) does it on demand.
pub struct TransactionalStore<B> {
    shared: Arc<Shared<B>>,
}

struct Shared<B> {
    backend: B,
    clock: Option<Arc<dyn Clock>>,
    latest: Latest,
    retries: u32,
    timeout: Duration,
    counts: Counts,
    sweeping: AtomicBool,
}

#[derive(Default)]
struct Counts {
    steps: AtomicU64,
    attempts: AtomicU64,
    conflicts: AtomicU64,
    writes: AtomicU64,
}

/// How a [`TransactionalStore`]'s steps went, counted since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransactionCounts {
    /// Steps finished (decisions, refunds, resets, blocks, overrides), answered or failed.
    pub steps: u64,
    /// Reads made: one per step, one more per conflict.
    pub attempts: u64,
    /// Conditional writes refused because a row had changed.
    pub conflicts: u64,
}

impl<B> Clone for TransactionalStore<B> {
    fn clone(&self) -> Self {
        TransactionalStore {
            shared: self.shared.clone(),
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for TransactionalStore<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionalStore")
            .field("backend", &self.shared.backend)
            .field("retries", &self.shared.retries)
            .field("timeout", &self.shared.timeout)
            .finish_non_exhaustive()
    }
}

/// Writes between two background sweeps of idle rows.
const SWEEP_EVERY: u64 = 1024;
/// Rows one sweep removes at most.
const SWEEP_ROWS: usize = 1000;
/// How many rows a page of a listing reads.
const PAGE_ROWS: usize = 100;

impl<B: TransactionalBackend> TransactionalStore<B> {
    /// A store over `backend`, on the backend's clock (or the system's when the backend has
    /// none), retrying a conflict up to 8 times, each step bounded by one second.
    pub fn new(backend: B) -> Self {
        TransactionalStore {
            shared: Arc::new(Shared {
                backend,
                clock: None,
                latest: Latest::default(),
                retries: 8,
                timeout: Duration::from_secs(1),
                counts: Counts::default(),
                sweeping: AtomicBool::new(false),
            }),
        }
    }

    fn edit(self, change: impl FnOnce(&mut Shared<B>)) -> Self {
        match Arc::try_unwrap(self.shared) {
            Ok(mut shared) => {
                change(&mut shared);
                TransactionalStore {
                    shared: Arc::new(shared),
                }
            }
            // A store already cloned keeps its settings: they are set before it is shared.
            Err(shared) => TransactionalStore { shared },
        }
    }

    /// Reads time from `clock` instead of the backend (tests drive a
    /// [`ManualClock`](crate::clock::ManualClock) this way). Set before the store is cloned.
    pub fn clock(self, clock: impl Clock) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(clock);
        self.edit(|shared| shared.clock = Some(clock))
    }

    /// How many times a step whose write met a concurrent change starts again (default 8)
    /// before the request is answered by the failure policy. Set before the store is cloned.
    pub fn retries(self, retries: u32) -> Self {
        self.edit(|shared| shared.retries = retries)
    }

    /// The longest a step may take, retries included (default one second); past it the request
    /// gets an error of kind `Timeout`. Set before the store is cloned.
    pub fn timeout(self, timeout: Duration) -> Self {
        self.edit(|shared| shared.timeout = timeout.max(Duration::from_millis(1)))
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.shared.backend
    }

    /// How the steps went so far: reads per step and conflicts tell how contended the keys are.
    pub fn counts(&self) -> TransactionCounts {
        let counts = &self.shared.counts;
        TransactionCounts {
            steps: counts.steps.load(Ordering::Relaxed),
            attempts: counts.attempts.load(Ordering::Relaxed),
            conflicts: counts.conflicts.load(Ordering::Relaxed),
        }
    }

    /// Removes up to `limit` idle rows now (the store also does it by itself as it writes);
    /// how many were removed.
    pub async fn remove_idle(&self, limit: usize) -> Result<u64, StoreError> {
        let now = self.shared.now(None);
        self.shared.backend.remove_idle(now, limit).await
    }
}

impl<B: TransactionalBackend> Shared<B> {
    /// The time to decide at: the store's clock if it has one, else the backend's, else the
    /// system's; never earlier than a time this store decided at before.
    fn now(&self, backend: Option<Micros>) -> Micros {
        let now = match (&self.clock, backend) {
            (Some(clock), _) => clock.now(),
            (None, Some(now)) => now,
            (None, None) => system_now(),
        };
        self.latest.at_least(now)
    }

    /// One step: read `keys`, decide, write if unchanged; again on a conflict.
    async fn step<T>(
        self: &Arc<Self>,
        keys: &[RowKey],
        mut decide: impl FnMut(&[Option<Row>], Micros) -> Result<(T, Vec<Write>), StoreError>,
    ) -> Result<T, StoreError> {
        let run = async {
            let mut conflicts = 0;
            loop {
                self.counts.attempts.fetch_add(1, Ordering::Relaxed);
                let read = self.backend.read(keys).await?;
                let now = self.now(read.now);
                let (answer, writes) = match decide(&read.rows, now) {
                    Ok(decided) => decided,
                    Err(error) => {
                        // Whatever the step holds is released before the error goes up.
                        let _ = self.backend.write(read.step, &[]).await;
                        return Err(error);
                    }
                };
                let wrote = !writes.is_empty();
                if self.backend.write(read.step, &writes).await? {
                    if wrote {
                        self.wrote(now);
                    }
                    return Ok(answer);
                }
                self.counts.conflicts.fetch_add(1, Ordering::Relaxed);
                conflicts += 1;
                if conflicts > self.retries {
                    return Err(StoreError::new(
                        StoreErrorKind::Contention,
                        format!("rows changed by others {conflicts} times in a row"),
                    ));
                }
                // Steps that lost the same race do not all read again at once: each waits a
                // random time, up to 100 µs doubled with every loss (at most 25.6 ms).
                let most = 100u64 << conflicts.min(8);
                tokio::time::sleep(Duration::from_micros(fastrand::u64(0..most))).await;
            }
        };
        let result = match tokio::time::timeout(self.timeout, run).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!("no answer within {:?}", self.timeout),
            )),
        };
        self.counts.steps.fetch_add(1, Ordering::Relaxed);
        result
    }

    /// Counts a write, and every [`SWEEP_EVERY`]th starts a sweep of idle rows in the background
    /// (when a tokio runtime runs this, and no sweep is under way).
    fn wrote(self: &Arc<Self>, now: Micros) {
        let writes = self.counts.writes.fetch_add(1, Ordering::Relaxed) + 1;
        if writes % SWEEP_EVERY != 0 {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.sweeping.swap(true, Ordering::Acquire) {
            return;
        }
        let shared = self.clone();
        runtime.spawn(async move {
            let swept = shared.backend.remove_idle(now, SWEEP_ROWS);
            if let Err(error) = tokio::time::timeout(shared.timeout, swept)
                .await
                .unwrap_or_else(|_| {
                    Err(StoreError::new(
                        StoreErrorKind::Timeout,
                        "removing idle rows took too long",
                    ))
                })
            {
                tracing::debug!(%error, "idle rows not removed");
            }
            shared.sweeping.store(false, Ordering::Release);
        });
    }
}

fn own(charge: &Charge<'_>) -> Owned {
    Owned {
        rule: charge.rule.as_str().to_owned(),
        key: charge.key.to_vec(),
        algorithm: charge.algorithm.clone(),
        cost: charge.cost,
        mode: charge.mode,
        penalty: charge.penalty.cloned(),
        overridable: charge.read_overrides,
    }
}

impl<B: TransactionalBackend> Store for TransactionalStore<B> {
    fn apply(&self, batch: &[Charge<'_>]) -> StoreFuture<Outcomes> {
        if batch.iter().any(|c| c.algorithm.is_concurrency()) {
            return StoreFuture::ready(Err(decide::no_concurrency()));
        }
        let charges: Vec<Owned> = batch.iter().map(own).collect();
        let shared = self.shared.clone();
        StoreFuture::pending(async move {
            let plan = Plan::new(&charges);
            let decided = shared
                .step(&plan.keys, |rows, now| {
                    let decided = decide::batch(&charges, &plan, rows, now)?;
                    let writes = decided.writes.clone();
                    Ok((decided, writes))
                })
                .await?;
            Ok(decided.outcomes)
        })
    }

    fn refund(&self, charge: &Charge<'_>) -> StoreFuture<()> {
        if charge.algorithm.is_concurrency() {
            return StoreFuture::ready(Err(decide::no_concurrency()));
        }
        let charge = own(charge);
        let shared = self.shared.clone();
        StoreFuture::pending(async move {
            let key = RowKey::new(RowKind::Counter, &charge.rule, &charge.key);
            let keys = [key.clone()];
            shared
                .step(&keys, |rows, now| {
                    let row = rows[0].as_ref();
                    let stored = row.map(|row| State::decode(&row.state)).transpose()?;
                    let algorithm = &charge.algorithm;
                    // As the memory store: a bucket nobody charged has nothing to give back;
                    // the other algorithms start from a fresh state.
                    let mut state = match (stored, algorithm) {
                        (Some(state), _) if state.fits(algorithm) => state,
                        (_, Algorithm::TokenBucket(_)) => return Ok(((), Vec::new())),
                        _ => decide::fresh(&charge, algorithm, now)?,
                    };
                    decide::refund(algorithm, &mut state, now, charge.cost);
                    let expires = decide::expires_at(algorithm, &state);
                    let write = Write::put(key.clone(), row, state.encode(), expires);
                    Ok(((), vec![write]))
                })
                .await
        })
    }

    fn reset(&self, rule: &str, _algorithm: &Algorithm, key: &[u8]) -> StoreFuture<()> {
        let keys = [
            RowKey::new(RowKind::Counter, rule, key),
            RowKey::new(RowKind::Block, rule, key),
        ];
        let shared = self.shared.clone();
        StoreFuture::pending(async move {
            shared
                .step(&keys, |rows, _| {
                    let writes = keys
                        .iter()
                        .zip(rows)
                        .filter_map(|(key, row)| {
                            row.as_ref()
                                .map(|row| Write::delete(key.clone(), Some(row)))
                        })
                        .collect();
                    Ok(((), writes))
                })
                .await
        })
    }

    fn set_block(
        &self,
        rule: &str,
        penalty: &Penalty,
        key: &[u8],
        block: Option<Duration>,
    ) -> StoreFuture<()> {
        let row_key = RowKey::new(RowKind::Block, rule, key);
        let penalty = penalty.clone();
        let shared = self.shared.clone();
        StoreFuture::pending(async move {
            let keys = [row_key.clone()];
            shared
                .step(&keys, |rows, now| {
                    let row = rows[0].as_ref();
                    let write = match block {
                        None if row.is_none() => return Ok(((), Vec::new())),
                        None => Write::delete(row_key.clone(), row),
                        Some(d) => {
                            let offences = match row {
                                Some(row) => rows::decode_block(&row.state)?.offences,
                                None => 0,
                            };
                            let block = Block {
                                until: now.saturating_add(micros(d)),
                                offences,
                            };
                            let expires = penalty.forgotten_at(&block);
                            Write::put(row_key.clone(), row, rows::encode_block(&block), expires)
                        }
                    };
                    Ok(((), vec![write]))
                })
                .await
        })
    }

    fn blocks(&self, rule: &str, cursor: Option<&Cursor>) -> StoreFuture<Page<BlockedKey>> {
        let rule = rule.to_owned();
        let after = match cursor.map(|c| c.key_after('k')) {
            Some(Some(after)) => Some(after),
            Some(None) => return StoreFuture::ready(Err(bad_cursor())),
            None => None,
        };
        let shared = self.shared.clone();
        StoreFuture::pending(async move {
            let found = shared
                .list(RowKind::Block, &rule, after.as_deref(), PAGE_ROWS)
                .await?;
            let now = shared.now(None);
            let next = next_cursor(&found, PAGE_ROWS);
            let mut items = Vec::new();
            for (key, row) in found {
                let block = rows::decode_block(&row.state)?;
                if block.until > now {
                    let remaining = duration(block.until - now);
                    items.push(BlockedKey::new(key, remaining, block.offences));
                }
            }
            Ok(Page::new(items, next))
        })
    }

    fn block_of(&self, rule: &str, key: &[u8]) -> StoreFuture<Option<BlockedKey>> {
        let keys = [RowKey::new(RowKind::Block, rule, key)];
        let shared = self.shared.clone();
        StoreFuture::pending(async move {
            shared
                .step(&keys, |rows, now| {
                    let blocked = match &rows[0] {
                        Some(row) => {
                            let block = rows::decode_block(&row.state)?;
                            (block.until > now).then(|| {
                                let remaining = duration(block.until - now);
                                BlockedKey::new(keys[0].key.clone(), remaining, block.offences)
                            })
                        }
                        None => None,
                    };
                    Ok((blocked, Vec::new()))
                })
                .await
        })
    }

    fn set_override(
        &self,
        rule: &str,
        key: &[u8],
        limit: Option<(&Limit, Duration)>,
    ) -> StoreFuture<()> {
        let row_key = RowKey::new(RowKind::Override, rule, key);
        let limit = limit.map(|(limit, ttl)| (limit.clone(), ttl));
        let shared = self.shared.clone();
        StoreFuture::pending(async move {
            let keys = [row_key.clone()];
            shared
                .step(&keys, |rows, now| {
                    let row = rows[0].as_ref();
                    let write = match &limit {
                        None if row.is_none() => return Ok(((), Vec::new())),
                        None => Write::delete(row_key.clone(), row),
                        Some((limit, ttl)) => {
                            let until = now.saturating_add(micros(*ttl));
                            let state = rows::encode_override(limit, until);
                            Write::put(row_key.clone(), row, state, until)
                        }
                    };
                    Ok(((), vec![write]))
                })
                .await
        })
    }

    fn override_of(&self, rule: &str, key: &[u8]) -> StoreFuture<Option<OverrideEntry>> {
        let keys = [RowKey::new(RowKind::Override, rule, key)];
        let shared = self.shared.clone();
        StoreFuture::pending(async move {
            shared
                .step(&keys, |rows, now| {
                    let entry = match &rows[0] {
                        Some(row) => {
                            let (until, limit) = rows::decode_override(&row.state)?;
                            (until > now).then(|| OverrideEntry {
                                key: KeyValue::new(&keys[0].key),
                                limit,
                                expires_in: duration(until - now),
                            })
                        }
                        None => None,
                    };
                    Ok((entry, Vec::new()))
                })
                .await
        })
    }

    fn overrides(
        &self,
        rule: &str,
        cursor: Option<&Cursor>,
        count: usize,
    ) -> StoreFuture<Page<OverrideEntry>> {
        let rule = rule.to_owned();
        let after = match cursor.map(|c| c.key_after('k')) {
            Some(Some(after)) => Some(after),
            Some(None) => return StoreFuture::ready(Err(bad_cursor())),
            None => None,
        };
        let count = count.clamp(1, super::MAX_OVERRIDE_PAGE);
        let shared = self.shared.clone();
        StoreFuture::pending(async move {
            let found = shared
                .list(RowKind::Override, &rule, after.as_deref(), count)
                .await?;
            let now = shared.now(None);
            let next = next_cursor(&found, count);
            let mut items = Vec::new();
            for (key, row) in found {
                let (until, limit) = rows::decode_override(&row.state)?;
                if until > now {
                    items.push(OverrideEntry {
                        key: KeyValue::new(&key),
                        limit,
                        expires_in: duration(until - now),
                    });
                }
            }
            Ok(Page::new(items, next))
        })
    }

    fn validate_overrides(&self, _rule: &str) -> Result<(), ConfigError> {
        Ok(())
    }

    fn validate(&self, rule: &str, algorithm: &Algorithm) -> Result<(), ConfigError> {
        if algorithm.is_concurrency() {
            return Err(ConfigError::new(
                rule,
                "limit",
                "a concurrency limit is kept by the memory and Redis stores only, not in a database",
            ));
        }
        Ok(())
    }

    /// One unit charged on a rule of the store's own (`tollgate:probe`), through the same read
    /// and write as a request: a database that answers reads but refuses writes (read-only,
    /// out of disk) keeps the circuit breaker open.
    fn probe(&self) -> StoreFuture<()> {
        let algorithm = Algorithm::TokenBucket(crate::algorithm::TokenBucket::new(
            1_000_000,
            Duration::from_secs(1),
        ));
        let charge = Charge {
            rule: super::RuleName::new("tollgate:probe"),
            algorithm: &algorithm,
            key: b"",
            cost: 1,
            mode: Mode::Charge,
            penalty: None,
            lease: None,
            read_overrides: false,
        };
        let answer = self.apply(std::slice::from_ref(&charge));
        StoreFuture::pending(async move { answer.await.map(drop) })
    }
}

impl<B: TransactionalBackend> Shared<B> {
    /// A listing's rows, within the store's timeout.
    async fn list(
        &self,
        kind: RowKind,
        rule: &str,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Row)>, StoreError> {
        let listed = self.backend.list(kind, rule, after, limit);
        tokio::time::timeout(self.timeout, listed)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::new(
                    StoreErrorKind::Timeout,
                    "listing timed out",
                ))
            })
    }
}

/// The cursor after a page of rows: the last key, when the page was full.
fn next_cursor(found: &[(Vec<u8>, Row)], asked: usize) -> Option<Cursor> {
    if found.len() < asked {
        return None;
    }
    let (last, _) = found.last()?;
    Some(Cursor::after_key('k', last))
}

fn bad_cursor() -> StoreError {
    StoreError::new(
        StoreErrorKind::BadCursor,
        "not a cursor of this store's listings",
    )
}

/// The system's time, for a backend without a clock of its own (a store on one host).
fn system_now() -> Micros {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, micros)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::TokenBucket;
    use std::sync::Mutex;

    /// Rows in a map; `lose` writes are refused as if another writer had come first.
    #[derive(Debug, Default)]
    struct Rows {
        rows: Mutex<std::collections::HashMap<RowKey, Row>>,
        lose: AtomicU64,
    }

    impl TransactionalBackend for Rows {
        type Step = ();

        async fn read(&self, keys: &[RowKey]) -> Result<Snapshot<()>, StoreError> {
            let rows = self.rows.lock().unwrap();
            Ok(Snapshot {
                rows: keys.iter().map(|k| rows.get(k).cloned()).collect(),
                now: Some(1_000_000_000),
                step: (),
            })
        }

        async fn write(&self, _: (), writes: &[Write]) -> Result<bool, StoreError> {
            if !writes.is_empty() && self.lose.load(Ordering::Relaxed) > 0 {
                self.lose.fetch_sub(1, Ordering::Relaxed);
                return Ok(false);
            }
            let mut rows = self.rows.lock().unwrap();
            for w in writes {
                match &w.row {
                    Some((state, expires_at)) => {
                        let version = rows.get(&w.key).map_or(1, |r| r.version + 1);
                        let row = Row {
                            version,
                            state: state.clone(),
                            expires_at: *expires_at,
                        };
                        rows.insert(w.key.clone(), row);
                    }
                    None => drop(rows.remove(&w.key)),
                }
            }
            Ok(true)
        }

        async fn remove_idle(&self, _: Micros, _: usize) -> Result<u64, StoreError> {
            Ok(0)
        }
    }

    fn charge(algorithm: &Algorithm) -> Charge<'_> {
        Charge {
            rule: super::super::RuleName::new("r"),
            algorithm,
            key: b"k",
            cost: 1,
            mode: Mode::Charge,
            penalty: None,
            lease: None,
            read_overrides: false,
        }
    }

    #[tokio::test]
    async fn a_lost_race_is_retried_and_too_many_are_an_error() {
        let bucket = Algorithm::TokenBucket(TokenBucket::new(3, Duration::from_secs(60)));
        let store = TransactionalStore::new(Rows::default()).retries(2);
        store.backend().lose.store(2, Ordering::Relaxed);
        let outcome = store.apply_one(&charge(&bucket)).await.unwrap();
        assert_eq!(outcome.remaining, 2);
        let counts = store.counts();
        assert_eq!((counts.steps, counts.attempts, counts.conflicts), (1, 3, 2));
        store.backend().lose.store(3, Ordering::Relaxed);
        let error = store.apply_one(&charge(&bucket)).await.unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::Contention);
        // Nothing was charged by the step that gave up.
        let outcome = store.apply_one(&charge(&bucket)).await.unwrap();
        assert_eq!(outcome.remaining, 1);
    }

    #[tokio::test]
    async fn concurrency_limits_are_refused() {
        let slots = Algorithm::Concurrency(crate::algorithm::Concurrency::new(2));
        let store = TransactionalStore::new(Rows::default());
        assert!(store.validate("exports", &slots).is_err());
        let error = store.apply_one(&charge(&slots)).await.unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::Config);
    }

    #[test]
    fn cursors_read_back() {
        let row = Row {
            version: 1,
            state: Vec::new(),
            expires_at: 0,
        };
        let found = vec![(vec![0, 0xab, 0xff], row)];
        let cursor = next_cursor(&found, 1).unwrap();
        assert_eq!(cursor.key_after('k').unwrap(), [0, 0xab, 0xff]);
        assert!(next_cursor(&found, 2).is_none());
        for bad in ["", "k0", "kzz", "o00"] {
            assert!(Cursor::new(bad).key_after('k').is_none(), "{bad}");
        }
    }
}
