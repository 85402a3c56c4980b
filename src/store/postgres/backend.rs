//! The Postgres backend: the rows of a [`TransactionalStore`](crate::store::TransactionalStore)
//! in one table, read and written through a pool of connections.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;

use deadpool_postgres::{Object, Pool, PoolError};
use tokio_postgres::error::SqlState;
use tokio_postgres::Statement;

use super::sql::Statements;
use crate::algorithm::Micros;
use crate::store::transact::{Row, RowKey, RowKind, Snapshot, TransactionalBackend, Write};
use crate::store::{StoreError, StoreErrorKind};

/// How a step keeps other writers out between its read and its write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepMode {
    /// The read locks the rows (`BEGIN`, `SELECT … FOR UPDATE`, the clock: one round trip), the
    /// write and `COMMIT` follow in one more (a step that writes nothing, a denial, answers
    /// without waiting for its `COMMIT`). Concurrent steps on a key wait in line instead of
    /// failing and starting again.
    #[default]
    Locks,
    /// The read takes no lock (one statement); the write happens only if every row still has
    /// the version read, and a step that lost the race starts again, up to the store's
    /// retries. Two round trips for a step that writes, one for a denial; on a busy key most
    /// steps lose the race.
    Versions,
}

/// The rows of a Postgres store: a pool, a table and its statements. Built by
/// [`PostgresStore::builder`](crate::PostgresStore::builder).
#[derive(Clone)]
pub struct PostgresBackend {
    pub(super) pool: Pool,
    pub(super) sql: Arc<Statements>,
    pub(super) mode: StepMode,
    pub(super) table: Arc<str>,
    /// Exchanges with the server: statements sent together and answered together count once.
    pub(super) round_trips: Arc<AtomicU64>,
}

impl PostgresBackend {
    /// The round trips to Postgres so far, counted by the store: statements sent together (a
    /// pipeline) count once; preparing a statement on a new connection counts too.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    fn trip(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    /// A statement prepared on `conn` (from the connection's cache after the first time).
    async fn prepared(&self, conn: &Object, sql: &str) -> Result<Statement, StoreError> {
        let cached = conn.statement_cache.size();
        let statement = conn.prepare_cached(sql).await.map_err(db_error)?;
        if conn.statement_cache.size() != cached {
            self.trip();
        }
        Ok(statement)
    }
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self.pool.status();
        f.debug_struct("PostgresBackend")
            .field("table", &self.table)
            .field("mode", &self.mode)
            .field("connections", &status.size)
            .field("max_connections", &status.max_size)
            .finish()
    }
}

/// A connection inside a transaction that holds rows' locks, between a step's read and its
/// write. Dropped without its write (a timeout, an error), it takes the connection out of the
/// pool and closes it, which makes the server roll the transaction back: a connection in the
/// middle of a transaction never goes back to the pool.
pub struct PostgresStep {
    conn: Option<Object>,
}

impl PostgresStep {
    fn release(mut self) -> Option<Object> {
        self.conn.take()
    }
}

impl Drop for PostgresStep {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            drop(Object::take(conn));
        }
    }
}

impl std::fmt::Debug for PostgresStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PostgresStep")
    }
}

impl PostgresBackend {
    pub(super) async fn connection(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(pool_error)
    }

