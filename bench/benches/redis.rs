//! Decisions per second through `RedisStore` with 64 concurrent callers, and Redis commands and
//! server time per decision read from `INFO commandstats` (`usec_per_call`) for every algorithm,
//! beside the floor measured in the same rounds through the same client: a script with only the
//! three commands a decision cannot do without (`TIME`, `GET`, `SET … PX`). Beside them, what
//! the guarantees cost: the store with the time sent by this process instead of the server's,
//! and counters grown in place without the design's guarantees (the usual Redis rate-limit
//! scripts' way).
//!
//! Two peers' scripts run beside them, written for this bench from their documentation:
//! Upstash's sliding window and redis_rate's GCRA. The sliding windows (the store's and
//! Upstash's) also run paced, each key called once and ten times a second (see `PACED`): how
//! often a key is called decides how often a window's first call, its roll-over, comes.
//!
//! It also runs `redis-benchmark` with `EVALSHA` of a trivial script at the same concurrency.
//! That compares clients (64 unpipelined sockets against one multiplexed connection), not the
//! script, and the output says so.
//!
//! ```text
//! cargo bench -p tollgate-bench --bench redis
//! ```
//!
//! It starts its own `redis-server` on a free loopback port (Debian packages `redis-server` and
//! `redis-tools`). Under `cargo test` (no `--bench` argument) it runs each phase briefly, as a
//! smoke test. With `--drive PORT` it runs the per-algorithm rows against a server started by
//! someone else, in step with its caller: `scripts/redis_instructions.sh` counts the server's
//! instructions per call of each row that way, under callgrind (see `drive`).

use tollgate_test_support::redis_server;

/// The store's fast-path scripts, as `RedisStore` puts them together (through the library's
/// `bench` feature: the bench compiles no file of the library's).
use tollgate::__bench as lua;

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_server::RedisServer;

const SECOND: Duration = Duration::from_secs(1);
use tollgate::algorithm::Lease;
use tollgate::clock::SystemClock;
use tollgate::{Limit, Limiter, RedisStore, Rule};

const CALLERS: usize = 64;

/// The Redis commands one decision cannot do without: the server's time, the key's state, and
/// writing it back with its expiry.
const FLOOR_SCRIPT: &str = "local t = redis.call('TIME') redis.call('GET', KEYS[1]) \
    redis.call('SET', KEYS[1], t[1], 'PX', 60000) return 1";

/// A fixed window without the design's guarantees, the way the usual Redis rate-limit scripts
/// count (Upstash's among them): the key names the window, taken from the client's clock, with
/// every key's windows starting together; the counter grows in place and gets its expiry when
/// the window's first unit creates it; a denied request is counted too. ARGV: the cost, the
/// window (ms), the limit.
const IN_PLACE_FIXED: &str = "local n = redis.call('INCRBY', KEYS[1], ARGV[1]) \
    if n == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end \
    if n > tonumber(ARGV[3]) then return -1 end return n";

/// The same counter after reading the server's clock (`TIME`, converted to µs, then unused): a
/// lower bound for a counter grown in place on the server's time, without a window of its own per
/// key, all-or-nothing or exact expiries.
const IN_PLACE_FIXED_SERVER_TIME: &str = "local t = redis.call('TIME') \
    local n = redis.call('INCRBY', KEYS[1], ARGV[1]) \
    if n == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end \
    local now = t[1] * 1000000 + t[2] \
    if n > tonumber(ARGV[3]) then return -1 end return n";

/// Upstash's sliding window, written for this bench from its documentation (two fixed-window
/// counters in keys named by the client's window, this one and the previous one; the previous
/// one weighted by the part of the sliding period it still covers, from the client's clock; the
/// current one grown in place when admitted, its expiry set by the window's first unit). KEYS:
/// the current window's key, the previous window's. ARGV: the limit, the client's time (ms), the
/// window (ms), the cost.
const UPSTASH_SLIDING: &str = "local limit, now = tonumber(ARGV[1]), tonumber(ARGV[2]) \
    local window, cost = tonumber(ARGV[3]), tonumber(ARGV[4]) \
    local cur = redis.call('GET', KEYS[1]) \
    if cur == false then cur = 0 end \
    local prev = redis.call('GET', KEYS[2]) \
    if prev == false then prev = 0 end \
    local weight = 1 - (now % window) / window \
    if tonumber(prev) * weight + tonumber(cur) + cost > limit then return -1 end \
    local n = redis.call('INCRBY', KEYS[1], cost) \
    if n == cost then redis.call('PEXPIRE', KEYS[1], window * 2 + 1000) end \
    return limit - (n + tonumber(prev) * weight)";

