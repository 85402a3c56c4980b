//! The limiters the store benchmarks compare, behind one interface, with the limits and keys they
//! decide: shared by `benches/store.rs` and `examples/decision_ab.rs`.

#![allow(dead_code)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::hash::BuildHasher;
use tollgate::algorithm::{Algorithm, TokenBucket};
use tollgate::store::{Charge, RuleName, Store};
use tollgate::MemoryStore;

/// Decide one unit for `key`; `true` if allowed.
pub(crate) trait Limiter: Sync {
    fn decide(&self, key: u64) -> bool;
}

/// A tollgate store deciding for rule `bench` on the key's eight little-endian bytes. `S` is
/// `MemoryStore` for the typed call the middleware makes, or `dyn Store` for a trait-object call.
pub(crate) struct Tollgate<S: ?Sized> {
    /// The rule's name with its digest, made once as the limiter makes it per rule.
    pub(crate) rule: RuleName<'static>,
    pub(crate) algorithm: Algorithm,
    pub(crate) store: Box<S>,
}

impl<S: Store + ?Sized> Tollgate<S> {
    /// `store` deciding the limits of the `denied` or allowed path.
    pub(crate) fn new(store: Box<S>, denied: bool) -> Self {
        let bucket = if denied {
            TokenBucket::new(1, Duration::from_secs(3600))
        } else {
            TokenBucket::new(1, Duration::from_secs(1)).with_capacity(u64::from(u32::MAX))
        };
        Tollgate {
            rule: RuleName::new("bench"),
            algorithm: Algorithm::TokenBucket(bucket),
            store,
        }
    }
}

impl<S: ?Sized> Tollgate<S> {
    /// One unit for `key`'s eight bytes under the bench's rule.
    #[inline]
    fn charge<'a>(&'a self, bytes: &'a [u8; 8]) -> Charge<'a> {
        Charge::new(self.rule, &self.algorithm, bytes, 1)
    }
}

/// The memory store by its type: its synchronous decision, the call the middleware makes for a
/// request under one rule.
impl Limiter for Tollgate<MemoryStore> {
    #[inline]
    fn decide(&self, key: u64) -> bool {
        let bytes = key.to_le_bytes();
        black_box(self.store.decide(&self.charge(&bytes)))
            .verdict
            .is_admitted()
    }
}

/// Any store through its trait object: the answer as a future, taken when it is ready.
impl Limiter for Tollgate<dyn Store> {
    #[inline]
    fn decide(&self, key: u64) -> bool {
        let bytes = key.to_le_bytes();
        match self.store.apply_one(&self.charge(&bytes)).into_ready() {
            Ok(Ok(outcome)) => black_box(outcome).verdict.is_admitted(),
            _ => unreachable!("the memory store answers at once"),
        }
    }
}

/// A `MemoryStore` read the way governor's keyed limiter is: allowed or not. The decision is the
/// same as [`Tollgate`]'s; only the verdict is read, so the compiler leaves out what computes the
/// rest of the outcome (units left, balance, waits), as governor computes a denial's wait only
/// when its caller asks. A limiter of its own, for binaries of their own: a second caller of the
/// store's decision in one binary changes what the compiler inlines into the first.
pub(crate) struct TollgateVerdict(pub(crate) Tollgate<MemoryStore>);

impl TollgateVerdict {
    /// A memory store deciding the limits of the `denied` or allowed path.
    pub(crate) fn new(denied: bool) -> Self {
        TollgateVerdict(Tollgate::new(Box::new(MemoryStore::new()), denied))
    }
}

impl Limiter for TollgateVerdict {
    #[inline]
    fn decide(&self, key: u64) -> bool {
        let bytes = key.to_le_bytes();
        self.0
            .store
            .decide(&self.0.charge(&bytes))
            .verdict
            .is_admitted()
    }
}

/// governor's keyed limiter (DashMap), deciding with `check_key`. `S` is the map's hasher: std's
/// SipHash by default (what `RateLimiter::dashmap` builds), or foldhash's, the hasher tollgate's
/// memory store uses, so that the comparison measures the limiters rather than their hashers.
pub(crate) struct Governor<S = governor::state::keyed::DefaultHasher>(
    DefaultKeyedRateLimiter<u64, governor::middleware::NoOpMiddleware, S>,
)
where
    S: BuildHasher + Clone;

/// governor's keyed limiter with foldhash's seeded hasher (`dashmap_with_hasher`), the hasher of
/// tollgate's memory store.
pub(crate) type GovernorFoldhash = Governor<foldhash::fast::RandomState>;

