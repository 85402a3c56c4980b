//! Quota leases (a rule's [`Lease`]): this instance takes a slice of a key's quota from Redis in
//! one charge and admits the key's next charges from it locally, until the slice is spent or the
//! lease ends.
//!
//! A charge of `cost` units on a leased key:
//! - **Held, enough left, not ended**: admitted here, nothing sent. Its outcome is Redis's answer
//!   to the lease's charge, with what this instance still holds counted as remaining and the
//!   times moved on by the time since (an estimate: other instances' charges since are not
//!   seen).
//! - **Otherwise** one charge goes to Redis for `max(units, cost)` minus what is still held, so
//!   the instance then holds `max(units, cost) − cost`; if Redis cannot grant that much, the
//!   charge is decided exactly (a second call, only near the limit), and the units held go back.
//!   A lease that ended goes back first (a token bucket's units at any time; a fixed window's
//!   while its window lasts; a sliding window's never, as a unit given back later would count in
//!   another window).
//!
//! Only one charge of a key asks Redis at a time on this instance: the others wait for its
//! answer and are then admitted from the lease it brought (on a hot key, dozens of charges
//! arrive while one lease is asked for).
//!
//! A fixed window's lease ends with its window (Redis's `next_unit_in` at the grant), so a
//! window is never over-admitted. Only charges of one key lease; a batch of several rules,
//! checks and reservations are decided exactly. At most `units` are held per key: a slice
//! granted while another charge of the same key was already holding units gives back what
//! exceeds `units`. Bounded like the deny cache: a full table leases nothing new (the charge is
//! exact) until leases end.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use smallvec::smallvec;

use super::{Inner, Item, Op, Record, RedisStore, Taken};
use crate::algorithm::{duration, micros, Algorithm, Lease, Micros, Mode, Outcome, Verdict};
use crate::store::{Charge, Outcomes, RuleName, StoreError, StoreErrorKind, StoreFuture};

const SHARDS: usize = 16;

/// The most times one charge waits for a lease another charge of this instance is asking for
/// (each wait is one call's round trip; among `n` charges waiting on a hot key, a lease of
/// `units` admits `units` of them per call). Past it, the charge is decided exactly.
const MAX_WAITS: u32 = 64;

/// The leases this instance holds, by `(rule, key)`.
pub(super) struct Quotas {
    hasher: foldhash::fast::RandomState,
    shards: Box<[Mutex<HashMap<u64, Slot>>]>,
    per_shard: usize,
}

/// One lease: what is left of it, until when, and what Redis said when it was granted.
struct Held {
    units: u64,
    /// The lease ends then (local clock).
    until: Micros,
    /// Its units may go back to Redis until then (local clock).
    returnable_until: Micros,
    /// The limit it was granted under: a charge under another (a limit chosen per request) asks
    /// Redis.
    limit_id: u64,
    granted: Outcome,
    granted_at: Micros,
    /// The key's record, to give units back.
    record: Arc<Record>,
}

