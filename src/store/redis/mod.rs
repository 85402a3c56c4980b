//! `RedisStore`: limits shared by every instance of an app, in Redis or a Redis Cluster (see the
//! type's documentation for how it decides, fails and scales).
//!
//! The request path: `decide` (the deny cache `cache`, the `fast` paths, quota leases `quota`),
//! a charge as the scripts see it (`record`, with `keys` and `params`), one script call (`call`)
//! and its reply (`reply`), several cluster slots (`cross_slot`, `shard` for hot keys). Beside
//! it: `builder`, the connection (`conn`, `failover`), the scripts (`lua`), concurrency leases
//! (`leases`), and the operators' `listing` of blocks and `overrides`.

mod builder;
mod cache;
mod call;
mod conn;
mod cross_slot;
mod decide;
mod failover;
mod fast;
mod keys;
mod leases;
mod listing;
mod lua;
mod overrides;
mod params;
mod quota;
mod record;
mod reply;
mod shard;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::redis::Cmd;

pub use self::builder::RedisStoreBuilder;
use self::cache::DenyCache;
use self::conn::{Conn, Target};
use self::leases::Leases;
use self::lua::Scripts;
#[cfg(feature = "bench")]
pub(crate) use self::lua::{BUCKET_NOW, FIXED, SLIDING};
use self::params::{push_now, Packed};
use self::quota::Quotas;
use self::record::{Item, Op};
use self::shard::Sharding;
use super::{
    BlockedKey, Charge, Cursor, Outcome, Outcomes, OverrideEntry, Page, RuleName, Store,
    StoreError, StoreErrorKind, StoreFuture,
};
use crate::algorithm::error::ConfigError;
use crate::algorithm::{micros, Algorithm, Limit, Micros, Penalty};
use crate::clock::Clock;

const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
const DEFAULT_PREFIX: &str = "tollgate";
const DEFAULT_CACHE_SIZE: usize = 65_536;

