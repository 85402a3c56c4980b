//! Redis behind Sentinel: the store asks the sentinels which server is the master, talks to it
//! through one auto-reconnecting connection, and asks again when the master may have changed — any
//! call that failed (on the connection, refused by a replica with `READONLY`, …) or timed out. A
//! master found at a new address gets a new connection; calls in flight on the old one fail and
//! the layer's failure policy (with the circuit breaker) answers for them meanwhile.
//!
//! URL: `redis+sentinel://host:port[,host:port…]/master-name` (the sentinels' addresses).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::sentinel::{SentinelClient, SentinelServerType};
use ::redis::{Cmd, ConnectionAddr, FromRedisValue, RedisError};

/// How often, at most, the sentinels are asked again: a burst of failed calls asks once.
const ASK_AT_MOST_EVERY: Duration = Duration::from_millis(100);

/// The sentinels and master name of a `redis+sentinel://` URL, if it is one.
pub(super) fn parse(url: &str) -> Option<Result<(Vec<String>, String), String>> {
    let rest = url.strip_prefix("redis+sentinel://")?;
    let expected = "(expected redis+sentinel://host:port[,host:port...]/master-name)";
    let Some((hosts, master)) = rest.split_once('/') else {
        return Some(Err(format!("{url:?} names no master {expected}")));
    };
    let sentinels: Vec<String> = hosts
        .split(',')
        .filter(|host| !host.is_empty())
        .map(|host| format!("redis://{host}"))
        .collect();
    if sentinels.is_empty() || master.is_empty() || master.contains('/') {
        return Some(Err(format!("{url:?} {expected}")));
    }
    Some(Ok((sentinels, master.to_owned())))
}

/// The connection to the master the sentinels name, replaced when they name another.
#[derive(Clone)]
pub(super) struct Failover(Arc<Inner>);

struct Inner {
    /// The sentinels' client; locked by the one task asking them.
    sentinel: tokio::sync::Mutex<SentinelClient>,
    /// The sentinels' addresses and the master's name, to build that client afresh.
    sentinels: Vec<String>,
    name: String,
    /// The master's address and the connection to it.
    master: Mutex<(ConnectionAddr, ConnectionManager)>,
    /// When the sentinels were last asked.
    asked: Mutex<Instant>,
    config: ConnectionManagerConfig,
}

impl Failover {
    pub(super) async fn connect(
        sentinels: &[String],
        master: &str,
        config: ConnectionManagerConfig,
    ) -> Result<Failover, RedisError> {
        let mut sentinel = sentinel_client(sentinels, master)?;
        let client = sentinel.async_get_client().await?;
        let addr = client.get_connection_info().addr().clone();
        let manager = ConnectionManager::new_with_config(client, config.clone()).await?;
        Ok(Failover(Arc::new(Inner {
            sentinel: tokio::sync::Mutex::new(sentinel),
            sentinels: sentinels.to_vec(),
            name: master.to_owned(),
            master: Mutex::new((addr, manager)),
            asked: Mutex::new(Instant::now()),
            config,
        })))
    }

    /// The connection to the master as last found.
    pub(super) fn manager(&self) -> ConnectionManager {
        let master = self.0.master.lock().unwrap_or_else(PoisonError::into_inner);
        master.1.clone()
    }

    pub(super) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, RedisError> {
        let answer = cmd.query_async(&mut self.manager()).await;
        if answer.is_err() {
            // Any failure: the connection manager reports a dead master in more than one way
            // (the error of its last reconnection attempt, among others), and asking again costs
            // one sentinel query per 100 ms at most.
            self.suspect();
        }
        answer
    }

    /// Asks the sentinels again, in the background, unless a task is at it or they were asked
    /// within the last 100 ms.
    pub(super) fn suspect(&self) {
        {
            let mut asked = self.0.asked.lock().unwrap_or_else(PoisonError::into_inner);
            if asked.elapsed() < ASK_AT_MOST_EVERY {
                return;
            }
            *asked = Instant::now();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = self.0.clone();
        runtime.spawn(async move {
            // Bounded: a sentinel or a new master that does not answer must not hold the lock
            // that every later attempt needs.
            let _ = tokio::time::timeout(FIND_AT_MOST, find_master(&inner)).await;
        });
    }
}

/// How long one search for the master may take.
const FIND_AT_MOST: Duration = Duration::from_secs(2);

/// How long the sentinels may take to name the master, within a search.
const ASK_SENTINELS_AT_MOST: Duration = Duration::from_secs(1);

/// A client of `sentinels` for the master they call `name`.
fn sentinel_client(sentinels: &[String], name: &str) -> Result<SentinelClient, RedisError> {
    // An owned name: without redis' TLS feature the builder takes a `String`, with it any
    // `AsRef<str>`.
    #[allow(clippy::unnecessary_to_owned)]
    SentinelClient::build(
        sentinels.to_vec(),
        name.to_owned(),
        None,
        SentinelServerType::Master,
    )
}

/// Asks the sentinels for the master and moves to it if it changed.
async fn find_master(inner: &Inner) {
    let Ok(mut sentinel) = inner.sentinel.try_lock() else {
        return;
    };
    let asked = tokio::time::timeout(ASK_SENTINELS_AT_MOST, sentinel.async_get_client()).await;
    let client = match asked {
        Ok(Ok(client)) => client,
        failed => {
            match failed {
                Ok(Err(error)) => {
                    tracing::debug!(%error, "rate limit: the sentinels named no master")
                }
                _ => tracing::debug!("rate limit: the sentinels did not answer in time"),
            }
            // The client keeps a connection to each sentinel; one left broken by a failure or
            // by a search cut short must not fail every later search: the next starts afresh.
            if let Ok(fresh) = sentinel_client(&inner.sentinels, &inner.name) {
                *sentinel = fresh;
            }
            return;
        }
    };
    let addr = client.get_connection_info().addr().clone();
    let known = inner
        .master
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .0
        == addr;
    if known {
        return;
    }
    match ConnectionManager::new_with_config(client, inner.config.clone()).await {
        Ok(manager) => {
            tracing::warn!(master = %addr, "rate limit: Redis master changed (Sentinel); following it");
            *inner.master.lock().unwrap_or_else(PoisonError::into_inner) = (addr, manager);
        }
        Err(error) => {
            tracing::debug!(%error, master = %addr, "rate limit: the new master does not answer yet");
        }
    }
}
