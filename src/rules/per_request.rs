//! Limits chosen per request: a rule's limit read from the request's extensions, or
//! looked up by the rule's key through an async [`LimitResolver`] with a bounded TTL cache.
//!
//! A per-request limit never makes a request fail: a limit that is missing, invalid, or that the
//! resolver could not give in time is replaced by the rule's own limit (its fallback).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::Extensions;
use tokio::time::Instant;

use crate::algorithm::Algorithm;
use crate::algorithm::Limit;
use crate::key::KeyValue;

/// The limit a request's charge of a per-request rule uses: filled in when the request is
/// planned (an extension, a cached answer) or by the resolver before the store is asked; `None`
/// inside is the rule's own limit.
pub(crate) type Applied = Arc<OnceLock<Option<Limit>>>;

/// Reads a rule's limit from a request's extensions.
type ReadExtension = dyn Fn(&Extensions) -> Option<Limit> + Send + Sync;

/// Where a rule's limit comes from when not from the rule itself.
#[derive(Clone)]
pub(crate) enum LimitSource {
    /// Read from the request's extensions (put there by an auth layer).
    Extension(Arc<ReadExtension>),
    /// Looked up by the rule's key.
    Resolver(LimitResolver),
}

impl fmt::Debug for LimitSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitSource::Extension(_) => f.write_str("Extension(..)"),
            LimitSource::Resolver(resolver) => resolver.fmt(f),
        }
    }
}

impl LimitSource {
    /// The limit this request's charge uses, as far as it is known without waiting: `None` for
    /// the rule's own; an empty cell when the resolver must be asked.
    pub(crate) fn applied(&self, extensions: &Extensions, key: &KeyValue) -> Option<Applied> {
        match self {
            LimitSource::Extension(read) => {
                read(extensions).map(|l| Arc::new(OnceLock::from(Some(l))))
            }
            LimitSource::Resolver(resolver) => match resolver.cached(key) {
                Some(Some(limit)) => Some(Arc::new(OnceLock::from(Some(limit)))),
                Some(None) => None,
                None => Some(Arc::new(OnceLock::new())),
            },
        }
    }
}

type Resolve = dyn Fn(KeyValue) -> Pin<Box<dyn Future<Output = Result<Option<Limit>, String>> + Send>>
    + Send
    + Sync;

/// An async lookup of a rule's limit by the rule's key (e.g. a customer's quota in a database),
/// with a bounded cache of its answers.
///
/// The resolver answers `Ok(Some(limit))` for a key's own limit, `Ok(None)` for "this key has
/// none: use the rule's limit"; both are kept for the [`ttl`](Self::ttl). Concurrent requests
/// of a key that is not cached wait for one lookup.
///
/// When the resolver fails — returns an error, panics, takes longer than the
/// [`timeout`](Self::timeout), or answers with a limit that cannot work (a zero rate or period,
/// numbers the store cannot count, a capacity below the request's cost) — the request is charged
/// under the rule's own limit, its documented fallback. Failures are kept for
/// [`retry_after`](Self::retry_after) (so a database that is down is not asked by every request)
/// and logged at most once per 10 seconds per resolver, with the number of failures since.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Key, Limit, Rule};
/// use tollgate::rules::LimitResolver;
///
/// let per_customer = LimitResolver::new(|api_key| async move {
///     // e.g. SELECT rpm FROM plans WHERE api_key = $1
///     let rpm = if api_key.as_bytes() == b"big-customer" { 3_000 } else { 60 };
///     Ok::<_, std::io::Error>(Some(Limit::per_minute(rpm)))
/// })
/// .ttl(Duration::from_secs(60))
/// .timeout(Duration::from_millis(200));
///
/// let rule = Rule::new("per-customer", Limit::per_minute(60))
///     .key(Key::header(http::HeaderName::from_static("x-api-key")))
///     .limit_from(per_customer);
/// ```
#[derive(Clone)]
pub struct LimitResolver {
    resolve: Arc<Resolve>,
    ttl: Duration,
    retry_after: Duration,
    timeout: Duration,
    /// Shared by the resolver's clones.
    state: Arc<State>,
}

struct State {
    cache: quick_cache::sync::Cache<KeyValue, Cached>,
    warnings: Warnings,
}

impl State {
    fn new(max_keys: usize) -> Arc<State> {
        Arc::new(State {
            cache: quick_cache::sync::Cache::new(max_keys.max(1)),
            warnings: Warnings::default(),
        })
    }
}

/// A cached answer: `None` means the rule's own limit.
#[derive(Clone)]
struct Cached {
    limit: Option<Limit>,
    expires: Instant,
}

impl fmt::Debug for LimitResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitResolver")
            .field("ttl", &self.ttl)
            .field("retry_after", &self.retry_after)
            .field("timeout", &self.timeout)
            .field("max_keys", &self.state.cache.capacity())
            .finish_non_exhaustive()
    }
}

