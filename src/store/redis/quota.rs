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
//! A fixed window's lease ends with its window (Redis's `next_unit_in` at the grant), so a
//! window is never over-admitted. Only charges of one key lease; a batch of several rules,
//! checks and reservations are decided exactly. At most `units` are held per key: a slice
//! granted while another charge of the same key was already holding units gives back what
//! exceeds `units`. Bounded like the deny cache: a full table leases nothing new (the charge is
//! exact) until leases end.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use smallvec::smallvec;

use super::{Inner, Item, Op, Record, RedisStore, Taken};
use crate::algorithm::{duration, micros, Algorithm, Lease, Micros, Mode, Outcome, Verdict};
use crate::store::{Charge, Outcomes, RuleName, StoreError, StoreFuture};

const SHARDS: usize = 16;

/// The leases this instance holds, by `(rule, key)`.
pub(super) struct Quotas {
    hasher: foldhash::fast::RandomState,
    shards: Box<[Mutex<HashMap<u64, Held>>]>,
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
    /// An ended lease's units to give back first.
    give_back: Option<(Arc<Record>, u64)>,
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

    /// Admits `cost` from a live lease, or takes out what the table holds for the key.
    fn take(&self, hash: u64, limit_id: u64, cost: u64, now: Micros) -> Result<Outcome, Found> {
        let mut shard = self.shard(hash);
        let Some(held) = shard.get_mut(&hash) else {
            return Err(Found {
                held: 0,
                give_back: None,
            });
        };
        let live = held.limit_id == limit_id && now < held.until;
        if live && held.units >= cost {
            held.units -= cost;
            return Ok(held.outcome(now));
        }
        let held = shard.remove(&hash).expect("found above");
        Err(if live {
            Found {
                held: held.units,
                give_back: None,
            }
        } else {
            Found {
                held: 0,
                give_back: (held.units > 0 && now < held.returnable_until)
                    .then_some((held.record, held.units)),
            }
        })
    }

    /// Keeps `new` for the key; returns the units that exceed `most` once merged with a lease
    /// granted meanwhile (or all of them when the table is full), to give back.
    fn keep(&self, hash: u64, new: Held, most: u64, now: Micros) -> Option<(Arc<Record>, u64)> {
        let mut shard = self.shard(hash);
        if let Some(held) = shard.get_mut(&hash) {
            if held.limit_id == new.limit_id && now < held.until {
                let total = held.units.saturating_add(new.units);
                held.units = total.min(most);
                return (total > most).then(|| (new.record, total - most));
            }
        }
        if shard.len() >= self.per_shard && !shard.contains_key(&hash) {
            // Ended leases make room; their units are not given back (under-admission only).
            shard.retain(|_, held| now < held.until);
            if shard.len() >= self.per_shard {
                return Some((new.record, new.units)).filter(|(_, units)| *units > 0);
            }
        }
        shard.insert(hash, new);
        None
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
    let now = inner.local.now();
    let hash = quotas.hash(charge.rule, charge.key);
    let limit_id = quotas.hasher.hash_one(charge.algorithm);
    let found = match quotas.take(hash, limit_id, charge.cost, now) {
        Ok(outcome) => return StoreFuture::ready(finish(smallvec![outcome])),
        Err(found) => found,
    };
    let size = lease.units().max(charge.cost);
    let need = charge.cost - found.held.min(charge.cost);
    let ask = size - found.held.min(size);
    let exact = |cost: u64| {
        let charge = Charge {
            cost,
            lease: None,
            ..*charge
        };
        store.decide_exactly(std::slice::from_ref(&charge), Ok)
    };
    // Both calls are put together now (they borrow the charge); the second is sent only if the
    // first is denied, and only when it asks for less.
    let leased = exact(ask);
    let fallback = (need < ask).then(|| exact(need));
    let record = Arc::new(inner.record(charge, true));
    let injected = inner.injected_now();
    let (ttl, most, cost, algorithm) = (
        micros(lease.ttl()),
        lease.units(),
        charge.cost,
        charge.algorithm.clone(),
    );
    let inner = store.inner.clone();
    StoreFuture::pending(async move {
        let injected = injected?;
        if let Some((record, units)) = found.give_back {
            give_back(&inner, injected, &record, units).await?;
        }
        let granted = leased.await?[0];
        if !granted.verdict.is_admitted() {
            // Not that much left: the charge alone, exactly; what was held goes back.
            let outcome = match fallback {
                Some(exact) => exact.await?[0],
                None => granted,
            };
            if found.held > 0 && !outcome.verdict.is_admitted() {
                give_back(&inner, injected, &record, found.held).await?;
            }
            return finish(smallvec![outcome]);
        }
        let held = found.held + ask - cost;
        let granted_at = inner.local.now();
        let mut until = granted_at.saturating_add(ttl);
        let mut returnable_until = Micros::MAX;
        match algorithm {
            Algorithm::FixedWindow(_) => {
                // The lease ends with its window: its units count in no other.
                let window_end = granted_at.saturating_add(micros(granted.next_unit_in));
                until = until.min(window_end);
                returnable_until = window_end;
            }
            Algorithm::SlidingWindow(_) => returnable_until = 0,
            _ => {}
        }
        let outcome = with_held(granted, held, std::time::Duration::ZERO);
        if held > 0 {
            let new = Held {
                units: held,
                until,
                returnable_until,
                limit_id,
                granted,
                granted_at,
                record: record.clone(),
            };
            if let Some((record, units)) = inner.quotas.keep(hash, new, most, granted_at) {
                if granted_at < returnable_until {
                    give_back(&inner, injected, &record, units).await?;
                }
            }
        }
        finish(smallvec![outcome])
    })
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
