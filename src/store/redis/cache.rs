//! The local deny cache: answers for keys Redis has just said are empty, without asking again.
//!
//! When Redis denies a charge and reports `remaining == 0`, no charge of one unit or more can pass
//! that key before `reset` has elapsed (the time until at least one unit is back), whatever the
//! other instances do — they can only take units, except for a refund or a reset. The cache keeps
//! "denied until X" for such keys, with X on this process's clock, and answers a request locally
//! when one of its charges hits such an entry.
//!
//! A local answer must still carry an outcome for every rule of the request, so the other keys of
//! a cached denial are kept too, as "last seen" entries valid as long as the denial: their
//! `remaining` is the value Redis reported then. A request is answered locally only when at least
//! one of its charges is denied by an entry and every other charge has an entry (and is not under
//! a rule with a penalty, whose denial by Redis would be an offence); otherwise it goes to Redis.
//!
//! A key blocked by its rule's penalty is answered the same way until its block ends (a blocked
//! answer says exactly that). The answer to the offence that started a block is not cached: it
//! may report the counters' longer wait, and a denial after the block but before that wait is a
//! new offence, which only the store can count.
//!
//! Bounded: at most `capacity` entries; when full, expired entries are dropped, and if that is not
//! enough, nothing new is cached until entries expire.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::algorithm::{duration, micros, Micros, Mode, Outcome, Verdict};
use crate::store::{Charge, Outcomes};

const SHARDS: usize = 16;

pub(super) struct DenyCache {
    hasher: foldhash::fast::RandomState,
    shards: Box<[Mutex<HashMap<u64, Entry>>]>,
    per_shard: usize,
    len: AtomicUsize,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The entry answers until then (local clock).
    until: Micros,
    /// Whether the key itself is empty until `until`; otherwise a last-seen value.
    denied: bool,
    limit: u64,
    remaining: u64,
    balance: i64,
    reset_at: Micros,
    full_at: Micros,
}

impl DenyCache {
    pub(super) fn new(capacity: usize) -> Self {
        DenyCache {
            hasher: foldhash::fast::RandomState::default(),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            len: AtomicUsize::new(0),
        }
    }

