//! The local deny cache: answers for keys Redis has just denied, without asking again.
//!
//! When Redis denies a charge of `cost` units, it says how long until that cost fits
//! (`retry_after`) and until the key's whole units grow (`next_unit_in`). Until the earlier of the two,
//! Redis's answer to the same charge (same cost, same mode) moves only with the clock — as long as
//! no one refunds or resets the key (other instances can only take units, which delays the key
//! further). The cache keeps those instants on this process's clock and answers such a request
//! locally with exactly the fields Redis would report: `retry_after`, `next_unit_in` and `full_in`
//! shrink as time passes, `remaining` and `balance` stay. A key in debt (a negative balance, owed
//! to reservations) is not cached: its balance grows before its `remaining` does. A request with
//! another cost or mode goes to Redis, and so does one under another limit (a limit chosen per
//! request may change between two requests of a key).
//!
//! A local answer must still carry an outcome for every rule of the request, so the other charges
//! of a cached denial are kept too, as "last seen" entries valid while their own fields stay
//! exact (until their `next_unit_in`) and no longer than the denial. A request is answered locally only
//! when every one of its charges has a matching entry and at least one of them is denied;
//! otherwise it goes to Redis. Reservations are never cached (their wait grows with every
//! reservation made elsewhere).
//!
//! Under a rule with a penalty, a request is answered locally only when that rule's own entry
//! denies it (a last-seen value cannot say whether Redis would count an offence). A key blocked by
//! its rule's penalty is answered locally until its block ends (a blocked answer says exactly
//! that), for at most [`BLOCK_RECHECK`] at a time: another instance may lift the block (an
//! operator's `unblock`), and this one must not go on denying a key that every listing shows
//! free. The answer to the offence that started a block is not cached: it may report the
//! counters' longer wait, and a denial after the block but before that wait is a new offence,
//! which only the store can count.
//!
//! Bounded: at most `capacity` entries; when full, expired entries are dropped, and if that is not
//! enough, nothing new is cached until entries expire.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::algorithm::{duration, micros, Algorithm, Micros, Mode, Outcome, Verdict};
use crate::store::{Charge, Outcomes, RuleName};

const SHARDS: usize = 16;

/// How long a blocked key's answer is given locally before Redis is asked again, so that a block
/// lifted through another instance is seen here within this time.
const BLOCK_RECHECK: Duration = Duration::from_secs(1);

pub(super) struct DenyCache {
    hasher: foldhash::fast::RandomState,
    shards: Box<[Mutex<HashMap<u64, Entry>>]>,
    per_shard: usize,
    len: AtomicUsize,
}

/// What Redis said about one charge, as instants on the local clock.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The entry answers until then (local clock).
    until: Micros,
    /// The charge it answers: the fields depend on the cost, the mode and the limit (its
    /// [`limit_id`](DenyCache::limit_id)).
    cost: u64,
    mode: Mode,
    limit_id: u64,
    limit: u64,
    remaining: u64,
    /// The signed balance; it moves only with `remaining`, as no entry is kept for a key in debt.
    balance: i64,
    /// When `remaining` grows (`next_unit_in`); `None` when the key was full (it stays so).
    next_unit_at: Option<Micros>,
    /// When the key is full again (`full_in`); passed when it was full.
    full_at: Micros,
    /// When the cost fits, for a denied charge; `None` for an admitted one.
    retry_at: Option<Micros>,
    /// Whether this entry's denial may answer a request locally (not a sharded rule's, whose
    /// answer depends on the shards a request happens to pick).
    anchor: bool,
}

impl Entry {
    fn matches(&self, view: &CacheView) -> bool {
        self.cost == view.cost && self.mode == view.mode && self.limit_id == view.limit_id
    }

    fn outcome(&self, now: Micros) -> Outcome {
        let left = |at: Micros| duration(at.saturating_sub(now));
        Outcome {
            verdict: match self.retry_at {
                Some(at) => Verdict::Denied {
                    retry_after: left(at),
                },
                None => Verdict::Allowed,
            },
            limit: self.limit,
            remaining: self.remaining,
            balance: self.balance,
            next_unit_in: self.next_unit_at.map_or(Duration::ZERO, left),
            full_in: left(self.full_at),
            offence: false,
            overridden: None,
        }
    }
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
    pub(super) fn hash(&self, rule: RuleName<'_>, key: &[u8]) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write_u64(rule.digest());
        h.write(key);
        h.finish()
    }

