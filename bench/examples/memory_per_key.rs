//! Memory per tracked key: tollgate's `MemoryStore` or governor's keyed limiter, one per process.
//!
//! ```text
//! cargo run --release -p tollgate-bench --example memory_per_key -- tollgate|governor [N]
//! ```
//!
//! Reads the resident set size from `/proc/self/statm` (Linux only), makes one allowed decision
//! for each of `N` distinct `u64` keys (default one million) under a token bucket of 1000 per day
//! — a fresh key's first request always passes, and the unit it spends takes 86.4 s to come back,
//! so no state becomes idle (and sweepable) during the run — and prints the growth of the resident
//! set divided by `N`. Keys are generated on the fly, so no key list is counted.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::{Quota, RateLimiter};
use tollgate::algorithm::{Algorithm, TokenBucket};
use tollgate::store::{Charge, RuleName, Store};
use tollgate::MemoryStore;

/// 1000 per day: one unit refills in 86.4 s, longer than the run.
const PER_DAY: u32 = 1_000;

/// Resident set size in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm (Linux)");
    let resident: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|pages| pages.parse().ok())
        .expect("resident pages in /proc/self/statm");
    resident * page_size()
}

/// The page size statm counts in, from `/proc/self/smaps`; 4 KiB if it cannot be read.
fn page_size() -> u64 {
    std::fs::read_to_string("/proc/self/smaps")
        .ok()
        .and_then(|smaps| {
            smaps.lines().find_map(|line| {
                let kib = line.strip_prefix("KernelPageSize:")?;
                kib.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
            })
        })
        .map_or(4096, |kib| kib * 1024)
}

/// The `i`-th key: distinct for distinct `i` (splitmix64 is a bijection).
fn key(i: u64) -> u64 {
    let mut z = i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn tollgate(n: u64) -> (u64, u64) {
    // Twice the keys as the bound: keys do not spread perfectly evenly over the shards, and no
    // shard may reach its share of the bound (it would evict).
    let max_keys = usize::try_from(n.saturating_mul(2)).unwrap_or(usize::MAX);
    let store = MemoryStore::builder().max_keys(max_keys).build();
    let algorithm = Algorithm::TokenBucket(TokenBucket::new(
        u64::from(PER_DAY),
        Duration::from_secs(86_400),
    ));
    let rule = RuleName::new("bench");
    let before = rss();
    for i in 0..n {
        let bytes = key(i).to_le_bytes();
        let charge = Charge::new(rule, &algorithm, &bytes, 1);
        let outcomes = match store.apply(std::slice::from_ref(&charge)).into_ready() {
            Ok(Ok(outcomes)) => outcomes,
            _ => unreachable!("the memory store answers at once"),
        };
        assert!(outcomes[0].verdict.is_admitted(), "key {i} was denied");
    }
    let after = rss();
    assert_eq!(store.len() as u64, n, "every key must still be tracked");
    black_box(&store);
    (before, after)
}

fn governor(n: u64) -> (u64, u64) {
    let quota = Quota::with_period(Duration::from_secs(86_400) / PER_DAY)
        .expect("non-zero period")
        .allow_burst(NonZeroU32::new(PER_DAY).expect("non-zero burst"));
    let limiter = RateLimiter::<u64, _, _>::dashmap(quota);
    let before = rss();
    for i in 0..n {
        assert!(limiter.check_key(&key(i)).is_ok(), "key {i} was denied");
    }
    let after = rss();
    assert_eq!(limiter.len() as u64, n, "every key must still be tracked");
    black_box(&limiter);
    (before, after)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_default();
    let n: u64 = args
        .next()
        .map(|n| n.parse().expect("N must be a number"))
        .unwrap_or(1_000_000);
    let (before, after) = match which.as_str() {
        "tollgate" => tollgate(n),
        "governor" => governor(n),
        _ => {
            eprintln!("usage: memory_per_key tollgate|governor [N]");
            std::process::exit(2);
        }
    };
    let grown = after.saturating_sub(before);
    println!(
        "{which}: {n} keys, RSS {:.1} MiB -> {:.1} MiB, {:.1} bytes/key",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        grown as f64 / n as f64,
    );
}
