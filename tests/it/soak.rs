//! Soak: simulated hours of mixed traffic on one `MemoryStore`, with time from a `ManualClock`.
//!
//! Three rules — a token bucket, an aligned fixed window, an aligned sliding window — see keys
//! churn: every simulated second new keys arrive, send a known pattern for a few seconds through
//! the middleware, and go idle; one in ten bursts past its limit once instead; one in four comes
//! back a minute later with a burst. Beside them a few greedy keys take everything they can,
//! every tick. Checked:
//!
//! - every decision is the one the math gives: each request of the churning keys, and each
//!   greedy key's admissions per tick (in all, a greedy bucket key admits exactly
//!   `⌊(C + r·elapsed) / cost⌋` requests; a window key `limit` per window);
//! - after warm-up the store stays flat: it drops idle keys as it grows (its peak size in the
//!   last third of the run is within 25% of the first third's, and under a quarter of the keys
//!   seen);
//! - the process's resident memory (`/proc/self/statm`, Linux) stays flat: its peak in the last
//!   third is within 10% (at least 2 MiB) of the first third's.
//!
//! `quick` runs with every `cargo test` (five simulated minutes at a light load; seconds).
//! The long soak (two simulated hours of heavier churn; about two minutes in release) runs on
//! demand:
//!
//! ```sh
//! cargo test --release --test it soak -- --ignored --nocapture
//! ```

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::clock::ManualClock;
use tollgate::{Key, Limit, Limiter, MemoryStore, RateLimitLayer, Rule};
use tower::{service_fn, Layer, ServiceExt};

use crate::support::oneshot;
use oneshot::Limited;

type Body = Full<Bytes>;

const TICK: Duration = Duration::from_millis(100);
const TICKS_PER_SECOND: u64 = 10;
/// A whole number of every period: aligned windows start with the run.
const START: Duration = Duration::from_secs(1_700_000_000);
/// Token bucket: 10 per second (one unit per tick), capacity 20.
const RATE: u64 = 10;
const CAPACITY: u64 = 20;
/// Windows: 10 s long, so 100 ticks.
const PERIOD_SECONDS: u64 = 10;
const PERIOD_TICKS: u64 = PERIOD_SECONDS * TICKS_PER_SECOND;
/// Seconds a churning key sends for.
const LIFE: u64 = 5;
/// Seconds after its arrival a returning key comes back.
const RETURN: u64 = 60;
/// Seconds before the store can have reached its steady size (returns and sliding windows
/// included); memory is compared after this.
const WARM_UP: u64 = RETURN + 3 * PERIOD_SECONDS;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Algorithm {
    Bucket,
    Window,
    Sliding,
}

/// A rule, and how its churning keys behave under it.
struct Spec {
    rule: &'static str,
    algorithm: Algorithm,
    /// The most a fresh key is admitted at once.
    limit: u64,
    /// Requests a churning key sends in its first second, then in each later second.
    first: u64,
    then: u64,
}

const SPECS: [Spec; 3] = [
    Spec {
        rule: "bucket",
        algorithm: Algorithm::Bucket,
        limit: CAPACITY,
        first: 4,
        then: 2,
    },
    Spec {
        rule: "window",
        algorithm: Algorithm::Window,
        limit: 50,
        first: 3,
        then: 3,
    },
    Spec {
        rule: "sliding",
        algorithm: Algorithm::Sliding,
        limit: 30,
        first: 3,
        then: 3,
    },
];

fn layer(store: MemoryStore) -> RateLimitLayer {
    let key = || Key::header(HeaderName::from_static("x-key"));
    let period = Duration::from_secs(PERIOD_SECONDS);
    RateLimitLayer::builder()
        .store(store)
        .rule(
            Rule::new("bucket", Limit::per_second(RATE).capacity(CAPACITY))
                .key(key())
                .path("/bucket"),
        )
        .rule(
            Rule::new("window", Limit::fixed_window(50, period).aligned())
                .key(key())
                .path("/window"),
        )
        .rule(
            Rule::new("sliding", Limit::sliding_window(30, period).aligned())
                .key(key())
                .path("/sliding"),
        )
        .build()
        .unwrap()
}