/// redis_rate's GCRA, written for this bench from its documentation: the theoretical arrival
/// time (`tat`, seconds since 2017 as a float) in a string key, the server's clock (`TIME`),
/// the key written back with `SET … EX` for as long as the bucket takes to fill, and an answer
/// of four items (admitted units, units left, retry after, reset after). ARGV: the burst, the
/// rate, the period (s), the cost.
const REDIS_RATE_GCRA: &str = "redis.replicate_commands() \
    local burst, rate = tonumber(ARGV[1]), tonumber(ARGV[2]) \
    local period, cost = tonumber(ARGV[3]), tonumber(ARGV[4]) \
    local interval = period / rate \
    local increment = interval * cost \
    local burst_offset = interval * burst \
    local t = redis.call('TIME') \
    local now = (t[1] - 1483228800) + t[2] / 1000000 \
    local tat = redis.call('GET', KEYS[1]) \
    if tat then tat = math.max(tonumber(tat), now) else tat = now end \
    local new_tat = tat + increment \
    local diff = now - (new_tat - burst_offset) \
    local remaining = diff / interval \
    if remaining < 0 then \
      return {0, 0, tostring(-diff), tostring(tat - now)} \
    end \
    local reset_after = new_tat - now \
    if reset_after > 0 then \
      redis.call('SET', KEYS[1], new_tat, 'EX', math.ceil(reset_after)) \
    end \
    return {cost, remaining, tostring(-1), tostring(reset_after)}";

/// A fast path's script with one line replaced (`from` must occur once): the same call without
/// one of its guarantees.
fn without(script: &str, from: &str, to: &str) -> String {
    assert_eq!(script.matches(from).count(), 1, "{from}");
    script.replace(from, to)
}

/// A window's fast path's arguments as the store sends them (see `src/store/redis/fast.rs`): the
/// server's time (-1), no grace, then the algorithm's numbers, the last of them the cost; then
/// the cost in decimal.
fn fast_args(numbers: &[f64]) -> Vec<Vec<u8>> {
    let cost = numbers.last().expect("the cost");
    vec![
        [-1.0, 0.0]
            .iter()
            .chain(numbers)
            .flat_map(|n| n.to_le_bytes())
            .collect(),
        (*cost as u64).to_string().into_bytes(),
    ]
}

/// The token bucket's fast path on the server's time: the algorithm's numbers alone.
fn bucket_args(numbers: &[f64]) -> Vec<Vec<u8>> {
    vec![numbers.iter().flat_map(|n| n.to_le_bytes()).collect()]
}

/// One call's keys and arguments.
type Call = (Vec<String>, Vec<Vec<u8>>);

struct Run {
    decisions: u64,
    admitted: u64,
    elapsed: Duration,
    evalsha: u64,
    /// Server time spent running the script.
    script: Duration,
    /// CPU time of the server's main thread over the run (s): unlike `script`, not inflated when
    /// the server is preempted during a call, but counting its network work too.
    cpu: f64,
}

/// CPU seconds of the server's main thread so far, from `INFO cpu`.
fn server_cpu(server: &Target) -> f64 {
    server
        .run("INFO cpu")
        .lines()
        .filter(|l| {
            l.starts_with("used_cpu_user_main_thread:")
                || l.starts_with("used_cpu_sys_main_thread:")
        })
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum()
}

impl Run {
    /// A run that began at `started` (after `CONFIG RESETSTAT`, the server's main thread having
    /// used `cpu` seconds then), with the server's script counts.
    fn finished(server: &Target, decisions: u64, admitted: u64, started: Instant, cpu: f64) -> Run {
        Run {
            decisions,
            admitted,
            elapsed: started.elapsed(),
            evalsha: server.command_calls("evalsha"),
            script: Duration::from_micros(server.command_usec("evalsha")),
            cpu: server_cpu(server) - cpu,
        }
    }

    /// Two runs' counts together, as one.
    fn plus(self, other: Run) -> Run {
        Run {
            decisions: self.decisions + other.decisions,
            admitted: self.admitted + other.admitted,
            elapsed: self.elapsed + other.elapsed,
            evalsha: self.evalsha + other.evalsha,
            script: self.script + other.script,
            cpu: self.cpu + other.cpu,
        }
    }

    fn cpu_micros_per_call(&self) -> f64 {
        self.cpu * 1e6 / self.evalsha as f64
    }

    fn per_second(&self) -> f64 {
        self.decisions as f64 / self.elapsed.as_secs_f64()
    }

    fn calls_per_decision(&self) -> f64 {
        self.evalsha as f64 / self.decisions as f64
    }

    fn server_micros_per_call(&self) -> f64 {
        self.script.as_secs_f64() * 1e6 / self.evalsha as f64
    }

    fn busy_percent(&self) -> f64 {
        100.0 * self.script.as_secs_f64() / self.elapsed.as_secs_f64()
    }
}

