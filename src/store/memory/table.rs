//! The sharded tables of the memory store: a spinlocked `HashMap` per shard, keyed by the key's
//! hash, each shard sweeping its idle keys (and, at its bound, the least limited) as it grows.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use spinning_top::guard::SpinlockGuard;
use spinning_top::Spinlock;

use super::spans::{BucketEntry, Spans};
use super::PINNED;
use crate::algorithm::{Algorithm, Micros};

/// A shard is swept for idle keys when it has grown past twice its size after the last sweep, and
/// never below this many keys.
pub(super) const MIN_SWEEP: usize = 64;

/// Which table a state lives in.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(super) enum Which {
    Buckets,
    Others,
    Blocks,
}

pub(super) fn table_of(algorithm: &Algorithm) -> Which {
    match algorithm {
        Algorithm::TokenBucket(_) => Which::Buckets,
        _ => Which::Others,
    }
}

/// What the sweeper needs to know about a state.
pub(super) trait Expiring {
    /// The moment the state equals a fresh key's (a bucket entry reads its span in `spans`).
    fn expires(&self, spans: &Spans) -> Micros;
}

impl Expiring for BucketEntry {
    fn expires(&self, spans: &Spans) -> Micros {
        self.idle_at(spans)
    }
}

/// Shard selection uses the hash's upper-middle bits: the map inside the shard uses the low bits for
/// the bucket and the top seven for its tags. `mask` is the shard count less one (a power of two).
#[inline]
pub(super) fn shard_index(hash: u64, mask: usize) -> usize {
    ((hash >> 32) as usize) & mask
}

/// Keys are already hashes: the map uses them as they are.
#[derive(Default, Clone, Copy)]
pub(super) struct PreHashed(u64);

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

pub(super) struct Table<S> {
    pub(super) shards: Box<[Shard<S>]>,
    /// The shard count (a power of two) less one, kept so that picking a shard is one `and`.
    pub(super) mask: usize,
}

/// Cache-line aligned, so neighbouring shards' locks don't share a line.
///
/// The lock is a spinlock: it is held only for a few nanoseconds of arithmetic (and, rarely, for
/// a sweep of one shard), and its release is a plain store where a sleeping mutex's is a second
/// atomic read-modify-write (about 5 ns, a quarter of a decision). A waiter spins briefly, then
/// yields its thread, so a holder that was preempted gets the CPU back.
#[repr(align(128))]
pub(super) struct Shard<S>(Spinlock<ShardMap<S>>);

pub(super) struct ShardMap<S> {
    pub(super) map: HashMap<u64, S, BuildHasherDefault<PreHashed>>,
    sweep_at: usize,
    max: usize,
    /// The store's refill spans, which a bucket entry's expiry reads.
    pub(super) spans: Arc<Spans>,
}

impl<S: Expiring> Table<S> {
    pub(super) fn new(shards: usize, max_per_shard: usize, spans: &Arc<Spans>) -> Self {
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
    pub(super) fn lock(&self, index: usize) -> SpinlockGuard<'_, ShardMap<S>> {
        let lock = &self.shards[index].0;
        match lock.try_lock() {
            Some(guard) => guard,
            None => lock_contended(lock),
        }
    }

    #[inline]
    pub(super) fn shard(&self, hash: u64) -> SpinlockGuard<'_, ShardMap<S>> {
        self.lock(shard_index(hash, self.mask))
    }

    pub(super) fn len(&self) -> usize {
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
    pub(super) fn put(&mut self, hash: u64, state: S, now: Micros) {
        if let Some(slot) = self.map.get_mut(&hash) {
            *slot = state;
            return;
        }
        self.make_room(now);
        self.map.insert(hash, state);
    }

    /// Called before a new key goes in: drops idle keys when the shard has grown enough, and
    /// evicts the least-limited keys when it is at its bound.
    pub(super) fn make_room(&mut self, now: Micros) {
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
