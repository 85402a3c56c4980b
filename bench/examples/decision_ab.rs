//! `MemoryStore` called through `&dyn Store` against governor's keyed limiter,
//! alternating in short rounds: the scenarios of `bench/benches/store.rs`, measured so that a noisy
//! machine cannot favour either side.
//!
//! ```text
//! cargo run --release -p tollgate-bench --example decision_ab -- [ROUNDS] [FILTER] [PAIR]
//! ```
//!
//! PAIR picks the two sides: `dyn` (the default, described below) or `typed_foldhash`: the
//! `MemoryStore` called by its type, as the middleware and `bench/benches/store.rs` call it,
//! against governor built with tollgate's hasher (foldhash, `dashmap_with_hasher`), so that
//! neither the call nor the hasher is what the ratio measures.
//!
//! Criterion measures one implementation for seconds, then the other; on a virtual machine whose
//! speed changes under it, or beside a build, that alone can move a result by half. Here every
//! round runs tollgate and governor back to back for 400,000 decisions each (in alternating order),
//! and each scenario prints the median of its rounds (default 30) in nanoseconds per decision, and
//! the median of the per-round ratios: below 1 is faster than governor. Scenario names work as in
//! `bench/benches/store.rs`; FILTER keeps the scenarios whose name contains it (e.g. `hot`, `2t`).
//!
//! Tollgate's store is called through `&dyn Store`, as the middleware calls any store but the
//! memory store (a store wrapping it, say), so its decision is one call. The middleware calls a
//! `MemoryStore` by its type, as `bench/benches/store.rs` does, where the compiler may inline the whole
//! decision into the caller, as it does with governor's generic `check_key` (inlined here too).

use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

use tollgate::store::Store;
use tollgate::MemoryStore;

#[path = "../benches/support/peers.rs"]
mod peers;
use peers::{keys, Governor, GovernorFoldhash, Limiter, Tollgate};

/// Decisions per implementation per round (split between the threads).
const DECISIONS: u64 = 400_000;

fn cycle(limiter: &impl Limiter, keys: &[u64], start: usize, decisions: u64) {
    let mut i = start;
    for _ in 0..decisions {
        black_box(limiter.decide(black_box(keys[i])));
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
}

/// Nanoseconds per decision of one thread, or wall time per decision of each of two threads
/// deciding at once (as in the bench). Generic, as in the bench, so each implementation's
/// decision is compiled into its own loop.
fn measure(limiter: &impl Limiter, keys: &[u64], threads: usize) -> f64 {
    let decisions = DECISIONS / threads as u64;
    let start = if threads == 1 {
        let start = Instant::now();
        cycle(limiter, keys, 0, decisions);
        start
    } else {
        let barrier = Barrier::new(threads + 1);
        std::thread::scope(|scope| {
            for t in 0..threads {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    cycle(limiter, keys, t * keys.len() / threads, decisions);
                });
            }
            barrier.wait();
            Instant::now()
        })
    };
    start.elapsed().as_nanos() as f64 / decisions as f64
}

/// Tracks every key, and checks the path: the first decision spends a fresh key's unit, and the
/// second is refused on the denied path.
fn check(limiter: &impl Limiter, keys: &[u64], denied: bool) {
    for &key in keys {
        assert!(limiter.decide(key), "a fresh key must be allowed");
        assert_eq!(limiter.decide(key), !denied);
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args
        .next()
        .map(|n| n.parse().expect("ROUNDS must be a number"))
        .unwrap_or(30)
        .max(1);
    let filter = args.next().unwrap_or_default();
    let typed = match args.next().as_deref() {
        None | Some("dyn") => false,
        Some("typed_foldhash") => true,
        Some(other) => panic!("PAIR must be `dyn` or `typed_foldhash`, not {other:?}"),
    };
    let peer = if typed {
        "governor_foldhash"
    } else {
        "governor"
    };
    println!("scenario              tollgate  {peer}   ratio");
    for (keyset, keys) in [("hot_key", vec![0x5eed_u64]), ("100k_keys", keys(100_000))] {
        for denied in [false, true] {
            // The bench's limits: a burst that never runs out, or one per hour already spent.
            if typed {
                let tollgate = Tollgate::<MemoryStore>::new(Box::new(MemoryStore::new()), denied);
                let governor = GovernorFoldhash::with_foldhash(denied);
                compare(&tollgate, &governor, keyset, &keys, denied, rounds, &filter);
            } else {
                let tollgate = Tollgate::<dyn Store>::new(Box::new(MemoryStore::new()), denied);
                let governor = Governor::new(denied);
                compare(&tollgate, &governor, keyset, &keys, denied, rounds, &filter);
            }
        }
    }
}

/// One scenario's rounds, one and two threads: each round runs both sides back to back, in
/// alternating order; prints the medians and the median of the per-round ratios.
fn compare(
    tollgate: &impl Limiter,
    governor: &impl Limiter,
    keyset: &str,
    keys: &[u64],
    denied: bool,
    rounds: usize,
    filter: &str,
) {
    check(tollgate, keys, denied);
    check(governor, keys, denied);
    for threads in [1, 2] {
        let path = if denied { "denied" } else { "allowed" };
        let name = format!("{keyset}/{path}/{threads}t");
        if !name.contains(filter) {
            continue;
        }
        let (mut ours, mut theirs, mut ratios) = (vec![], vec![], vec![]);
        for round in 0..rounds {
            let (t, g) = if round % 2 == 0 {
                let t = measure(tollgate, keys, threads);
                (t, measure(governor, keys, threads))
            } else {
                let g = measure(governor, keys, threads);
                (measure(tollgate, keys, threads), g)
            };
            ours.push(t);
            theirs.push(g);
            ratios.push(t / g);
        }
        let (t, g, r) = (median(ours), median(theirs), median(ratios));
        println!("{name:20} {t:9.1} {g:9.1} {r:7.3}");
    }
}
