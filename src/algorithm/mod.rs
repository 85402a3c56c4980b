//! The pure math of every limit: `(limit, state, now, cost, mode) → outcome (+ new state)`.
//!
//! Nothing here knows about I/O, clocks, async or HTTP: time is an argument (microseconds since the
//! Unix epoch), and every function is deterministic. Microseconds, not nanoseconds, so that every
//! time and product stays below 2^53 and the Redis store's Lua (whose numbers are doubles) computes
//! exactly the same integers. The stores call these functions; the Redis
//! store runs the same formulas in Lua, kept equal by a differential test.
//!
//! Each algorithm works in two steps so that a store can decide several rules at once and commit all
//! or none of them: [`evaluate`](TokenBucket::evaluate) looks at a state without changing it, and
//! `commit` applies an allowed (or reserved) charge.
//!
//! All arithmetic is integer. Token buckets keep their state as an absolute time (the moment the
//! bucket was empty: GCRA's theoretical arrival time less the capacity's span), so there is no
//! drift, and a key whose limit changes reads the same moment under the new one; when
//! `period / rate` is not a whole number of microseconds, the time one unit takes to refill is
//! rounded up to the next microsecond, which errs on the strict side and keeps bursts exact.
//!
//! A `now` earlier than a state's own time (a clock that stepped back) never panics and never
//! refills anything: sliding windows read it as their window's start, the log as its newest
//! entry's time — the time in between counts as none. A bucket's state is only the moment it was
//! empty, so an earlier `now` reads as less time refilled, and a fixed window's may be a later
//! window a reservation holds, so an earlier `now` reads the windows before it as held: never
//! more admitted, but possibly less. That is why
//! stores never hand an earlier time than one they handed before (see the memory store's clock).

mod burst_pool;
mod calendar;
mod concurrency;
pub(crate) mod error;
mod fixed_window;
mod lease;
pub(crate) mod limit;
pub(crate) mod penalty;
mod sliding_log;
mod sliding_window;
mod token_bucket;

use std::sync::Arc;
use std::time::Duration;

pub use burst_pool::BurstPool;
pub(crate) use burst_pool::BurstPoolState;
pub use concurrency::{Concurrency, SLOT_RETRY_AFTER};
pub use fixed_window::FixedWindow;
pub(crate) use fixed_window::FixedWindowState;
pub use lease::{Lease, MAX_LEASE_TTL};
pub(crate) use limit::Limit;
pub use penalty::Block;
pub(crate) use penalty::Penalty;
pub use sliding_log::SlidingLog;
pub(crate) use sliding_log::SlidingLogState;
pub use sliding_window::SlidingWindow;
pub(crate) use sliding_window::SlidingWindowState;
pub(crate) use state::{stable_key_hash, Micros};
pub use token_bucket::TokenBucket;

/// What a store keeps per key, for the authors of custom stores (and of benchmarks of the
/// algorithms alone): the state each algorithm's `evaluate` reads and `commit` returns, the time
/// they work in, and the hash that places a key's windows. An application never needs these:
/// the stores keep them.
///
/// A token bucket's state is a plain `i64` (the moment the bucket was empty) and a concurrency
/// limit's a `u64` (the slots taken), so neither has a type here.
pub mod state {
    pub use super::burst_pool::BurstPoolState;
    pub use super::fixed_window::FixedWindowState;
    pub use super::sliding_log::SlidingLogState;
    pub use super::sliding_window::SlidingWindowState;

    /// Microseconds since the Unix epoch: the time every algorithm works in.
    pub type Micros = u64;

    /// A stable 64-bit hash (FNV-1a) of a rule name and a key. Stable across processes,
    /// versions and machines, so every instance of a fleet derives the same per-key window
    /// start ([`WindowStart::PerKey`](super::WindowStart::PerKey)): a store that places
    /// windows itself must use it to agree with the others.
    pub fn stable_key_hash(rule: &str, key: &[u8]) -> u64 {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut h = OFFSET;
        for &b in rule.as_bytes().iter().chain(&[0xff]).chain(key) {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
        h
    }
}

/// What a caller asks of one rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// Charge if the cost fits now, otherwise deny and charge nothing.
    #[default]
    Charge,
    /// Look only: the outcome a charge would have, with nothing charged.
    Check,
    /// Charge if the cost fits now; otherwise reserve it (the balance goes negative) when the
    /// reservation stays within the bound, and report how long the caller must wait. Token
    /// buckets and fixed windows reserve; other algorithms treat this as [`Mode::Charge`].
    Reserve(ReserveBound),
}

/// How far into the future a reservation may reach. `None` on both sides means unbounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ReserveBound {
    /// At most this many units may be owed (the balance may go down to `-max_units`).
    pub max_units: Option<u64>,
    /// A reservation whose wait would exceed this is denied instead.
    pub max_wait: Option<Duration>,
}