impl LimitResolver {
    /// Answers cached at most this long by default.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(60);
    /// How long a lookup may take by default.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
    /// How long a failure is remembered by default.
    pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);
    /// Keys cached at most by default.
    pub const DEFAULT_MAX_KEYS: usize = 10_000;

    /// A resolver calling `resolve` with the rule's key.
    pub fn new<F, Fut, E>(resolve: F) -> Self
    where
        F: Fn(KeyValue) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<Limit>, E>> + Send + 'static,
        E: fmt::Display,
    {
        let resolve = Arc::new(resolve);
        LimitResolver {
            resolve: Arc::new(move |key| {
                let resolve = resolve.clone();
                Box::pin(async move { resolve(key).await.map_err(|e| e.to_string()) })
            }),
            ttl: Self::DEFAULT_TTL,
            retry_after: Self::DEFAULT_RETRY_AFTER,
            timeout: Self::DEFAULT_TIMEOUT,
            state: State::new(Self::DEFAULT_MAX_KEYS),
        }
    }

    /// How long an answer is used before the key is looked up again (default 60 s). A key's new
    /// limit applies at most this long after it changed at the source.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long a lookup may take (default 1 s); past it the request uses the rule's own limit.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long a failed lookup is remembered before the key is looked up again (default 1 s);
    /// meanwhile the key's requests use the rule's own limit at once.
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// The most keys whose answers are kept (default 10,000); the least used go first. (A new,
    /// empty cache: set it before the resolver is used.)
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.state = State::new(max_keys);
        self
    }

    /// The cached answer for `key`, if fresh: `Some(None)` is "the rule's own limit".
    fn cached(&self, key: &KeyValue) -> Option<Option<Limit>> {
        let cached = self.state.cache.get(key)?;
        (cached.expires > Instant::now()).then_some(cached.limit)
    }

    /// Looks `key` up (once for concurrent requests of the same key), bounded by the timeout;
    /// `None` is the rule's own limit. `usable` says whether a limit can work.
    pub(crate) async fn resolve(
        &self,
        rule: &str,
        key: &KeyValue,
        usable: impl Fn(&Limit) -> Result<(), String>,
    ) -> Option<Limit> {
        let inner = &*self.state;
        let now = Instant::now();
        inner.cache.remove_if(key, |cached| cached.expires <= now);
        let guard = match inner.cache.get_value_or_guard_async(key).await {
            Ok(cached) => return cached.limit,
            Err(guard) => guard,
        };
        // Spawned: a panic is the task's, not the request's. Aborted when the wait ends without
        // an answer (timeout, or the request is dropped), so a hung lookup does not linger.
        let mut task = Abort(tokio::spawn((self.resolve)(key.clone())));
        let result = match tokio::time::timeout(self.timeout, &mut task.0).await {
            Ok(Ok(Ok(limit))) => match limit.map(|l| usable(&l).map(|()| l)).transpose() {
                Ok(limit) => Ok(limit),
                Err(why) => Err(format!("unusable limit: {why}")),
            },
            Ok(Ok(Err(error))) => Err(error),
            Ok(Err(join)) => Err(format!("resolver panicked: {join}")),
            Err(_) => Err(format!("resolver took longer than {:?}", self.timeout)),
        };
        let now = Instant::now();
        let cached = match result {
            Ok(limit) => Cached {
                limit,
                expires: after(now, self.ttl),
            },
            Err(error) => {
                inner.warnings.failed(rule, &error);
                Cached {
                    limit: None,
                    expires: after(now, self.retry_after),
                }
            }
        };
        let limit = cached.limit.clone();
        let _ = guard.insert(cached);
        limit
    }

    /// Reports a limit a request brought that cannot work (logged like a resolver's failure).
    pub(crate) fn unusable(rule: &str, why: &str) {
        EXTENSION_WARNINGS.failed(rule, &format!("unusable limit: {why}"));
    }
}

/// A spawned lookup, aborted when dropped.
struct Abort<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Abort<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `now + by`; a duration past what the clock can count (`Duration::MAX` for "forever") is a
/// century.
fn after(now: Instant, by: Duration) -> Instant {
    now.checked_add(by)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
}

/// Warnings about one resolver (or about limits from extensions), at most one per interval.
#[derive(Default)]
struct Warnings {
    /// Milliseconds since `start` at the last warning (0: none yet).
    last: AtomicU64,
    /// Failures since the last warning.
    count: AtomicU64,
    /// (Tokio's clock: tests with paused time drive the interval.)
    start: OnceLock<Instant>,
}

static EXTENSION_WARNINGS: Warnings = Warnings {
    last: AtomicU64::new(0),
    count: AtomicU64::new(0),
    start: OnceLock::new(),
};

const WARN_EVERY: Duration = Duration::from_secs(10);

impl Warnings {
    fn failed(&self, rule: &str, error: &str) {
        let count = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        let start = self.start.get_or_init(Instant::now);
        let now = start.elapsed().as_millis() as u64 + 1;
        let last = self.last.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= WARN_EVERY.as_millis() as u64;
        if due
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.count.fetch_sub(count, Ordering::Relaxed);
            tracing::warn!(
                rule,
                error,
                failures = count,
                "rate limit: per-request limit unavailable; the rule's own limit applies"
            );
        }
    }
}

/// The algorithm a charge uses: the applied limit's, else the rule's.
#[inline]
pub(crate) fn algorithm_of<'a>(applied: &'a Option<Applied>, own: &'a Algorithm) -> &'a Algorithm {
    match applied.as_ref().and_then(|cell| cell.get()?.as_ref()) {
        Some(limit) => limit.algorithm(),
        None => own,
    }
}
