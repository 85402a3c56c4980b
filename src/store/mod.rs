//! Where limits keep their state, and the one atomic step that charges a request.
//!
//! A [`Store`] applies a batch of [`Charge`]s — one per rule that applies to a request — as a single
//! atomic step: every charge is admitted, or none is. [`MemoryStore`] is the default; `RedisStore`
//! (feature `redis`) shares limits between the instances of an app through the same trait, and
//! [`TransactionalStore`] keeps them in a transactional database (`PostgresStore`, feature
//! `postgres`).

pub(crate) mod failure;
mod listing;
pub(crate) mod memory;
mod outcomes;
mod overrides;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "redis")]
pub(crate) mod redis;
pub(crate) mod transact;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::algorithm::error::ConfigError;
use crate::algorithm::{Algorithm, Lease, Limit, Mode, Outcome, Penalty};
use crate::key::namespace;

#[cfg(feature = "redis")]
pub use self::redis::RedisStoreBuilder;
pub use failure::CircuitBreaker;
pub(crate) use failure::{FailurePolicy, Guarded};
pub use listing::{BlockedKey, Cursor, Page};
pub(crate) use memory::MemoryStore;
pub use memory::MemoryStoreBuilder;
pub use outcomes::{Outcomes, OutcomesIntoIter};
pub use overrides::OverrideEntry;
pub(crate) use overrides::MAX_OVERRIDE_PAGE;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresBackend, PostgresStep, PostgresStoreBuilder, StepMode};
pub use transact::{
    Row, RowKey, RowKind, Snapshot, TransactionCounts, TransactionalBackend, TransactionalStore,
    Write,
};

/// One rule's part of a request: charge `cost` units to `key` under `rule`.
///
/// Outside the crate (a test, a bench, a front end driving a store directly), build one with
/// [`Charge::new`] and the `with_` setters; a store reads the fields.
// Non-exhaustive: a field a rule hands its store later is an addition, not a break.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Charge<'a> {
    /// The rule's name: the namespace of its keys.
    pub rule: RuleName<'a>,
    /// The rule's algorithm and parameters.
    pub algorithm: &'a Algorithm,
    /// The key's bytes.
    pub key: &'a [u8],
    /// Units to charge (for a refund: units to give back).
    pub cost: u64,
    /// Charge, check, or reserve.
    pub mode: Mode,
    /// The rule's penalty, if it blocks keys it denies: a blocked key is denied
    /// without touching its counters, and a charge the rule denies starts a block.
    pub penalty: Option<&'a Penalty>,
    /// The rule's quota lease, if a remote store may hand this instance a slice of the key's
    /// quota to decide from locally ([`Lease`]); an exact store ignores it.
    pub lease: Option<&'a Lease>,
    /// For a rule with overrides ([`Rule::overridable`](crate::Rule::overridable)): the store
    /// reads the key's override in the same atomic step, charges under it in place of
    /// `algorithm` when there is one, and returns it with the outcome
    /// ([`Outcome::with_override`], for the `RateLimit-Policy` field). `false` for every other
    /// rule: the store reads no override.
    pub read_overrides: bool,
}

impl<'a> Charge<'a> {
    /// A plain charge of `cost` units to `key` under `rule` and its `algorithm`: mode
    /// [`Mode::Charge`], no penalty, no lease, no override read.
    pub const fn new(
        rule: RuleName<'a>,
        algorithm: &'a Algorithm,
        key: &'a [u8],
        cost: u64,
    ) -> Self {
        Charge {
            rule,
            algorithm,
            key,
            cost,
            mode: Mode::Charge,
            penalty: None,
            lease: None,
            read_overrides: false,
        }
    }

    /// The same charge in `mode` (charge, check or reserve).
    pub const fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The same charge under the rule's `penalty`.
    pub const fn with_penalty(mut self, penalty: &'a Penalty) -> Self {
        self.penalty = Some(penalty);
        self
    }

    /// The same charge with the rule's quota `lease`.
    pub const fn with_lease(mut self, lease: &'a Lease) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The same charge reading the key's override (see
    /// [`read_overrides`](Charge::read_overrides)).
    pub const fn with_overrides(mut self) -> Self {
        self.read_overrides = true;
        self
    }
}

/// A rule's name as a store sees it: the text (reached through `Deref<Target = str>`), and a
/// 64-bit digest of it that the limiter computes once per rule, so that a store hashing
/// `(rule, key)` on every charge can hash the digest instead of the name. The two cannot
/// disagree: [`new`](RuleName::new) computes the digest from the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleName<'a> {
    text: &'a str,
    digest: u64,
}

impl<'a> RuleName<'a> {
    /// The name `text`, with its digest.
    pub fn new(text: &'a str) -> Self {
        RuleName {
            text,
            digest: namespace(text),
        }
    }

