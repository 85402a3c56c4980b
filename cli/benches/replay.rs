//! Replay speed: `combined` lines per second through one rule, on one core.
//!
//! `cargo bench -p tollgate-cli --bench replay`
//!
//! The log is built in memory (so the disk is not measured): 200,000 lines from 5,000 client
//! addresses, 50 lines per second, with a referer and a user agent like a real log.
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

const LINES: usize = 200_000;

fn log_text() -> Vec<u8> {
    let mut text = Vec::with_capacity(LINES * 160);
    let mut rng = fastrand::Rng::with_seed(7);
    for i in 0..LINES {
        let client = rng.u32(0..5_000);
        let elapsed = i / 50;
        let (hour, minute, second) = (22 + elapsed / 3600, elapsed / 60 % 60, elapsed % 60);
        text.extend_from_slice(
            format!(
                "10.{}.{}.{} - - [14/Nov/2023:{hour}:{minute:02}:{second:02} +0000] \"GET /v1/items/{} HTTP/1.1\" 200 512 \"https://example.com/\" \"Mozilla/5.0 (X11; Linux x86_64)\"\n",
                client >> 16,
                (client >> 8) & 0xff,
                client & 0xff,
                rng.u32(0..1000)
            )
            .as_bytes(),
        );
    }
    text
}

const CONFIG: &str = r#"
[[rules]]
name = "per-ip"
rate = 10
period = "1s"
burst = 20
key = "peer_ip"
"#;

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
    let text = log_text();
    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Elements(LINES as u64));
    group.sample_size(10);
    group.bench_function("combined, one rule", |b| {
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
    group.bench_function("combined, parse only", |b| {
        b.iter(|| {
            let mut source = log::open(
                Format::Combined,
                Cursor::new(&text[..]),
                FieldMap::default(),
            );
            let mut n = 0;
            while let Some(entry) = source.next_entry() {
                n += entry.expect("in memory").is_ok() as u64;
            }
            black_box(n)
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = bench
}
criterion_main!(benches);
