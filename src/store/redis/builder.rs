//! `RedisStoreBuilder`: where Redis is, the store's prefix, timeout, deny cache, shards and
//! leases, and the connection it opens.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::cache::DenyCache;
use super::conn::{self, Conn, Target};
use super::leases::{self, Leases};
use super::lua::Scripts;
use super::quota::Quotas;
use super::shard::Sharding;
use super::{keys, Inner, RedisStore, DEFAULT_CACHE_SIZE};
use crate::clock::{Clock, SystemClock};
use crate::store::{StoreError, StoreErrorKind};

/// Configures and connects a [`RedisStore`].
#[must_use]
pub struct RedisStoreBuilder {
    pub(super) target: Target,
    pub(super) prefix: String,
    pub(super) timeout: Duration,
    pub(super) clock: Option<Arc<dyn Clock>>,
    pub(super) cache: Option<usize>,
    pub(super) shards: Vec<(String, u32)>,
    pub(super) lease: Duration,
    pub(super) tls: conn::Tls,
    pub(super) lazily: bool,
}

impl RedisStoreBuilder {
    /// Connects to one Redis server (default `redis://127.0.0.1:6379`; `rediss://` is TLS, with
    /// the feature `redis-tls`).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.target = Target::Single(url.into());
        self
    }

    /// Connects to a Redis Cluster through these nodes (any subset; the others are discovered).
    pub fn cluster<I, S>(mut self, nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.target = Target::Cluster(nodes.into_iter().map(Into::into).collect());
        self
    }

    /// The first part of every key name (default `tollgate`); no `{` or `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest a decision may wait for Redis before the layer's failure policy applies
    /// (default 100 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether keys known to be empty are answered locally until they refill (default: on).
    pub fn deny_cache(mut self, on: bool) -> Self {
        self.cache = on.then_some(self.cache.unwrap_or(DEFAULT_CACHE_SIZE));
        self
    }

    /// The most entries the deny cache holds (default 65 536; zero turns it off).
    pub fn deny_cache_size(mut self, entries: usize) -> Self {
        self.cache = (entries > 0).then_some(entries);
        self
    }

    /// Splits the rule named `rule` over `shards` Redis keys (two or more; see the type's docs
    /// on hot keys). Each shard gets an `n`-th of the limit.
    pub fn shard_rule(mut self, rule: impl Into<String>, shards: u32) -> Self {
        let rule = rule.into();
        self.shards.retain(|(r, _)| *r != rule);
        if shards >= 2 {
            self.shards.push((rule, shards));
        }
        self
    }

    /// How long a [concurrency](crate::Limit::concurrent) slot's lease lives unless renewed
    /// (default 60 s; at least 30 ms, a shorter one is raised to that).
    ///
    /// A slot taken in Redis is a lease with an expiry. While this instance holds it — while the
    /// response streams, however long — a background task renews it every third of this length,
    /// so a long stream keeps its slot. If the instance crashes, nothing renews its leases: they
    /// expire after at most this long, and their slots come back by themselves. If renewing fails
    /// for a whole lease length (Redis unreachable meanwhile), the lease lapses while its request
    /// still runs: the request no longer counts, so one more may be admitted while it lasts.
    /// A shorter lease returns a crashed instance's slots sooner; a longer one survives longer
    /// Redis outages.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Trusts the certificate authority in `pem` (PEM text) for `rediss://` servers, instead of
    /// the system's roots: a managed service's or your own CA. A server whose certificate it did
    /// not sign is an error from [`build`](Self::build), not from each request.
    #[cfg(feature = "redis-tls")]
    pub fn ca_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(pem.into());
        self
    }

    /// Presents this client certificate and its private key (both PEM text) to `rediss://`
    /// servers that require one (`tls-auth-clients yes`).
    #[cfg(feature = "redis-tls")]
    pub fn client_certificate(
        mut self,
        certificate: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((certificate.into(), key.into()));
        self
    }

    /// Whether [`build`](Self::build) may return a store while Redis cannot be reached (default:
    /// no, it fails). A store built lazily connects on first use: until Redis answers, its calls
    /// fail as `Unavailable` at once (a new attempt at most once a second) and the layer's
    /// failure policy answers for them; a warning says so once at start. For apps that fail
    /// open and must start while Redis is down; `Config::connect` builds this way unless the
    /// file says `on_failure = "closed"`.
    pub fn connect_lazily(mut self, lazily: bool) -> Self {
        self.lazily = lazily;
        self
    }

    /// **For tests**: the time comes from `clock` instead of the Redis server, and the deny cache
    /// follows it too. Don't use it in production: app hosts' clocks differ.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Connects (and loads the scripts).
    ///
    /// # Errors
    /// `Config` for a malformed URL or prefix; `Unavailable` or `Timeout` when Redis cannot be
    /// reached.
    pub async fn build(self) -> Result<RedisStore, StoreError> {
        if !keys::valid_prefix(&self.prefix) {
            return Err(StoreError::new(
                StoreErrorKind::Config,
                format!(
                    "key prefix {:?} contains `{{` or `}}`, which would move the cluster hash tag",
                    self.prefix
                ),
            ));
        }
        let scripts = Scripts::new();
        let conn = if self.lazily {
            // Boxed: the connection's future nests deep, and callers' own futures hold it.
            Box::pin(Conn::later(&self.target, &self.tls, self.timeout)).await
        } else {
            let conn = Conn::connect(&self.target, &self.tls, self.timeout).await?;
            let wait = conn::connect_timeout(self.timeout);
            tokio::time::timeout(wait, conn.load_all(&scripts.all()))
                .await
                .map_err(|_| conn::timed_out(wait))??;
            conn
        };
        let local: Arc<dyn Clock> = match &self.clock {
            Some(clock) => clock.clone(),
            None => Arc::new(SystemClock::new()),
        };
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn,
                target: self.target,
                scripts,
                prefix: self.prefix.into(),
                timeout: self.timeout,
                clock: self.clock,
                local,
                cache: self.cache.map(DenyCache::new),
                shards: self
                    .shards
                    .into_iter()
                    .map(|(rule, n)| (rule.into(), Arc::new(Sharding::new(n))))
                    .collect(),
                lease: leases::lease_of(self.lease),
                leases: Leases::default(),
                quotas: Quotas::new(DEFAULT_CACHE_SIZE),
            }),
        })
    }
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("target", &self.target)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("deny_cache", &self.cache)
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}