/// The answer for one rule.
// Non-exhaustive: a new kind of answer (a partial grant, say) is an addition, not a break.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// The cost fits now and was charged.
    Allowed,
    /// The cost was reserved: the work may start after `wait`.
    Reserved {
        /// Time until the reserved slot.
        wait: Duration,
    },
    /// The cost does not fit; nothing was charged.
    Denied {
        /// The earliest moment, from now, at which the same request would be admitted: when the
        /// cost fits, or, for a reservation past its bound, when it could queue.
        retry_after: Duration,
    },
}

impl Verdict {
    /// `true` unless the request was denied.
    pub fn is_admitted(&self) -> bool {
        !matches!(self, Verdict::Denied { .. })
    }
}

/// The answer for one rule, with everything the response headers need.
///
/// A custom [`Store`](crate::store::Store) builds one with [`Outcome::new`] and the `with_`
/// setters; the fields stay readable.
///
/// Not `Copy`: it may carry the key's override ([`override_limit`](Self::override_limit)), shared
/// rather than copied.
// Non-exhaustive: a field the headers need later is an addition, not a break.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Outcome {
    /// Allowed, reserved or denied.
    pub verdict: Verdict,
    /// The most units the limit can hold (`q` in `RateLimit-Policy`).
    pub limit: u64,
    /// Whole units available after this decision (`r` in `RateLimit`); never negative.
    pub remaining: u64,
    /// The signed balance after this decision: `remaining` when units are available, negative
    /// while units are owed (reservations not yet paid back by the refill).
    pub balance: i64,
    /// Time until the available quota grows by at least one unit; zero when it is full (`t` in
    /// `RateLimit`). Not the time until the quota is full again: that is
    /// [`full_in`](Self::full_in).
    pub next_unit_in: Duration,
    /// Time until the quota is full again (`remaining == limit`), debt and reservations
    /// included; zero when it is full.
    pub full_in: Duration,
    /// Whether this denial was an offence that blocked the key under the rule's penalty
    /// ([`Penalty`]); false for every other outcome, denials during a block included.
    pub offence: bool,
    /// The key's override the store charged under, if any (see
    /// [`override_limit`](Self::override_limit)). Shared: a store keeping its overrides as
    /// `Arc`s hands one out without allocating.
    pub(crate) overridden: Option<Arc<Limit>>,
}

impl Outcome {
    /// The answer where a store's invariant says none is needed (a state of another algorithm
    /// than the charge's, which the store's own `fresh` never makes): denied for a window,
    /// nothing left, so that even a broken invariant stays on the safe side instead of panicking.
    pub(crate) fn unreachable(algorithm: &Algorithm) -> Outcome {
        Outcome::new(
            Verdict::Denied {
                retry_after: algorithm.window(),
            },
            algorithm.capacity(),
            0,
        )
        .with_next_unit_in(algorithm.window())
        .with_full_in(algorithm.window())
    }

    /// An outcome of `verdict` under a limit of `limit` units with `remaining` left: the balance
    /// is `remaining`, nothing is owed, the quota is full again at once (`next_unit_in` and
    /// `full_in` zero), and it is no offence. The `with_` setters change the rest.
    pub const fn new(verdict: Verdict, limit: u64, remaining: u64) -> Self {
        Outcome {
            verdict,
            limit,
            remaining,
            balance: if remaining > i64::MAX as u64 {
                i64::MAX
            } else {
                remaining as i64
            },
            next_unit_in: Duration::ZERO,
            full_in: Duration::ZERO,
            offence: false,
            overridden: None,
        }
    }

    /// The same outcome with the signed balance `balance` (negative while units are owed).
    pub const fn with_balance(mut self, balance: i64) -> Self {
        self.balance = balance;
        self
    }

    /// The same outcome, the available quota growing by a unit in `wait`.
    pub const fn with_next_unit_in(mut self, wait: Duration) -> Self {
        self.next_unit_in = wait;
        self
    }

    /// The same outcome, the quota full again in `wait`.
    pub const fn with_full_in(mut self, wait: Duration) -> Self {
        self.full_in = wait;
        self
    }

    /// The same outcome, marked as the offence that blocked its key (or not).
    pub const fn with_offence(mut self, offence: bool) -> Self {
        self.offence = offence;
        self
    }

    /// The same outcome, decided under `limit`, the key's override
    /// ([`Rule::overridable`](crate::Rule::overridable)), which the store read for a charge whose
    /// [`read_overrides`](crate::store::Charge::read_overrides) is set and charged under in place
    /// of the rule's limit. Pass an `Arc` a store keeps to hand it out without allocating.
    pub fn with_override(mut self, limit: impl Into<Arc<Limit>>) -> Self {
        self.overridden = Some(limit.into());
        self
    }

    /// The key's override this outcome was decided under, if any (see
    /// [`with_override`](Self::with_override)): the limit the `RateLimit-Policy` field states.
    pub fn override_limit(&self) -> Option<&Limit> {
        self.overridden.as_deref()
    }

    /// `true` unless the request was denied.
    pub fn is_allowed(&self) -> bool {
        self.verdict.is_admitted()
    }