/// A [`Store`] in Redis or a Redis Cluster: one limit for all the instances of an app.
///
/// Clones share the connection and the deny cache.
///
/// # How it decides
/// Every request is **one round trip**, whatever the number of rules: one Lua script (sent with
/// `EVALSHA`, and sent again by its source (`EVAL`) after `NOSCRIPT`, e.g. when Redis restarted) reads
/// every key of the request, decides every rule with the same math as the [`MemoryStore`]
/// (the scripts in `src/store/redis/lua/`, one per operation, are a port of
/// [`algorithm`](crate::algorithm), kept equal by a differential test), and commits all charges
/// or none. Redis runs a script atomically, so concurrent requests from any number of app
/// instances never over-admit.
///
/// Time comes from the Redis server (`TIME`), so app hosts whose clocks disagree still agree on
/// every limit. (A Redis Cluster's nodes each use their own clock for the keys they hold.)
///
/// Each key gets an expiry at the moment its state becomes equal to a new key's (a bucket that
/// has refilled, a window that has passed), so Redis holds no dead keys. A token bucket with an
/// [`initial`](crate::Limit::initial) balance below its capacity starts from that balance again
/// once its key has expired, as with the memory store's cleanup; so does a bucket whose limit
/// comes from the request and grows after the key expired (refilled under the limit that last
/// charged it).
///
/// # Keys
/// `<prefix>:{<key value>}:<rule>`, prefix `tollgate` by default
/// ([`prefix`](RedisStoreBuilder::prefix)). The key value is the Redis Cluster hash tag, so all
/// the rules of a request that count by the same value (per IP and per IP on `/login`) share a
/// slot and are decided in one script call. Values that are empty or contain `{`, `}`, `|` (or
/// start with `=`) are written as `=` and their hex digits.
///
/// A [concurrency rule](crate::Limit::concurrent)'s key is a sorted set of leases, one per slot
/// taken (lease id → expiry by the server's clock), changed in the same script call as the
/// request's other rules; see [`lease`](RedisStoreBuilder::lease) for how leases are renewed and
/// what happens when an instance dies. A concurrency rule cannot be sharded.
///
/// Rules with a penalty ([`Rule::block`](crate::Rule::block)) keep their blocks beside
/// the counters, in `<prefix>:block:{<key value>}:<rule>` (same slot), read and written in the
/// same script call; a sharded rule cannot have one. [`Limiter::blocks`](crate::Limiter::blocks)
/// lists them with `SCAN <cursor> MATCH <prefix>:block:{*}:<rule> COUNT 100` (on a cluster, on
/// each master in turn) and one pipeline of `TIME` and `GET`s per page, never `KEYS`.
///
/// Rules with overrides ([`Rule::overridable`](crate::Rule::overridable)) keep each key's
/// override in `<prefix>:override:{<key value>}:<rule>` (same slot), set by a script with the
/// server's time and a `PX` expiry of its TTL, cleared with `DEL`, and read by the same script
/// call as the charge (one `GET`, for these rules only), which charges the key's counters under
/// the override while it lasts. Such a rule takes neither the single-key fast path nor the deny
/// cache, and cannot be sharded. [`Limiter::overrides`](crate::Limiter::overrides) lists them as
/// blocks are listed, at most 100 a page.
///
/// The circuit breaker's probes (below) charge `<prefix>:probe`, which is full again, and gone,
/// within a millisecond.
///
/// # Redis Cluster
/// [`cluster`](RedisStoreBuilder::cluster) connects to a cluster. A request whose keys share a
/// slot is one script call, as above. Rules counting by different values (a per-user rule and a
/// global rule) usually live in different slots, which one script cannot touch together; such a
/// request is split into one group per slot, applied one after the other in slot order, each
/// group atomic on its own. If a later group denies, the earlier groups' charges are refunded and
/// the request is denied. This **never over-admits**: a unit is only ever taken by an atomic
/// script that saw it free. The cost: between a group's charge and its refund (one round trip),
/// concurrent requests see those units as spent and may be denied; and the request takes one
/// round trip per slot, plus one for the compensation when it is denied. Keep the rules of
/// latency-critical routes on one key value when that matters.
///
/// # Failures
/// Every call has a timeout (default 100 ms, [`timeout`](RedisStoreBuilder::timeout)). When Redis
/// is unreachable, slow or answers nonsense, the store returns a [`StoreError`] (kind `Timeout`,
/// `Unavailable` or `Protocol`) and the layer's [`FailurePolicy`](crate::FailurePolicy) decides:
/// the store never panics and never makes a request wait longer than the timeout. The connection
/// reconnects by itself (backing off up to one second), so the app recovers when Redis comes
/// back, without a restart. The [`Limiter`](crate::Limiter) puts a
/// [`CircuitBreaker`](crate::store::CircuitBreaker) in front of the store: after consecutive failures,
/// requests stop waiting for the timeout and are answered by the failure policy at once while
/// the store is probed in the background, with backoff. A probe is a charge like a request's
/// (one unit on `<prefix>:probe`, through the same script), so Redis out of memory, which still
/// answers `PING` but refuses every charge, keeps the breaker open; and a probe whose connection
/// fails tries once more on the connection opened in its place, so the first probe after Redis
/// comes back closes the breaker. On a cluster, the probe asks the node holding its key.
///
/// **Which failure policy?** The layer's default, fail open, suits most users of a shared Redis: a
/// rate limiter protects a service from overload and abuse, and an outage of the limiter's Redis
/// should degrade that protection for its duration (every failure is logged with `tracing`)
/// rather than turn into an outage of the service itself — which is what failing closed does,
/// since every request then gets `503`. [`FailurePolicy::Local`](crate::FailurePolicy::Local)
/// keeps a share of each limit per instance in memory meanwhile. Choose
/// [`FailurePolicy::Closed`](crate::FailurePolicy::Closed) when going over the limit costs more
/// than refusing service: a paid upstream with a hard quota, an SMS or e-mail budget, a login
/// throttle against password guessing. The short default timeout keeps either policy quick to
/// apply when Redis hangs.
///
/// # Local deny cache
/// On by default ([`deny_cache`](RedisStoreBuilder::deny_cache)). When Redis denies a charge, its
/// answer to the same charge (same cost) only moves with the clock until the key's units grow
/// again, so this instance answers that charge itself until then, without a Redis call, with the
/// fields Redis would give: the `Retry-After` for that cost and the `remaining` it reported. A
/// client hammering a limit costs Redis one call per refill interval instead of one per request;
/// a request of another cost, or under another limit (chosen per request), goes to Redis. The deadlines are kept on this process's monotonic
/// clock from the moment the answer arrived, so the local answer can be later than Redis's only
/// by the network delay of the call that filled the cache, never earlier. A
/// [`refund`](crate::Limiter::refund) or [`reset`](crate::Limiter::reset) through *this* store
/// clears the entry; one made by another instance takes effect here when the entry expires. A
/// key blocked by its rule's penalty is answered locally for a second at a time (then Redis is
/// asked again), so a block lifted through another instance
/// ([`unblock`](crate::Limiter::unblock)) reaches this one within a second, and its decisions
/// agree with [`blocks`](crate::Limiter::blocks) again. The
/// cache holds a bounded number of entries ([`deny_cache_size`](RedisStoreBuilder::deny_cache_size)).
///
/// # Hot keys: sharding
/// One global key (a service-wide limit) puts every request on one Redis node.
/// [`shard_rule`](RedisStoreBuilder::shard_rule) splits such a rule into `n` keys, each holding
/// an `n`-th of the limit (rate, capacity, window limit), in different cluster slots. Each request
/// picks two shards at random and charges the one with more units left (the power of two
/// choices). On a single server both candidates are read by the same script call; in a cluster
/// they usually sit on different nodes, so the choice uses the units this instance last saw in
/// each (still one call per request).
///
/// Accuracy: the shards together never admit more than the rule's limit, but a request can be
/// denied while another shard still has room (the two candidates happened to be the emptiest),
/// a request can never cost more than one shard holds (the limit divided by `n`), and the
/// `remaining` reported is the chosen shard's. Use as few shards as spread the load.
///
/// # Exact arithmetic
/// Lua counts in doubles, exact for integers up to 2^53; times are microseconds since the Unix
/// epoch. Building a layer fails, naming the rule and the field, when a rule's numbers could leave
/// that range: spans (a bucket's refill time, a window's longest wait) above 2^50 µs (35 years),
/// counts above 2^50, and for sliding windows `limit × period` (µs) near 2^53 — at most about
/// 100 000 requests per day; use a fixed window, a token bucket or a sliding log above that.
/// Reservations may reach at most 2^51 µs ahead.
///
/// # Tests
/// [`clock`](RedisStoreBuilder::clock) makes the store send its own time instead of using the
/// server's, so tests can drive a [`ManualClock`](crate::clock::ManualClock) through Redis exactly as
/// through the memory store. Expiries then follow that clock, plus one minute of slack, so keys do
/// not vanish while a test's clock runs slower than real time. Don't combine a `RedisStore` with
/// tokio's paused time: its timeouts would fire at once while the runtime waits for the network.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tollgate::{FailurePolicy, Key, Limit, RateLimitLayer, RedisStore, Rule};
///
/// let store = RedisStore::builder()
///     .url("redis://127.0.0.1:6379")
///     .timeout(Duration::from_millis(50))
///     .build()
///     .await?;
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::new("per-ip", Limit::per_minute(60)).key(Key::client_ip()))
///     .store(store)
///     .on_store_failure(FailurePolicy::Open)
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
///
/// [`MemoryStore`]: crate::MemoryStore
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    target: Target,
    scripts: Scripts,
    prefix: Box<str>,
    timeout: Duration,
    /// Test mode: the time sent to the script instead of the server's.
    clock: Option<Arc<dyn Clock>>,
    /// The deny cache's time.
    local: Arc<dyn Clock>,
    cache: Option<DenyCache>,
    shards: HashMap<Box<str>, Arc<Sharding>>,
    /// How long a concurrency lease lives unless renewed.
    lease: Duration,
    /// The concurrency leases this instance holds.
    leases: Leases,
    /// The quota leases this instance holds (rules with a `lease`).
    quotas: Quotas,
}

