//! Decision cost of each algorithm on its own: the pure functions, no store, no lock, no clock.
//!
//! Every iteration advances a fake `now` (microseconds) and decides one charge of one unit against a
//! state kept across iterations: `evaluate`, then `commit` when the charge is admitted, which is what
//! a store does for a batch of one rule. Each algorithm is measured on the allowed path (time moves
//! fast enough that every charge fits) and on the denied path (an exhausted limit whose refill is
//! an hour away, so every charge is refused and nothing is committed).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use tollgate::algorithm::state::{
    BurstPoolState, FixedWindowState, Micros, SlidingLogState, SlidingWindowState,
};
use tollgate::algorithm::{
    BurstPool, FixedWindow, Mode, Outcome, SlidingLog, SlidingWindow, TokenBucket, WindowStart,
};

/// An arbitrary start time: 2023-11-14, in microseconds since the Unix epoch.
const START: Micros = 1_700_000_000 * 1_000_000;
/// How far `now` moves per iteration on the denied paths: far too little to refill anything.
const DENIED_STEP: Micros = 1;
const MS: Micros = 1_000;
const SEC: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3600);

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(40)
}

/// One algorithm with its mutable state, deciding one unit at `now`.
trait Decide {
    fn decide(&mut self, now: Micros) -> Outcome;
}

/// A token bucket and its state, the moment it was empty.
struct Bucket(TokenBucket, i64);

impl Decide for Bucket {
    fn decide(&mut self, now: Micros) -> Outcome {
        let outcome = self.0.evaluate(self.1, now, 1, Mode::Charge);
        if outcome.verdict.is_admitted() {
            self.1 = self.0.commit(self.1, now, 1);
        }
        outcome
    }
}

struct Fixed(FixedWindow, FixedWindowState);

impl Decide for Fixed {
    fn decide(&mut self, now: Micros) -> Outcome {
        let outcome = self.0.evaluate(self.1, now, 1, Mode::Charge);
        if outcome.verdict.is_admitted() {
            self.1 = self.0.commit(self.1, now, 1);
        }
        outcome
    }
}

struct Sliding(SlidingWindow, SlidingWindowState);

impl Decide for Sliding {
    fn decide(&mut self, now: Micros) -> Outcome {
        let outcome = self.0.evaluate(self.1, now, 1);
        if outcome.verdict.is_admitted() {
            self.1 = self.0.commit(self.1, now, 1);
        }
        outcome
    }
}

struct Log(SlidingLog, SlidingLogState);

impl Decide for Log {
    fn decide(&mut self, now: Micros) -> Outcome {
        let outcome = self.0.evaluate(&self.1, now, 1);
        if outcome.verdict.is_admitted() {
            self.0.commit(&mut self.1, now, 1);
        }
        outcome
    }
}

struct Pool(BurstPool, BurstPoolState);

impl Decide for Pool {
    fn decide(&mut self, now: Micros) -> Outcome {
        let outcome = self.0.evaluate(self.1, now, 1);
        if outcome.verdict.is_admitted() {
            self.1 = self.0.commit(self.1, now, 1);
        }
        outcome
    }
}

/// Measures `limiter`, moving `now` by `step` per decision, after checking (outside the
/// measurement) that the path really is the one named.
fn run(c: &mut Criterion, name: &str, allowed: bool, step: Micros, mut limiter: impl Decide) {
    let mut now = START;
    for _ in 0..10_000 {
        now += step;
        let outcome = limiter.decide(now);
        assert_eq!(
            outcome.verdict.is_admitted(),
            allowed,
            "{name}: unexpected verdict {outcome:?}"
        );
    }
    let path = if allowed { "allowed" } else { "denied" };
    c.bench_function(&format!("algorithm/{name}/{path}"), |b| {
        b.iter(|| {
            now += step;
            black_box(limiter.decide(black_box(now)))
        })
    });
}

fn token_bucket(c: &mut Criterion) {
    // 100/s refills a unit every 10 ms; 20 ms per step keeps the bucket full.
    let tb = TokenBucket::new(100, SEC);
    let empty_at = tb.fresh(START);
    run(c, "token_bucket", true, 20 * MS, Bucket(tb, empty_at));

    // One per hour, already spent.
    let tb = TokenBucket::new(1, HOUR);
    let empty_at = tb.commit(tb.fresh(START), START, 1);
    run(c, "token_bucket", false, DENIED_STEP, Bucket(tb, empty_at));
}

fn fixed_window(c: &mut Criterion) {
    // 100 per second, one charge every 20 ms: 50 per window.
    let fw = FixedWindow::new(100, SEC).with_start(WindowStart::Aligned(Duration::ZERO));
    let state = fw.fresh(START, 0);
    run(c, "fixed_window", true, 20 * MS, Fixed(fw, state));

    let fw = FixedWindow::new(1, HOUR).with_start(WindowStart::Aligned(Duration::ZERO));
    let state = fw.commit(fw.fresh(START, 0), START, 1);
    run(c, "fixed_window", false, DENIED_STEP, Fixed(fw, state));
}

fn sliding_window(c: &mut Criterion) {
    let sw = SlidingWindow::new(100, SEC).with_start(WindowStart::Aligned(Duration::ZERO));
    let state = sw.fresh(START, 0);
    run(c, "sliding_window", true, 20 * MS, Sliding(sw, state));

    let sw = SlidingWindow::new(1, HOUR).with_start(WindowStart::Aligned(Duration::ZERO));
    let state = sw.commit(sw.fresh(START, 0), START, 1);
    run(c, "sliding_window", false, DENIED_STEP, Sliding(sw, state));
}

fn sliding_log(c: &mut Criterion) {
    // Limit 100 per second, one charge every 11 ms: about 90 live entries in the log.
    run(
        c,
        "sliding_log_100",
        true,
        11 * MS,
        Log(SlidingLog::new(100, SEC), SlidingLogState::default()),
    );

    // Limit 100 per hour, full: 100 live entries, each denial scans them all.
    let log = SlidingLog::new(100, HOUR);
    let mut state = SlidingLogState::default();
    for i in 0..100 {
        log.commit(&mut state, START - 100 + i, 1);
    }
    run(c, "sliding_log_100", false, DENIED_STEP, Log(log, state));
}

fn burst_pool(c: &mut Criterion) {
    // A steady 10/s with a pool of 100/h; 200 ms per step is served by the steady bucket.
    let bp = BurstPool::new(TokenBucket::new(10, SEC), TokenBucket::new(100, HOUR));
    let state = bp.fresh(START);
    run(c, "burst_pool", true, 200 * MS, Pool(bp, state));

    // Both buckets one per hour and spent.
    let bp = BurstPool::new(TokenBucket::new(1, HOUR), TokenBucket::new(1, HOUR));
    let state = bp.commit(bp.commit(bp.fresh(START), START, 1), START, 1);
    run(c, "burst_pool", false, DENIED_STEP, Pool(bp, state));
}

criterion_group! {
    name = algorithms;
    config = config();
    targets = token_bucket, fixed_window, sliding_window, sliding_log, burst_pool
}
criterion_main!(algorithms);
