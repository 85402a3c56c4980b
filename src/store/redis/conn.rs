//! The connection: one multiplexed, auto-reconnecting connection to a Redis server, or the cluster
//! client's connection (which follows slot moves and reconnects to nodes by itself). Both are
//! cheap to clone and pipeline the commands of concurrent callers on shared sockets.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use ::redis::{Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, ServerErrorKind, Value};

use super::failover::{self, Failover};
use super::lua::Lua;

use crate::store::{StoreError, StoreErrorKind};

#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// The master that Sentinel names, followed through failovers.
    Sentinel(Failover),
    /// Not connected yet: connects on first use (`RedisStoreBuilder::connect_lazily`).
    Later(Arc<Later>),
}

/// A connection still to be made, and what makes it.
pub(super) struct Later {
    target: Target,
    tls: Tls,
    timeout: Duration,
    conn: tokio::sync::OnceCell<Conn>,
    /// When the last attempt failed: the next waits a second.
    failed: Mutex<Option<Instant>>,
}

/// How long after a failed attempt the next one may start.
const RETRY_CONNECTING: Duration = Duration::from_secs(1);

impl Later {
    /// The connection, made now if it can be.
    async fn get(&self) -> Result<Conn, RedisError> {
        if let Some(conn) = self.conn.get() {
            return Ok(conn.clone());
        }
        let recent = *self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        if recent.is_some_and(|at| at.elapsed() < RETRY_CONNECTING) {
            return Err(not_yet());
        }
        let made = self
            .conn
            .get_or_try_init(|| async {
                Conn::connect(&self.target, &self.tls, self.timeout)
                    .await
                    .map_err(|_| not_yet())
            })
            .await;
        if made.is_err() {
            *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        }
        made.cloned()
    }
}

/// The error of a call while the lazy connection is not made.
fn not_yet() -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "not connected to Redis yet",
        "the store was built with connect_lazily and Redis has not answered".to_owned(),
    ))
}

/// Where the store connects.
#[derive(Clone, Debug)]
pub(super) enum Target {
    Single(String),
    Cluster(Vec<String>),
}

/// The certificates of `rediss://` connections beyond the system's roots (feature `redis-tls`).
#[derive(Clone, Debug, Default)]
#[cfg_attr(not(feature = "redis-tls"), allow(dead_code))]
pub(super) struct Tls {
    /// A certificate authority to trust instead of the system's (PEM).
    pub(super) ca: Option<Vec<u8>>,
    /// A client certificate and its key (PEM).
    pub(super) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl Tls {
    #[cfg(feature = "redis-tls")]
    fn certificates(&self) -> Option<::redis::TlsCertificates> {
        if self.ca.is_none() && self.client.is_none() {
            return None;
        }
        Some(::redis::TlsCertificates {
            client_tls: self.client.clone().map(|(client_cert, client_key)| {
                ::redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }
            }),
            root_cert: self.ca.clone(),
        })
    }
}

impl Conn {
    /// A connection made on first use; one attempt now, so that a Redis that answers is
    /// connected at once, and a warning when it does not.
    pub(super) async fn later(target: &Target, tls: &Tls, timeout: Duration) -> Conn {
        let later = Arc::new(Later {
            target: target.clone(),
            tls: tls.clone(),
            timeout,
            conn: tokio::sync::OnceCell::new(),
            failed: Mutex::new(None),
        });
        if let Err(error) = later.get().await {
            tracing::warn!(
                %error,
                "rate limit: Redis cannot be reached at start; the failure policy answers until it can"
            );
        }
        Conn::Later(later)
    }

    pub(super) async fn connect(
        target: &Target,
        tls: &Tls,
        timeout: Duration,
    ) -> Result<Conn, StoreError> {
        // Reconnection attempts back off up to a second, so a server that comes back is found
        // again within about a second.
        let connect_timeout = connect_timeout(timeout);
        match target {
            Target::Single(url) => {
                // No response timeout here: every call already runs under the store's own
                // timeout (which also bounds reconnecting and reloading the script), and a second
                // timer per request would only cost time.
                let manager_config = ConnectionManagerConfig::new()
                    .set_response_timeout(None)
                    .set_connection_timeout(Some(connect_timeout))
                    .set_min_delay(Duration::from_millis(20))
                    .set_max_delay(Duration::from_secs(1))
                    .set_number_of_retries(4);
                if let Some(sentinel) = failover::parse(url) {
                    let (sentinels, master) = sentinel
                        .map_err(|message| StoreError::new(StoreErrorKind::Config, message))?;
                    let failover = Failover::connect(&sentinels, &master, manager_config)
                        .await
                        .map_err(error)?;
                    return Ok(Conn::Sentinel(failover));
                }
                let client = open(url, tls).map_err(config)?;
                let manager = ConnectionManager::new_with_config(client, manager_config)
                    .await
                    .map_err(error)?;
                Ok(Conn::Single(manager))
            }
            Target::Cluster(nodes) => {
                let builder = ClusterClient::builder(nodes.iter().map(String::as_str))
                    .connection_timeout(connect_timeout)
                    .response_timeout(timeout)
                    .retries(2);
                #[cfg(feature = "redis-tls")]
                let builder = match tls.certificates() {
                    Some(certificates) => builder.certs(certificates),
                    None => builder,
                };
                #[cfg(not(feature = "redis-tls"))]
                let _ = tls;
                let client = builder.build().map_err(config)?;
                let connection = client.get_async_connection().await.map_err(error)?;
                Ok(Conn::Cluster(connection))
            }
        }
    }

