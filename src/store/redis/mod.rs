//! `RedisStore`: limits shared by every instance of an app, in Redis or a Redis Cluster (see the
//! type's documentation for how it decides, fails and scales).

mod cache;
mod conn;
mod failover;
mod fast;
mod keys;
mod leases;
mod listing;
mod lua;
mod overrides;
mod params;
mod quota;
mod shard;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::redis::{Cmd, Value};
use smallvec::SmallVec;

use self::cache::{CacheView, DenyCache};
use self::conn::{Conn, Target};
use self::fast::Fast;
use self::leases::Leases;
use self::lua::{Lua, Scripts};
use self::quota::Quotas;
use self::shard::Sharding;
use super::{
    BlockedKey, Charge, Cursor, Outcomes, OverrideEntry, Page, RuleName, Store, StoreError,
    StoreErrorKind, StoreFuture,
};
use crate::algorithm::error::ConfigError;
use crate::algorithm::{
    duration, micros, Algorithm, Limit, Micros, Mode, Outcome, Penalty, TokenBucket, Verdict,
};
use crate::clock::{Clock, SystemClock};

const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
const DEFAULT_PREFIX: &str = "tollgate";
const DEFAULT_CACHE_SIZE: usize = 65_536;
/// Extra lifetime of keys written with an injected clock (see "Tests" on [`RedisStore`]).
const TEST_GRACE_MS: u64 = 60_000;

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

