//! `PostgresStore`: limits kept durably in Postgres (see the type's documentation).

mod backend;
mod sql;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

pub use self::backend::{PostgresBackend, PostgresStep, StepMode};
use super::transact::TransactionalStore;
use super::{StoreError, StoreErrorKind};
use crate::clock::Clock;

const DEFAULT_TABLE: &str = "tollgate_state";
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);
const DEFAULT_RETRIES: u32 = 8;

/// A [`Store`](crate::store::Store) in Postgres: limits that survive a restart, a failover and a
/// cache flush, shared by every instance of an app, in a database the team already runs.
///
/// It is a [`TransactionalStore`] on a [`PostgresBackend`]: the crate's algorithms decide in
/// Rust, by the same code as the [`MemoryStore`](crate::MemoryStore) (no SQL copy of the
/// math), and Postgres makes each request's step atomic.
///
/// # How it decides
/// A request's step reads the rows of its keys (counters, and the blocks and overrides of the
/// rules that have them), decides every rule, and writes the changed rows back in one
/// statement, all or none. By default ([`StepMode::Locks`]) the read locks the rows
/// (`BEGIN; SELECT … FOR UPDATE`, sent with the clock query in one round trip) and the write
/// goes with its `COMMIT` in a second: concurrent requests on a key wait in line. With
/// [`StepMode::Versions`] the read takes no lock and the write happens only if every row
/// still has the version read, else the step starts again (up to
/// [`retries`](PostgresStoreBuilder::retries) times, default 8, then the request is answered by
/// the failure policy). Measured on one hot key with 64 callers, locks decide 3 to 7 times as
/// many requests a second and none gives up, where two thirds of the versioned steps give up
/// after their retries; over many keys the two are level (see `BENCHMARKS.md`, "Postgres
/// store").
///
/// Time is the database's `clock_timestamp()`, read in the step itself, so app hosts whose
/// clocks disagree decide by one clock. Not `now()`: that is the start of the transaction,
/// which for a step that waited for a lock is earlier than the time the previous holder
/// decided at.
///
/// # What it keeps
/// Every algorithm but concurrency limits, with reservations, refunds, settlements, limits
/// chosen per request, penalties and per-key overrides. A
/// [concurrency limit](crate::Limit::concurrent) needs its slots back when responses end and
/// leases that lapse when an instance dies: keep those on the memory or Redis store (building
/// a limiter with one on this store is an error naming the rule). Quota leases are ignored:
/// every decision is exact.
///
/// # The table
/// One table (default `tollgate_state`, [`table`](PostgresStoreBuilder::table)), created by
/// [`create_schema`](PostgresStoreBuilder::create_schema) or by the SQL
/// [`PostgresStore::schema_sql`] prints:
///
/// ```sql
/// CREATE TABLE IF NOT EXISTS tollgate_state (
///     kind smallint NOT NULL,        -- 0 counter, 1 block, 2 override
///     rule text NOT NULL,
///     key bytea NOT NULL,
///     version bigint NOT NULL,       -- changed by every write
///     state bytea NOT NULL,          -- the algorithm's state
///     expires_at bigint NOT NULL,    -- µs since the epoch: idle from then on
///     PRIMARY KEY (kind, rule, key)
/// ) WITH (fillfactor = 70);
/// CREATE INDEX IF NOT EXISTS tollgate_state_expires_at ON tollgate_state (expires_at);
/// ```
///
/// Idle rows (a full bucket, a past window, a forgiven offence, an ended override) are removed
/// through the expiry's index, a thousand at a time, in the background every 1024 writes
/// ([`TransactionalStore::remove_idle`] on demand): never a scan of the whole table.
///
/// # Failures
/// Every step has a timeout (default 500 ms, retries included). When Postgres is down, slow or
/// refuses a statement, the store returns a [`StoreError`] and the layer's
/// [`FailurePolicy`](crate::FailurePolicy) decides, behind the same
/// [`CircuitBreaker`](crate::store::CircuitBreaker) as the Redis store (its probe charges a
/// row of its own, `tollgate:probe`, so a database that reads but cannot write keeps it open).
/// The pool opens new connections as the database comes back. A step cut short inside its
/// transaction closes its connection, so the database rolls it back. TLS to Postgres is not
/// built in yet: use a local socket, a private network or a TLS proxy.
///
/// # Where it is the wrong choice
/// Every decision is two round trips and a durable commit. One hot key is decided one step at
/// a time, each holding the row's lock through its flush to disk: a few hundred decisions a
/// second; over many keys, a few thousand on a small server: 30 to 150 times fewer than the
/// Redis store decides on the same machine.
/// Put limits that only protect a service from overload (per IP, per route) on Redis or in
/// memory, and keep Postgres for quotas that bill or must survive a restart.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use http::HeaderName;
/// use tollgate::{FailurePolicy, Key, Limit, PostgresStore, RateLimitLayer, Rule};
///
/// let store = PostgresStore::builder()
///     .url("postgres://app@127.0.0.1/app")
///     .create_schema(true)
///     .build()
///     .await?;
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::new("tokens", Limit::per_day(1_000_000)).key(Key::header(HeaderName::from_static("x-tenant"))))
///     .store(store)
///     .on_store_failure(FailurePolicy::Closed)
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
pub type PostgresStore = TransactionalStore<PostgresBackend>;