    /// The table's rows of `keys` (with the locks of those that exist, in lock mode).
    async fn read_rows(
        &self,
        keys: &[RowKey],
    ) -> Result<Snapshot<Option<PostgresStep>>, StoreError> {
        let (kinds, rules, names) = columns(keys);
        let conn = self.connection().await?;
        match self.mode {
            StepMode::Versions => {
                let statement = self.prepared(&conn, &self.sql.read).await?;
                self.trip();
                let found = conn
                    .query(&statement, &[&kinds, &rules, &names])
                    .await
                    .map_err(db_error)?;
                let mut rows = vec![None; keys.len()];
                let mut now = None;
                for found in found {
                    let i: i64 = found.try_get(0).map_err(db_error)?;
                    now = Some(found.try_get::<_, i64>(4).map_err(db_error)?);
                    let version: Option<i64> = found.try_get(1).map_err(db_error)?;
                    if let (Some(version), Some(slot)) = (version, usize::try_from(i - 1).ok()) {
                        if let Some(slot) = rows.get_mut(slot) {
                            *slot = Some(Row {
                                version: version as u64,
                                state: found.try_get(2).map_err(db_error)?,
                                expires_at: found.try_get::<_, i64>(3).map_err(db_error)?.max(0)
                                    as Micros,
                            });
                        }
                    }
                }
                Ok(Snapshot {
                    rows,
                    now: now.map(|n| n.max(0) as Micros),
                    step: None,
                })
            }
            StepMode::Locks => {
                let lock = self.prepared(&conn, &self.sql.lock).await?;
                let clock = self.prepared(&conn, self.sql.clock).await?;
                self.trip();
                let held = PostgresStep { conn: Some(conn) };
                let conn = held.conn.as_ref().ok_or_else(lost)?;
                // Sent together, answered together: one round trip. The clock is read after the
                // locks are held, so it is never earlier than the previous holder's.
                let (begun, locked, now) = join3(
                    conn.batch_execute("BEGIN"),
                    conn.query(&lock, &[&kinds, &rules, &names]),
                    conn.query_one(&clock, &[]),
                )
                .await;
                begun.map_err(db_error)?;
                let locked = locked.map_err(db_error)?;
                let now: i64 = now.map_err(db_error)?.try_get(0).map_err(db_error)?;
                let mut rows = vec![None; keys.len()];
                for found in locked {
                    let kind: i16 = found.try_get(0).map_err(db_error)?;
                    let rule: &str = found.try_get(1).map_err(db_error)?;
                    let key: &[u8] = found.try_get(2).map_err(db_error)?;
                    let at = keys
                        .iter()
                        .position(|k| k.kind.code() == kind && k.rule == rule && k.key == key);
                    if let Some(at) = at {
                        rows[at] = Some(Row {
                            version: found.try_get::<_, i64>(3).map_err(db_error)? as u64,
                            state: found.try_get(4).map_err(db_error)?,
                            expires_at: found.try_get::<_, i64>(5).map_err(db_error)?.max(0)
                                as Micros,
                        });
                    }
                }
                Ok(Snapshot {
                    rows,
                    now: Some(now.max(0) as Micros),
                    step: Some(held),
                })
            }
        }
    }

    async fn write_rows(
        &self,
        held: Option<PostgresStep>,
        writes: &[Write],
    ) -> Result<bool, StoreError> {
        match held {
            None if writes.is_empty() => Ok(true),
            None => {
                let conn = self.connection().await?;
                let statement = self.prepared(&conn, &self.sql.write).await?;
                let (kinds, rules, names, versions, next, states, expiries) = write_columns(writes);
                self.trip();
                let written = conn
                    .query_one(
                        &statement,
                        &[&kinds, &rules, &names, &versions, &next, &states, &expiries],
                    )
                    .await;
                conflict_or(written.map(drop))
            }
            Some(held) => {
                if writes.is_empty() {
                    // Nothing written (a denial, a check): the answer does not wait for the
                    // `COMMIT` that releases the locks. A connection whose `COMMIT` fails is
                    // closed rather than pooled.
                    self.trip();
                    tokio::spawn(async move {
                        if let Some(conn) = held.conn.as_ref() {
                            if conn.batch_execute("COMMIT").await.is_ok() {
                                drop(held.release());
                            }
                        }
                    });
                    return Ok(true);
                }
                let conn = held.conn.as_ref().ok_or_else(lost)?;
                let statement = self.prepared(conn, &self.sql.write).await?;
                let (kinds, rules, names, versions, next, states, expiries) = write_columns(writes);
                self.trip();
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
                    [&kinds, &rules, &names, &versions, &next, &states, &expiries];
                // After a conflict the transaction is aborted, and its `COMMIT` rolls it back.
                let (written, committed) = join2(
                    conn.query_one(&statement, &params),
                    conn.batch_execute("COMMIT"),
                )
                .await;
                let written = conflict_or(written.map(drop));
                committed.map_err(db_error)?;
                drop(held.release());
                written
            }
        }
    }
}

impl TransactionalBackend for PostgresBackend {
    type Step = Option<PostgresStep>;

    fn read(
        &self,
        keys: &[RowKey],
    ) -> impl Future<Output = Result<Snapshot<Option<PostgresStep>>, StoreError>> + Send {
        self.read_rows(keys)
    }

    fn write(
        &self,
        step: Option<PostgresStep>,
        writes: &[Write],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.write_rows(step, writes)
    }

    async fn remove_idle(&self, now: Micros, limit: usize) -> Result<u64, StoreError> {
        let conn = self.connection().await?;
        let statement = self.prepared(&conn, &self.sql.remove_idle).await?;
        self.trip();
        let now = i64::try_from(now).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        conn.execute(&statement, &[&now, &limit])
            .await
            .map_err(db_error)
    }

