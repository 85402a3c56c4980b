//! End-to-end HTTP comparison on loopback: axum hello-world bare, behind tollgate, and behind
//! tower_governor, with the same quota, measured by `wrk`.
//!
//! ```text
//! cargo bench -p tollgate-bench --bench http                 # needs `wrk` (Debian package `wrk`)
//! HTTP_BENCH_SECS=10 HTTP_BENCH_RUNS=5 cargo bench -p tollgate-bench --bench http
//! ```
//!
//! Each server runs in its own process (this binary with `--serve VARIANT ADDR`) on a one-thread
//! tokio runtime, so `wrk` (one thread, 32 connections) has the other core. Besides requests per
//! second and latency, the table reports the server's CPU time per request, read from
//! `/proc/PID/stat` before and after each run: with client and server sharing two cores, that is
//! a sharper measure than requests per second. All servers start together and each round runs
//! every variant once, in an order rotated by one place per round (a run of 5 s per variant puts
//! the first and last of a round 40 s apart), so no variant always runs first or last and the
//! machine's changing state hits them alike. Each cell is the median of the rounds, with the
//! min–max range.
//!
//! On a shared virtual machine whose speed changes under it, even CPU time only gives the
//! direction: the primary figure for what a layer costs is instructions per request, counted by
//! `./scripts/http_instructions.sh` (the same servers under callgrind).
//!
//! The limiters are added with `Router::layer`, as their READMEs show, except in the two
//! "around the Router" rows, where they wrap the whole router: a refusal then skips routing.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use axum::extract::Request;
use axum::{routing::get, Router};
use tower::{Layer, ServiceExt};

/// The quota every limiter gets in the "allowed" runs: nothing is ever denied.
const GENEROUS_PER_SECOND: u64 = 1_000_000;
/// The quota of the "denied" runs: 10 per second; almost every request gets 429.
const TIGHT_PER_SECOND: u64 = 10;

#[derive(Clone, Copy, Debug)]
enum Variant {
    Bare,
    Tollgate {
        tight: bool,
        headers: bool,
    },
    TowerGovernor {
        tight: bool,
        /// tower_governor's `use_headers()`: `x-ratelimit-limit` and `x-ratelimit-remaining` on
        /// every response, its counterpart of tollgate's fields (for a feature-matched row).
        headers: bool,
    },
    /// Denied runs with the limiter wrapped around the whole `Router` rather than added with
    /// `Router::layer`: a refusal then skips routing, the placement that shields a server from a
    /// flood (and also limits requests to unknown paths).
    Around {
        tollgate: bool,
    },
}

impl Variant {
    fn all() -> [Variant; 9] {
        [
            Variant::Bare,
            Variant::Tollgate {
                tight: false,
                headers: true,
            },
            Variant::Tollgate {
                tight: false,
                headers: false,
            },
            Variant::TowerGovernor {
                tight: false,
                headers: false,
            },
            Variant::TowerGovernor {
                tight: false,
                headers: true,
            },
            Variant::Tollgate {
                tight: true,
                headers: true,
            },
            Variant::TowerGovernor {
                tight: true,
                headers: false,
            },
            Variant::Around { tollgate: true },
            Variant::Around { tollgate: false },
        ]
    }

    fn name(self) -> String {
        match self {
            Variant::Bare => "bare".into(),
            Variant::Tollgate { tight, headers } => format!(
                "tollgate-{}-{}",
                path(tight),
                if headers { "headers" } else { "noheaders" }
            ),
            Variant::TowerGovernor { tight, headers } => format!(
                "tower_governor-{}{}",
                path(tight),
                if headers { "-headers" } else { "" }
            ),
            Variant::Around { tollgate: true } => "tollgate-denied-around".into(),
            Variant::Around { tollgate: false } => "tower_governor-denied-around".into(),
        }
    }

    fn parse(name: &str) -> Option<Variant> {
        Variant::all().into_iter().find(|v| v.name() == name)
    }

    fn label(self) -> String {
        match self {
            Variant::Bare => "axum, bare (200)".into(),
            Variant::Tollgate {
                tight: false,
                headers: true,
            } => "tollgate, allowed (200 + RateLimit fields)".into(),
            Variant::Tollgate {
                tight: false,
                headers: false,
            } => "tollgate, allowed, fields off (200)".into(),
            Variant::Tollgate { tight: true, .. } => "tollgate, denied (429)".into(),
            Variant::TowerGovernor {
                tight: false,
                headers: false,
            } => "tower_governor, allowed (200)".into(),
            Variant::TowerGovernor {
                tight: false,
                headers: true,
            } => "tower_governor, allowed, `use_headers()` (200 + x-ratelimit-*)".into(),
            Variant::TowerGovernor { tight: true, .. } => "tower_governor, denied (429)".into(),
            Variant::Around { tollgate: true } => {
                "tollgate, denied (429), around the Router".into()
            }
            Variant::Around { tollgate: false } => {
                "tower_governor, denied (429), around the Router".into()
            }
        }
    }
}