    /// The cache's identity of `(rule, key)`.
    pub(super) fn hash(&self, rule: &str, key: &[u8]) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(rule.as_bytes());
        h.write_u8(0xff);
        h.write(key);
        h.finish()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    fn shard(&self, hash: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.shards[(hash >> 59) as usize % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self, hash: u64, now: Micros) -> Option<Entry> {
        self.shard(hash)
            .get(&hash)
            .copied()
            .filter(|e| e.until > now)
    }

    /// The outcomes of `batch` if the cache can answer it (a denial), or `None`.
    pub(super) fn answer(
        &self,
        batch: &[Charge<'_>],
        hashes: &[u64],
        now: Micros,
    ) -> Option<Outcomes> {
        if self.is_empty() {
            return None;
        }
        let mut denied = false;
        let mut outcomes = Outcomes::new();
        for (charge, &hash) in batch.iter().zip(hashes) {
            let entry = self.get(hash, now)?;
            let left = |at: Micros| duration(at.saturating_sub(now));
            let denies =
                entry.denied && charge.cost > 0 && !matches!(charge.mode, Mode::Reserve(_));
            if !denies && charge.penalty.is_some() {
                // A last-seen value cannot say whether this charge would be an offence.
                return None;
            }
            denied |= denies;
            outcomes.push(if denies {
                Outcome {
                    verdict: Verdict::Denied {
                        retry_after: left(entry.until),
                    },
                    limit: entry.limit,
                    remaining: 0,
                    balance: entry.balance,
                    next_unit_in: left(entry.until),
                    full_in: left(entry.full_at),
                    offence: false,
                }
            } else {
                Outcome {
                    verdict: Verdict::Allowed,
                    limit: entry.limit,
                    remaining: entry.remaining,
                    balance: entry.balance,
                    next_unit_in: left(entry.reset_at),
                    full_in: left(entry.full_at),
                    offence: false,
                }
            });
        }
        denied.then_some(outcomes)
    }

    /// Learns from Redis's answer to `batch`. `cacheable[i]` says whether charge `i` may be cached
    /// as denied (not a sharded rule).
    pub(super) fn learn(&self, batch: &[CacheView], outcomes: &[Outcome], now: Micros) {
        let empty_until = |view: &CacheView, outcome: &Outcome| match outcome.verdict {
            Verdict::Denied { .. }
                if outcome.remaining == 0
                    && view.cacheable
                    && !matches!(view.mode, Mode::Reserve(_)) =>
            {
                Some(now.saturating_add(micros(outcome.next_unit_in).max(1)))
            }
            _ => None,
        };
        // An offence blocked a key: what its rule answers next is the store's to say.
        let offence = outcomes.iter().any(|o| o.offence);
        let until = batch
            .iter()
            .zip(outcomes)
            .filter_map(|(view, outcome)| empty_until(view, outcome))
            .max()
            .filter(|_| !offence);
        let Some(until) = until else {
            // Admitted (or denied with units left, or an offence): whatever was cached for these
            // keys is stale.
            if !self.is_empty() {
                for view in batch {
                    if self.shard(view.hash).remove(&view.hash).is_some() {
                        self.len.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
            return;
        };
        for (view, outcome) in batch.iter().zip(outcomes) {
            let entry = match empty_until(view, outcome) {
                Some(empty) => Entry {
                    until: empty,
                    denied: true,
                    limit: outcome.limit,
                    remaining: 0,
                    balance: outcome.balance,
                    reset_at: empty,
                    full_at: now.saturating_add(micros(outcome.full_in)),
                },
                None => Entry {
                    until,
                    denied: false,
                    limit: outcome.limit,
                    remaining: outcome.remaining,
                    balance: outcome.balance,
                    reset_at: now.saturating_add(micros(outcome.next_unit_in)),
                    full_at: now.saturating_add(micros(outcome.full_in)),
                },
            };
            self.insert(view.hash, entry, now);
        }
    }

    fn insert(&self, hash: u64, entry: Entry, now: Micros) {
        let mut shard = self.shard(hash);
        if shard.len() >= self.per_shard && !shard.contains_key(&hash) {
            let before = shard.len();
            shard.retain(|_, e| e.until > now);
            self.len.fetch_sub(before - shard.len(), Ordering::Relaxed);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        if shard.insert(hash, entry).is_none() {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Drops what is known about a key (after a local refund or reset).
    pub(super) fn forget(&self, hash: u64) {
        if self.shard(hash).remove(&hash).is_some() {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// What the cache needs to know about one charge of a batch.
#[derive(Clone, Copy, Debug)]
pub(super) struct CacheView {
    pub(super) hash: u64,
    pub(super) mode: Mode,
    pub(super) cacheable: bool,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::{Algorithm, TokenBucket};

    impl DenyCache {
        /// How long a key stays answered locally.
        fn denied_for(&self, hash: u64, now: Micros) -> Option<Duration> {
            self.get(hash, now)
                .filter(|e| e.denied)
                .map(|e| duration(e.until - now))
        }
    }

    const SECOND: Duration = Duration::from_secs(1);

    fn denied(reset: Duration) -> Outcome {
        Outcome {
            verdict: Verdict::Denied { retry_after: reset },
            limit: 10,
            remaining: 0,
            balance: 0,
            next_unit_in: reset,
            full_in: reset,
            offence: false,
        }
    }

    fn allowed(remaining: u64) -> Outcome {
        Outcome {
            verdict: Verdict::Allowed,
            limit: 100,
            remaining,
            balance: remaining as i64,
            next_unit_in: SECOND,
            full_in: SECOND,
            offence: false,
        }
    }

    #[test]
    fn a_denied_key_is_answered_until_its_reset_with_the_other_rules_last_seen() {
        let cache = DenyCache::new(100);
        let algorithm = Algorithm::TokenBucket(TokenBucket::new(10, SECOND));
        let charge = |rule, cost| Charge {
            rule,
            algorithm: &algorithm,
            key: b"k",
            cost,
            mode: Mode::Charge,
            penalty: None,
        };
        let batch = [charge("tight", 1), charge("roomy", 1)];
        let hashes = [cache.hash("tight", b"k"), cache.hash("roomy", b"k")];
        let views = hashes.map(|hash| CacheView {
            hash,
            mode: Mode::Charge,
            cacheable: true,
        });
        assert!(cache.answer(&batch, &hashes, 0).is_none());
        cache.learn(&views, &[denied(SECOND), allowed(7)], 1_000);
        assert_eq!(cache.denied_for(hashes[0], 1_000), Some(SECOND));
        let answer = cache.answer(&batch, &hashes, 251_000).unwrap();
        assert_eq!(answer[0], denied(Duration::from_millis(750)));
        assert_eq!(
            answer[1],
            Outcome {
                next_unit_in: Duration::from_millis(750),
                full_in: Duration::from_millis(750),
                ..allowed(7)
            }
        );
        // The roomy rule alone is not known to be denied; a peek (cost 0) is not either.
        assert!(cache.answer(&batch[1..], &hashes[1..], 251_000).is_none());
        assert!(cache
            .answer(&[charge("tight", 0)], &hashes[..1], 251_000)
            .is_none());
        // At the reset, Redis is asked again.
        assert!(cache.answer(&batch, &hashes, 1_001_000).is_none());
        // An admitted answer or a forget drops the entries.
        cache.learn(&views, &[denied(SECOND), allowed(7)], 2_000_000);
        cache.learn(&views, &[allowed(1), allowed(7)], 2_000_001);
        assert!(cache.answer(&batch, &hashes, 2_000_002).is_none());
        cache.learn(&views, &[denied(SECOND), allowed(7)], 3_000_000);
        cache.forget(hashes[0]);
        assert!(cache.answer(&batch, &hashes, 3_000_001).is_none());
    }

    #[test]
    fn not_cached_denials_with_units_left_reservations_or_sharded_rules() {
        let cache = DenyCache::new(100);
        let hash = cache.hash("r", b"k");
        let view = |mode, cacheable| CacheView {
            hash,
            mode,
            cacheable,
        };
        let partly = Outcome {
            remaining: 2,
            ..denied(SECOND)
        };
        cache.learn(&[view(Mode::Charge, true)], &[partly], 0);
        cache.learn(
            &[view(Mode::Reserve(Default::default()), true)],
            &[denied(SECOND)],
            0,
        );
        cache.learn(&[view(Mode::Charge, false)], &[denied(SECOND)], 0);
        assert_eq!(cache.denied_for(hash, 1), None);
    }

    #[test]
    fn the_size_is_bounded() {
        let cache = DenyCache::new(32);
        for i in 0..1_000u32 {
            let view = CacheView {
                hash: cache.hash("r", &i.to_le_bytes()),
                mode: Mode::Charge,
                cacheable: true,
            };
            cache.learn(&[view], &[denied(SECOND)], 0);
        }
        assert!(cache.len.load(Ordering::Relaxed) <= 32);
        // Once expired, entries make room again.
        let view = CacheView {
            hash: cache.hash("r", b"late"),
            mode: Mode::Charge,
            cacheable: true,
        };
        cache.learn(&[view], &[denied(SECOND)], 10_000_000);
        assert!(cache.denied_for(view.hash, 10_000_000).is_some());
    }
}