/// Configures and connects a [`RedisStore`].
#[must_use]
pub struct RedisStoreBuilder {
    target: Target,
    prefix: String,
    timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    cache: Option<usize>,
    shards: Vec<(String, u32)>,
    lease: Duration,
    tls: conn::Tls,
    lazily: bool,
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

impl RedisStore {
    /// [`Store::apply`], with `finish` applied to the outcomes inside the one future (a single
    /// charge's caller gets its outcome without a second boxed future around the first).
    fn decide<T>(
        &self,
        batch: &[Charge<'_>],
        finish: impl FnOnce(Outcomes) -> Result<T, StoreError> + Send + 'static,
    ) -> StoreFuture<T> {
        let inner = &self.inner;
        if let [charge] = batch {
            // A hot key's rule may lease a slice of its quota (a sharded rule spreads it instead).
            if let Some(lease) = charge.lease {
                if charge.mode == Mode::Charge
                    && charge.cost > 0
                    && !charge.read_overrides
                    && !inner.shards.contains_key(charge.rule.as_str())
                {
                    return quota::charge(self, lease, charge, finish);
                }
            }
        }
        self.decide_exactly(batch, finish)
    }

    /// [`decide`](Self::decide) without quota leases: every charge as Redis decides it (or the
    /// deny cache, which answers exactly as Redis would).
    fn decide_exactly<T>(
        &self,
        batch: &[Charge<'_>],
        finish: impl FnOnce(Outcomes) -> Result<T, StoreError> + Send + 'static,
    ) -> StoreFuture<T> {
        let inner = &self.inner;
        let views: SmallVec<[CacheView; 2]> = match &inner.cache {
            Some(cache) => batch
                .iter()
                .map(|charge| CacheView {
                    hash: cache.hash(charge.rule, charge.key),
                    cost: charge.cost,
                    mode: charge.mode,
                    limit_id: cache.limit_id(charge.algorithm),
                    // A penalised rule's denials are cached only once the key is blocked (a
                    // charge denied then is a blocked answer, exact until the block ends): the
                    // offence itself may outlast its block, and a later denial is an offence.
                    // A slot's denial ends when a response does, not with the clock.
                    // An override set through another instance applies on the next decision.
                    cacheable: !inner.shards.contains_key(charge.rule.as_str())
                        && !charge.algorithm.is_concurrency()
                        && !charge.read_overrides
                        && (charge.penalty.is_none()
                            || (charge.mode == Mode::Charge && charge.cost > 0)),
                    penalised: charge.penalty.is_some(),
                })
                .collect(),
            None => SmallVec::new(),
        };
        if let Some(cache) = &inner.cache {
            if let Some(outcomes) = cache.answer(batch, &views, inner.local.now()) {
                return StoreFuture::ready(finish(outcomes));
            }
        }
        if batch.is_empty() {
            return StoreFuture::ready(finish(Outcomes::new()));
        }
        let now = match inner.injected_now() {
            Ok(now) => now,
            Err(error) => return StoreFuture::ready(Err(error)),
        };
        if let [charge] = batch {
            let sharded = inner.shards.contains_key(charge.rule.as_str());
            if let Some(fast) = Fast::new(&inner.prefix, charge, sharded) {
                let packed = fast.packed(charge, now);
                let inner = self.inner.clone();
                return StoreFuture::pending(async move {
                    let (outcome, missing) = inner.timed(inner.fast(&fast, now, packed)).await?;
                    let outcomes = Outcomes::from(outcome);
                    if let Some(cache) = &inner.cache {
                        cache.learn(&views, &outcomes, &[missing], inner.local.now());
                    }
                    finish(outcomes)
                });
            }
        }
        let records: Vec<Record> = batch.iter().map(|c| inner.record(c, false)).collect();
        let inner = self.inner.clone();
        StoreFuture::pending(async move {
            let (mut outcomes, missing, applied) = inner.timed(inner.decide(now, &records)).await?;
            // Only a charge that reads overrides has one applied (`Charge::read_overrides`).
            for (outcome, limit) in outcomes.iter_mut().zip(applied) {
                outcome.overridden = limit.map(Arc::new);
            }
            if outcomes.iter().all(|o| o.verdict.is_admitted()) {
                // The batch was charged: this instance now holds its leases, and renews them.
                for record in &records {
                    for candidate in &record.candidates {
                        if let Some(id) = candidate.lease {
                            Leases::hold(&inner, candidate.name.clone(), id);
                        }
                    }
                }
            }
            if let Some(cache) = &inner.cache {
                cache.learn(&views, &outcomes, &missing, inner.local.now());
            }
            finish(outcomes)
        })
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

/// One charge as the script sees it: its candidate keys (two for a sharded rule's choice).
struct Record {
    mode: Mode,
    cost: u64,
    limit: u64,
    candidates: SmallVec<[Candidate; 2]>,
    sharding: Option<Arc<Sharding>>,
    /// A rule with a penalty: its block's key, and the script's numbers (see `params`).
    penalty: Option<(Vec<u8>, params::Args)>,
    /// A rule with overrides: its override's key (read when deciding), and what an undo needs
    /// to take back a charge made under the override.
    overrides: Option<Overridable>,
}

/// A charge of a rule with overrides, as its record keeps it.
struct Overridable {
    name: Vec<u8>,
    rule: Box<str>,
    key: Box<[u8]>,
}

impl Record {
    /// This record with its candidates' numbers under `limit`, the override its charge was
    /// decided under: what an undo of that charge takes back.
    fn under(&self, limit: &Limit) -> Record {
        let (rule, key) = match &self.overrides {
            Some(o) => (&*o.rule, &*o.key),
            None => ("", &[][..]),
        };
        Record {
            mode: self.mode,
            cost: self.cost,
            limit: limit.algorithm().capacity(),
            candidates: self
                .candidates
                .iter()
                .map(|c| Candidate {
                    name: c.name.clone(),
                    slot: c.slot,
                    shard: c.shard,
                    args: overrides::numbers_under(limit, &c.args, rule, key, self.cost, self.mode),
                    lease: c.lease,
                })
                .collect(),
            sharding: self.sharding.clone(),
            penalty: None,
            overrides: None,
        }
    }
}

struct Candidate {
    name: Vec<u8>,
    slot: u16,
    shard: u32,
    args: params::Args,
    /// The concurrency lease this charge adds, if admitted.
    lease: Option<u64>,
}

/// A record in one script call, with the mode and cost that call uses; `only` restricts it to
/// one candidate (the shard an earlier call chose); `undo` is what an undo needs to know.
#[derive(Clone, Copy)]
struct Item<'r> {
    record: &'r Record,
    mode: Mode,
    cost: u64,
    only: Option<usize>,
    undo: Taken,
}

/// What one record's charge took: the candidate it chose, what a burst pool took from its steady
/// bucket, when, whether the key held no state (for a charge: before it, so that an undo of a
/// charge that created the key removes it again while any other undo keeps the key; for a check
/// or an undo: after it), and the state a token bucket's, burst pool's or fixed window's charge
/// found, which an undo restores when nothing changed the key since (a charge from full forgets
/// how long the bucket had been full, and a window's charge pays a debt back at the limit it
/// brought: a limit chosen per request would read either differently).
#[derive(Clone, Copy, Debug, Default)]
struct Taken {
    chosen: usize,
    steady: u64,
    at: Micros,
    missing: bool,
    found: [i64; 2],
}

/// Per outcome of a batch: whether its key holds no state (see [`Inner::decide`]).
type Missing = SmallVec<[bool; 2]>;

impl<'r> Item<'r> {
    fn apply(record: &'r Record) -> Self {
        Item {
            record,
            mode: record.mode,
            cost: record.cost,
            only: None,
            undo: Taken::default(),
        }
    }

    fn candidates(&self) -> &'r [Candidate] {
        match self.only {
            Some(i) => std::slice::from_ref(&self.record.candidates[i]),
            None => &self.record.candidates,
        }
    }
}

#[derive(Clone, Copy)]
enum Op {
    /// Decide and charge, all or nothing.
    Apply,
    /// Decide without charging; admitted records report what they have left.
    Check,
    /// Give units back.
    Refund,
    /// Take back an earlier charge exactly.
    Undo,
}

impl Op {
    /// Whether the operation decides (and so reads blocks and overrides).
    fn decides(self) -> bool {
        matches!(self, Op::Apply | Op::Check)
    }

    /// The script that runs the operation.
    fn script(self, scripts: &Scripts) -> &Lua {
        match self {
            Op::Apply => &scripts.charge,
            Op::Check => &scripts.check,
            Op::Refund => &scripts.refund,
            Op::Undo => &scripts.undo,
        }
    }
}

impl Inner {
    fn injected_now(&self) -> Result<Option<Micros>, StoreError> {
        self.clock
            .as_ref()
            .map(|clock| params::check_now(clock.now()))
            .transpose()
            .map_err(|message| StoreError::new(StoreErrorKind::Config, message))
    }

    fn names(&self, rule: &str, key: &[u8]) -> Vec<Vec<u8>> {
        match self.shards.get(rule) {
            Some(sharding) => (0..sharding.n)
                .map(|i| keys::key_name(&self.prefix, rule, key, Some(i)))
                .collect(),
            None => vec![keys::key_name(&self.prefix, rule, key, None)],
        }
    }

    fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    fn candidate(
        &self,
        charge: &Charge<'_>,
        algorithm: &Algorithm,
        shard: Option<u32>,
    ) -> Candidate {
        let name = keys::key_name(&self.prefix, &charge.rule, charge.key, shard);
        let mut args = params::Args::new();
        let mut lease = None;
        match algorithm {
            // A slot taken is a lease (a check takes none).
            Algorithm::Concurrency(slots) if charge.mode != Mode::Check && charge.cost > 0 => {
                let id = leases::new_id();
                params::push_slots(&mut args, slots, micros(self.lease), id);
                lease = Some(id);
            }
            _ => params::push(
                &mut args,
                algorithm,
                &charge.rule,
                charge.key,
                charge.cost,
                charge.mode,
            ),
        }
        Candidate {
            lease,
            slot: if self.is_cluster() {
                keys::slot(&name)
            } else {
                0
            },
            name,
            shard: shard.unwrap_or(0),
            args,
        }
    }

    /// The record of a charge; for a sharded rule, its candidate shards.
    fn record(&self, charge: &Charge<'_>, refund: bool) -> Record {
        let sharding = self.shards.get(charge.rule.as_str()).cloned();
        let candidates = match &sharding {
            None => SmallVec::from_iter([self.candidate(charge, charge.algorithm, None)]),
            Some(sharding) => {
                let (a, b) = sharding.two();
                let make = |i: u32| {
                    let part = shard::split(charge.algorithm, sharding.n, i);
                    self.candidate(charge, &part, Some(i))
                };
                let (first, second) = (make(a), make(b));
                if first.slot == second.slot {
                    SmallVec::from_iter([first, second])
                } else if refund || sharding.likelier((a, b)) == a {
                    // Different nodes: one script cannot read both, so choose by what this
                    // instance last saw (refunds go to the first at random).
                    SmallVec::from_iter([first])
                } else {
                    SmallVec::from_iter([second])
                }
            }
        };
        Record {
            mode: charge.mode,
            cost: charge.cost,
            limit: charge.algorithm.capacity(),
            candidates,
            sharding,
            penalty: charge.penalty.map(|penalty| {
                (
                    keys::block_name(&self.prefix, &charge.rule, charge.key),
                    params::penalty(penalty),
                )
            }),
            overrides: charge.read_overrides.then(|| Overridable {
                name: keys::override_name(&self.prefix, &charge.rule, charge.key),
                rule: charge.rule.as_str().into(),
                key: charge.key.into(),
            }),
        }
    }

    /// Runs an operator's read (a listing) within the time a connection gets (the store's
    /// timeout, at least 1 s): no request waits for it, and it may take a few round trips.
    async fn listing<T>(
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

    async fn timed<T>(
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

    /// Decides a batch: one script call, or one per slot on a cluster. Beside each outcome:
    /// whether its key holds no state after the call (its answer then does not move with the
    /// clock, which the deny cache must know).
    /// And per record: the override it was charged under, if any.
    async fn decide(
        &self,
        now: Option<Micros>,
        records: &[Record],
    ) -> Result<(Outcomes, Missing, Applied), StoreError> {
        let groups = if self.is_cluster() {
            self.groups(records)
        } else {
            Vec::new()
        };
        if groups.len() <= 1 {
            let items: SmallVec<[Item<'_>; 2]> = records.iter().map(Item::apply).collect();
            let (results, applied) = self.call(Op::Apply, now, &items).await?;
            let (outcomes, missing) = results
                .into_iter()
                .map(|(o, taken)| (o, taken.missing))
                .unzip();
            return Ok((outcomes, missing, applied));
        }
        self.cross_slot(now, records, &groups).await
    }

    /// The records grouped by cluster slot, in slot order.
    fn groups(&self, records: &[Record]) -> Vec<Vec<usize>> {
        let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, record) in records.iter().enumerate() {
            groups.entry(record.candidates[0].slot).or_default().push(i);
        }
        groups.into_values().collect()
    }

    /// A batch over several slots: groups in slot order; a denial undoes the earlier groups.
    async fn cross_slot(
        &self,
        now: Option<Micros>,
        records: &[Record],
        groups: &[Vec<usize>],
    ) -> Result<(Outcomes, Missing, Applied), StoreError> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; records.len()];
        let mut missing: Missing = smallvec::smallvec![false; records.len()];
        let mut taken = vec![Taken::default(); records.len()];
        let mut applied: Applied = smallvec::smallvec![None; records.len()];
        for (g, group) in groups.iter().enumerate() {
            let items: Vec<Item<'_>> = group.iter().map(|&i| Item::apply(&records[i])).collect();
            let (results, found) = self.call(Op::Apply, now, &items).await?;
            let denied = results.iter().any(|(o, _)| !o.verdict.is_admitted());
            for ((&i, (outcome, took)), limit) in group.iter().zip(results).zip(found) {
                outcomes[i] = Some(outcome);
                missing[i] = took.missing;
                taken[i] = took;
                applied[i] = limit;
            }
            if !denied {
                continue;
            }
            for earlier in &groups[..g] {
                // Each group committed atomically on its own: take this request's charges back
                // (the script leaves checks alone and reports what every key has left), under
                // the override a charge was made under.
                let under: Vec<Option<Record>> = earlier
                    .iter()
                    .map(|&i| Some(records[i].under(applied[i].as_ref()?)))
                    .collect();
                let items: Vec<Item<'_>> = earlier
                    .iter()
                    .zip(&under)
                    .map(|(&i, under)| Item {
                        only: Some(taken[i].chosen),
                        undo: taken[i],
                        ..Item::apply(under.as_ref().unwrap_or(&records[i]))
                    })
                    .collect();
                match self.call(Op::Undo, now, &items).await {
                    Ok((results, _)) => {
                        for (&i, (outcome, took)) in earlier.iter().zip(results) {
                            outcomes[i] = Some(outcome);
                            missing[i] = took.missing;
                        }
                    }
                    // The units stay taken until they refill: under-admits, never over.
                    Err(error) => {
                        tracing::warn!(%error, "rate-limit undo after a cross-slot denial failed")
                    }
                }
            }
            for later in &groups[g + 1..] {
                let items: Vec<Item<'_>> =
                    later.iter().map(|&i| Item::apply(&records[i])).collect();
                match self.call(Op::Check, now, &items).await {
                    Ok((results, found)) => {
                        for ((&i, (outcome, took)), limit) in later.iter().zip(results).zip(found) {
                            outcomes[i] = Some(outcome);
                            missing[i] = took.missing;
                            applied[i] = limit;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "rate-limit check after a cross-slot denial failed")
                    }
                }
            }
            break;
        }
        let outcomes = outcomes
            .into_iter()
            .zip(records)
            .map(|(outcome, record)| {
                // Only when a follow-up call failed: the request is denied anyway.
                outcome.unwrap_or(Outcome {
                    verdict: Verdict::Allowed,
                    limit: record.limit,
                    remaining: 0,
                    balance: 0,
                    next_unit_in: Duration::ZERO,
                    full_in: Duration::ZERO,
                    offence: false,
                    overridden: None,
                })
            })
            .collect();
        Ok((outcomes, missing, applied))
    }

    /// The `EVALSHA` of a fast path's call, with its script.
    fn fast_command(&self, fast: &Fast, now: Option<Micros>, packed: Packed) -> (&Lua, Cmd) {
        let script = fast.script(&self.scripts, now);
        let mut cmd = Cmd::with_capacity(5, 64 + fast.name.len() + packed.0.len());
        cmd.arg("EVALSHA").arg(script.hash()).arg(1);
        cmd.arg(&fast.name).arg(packed.0.as_slice());
        // A window's script counts in place with the cost as text (see `lua/fast_sliding.lua`).
        if let Some(units) = fast.units() {
            cmd.arg(units);
        }
        (script, cmd)
    }

    /// One call of a fast path (see `fast`): the outcome, and whether the key held no state
    /// before the call.
    async fn fast(
        &self,
        fast: &Fast,
        now: Option<Micros>,
        packed: Packed,
    ) -> Result<(Outcome, bool), StoreError> {
        let (script, cmd) = self.fast_command(fast, now, packed);
        let mut conn = self.conn.clone();
        let reply: Value = conn.eval(script, &cmd).await.map_err(conn::error)?;
        fast.outcome(&reply)
    }

    /// The circuit breaker's probe: what a request does, so that it fails when requests fail.
    /// One unit of a bucket refilling a million a second (never denied, so always written, and
    /// full again within a millisecond) on the probe key, through the script's fast path: the
    /// script must be there (or is sent again), and Redis must take a write (a `PING` still
    /// answers when Redis is out of memory and refuses every charge). On a stale connection
    /// failure it tries again on the new connection (see `Conn::eval_afresh`).
    async fn probe(&self) -> Result<(), StoreError> {
        let bucket = Algorithm::TokenBucket(TokenBucket::new(1_000_000, Duration::from_secs(1)));
        let charge = Charge {
            rule: RuleName::new("probe"),
            algorithm: &bucket,
            key: b"probe",
            cost: 1,
            mode: Mode::Charge,
            penalty: None,
            lease: None,
            read_overrides: false,
        };
        let mut fast =
            Fast::new(&self.prefix, &charge, false).expect("a bucket's charge of 1 is a fast path");
        fast.name = keys::probe_name(&self.prefix);
        let now = self.injected_now()?;
        let (script, cmd) = self.fast_command(&fast, now, fast.packed(&charge, now));
        let mut conn = self.conn.clone();
        let reply: Value = conn.eval_afresh(script, &cmd).await.map_err(conn::error)?;
        fast.outcome(&reply)?;
        Ok(())
    }

    /// One script call; the outcome of each item, with the candidate it chose, and the
    /// override each item was decided under (deciding only).
    async fn call(
        &self,
        op: Op,
        now: Option<Micros>,
        items: &[Item<'_>],
    ) -> Result<(Vec<(Outcome, Taken)>, Applied), StoreError> {
        let cmd = self.command(op, now, items);
        let mut conn = self.conn.clone();
        let reply: Vec<u8> = conn
            .eval(op.script(&self.scripts), &cmd)
            .await
            .map_err(conn::error)?;
        decode(&reply, items, op.decides())
    }

    fn command<'r>(&self, op: Op, now: Option<Micros>, items: &[Item<'r>]) -> Cmd {
        let candidates = || items.iter().flat_map(|item| item.candidates());
        // Blocks are read when deciding, never by refunds and undos.
        let deciding = op.decides();
        let penalty = |item: &Item<'r>| item.record.penalty.as_ref().filter(|_| deciding);
        let blocks = || items.iter().filter_map(penalty);
        // Overrides too are read when deciding only.
        let overrides = || {
            items
                .iter()
                .filter_map(|item| item.record.overrides.as_ref().filter(|_| deciding))
        };
        let keys = candidates().count() + blocks().count() + overrides().count();
        let names: usize = candidates().map(|c| c.name.len()).sum::<usize>()
            + blocks().map(|(name, _)| name.len()).sum::<usize>()
            + overrides().map(|o| o.name.len()).sum::<usize>();
        let numbers = 3
            + 8 * items.len()
            + candidates().map(|c| c.args.len()).sum::<usize>()
            + blocks().map(|(_, args)| args.len()).sum::<usize>();
        // Sized once: EVALSHA, the hash, the key count, the names and the numbers.
        let mut cmd = Cmd::with_capacity(4 + keys, 64 + names + 8 * numbers);
        cmd.arg("EVALSHA")
            .arg(op.script(&self.scripts).hash())
            .arg(keys);
        for item in items {
            for candidate in item.candidates() {
                cmd.arg(&candidate.name);
            }
            if let Some((name, _)) = penalty(item) {
                cmd.arg(name);
            }
            if let Some(overrides) = item.record.overrides.as_ref().filter(|_| deciding) {
                cmd.arg(&overrides.name);
            }
        }
        // Every number as one string of little-endian doubles, exact below 2^53 (the script
        // reads them with one `struct.unpack` instead of one `tonumber` each).
        let mut packed = Packed(Vec::with_capacity(8 * numbers));
        push_now(&mut packed, now);
        packed.push(items.len() as u64);
        for item in items {
            let candidates = item.candidates();
            packed.push(candidates.len() as u64);
            packed.push(params::mode_code(item.mode));
            packed.push(params::units_arg(item.cost));
            // Deciding, the five undo numbers give way to the penalty's count (0: none) and
            // whether the rule has overrides.
            match (deciding, penalty(item)) {
                (true, found) => {
                    packed.push(found.map_or(0, |(_, args)| args.len() as u64));
                    packed.push(u64::from(item.record.overrides.is_some()));
                    packed.0.extend_from_slice(&[0; 24]);
                }
                (false, _) => {
                    packed.push(item.undo.steady);
                    packed.push(item.undo.at);
                    packed.push(u64::from(item.undo.missing));
                    packed.push_signed(item.undo.found[0]);
                    packed.push_signed(item.undo.found[1]);
                }
            }
            for candidate in candidates {
                for &value in &candidate.args {
                    packed.push(value);
                }
            }
            if let Some((_, args)) = penalty(item) {
                for &value in args {
                    packed.push(value);
                }
            }
        }
        cmd.arg(packed.0.as_slice());
        cmd
    }
}

/// The time for the script, and the milliseconds its expiries get on top: an injected time, or
/// the server's.
fn push_now(packed: &mut Packed, now: Option<Micros>) {
    match now {
        Some(now) => packed.push(now),
        None => packed.0.extend_from_slice(&(-1f64).to_le_bytes()),
    }
    packed.push(if now.is_some() { TEST_GRACE_MS } else { 0 });
}

/// Numbers for the script, as it reads them: little-endian doubles.
struct Packed(Vec<u8>);

impl Packed {
    /// Integers below 2^53 convert exactly; the rules are validated to stay there.
    fn push(&mut self, value: u64) {
        self.0.extend_from_slice(&(value as f64).to_le_bytes());
    }

