use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::*;
use crate::algorithm::{
    FixedWindow, Mode, SlidingLog, SlidingWindow, TokenBucket, Verdict, WindowStart,
};
use crate::clock::ManualClock;

const SECOND: Duration = Duration::from_secs(1);

fn bucket(rate: u64, period: Duration) -> Algorithm {
    Algorithm::TokenBucket(TokenBucket::new(rate, period))
}

fn store_at(clock: &ManualClock) -> MemoryStore {
    MemoryStore::builder().clock(clock.clone()).build()
}

fn charge<'a>(rule: &'a str, algorithm: &'a Algorithm, key: &'a [u8], cost: u64) -> Charge<'a> {
    Charge {
        rule: RuleName::new(rule),
        algorithm,
        key,
        cost,
        mode: Mode::Charge,
        penalty: None,
        lease: None,
        read_overrides: false,
    }
}

fn apply(store: &MemoryStore, batch: &[Charge<'_>]) -> Outcomes {
    match store.apply(batch).into_ready() {
        Ok(Ok(outcomes)) => outcomes,
        _ => panic!("the memory store always answers at once"),
    }
}

fn admitted(store: &MemoryStore, batch: &[Charge<'_>]) -> bool {
    apply(store, batch).iter().all(|o| o.verdict.is_admitted())
}

#[test]
fn token_bucket_exact_numbers_through_the_store() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = store_at(&clock);
    let limit = bucket(10, SECOND);
    for left in (0..10).rev() {
        let out = apply(&store, &[charge("r", &limit, b"k", 1)]);
        assert_eq!(out[0].verdict, Verdict::Allowed);
        assert_eq!(out[0].remaining, left);
    }
    let denied = apply(&store, &[charge("r", &limit, b"k", 1)]);
    assert_eq!(
        denied[0].verdict,
        Verdict::Denied {
            retry_after: Duration::from_millis(100)
        }
    );
    clock.advance(Duration::from_millis(100));
    assert!(admitted(&store, &[charge("r", &limit, b"k", 1)]));
    // Another key and another rule with the same key are independent.
    assert_eq!(
        apply(&store, &[charge("r", &limit, b"other", 1)])[0].remaining,
        9
    );
    assert_eq!(
        apply(&store, &[charge("r2", &limit, b"k", 1)])[0].remaining,
        9
    );
}

#[test]
fn a_batch_is_all_or_nothing() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = store_at(&clock);
    let roomy = bucket(100, SECOND);
    let tight = bucket(2, SECOND);
    let batch = [
        charge("roomy", &roomy, b"k", 1),
        charge("tight", &tight, b"k", 1),
    ];
    assert!(admitted(&store, &batch));
    assert!(admitted(&store, &batch));
    let out = apply(&store, &batch);
    assert!(out[0].verdict.is_admitted(), "roomy alone would pass");
    assert!(!out[1].verdict.is_admitted(), "tight is empty");
    // Nothing was charged by the denied batch: roomy still has 98, and says so.
    assert_eq!(out[0].remaining, 98);
    assert_eq!(
        apply(&store, &[charge("roomy", &roomy, b"k", 0)])[0].remaining,
        98
    );
}

#[test]
fn check_mode_charges_nothing() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = store_at(&clock);
    let limit = bucket(3, SECOND);
    let peek = Charge {
        mode: Mode::Check,
        penalty: None,
        ..charge("r", &limit, b"k", 2)
    };
    for _ in 0..5 {
        assert_eq!(apply(&store, &[peek])[0].remaining, 1);
    }
    assert!(store.is_empty(), "checks never create state");
}

#[test]
fn refund_and_reset() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = store_at(&clock);
    let limit = bucket(5, Duration::from_secs(60));
    let window = Algorithm::FixedWindow(FixedWindow::new(5, Duration::from_secs(60)));
    for algorithm in [&limit, &window] {
        assert!(admitted(&store, &[charge("r", algorithm, b"k", 5)]));
        assert!(!admitted(&store, &[charge("r", algorithm, b"k", 1)]));
        let refund = charge("r", algorithm, b"k", 2);
        assert!(store.refund(&refund).into_ready().is_ok());
        assert_eq!(
            apply(&store, &[charge("r", algorithm, b"k", 0)])[0].remaining,
            2
        );
        // Refunds never lift a key above its capacity.
        let big = charge("r", algorithm, b"k", 100);
        assert!(store.refund(&big).into_ready().is_ok());
        assert_eq!(
            apply(&store, &[charge("r", algorithm, b"k", 0)])[0].remaining,
            5
        );
        assert!(admitted(&store, &[charge("r", algorithm, b"k", 5)]));
        assert!(store.reset("r", algorithm, b"k").into_ready().is_ok());
        assert_eq!(
            apply(&store, &[charge("r", algorithm, b"k", 0)])[0].remaining,
            5
        );
    }
}

