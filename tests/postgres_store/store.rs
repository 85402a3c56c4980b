//! What the Postgres store keeps besides counters, and how it is set up: blocks and overrides
//! seen by every instance and listed a page at a time, idle rows removed through the expiry's
//! index, the schema, a configuration file, and the limits it refuses.

use std::time::Duration;

use tokio_postgres::SimpleQueryMessage;
use tollgate::clock::ManualClock;
use tollgate::config::{Config, ConfigFormat};
use tollgate::store::{StepMode, Store};
use tollgate::{Limit, Limiter, Penalty, PostgresStore, Rule};

use crate::support::postgres_server::PgServer;

const START: Duration = Duration::from_secs(1_750_000_000);
const MINUTE: Duration = Duration::from_secs(60);

async fn store(server: &PgServer, clock: &ManualClock) -> PostgresStore {
    PostgresStore::builder()
        .url(server.url())
        .clock(clock.clone())
        .create_schema(true)
        .build()
        .await
        .unwrap()
}

/// The first column of the first row `sql` returns.
async fn scalar(server: &PgServer, sql: &str) -> String {
    server
        .query(sql)
        .await
        .into_iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap_or_default()
}

/// A block set through one instance denies the key on another; offences are counted, listed,
/// and lifted for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_are_seen_by_every_instance_and_listed() {
    let server = PgServer::start().await;
    let clock = ManualClock::new(START);
    let limiter = |store| {
        Limiter::builder()
            .rule(Rule::new("login", Limit::per_minute(2)).block(Penalty::fixed(10 * MINUTE)))
            .store(store)
            .build()
            .unwrap()
    };
    let a = limiter(store(&server, &clock).await);
    let b = limiter(store(&server, &clock).await);
    for _ in 0..2 {
        assert!(a.charge("login", "mallory", 1).await.unwrap().is_allowed());
    }
    // The third is an offence: blocked for ten minutes, on both instances.
    assert!(!a.charge("login", "mallory", 1).await.unwrap().is_allowed());
    clock.advance(5 * MINUTE);
    let blocked = b.charge("login", "mallory", 1).await.unwrap();
    assert!(!blocked.is_allowed());
    let listed = b.blocked("login", "mallory").await.unwrap().unwrap();
    assert_eq!((listed.remaining, listed.offences), (5 * MINUTE, 1));
    b.block("login", "trudy", MINUTE).await.unwrap();
    let page = a.blocks("login", None).await.unwrap();
    let mut keys: Vec<Vec<u8>> = page.items.iter().map(|k| k.key.clone()).collect();
    keys.sort();
    assert_eq!(keys, [b"mallory".to_vec(), b"trudy".to_vec()]);
    assert!(page.next.is_none());
    a.unblock("login", "mallory").await.unwrap();
    assert!(b.charge("login", "mallory", 1).await.unwrap().is_allowed());
}

/// An override set through one instance is charged under on the other, listed, and cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_are_seen_by_every_instance_and_listed() {
    let server = PgServer::start().await;
    let clock = ManualClock::new(START);
    let limiter = |store| {
        Limiter::builder()
            .rule(Rule::new("api", Limit::per_minute(2)).overridable())
            .store(store)
            .build()
            .unwrap()
    };
    let a = limiter(store(&server, &clock).await);
    let b = limiter(store(&server, &clock).await);
    a.set_override("api", "acme", Limit::per_minute(50), MINUTE)
        .await
        .unwrap();
    let outcome = b.charge("api", "acme", 1).await.unwrap();
    assert_eq!((outcome.limit, outcome.remaining), (50, 49));
    let listed = b.overrides("api", None).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].key.as_bytes(), b"acme");
    assert_eq!(listed.items[0].expires_in, MINUTE);
    // Ended: the rule's own limit again, the state carried over (49 left, capped at 2).
    clock.advance(MINUTE);
    assert!(b.override_of("api", "acme").await.unwrap().is_none());
    let outcome = a.charge("api", "acme", 1).await.unwrap();
    assert_eq!((outcome.limit, outcome.remaining), (2, 1));
    a.set_override("api", "acme", Limit::per_minute(9), MINUTE)
        .await
        .unwrap();
    a.clear_override("api", "acme").await.unwrap();
    assert!(b.overrides("api", None).await.unwrap().items.is_empty());
}

/// Rows become idle when their state equals a new key's; they are removed through the expiry's
/// index, the others kept; `reset` removes a key's rows at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_rows_are_removed_and_busy_ones_kept() {
    let server = PgServer::start().await;
    let clock = ManualClock::new(START);
    let store = store(&server, &clock).await;
    let limiter = Limiter::builder()
        .rule(Rule::new("fast", Limit::per_second(10)))
        .rule(Rule::new("slow", Limit::per_day(10)))
        .store(store.clone())
        .build()
        .unwrap();
    for key in ["a", "b", "c"] {
        limiter.charge("fast", key, 1).await.unwrap();
    }
    limiter.charge("slow", "a", 1).await.unwrap();
    limiter.charge("slow", "b", 1).await.unwrap();
    let rows = || scalar(&server, "SELECT count(*) FROM tollgate_state");
    assert_eq!(rows().await, "5");
    // Expiries are kept to the second (rounded up): two seconds on, the fast bucket's are idle.
    clock.advance(Duration::from_secs(2));
    assert_eq!(store.remove_idle(1_000).await.unwrap(), 3);
    assert_eq!(rows().await, "2");
    limiter.reset("slow", "a").await.unwrap();
    assert_eq!(rows().await, "1");
    assert_eq!(limiter.check("slow", "b", 0).await.unwrap().remaining, 9);
    // The removal can read the expiry's index rather than the table (on a table this small
    // the planner would scan it: told not to, it shows the index is there to use).
    let plan: String = server
        .query(
            "SET enable_seqscan = off; EXPLAIN SELECT ctid FROM tollgate_state \
             WHERE expires_at < 5 ORDER BY expires_at LIMIT 10",
        )
        .await
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .collect();
    assert!(plan.contains("tollgate_state_expires_at"), "{plan}");
}