    /// A name whose digest was computed when its rule was built.
    pub(crate) fn known(text: &'a str, digest: u64) -> Self {
        debug_assert_eq!(digest, namespace(text));
        RuleName { text, digest }
    }

    /// The name.
    pub fn as_str(&self) -> &'a str {
        self.text
    }

    /// A digest of the name: equal names, equal digests, within one process. Not a secret: a
    /// store that hashes it seeds its own hasher as it would for the name.
    pub fn digest(&self) -> u64 {
        self.digest
    }
}

impl std::ops::Deref for RuleName<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        self.text
    }
}

impl fmt::Display for RuleName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text)
    }
}

/// The state store behind a limiter.
///
/// # Contract
/// - [`apply`](Store::apply) decides every charge of the batch in one atomic step: if any charge is
///   denied, none is charged, and the admitted ones report what they would leave without charging.
///   Concurrent batches never over-admit.
/// - A key's state may be dropped once it equals a fresh key's state.
/// - The store never panics on any input and never blocks a caller past its own timeout.
///
/// Futures are [`StoreFuture`]s so that a synchronous store answers without allocating.
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// Decides and charges a batch atomically (see the contract above). Costs have been checked
    /// against [`Algorithm::max_cost`].
    fn apply(&self, batch: &[Charge<'_>]) -> StoreFuture<Outcomes>;

    /// Decides a single charge: [`apply`](Store::apply) with a batch of one, the usual case (a
    /// request under one rule). Stores may answer it without the batch's bookkeeping.
    fn apply_one(&self, charge: &Charge<'_>) -> StoreFuture<Outcome> {
        match self.apply(std::slice::from_ref(charge)).into_ready() {
            Ok(result) => StoreFuture::ready(result.and_then(Outcomes::into_first)),
            Err(pending) => StoreFuture::pending(async move { pending.await?.into_first() }),
        }
    }

    /// Gives `charge.cost` units back to the key, never above the limit's capacity.
    fn refund(&self, charge: &Charge<'_>) -> StoreFuture<()>;

    /// Forgets the key: its next request is treated like a new key's.
    fn reset(&self, rule: &str, algorithm: &Algorithm, key: &[u8]) -> StoreFuture<()>;

    /// Blocks `key` under `rule` for `block` from now (its offences are kept), or, with `None`,
    /// lifts its block and forgets its offences. Only rules with a `penalty` read blocks. The
    /// default answers that the store keeps no blocks.
    fn set_block(
        &self,
        rule: &str,
        penalty: &Penalty,
        key: &[u8],
        block: Option<std::time::Duration>,
    ) -> StoreFuture<()> {
        let _ = (rule, penalty, key, block);
        StoreFuture::ready(Err(StoreError::new(
            StoreErrorKind::Config,
            "this store keeps no blocks",
        )))
    }

    /// One page of the keys blocked now under `rule` (a block whose end has passed is not
    /// listed, even while its offences are remembered), from the start of the listing or from
    /// where `cursor`, a previous page's [`next`](Page::next), left it. Each call looks at a
    /// bounded part of the store; a key blocked during the whole walk is listed (the memory
    /// store lists it exactly once; Redis's `SCAN` may list a key twice while it resizes its
    /// table). A cursor the store cannot read is an error of kind
    /// [`BadCursor`](StoreErrorKind::BadCursor).
    ///
    /// The default answers that the store cannot list blocks (an error of kind
    /// [`Config`](StoreErrorKind::Config)): a custom store that keeps blocks implements this and
    /// [`block_of`](Store::block_of) to let operators see them.
    fn blocks(&self, rule: &str, cursor: Option<&Cursor>) -> StoreFuture<Page<BlockedKey>> {
        let _ = (rule, cursor);
        StoreFuture::ready(Err(StoreError::new(
            StoreErrorKind::Config,
            "this store cannot list blocks",
        )))
    }

    /// The block of `key` under `rule` if the key is blocked now, or `None`. The default answers
    /// that the store cannot read blocks, as [`blocks`](Store::blocks).
    fn block_of(&self, rule: &str, key: &[u8]) -> StoreFuture<Option<BlockedKey>> {
        let _ = (rule, key);
        StoreFuture::ready(Err(StoreError::new(
            StoreErrorKind::Config,
            "this store cannot list blocks",
        )))
    }

    /// Gives `key` under `rule` the limit `limit` for `ttl` from now (replacing any override it
    /// has), or, with `None`, removes its override. Only charges whose
    /// [`read_overrides`](Charge::read_overrides) is set read overrides. The caller has checked
    /// the limit and the TTL. The default answers that the store keeps no overrides.
    fn set_override(
        &self,
        rule: &str,
        key: &[u8],
        limit: Option<(&Limit, std::time::Duration)>,
    ) -> StoreFuture<()> {
        let _ = (rule, key, limit);
        StoreFuture::ready(Err(no_overrides()))
    }

    /// The override of `key` under `rule` in force now, if any. The default answers that the
    /// store keeps no overrides.
    fn override_of(&self, rule: &str, key: &[u8]) -> StoreFuture<Option<OverrideEntry>> {
        let _ = (rule, key);
        StoreFuture::ready(Err(no_overrides()))
    }

    /// Up to `count` of `rule`'s overrides in force, from `cursor` on (`None`: from the start).
    /// The default answers that the store keeps no overrides.
    fn overrides(
        &self,
        rule: &str,
        cursor: Option<&Cursor>,
        count: usize,
    ) -> StoreFuture<Page<OverrideEntry>> {
        let _ = (rule, cursor, count);
        StoreFuture::ready(Err(no_overrides()))
    }

    /// Checks, when a limiter is built, that this store keeps overrides for `rule`, a rule with
    /// [`overridable`](crate::Rule::overridable). The default refuses: a store that does not
    /// read overrides must say so rather than ignore them.
    fn validate_overrides(&self, rule: &str) -> Result<(), ConfigError> {
        Err(ConfigError::new(
            rule,
            "overrides",
            "this store keeps no overrides",
        ))
    }

    /// Checks, when a limiter is built, that this store can decide `rule` exactly (the default
    /// accepts every rule). A store with narrower arithmetic than the algorithms' — the Redis
    /// store's Lua counts in doubles — rejects the parameters it cannot handle here, so that the
    /// error names the rule and the field instead of a request meeting it.
    fn validate(&self, rule: &str, algorithm: &Algorithm) -> Result<(), ConfigError> {
        let _ = (rule, algorithm);
        Ok(())
    }

    /// Checks, when a limiter is built, that this store can keep the blocks of `rule` (the
    /// default accepts every rule).
    fn validate_penalty(&self, rule: &str, penalty: &Penalty) -> Result<(), ConfigError> {
        let _ = (rule, penalty);
        Ok(())
    }

    /// Asks whether the store answers again, for the circuit breaker in front of a remote store
    /// (see [`CircuitBreaker`]): a cheap call that fails when requests would, on a connection as
    /// the store is now rather than one kept from before it failed. The Redis store charges one
    /// unit on a key of its own (`<prefix>:probe`) through the same script as requests: a `PING`
    /// would answer while Redis refuses every write, out of memory. No request waits for a probe;
    /// the Redis store gives it the time it gives a connection (its timeout, at least 1 s). The
    /// default answers yes at once, which lets requests through again to find out.
    fn probe(&self) -> StoreFuture<()> {
        StoreFuture::ready(Ok(()))
    }
}

fn no_overrides() -> StoreError {
    StoreError::new(StoreErrorKind::Config, "this store keeps no overrides")
}

/// A store failed to answer (unreachable, timed out, or an unexpected reply).
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Box<dyn std::error::Error + Send + Sync>,
    retry_after: Option<std::time::Duration>,
}

/// What went wrong in a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store did not answer within its timeout.
    Timeout,
    /// The store could not be reached.
    Unavailable,
    /// The store answered something unexpected.
    Protocol,
    /// The store's own settings are unusable (a malformed address, a bad key prefix).
    Config,
    /// The store was not asked: its circuit breaker is open after repeated failures (see
    /// [`CircuitBreaker`]).
    CircuitOpen,
    /// A listing was given a [`Cursor`] this store did not make (or cannot read any more).
    BadCursor,
    /// Other instances changed the rows of a request every time it was decided, more times than
    /// the store retries (a [`TransactionalStore`] under contention).
    Contention,
}