/// How much load.
struct Soak {
    seconds: u64,
    /// New keys per rule per simulated second.
    arrivals: u64,
    /// Greedy keys per rule.
    greedy: u64,
}

/// A key that takes all it can every tick, and what the math says it gets.
struct Greedy {
    spec: &'static Spec,
    key: String,
    cost: u64,
    /// The tick of its first request.
    start: u64,
    /// Requests admitted so far.
    admitted: u64,
    /// Fixed and sliding windows: the window of the last tick, and the units admitted in it and
    /// in the window before.
    window: Option<u64>,
    current: u64,
    previous: u64,
}

impl Greedy {
    /// Requests the math admits at tick `t` (on or after the start).
    fn expected(&mut self, t: u64) -> u64 {
        let limit = self.spec.limit;
        match self.spec.algorithm {
            // One unit per tick on top of the capacity; whole requests of `cost` units.
            Algorithm::Bucket => (CAPACITY + (t - self.start)) / self.cost - self.admitted,
            Algorithm::Window => {
                let window = t / PERIOD_TICKS;
                let new = self.window != Some(window);
                self.window = Some(window);
                if new {
                    limit
                } else {
                    0
                }
            }
            // estimate = previous·(P − elapsed)/P + current; n more fit while estimate + n ≤ limit.
            Algorithm::Sliding => {
                let window = t / PERIOD_TICKS;
                match self.window {
                    Some(w) if w == window => {}
                    Some(w) if w + 1 == window => {
                        self.previous = self.current;
                        self.current = 0;
                    }
                    _ => {
                        self.previous = 0;
                        self.current = 0;
                    }
                }
                self.window = Some(window);
                let elapsed = t % PERIOD_TICKS;
                let weighted = self.previous * (PERIOD_TICKS - elapsed);
                let room = (limit * PERIOD_TICKS).saturating_sub(weighted) / PERIOD_TICKS;
                let n = room.saturating_sub(self.current);
                self.current += n;
                n
            }
        }
    }
}

/// What the run saw.
#[derive(Default)]
struct Report {
    requests: u64,
    admitted: u64,
    keys: u64,
    mismatches: u64,
    examples: Vec<String>,
    /// The peaks of the first, middle and last third of the time after the warm-up, sampled every
    /// simulated second. (Kept as peaks, not samples: a growing list would be measured too.)
    peaks: [Peak; 3],
}

#[derive(Clone, Copy, Default)]
struct Peak {
    keys: usize,
    /// Resident pages, where measured.
    pages: Option<u64>,
}

impl Report {
    fn check(&mut self, what: impl FnOnce() -> String, got: u64, want: u64) {
        if got != want {
            self.mismatches += 1;
            if self.examples.len() < 10 {
                self.examples
                    .push(format!("{}: got {got}, want {want}", what()));
            }
        }
    }
}

/// The churning keys of `spec` that arrived at second `born` and act on tick `tick`.
fn arrivals(born: u64, tick: u64, per_second: u64) -> impl Iterator<Item = u64> {
    let first = born * per_second;
    let offset = (tick + TICKS_PER_SECOND - first % TICKS_PER_SECOND) % TICKS_PER_SECOND;
    (first + offset..first + per_second).step_by(TICKS_PER_SECOND as usize)
}

fn key_of(spec: &Spec, id: u64) -> String {
    format!("{}-{id}", spec.rule)
}