#[test]
fn every_algorithm_runs_through_the_store() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = store_at(&clock);
    let algorithms = [
        bucket(4, SECOND),
        Algorithm::FixedWindow(
            FixedWindow::new(4, SECOND).with_start(WindowStart::Aligned(Duration::ZERO)),
        ),
        Algorithm::SlidingWindow(
            SlidingWindow::new(4, SECOND).with_start(WindowStart::Aligned(Duration::ZERO)),
        ),
        Algorithm::SlidingLog(SlidingLog::new(4, SECOND)),
        Algorithm::BurstPool(crate::algorithm::BurstPool::new(
            TokenBucket::new(2, SECOND),
            TokenBucket::new(1, SECOND).with_capacity(2),
        )),
    ];
    for (i, algorithm) in algorithms.iter().enumerate() {
        let rule = format!("rule-{i}");
        let passed = (0..10)
            .filter(|_| admitted(&store, &[charge(&rule, algorithm, b"k", 1)]))
            .count();
        assert_eq!(
            passed, 4,
            "{algorithm:?} admits its capacity at one instant"
        );
        clock.advance(Duration::from_secs(2));
        assert!(
            admitted(&store, &[charge(&rule, algorithm, b"k", 1)]),
            "{algorithm:?} refills"
        );
    }
}

#[test]
fn per_key_window_starts_are_the_same_for_every_store() {
    // Two stores (two app instances) derive the same window for a key from (rule, key) alone.
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let a = store_at(&clock);
    let b = store_at(&clock);
    let window = Algorithm::FixedWindow(FixedWindow::new(1, Duration::from_secs(60)));
    assert!(admitted(&a, &[charge("w", &window, b"user-7", 1)]));
    assert!(admitted(&b, &[charge("w", &window, b"user-7", 1)]));
    let ra = apply(&a, &[charge("w", &window, b"user-7", 1)])[0].verdict;
    let rb = apply(&b, &[charge("w", &window, b"user-7", 1)])[0].verdict;
    assert_eq!(ra, rb);
    assert!(!ra.is_admitted());
}

