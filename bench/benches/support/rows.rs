//! The store benchmarks' scenarios, shared by `benches/store.rs` and `benches/verdict.rs`: each
//! builds its limiters and measures them here, row by row, in groups named alike.
//!
//! - `hot_key`: every decision on the same key; `100k_keys`: cycling through 100 000 random keys,
//!   all tracked before the measurement starts.
//! - `allowed`: a burst of `u32::MAX` refilling one unit per second, so nothing is denied and every
//!   key stays tracked (a state whose bucket is full again is idle, and tollgate drops idle states
//!   as its tables grow: with `u32::MAX` *per second* every state would be idle a microsecond after
//!   its charge, and the 100k-key scenario would measure re-inserting swept keys instead of
//!   looking them up). `denied`: one per hour, already spent, so every decision is a refusal.
//! - `1_thread`: the time of one decision. `2_threads_wall_per_decision`: two threads decide at
//!   the same time, each `iters` times; the reported time is the wall-clock time divided by the
//!   decisions of one thread, i.e. what one decision takes while another thread hammers the same
//!   limiter (the aggregate throughput is twice the reciprocal).

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion};

use super::peers::{keys, Governor, GovernorFoldhash, Limiter};

/// The keys of the `100k_keys` scenario.
const KEYS: usize = 100_000;

pub(crate) fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(40)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Allowed,
    Denied,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Allowed => "allowed",
            Path::Denied => "denied",
        }
    }

    fn denied(self) -> bool {
        self == Path::Denied
    }
}

/// Tracks every key before measuring, and checks the path: on the denied path the first decision
/// spends the key's only unit and the second must be refused.
fn prepare(limiter: &impl Limiter, keys: &[u64], path: Path) {
    for &key in keys {
        let first = limiter.decide(key);
        assert!(first, "a fresh key must be allowed");
        assert_eq!(limiter.decide(key), path == Path::Allowed);
    }
}

/// Decisions for keys `keys[start..]`, cycling, `iters` times.
#[inline]
fn cycle(limiter: &impl Limiter, keys: &[u64], start: usize, iters: u64) {
    let mut i = start;
    for _ in 0..iters {
        black_box(limiter.decide(black_box(keys[i])));
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
}

/// Wall-clock time of two threads each making `iters` decisions at once.
fn two_threads(limiter: &impl Limiter, keys: &[u64], iters: u64) -> Duration {
    let barrier = Barrier::new(3);
    std::thread::scope(|scope| {
        for t in 0..2 {
            let barrier = &barrier;
            scope.spawn(move || {
                barrier.wait();
                // Start the two threads half the key set apart.
                cycle(limiter, keys, t * keys.len() / 2, iters);
            });
        }
        barrier.wait();
        let start = Instant::now();
        // Leaving the scope joins both threads.
        start
    })
    .elapsed()
}

/// One limiter's row in a one-thread group.
fn one_thread(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    limiter: &impl Limiter,
    keys: &[u64],
) {
    group.bench_function(BenchmarkId::from_parameter(name), |b| {
        let mut i = 0;
        b.iter(|| {
            let allowed = limiter.decide(keys[i]);
            i += 1;
            if i == keys.len() {
                i = 0;
            }
            allowed
        })
    });
}

/// One limiter's row in a two-thread group.
fn two_thread(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    limiter: &impl Limiter,
    keys: &[u64],
) {
    group.bench_function(BenchmarkId::from_parameter(name), |b| {
        b.iter_custom(|iters| two_threads(limiter, keys, iters))
    });
}

/// Every scenario, each measuring tollgate's limiter (`name`, built by `tollgate` for the denied
/// or allowed path) beside governor with SipHash and with foldhash, one group per scenario and
/// thread count, named `{bench}/{keys}/{path}/{threads}`.
pub(crate) fn every_scenario<T: Limiter>(
    c: &mut Criterion,
    bench: &str,
    name: &str,
    tollgate: impl Fn(bool) -> T,
) {
    let hot = [0x5eed_u64];
    let many = keys(KEYS);
    for (keyset, keys) in [("hot_key", &hot[..]), ("100k_keys", &many[..])] {
        for path in [Path::Allowed, Path::Denied] {
            scenario(c, bench, keyset, keys, path, name, &tollgate(path.denied()));
        }
    }
}

fn scenario(
    c: &mut Criterion,
    bench: &str,
    keyset: &str,
    keys: &[u64],
    path: Path,
    name: &str,
    tollgate: &impl Limiter,
) {
    let governor = Governor::new(path.denied());
    let governor_foldhash = GovernorFoldhash::with_foldhash(path.denied());
    prepare(tollgate, keys, path);
    prepare(&governor, keys, path);
    prepare(&governor_foldhash, keys, path);

    let mut group = c.benchmark_group(format!("{bench}/{keyset}/{}/1_thread", path.name()));
    one_thread(&mut group, name, tollgate, keys);
    one_thread(&mut group, "governor", &governor, keys);
    one_thread(&mut group, "governor_foldhash", &governor_foldhash, keys);
    group.finish();

    let mut group = c.benchmark_group(format!(
        "{bench}/{keyset}/{}/2_threads_wall_per_decision",
        path.name()
    ));
    two_thread(&mut group, name, tollgate, keys);
    two_thread(&mut group, "governor", &governor, keys);
    two_thread(&mut group, "governor_foldhash", &governor_foldhash, keys);
    group.finish();

    // Still on the same path after all the decisions (buckets only drain here, so an allowed
    // decision now means every earlier one was allowed too).
    for limiter in [tollgate as &dyn Limiter, &governor, &governor_foldhash] {
        assert_eq!(limiter.decide(keys[0]), path == Path::Allowed);
    }
}
