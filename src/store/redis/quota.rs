//! Quota leases (a rule's [`Lease`]): this instance takes a slice of a key's quota from Redis in
//! one charge and admits the key's next charges from it locally, until the slice is spent or the
//! lease ends.
//!
//! The units a key holds are the permits of a semaphore, handed out first come, first served:
//! - **Units held, nobody queued**: a charge takes its cost at once and is admitted here,
//!   nothing sent. Its outcome is Redis's answer to the lease's charge, with the units still held
//!   counted as remaining and the times moved on since (an estimate: other instances' charges
//!   since are not seen).
//! - **Not enough held**: the charge queues for its cost, and one charge at a time asks Redis for
//!   the key's next lease: `units`, or what the charges queued need when more (they take it at
//!   once). Charges arriving meanwhile queue behind, so on a hot key one call serves every charge
//!   that came during the last one. If charges are still queued when a lease comes in, the next
//!   one is asked for at once.
//! - **Redis cannot grant the lease** (the limit is near): the queued charges are each decided
//!   exactly (a call each, only near the limit).
//! - **A call fails**: the charges queued for it fail with it, at once.
//!
//! A lease that ended gives its unused units back to Redis: a token bucket's at any time, a fixed
//! window's while its window lasts, a sliding window's never (a unit given back later would count
//! in another window). A fixed window's lease ends with its window (Redis's `next_unit_in` at the
//! grant), so a window is never over-admitted. Only charges of one key lease; a batch of several
//! rules, checks and reservations are decided exactly. Bounded like the deny cache: a full table
//! leases nothing new (the charge is exact) until leases end.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Semaphore;

use super::record::{Item, Op, Record, Taken};
use super::{Inner, RedisStore};
use crate::algorithm::{duration, micros, Algorithm, Lease, Micros, Mode, Outcome, Verdict};
use crate::store::{Charge, Outcomes, RuleName, StoreError, StoreErrorKind, StoreFuture};

const SHARDS: usize = 16;

/// The most units one lease hands out as permits (tokio's semaphore holds fewer than `usize`).
const MOST_PERMITS: u64 = 1 << 28;

/// The leases this instance holds, by `(rule, key)`.
pub(super) struct Quotas {
    hasher: foldhash::fast::RandomState,
    shards: Box<[Mutex<HashMap<u64, Held>>]>,
    per_shard: usize,
}

/// One key's lease: its units as permits, the charges queued for more, and what Redis said when
/// the last slice was granted.
struct Held {
    queue: Arc<Queue>,
    /// A charge of this instance is asking Redis for the next slice.
    asking: bool,
    /// The lease ends then (local clock); 0 before the first slice.
    until: Micros,
    /// Its units may go back to Redis until then (local clock).
    returnable_until: Micros,
    /// The limit it was granted under: a charge under another (a limit chosen per request) asks
    /// anew.
    limit_id: u64,
    /// The key's record, to give units back.
    record: Arc<Record>,
}

/// The units of one lease and the charges queued for them.
struct Queue {
    permits: Semaphore,
    /// The costs of the charges queued and not yet served (the one asking included, until it is
    /// served).
    queued: AtomicU64,
    /// The last call for this lease failed: those queued fail too.
    failed: AtomicBool,
    /// Redis's answer to the last slice, and when it came.
    granted: Mutex<Option<(Outcome, Micros)>>,
}

impl Queue {
    /// The outcome of a charge admitted from these units at `now`.
    fn outcome(&self, now: Micros) -> Option<Outcome> {
        let (granted, at) = self
            .granted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()?;
        let held = self.permits.available_permits() as u64;
        Some(with_held(granted, held, duration(now.saturating_sub(at))))
    }
}

impl Held {
    fn live(&self, limit_id: u64, now: Micros) -> bool {
        self.limit_id == limit_id && (self.asking || now < self.until)
    }
}

/// Redis's `outcome`, `held` more units available to this instance, `since` later.
fn with_held(outcome: Outcome, held: u64, since: std::time::Duration) -> Outcome {
    Outcome {
        verdict: Verdict::Allowed,
        remaining: outcome.remaining.saturating_add(held).min(outcome.limit),
        balance: outcome
            .balance
            .saturating_add(i64::try_from(held).unwrap_or(i64::MAX)),
        next_unit_in: outcome.next_unit_in.saturating_sub(since),
        full_in: outcome.full_in.saturating_sub(since),
        ..outcome
    }
}