async fn run(soak: Soak) {
    assert!(
        soak.seconds >= WARM_UP + 30,
        "the run is too short to compare thirds"
    );
    let wall = Instant::now();
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(16)
        .build();
    let layer = layer(store.clone());
    let limiter = layer.limiter().clone();
    let service = layer.layer(service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::new(Bytes::from_static(b"ok"))))
    }));
    let mut report = Report::default();

    let mut greedy: Vec<Greedy> = SPECS
        .iter()
        .flat_map(|spec| {
            (0..soak.greedy).map(move |g| Greedy {
                spec,
                key: format!("greedy-{}-{g}", spec.rule),
                cost: if spec.algorithm == Algorithm::Bucket && g % 2 == 1 {
                    3
                } else {
                    1
                },
                // Staggered starts: every key begins at its own point of the windows.
                start: g * 7,
                admitted: 0,
                window: None,
                current: 0,
                previous: 0,
            })
        })
        .collect();

    for second in 0..soak.seconds {
        for tick in 0..TICKS_PER_SECOND {
            let t = second * TICKS_PER_SECOND + tick;
            for key in greedy.iter_mut().filter(|key| t >= key.start) {
                let mut got = 0;
                while charge(&limiter, key.spec.rule, &key.key, key.cost).await {
                    got += 1;
                    assert!(got <= 1_000, "{} is never denied", key.key);
                }
                report.requests += got + 1;
                report.admitted += got;
                let want = key.expected(t);
                key.admitted += got;
                report.check(|| format!("{} at tick {t}", key.key), got, want);
            }
            for spec in &SPECS {
                for age in 0..LIFE.min(second + 1) {
                    for id in arrivals(second - age, tick, soak.arrivals) {
                        let key = key_of(spec, id);
                        if id % 10 == 9 {
                            // Bursting keys: once, past the limit, on arrival.
                            if age == 0 {
                                report.keys += 1;
                                burst(&limiter, spec, &key, spec.limit + 5, &mut report).await;
                            }
                            continue;
                        }
                        if age == 0 {
                            report.keys += 1;
                        }
                        let n = if age == 0 { spec.first } else { spec.then };
                        for i in 0..n {
                            let status = request(&service, spec, &key).await;
                            report.requests += 1;
                            report.admitted += u64::from(status == StatusCode::OK);
                            report.check(
                                || format!("{key} at second {second}, request {i}: {status}"),
                                status.as_u16().into(),
                                200,
                            );
                        }
                    }
                }
                if second >= RETURN {
                    // Back after a minute: treated exactly as a new key, whether the store
                    // dropped its idle state or not.
                    for id in arrivals(second - RETURN, tick, soak.arrivals) {
                        if id % 4 == 0 {
                            let key = key_of(spec, id);
                            burst(&limiter, spec, &key, spec.limit + 1, &mut report).await;
                        }
                    }
                }
            }
            clock.advance(TICK);
        }
        if let Some(measured) = second.checked_sub(WARM_UP) {
            let peak = &mut report.peaks[third(measured, soak.seconds - WARM_UP)];
            peak.keys = peak.keys.max(store.len());
            peak.pages = peak.pages.max(resident_pages());
        }
    }

    // Greedy keys in all, by the closed forms (a sliding window has none; its ticks were checked).
    let last = soak.seconds * TICKS_PER_SECOND - 1;
    for key in &greedy {
        let want = match key.spec.algorithm {
            Algorithm::Bucket => (CAPACITY + (last - key.start)) / key.cost,
            Algorithm::Window => {
                key.spec.limit * (last / PERIOD_TICKS - key.start / PERIOD_TICKS + 1)
            }
            Algorithm::Sliding => continue,
        };
        report.check(|| format!("{} in all", key.key), key.admitted, want);
    }

    summarize(&soak, &report, &store, wall.elapsed());
}

async fn charge(limiter: &Limiter, rule: &str, key: &str, cost: u64) -> bool {
    limiter
        .charge(rule, key, cost)
        .await
        .expect("the memory store answers")
        .is_allowed()
}

/// `n` requests at once from a key that is new (or idle long enough to be): exactly the limit
/// passes.
async fn burst(limiter: &Limiter, spec: &Spec, key: &str, n: u64, report: &mut Report) {
    let mut got = 0;
    for _ in 0..n {
        got += u64::from(charge(limiter, spec.rule, key, 1).await);
    }
    report.requests += n;
    report.admitted += got;
    report.check(|| format!("burst of {n} from {key}"), got, spec.limit);
}

async fn request<S: Limited<Body>>(service: &S, spec: &Spec, key: &str) -> StatusCode {
    let request = Request::get(format!("/{}", spec.rule))
        .header("x-key", key)
        .body(Body::default())
        .unwrap();
    service.clone().oneshot(request).await.unwrap().status()
}