    async fn list(
        &self,
        kind: RowKind,
        rule: &str,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Row)>, StoreError> {
        let conn = self.connection().await?;
        let statement = self.prepared(&conn, &self.sql.list).await?;
        self.trip();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let found = conn
            .query(&statement, &[&kind.code(), &rule, &after, &limit])
            .await
            .map_err(db_error)?;
        found
            .into_iter()
            .map(|found| {
                let key: Vec<u8> = found.try_get(0)?;
                let row = Row {
                    version: found.try_get::<_, i64>(1)? as u64,
                    state: found.try_get(2)?,
                    expires_at: found.try_get::<_, i64>(3)?.max(0) as Micros,
                };
                Ok((key, row))
            })
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(db_error)
    }
}

type Columns<'a> = (Vec<i16>, Vec<&'a str>, Vec<&'a [u8]>);

fn columns(keys: &[RowKey]) -> Columns<'_> {
    (
        keys.iter().map(|k| k.kind.code()).collect(),
        keys.iter().map(|k| k.rule.as_str()).collect(),
        keys.iter().map(|k| k.key.as_slice()).collect(),
    )
}

type WriteColumns<'a> = (
    Vec<i16>,
    Vec<&'a str>,
    Vec<&'a [u8]>,
    Vec<i64>,
    Vec<i64>,
    Vec<Option<&'a [u8]>>,
    Vec<i64>,
);

/// Seconds, in µs: expiries are rounded up to the next one.
const SECOND: Micros = 1_000_000;

fn write_columns(writes: &[Write]) -> WriteColumns<'_> {
    (
        writes.iter().map(|w| w.key.kind.code()).collect(),
        writes.iter().map(|w| w.key.rule.as_str()).collect(),
        writes.iter().map(|w| w.key.key.as_slice()).collect(),
        writes.iter().map(|w| w.version as i64).collect(),
        // A random version: a row removed and written again is never taken for an older one.
        writes.iter().map(|_| fastrand::i64(1..i64::MAX)).collect(),
        writes
            .iter()
            .map(|w| w.row.as_ref().map(|(state, _)| state.as_slice()))
            .collect(),
        // Kept to the second, rounded up (removed a little later, never sooner): most writes
        // of a busy key then leave the indexed expiry as it was, so Postgres updates the row
        // in place without a new index entry.
        writes
            .iter()
            .map(|w| {
                let at = w.row.as_ref().map_or(0, |(_, at)| *at);
                let at = at.saturating_add(SECOND - 1) / SECOND * SECOND;
                i64::try_from(at).unwrap_or(i64::MAX)
            })
            .collect(),
    )
}

/// A write's answer: written, refused by a changed row (the division by zero of the write
/// statement, or a lock or serialization conflict), or an error.
fn conflict_or(written: Result<(), tokio_postgres::Error>) -> Result<bool, StoreError> {
    match written {
        Ok(()) => Ok(true),
        Err(error)
            if matches!(
                error.code(),
                Some(&SqlState::DIVISION_BY_ZERO)
                    | Some(&SqlState::T_R_SERIALIZATION_FAILURE)
                    | Some(&SqlState::T_R_DEADLOCK_DETECTED)
                    | Some(&SqlState::UNIQUE_VIOLATION)
            ) =>
        {
            Ok(false)
        }
        Err(error) => Err(db_error(error)),
    }
}

fn lost() -> StoreError {
    StoreError::new(StoreErrorKind::Protocol, "the step's connection is gone")
}

/// An error of the database: unreachable when the connection failed, a protocol error when the
/// database refused a statement (a missing table, a read-only server: the message says which).
pub(super) fn db_error(error: tokio_postgres::Error) -> StoreError {
    let kind = if error.as_db_error().is_some() {
        match error.code() {
            Some(code) if code.code().starts_with("08") || code.code().starts_with("57") => {
                StoreErrorKind::Unavailable
            }
            _ => StoreErrorKind::Protocol,
        }
    } else {
        StoreErrorKind::Unavailable
    };
    StoreError::new(kind, error)
}

pub(super) fn pool_error(error: PoolError) -> StoreError {
    match error {
        PoolError::Timeout(_) => StoreError::new(StoreErrorKind::Timeout, error),
        PoolError::Backend(error) => db_error(error),
        other => StoreError::new(StoreErrorKind::Unavailable, other),
    }
}

/// Polls two futures together (so that their statements leave in one write), both answers.
async fn join2<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (pin!(a), pin!(b));
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(|cx| {
        if ra.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v);
            }
        }
        match (ra.take(), rb.take()) {
            (Some(a), Some(b)) => Poll::Ready((a, b)),
            (a, b) => {
                (ra, rb) = (a, b);
                Poll::Pending
            }
        }
    })
    .await
}

/// [`join2`] of three.
async fn join3<A: Future, B: Future, C: Future>(
    a: A,
    b: B,
    c: C,
) -> (A::Output, B::Output, C::Output) {
    let ((a, b), c) = join2(join2(a, b), c).await;
    (a, b, c)
}