fn path(tight: bool) -> &'static str {
    if tight {
        "denied"
    } else {
        "allowed"
    }
}

fn per_second(tight: bool) -> u64 {
    if tight {
        TIGHT_PER_SECOND
    } else {
        GENEROUS_PER_SECOND
    }
}

fn tollgate_layer(tight: bool, headers: bool) -> tollgate::RateLimitLayer {
    tollgate::RateLimitLayer::builder()
        .rule(tollgate::Limit::per_second(per_second(tight)).key(tollgate::Key::peer_ip()))
        .headers_on_allowed(headers)
        .build()
        .expect("valid rule")
}

/// tower_governor's builder for the quota of a run.
fn governor_config(
    tight: bool,
) -> tower_governor::governor::GovernorConfigBuilder<
    tower_governor::key_extractor::PeerIpKeyExtractor,
    governor::middleware::NoOpMiddleware,
> {
    let per_second = per_second(tight);
    // tower_governor counts "one unit every `period`"; the burst is the capacity.
    let mut config = tower_governor::governor::GovernorConfigBuilder::default();
    config
        .period(Duration::from_nanos(1_000_000_000 / per_second))
        .burst_size(per_second as u32);
    config
}

fn governor_layer(
    tight: bool,
) -> tower_governor::GovernorLayer<
    tower_governor::key_extractor::PeerIpKeyExtractor,
    governor::middleware::NoOpMiddleware,
    axum::body::Body,
> {
    tower_governor::GovernorLayer::new(governor_config(tight).finish().expect("valid quota"))
}

fn governor_layer_with_headers() -> tower_governor::GovernorLayer<
    tower_governor::key_extractor::PeerIpKeyExtractor,
    governor::middleware::StateInformationMiddleware,
    axum::body::Body,
> {
    let config = governor_config(false).use_headers().finish();
    tower_governor::GovernorLayer::new(config.expect("valid quota"))
}

/// A service around the `Router` answers with its own body type; `axum::serve` wants axum's.
fn into_axum_body<B>(response: http::Response<B>) -> axum::response::Response
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    response.map(axum::body::Body::new)
}

fn app(variant: Variant) -> Router {
    let router = Router::new().route("/", get(|| async { "Hello, World!" }));
    match variant {
        Variant::Bare | Variant::Around { .. } => router,
        Variant::Tollgate { tight, headers } => router.layer(tollgate_layer(tight, headers)),
        Variant::TowerGovernor {
            tight: false,
            headers: true,
        } => router.layer(governor_layer_with_headers()),
        Variant::TowerGovernor { tight, .. } => router.layer(governor_layer(tight)),
    }
}

fn serve(variant: Variant, addr: SocketAddr) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        match variant {
            Variant::Around { tollgate: true } => {
                let service = ServiceExt::<Request>::map_response(
                    tollgate_layer(true, true).layer(app(variant)),
                    into_axum_body,
                );
                let service = axum::ServiceExt::<Request>::into_make_service_with_connect_info::<
                    SocketAddr,
                >(service);
                axum::serve(listener, service).await.expect("serve");
            }
            Variant::Around { tollgate: false } => {
                let service = ServiceExt::<Request>::map_response(
                    governor_layer(true).layer(app(variant)),
                    into_axum_body,
                );
                let service = axum::ServiceExt::<Request>::into_make_service_with_connect_info::<
                    SocketAddr,
                >(service);
                axum::serve(listener, service).await.expect("serve");
            }
            _ => {
                let service = app(variant).into_make_service_with_connect_info::<SocketAddr>();
                axum::serve(listener, service).await.expect("serve");
            }
        }
    });
}

/// One wrk run's figures.
#[derive(Clone, Copy, Debug)]
struct Run {
    requests_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_us_per_request: f64,
    non_2xx_share: f64,
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("server stat");
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("stat format") + 2..]
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

fn clock_ticks_per_second() -> u64 {
    let out = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .expect("getconf");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(100)
}

/// Parses a wrk latency like `1.23ms`, `845.00us` or `1.02s` into milliseconds.
fn millis(text: &str) -> f64 {
    let (number, unit) = text.split_at(
        text.find(|c: char| c.is_ascii_alphabetic())
            .unwrap_or(text.len()),
    );
    let value: f64 = number.parse().unwrap_or(f64::NAN);
    match unit {
        "us" => value / 1000.0,
        "ms" => value,
        "s" => value * 1000.0,
        _ => f64::NAN,
    }
}