    /// For a denial: the earliest moment, from now, at which the same request would be admitted.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.verdict {
            Verdict::Denied { retry_after } => Some(retry_after),
            _ => None,
        }
    }
}

/// A cost that can never pass: more than the limit can ever hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CostTooLarge {
    /// The requested cost.
    pub cost: u64,
    /// The largest cost that could ever pass in this mode.
    pub max: u64,
}

impl std::fmt::Display for CostTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cost {} can never pass: at most {} fits",
            self.cost, self.max
        )
    }
}

impl std::error::Error for CostTooLarge {}

/// Where a window-based limit starts its windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum WindowStart {
    /// Each key gets its own start, derived from a stable hash of (rule, key): every instance
    /// computes the same start, and keys don't all reset at the same instant.
    #[default]
    PerKey,
    /// Windows start at `offset + k·period` after the Unix epoch (offset zero aligns a one-minute
    /// window to whole UTC minutes, a one-day window to UTC midnight).
    Aligned(Duration),
}

/// Every algorithm, as a store sees it.
// Non-exhaustive: adding an algorithm (ARCHITECTURE's recipe) must not break a store's or a
// tool's `match`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// Continuous refill with a burst capacity.
    TokenBucket(TokenBucket),
    /// Counter per window, optional roll-over.
    FixedWindow(FixedWindow),
    /// Weighted previous + current window counter.
    SlidingWindow(SlidingWindow),
    /// Exact log of admitted units in the last period.
    SlidingLog(SlidingLog),
    /// A steady bucket with a fallback pool.
    BurstPool(BurstPool),
    /// At most so many requests of a key in flight at once (not a quota over time).
    Concurrency(Concurrency),
}

impl Algorithm {
    /// The most units the limit can hold (`q`).
    pub fn capacity(&self) -> u64 {
        match self {
            Algorithm::TokenBucket(a) => a.capacity(),
            Algorithm::FixedWindow(a) => a.capacity(),
            Algorithm::SlidingWindow(a) => a.limit(),
            Algorithm::SlidingLog(a) => a.limit(),
            Algorithm::BurstPool(a) => a.capacity(),
            Algorithm::Concurrency(a) => a.max(),
        }
    }

    /// The policy window (`w`): the period for windows, the time to refill from empty for buckets;
    /// for a concurrency limit, which is no quota over time, the wait a denial is told
    /// ([`SLOT_RETRY_AFTER`]).
    pub fn window(&self) -> Duration {
        match self {
            Algorithm::TokenBucket(a) => a.refill_time(),
            Algorithm::FixedWindow(a) => a.period(),
            Algorithm::SlidingWindow(a) => a.period(),
            Algorithm::SlidingLog(a) => a.period(),
            Algorithm::BurstPool(a) => a.steady().refill_time(),
            Algorithm::Concurrency(_) => SLOT_RETRY_AFTER,
        }
    }

    /// The largest cost that can ever pass in `mode`.
    pub fn max_cost(&self, mode: Mode) -> u64 {
        match self {
            Algorithm::TokenBucket(a) => a.max_cost(mode),
            Algorithm::FixedWindow(a) => a.max_cost(mode),
            other => other.capacity(),
        }
    }

    /// Whether `mode` can reserve with this algorithm (token buckets and fixed windows do).
    pub fn reserves(&self) -> bool {
        matches!(self, Algorithm::TokenBucket(_) | Algorithm::FixedWindow(_))
    }

    /// Whether this is a concurrency limit: slots held while a response is in flight, not a
    /// quota over time (no `RateLimit` fields; released when the response ends).
    pub fn is_concurrency(&self) -> bool {
        matches!(self, Algorithm::Concurrency(_))
    }

    /// Checks `cost` against [`max_cost`](Self::max_cost).
    pub fn check_cost(&self, cost: u64, mode: Mode) -> Result<(), CostTooLarge> {
        let max = self.max_cost(mode);
        if cost > max {
            Err(CostTooLarge { cost, max })
        } else {
            Ok(())
        }
    }
}

pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

pub(crate) fn duration(us: u64) -> Duration {
    Duration::from_micros(us)
}

/// The start of the window that contains `now`, for windows at `offset + k·period`.
pub(crate) fn window_containing(now: Micros, offset: Micros, period: Micros) -> Micros {
    let offset = offset % period;
    // `now + period - offset` stays positive even when `now < offset`.
    let into = (u128::from(now) + u128::from(period) - u128::from(offset)) % u128::from(period);
    // Only a time within one period of the epoch has a window starting before it; start that one
    // at the epoch instead.
    now.saturating_sub(into as u64)
}

impl WindowStart {
    /// The window offset in `[0, period)` for `(rule, key)`.
    pub fn offset(&self, period: Micros, rule: &str, key: &[u8]) -> Micros {
        match self {
            WindowStart::PerKey => stable_key_hash(rule, key) % period,
            WindowStart::Aligned(offset) => micros(*offset) % period,
        }
    }
}

#[cfg(test)]
mod tests;