impl StoreError {
    /// An error of `kind` caused by `source`.
    pub fn new(
        kind: StoreErrorKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        StoreError {
            kind,
            source: source.into(),
            retry_after: None,
        }
    }

    /// The same error, saying when the store is worth asking again.
    pub fn with_retry_after(mut self, wait: std::time::Duration) -> Self {
        self.retry_after = Some(wait);
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// When the store is worth asking again, if known: with the circuit breaker open, the time
    /// until its next probe. (The fail-closed `503` sends it as `Retry-After`.)
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        self.retry_after
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            StoreErrorKind::Timeout => "rate-limit store timed out",
            StoreErrorKind::Unavailable => "rate-limit store unavailable",
            StoreErrorKind::Protocol => "rate-limit store answered unexpectedly",
            StoreErrorKind::Config => "rate-limit store misconfigured",
            StoreErrorKind::CircuitOpen => "rate-limit store not asked (circuit breaker open)",
            StoreErrorKind::BadCursor => "rate-limit store cannot read the listing's cursor",
            StoreErrorKind::Contention => "rate-limit store met too many concurrent writes",
        };
        write!(f, "{what}: {}", self.source)
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'static>>;

/// The answer of a [`Store`]: either ready now (no allocation) or a boxed future.
pub struct StoreFuture<T>(Inner<T>);

enum Inner<T> {
    Ready(Option<Result<T, StoreError>>),
    Pending(BoxFuture<T>),
}

impl<T> StoreFuture<T> {
    /// An answer available now.
    pub fn ready(result: Result<T, StoreError>) -> Self {
        StoreFuture(Inner::Ready(Some(result)))
    }