fn wrk(addr: SocketAddr, seconds: u64, server: u32, ticks_per_second: u64) -> Run {
    let before = cpu_ticks(server);
    let out = Command::new("wrk")
        .args([
            "-t1",
            "-c32",
            &format!("-d{seconds}s"),
            "--latency",
            &format!("http://{addr}/"),
        ])
        .output()
        .expect("wrk is installed (Debian package `wrk`)");
    let after = cpu_ticks(server);
    let text = String::from_utf8_lossy(&out.stdout);
    let find = |prefix: &str| {
        text.lines()
            .map(str::trim)
            .find_map(|line| line.strip_prefix(prefix).map(|rest| rest.trim().to_owned()))
            .unwrap_or_else(|| panic!("no {prefix:?} in wrk output:\n{text}"))
    };
    let requests_per_second: f64 = find("Requests/sec:").parse().expect("rate");
    let total: f64 = text
        .lines()
        .find(|l| l.contains("requests in"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("request count");
    let non_2xx: f64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Non-2xx or 3xx responses:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0.0);
    let cpu_seconds = (after - before) as f64 / ticks_per_second as f64;
    Run {
        requests_per_second,
        p50_ms: millis(&find("50%")),
        p99_ms: millis(&find("99%")),
        cpu_us_per_request: cpu_seconds * 1e6 / total,
        non_2xx_share: non_2xx / total,
    }
}

fn free_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

fn start(variant: Variant) -> (Child, SocketAddr) {
    let addr = free_addr();
    let mut child = Command::new(std::env::current_exe().expect("self"))
        .args(["--serve", &variant.name(), &addr.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("server process");
    for _ in 0..200 {
        if std::net::TcpStream::connect(addr).is_ok() {
            return (child, addr);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("{} did not start listening on {addr}", variant.name());
}

/// Median and range of one figure over the runs.
fn summary(values: impl Iterator<Item = f64>) -> (f64, f64, f64) {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

fn cell((median, min, max): (f64, f64, f64), digits: usize) -> String {
    format!("{median:.digits$} ({min:.digits$}–{max:.digits$})")
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, variant, addr] = &args[..] {
        if flag == "--serve" {
            let variant = Variant::parse(variant).expect("known variant");
            serve(variant, addr.parse().expect("address"));
            return;
        }
    }
    // `cargo test --benches` runs every bench once as a test: there is nothing to check here
    // without wrk and minutes of load, so it only checks that every variant builds its router.
    if !args.iter().any(|a| a == "--bench") {
        for variant in Variant::all() {
            let _ = app(variant);
        }
        println!("http bench: routers build (run `cargo bench -p tollgate-bench --bench http` to measure)");
        return;
    }
    let seconds = env("HTTP_BENCH_SECS", 5);
    let runs = env("HTTP_BENCH_RUNS", 3) as usize;
    let ticks = clock_ticks_per_second();
    println!(
        "wrk -t1 -c32 -d{seconds}s, {runs} runs each, server on one tokio worker thread, \
         the order of the variants rotated each round"
    );
    println!(
        "CPU time and requests/s give the direction only on a machine whose speed changes; \
         instructions per request (./scripts/http_instructions.sh) are the primary figure\n"
    );
    println!(
        "| server | requests/s | vs bare, same round | p50 ms | p99 ms | server CPU µs/request \
         | added CPU µs, same round | non-2xx |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    // All servers run for the whole measurement and every round runs each variant once, so a
    // change in the machine's state (a VM's CPU steal, frequency) hits every variant alike.
    let mut servers: Vec<(Variant, Child, SocketAddr)> = Variant::all()
        .into_iter()
        .map(|variant| {
            let (child, addr) = start(variant);
            (variant, child, addr)
        })
        .collect();
    for (_, child, addr) in &servers {
        // Warm up: connections, allocator, and (for the denied runs) an exhausted bucket.
        let _ = wrk(*addr, 1, child.id(), ticks);
    }
    let mut results: Vec<Vec<Run>> = vec![Vec::new(); servers.len()];
    for round in 0..runs {
        // Round r starts with variant r (modulo their number): the order rotates, so the
        // distance in time between bare axum and each variant changes from round to round.
        for k in 0..servers.len() {
            let i = (round + k) % servers.len();
            let (_, child, addr) = &servers[i];
            results[i].push(wrk(*addr, seconds, child.id(), ticks));
        }
    }
    // This VM switches between speeds for seconds at a time, which moves whole rounds: each
    // variant is also compared with bare axum in the same round, a steadier figure.
    let bare = results[0].clone();
    for ((variant, child, _), results) in servers.iter_mut().zip(&results) {
        let _ = child.kill();
        let _ = child.wait();
        let paired = || results.iter().zip(&bare);
        println!(
            "| {} | {} | {} % | {} | {} | {} | {} | {:.0}% |",
            variant.label(),
            cell(summary(results.iter().map(|r| r.requests_per_second)), 0),
            cell(
                summary(
                    paired()
                        .map(|(r, b)| { 100.0 * r.requests_per_second / b.requests_per_second })
                ),
                0
            ),
            cell(summary(results.iter().map(|r| r.p50_ms)), 2),
            cell(summary(results.iter().map(|r| r.p99_ms)), 2),
            cell(summary(results.iter().map(|r| r.cpu_us_per_request)), 1),
            cell(
                summary(paired().map(|(r, b)| r.cpu_us_per_request - b.cpu_us_per_request)),
                2
            ),
            100.0 * summary(results.iter().map(|r| r.non_2xx_share)).0,
        );
    }
}