    pub(super) async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, RedisError> {
        match self {
            Conn::Later(later) => later.get().await?.query_made(cmd).await,
            made => made.query_made(cmd).await,
        }
    }

    /// [`query`](Self::query) on a connection made (a lazy one's is never lazy itself).
    async fn query_made<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, RedisError> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
            Conn::Sentinel(f) => f.query(cmd).await,
            Conn::Later(_) => Err(not_yet()),
        }
    }

    /// Runs `cmd` on the server; on a cluster, on the master holding `slot` (any node for
    /// `None`). For commands about a node rather than a key (`SCAN`, `CLUSTER SLOTS`).
    pub(super) async fn query_node(
        &mut self,
        cmd: &Cmd,
        slot: Option<u16>,
    ) -> Result<Value, RedisError> {
        match self.made().await? {
            Conn::Cluster(mut c) => c.route_command(cmd.clone(), routing(slot)).await,
            mut made => made.query_made(cmd).await,
        }
    }

    /// Runs `pipe` on the server; on a cluster, on the master holding `slot`: the answers, in
    /// order.
    pub(super) async fn pipeline_on(
        &mut self,
        pipe: Pipeline,
        slot: Option<u16>,
    ) -> Result<Vec<Value>, RedisError> {
        match self.made().await? {
            Conn::Single(mut c) => pipe.query_async(&mut c).await,
            Conn::Cluster(mut c) => {
                let route = match routing(slot) {
                    RoutingInfo::SingleNode(route) => route,
                    _ => SingleNodeRoutingInfo::Random,
                };
                let count = pipe.len();
                c.route_pipeline(pipe, 0, count, route).await
            }
            Conn::Sentinel(f) => {
                let answer = pipe.query_async(&mut f.manager()).await;
                if answer.is_err() {
                    f.suspect();
                }
                answer
            }
            Conn::Later(_) => Err(not_yet()),
        }
    }

    /// The connection, made now if it is a lazy one not made yet.
    async fn made(&self) -> Result<Conn, RedisError> {
        match self {
            Conn::Later(later) => later.get().await,
            made => Ok(made.clone()),
        }
    }

    /// A call got no answer in time: behind Sentinel, the master may have moved.
    pub(super) fn suspect(&self) {
        match self {
            Conn::Sentinel(f) => f.suspect(),
            Conn::Later(later) => {
                if let Some(conn) = later.conn.get() {
                    conn.suspect();
                }
            }
            _ => {}
        }
    }

    /// Loads `script` (on a cluster, into every primary).
    async fn load(&mut self, script: &Lua) -> Result<(), RedisError> {
        let mut made = match self {
            Conn::Later(later) => later.get().await?,
            made => made.clone(),
        };
        match &mut made {
            Conn::Single(c) => script.script().load_async(c).await?,
            Conn::Cluster(c) => script.script().load_async(c).await?,
            Conn::Sentinel(f) => script.script().load_async(&mut f.manager()).await?,
            Conn::Later(_) => return Err(not_yet()),
        };
        Ok(())
    }

    /// Loads every one of `scripts`, all at once (the connection carries them side by side).
    ///
    /// A server that answers `SCRIPT LOAD` with an error (a managed service that forbids the
    /// `SCRIPT` command, or one renamed away) is not a failure: [`eval`](Self::eval) then sends
    /// each script's source the first time the server does not know it. Only a server that does
    /// not answer fails the connection.
    pub(super) async fn load_all(&self, scripts: &[&Lua]) -> Result<(), StoreError> {
        let mut loads = tokio::task::JoinSet::new();
        for &script in scripts {
            let (mut conn, script) = (self.clone(), Lua::clone(script));
            loads.spawn(async move { conn.load(&script).await });
        }
        let mut refused = None;
        while let Some(loaded) = loads.join_next().await {
            match loaded.map_err(|e| StoreError::new(StoreErrorKind::Protocol, e))? {
                Ok(()) => {}
                Err(e) if is_refusal(&e) => refused = Some(e),
                Err(e) => return Err(error(e)),
            }
        }
        if let Some(e) = refused {
            tracing::info!(
                error = %e,
                "rate limit: Redis refused SCRIPT LOAD; each script is sent with EVAL the first \
                 time a server does not know it, then by its hash"
            );
        }
        Ok(())
    }

    /// Runs `cmd`, an `EVALSHA` of `script`; after `NOSCRIPT` (a restarted or flushed server, or
    /// one that refused `SCRIPT LOAD`), the same call as an `EVAL` of the script's source, which
    /// runs it and leaves it in the server's script cache for the next `EVALSHA`. No `SCRIPT`
    /// command on the way: managed services that forbid it work the same.
    pub(super) async fn eval<T: FromRedisValue>(
        &mut self,
        script: &Lua,
        cmd: &Cmd,
    ) -> Result<T, RedisError> {
        match self.query(cmd).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.query(&by_source(script, cmd)).await
            }
            other => other,
        }
    }

    /// [`eval`](Self::eval) on a connection as Redis is now: when the call fails on the
    /// connection itself, which may be a failure kept from an earlier attempt (see
    /// [`reconnects`]), once more on the connection the failure started.
    pub(super) async fn eval_afresh<T: FromRedisValue>(
        &mut self,
        script: &Lua,
        cmd: &Cmd,
    ) -> Result<T, RedisError> {
        match self.eval(script, cmd).await {
            Err(e) if reconnects(&e) => self.eval(script, cmd).await,
            other => other,
        }
    }
}