    /// An answer that needs I/O.
    pub fn pending(future: impl Future<Output = Result<T, StoreError>> + Send + 'static) -> Self {
        StoreFuture(Inner::Pending(Box::pin(future)))
    }

    /// Takes the answer if it is available without waiting; otherwise gives the future back.
    pub fn into_ready(self) -> Result<Result<T, StoreError>, Self> {
        match self.0 {
            Inner::Ready(Some(result)) => Ok(result),
            inner => Err(StoreFuture(inner)),
        }
    }
}

impl<T> fmt::Debug for StoreFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.0 {
            Inner::Ready(_) => "ready",
            Inner::Pending(_) => "pending",
        };
        f.debug_tuple("StoreFuture").field(&state).finish()
    }
}

// The ready value is never pinned in place (it is moved out), and the pending future is boxed.
impl<T> Unpin for StoreFuture<T> {}

impl<T> Future for StoreFuture<T> {
    type Output = Result<T, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().0 {
            Inner::Ready(result) => match result.take() {
                Some(result) => Poll::Ready(result),
                None => Poll::Pending,
            },
            Inner::Pending(future) => future.as_mut().poll(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::{ReserveBound, TokenBucket, Verdict};

    /// `Charge::new` is a plain charge; each setter sets its field and only it (the way every
    /// caller outside the crate builds one, the type being non-exhaustive).
    #[test]
    fn a_charge_built_with_its_setters_has_each_field() {
        let algorithm = Algorithm::TokenBucket(TokenBucket::new(5, Duration::from_secs(1)));
        let penalty = Penalty::fixed(Duration::from_secs(60));
        let lease = Lease::new(2, Duration::from_secs(1));
        let plain = Charge::new(RuleName::new("api"), &algorithm, b"alice", 3);
        assert_eq!(
            (plain.rule.as_str(), plain.key, plain.cost, plain.mode),
            ("api", &b"alice"[..], 3, Mode::Charge)
        );
        assert!(plain.penalty.is_none() && plain.lease.is_none() && !plain.read_overrides);
        let reserve = Mode::Reserve(ReserveBound::default());
        let full = plain
            .with_mode(reserve)
            .with_penalty(&penalty)
            .with_lease(&lease)
            .with_overrides();
        assert_eq!(full.mode, reserve);
        assert_eq!(full.penalty, Some(&penalty));
        assert_eq!(full.lease, Some(&lease));
        assert!(full.read_overrides);
        assert_eq!(
            (full.rule, full.key, full.cost),
            (plain.rule, plain.key, plain.cost)
        );
    }

    /// `Outcome::new` starts from a full quota with nothing owed; the setters change the rest.
    #[test]
    fn an_outcome_built_with_its_setters_has_each_field() {
        let denied = Verdict::Denied {
            retry_after: Duration::from_secs(2),
        };
        let plain = Outcome::new(denied, 10, 0);
        assert_eq!((plain.limit, plain.remaining, plain.balance), (10, 0, 0));
        assert_eq!(
            (plain.next_unit_in, plain.full_in),
            (Duration::ZERO, Duration::ZERO)
        );
        assert!(!plain.offence);
        let owed = plain
            .with_balance(-4)
            .with_next_unit_in(Duration::from_secs(2))
            .with_full_in(Duration::from_secs(7))
            .with_offence(true);
        assert_eq!(owed.balance, -4);
        assert_eq!(owed.next_unit_in, Duration::from_secs(2));
        assert_eq!(owed.full_in, Duration::from_secs(7));
        assert!(owed.offence);
        assert_eq!(owed.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(
            Outcome::new(Verdict::Allowed, 3, u64::MAX).balance,
            i64::MAX
        );
    }
}