/// `CALLERS` tasks charging `rule` for `duration`; each caller uses its own key unless `one_key`.
async fn hammer(
    server: &Target,
    limiter: Limiter,
    rule: &'static str,
    one_key: bool,
    duration: Duration,
) -> Run {
    server.run("CONFIG RESETSTAT");
    let cpu = server_cpu(server);
    let decisions = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let limiter = limiter.clone();
            let (decisions, admitted) = (decisions.clone(), admitted.clone());
            tokio::spawn(async move {
                let key = if one_key {
                    "hot".to_owned()
                } else {
                    format!("caller-{caller}")
                };
                // Locally cached answers (denials only) complete without yielding: after a
                // denial the caller yields, as separate requests would, so the connection's task
                // keeps running. Every other answer came over the connection, which yielded.
                while started.elapsed() < duration {
                    let outcome = limiter.charge(rule, &key, 1).await.expect("Redis answers");
                    decisions.fetch_add(1, Ordering::Relaxed);
                    admitted.fetch_add(u64::from(outcome.verdict.is_admitted()), Ordering::Relaxed);
                    if !outcome.verdict.is_admitted() {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    Run::finished(
        server,
        decisions.load(Ordering::Relaxed),
        admitted.load(Ordering::Relaxed),
        started,
        cpu,
    )
}

/// The client library alone: `CALLERS` tasks sending EVALSHA of `script` (with one key per
/// caller) through one multiplexed connection, as the store does. With `return 1`, what the
/// store's client side costs on top; with only the commands a decision cannot do without, the
/// most any one-call-per-decision store could reach on this server.
async fn client_alone(server: &Target, script: &str, duration: Duration) -> Run {
    client_calls(server, script, duration, |caller| {
        (vec![format!("alone-{caller}")], Vec::new())
    })
    .await
}

/// Like [`client_alone`], with string arguments.
async fn client_strings(
    server: &Target,
    script: &str,
    duration: Duration,
    call: fn(usize) -> (Vec<String>, Vec<String>),
) -> Run {
    client_with(server, script, duration, move |caller| {
        let (keys, args) = call(caller);
        (keys, args.into_iter().map(String::into_bytes).collect())
    })
    .await
}

/// Like [`client_alone`], with the keys and arguments of each call from `call(caller)`.
async fn client_calls(
    server: &Target,
    script: &str,
    duration: Duration,
    call: fn(usize) -> Call,
) -> Run {
    client_with(server, script, duration, call).await
}

/// The rows' connection. A reply may take longer than the `redis` crate's default of 500 ms
/// when `scripts/redis_instructions.sh` runs the server under callgrind on a busy machine: the
/// rows count instructions, not time, so they wait.
async fn connection(client: ::redis::Client) -> ::redis::aio::ConnectionManager {
    let config = ::redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(30)));
    ::redis::aio::ConnectionManager::new_with_config(client, config)
        .await
        .unwrap()
}

async fn client_with(
    server: &Target,
    script: &str,
    duration: Duration,
    call: impl Fn(usize) -> Call + Copy + Send + 'static,
) -> Run {
    server.run("CONFIG RESETSTAT");
    let cpu = server_cpu(server);
    let client = ::redis::Client::open(server.url()).unwrap();
    let conn = connection(client).await;
    let script = ::redis::Script::new(script);
    let calls = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let (mut conn, script, calls) = (conn.clone(), script.clone(), calls.clone());
            tokio::spawn(async move {
                while started.elapsed() < duration {
                    let (keys, args) = call(caller);
                    let mut invocation = script.prepare_invoke();
                    for key in &keys {
                        invocation.key(key);
                    }
                    for arg in &args {
                        invocation.arg(arg.as_slice());
                    }
                    let _: ::redis::Value = invocation.invoke_async(&mut conn).await.unwrap();
                    calls.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let calls = calls.load(Ordering::Relaxed);
    Run::finished(server, calls, calls, started, cpu)
}

/// `redis-benchmark` at the same concurrency: EVALSHA of `return 1`.
fn redis_benchmark(server: &Target, requests: u64) -> f64 {
    let sha = server.run("SCRIPT LOAD \"return 1\"");
    let sha = sha.lines().nth(1).expect("a SHA").trim().to_owned();
    let output = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &server.port.to_string()])
        .args([
            "-c",
            &CALLERS.to_string(),
            "-n",
            &requests.to_string(),
            "-q",
        ])
        .args(["EVALSHA", &sha, "0"])
        .output()
        .expect("run redis-benchmark (Debian package `redis-tools`)");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    // "EVALSHA ...: 136986.30 requests per second, p50=..." (the last of the \r-updated lines).
    text.rsplit(['\r', '\n'])
        .find_map(|line| {
            let (_, rest) = line.split_once(": ")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("cannot read redis-benchmark's output: {text:?}"))
}

/// One call of [`UPSTASH_SLIDING`] for the key `name`: a limit of 10^9 a second, one unit.
fn upstash_sliding_call(name: String) -> (Vec<String>, Vec<String>) {
    let now = unix_millis();
    let window = now / 1_000;
    (
        vec![format!("{name}:{window}"), format!("{name}:{}", window - 1)],
        vec![
            "1000000000".to_owned(),
            now.to_string(),
            "1000".to_owned(),
            "1".to_owned(),
        ],
    )
}

/// How often each caller of a paced row calls.
const TICK: Duration = Duration::from_millis(100);
/// Calls a caller of a paced row makes in a second.
const TICKS_PER_SECOND: u64 = 10;

/// The rows that call every key at a steady rate, after the rows of `NAMES` (their numbers
/// follow them): how often a key is called decides how often a window's first call (its
/// roll-over, which writes the key whole) comes, as real traffic at that rate brings it. Each of
/// the `CALLERS` callers calls once a `TICK`, round-robin over keys of its own, as many as make
/// each key's rate, on windows of one second. (64 × 10 calls a second: few enough for a server
/// under callgrind to keep up with.) The name, the script, calls per key per second.
const PACED: [(&str, Paced, u64); 8] = [
    (
        "sliding window, the store's script (10^4 a second), one call per key per second",
        Paced::Store(SLIDING_LIMIT),
        1,
    ),
    (
        "sliding window, the store's script (10^4 a second), ten calls per key per second",
        Paced::Store(SLIDING_LIMIT),
        10,
    ),
    (
        "the same above 2^26 a window (10^9), one call per key per second",
        Paced::Store(1e9),
        1,
    ),
    (
        "the same above 2^26 a window (10^9), ten calls per key per second",
        Paced::Store(1e9),
        10,
    ),
    (
        "Upstash's sliding window (as documented), one call per key per second",
        Paced::Upstash,
        1,
    ),
    (
        "Upstash's sliding window (as documented), ten calls per key per second",
        Paced::Upstash,
        10,
    ),
    (
        "the same after the server's TIME, one call per key per second",
        Paced::UpstashTime,
        1,
    ),
    (
        "the same after the server's TIME, ten calls per key per second",
        Paced::UpstashTime,
        10,
    ),
];

#[derive(Clone, Copy, Debug)]
enum Paced {
    /// The store's sliding window (`lua::SLIDING`), on the server's time, under this limit a
    /// second.
    Store(f64),
    /// [`UPSTASH_SLIDING`].
    Upstash,
    /// [`UPSTASH_SLIDING`] after reading the server's clock (`TIME`, converted to µs, then
    /// unused): what its windows would cost on the server's time, as the fixed window's row
    /// "in place: TIME + INCRBY + PEXPIRE" is for the fixed counter.
    UpstashTime,
}

/// How long a paced row runs before it is measured (`--drive`), so that each of its keys was
/// called within the last window, as under steady traffic.
const LEAD: Duration = Duration::from_millis(1_200);

/// The paced row `PACED[index]` for `duration`.
async fn paced(server: &Target, index: usize, duration: Duration) -> Run {
    let (_, kind, rate) = PACED[index];
    server.run("CONFIG RESETSTAT");
    let cpu = server_cpu(server);
    let client = ::redis::Client::open(server.url()).unwrap();
    let conn = connection(client).await;
    let script = ::redis::Script::new(&match kind {
        Paced::Store(_) => lua::SLIDING.to_owned(),
        Paced::Upstash => UPSTASH_SLIDING.to_owned(),
        Paced::UpstashTime => format!(
            "local t = redis.call('TIME') local micros = t[1] * 1000000 + t[2] {UPSTASH_SLIDING}"
        ),
    });
    let keys = TICKS_PER_SECOND / rate;
    let calls = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let (mut conn, script, calls) = (conn.clone(), script.clone(), calls.clone());
            tokio::spawn(async move {
                // The callers spread over a tick: a steady stream, not bursts of 64.
                tokio::time::sleep(TICK * caller as u32 / CALLERS as u32).await;
                let mut ticks = tokio::time::interval(TICK);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut made = 0;
                while started.elapsed() < duration {
                    ticks.tick().await;
                    let key = caller as u64 * keys + made % keys;
                    made += 1;
                    let mut invocation = script.prepare_invoke();
                    match kind {
                        Paced::Store(limit) => {
                            let offset = (key as f64 * 7919.0) % 1e6;
                            invocation.key(format!("paced-sliding-{limit}-{rate}-{key}"));
                            for arg in fast_args(&[limit, 1e6, offset, 1.0]) {
                                invocation.arg(arg);
                            }
                        }
                        Paced::Upstash | Paced::UpstashTime => {
                            let (names, args) =
                                upstash_sliding_call(format!("paced-{kind:?}-{rate}-{key}"));
                            for name in names {
                                invocation.key(name);
                            }
                            for arg in args {
                                invocation.arg(arg);
                            }
                        }
                    }
                    let _: ::redis::Value = invocation.invoke_async(&mut conn).await.unwrap();
                    calls.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let calls = calls.load(Ordering::Relaxed);
    Run::finished(server, calls, calls, started, cpu)
}

fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// The server the rows run against, by its port: one this bench started, or (with `--drive`)
/// one started by someone else, such as `scripts/redis_instructions.sh` under callgrind.
struct Target {
    port: u16,
}

impl Target {
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs an inline command against the server.
    fn run(&self, line: &str) -> String {
        redis_server::command(self.port, line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    /// How many times `command` ran, from `INFO commandstats`.
    fn command_calls(&self, command: &str) -> u64 {
        self.command_stat(command, 1)
    }

    /// Microseconds the server spent in `command`, from `INFO commandstats`.
    fn command_usec(&self, command: &str) -> u64 {
        self.command_stat(command, 3)
    }

    fn command_stat(&self, command: &str, field: usize) -> u64 {
        redis_server::command_stat(self.port, command, field)
    }
}

/// The rows of the per-algorithm table, in order; `Rows::run` runs one. Row 3 is the floor.
const NAMES: [&str; 18] = [
    "RedisStore, token bucket",
    "RedisStore, fixed window",
    "RedisStore, sliding window",
    "floor: TIME + GET + SET … PX (redis crate alone)",
    "`return 1` (redis crate alone)",
    "RedisStore, token bucket, the client's time",
    "RedisStore, fixed window, the client's time",
    "RedisStore, sliding window, the client's time",
    "fixed, in place, no guarantees: INCRBY + PEXPIRE, client's window",
    "fixed, in place: TIME + INCRBY + PEXPIRE",
    "Upstash's sliding window (as documented): 2 GET + INCRBY + PEXPIRE, client's windows",
    "token bucket, the store's script (redis crate alone)",
    "token bucket, no expiry (SET without PX)",
    "fixed window, the store's script (redis crate alone)",
    "fixed window, answering a count instead of the state",
    "sliding window, the store's script (redis crate alone)",
    "sliding window, answering a count instead of the state",
    "redis_rate's GCRA (as documented): TIME + GET + SET … EX",
];

/// Index of the floor's row in `NAMES`.
const FLOOR: usize = 3;

/// What the rows need: the limiters on the store (the server's time and this process's), and the
/// store's script without one guarantee each.
struct Rows {
    server_time: Limiter,
    client_time: Limiter,
    bucket_no_expiry: String,
    fixed_count: String,
    sliding_count: String,
}

impl Rows {
    async fn new(target: &Target) -> Rows {
        let store = |clock: bool| {
            let url = target.url();
            async move {
                let builder = RedisStore::builder()
                    .url(url)
                    .deny_cache(true)
                    .timeout(Duration::from_secs(2));
                // The store's test mode: the time sent from this process instead of `TIME`.
                let builder = if clock {
                    builder.clock(SystemClock::new())
                } else {
                    builder
                };
                builder.build().await.expect("connect")
            }
        };
        Rows {
            server_time: roomy(store(false).await),
            client_time: roomy(store(true).await),
            // The store's fast paths sent directly, as is and without one guarantee each.
            bucket_no_expiry: without(lua::BUCKET_NOW, BUCKET_EXPIRY.0, BUCKET_EXPIRY.1),
            fixed_count: without(
                lua::FIXED,
                "  local n = left * period + into\n",
                "  do return used end\n",
            ),
            sliding_count: without(
                lua::SLIDING,
                "    if packs and cur <= limit and into < period then\n",
                "    do return cur end\n    if packs and cur <= limit and into < period then\n",
            ),
        }
    }

    /// `row` (an index of `NAMES`) for `phase`.
    async fn run(&self, server: &Target, row: usize, phase: Duration) -> Run {
        // The store's rules (see `roomy`): a bucket of 10^8 refilled one a second (a fresh key
        // was empty 10^8 s ago: full; a unit's span 1 s; the capacity's span 10^8 s); windows of
        // 10^6 per minute (fixed) and 10^4 per second (sliding): see `FIXED_LIMIT`.
        let bucket_call = |caller: usize| {
            (
                vec![format!("direct-bucket-{caller}")],
                bucket_args(&[1e14, 1e6, 1e14]),
            )
        };
        let fixed_call = |caller: usize| {
            let offset = (caller as f64 * 7919.0) % 60e6;
            (
                vec![format!("direct-fixed-{caller}")],
                fast_args(&[FIXED_LIMIT, 60e6, FIXED_LIMIT, offset, 1.0]),
            )
        };
        let sliding_call = |caller: usize| {
            let offset = (caller as f64 * 7919.0) % 1e6;
            (
                vec![format!("direct-sliding-{caller}")],
                fast_args(&[SLIDING_LIMIT, 1e6, offset, 1.0]),
            )
        };
        let (server_time, client_time) = (&self.server_time, &self.client_time);
        match row {
            0 => hammer(server, server_time.clone(), "bucket", false, phase).await,
            1 => hammer(server, server_time.clone(), "fixed", false, phase).await,
            2 => hammer(server, server_time.clone(), "sliding", false, phase).await,
            // What every decision must do: read the server's clock, read the key, write it back
            // with its expiry. No arithmetic, no encoding.
            FLOOR => client_alone(server, FLOOR_SCRIPT, phase).await,
            4 => client_alone(server, "return 1", phase).await,
            5 => hammer(server, client_time.clone(), "bucket", false, phase).await,
            6 => hammer(server, client_time.clone(), "fixed", false, phase).await,
            7 => hammer(server, client_time.clone(), "sliding", false, phase).await,
            8 => {
                client_strings(server, IN_PLACE_FIXED, phase, |caller| {
                    let window = unix_millis() / 60_000;
                    (
                        vec![format!("in-place-fixed-{caller}:{window}")],
                        vec!["1".to_owned(), "60000".to_owned(), "1000000000".to_owned()],
                    )
                })
                .await
            }
            9 => {
                client_strings(server, IN_PLACE_FIXED_SERVER_TIME, phase, |caller| {
                    (
                        vec![format!("in-place-fixed-server-time-{caller}")],
                        vec!["1".to_owned(), "60000".to_owned(), "1000000000".to_owned()],
                    )
                })
                .await
            }
            10 => {
                client_strings(server, UPSTASH_SLIDING, phase, |caller| {
                    upstash_sliding_call(format!("upstash-sliding-{caller}"))
                })
                .await
            }
            11 => client_calls(server, lua::BUCKET_NOW, phase, bucket_call).await,
            12 => client_calls(server, &self.bucket_no_expiry, phase, bucket_call).await,
            13 => client_calls(server, lua::FIXED, phase, fixed_call).await,
            14 => client_calls(server, &self.fixed_count, phase, fixed_call).await,
            15 => client_calls(server, lua::SLIDING, phase, sliding_call).await,
            16 => client_calls(server, &self.sliding_count, phase, sliding_call).await,
            17 => {
                client_strings(server, REDIS_RATE_GCRA, phase, |caller| {
                    // The store's bucket (row 11): one a second, 10^8 of burst, one unit a call.
                    (
                        vec![format!("redis-rate-{caller}")],
                        ["100000000", "1", "1", "1"].map(str::to_owned).to_vec(),
                    )
                })
                .await
            }
            _ => unreachable!("one arm per row"),
        }
    }
}

/// The token bucket's write with its expiry in the store's script (on the server's time), and
/// the same write without.
const BUCKET_EXPIRY: (&str, &str) = (
    "redis.call('PSETEX', key, string.format('%d', (after + round) / 1000),\n  \
     struct.pack('<Bd', 69, e + cost_span))",
    "redis.call('SET', key, struct.pack('<Bd', 69, e + cost_span))",
);

/// The sliding windows' limit a second: far above what the run can use (each key is called a
/// few thousand times a second at most), and a limit as people write them: below 2^26, so the
/// store's key holds both counts in one field, and below about 47,000 a second, so a charge
/// inside its window is answered as one integer (see `lua/fast_sliding.lua`). The paced rows of
/// 10^9 measure the store above both.
const SLIDING_LIMIT: f64 = 1e4;

/// The fixed window's limit a minute: far above what the run can use, and below about
/// 3.7 × 10^7, so that a charge inside its window is answered as one integer (see
/// `lua/fast_fixed.lua`).
const FIXED_LIMIT: f64 = 1e6;

/// Allowed decisions: limits far above what the run can use. Each call reads a state: the
/// windows' keys live for a period, and each charge of the bucket adds a second to its key's
/// debt (and to its life), of the 10^8 s it has room for.
fn roomy(store: RedisStore) -> Limiter {
    Limiter::builder()
        .rule(Rule::new(
            "bucket",
            Limit::per_second(1).capacity(100_000_000),
        ))
        .rule(Rule::new(
            "fixed",
            Limit::fixed_window(FIXED_LIMIT as u64, Duration::from_secs(60)),
        ))
        .rule(Rule::new(
            "sliding",
            Limit::sliding_window(SLIDING_LIMIT as u64, Duration::from_secs(1)),
        ))
        .store(store)
        .build()
        .unwrap()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--drive") {
        let port = args
            .get(at + 1)
            .and_then(|p| p.parse().ok())
            .expect("--drive PORT");
        drive(&Target { port });
        return;
    }
    let full = args.iter().any(|a| a == "--bench");
    let (duration, requests) = if full {
        (Duration::from_secs(5), 1_000_000)
    } else {
        (Duration::from_millis(300), 20_000)
    };
    let redis = RedisServer::start();
    let server = Target { port: redis.port };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let rows = Rows::new(&server).await;
        // Warm up connections and the script.
        hammer(&server, rows.server_time.clone(), "bucket", false, duration / 5).await;

        let baseline = redis_benchmark(&server, requests);
        let alone = client_alone(&server, "return 1", duration).await;

        // Denied decisions on one hot key, with and without the deny cache.
        let tight = |cache: bool| {
            let url = server.url();
            async move {
                let store = RedisStore::builder()
                    .url(url)
                    .deny_cache(cache)
                    .timeout(Duration::from_secs(2))
                    .build()
                    .await
                    .expect("connect");
                Limiter::builder()
                    .rule(Rule::new("tight", Limit::per_hour(100)))
                    .store(store)
                    .build()
                    .unwrap()
            }
        };
        let cached = hammer(&server, tight(true).await, "tight", true, duration).await;
        server.run("FLUSHALL");
        let uncached = hammer(&server, tight(false).await, "tight", true, duration).await;

        // Allowed decisions on one hot key, in the same run: every charge sent (exact), then
        // with a quota lease of 10 units held at most a second (one call per 10 charges).
        let hot = |lease: bool| {
            let url = server.url();
            async move {
                let store = RedisStore::builder()
                    .url(url)
                    .timeout(Duration::from_secs(2))
                    .build()
                    .await
                    .expect("connect");
                let rule = Rule::new("hot", Limit::fixed_window(1_000_000_000, 3_600 * SECOND));
                let rule = if lease {
                    rule.lease(Lease::new(10, SECOND))
                } else {
                    rule
                };
                Limiter::builder().rule(rule).store(store).build().unwrap()
            }
        };
        server.run("FLUSHALL");
        let exact_hot = hammer(&server, hot(false).await, "hot", true, duration).await;
        server.run("FLUSHALL");
        let leased_hot = hammer(&server, hot(true).await, "hot", true, duration).await;

        // Redis time per decision: every algorithm beside the floor, through the same client and
        // the same callers, in rounds (the machine's speed changes; medians of the rounds).
        // Each round cycles through every row in short slices, so that the machine's changes of
        // speed (other work on its two cores) fall on every row alike.
        let slice = duration / 25;
        let mut rounds: Vec<Vec<Run>> = Vec::new();
        for _ in 0..ROUNDS {
            let mut totals: Vec<Option<Run>> = NAMES.iter().map(|_| None).collect();
            for _ in 0..SLICES {
                for (row, total) in totals.iter_mut().enumerate() {
                    let run = rows.run(&server, row, slice).await;
                    *total = Some(match total.take() {
                        Some(sum) => sum.plus(run),
                        None => run,
                    });
                }
            }
            let round: Vec<Run> = totals.into_iter().map(|t| t.expect("every row ran")).collect();
            for run in &round[..3] {
                assert_eq!(run.evalsha, run.decisions, "one call per decision");
            }
            rounds.push(round);
        }

        println!(
            "Redis time per call (INFO commandstats usec_per_call of EVALSHA), {CALLERS} callers \
             on one multiplexed connection, one rule, all allowed; medians of {ROUNDS} rounds, each \
             cycling {SLICES} times through the rows (each row's distance to the floor taken \
             within its round):"
        );
        println!(
            "| script | decisions/s | EVALSHA per decision | usec_per_call | above the floor | \
             rounds | server CPU per call | above the floor |"
        );
        println!("|---|---:|---:|---:|---:|---|---:|---:|");
        for (row, name) in NAMES.iter().enumerate() {
            let runs: Vec<&Run> = rounds.iter().map(|round| &round[row]).collect();
            let usec: Vec<f64> = runs.iter().map(|r| r.server_micros_per_call()).collect();
            let above: Vec<f64> = rounds
                .iter()
                .map(|round| {
                    round[row].server_micros_per_call() - round[FLOOR].server_micros_per_call()
                })
                .collect();
            let each: Vec<String> = usec.iter().map(|u| format!("{u:.2}")).collect();
            let cpu_above: Vec<f64> = rounds
                .iter()
                .map(|round| round[row].cpu_micros_per_call() - round[FLOOR].cpu_micros_per_call())
                .collect();
            println!(
                "| {name} | {:.0} | {:.3} | {:.2} µs | {:+.2} µs | {} | {:.2} µs | {:+.2} µs |",
                median(runs.iter().map(|r| r.per_second()).collect()),
                median(runs.iter().map(|r| r.calls_per_decision()).collect()),
                median(usec),
                median(above),
                each.join(" / "),
                median(runs.iter().map(|r| r.cpu_micros_per_call()).collect()),
                median(cpu_above),
            );
        }
        // The paced rows, each without a break (a break would let their keys expire).
        println!("| paced row | calls | calls per key per second | usec_per_call |");
        println!("|---|---:|---:|---:|");
        for (index, (name, _, rate)) in PACED.iter().enumerate() {
            if full {
                paced(&server, index, LEAD).await;
            }
            let run = paced(&server, index, duration).await;
            println!(
                "| {name} | {} | {:.2} | {:.2} µs |",
                run.evalsha,
                run.evalsha as f64
                    / (CALLERS as u64 * (TICKS_PER_SECOND / rate)) as f64
                    / run.elapsed.as_secs_f64(),
                run.server_micros_per_call()
            );
        }
        let bucket = &rounds[ROUNDS / 2][0];
        println!(
            "token bucket (middle round): {} decisions in {:.2?}, Redis busy in the script {:.0}% \
             of the run (floor: {:.0}%)",
            bucket.decisions,
            bucket.elapsed,
            bucket.busy_percent(),
            rounds[ROUNDS / 2][FLOOR].busy_percent()
        );
        // redis-benchmark opens 64 sockets and sends one request at a time on each; the store
        // and the rows above share one multiplexed connection. Their ratio says how the two
        // clients compare on this machine, not what the script costs: printed as such.
        println!(
            "clients compared, not the script: redis-benchmark -c {CALLERS} (64 unpipelined \
             sockets), EVALSHA of `return 1`: {baseline:.0} requests/s; the redis crate's one \
             multiplexed connection, same script: {:.0} requests/s",
            alone.per_second()
        );
        for (name, run) in [("deny cache on ", &cached), ("deny cache off", &uncached)] {
            println!(
                "one hot key, limit exhausted, {name}: {:>10.0} decisions/s, {} admitted, \
                 {:.5} EVALSHA per decision ({} calls for {} decisions)",
                run.per_second(),
                run.admitted,
                run.calls_per_decision(),
                run.evalsha,
                run.decisions
            );
        }
        for (name, run) in [("exact           ", &exact_hot), ("lease of 10 units", &leased_hot)] {
            println!(
                "one hot key, all allowed, {name}: {:>10.0} decisions/s on one instance, \
                 {:.4} EVALSHA per decision ({} calls for {} decisions)",
                run.per_second(),
                run.calls_per_decision(),
                run.evalsha,
                run.decisions
            );
        }
        println!(
            "quota lease: {:.1}x fewer Redis calls per decision, {:.1}x the decisions per second",
            exact_hot.calls_per_decision() / leased_hot.calls_per_decision(),
            leased_hot.per_second() / exact_hot.per_second()
        );
        assert_eq!(exact_hot.evalsha, exact_hot.decisions, "exact: one call each");
        assert!(
            leased_hot.evalsha * 10 <= leased_hot.decisions + 10 * CALLERS as u64,
            "leased: one call per 10 decisions"
        );
        assert_eq!(
            uncached.evalsha, uncached.decisions,
            "one call per decision"
        );
        assert!(
            cached.evalsha < uncached.evalsha.min(cached.decisions),
            "cached denials make no call"
        );
        assert!(cached.admitted <= 100 && uncached.admitted <= 100);
    });
}

/// `--drive PORT`: every row of the per-algorithm table against a server someone else started
/// (`scripts/redis_instructions.sh` runs it under callgrind), one row after the other, in step
/// with the caller through stdin and stdout: for each row the bench prints `ready ROW` and waits
/// for a line (the caller zeroes its counters); then it runs the row for `DRIVE` and prints
/// `done ROW CALLS NAME` (`CALLS`: the server's `EVALSHA` count over the row) and waits for a
/// line again (the caller dumps its counters). Every row runs briefly first, so that each is
/// measured with its connections made, its keys holding a state, and every script of the table
/// loaded: Redis's Lua garbage collector walks all loaded scripts, and its periodic step is part
/// of every call's cost.
fn drive(server: &Target) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut line = String::new();
    let mut step = |message: String| {
        println!("{message}");
        line.clear();
        std::io::stdin().read_line(&mut line).expect("read stdin");
    };
    runtime.block_on(async {
        let rows = Rows::new(server).await;
        for row in 0..NAMES.len() {
            rows.run(server, row, DRIVE / 4).await;
        }
        for index in 0..PACED.len() {
            paced(server, index, DRIVE / 4).await;
        }
        for (row, name) in NAMES.iter().enumerate() {
            step(format!("ready {row}"));
            let run = rows.run(server, row, DRIVE).await;
            if row < 3 {
                assert_eq!(run.evalsha, run.decisions, "one call per decision");
            }
            step(format!("done {row} {} {name}", run.evalsha));
        }
        for (index, (name, _, _)) in PACED.iter().enumerate() {
            paced(server, index, LEAD).await;
            let row = NAMES.len() + index;
            step(format!("ready {row}"));
            let run = paced(server, index, DRIVE).await;
            step(format!("done {row} {} {name}", run.evalsha));
        }
    });
}

/// How long `--drive` runs each row (under callgrind, the server makes a few thousand calls a
/// second).
const DRIVE: Duration = Duration::from_secs(2);

/// Rounds of the per-algorithm table.
const ROUNDS: usize = 3;
/// Slices of every row in a round.
const SLICES: usize = 10;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