#[test]
fn threads_hammering_one_key_admit_exactly_the_capacity() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = store_at(&clock);
    let limit = bucket(1_000, Duration::from_secs(3_600));
    let passed = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..500 {
                    if admitted(&store, &[charge("r", &limit, b"hot", 1)]) {
                        passed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(passed.into_inner(), 1_000);
}

#[test]
fn concurrent_batches_never_over_admit_any_rule() {
    let store = two_shards();
    let a = bucket(50, Duration::from_secs(3_600));
    let b = Algorithm::FixedWindow(FixedWindow::new(30, Duration::from_secs(3_600)));
    let passed = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let (a, b, passed, store) = (&a, &b, &passed, &store);
            s.spawn(move || {
                for i in 0..200u32 {
                    // Half the threads list the rules in the other order: lock order must not matter.
                    let (first, second) = (charge("a", a, b"k", 1), charge("b", b, b"k", 1));
                    let batch = if (t + i as u8) % 2 == 0 {
                        [first, second]
                    } else {
                        [second, first]
                    };
                    if admitted(store, &batch) {
                        passed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(passed.into_inner(), 30);
    assert_eq!(apply(&store, &[charge("a", &a, b"k", 0)])[0].remaining, 20);
}

#[test]
fn single_charges_and_batches_on_shared_keys_stay_exact() {
    // Single charges take the one-key fast path and batches the ordered multi-shard path; on the
    // same keys they must still be atomic with respect to each other.
    let store = two_shards();
    let a = bucket(50, Duration::from_secs(3_600));
    let b = Algorithm::FixedWindow(FixedWindow::new(30, Duration::from_secs(3_600)));
    let c = bucket(40, Duration::from_secs(3_600));
    let (batches, singles) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let (a, b, c, store) = (&a, &b, &c, &store);
            let (batches, singles) = (&batches, &singles);
            s.spawn(move || {
                for _ in 0..300 {
                    if t % 2 == 0 {
                        let batch = [
                            charge("a", a, b"k", 1),
                            charge("b", b, b"k", 1),
                            charge("c", c, b"k", 1),
                        ];
                        if admitted(store, &batch) {
                            batches.fetch_add(1, Ordering::Relaxed);
                        }
                    } else if admitted(store, &[charge("a", a, b"k", 1)]) {
                        singles.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let (batches, singles) = (batches.into_inner(), singles.into_inner());
    // Singles drain `a` whatever happens, so `a` ends empty and every unit of it is accounted for
    // by exactly one admitted charge; a batch is charged to all three rules or to none.
    assert_eq!(batches + singles, 50);
    assert!(batches <= 30);
    let peek = |rule, algorithm| apply(&store, &[charge(rule, algorithm, b"k", 0)])[0].remaining;
    assert_eq!(peek("a", &a), 0);
    assert_eq!(peek("b", &b), 30 - batches);
    assert_eq!(peek("c", &c), 40 - batches);
}

#[test]
fn idle_keys_are_dropped_as_the_table_grows() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(1)
        .build();
    let limit = bucket(10, SECOND);
    for i in 0..1_000u32 {
        assert!(admitted(
            &store,
            &[charge("r", &limit, &i.to_le_bytes(), 1)]
        ));
    }
    assert_eq!(store.len(), 1_000);
    // One unit refills in 100 ms: after that every key is as good as new.
    clock.advance(Duration::from_millis(100));
    for i in 1_000..2_100u32 {
        assert!(admitted(
            &store,
            &[charge("r", &limit, &i.to_le_bytes(), 1)]
        ));
    }
    assert!(
        store.len() < 2_000,
        "idle keys were swept ({} tracked)",
        store.len()
    );
}

#[test]
fn idle_keys_are_swept_by_the_refill_time_of_the_limit_that_wrote_them() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(1)
        .build();
    // One unit refills in 100 ms under the first rule, in 6 s under the second.
    let (fast, slow) = (bucket(10, SECOND), bucket(10, Duration::from_secs(60)));
    for i in 0..1_000u32 {
        let (rule, limit) = if i % 2 == 0 {
            ("fast", &fast)
        } else {
            ("slow", &slow)
        };
        assert!(admitted(
            &store,
            &[charge(rule, limit, &i.to_le_bytes(), 1)]
        ));
    }
    clock.advance(Duration::from_millis(100));
    for i in 1_000..2_100u32 {
        assert!(admitted(
            &store,
            &[charge("fast", &fast, &i.to_le_bytes(), 1)]
        ));
    }
    assert!(store.len() < 2_000, "{} tracked", store.len());
    // The slow rule's keys were kept: each still misses its unit.
    for i in (1..1_000u32).step_by(2) {
        let out = apply(&store, &[charge("slow", &slow, &i.to_le_bytes(), 1)]);
        assert_eq!(out[0].remaining, 8, "key {i}");
    }
}

#[test]
fn a_smaller_capacity_leaves_what_fits_through_the_store() {
    // A capacity that changes: 10 a minute, 40 of 100 left, then a capacity of 20: 20 at once, on the
    // single-charge path and in a batch.
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = store_at(&clock);
    let minute = Duration::from_secs(60);
    let plan = Algorithm::TokenBucket(TokenBucket::new(10, minute).with_capacity(100));
    let small = Algorithm::TokenBucket(TokenBucket::new(10, minute).with_capacity(20));
    let large = Algorithm::TokenBucket(TokenBucket::new(10, minute).with_capacity(200));
    let other = bucket(1, SECOND);
    for key in [b"single", b"batch_"] {
        assert_eq!(
            apply(&store, &[charge("r", &plan, key, 60)])[0].remaining,
            40
        );
        assert_eq!(
            apply(&store, &[charge("r", &large, key, 0)])[0].remaining,
            40
        );
    }
    for left in (0..20).rev() {
        let one = apply(&store, &[charge("r", &small, b"single", 1)]);
        assert_eq!((one[0].verdict, one[0].remaining), (Verdict::Allowed, left));
        let batch = [
            charge("r", &small, b"batch_", 1),
            charge("o", &other, b"k", 0),
        ];
        let both = apply(&store, &batch);
        assert_eq!(
            (both[0].verdict, both[0].remaining),
            (Verdict::Allowed, left)
        );
    }
    assert!(!admitted(&store, &[charge("r", &small, b"single", 1)]));
}

#[test]
fn a_flood_of_new_keys_stays_within_the_bound() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(4)
        .max_keys(1_000)
        .build();
    let limit = bucket(10, Duration::from_secs(3_600));
    // A key held back hard: it owes a full hour of refill.
    assert!(admitted(&store, &[charge("r", &limit, b"abuser", 10)]));
    for i in 0..100_000u32 {
        apply(&store, &[charge("r", &limit, &i.to_le_bytes(), 1)]);
        assert!(store.len() <= 1_000);
    }
    // The flood evicted keys that were nearly idle, not the one being held back.
    assert!(!admitted(&store, &[charge("r", &limit, b"abuser", 1)]));
}

#[test]
fn a_rule_that_changes_algorithm_starts_over() {
    let clock = ManualClock::new(Duration::from_secs(1_000));
    let store = store_at(&clock);
    let window = Algorithm::FixedWindow(FixedWindow::new(2, Duration::from_secs(60)));
    let log = Algorithm::SlidingLog(SlidingLog::new(3, Duration::from_secs(60)));
    assert!(admitted(&store, &[charge("r", &window, b"k", 2)]));
    assert!(!admitted(&store, &[charge("r", &window, b"k", 1)]));
    assert_eq!(apply(&store, &[charge("r", &log, b"k", 1)])[0].remaining, 2);
}

mod single_charge_fast_path {
    use proptest::prelude::*;

    use super::*;
    use crate::algorithm::{BurstPool, ReserveBound};

    pub(super) fn algorithms() -> Vec<Algorithm> {
        vec![
            bucket(3, SECOND),
            Algorithm::TokenBucket(TokenBucket::new(2, SECOND).with_capacity(5).with_initial(1)),
            Algorithm::FixedWindow(FixedWindow::new(3, SECOND).with_capacity(5)),
            Algorithm::SlidingWindow(SlidingWindow::new(4, SECOND)),
            Algorithm::SlidingLog(SlidingLog::new(3, SECOND)),
            Algorithm::BurstPool(BurstPool::new(
                TokenBucket::new(2, SECOND),
                TokenBucket::new(3, Duration::from_secs(10)),
            )),
        ]
    }

    fn mode(pick: u8) -> Mode {
        match pick % 4 {
            0 | 1 => Mode::Charge,
            2 => Mode::Check,
            _ => Mode::Reserve(ReserveBound {
                max_units: Some(4),
                max_wait: None,
            }),
        }
    }

    proptest! {
        /// A batch of one charge goes through `apply_one`; the general path must decide it the
        /// same way, call after call, for every algorithm and mode.
        #[test]
        fn decides_like_the_general_path(
            steps in proptest::collection::vec(
                (0usize..6, 0u8..3, 0u64..6, 0u8..4, 0u64..700),
                1..120,
            ),
        ) {
            let algorithms = algorithms();
            let clock = ManualClock::new(Duration::from_secs(1_000));
            let fast = store_at(&clock);
            let general = store_at(&clock);
            for (algorithm, key, cost, pick, wait_ms) in steps {
                let algorithm = &algorithms[algorithm];
                let mode = mode(pick);
                let cost = cost.min(algorithm.max_cost(mode));
                let key = [b'k', key];
                let charge = Charge { rule: RuleName::new("r"), algorithm, key: &key, cost, mode, penalty: None, lease: None, read_overrides: false };
                let one = apply(&fast, std::slice::from_ref(&charge));
                let all = general.apply_batch(std::slice::from_ref(&charge));
                prop_assert_eq!(one, all);
                clock.advance(Duration::from_millis(wait_ms));
            }
        }
    }
}

#[test]
fn table_entries_are_as_small_as_the_readme_says() {
    // A token-bucket key is a `u64` hash and a `u64` entry (the moment it was empty, and its
    // span's code); the other algorithms' entries are the hash and a `Timed` state (the guide's
    // algorithms chapter: "48-byte table entry").
    assert_eq!(std::mem::size_of::<(u64, BucketEntry)>(), 16);
    assert_eq!(std::mem::size_of::<(u64, Timed)>(), 48);
}

/// A store of two shards (so that keys share shards and batches lock several), on a clock that
/// stands still.
fn two_shards() -> MemoryStore {
    MemoryStore::builder()
        .clock(ManualClock::new(Duration::from_secs(1_000)))
        .shards(2)
        .build()
}

mod a_clock_stepping_back {
    use proptest::prelude::*;

    use super::single_charge_fast_path::algorithms;
    use super::*;

    proptest! {
        /// A store whose clock sometimes steps back decides exactly like one whose clock stands
        /// still instead: for every algorithm the time in between counts as none — no request
        /// is denied early, no refill is invented, nothing panics.
        #[test]
        fn decides_as_if_the_clock_had_stood_still(
            steps in proptest::collection::vec(
                (0usize..6, 0u8..3, 0u64..6, any::<bool>(), 0u64..3_000),
                1..120,
            ),
        ) {
            let algorithms = algorithms();
            let start = Duration::from_secs(1_000);
            let (stepping, standing) = (ManualClock::new(start), ManualClock::new(start));
            let (back, still) = (store_at(&stepping), store_at(&standing));
            let (mut now, mut latest) = (start, start);
            for (algorithm, key, cost, backwards, ms) in steps {
                let algorithm = &algorithms[algorithm];
                let cost = cost.min(algorithm.max_cost(Mode::Charge));
                let key = [b'k', key];
                let charge = Charge { rule: RuleName::new("r"), algorithm, key: &key, cost, mode: Mode::Charge, penalty: None, lease: None, read_overrides: false };
                prop_assert_eq!(
                    apply(&back, std::slice::from_ref(&charge)),
                    apply(&still, std::slice::from_ref(&charge))
                );
                let by = Duration::from_millis(ms);
                now = if backwards { now.saturating_sub(by) } else { now + by };
                latest = latest.max(now);
                stepping.set(now);
                standing.set(latest);
            }
        }
    }
}

mod listing_blocks {
    use std::collections::HashSet;

    use super::*;
    use crate::store::{BlockedKey, Cursor, Page, StoreError, StoreErrorKind};

    const MINUTE: Duration = Duration::from_secs(60);

    fn ready<T>(future: StoreFuture<T>) -> Result<T, StoreError> {
        match future.into_ready() {
            Ok(result) => result,
            Err(_) => panic!("the memory store always answers at once"),
        }
    }

    fn block(store: &MemoryStore, rule: &str, key: &[u8], d: Duration) {
        let penalty = Penalty::escalating([MINUTE], 60 * MINUTE);
        ready(store.set_block(rule, &penalty, key, Some(d))).unwrap();
    }

    fn page(store: &MemoryStore, rule: &str, cursor: Option<&Cursor>) -> Page<BlockedKey> {
        ready(store.blocks(rule, cursor)).unwrap()
    }

    /// Every page of a walk, in order.
    fn walk(store: &MemoryStore, rule: &str) -> Vec<Page<BlockedKey>> {
        let mut pages = vec![page(store, rule, None)];
        while let Some(next) = pages.last().unwrap().next.clone() {
            pages.push(page(store, rule, Some(&next)));
            assert!(pages.len() < 1_000, "the walk ends");
        }
        pages
    }

    fn key(i: usize) -> Vec<u8> {
        format!("10.0.{}.{}", i / 256, i % 256).into_bytes()
    }

    #[test]
    fn a_walk_lists_each_blocked_key_of_the_rule_once_over_bounded_pages() {
        let clock = ManualClock::new(Duration::from_secs(1_000));
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .shards(4)
            .build();
        for i in 0..250 {
            block(
                &store,
                "login",
                &key(i),
                MINUTE + Duration::from_secs(i as u64),
            );
        }
        for i in 0..30 {
            block(&store, "signup", &key(i), MINUTE);
        }
        clock.advance(Duration::from_secs(10));
        let pages = walk(&store, "login");
        assert!(pages.len() >= 3, "{} pages", pages.len());
        assert!(pages.iter().all(|p| p.items.len() <= listing::PAGE));
        let mut seen = HashSet::new();
        for listed in pages.iter().flat_map(|p| &p.items) {
            let i = (0..250)
                .find(|&i| key(i) == listed.key)
                .expect("a login key");
            assert!(seen.insert(i), "key {i} listed twice");
            // By the store's clock: the block's length less the 10 s since it began.
            assert_eq!(listed.remaining, Duration::from_secs(50 + i as u64));
            assert_eq!(listed.offences, 0);
        }
        assert_eq!(seen.len(), 250);
        let signups: usize = walk(&store, "signup").iter().map(|p| p.items.len()).sum();
        assert_eq!(signups, 30);
        assert!(walk(&store, "nobody").iter().all(|p| p.items.is_empty()));
    }

    #[test]
    fn pages_hold_at_most_a_hundred_keys_and_the_last_has_no_cursor() {
        let store = MemoryStore::builder()
            .clock(ManualClock::new(Duration::from_secs(1_000)))
            .shards(1)
            .build();
        for i in 0..250 {
            block(&store, "login", &key(i), MINUTE);
        }
        let sizes: Vec<usize> = walk(&store, "login")
            .iter()
            .map(|p| p.items.len())
            .collect();
        assert_eq!(sizes, [100, 100, 50]);
        let empty = MemoryStore::new();
        assert_eq!(walk(&empty, "login").len(), 1);
    }

    #[test]
    fn keys_blocked_during_the_whole_walk_are_listed_once_whatever_changes_meanwhile() {
        let store = MemoryStore::builder()
            .clock(ManualClock::new(Duration::from_secs(1_000)))
            .shards(2)
            .build();
        for i in 0..300 {
            block(&store, "login", &key(i), MINUTE);
        }
        let penalty = Penalty::fixed(MINUTE);
        let mut listed = Vec::new();
        let mut cursor = None;
        let mut added = 1_000;
        loop {
            let page = page(&store, "login", cursor.as_ref());
            listed.extend(page.items.into_iter().map(|b| b.key));
            // Between pages: keys come and go (the stable ones are 0..200).
            for _ in 0..40 {
                block(&store, "login", &key(added), MINUTE);
                added += 1;
            }
            for i in (200..300).step_by(7) {
                ready(store.set_block("login", &penalty, &key(i), None)).unwrap();
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        let unique: HashSet<&Vec<u8>> = listed.iter().collect();
        assert_eq!(unique.len(), listed.len(), "no key listed twice");
        for i in 0..200 {
            assert!(unique.contains(&key(i)), "key {i} is listed");
        }
    }

    #[test]
    fn ended_blocks_are_not_listed_though_their_offences_are_remembered() {
        let clock = ManualClock::new(Duration::from_secs(1_000));
        let store = store_at(&clock);
        let limit = bucket(1, MINUTE);
        let penalty = Penalty::escalating([10 * SECOND, MINUTE], 60 * MINUTE);
        let offend = |key: &'static [u8]| {
            let charge = Charge {
                penalty: Some(&penalty),
                ..charge("login", &limit, key, 1)
            };
            apply(&store, &[charge]);
            apply(&store, &[charge])
        };
        // A denial blocks `short` for 10 s (its first offence).
        assert!(!offend(b"short")[0].verdict.is_admitted());
        block(&store, "login", b"long", MINUTE);
        clock.advance(5 * SECOND);
        let listed = |store: &MemoryStore| {
            let mut all: Vec<(Vec<u8>, Duration, u64)> = walk(store, "login")
                .into_iter()
                .flat_map(|p| p.items)
                .map(|b| (b.key, b.remaining, b.offences))
                .collect();
            all.sort();
            all
        };
        assert_eq!(
            listed(&store),
            [
                (b"long".to_vec(), 55 * SECOND, 0),
                (b"short".to_vec(), 5 * SECOND, 1)
            ]
        );
        clock.advance(5 * SECOND);
        assert_eq!(listed(&store), [(b"long".to_vec(), 50 * SECOND, 0)]);
        assert_eq!(ready(store.block_of("login", b"short")).unwrap(), None);
        assert_eq!(
            ready(store.block_of("login", b"long")).unwrap(),
            Some(BlockedKey::new(b"long".to_vec(), 50 * SECOND, 0))
        );
        // The offence is still counted: the next denial blocks for the second duration.
        let outcome = offend(b"short");
        assert_eq!(
            outcome[0].verdict,
            Verdict::Denied {
                retry_after: MINUTE
            }
        );
        assert_eq!(
            ready(store.block_of("login", b"short")).unwrap(),
            Some(BlockedKey::new(b"short".to_vec(), MINUTE, 2))
        );
    }

    #[test]
    fn a_long_key_is_kept_and_listed_as_its_digest() {
        let store = MemoryStore::new();
        let long = vec![b'a'; crate::key::MAX_KEY_LEN + 1];
        block(&store, "login", &long, MINUTE);
        let listed = walk(&store, "login").remove(0).items;
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].key, crate::key::KeyValue::new(&long).as_bytes());
        assert!(listed[0].key.starts_with(b"sha256:"));
    }

    #[test]
    fn a_cursor_of_another_kind_is_refused() {
        let store = MemoryStore::new();
        let error = ready(store.blocks("login", Some(&Cursor::new("r:17")))).unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::BadCursor);
    }
}
