//! `PostgresStore` beside `RedisStore`, in one run: decisions per second and round trips per
//! request with 64 concurrent callers, on one hot key and over 10,000 keys, for both of the
//! Postgres store's step modes (rows locked, or versions checked), with the conflicts (steps
//! started again) per request and the requests that gave up after the store's retries (the
//! stores are called directly, without a limiter's circuit breaker). One more row per key set:
//! locks with `synchronous_commit = off`, commits that return before their flush to disk.
//!
//! ```text
//! cargo bench -p tollgate-bench --bench postgres
//! ```
//!
//! It starts its own `postgres` (made by `initdb`, Debian package `postgresql`; every commit
//! flushed to disk, as in production) and `redis-server` (no persistence, the Redis store's usual
//! setting) on free loopback ports. The limit is high enough that every decision is admitted:
//! each one writes. Round trips are counted by the Postgres store itself (statements sent
//! together count once) and, for Redis, as the server's calls of the store's script. Under
//! `cargo test` (no `--bench` argument) each phase runs briefly, as a smoke test.

use tollgate_test_support::{postgres_server, redis_server};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use postgres_server::PgServer;
use redis_server::RedisServer;
use tollgate::algorithm::{Algorithm, Mode, TokenBucket};
use tollgate::store::{Charge, RuleName, StepMode, Store};
use tollgate::{PostgresStore, RedisStore};

const CALLERS: usize = 64;
const KEYS: usize = 10_000;
/// Connections per Postgres store: the store's default on this machine (four per CPU), the
/// `POOL` variable when set.
static POOL: std::sync::LazyLock<usize> = std::sync::LazyLock::new(|| {
    std::env::var("POOL")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(4 * std::thread::available_parallelism().map_or(4, |n| n.get()))
});

/// What one phase measured.
struct Run {
    decisions: u64,
    errors: u64,
    elapsed: Duration,
    round_trips: u64,
    conflicts: u64,
}

/// `CALLERS` tasks charging one unit through `store` for `duration`, each on one hot key or on
/// a key drawn from `KEYS`: the store itself, without a limiter's circuit breaker, so that every
/// request that gives up (too many conflicts) is counted rather than followed by the breaker's
/// answers.
async fn hammer<S: Store + Clone>(
    store: &S,
    hot: bool,
    duration: Duration,
) -> (u64, u64, Duration) {
    let decisions = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for caller in 0..CALLERS {
        let (store, decisions, errors) = (store.clone(), decisions.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(caller as u64);
            let limit =
                Algorithm::TokenBucket(TokenBucket::new(100_000_000, Duration::from_secs(1)));
            while Instant::now() < deadline {
                let key = if hot {
                    "hot".to_owned()
                } else {
                    format!("k{}", rng.usize(..KEYS))
                };
                let charge = Charge::new(RuleName::new("limit"), &limit, key.as_bytes(), 1)
                    .with_mode(Mode::Charge);
                match store.apply_one(&charge).await {
                    Ok(_) => decisions.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for task in tasks {
        task.await.expect("a caller");
    }
    (
        decisions.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        started.elapsed(),
    )
}

async fn postgres(url: &str, mode: StepMode, hot: bool, duration: Duration) -> Run {
    let store = PostgresStore::builder()
        .url(url)
        .mode(mode)
        .pool_size(*POOL)
        .timeout(Duration::from_secs(5))
        .create_schema(true)
        .build()
        .await
        .expect("connect to postgres");
    // Warm up: every connection opened and its statements prepared.
    hammer(&store, hot, duration / 5).await;
    let (trips, counts) = (store.backend().round_trips(), store.counts());
    let (decisions, errors, elapsed) = hammer(&store, hot, duration).await;
    let after = store.counts();
    Run {
        decisions,
        errors,
        elapsed,
        round_trips: store.backend().round_trips() - trips,
        conflicts: after.conflicts - counts.conflicts,
    }
}

async fn redis(server: &RedisServer, hot: bool, duration: Duration) -> Run {
    let store = RedisStore::builder()
        .url(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("connect to redis");
    hammer(&store, hot, duration / 5).await;
    let calls = || server.command_calls("evalsha") + server.command_calls("eval");
    let before = calls();
    let (decisions, errors, elapsed) = hammer(&store, hot, duration).await;
    Run {
        decisions,
        errors,
        elapsed,
        round_trips: calls() - before,
        conflicts: 0,
    }
}

fn row(store: &str, keys: &str, run: &Run) {
    let requests = (run.decisions + run.errors).max(1) as f64;
    println!(
        "| {store} | {keys} | {:.0} | {:.2} | {:.3} | {:.1} % |",
        run.decisions as f64 / run.elapsed.as_secs_f64(),
        run.round_trips as f64 / requests,
        run.conflicts as f64 / requests,
        100.0 * run.errors as f64 / requests,
    );
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let duration = if full {
        Duration::from_secs(5)
    } else {
        Duration::from_millis(300)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let pg = PgServer::start_durable().await;
        let redis_server = RedisServer::start();
        println!("{CALLERS} callers, {duration:?} a row, every decision admitted (each writes)");
        println!();
        println!(
            "| store | keys | decisions/s | round trips per request | conflicts per request | \
             requests given up |"
        );
        println!("|---|---|---|---|---|---|");
        let durable = pg.url();
        // The same server, each commit returning before its flush to disk: where the time of
        // the durable rows goes.
        let unflushed = format!("{durable}&options=-c%20synchronous_commit%3Doff");
        for (hot, keys) in [(true, "1 (hot)"), (false, "10,000")] {
            row(
                "RedisStore",
                keys,
                &redis(&redis_server, hot, duration).await,
            );
            for (mode, url, name) in [
                (StepMode::Locks, &durable, "PostgresStore, locks"),
                (StepMode::Versions, &durable, "PostgresStore, versions"),
                (
                    StepMode::Locks,
                    &unflushed,
                    "PostgresStore, locks, commits not flushed",
                ),
            ] {
                row(name, keys, &postgres(url, mode, hot, duration).await);
            }
        }
    });
}