    /// The cache's identity of a limit, so that an answer under one is never given under another.
    pub(super) fn limit_id(&self, algorithm: &Algorithm) -> u64 {
        self.hasher.hash_one(algorithm)
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
        views: &[CacheView],
        now: Micros,
    ) -> Option<Outcomes> {
        // An override set through another instance applies on the key's next decision: a batch
        // with a rule that has overrides goes to Redis.
        if self.is_empty() || batch.iter().any(|c| c.read_overrides) {
            return None;
        }
        let mut denied = false;
        let mut outcomes = Outcomes::new();
        for (charge, view) in batch.iter().zip(views) {
            let entry = self.get(view.hash, now).filter(|e| e.matches(view))?;
            let denies = entry.anchor && entry.retry_at.is_some();
            if !denies && charge.penalty.is_some() {
                // A last-seen value cannot say whether this charge would be an offence.
                return None;
            }
            denied |= denies;
            outcomes.push(entry.outcome(now));
        }
        denied.then_some(outcomes)
    }

    /// Learns from Redis's answer to `batch`, received at `now`. `missing[i]` says that charge
    /// `i`'s key holds no state: its answer does not move with the clock (a new key is seen
    /// fresh whenever it is asked about), so such a batch is not cached.
    pub(super) fn learn(
        &self,
        batch: &[CacheView],
        outcomes: &[Outcome],
        missing: &[bool],
        now: Micros,
    ) {
        let at = |d: Duration| now.saturating_add(micros(d));
        let anchors = |view: &CacheView, outcome: &Outcome| {
            view.cacheable && matches!(outcome.verdict, Verdict::Denied { .. })
        };
        let reserves = batch.iter().any(|v| matches!(v.mode, Mode::Reserve(_)));
        let until = batch
            .iter()
            .zip(outcomes)
            .filter(|(view, outcome)| anchors(view, outcome))
            .map(|(_, outcome)| match outcome.verdict {
                Verdict::Denied { retry_after } => at(retry_after.min(outcome.next_unit_in)),
                _ => now,
            })
            .max()
            .filter(|&until| {
                until > now
                    && !reserves
                    && !missing.contains(&true)
                    && outcomes.iter().all(|outcome| outcome.balance >= 0)
                    // An offence blocked a key: what its rule answers next is the store's to say.
                    && !outcomes.iter().any(|outcome| outcome.offence)
            });
        let Some(until) = until else {
            // Admitted (or not cacheable): whatever was cached for these keys is stale.
            if !self.is_empty() {
                for view in batch {
                    self.forget(view.hash);
                }
            }
            return;
        };
        for (view, outcome) in batch.iter().zip(outcomes) {
            let next_unit_at =
                (outcome.next_unit_in > Duration::ZERO).then(|| at(outcome.next_unit_in));
            let retry_at = match outcome.verdict {
                Verdict::Denied { retry_after } => Some(at(retry_after)),
                _ => None,
            };
            let exact_until = [next_unit_at, retry_at].into_iter().flatten().min();
            let mut until = exact_until.map_or(until, |exact| exact.min(until));
            if view.penalised {
                until = until.min(at(BLOCK_RECHECK));
            }
            let entry = Entry {
                until,
                cost: view.cost,
                mode: view.mode,
                limit_id: view.limit_id,
                limit: outcome.limit,
                remaining: outcome.remaining,
                balance: outcome.balance,
                next_unit_at,
                full_at: at(outcome.full_in),
                retry_at,
                anchor: view.cacheable,
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
    pub(super) cost: u64,
    pub(super) mode: Mode,
    /// [`DenyCache::limit_id`] of the charge's limit.
    pub(super) limit_id: u64,
    pub(super) cacheable: bool,
    /// The charge's rule has a penalty: its denials are blocks, which another instance may lift.
    pub(super) penalised: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, TokenBucket};

    const SECOND: Duration = Duration::from_secs(1);

    fn denied(retry_after: Duration, remaining: u64, reset: Duration) -> Outcome {
        Outcome {
            verdict: Verdict::Denied { retry_after },
            limit: 10,
            remaining,
            balance: remaining as i64,
            next_unit_in: reset,
            full_in: reset,
            offence: false,
            overridden: None,
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
            overridden: None,
        }
    }

    /// The limit of these tests' charges.
    fn ten_a_second() -> Algorithm {
        Algorithm::TokenBucket(TokenBucket::new(10, SECOND))
    }

    fn view(cache: &DenyCache, rule: &str, cost: u64, mode: Mode) -> CacheView {
        CacheView {
            hash: cache.hash(RuleName::new(rule), b"k"),
            cost,
            mode,
            limit_id: cache.limit_id(&ten_a_second()),
            cacheable: true,
            penalised: false,
        }
    }

    #[test]
    fn a_denied_charge_is_answered_with_the_fields_redis_would_give_until_one_changes() {
        let cache = DenyCache::new(100);
        let algorithm = ten_a_second();
        let charge = |rule, cost| Charge {
            rule: RuleName::new(rule),
            algorithm: &algorithm,
            key: b"k",
            cost,
            mode: Mode::Charge,
            penalty: None,
            lease: None,
            read_overrides: false,
        };
        let batch = [charge("tight", 5), charge("roomy", 1)];
        let views = [
            view(&cache, "tight", 5, Mode::Charge),
            view(&cache, "roomy", 1, Mode::Charge),
        ];
        assert!(cache.answer(&batch, &views, 0).is_none());
        // Five units missing at one per 100 ms; the next whole unit in 100 ms.
        let ms = Duration::from_millis;
        cache.learn(
            &views,
            &[denied(ms(500), 0, ms(100)), allowed(7)],
            &[],
            1_000,
        );
        let answer = cache.answer(&batch, &views, 61_000).unwrap();
        assert_eq!(answer[0], denied(ms(440), 0, ms(40)));
        assert_eq!(
            answer[1],
            Outcome {
                next_unit_in: ms(940),
                full_in: ms(940),
                ..allowed(7)
            }
        );
        // Another cost, a peek, or the roomy rule alone are not known: Redis is asked.
        for cost in [4, 0] {
            let other = [view(&cache, "tight", cost, Mode::Charge)];
            assert!(cache
                .answer(&[charge("tight", cost)], &other, 61_000)
                .is_none());
        }
        assert!(cache.answer(&batch[1..], &views[1..], 61_000).is_none());
        // Once a unit is back, `remaining` would be 1: Redis is asked again.
        assert!(cache.answer(&batch, &views, 101_000).is_none());
        // An admitted answer or a forget drops the entries.
        cache.learn(
            &views,
            &[denied(ms(500), 0, ms(100)), allowed(7)],
            &[],
            2_000_000,
        );
        cache.learn(&views, &[allowed(1), allowed(7)], &[], 2_000_001);
        assert!(cache.answer(&batch, &views, 2_000_002).is_none());
        cache.learn(
            &views,
            &[denied(ms(500), 0, ms(100)), allowed(7)],
            &[],
            3_000_000,
        );
        cache.forget(views[0].hash);
        assert!(cache.answer(&batch, &views, 3_000_001).is_none());
    }

    #[test]
    fn a_denial_under_one_limit_never_answers_a_request_under_another() {
        // A limit chosen per request (a tier's, say): denied under 10 a second, then asked under a
        // capacity of 20, whose answer Redis gives.
        let cache = DenyCache::new(100);
        let (own, other) = (
            ten_a_second(),
            Algorithm::TokenBucket(TokenBucket::new(10, SECOND).with_capacity(20)),
        );
        let charge = |algorithm| Charge {
            rule: RuleName::new("r"),
            algorithm,
            key: b"k",
            cost: 1,
            mode: Mode::Charge,
            penalty: None,
            lease: None,
            read_overrides: false,
        };
        let under_own = [view(&cache, "r", 1, Mode::Charge)];
        let under_other = [CacheView {
            limit_id: cache.limit_id(&other),
            ..under_own[0]
        }];
        cache.learn(&under_own, &[denied(SECOND, 0, SECOND)], &[], 0);
        assert!(cache.answer(&[charge(&own)], &under_own, 1).is_some());
        assert!(cache.answer(&[charge(&other)], &under_other, 1).is_none());
    }

    #[test]
    fn a_denial_with_units_left_is_exact_until_its_reset() {
        let cache = DenyCache::new(100);
        let algorithm = ten_a_second();
        let charge = Charge {
            rule: RuleName::new("r"),
            algorithm: &algorithm,
            key: b"k",
            cost: 5,
            mode: Mode::Charge,
            penalty: None,
            lease: None,
            read_overrides: false,
        };
        let v = [view(&cache, "r", 5, Mode::Charge)];
        cache.learn(&v, &[denied(SECOND, 2, Duration::from_millis(300))], &[], 0);
        assert_eq!(
            cache.answer(&[charge], &v, 100_000).unwrap()[0],
            denied(Duration::from_millis(900), 2, Duration::from_millis(200))
        );
        assert!(cache.answer(&[charge], &v, 300_000).is_none());
    }

    #[test]
    fn not_cached_reservations_sharded_rules_or_keys_without_state() {
        let cache = DenyCache::new(100);
        let reserve = Mode::Reserve(Default::default());
        let hash = cache.hash(RuleName::new("r"), b"k");
        cache.learn(
            &[view(&cache, "r", 1, reserve)],
            &[denied(SECOND, 0, SECOND)],
            &[],
            0,
        );
        let sharded = CacheView {
            cacheable: false,
            ..view(&cache, "r", 1, Mode::Charge)
        };
        cache.learn(&[sharded], &[denied(SECOND, 0, SECOND)], &[], 0);
        // A key Redis holds no state for is seen fresh whenever it is asked: its answer stays.
        cache.learn(
            &[view(&cache, "r", 1, Mode::Charge)],
            &[denied(SECOND, 0, SECOND)],
            &[true],
            0,
        );
        // A key in debt (owed to reservations): its balance grows before its `remaining`.
        cache.learn(
            &[view(&cache, "r", 1, Mode::Charge)],
            &[Outcome {
                balance: -3,
                ..denied(SECOND, 0, SECOND)
            }],
            &[false],
            0,
        );
        assert!(cache.get(hash, 1).is_none());
        // The same denial without debt is cached.
        cache.learn(
            &[view(&cache, "r", 1, Mode::Charge)],
            &[denied(SECOND, 0, SECOND)],
            &[false],
            0,
        );
        assert!(cache.get(hash, 1).is_some());
    }

    #[test]
    fn the_size_is_bounded() {
        let cache = DenyCache::new(32);
        for i in 0..1_000u32 {
            let view = CacheView {
                hash: cache.hash(RuleName::new("r"), &i.to_le_bytes()),
                cost: 1,
                mode: Mode::Charge,
                limit_id: 0,
                cacheable: true,
                penalised: false,
            };
            cache.learn(&[view], &[denied(SECOND, 0, SECOND)], &[], 0);
        }
        assert!(cache.len.load(Ordering::Relaxed) <= 32);
        // Once expired, entries make room again.
        let view = CacheView {
            hash: cache.hash(RuleName::new("r"), b"late"),
            cost: 1,
            mode: Mode::Charge,
            limit_id: 0,
            cacheable: true,
            penalised: false,
        };
        cache.learn(&[view], &[denied(SECOND, 0, SECOND)], &[], 10_000_000);
        assert!(cache.get(view.hash, 10_000_000).is_some());
    }

    #[test]
    fn a_blocked_answer_is_given_for_a_second_at_a_time() {
        let cache = DenyCache::new(100);
        let algorithm = ten_a_second();
        let penalty = crate::algorithm::Penalty::fixed(Duration::from_secs(600));
        let charge = Charge {
            rule: RuleName::new("login"),
            algorithm: &algorithm,
            key: b"k",
            cost: 1,
            mode: Mode::Charge,
            penalty: Some(&penalty),
            lease: None,
            read_overrides: false,
        };
        let views = [CacheView {
            penalised: true,
            ..view(&cache, "login", 1, Mode::Charge)
        }];
        let blocked = denied(Duration::from_secs(600), 0, Duration::from_secs(600));
        cache.learn(&views, &[blocked], &[false], 0);
        let second = micros(BLOCK_RECHECK);
        let local = cache.answer(&[charge], &views, second - 1).unwrap();
        assert_eq!(
            local[0].verdict,
            Verdict::Denied {
                retry_after: Duration::from_secs(600) - Duration::from_micros(second - 1)
            }
        );
        assert!(cache.answer(&[charge], &views, second).is_none());
    }
}