/// A cluster's route to the master holding `slot`, or to any node.
fn routing(slot: Option<u16>) -> RoutingInfo {
    RoutingInfo::SingleNode(match slot {
        Some(slot) => SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master)),
        None => SingleNodeRoutingInfo::Random,
    })
}

/// The client of one server, with the certificates given for TLS.
fn open(url: &str, tls: &Tls) -> Result<::redis::Client, RedisError> {
    #[cfg(feature = "redis-tls")]
    if let Some(certificates) = tls.certificates() {
        return ::redis::Client::build_with_tls(url, certificates);
    }
    let _ = tls;
    ::redis::Client::open(url)
}

/// `cmd`, an `EVALSHA <hash> …` of `script`, as `EVAL <source> …`.
fn by_source(script: &Lua, cmd: &Cmd) -> Cmd {
    let mut eval = ::redis::cmd("EVAL");
    eval.arg(script.source());
    for arg in cmd.args_iter().skip(2) {
        if let ::redis::Arg::Simple(bytes) = arg {
            eval.arg(bytes);
        }
    }
    eval
}

/// Whether `e` is the server refusing a command (unknown, renamed away, or denied by its ACL), as
/// opposed to not answering.
fn is_refusal(e: &RedisError) -> bool {
    !(e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal())
        && e.kind() != ErrorKind::Server(ServerErrorKind::BusyLoading)
        && e.kind() != ErrorKind::Server(ServerErrorKind::MasterDown)
}

/// Whether the connection starts over after `e`: the connection manager then opens a new one
/// (the cluster client refreshes its own), so a second call reaches Redis as it is now.
///
/// This matters after an outage. The manager keeps the result of its last attempt to reconnect
/// and hands it to the next caller, who gets that failure at once while a new attempt starts: the
/// first call after Redis is back fails with an error from the time it was down.
pub(super) fn reconnects(e: &RedisError) -> bool {
    e.is_io_error() || e.is_unrecoverable_error()
}

/// A Redis failure as the layer's failure policy sees it.
pub(super) fn error(e: RedisError) -> StoreError {
    let kind = if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                )
        )
    {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Protocol
    };
    StoreError::new(kind, e)
}

fn config(e: RedisError) -> StoreError {
    StoreError::new(StoreErrorKind::Config, e)
}

/// How long connecting (and loading the script) may take: a little longer than one decision.
pub(super) fn connect_timeout(timeout: Duration) -> Duration {
    timeout.max(Duration::from_secs(1))
}

pub(super) fn timed_out(timeout: Duration) -> StoreError {
    StoreError::new(
        StoreErrorKind::Timeout,
        format!("no answer from Redis within {timeout:?}"),
    )
}