impl Held {
    /// The outcome of a charge admitted from this lease at `now`.
    fn outcome(&self, now: Micros) -> Outcome {
        let since = duration(now.saturating_sub(self.granted_at));
        with_held(self.granted, self.units, since)
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

/// What a charge found in the table before asking Redis.
struct Found {
    /// Units of a live lease, taken out to pay part of this charge.
    held: u64,
    /// Waited too long for another charge's lease: this one is decided exactly, for its cost.
    exact: bool,
    /// An ended lease's units to give back first.
    give_back: Option<(Arc<Record>, u64)>,
}

/// A slot of the table: a lease held, or one being asked for.
enum Slot {
    Held(Held),
    Asking(Asking),
}

/// A lease being asked for: its sender is dropped when the answer is in (turning `false` first
/// if the call failed), which wakes the charges waiting for it; `waiting` sums their costs, so
/// the lease asked for covers them.
#[derive(Clone)]
struct Asking {
    answered: watch::Receiver<bool>,
    waiting: Arc<AtomicU64>,
}

impl Asking {
    /// Whether the charge asking is still at it (it was not dropped, and has not answered).
    fn live(&self) -> bool {
        self.answered.has_changed().is_ok()
    }
}

/// What a charge does after looking in the table.
enum Lookup {
    /// Admitted from the lease held.
    Admitted(Outcome),
    /// Another charge of this instance is asking Redis for the key's next lease: wait for it
    /// rather than ask too (on a hot key, dozens of charges would each ask for a lease at once).
    Wait(watch::Receiver<bool>),
    /// Ask Redis; the sender (when this charge registered its asking) wakes those waiting, whose
    /// costs add up in the counter.
    Ask(Found, Option<(watch::Sender<bool>, Arc<AtomicU64>)>),
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

    fn shard(&self, hash: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Slot>> {
        self.shards[(hash as usize) % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits `cost` from a live lease, or says to wait for the lease being asked for, or takes
    /// out what the table holds for the key and registers this charge as the one asking.
    fn take(&self, hash: u64, limit_id: u64, cost: u64, now: Micros, may_wait: bool) -> Lookup {
        let mut shard = self.shard(hash);
        let mut found = Found {
            held: 0,
            exact: false,
            give_back: None,
        };
        match shard.get_mut(&hash) {
            // While a lease is asked for, charges queue behind it (a charge arriving now does not
            // take units those waiting were promised), and the lease asked for covers them.
            Some(Slot::Asking(asking)) if asking.live() && may_wait => {
                asking.waiting.fetch_add(cost, Ordering::Relaxed);
                return Lookup::Wait(asking.answered.clone());
            }
            // Waited long enough: decided exactly, beside the one asking.
            Some(Slot::Asking(asking)) if asking.live() => {
                found.exact = true;
                return Lookup::Ask(found, None);
            }
            // A charge that asked was dropped: nobody is asking.
            Some(Slot::Asking(_)) => {}
            Some(Slot::Held(held)) => {
                let live = held.limit_id == limit_id && now < held.until;
                if live && held.units >= cost {
                    held.units -= cost;
                    return Lookup::Admitted(held.outcome(now));
                }
                if live {
                    found.held = held.units;
                } else if held.units > 0 && now < held.returnable_until {
                    found.give_back = Some((held.record.clone(), held.units));
                }
            }
            None => {}
        }
        shard.remove(&hash);
        if shard.len() >= self.per_shard {
            // Ended leases make room; their units are not given back (under-admission only).
            shard.retain(|_, slot| match slot {
                Slot::Held(held) => now < held.until,
                Slot::Asking(asking) => asking.live(),
            });
            if shard.len() >= self.per_shard {
                return Lookup::Ask(found, None);
            }
        }
        let (sender, answered) = watch::channel(true);
        let waiting = Arc::new(AtomicU64::new(0));
        shard.insert(
            hash,
            Slot::Asking(Asking {
                answered,
                waiting: waiting.clone(),
            }),
        );
        Lookup::Ask(found, Some((sender, waiting)))
    }

    /// Keeps `new` for the key; returns the units that exceed `most` once merged with a lease
    /// granted meanwhile (or all of them when the table is full), to give back.
    fn keep(&self, hash: u64, new: Held, most: u64, now: Micros) -> Option<(Arc<Record>, u64)> {
        let mut shard = self.shard(hash);
        if let Some(Slot::Held(held)) = shard.get_mut(&hash) {
            if held.limit_id == new.limit_id && now < held.until {
                let total = held.units.saturating_add(new.units);
                held.units = total.min(most);
                return match total.checked_sub(most) {
                    Some(excess) if excess > 0 => Some((new.record, excess)),
                    _ => None,
                };
            }
        }
        if shard.len() >= self.per_shard && !shard.contains_key(&hash) {
            return Some((new.record, new.units)).filter(|(_, units)| *units > 0);
        }
        shard.insert(hash, Slot::Held(new));
        None
    }
}

/// The parts of a charge a lease's future keeps (the charge itself is borrowed).
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
            overrides: None,
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
    let quotas = &inner.quotas;
    let hash = quotas.hash(charge.rule, charge.key);
    let limit_id = quotas.hasher.hash_one(charge.algorithm);
    let first = match quotas.take(hash, limit_id, charge.cost, inner.local.now(), true) {
        Lookup::Admitted(outcome) => return StoreFuture::ready(finish(smallvec![outcome])),
        next => next,
    };
    let owned = Owned {
        rule: charge.rule.as_str().into(),
        digest: charge.rule.digest(),
        key: charge.key.into(),
        algorithm: charge.algorithm.clone(),
        cost: charge.cost,
    };
    let (store, lease) = (store.clone(), *lease);
    StoreFuture::pending(async move {
        let mut next = first;
        let mut waits = 0;
        let (found, asking) = loop {
            match next {
                Lookup::Wait(mut asking) => {
                    // Granted, refused or dropped: the sender is gone either way. The lease
                    // covered the charges waiting when it was asked for; one that came later
                    // waits for the next (past MAX_WAITS it is decided exactly). A call that
                    // failed fails those waiting for it: none waits past one call's timeout.
                    let _ = asking.changed().await;
                    if !*asking.borrow() {
                        return Err(StoreError::new(
                            StoreErrorKind::Unavailable,
                            "the call for this key's quota lease failed",
                        ));
                    }
                    waits += 1;
                    let now = store.inner.local.now();
                    let may_wait = waits < MAX_WAITS;
                    next = store
                        .inner
                        .quotas
                        .take(hash, limit_id, owned.cost, now, may_wait);
                }
                Lookup::Ask(found, asking) => break (found, asking),
                Lookup::Admitted(outcome) => return finish(smallvec![outcome]),
            }
        };
        let waiting = asking.as_ref().map(|(_, waiting)| waiting.clone());
        let outcome = acquire(&store, &owned, &lease, found, waiting, hash, limit_id).await;
        // Those waiting look again now that the lease (if any) is in the table.
        if let (Some((answered, _)), Err(_)) = (&asking, &outcome) {
            answered.send_replace(false);
        }
        drop(asking);
        finish(smallvec![outcome?])
    })
}

/// Asks Redis for a lease big enough for `owned`'s charge and for the charges `waiting` for it
/// (what `found` holds counts toward it), keeps what is left of it, and answers the charge.
async fn acquire(
    store: &RedisStore,
    owned: &Owned,
    lease: &Lease,
    found: Found,
    waiting: Option<Arc<AtomicU64>>,
    hash: u64,
    limit_id: u64,
) -> Result<Outcome, StoreError> {
    let inner = &store.inner;
    let injected = inner.injected_now()?;
    let record = inner.record(&owned.charge(owned.cost), true);
    if let Some((ended, units)) = found.give_back {
        give_back(inner, injected, &ended, units).await?;
    }
    let cost = owned.cost;
    // `units`, or what this charge and those waiting for it need when more: they take it at
    // once, so it is never held beyond the lease's `units`.
    let waiting = waiting.map_or(0, |waiting| waiting.load(Ordering::Relaxed));
    let size = if found.exact {
        cost
    } else {
        lease
            .units()
            .max(cost.saturating_add(waiting))
            .min(owned.algorithm.capacity().max(cost))
    };
    let need = cost - found.held.min(cost);
    let ask = size - found.held.min(size);
    let exact = |cost: u64| store.decide_exactly(std::slice::from_ref(&owned.charge(cost)), Ok);
    let granted = exact(ask).await?[0];
    if !granted.verdict.is_admitted() {
        // Not that much left: the charge alone, exactly; what was held goes back.
        let outcome = if need < ask {
            exact(need).await?[0]
        } else {
            granted
        };
        if found.held > 0 && !outcome.verdict.is_admitted() {
            give_back(inner, injected, &record, found.held).await?;
        }
        return Ok(outcome);
    }
    let held = found.held + ask - cost;
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
    if held > 0 {
        let new = Held {
            units: held,
            until,
            returnable_until,
            limit_id,
            granted,
            granted_at,
            record: Arc::new(record),
        };
        if let Some((record, units)) = inner.quotas.keep(hash, new, lease.units(), granted_at) {
            if granted_at < returnable_until {
                give_back(inner, injected, &record, units).await?;
            }
        }
    }
    Ok(with_held(granted, held, std::time::Duration::ZERO))
}

/// Gives `units` of a lease back to the key in Redis. (Boxed: the script call's future nests
/// deep, and the lease's future holds it beside two others.)
fn give_back<'a>(
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