/// Resident pages of this process (Linux); `None` elsewhere.
fn resident_pages() -> Option<u64> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let resident = statm.split_whitespace().nth(1).expect("statm's resident");
    Some(resident.parse().expect("a page count"))
}

/// The page size, from the auxiliary vector (`AT_PAGESZ`).
fn page_size() -> u64 {
    const AT_PAGESZ: u64 = 6;
    const WORD: usize = std::mem::size_of::<usize>();
    let auxv = std::fs::read("/proc/self/auxv").unwrap_or_default();
    auxv.chunks_exact(2 * WORD)
        .map(|pair| {
            let word = |bytes: &[u8]| {
                let mut buf = [0u8; WORD];
                buf.copy_from_slice(bytes);
                usize::from_ne_bytes(buf) as u64
            };
            (word(&pair[..WORD]), word(&pair[WORD..]))
        })
        .find(|&(kind, _)| kind == AT_PAGESZ)
        .map_or(4096, |(_, size)| size)
}

fn mib(pages: u64) -> f64 {
    (pages * page_size()) as f64 / f64::from(1 << 20)
}

/// Prints the summary and asserts the checks.
fn summarize(soak: &Soak, report: &Report, store: &MemoryStore, wall: Duration) {
    println!(
        "soak: {} simulated s ({} keys per rule per s) in {:.1} s: {} requests, {} admitted, {} keys",
        soak.seconds,
        soak.arrivals,
        wall.as_secs_f64(),
        report.requests,
        report.admitted,
        report.keys,
    );
    println!(
        "  decisions off the math: {} {:?}",
        report.mismatches, report.examples
    );
    assert_eq!(report.mismatches, 0, "{:?}", report.examples);

    let [first, middle, last] = report.peaks;

    // The store: flat after warm-up, and far below the keys ever seen.
    let (keys_first, keys_last) = (first.keys, last.keys);
    println!(
        "  store keys, peak per third: {keys_first}, {}, {keys_last} ({:+.1}%); {} at the end",
        middle.keys,
        percent(keys_first as f64, keys_last as f64),
        store.len()
    );
    // The tolerance covers where the random hash seed puts keys: shards sweep at different times.
    assert!(
        keys_last as f64 <= keys_first as f64 * 1.25,
        "the store grows: {keys_first} → {keys_last}"
    );
    assert!(
        (keys_last as u64) * 4 < report.keys,
        "idle keys are not dropped: {keys_last} of {} keys kept",
        report.keys
    );

    // Resident memory: flat within 10% (allocator noise on a small heap: at least 2 MiB).
    match (first.pages, last.pages) {
        (Some(before), Some(after)) => {
            let slack = (before / 10).max((2 << 20) / page_size());
            println!(
                "  RSS, peak per third: {:.1} MiB, {:.1} MiB, {:.1} MiB ({:+.1}%; tolerance +{:.1} MiB)",
                mib(before),
                mib(middle.pages.unwrap_or(before)),
                mib(after),
                percent(before as f64, after as f64),
                mib(slack)
            );
            assert!(
                after <= before + slack,
                "resident memory grows: {:.1} MiB → {:.1} MiB",
                mib(before),
                mib(after)
            );
        }
        _ => println!("  RSS: not measured (no /proc on this system)"),
    }
}

/// Which third of `n` seconds second `i` is in.
fn third(i: u64, n: u64) -> usize {
    let third = n / 3;
    if i < third {
        0
    } else if i >= n - third {
        2
    } else {
        1
    }
}

fn percent(before: f64, after: f64) -> f64 {
    (after / before - 1.0) * 100.0
}

/// A few simulated minutes at a light load: the soak's logic, in every `cargo test`.
#[tokio::test]
async fn quick() {
    run(Soak {
        seconds: 300,
        arrivals: 20,
        greedy: 4,
    })
    .await;
}

/// Two simulated hours of heavier churn; about two minutes in release.
#[tokio::test]
#[ignore = "long: cargo test --release --test it soak -- --ignored --nocapture"]
async fn soak() {
    run(Soak {
        seconds: 7_200,
        arrivals: 400,
        greedy: 8,
    })
    .await;
}