impl TransactionalStore<PostgresBackend> {
    /// Configures a Postgres store.
    pub fn builder() -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            url: None,
            table: DEFAULT_TABLE.to_owned(),
            pool_size: None,
            timeout: DEFAULT_TIMEOUT,
            retries: DEFAULT_RETRIES,
            mode: StepMode::default(),
            create_schema: false,
            connect_lazily: false,
            clock: None,
        }
    }

    /// The SQL that creates the store's table and its index (what
    /// [`create_schema`](PostgresStoreBuilder::create_schema) runs), for a migration.
    pub fn schema_sql(table: &str) -> String {
        sql::schema(table)
    }

    /// Creates the table and its index if they are missing.
    pub async fn ensure_schema(&self) -> Result<(), StoreError> {
        let backend = self.backend();
        let conn = backend.connection().await?;
        conn.batch_execute(&backend.sql.schema)
            .await
            .map_err(backend::db_error)
    }
}

/// Builds a [`PostgresStore`].
#[derive(Debug)]
pub struct PostgresStoreBuilder {
    url: Option<String>,
    table: String,
    pool_size: Option<usize>,
    timeout: Duration,
    retries: u32,
    mode: StepMode,
    create_schema: bool,
    connect_lazily: bool,
    clock: Option<Arc<dyn Clock>>,
}

impl PostgresStoreBuilder {
    /// The database: `postgres://user:password@host:port/database` (or `postgresql://`, or
    /// libpq's `host=… user=…` form).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// The table of the rows (default `tollgate_state`): lower-case letters, digits and
    /// underscores, optionally after a schema and a dot.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The most connections the pool opens (default four per CPU).
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = Some(size.max(1));
        self
    }

    /// The longest a step may take, waiting for a connection and retries included (default
    /// 500 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many times a step that met a concurrent write starts again (default 8).
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// How a step keeps other writers out (default [`StepMode::Locks`]).
    pub fn mode(mut self, mode: StepMode) -> Self {
        self.mode = mode;
        self
    }

    /// Creates the table and its index when the store is built, if they are missing (default
    /// off: the SQL of [`PostgresStore::schema_sql`] in a migration is the other way).
    pub fn create_schema(mut self, create: bool) -> Self {
        self.create_schema = create;
        self
    }

    /// Builds the store without connecting (default off: `build` fails when Postgres cannot be
    /// reached). On, an app starts while Postgres is down and answers by its failure policy
    /// until it is up; the schema, if asked for, is created at build when Postgres answers,
    /// else by a call of [`ensure_schema`](PostgresStore::ensure_schema).
    pub fn connect_lazily(mut self, lazily: bool) -> Self {
        self.connect_lazily = lazily;
        self
    }

    /// Decides by `clock` instead of the database's (tests drive a
    /// [`ManualClock`](crate::clock::ManualClock) this way).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Builds the store: the pool, and unless [`connect_lazily`](Self::connect_lazily), a first
    /// connection (and the schema when asked for).
    pub async fn build(self) -> Result<PostgresStore, StoreError> {
        let config = |message: String| StoreError::new(StoreErrorKind::Config, message);
        let url = self
            .url
            .ok_or_else(|| config("no url: give the database's with `url`".to_owned()))?;
        let pg: tokio_postgres::Config = url
            .parse()
            .map_err(|e| config(format!("not a Postgres URL: {e}")))?;
        if !sql::valid_table(&self.table) {
            return Err(config(format!(
                "{:?} is not a table name this store writes (lower-case letters, digits, \
                 underscores, and an optional schema before a dot)",
                self.table
            )));
        }
        let manager = Manager::from_config(
            pg,
            tokio_postgres::NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
        let pool = Pool::builder(manager)
            .max_size(self.pool_size.unwrap_or(4 * cpus))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(self.timeout))
            .create_timeout(Some(self.timeout.max(Duration::from_secs(1))))
            .recycle_timeout(Some(self.timeout))
            .build()
            .map_err(|e| config(e.to_string()))?;
        let backend = PostgresBackend {
            pool,
            sql: Arc::new(sql::Statements::new(&self.table)),
            mode: self.mode,
            table: self.table.into(),
            round_trips: Arc::default(),
        };
        let mut store = TransactionalStore::new(backend)
            .retries(self.retries)
            .timeout(self.timeout);
        if let Some(clock) = self.clock {
            store = store.clock(ArcClock(clock));
        }
        match (self.connect_lazily, self.create_schema) {
            (false, true) => store.ensure_schema().await?,
            (false, false) => drop(store.backend().connection().await?),
            // Started while Postgres may be down: the table is created now if it can be, and a
            // failure is the first request's to meet.
            (true, true) => {
                if let Err(error) = store.ensure_schema().await {
                    tracing::warn!(%error, "the Postgres store's table was not created");
                }
            }
            (true, false) => {}
        }
        Ok(store)
    }
}

/// A shared clock handed on as a clock.
#[derive(Debug)]
struct ArcClock(Arc<dyn Clock>);

impl Clock for ArcClock {
    fn now(&self) -> crate::algorithm::Micros {
        self.0.now()
    }
}