/// The schema: created on request (twice is harmless), printed for a migration, and a table of
/// another name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_is_created_on_request_or_by_the_printed_sql() {
    let server = PgServer::start().await;
    let sql = PostgresStore::schema_sql("limits.state");
    server.query("CREATE SCHEMA limits").await;
    server.query(&sql).await;
    let store = PostgresStore::builder()
        .url(server.url())
        .table("limits.state")
        .build()
        .await
        .unwrap();
    store.ensure_schema().await.unwrap();
    let limiter = Limiter::builder()
        .rule(Rule::new("api", Limit::per_minute(3)))
        .store(store)
        .build()
        .unwrap();
    assert_eq!(limiter.charge("api", "k", 1).await.unwrap().remaining, 2);
    assert_eq!(
        scalar(&server, "SELECT count(*) FROM limits.state").await,
        "1"
    );
    let bad = PostgresStore::builder()
        .url(server.url())
        .table("x; DROP TABLE y")
        .build()
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("table name"), "{bad}");
}

/// A concurrency limit is refused when the limiter is built, naming the rule; a store built
/// while Postgres is away is refused unless built lazily.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_limits_are_refused_and_an_absent_database_is_an_error() {
    let server = PgServer::start().await;
    let store = store(&server, &ManualClock::new(START)).await;
    let error = Limiter::builder()
        .rule(Rule::new("exports", Limit::concurrent(2)))
        .store(store)
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("exports"), "{error}");
    assert!(error.to_string().contains("concurrency"), "{error}");
    let port = server.port;
    drop(server);
    let url = format!("postgres://tollgate@127.0.0.1:{port}/postgres?connect_timeout=1");
    let absent = PostgresStore::builder()
        .url(&url)
        .timeout(Duration::from_millis(300))
        .build()
        .await;
    assert!(absent.is_err());
    let lazy = PostgresStore::builder()
        .url(&url)
        .timeout(Duration::from_millis(300))
        .connect_lazily(true)
        .build()
        .await
        .unwrap();
    assert!(lazy.probe().await.is_err());
}

/// A configuration file's `[store]` of kind `postgres` (said, or the url's scheme) builds a
/// limiter on the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_file_names_the_postgres_store() {
    let server = PgServer::start().await;
    let file = |store: &str| {
        format!(
            "[store]\n{store}url = \"{}\"\n\n[[rules]]\nname = \"api\"\n\
             algorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\n",
            server.url()
        )
    };
    // `kind` said, or left to the url's scheme: both charge the same row.
    for store in [
        "kind = \"postgres\"\ncreate_schema = true\ntimeout = \"2s\"\non_failure = \"closed\"\n",
        "",
    ] {
        let config = Config::parse(ConfigFormat::Toml, &file(store)).unwrap();
        let limiter = config.connect_limiter().await.unwrap();
        assert!(limiter.charge("api", "k", 1).await.unwrap().is_allowed());
    }
    assert_eq!(
        scalar(&server, "SELECT count(*) FROM tollgate_state").await,
        "1"
    );
    // A table without a url names no store.
    let error = Config::parse(ConfigFormat::Toml, "[store]\ntimeout = \"1s\"\n")
        .map(drop)
        .unwrap_err();
    assert!(error.to_string().contains("store.kind"), "{error}");
}

/// Both step modes answer alike on one scenario of each kind of request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_and_locks_answer_alike() {
    let server = PgServer::start().await;
    let mut answers = Vec::new();
    for mode in [StepMode::Locks, StepMode::Versions] {
        let clock = ManualClock::new(START);
        let store = PostgresStore::builder()
            .url(server.url())
            .clock(clock.clone())
            .mode(mode)
            .create_schema(true)
            .build()
            .await
            .unwrap();
        let name = format!("{mode:?}");
        let limiter = Limiter::builder()
            .rule(Rule::new(name.clone(), Limit::per_minute(3)))
            .store(store.clone())
            .build()
            .unwrap();
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(limiter.charge(&name, "k", 1).await.unwrap().remaining);
        }
        limiter.refund(&name, "k", 2).await.unwrap();
        seen.push(limiter.check(&name, "k", 0).await.unwrap().remaining);
        clock.advance(Duration::from_secs(20));
        seen.push(limiter.charge(&name, "k", 1).await.unwrap().remaining);
        answers.push(seen);
        let counts = store.counts();
        assert_eq!(counts.conflicts, 0, "{mode:?}");
        assert!(counts.attempts >= counts.steps, "{counts:?}");
    }
    assert_eq!(answers[0], [2, 1, 0, 0, 2, 2]);
    assert_eq!(answers[0], answers[1]);
}
