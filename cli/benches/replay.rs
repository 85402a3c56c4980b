//! Replay speed: `combined` lines per second through one rule, on one core.
//!
//! `cargo bench -p tollgate-cli --bench replay`
//!
//! The log is built in memory (so the disk is not measured): 200,000 and 1,000,000 lines from
//! 5,000 client addresses, 50 lines per second, with a referer and a user agent like a real log
//! (`support/log.rs`; `examples/replay_log.rs` writes the same log to a file).
//!
//! Time is the bench thread's CPU time, not the wall clock: on a shared machine the wall clock
//! also counts the time other processes hold the core, which says nothing of the replay. "Lines
//! per second" below is therefore lines per CPU-second of one core.

use std::hint::black_box;
use std::io::Cursor;

use std::time::Duration;

use cpu_time::ThreadTime;
use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tollgate_cli::log::{self, FieldMap, Format};
use tollgate_cli::replay::replay;
use tollgate_cli::simulate::runner;

#[path = "support/log.rs"]
mod support;

use support::{log_text, CONFIG};

/// The CPU time of the thread that runs the bench.
struct ThreadCpu;

impl Measurement for ThreadCpu {
    type Intermediate = ThreadTime;
    type Value = Duration;

    fn start(&self) -> ThreadTime {
        ThreadTime::now()
    }
    fn end(&self, start: ThreadTime) -> Duration {
        start.elapsed()
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        // Nanoseconds, shown as the wall clock's durations and throughputs are.
        static WALL: WallTime = WallTime;
        WALL.formatter()
    }
}

fn bench(c: &mut Criterion<ThreadCpu>) {
    let mut group = c.benchmark_group("replay");
    group.sample_size(10);
    for lines in [200_000, 1_000_000] {
        let text = log_text(lines);
        group.throughput(Throughput::Elements(lines as u64));
        group.bench_function(format!("combined, one rule, {lines} lines"), |b| {
            b.iter(|| {
                let mut runners = [runner(CONFIG).expect("a valid config")];
                let mut source = log::open(
                    Format::Combined,
                    Cursor::new(&text[..]),
                    FieldMap::default(),
                );
                replay(&mut *source, &mut runners).expect("in memory");
                black_box(runners[0].tally.rules[0].allowed)
            })
        });
        if lines == 200_000 {
            group.bench_function(format!("combined, parse only, {lines} lines"), |b| {
                b.iter(|| {
                    let mut source = log::open(
                        Format::Combined,
                        Cursor::new(&text[..]),
                        FieldMap::default(),
                    );
                    // Read into one entry, as a replay reads into the places it keeps.
                    let mut entry = log::Entry::default();
                    let mut n = 0;
                    while let Some(read) = source.next_into(&mut entry) {
                        n += read.expect("in memory").is_ok() as u64;
                    }
                    black_box(n)
                })
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = bench
}
criterion_main!(benches);