/// What a charge does after looking in the table.
enum Lookup {
    /// Admitted from the units held.
    Admitted(Outcome),
    /// Queued for its cost; `ask` when this charge is the one to ask Redis for the next slice.
    Queued { queue: Arc<Queue>, ask: bool },
    /// No lease for this charge (the table is full): decided exactly.
    Exact,
}

impl Quotas {
    pub(super) fn new(capacity: usize) -> Self {
        Quotas {
            hasher: foldhash::fast::RandomState::default(),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
        }
    }

    fn hash(&self, rule: RuleName<'_>, key: &[u8]) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write_u64(rule.digest());
        h.write(key);
        h.finish()
    }

    fn shard(&self, hash: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Held>> {
        self.shards[(hash as usize) % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits `cost` from the units held, or queues the charge for them (and says whether it is
    /// the one to ask Redis). An ended lease is taken out, its unused units to give back.
    fn take(
        &self,
        hash: u64,
        limit_id: u64,
        cost: u64,
        now: Micros,
        record: impl FnOnce() -> Record,
    ) -> (Lookup, Option<(Arc<Record>, u64)>) {
        let mut shard = self.shard(hash);
        let mut give_back = None;
        if let Some(held) = shard.get_mut(&hash) {
            if held.live(limit_id, now) {
                let queue = held.queue.clone();
                let permits = u32::try_from(cost).unwrap_or(u32::MAX);
                if let Ok(taken) = queue.permits.try_acquire_many(permits) {
                    taken.forget();
                    if let Some(outcome) = queue.outcome(now) {
                        return (Lookup::Admitted(outcome), None);
                    }
                }
                queue.queued.fetch_add(cost, Ordering::Relaxed);
                let ask = !std::mem::replace(&mut held.asking, true);
                return (Lookup::Queued { queue, ask }, None);
            }
            let held = shard.remove(&hash).expect("found above");
            // Wakes any charge still queued on it: it looks again.
            held.queue.permits.close();
            let unused = held.queue.permits.available_permits() as u64;
            if unused > 0 && now < held.returnable_until {
                give_back = Some((held.record, unused));
            }
        }
        if shard.len() >= self.per_shard {
            // Ended leases make room; their units are not given back (under-admission only).
            shard.retain(|_, held| held.asking || now < held.until);
            if shard.len() >= self.per_shard {
                return (Lookup::Exact, give_back);
            }
        }
        let queue = Arc::new(Queue {
            permits: Semaphore::new(0),
            queued: AtomicU64::new(cost),
            failed: AtomicBool::new(false),
            granted: Mutex::new(None),
        });
        let held = Held {
            queue: queue.clone(),
            asking: true,
            until: 0,
            returnable_until: 0,
            limit_id,
            record: Arc::new(record()),
        };
        shard.insert(hash, held);
        (Lookup::Queued { queue, ask: true }, give_back)
    }

    /// Records a slice Redis granted: `units` handed to the charges queued (first come, first
    /// served; what is left stays held), Redis's answer `granted`. Whether charges are still
    /// queued beyond it: then the lease stays "asking", and the caller asks again.
    fn granted(
        &self,
        hash: u64,
        queue: &Arc<Queue>,
        units: u64,
        granted: Outcome,
        ends: (Micros, Micros),
        now: Micros,
    ) -> bool {
        *queue.granted.lock().unwrap_or_else(PoisonError::into_inner) = Some((granted, now));
        let mut shard = self.shard(hash);
        // The units go to the charges queued, first come first served: their demand is met now
        // (counted here, not when each wakes, so the next slice is not asked for them again).
        let queued = queue.queued.load(Ordering::Relaxed);
        queue.queued.fetch_sub(queued.min(units), Ordering::Relaxed);
        queue
            .permits
            .add_permits(usize::try_from(units).unwrap_or(usize::MAX));
        let Some(held) = shard
            .get_mut(&hash)
            .filter(|h| Arc::ptr_eq(&h.queue, queue))
        else {
            // The lease was ended meanwhile: the units go to the charges queued, if any.
            return false;
        };
        (held.until, held.returnable_until) = ends;
        held.asking = queued > units;
        held.asking
    }

    /// The call for `queue`'s next slice failed or was refused: the lease ends, and the charges
    /// queued look again (`failed`: they fail).
    fn end(&self, hash: u64, queue: &Arc<Queue>, failed: bool) {
        queue.failed.store(failed, Ordering::Relaxed);
        let mut shard = self.shard(hash);
        if shard
            .get(&hash)
            .is_some_and(|held| Arc::ptr_eq(&held.queue, queue))
        {
            shard.remove(&hash);
        }
        queue.permits.close();
    }
}

/// The parts of a charge a lease's future keeps (the charge itself is borrowed).
#[derive(Clone)]
struct Owned {
    rule: Box<str>,
    digest: u64,
    key: Box<[u8]>,
    algorithm: Algorithm,
    cost: u64,
}

impl Owned {
    /// The charge of `cost` units, exactly (no lease).
    fn charge(&self, cost: u64) -> Charge<'_> {
        Charge {
            rule: RuleName::known(&self.rule, self.digest),
            algorithm: &self.algorithm,
            key: &self.key,
            cost,
            mode: Mode::Charge,
            penalty: None,
            lease: None,
            read_overrides: false,
        }
    }
}

/// Decides a single charge of a rule with a lease (see the module's documentation).
pub(super) fn charge<T>(
    store: &RedisStore,
    lease: &Lease,
    charge: &Charge<'_>,
    finish: impl FnOnce(Outcomes) -> Result<T, StoreError> + Send + 'static,
) -> StoreFuture<T> {
    let inner = &store.inner;
    let hash = inner.quotas.hash(charge.rule, charge.key);
    let limit_id = inner.quotas.hasher.hash_one(charge.algorithm);
    let now = inner.local.now();
    let record = || inner.record(charge, true);
    let (first, give_back) = inner.quotas.take(hash, limit_id, charge.cost, now, record);
    if let (Lookup::Admitted(outcome), None) = (&first, &give_back) {
        return StoreFuture::ready(finish(Outcomes::from(outcome.clone())));
    }
    let owned = Owned {
        rule: charge.rule.as_str().into(),
        digest: charge.rule.digest(),
        key: charge.key.into(),
        algorithm: charge.algorithm.clone(),
        cost: charge.cost,
    };
    let (store, lease) = (store.clone(), *lease);
    StoreFuture::pending(async move {
        let outcome = decide(&store, owned, lease, first, give_back, hash, limit_id).await?;
        finish(Outcomes::from(outcome))
    })
}

/// The part of [`charge`] that waits: giving an ended lease back, asking for a slice or queuing
/// for one.
async fn decide(
    store: &RedisStore,
    owned: Owned,
    lease: Lease,
    first: Lookup,
    give_back: Option<(Arc<Record>, u64)>,
    hash: u64,
    limit_id: u64,
) -> Result<Outcome, StoreError> {
    let inner = &store.inner;
    let injected = inner.injected_now()?;
    if let Some((record, units)) = give_back {
        give_back_units(inner, injected, &record, units).await?;
    }
    let exactly = || async {
        let charge = owned.charge(owned.cost);
        store
            .decide_exactly(std::slice::from_ref(&charge), Outcomes::into_first)
            .await
    };
    let mut next = first;
    loop {
        let (queue, ask) = match next {
            Lookup::Admitted(outcome) => return Ok(outcome),
            Lookup::Exact => return exactly().await,
            Lookup::Queued { queue, ask } => (queue, ask),
        };
        if ask {
            match ask_for_slice(store, &owned, &lease, &queue, hash, owned.cost).await {
                Ok(Some((outcome, more))) => {
                    if more {
                        // Charges still queued: the next slice is asked for beside this answer.
                        let (store, owned) = (store.clone(), owned.clone());
                        tokio::spawn(async move {
                            let asked = refill(&store, &owned, &lease, &queue, hash).await;
                            if asked.is_err() {
                                store.inner.quotas.end(hash, &queue, true);
                            }
                        });
                    }
                    return Ok(outcome);
                }
                // Refused a slice (the limit is near): this charge alone, exactly.
                Ok(None) => return exactly().await,
                Err(error) => {
                    inner.quotas.end(hash, &queue, true);
                    return Err(error);
                }
            }
        }
        let permits = u32::try_from(owned.cost).unwrap_or(u32::MAX);
        let taken = queue.permits.acquire_many(permits).await;
        match taken {
            Ok(taken) => {
                taken.forget();
                let now = inner.local.now();
                return Ok(queue.outcome(now).unwrap_or(Outcome {
                    verdict: Verdict::Allowed,
                    limit: owned.algorithm.capacity(),
                    remaining: 0,
                    balance: 0,
                    next_unit_in: std::time::Duration::ZERO,
                    full_in: std::time::Duration::ZERO,
                    offence: false,
                    overridden: None,
                }));
            }
            Err(_) if queue.failed.load(Ordering::Relaxed) => {
                return Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    "the call for this key's quota lease failed",
                ));
            }
            // The lease ended, or Redis could not grant a slice: look again (exactly when the
            // slice was refused).
            Err(_) => {
                let now = inner.local.now();
                let record = || inner.record(&owned.charge(owned.cost), true);
                let (lookup, give_back) =
                    inner.quotas.take(hash, limit_id, owned.cost, now, record);
                if let Some((record, units)) = give_back {
                    give_back_units(inner, injected, &record, units).await?;
                }
                next = match lookup {
                    Lookup::Queued { ask: true, queue } => {
                        inner.quotas.end(hash, &queue, false);
                        Lookup::Exact
                    }
                    other => other,
                };
            }
        }
    }
}

/// Asks Redis for one slice of the key's quota: `units`, or what the charges queued need when
/// more (`own` units of it for the charge asking, which is admitted with it). Redis's answer
/// and whether charges are still queued beyond the slice; `None` if Redis could not grant it
/// (the lease ends, the charges queued look again).
async fn ask_for_slice(
    store: &RedisStore,
    owned: &Owned,
    lease: &Lease,
    queue: &Arc<Queue>,
    hash: u64,
    own: u64,
) -> Result<Option<(Outcome, bool)>, StoreError> {
    let inner = &store.inner;
    let queued = queue.queued.load(Ordering::Relaxed);
    let size = lease
        .units()
        .max(queued)
        .max(own)
        .min(owned.algorithm.capacity().max(own))
        .min(MOST_PERMITS);
    let exact = store.decide_exactly(
        std::slice::from_ref(&owned.charge(size)),
        Outcomes::into_first,
    );
    let granted = exact.await?;
    if !granted.verdict.is_admitted() {
        inner.quotas.end(hash, queue, false);
        return Ok(None);
    }
    let granted_at = inner.local.now();
    let mut until = granted_at.saturating_add(micros(lease.ttl()));
    let mut returnable_until = Micros::MAX;
    match owned.algorithm {
        Algorithm::FixedWindow(_) => {
            // The lease ends with its window: its units count in no other.
            let window_end = granted_at.saturating_add(micros(granted.next_unit_in));
            until = until.min(window_end);
            returnable_until = window_end;
        }
        Algorithm::SlidingWindow(_) => returnable_until = 0,
        _ => {}
    }
    // The charge asking takes its own units first: it is served.
    queue.queued.fetch_sub(own, Ordering::Relaxed);
    let handed = size - own;
    let ends = (until, returnable_until);
    let more = inner
        .quotas
        .granted(hash, queue, handed, granted.clone(), ends, granted_at);
    Ok(Some((
        with_held(granted, handed, std::time::Duration::ZERO),
        more,
    )))
}

/// Asks for slices while charges stay queued on `queue` (a hot key under steady load), beside
/// the answers of the charges that asked.
async fn refill(
    store: &RedisStore,
    owned: &Owned,
    lease: &Lease,
    queue: &Arc<Queue>,
    hash: u64,
) -> Result<(), StoreError> {
    while let Some((_, true)) = ask_for_slice(store, owned, lease, queue, hash, 0).await? {}
    Ok(())
}

/// Gives `units` of a lease back to the key in Redis. (Boxed: the script call's future nests
/// deep, and the lease's future holds it beside others.)
fn give_back_units<'a>(
    inner: &'a Arc<Inner>,
    now: Option<Micros>,
    record: &'a Record,
    units: u64,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), StoreError>> + Send + 'a>> {
    Box::pin(async move {
        let item = Item {
            record,
            mode: Mode::Charge,
            cost: units,
            only: None,
            undo: Taken::default(),
        };
        inner
            .timed(inner.call(Op::Refund, now, std::slice::from_ref(&item)))
            .await?;
        Ok(())
    })
}