impl RedisStore {
    /// Connects to the Redis server at `url` (e.g. `redis://127.0.0.1:6379`) with the default
    /// settings.
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        Self::builder().url(url).build().await
    }

    /// Configures a store (default: `redis://127.0.0.1:6379`, prefix `tollgate`, 100 ms timeout,
    /// deny cache on).
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder {
            target: Target::Single("redis://127.0.0.1:6379".to_owned()),
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            clock: None,
            cache: Some(DEFAULT_CACHE_SIZE),
            shards: Vec::new(),
            lease: leases::DEFAULT_LEASE,
            tls: conn::Tls::default(),
            lazily: false,
        }
    }

    /// The Redis key names holding `(rule, key)`: one, or one per shard of a sharded rule.
    pub fn key_names(&self, rule: &str, key: &[u8]) -> Vec<Vec<u8>> {
        self.inner.names(rule, key)
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        f.debug_struct("RedisStore")
            .field("target", &inner.target)
            .field("prefix", &inner.prefix)
            .field("timeout", &inner.timeout)
            .field("deny_cache", &inner.cache.is_some())
            .field("test_clock", &inner.clock)
            .finish_non_exhaustive()
    }
}

impl Store for RedisStore {
    fn apply(&self, batch: &[Charge<'_>]) -> StoreFuture<Outcomes> {
        self.decide(batch, Ok)
    }

    fn apply_one(&self, charge: &Charge<'_>) -> StoreFuture<Outcome> {
        self.decide(std::slice::from_ref(charge), Outcomes::into_first)
    }

    fn refund(&self, charge: &Charge<'_>) -> StoreFuture<()> {
        let inner = &self.inner;
        if charge.algorithm.is_concurrency() {
            // A slot given back: one of this instance's leases of the key goes.
            let name = keys::key_name(&inner.prefix, &charge.rule, charge.key, None);
            let ids = inner.leases.release(&name, charge.cost);
            if ids.is_empty() {
                return StoreFuture::ready(Ok(()));
            }
            let inner = self.inner.clone();
            return StoreFuture::pending(async move {
                inner.timed(leases::remove(&inner, &name, &ids)).await
            });
        }
        if let Some(cache) = &inner.cache {
            cache.forget(cache.hash(charge.rule, charge.key));
        }
        let now = match inner.injected_now() {
            Ok(now) => now,
            Err(error) => return StoreFuture::ready(Err(error)),
        };
        let record = inner.record(charge, true);
        let inner = self.inner.clone();
        StoreFuture::pending(async move {
            let item = Item::apply(&record);
            inner.timed(inner.call(Op::Refund, now, &[item])).await?;
            Ok(())
        })
    }

    fn reset(&self, rule: &str, _algorithm: &Algorithm, key: &[u8]) -> StoreFuture<()> {
        let inner = &self.inner;
        if let Some(cache) = &inner.cache {
            cache.forget(cache.hash(RuleName::new(rule), key));
        }
        let mut names = inner.names(rule, key);
        names.push(keys::block_name(&inner.prefix, rule, key));
        let inner = self.inner.clone();
        StoreFuture::pending(async move {
            inner
                .timed(async {
                    let mut conn = inner.conn.clone();
                    // A cluster cannot delete keys of several slots in one command.
                    let per_command = if inner.is_cluster() { 1 } else { names.len() };
                    for chunk in names.chunks(per_command.max(1)) {
                        let mut cmd = ::redis::cmd("DEL");
                        for name in chunk {
                            cmd.arg(name);
                        }
                        conn.query::<i64>(&cmd).await.map_err(conn::error)?;
                    }
                    Ok(())
                })
                .await
        })
    }

    fn set_block(
        &self,
        rule: &str,
        penalty: &Penalty,
        key: &[u8],
        block: Option<Duration>,
    ) -> StoreFuture<()> {
        let inner = &self.inner;
        if let Some(cache) = &inner.cache {
            cache.forget(cache.hash(RuleName::new(rule), key));
        }
        let now = match inner.injected_now() {
            Ok(now) => now,
            Err(error) => return StoreFuture::ready(Err(error)),
        };
        let name = keys::block_name(&inner.prefix, rule, key);
        let forget = micros(penalty.forget_after());
        let inner = self.inner.clone();
        StoreFuture::pending(async move {
            inner
                .timed(async {
                    let mut conn = inner.conn.clone();
                    match block {
                        None => {
                            let mut cmd = ::redis::cmd("DEL");
                            cmd.arg(&name);
                            conn.query::<i64>(&cmd).await.map_err(conn::error)?;
                        }
                        Some(d) => {
                            // The script reads the key's offences and the time in one step.
                            let script = &inner.scripts.block;
                            let mut cmd = Cmd::new();
                            cmd.arg("EVALSHA").arg(script.hash()).arg(1);
                            cmd.arg(&name);
                            let mut packed = Packed(Vec::with_capacity(8 * 4));
                            push_now(&mut packed, now);
                            let span = |d: u64| d.min(params::MAX_SPAN);
                            packed.push(span(micros(d)));
                            packed.push(span(forget));
                            cmd.arg(packed.0.as_slice());
                            let _: Vec<u8> = conn.eval(script, &cmd).await.map_err(conn::error)?;
                        }
                    }
                    Ok(())
                })
                .await
        })
    }

    fn blocks(&self, rule: &str, cursor: Option<&Cursor>) -> StoreFuture<Page<BlockedKey>> {
        let (inner, rule, cursor) = (self.inner.clone(), rule.to_owned(), cursor.cloned());
        StoreFuture::pending(async move {
            inner
                .listing(inner.list_blocks(&rule, cursor.as_ref()))
                .await
        })
    }

    fn block_of(&self, rule: &str, key: &[u8]) -> StoreFuture<Option<BlockedKey>> {
        let (inner, rule, key) = (self.inner.clone(), rule.to_owned(), key.to_vec());
        StoreFuture::pending(async move { inner.listing(inner.block_now(&rule, &key)).await })
    }

    fn set_override(
        &self,
        rule: &str,
        key: &[u8],
        limit: Option<(&Limit, Duration)>,
    ) -> StoreFuture<()> {
        let inner = &self.inner;
        let now = match inner.injected_now() {
            Ok(now) => now,
            Err(error) => return StoreFuture::ready(Err(error)),
        };
        let (rule, key) = (rule.to_owned(), key.to_vec());
        let limit = limit.map(|(limit, ttl)| (limit.clone(), ttl));
        let inner = self.inner.clone();
        StoreFuture::pending(async move {
            let limit = limit.as_ref().map(|(limit, ttl)| (limit, *ttl));
            inner
                .timed(inner.set_override(&rule, &key, limit, now))
                .await
        })
    }

    fn override_of(&self, rule: &str, key: &[u8]) -> StoreFuture<Option<OverrideEntry>> {
        let (inner, rule, key) = (self.inner.clone(), rule.to_owned(), key.to_vec());
        StoreFuture::pending(async move { inner.listing(inner.override_now(&rule, &key)).await })
    }

    fn overrides(
        &self,
        rule: &str,
        cursor: Option<&Cursor>,
        count: usize,
    ) -> StoreFuture<Page<OverrideEntry>> {
        let (inner, rule, cursor) = (self.inner.clone(), rule.to_owned(), cursor.cloned());
        StoreFuture::pending(async move {
            inner
                .listing(inner.list_overrides(&rule, cursor.as_ref(), count))
                .await
        })
    }

    fn validate_overrides(&self, rule: &str) -> Result<(), ConfigError> {
        if self.inner.shards.contains_key(rule) {
            return Err(ConfigError::new(
                rule,
                "overrides",
                "a rule sharded over several Redis keys cannot have overrides",
            ));
        }
        Ok(())
    }

    fn probe(&self) -> StoreFuture<()> {
        let inner = self.inner.clone();
        StoreFuture::pending(async move {
            // No request waits for a probe, and it may have to connect afresh: it gets the time
            // a connection gets.
            let wait = conn::connect_timeout(inner.timeout);
            match tokio::time::timeout(wait, inner.probe()).await {
                Ok(result) => result,
                Err(_) => {
                    inner.conn.suspect();
                    Err(conn::timed_out(wait))
                }
            }
        })
    }

    fn validate_penalty(&self, rule: &str, penalty: &Penalty) -> Result<(), ConfigError> {
        if self.inner.shards.contains_key(rule) {
            return Err(ConfigError::new(
                rule,
                "block",
                "a rule sharded over several Redis keys cannot block keys",
            ));
        }
        params::validate_penalty(rule, penalty)
    }

    fn validate(&self, rule: &str, algorithm: &Algorithm) -> Result<(), ConfigError> {
        params::validate(rule, algorithm)?;
        match self.inner.shards.get(rule) {
            Some(sharding) => sharding.validate(rule, algorithm),
            None => Ok(()),
        }
    }
}

impl Inner {
    pub(super) fn injected_now(&self) -> Result<Option<Micros>, StoreError> {
        self.clock
            .as_ref()
            .map(|clock| params::check_now(clock.now()))
            .transpose()
            .map_err(|message| StoreError::new(StoreErrorKind::Config, message))
    }

    pub(super) fn names(&self, rule: &str, key: &[u8]) -> Vec<Vec<u8>> {
        match self.shards.get(rule) {
            Some(sharding) => (0..sharding.n)
                .map(|i| keys::key_name(&self.prefix, rule, key, Some(i)))
                .collect(),
            None => vec![keys::key_name(&self.prefix, rule, key, None)],
        }
    }

    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    /// Runs an operator's read (a listing) within the time a connection gets (the store's
    /// timeout, at least 1 s): no request waits for it, and it may take a few round trips.
    pub(super) async fn listing<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let wait = conn::connect_timeout(self.timeout);
        match tokio::time::timeout(wait, work).await {
            Ok(result) => result,
            Err(_) => {
                self.conn.suspect();
                Err(conn::timed_out(wait))
            }
        }
    }

    pub(super) async fn timed<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, work).await {
            Ok(result) => result,
            Err(_) => {
                self.conn.suspect();
                Err(conn::timed_out(self.timeout))
            }
        }
    }
}