/// The same limits as [`Tollgate::new`]: a burst that never runs out, or one per hour.
fn quota(denied: bool) -> Quota {
    if denied {
        Quota::per_hour(NonZeroU32::MIN)
    } else {
        Quota::per_second(NonZeroU32::MIN).allow_burst(NonZeroU32::MAX)
    }
}

impl Governor {
    /// governor as `RateLimiter::dashmap` builds it (SipHash), with the limits of the `denied` or
    /// allowed path.
    pub(crate) fn new(denied: bool) -> Self {
        Governor(RateLimiter::dashmap(quota(denied)))
    }
}

impl GovernorFoldhash {
    /// governor keyed through foldhash, with the limits of the `denied` or allowed path.
    pub(crate) fn with_foldhash(denied: bool) -> Self {
        Governor(RateLimiter::dashmap_with_hasher(
            quota(denied),
            foldhash::fast::RandomState::default(),
        ))
    }
}

impl<S: BuildHasher + Clone + Sync + Send> Limiter for Governor<S> {
    #[inline]
    fn decide(&self, key: u64) -> bool {
        black_box(self.0.check_key(&key)).is_ok()
    }
}

/// governor's keyed limiter through foldhash with the middleware tower_governor's `use_headers()`
/// installs (`StateInformationMiddleware`), read as that layer reads it: an allowed decision's
/// quota and units left (`x-ratelimit-limit`, `x-ratelimit-remaining`), a denial's quota and wait
/// from now (`x-ratelimit-after`, `retry-after`; governor reads its clock again for it).
pub(crate) struct GovernorFields(
    governor::RateLimiter<
        u64,
        governor::state::keyed::DashMapStateStore<u64, foldhash::fast::RandomState>,
        governor::clock::QuantaClock,
        governor::middleware::StateInformationMiddleware,
    >,
);

impl GovernorFields {
    /// With the limits of the `denied` or allowed path.
    pub(crate) fn new(denied: bool) -> Self {
        GovernorFields(
            RateLimiter::dashmap_with_hasher(quota(denied), foldhash::fast::RandomState::default())
                .with_middleware::<governor::middleware::StateInformationMiddleware>(),
        )
    }
}

impl Limiter for GovernorFields {
    #[inline]
    fn decide(&self, key: u64) -> bool {
        use governor::clock::Clock;
        match self.0.check_key(&key) {
            Ok(snapshot) => {
                black_box((
                    snapshot.quota().burst_size().get(),
                    snapshot.remaining_burst_capacity(),
                ));
                true
            }
            Err(not_until) => {
                black_box((
                    not_until.quota().burst_size().get(),
                    not_until.wait_time_from(self.0.clock().now()),
                ));
                false
            }
        }
    }
}

/// A `MemoryStore` read as tollgate's layer reads an outcome for its fields: the verdict, the
/// units left and the time to the next unit (`RateLimit`; the limit too, as the legacy
/// `X-RateLimit-Limit` does), and a denial's wait (`Retry-After`).
pub(crate) struct TollgateFields(pub(crate) Tollgate<MemoryStore>);

impl Limiter for TollgateFields {
    #[inline]
    fn decide(&self, key: u64) -> bool {
        let bytes = key.to_le_bytes();
        let outcome = self.0.store.decide(&self.0.charge(&bytes));
        match outcome.retry_after() {
            None => {
                black_box((outcome.limit, outcome.remaining, outcome.next_unit_in));
                true
            }
            Some(wait) => {
                black_box((wait, outcome.remaining, outcome.next_unit_in));
                false
            }
        }
    }
}

/// `count` distinct pseudo-random keys (splitmix64), the same on every run.
pub(crate) fn keys(count: usize) -> Vec<u64> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let keys: Vec<u64> = (0..count)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        })
        .collect();
    let mut distinct = keys.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), count);
    keys
}

/// The instruction-counting examples' scenario from their arguments: the keys (`hot`: one key,
/// `100k`: 100,000), whether the path is `denied` (or `allowed`), and the number of decisions;
/// `None` for anything else.
pub(crate) fn scenario(keyset: &str, path: &str, decisions: &str) -> Option<(Vec<u64>, bool, u64)> {
    let keys = match keyset {
        "hot" => vec![0x5eed_u64],
        "100k" => keys(100_000),
        _ => return None,
    };
    let denied = match path {
        "allowed" => false,
        "denied" => true,
        _ => return None,
    };
    Some((keys, denied, decisions.parse().ok()?))
}