    /// Like `push`, for a number that may be negative.
    fn push_signed(&mut self, value: i64) {
        self.0.extend_from_slice(&(value as f64).to_le_bytes());
    }
}

/// Per record (or item) of a call: the override it was decided under, if any.
type Applied = SmallVec<[Option<Limit>; 2]>;

/// Reads the script's reply: twelve integers per item, then the time the script used, as
/// little-endian doubles; then, `deciding` items of overridable rules, the overrides' part.
fn decode(
    reply: &[u8],
    items: &[Item<'_>],
    deciding: bool,
) -> Result<(Vec<(Outcome, Taken)>, Applied), StoreError> {
    let fixed = 8 * (12 * items.len() + 1);
    let (reply, applied) = if deciding && items.iter().any(|i| i.record.overrides.is_some()) {
        let (head, tail) = reply.split_at(fixed.min(reply.len()));
        (head, read_applied(tail, items)?)
    } else {
        (reply, items.iter().map(|_| None).collect())
    };
    if reply.len() != fixed {
        return Err(protocol(format!(
            "the script answered {} bytes for {} charges",
            reply.len(),
            items.len()
        )));
    }
    let reply: SmallVec<[f64; 8]> = reply
        .chunks_exact(8)
        .map(|bytes| f64::from_le_bytes(bytes.try_into().expect("8 bytes")))
        .collect();
    let number = |value: f64| {
        // The script's numbers are integers below 2^53, where the conversion is exact.
        if value.is_finite() && value >= 0.0 {
            Ok(value as u64)
        } else {
            Err(protocol(format!(
                "a value in the script's reply is not a count: {reply:?}"
            )))
        }
    };
    let signed = |value: f64| {
        if value.is_finite() && value.abs() < 9.0e15 {
            Ok(value as i64)
        } else {
            Err(protocol(format!(
                "a value in the script's reply is not a balance: {reply:?}"
            )))
        }
    };
    let at = number(reply[reply.len() - 1])?;
    items
        .iter()
        .zip(reply.chunks_exact(12))
        .map(|(item, values)| {
            let wait = duration(number(values[1])?);
            let verdict = match number(values[0])? {
                0 => Verdict::Allowed,
                1 => Verdict::Reserved { wait },
                2 | 3 => Verdict::Denied { retry_after: wait },
                other => return Err(protocol(format!("unknown verdict {other}"))),
            };
            let candidates = item.candidates();
            let index = usize::try_from(number(values[5])?)
                .ok()
                .filter(|&i| i < candidates.len())
                .ok_or_else(|| protocol(format!("unknown candidate {}", values[5])))?;
            let mut outcome = Outcome {
                verdict,
                limit: number(values[2])?,
                remaining: number(values[3])?,
                balance: signed(values[7])?,
                next_unit_in: duration(number(values[4])?),
                full_in: duration(number(values[8])?),
                offence: values[0] == 3.0,
                overridden: None,
            };
            if let Some(sharding) = &item.record.sharding {
                sharding.saw(candidates[index].shard, outcome.remaining);
                outcome.limit = item.record.limit;
            }
            let taken = Taken {
                chosen: item.only.unwrap_or(index),
                steady: number(values[6])?,
                at,
                missing: number(values[9])? == 1,
                found: [signed(values[10])?, signed(values[11])?],
            };
            Ok((outcome, taken))
        })
        .collect::<Result<_, _>>()
        .map(|results| (results, applied))
}

/// The overrides' part of a reply: per overridable item, the length of the value applied (0:
/// none) as a double, then the value.
fn read_applied(mut tail: &[u8], items: &[Item<'_>]) -> Result<Applied, StoreError> {
    let mut applied = Applied::with_capacity(items.len());
    for item in items {
        if item.record.overrides.is_none() {
            applied.push(None);
            continue;
        }
        let (length, rest) = tail
            .split_first_chunk::<8>()
            .ok_or_else(|| protocol("the script's reply ends before its overrides".to_owned()))?;
        let length = f64::from_le_bytes(*length);
        if !(length >= 0.0 && length <= rest.len() as f64) || length.fract() != 0.0 {
            return Err(protocol(format!(
                "the script answered an override of {length} bytes"
            )));
        }
        let (value, rest) = rest.split_at(length as usize);
        applied.push(match value {
            [] => None,
            value => Some(overrides::decode(value)?.1),
        });
        tail = rest;
    }
    if !tail.is_empty() {
        return Err(protocol(format!(
            "the script answered {} bytes after its overrides",
            tail.len()
        )));
    }
    Ok(applied)
}

fn protocol(message: String) -> StoreError {
    StoreError::new(StoreErrorKind::Protocol, message)
}
