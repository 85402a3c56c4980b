//! `PostgresStore` beside `RedisStore`, in one run: decisions per second and round trips per
//! decision with 64 concurrent callers, on one hot key and over 10,000 keys, for both of the
//! Postgres store's step modes (rows locked, or versions checked), with the conflicts (steps
//! started again) per decision.
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

#[path = "../../tests/support/postgres_server.rs"]
mod postgres_server;
#[path = "../../tests/support/redis_server.rs"]
mod redis_server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use postgres_server::PgServer;
use redis_server::RedisServer;
use tollgate::store::StepMode;
use tollgate::{Limit, Limiter, PostgresStore, RedisStore, Rule};

const CALLERS: usize = 64;
const KEYS: usize = 10_000;

/// What one phase measured.
struct Run {
    decisions: u64,
    errors: u64,
    elapsed: Duration,
    round_trips: u64,
    conflicts: u64,
}

/// `CALLERS` tasks charging the rule `limit` of `limiter` for `duration`, each on one hot key
/// or on a key drawn from `KEYS`.
async fn hammer(limiter: &Limiter, hot: bool, duration: Duration) -> (u64, u64, Duration) {
    let decisions = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for caller in 0..CALLERS {
        let (limiter, decisions, errors) = (limiter.clone(), decisions.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(caller as u64);
            while Instant::now() < deadline {
                let key = if hot {
                    "hot".to_owned()
                } else {
                    format!("k{}", rng.usize(..KEYS))
                };
                match limiter.charge("limit", key, 1).await {
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

fn limiter(store: impl tollgate::store::Store) -> Limiter {
    Limiter::builder()
        .rule(Rule::new("limit", Limit::per_second(100_000_000)))
        .store(store)
        .build()
        .expect("the limiter")
}

async fn postgres(server: &PgServer, mode: StepMode, hot: bool, duration: Duration) -> Run {
    let store = PostgresStore::builder()
        .url(server.url())
        .mode(mode)
        .pool_size(CALLERS)
        .timeout(Duration::from_secs(5))
        .create_schema(true)
        .build()
        .await
        .expect("connect to postgres");
    let limiter = limiter(store.clone());
    // Warm up: every connection opened and its statements prepared.
    hammer(&limiter, hot, duration / 5).await;
    let (trips, counts) = (store.backend().round_trips(), store.counts());
    let (decisions, errors, elapsed) = hammer(&limiter, hot, duration).await;
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
    let limiter = limiter(store);
    hammer(&limiter, hot, duration / 5).await;
    let calls = || server.command_calls("evalsha") + server.command_calls("eval");
    let before = calls();
    let (decisions, errors, elapsed) = hammer(&limiter, hot, duration).await;
    Run {
        decisions,
        errors,
        elapsed,
        round_trips: calls() - before,
        conflicts: 0,
    }
}

fn row(store: &str, keys: &str, run: &Run) {
    let per_decision = |n: u64| n as f64 / run.decisions.max(1) as f64;
    println!(
        "| {store} | {keys} | {:.0} | {:.2} | {:.3} | {} |",
        run.decisions as f64 / run.elapsed.as_secs_f64(),
        per_decision(run.round_trips),
        per_decision(run.conflicts),
        run.errors,
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
            "| store | keys | decisions/s | round trips/decision | conflicts/decision | errors |"
        );
        println!("|---|---|---|---|---|---|");
        for (hot, keys) in [(true, "1 (hot)"), (false, "10,000")] {
            row(
                "RedisStore",
                keys,
                &redis(&redis_server, hot, duration).await,
            );
            for (mode, name) in [
                (StepMode::Locks, "PostgresStore, locks"),
                (StepMode::Versions, "PostgresStore, versions"),
            ] {
                row(name, keys, &postgres(&pg, mode, hot, duration).await);
            }
        }
    });
}
