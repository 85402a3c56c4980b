//! Quota leases: an instance takes a slice of a key's quota from a shared store in one call and
//! decides that key's requests locally until the slice is spent or its time is up — fewer round
//! trips for hot keys, for a bounded error (see [`Lease`]).

use std::time::Duration;

use super::Algorithm;

/// The longest a lease may last: past it, a block or a lowered limit set elsewhere would go
/// unnoticed too long for a lease to be worth its error.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(60);

/// How much of a key's quota one instance may hold at once, and for how long.
///
/// With a lease, the first charge of a key takes `units` from the shared store (or the charge's
/// cost, when larger) in one call; this instance then admits the key's requests from what it
/// holds, without asking the store, until the units are spent or `ttl` has passed. Unused units
/// go back to the store when the lease ends. The trade, stated exactly:
///
/// - **Never more than the store charged.** Every unit admitted locally was charged in the store
///   first, so over any stretch of time the instances together admit at most what the exact
///   limit admits — but a unit may be spent later than it was taken: a token bucket's slice
///   taken while it was full can be spent once it has refilled. At any moment, at most
///   `instances × units` requests are admitted beyond the exact answer. A fixed window's lease
///   ends with its window, so windows are never over-admitted.
/// - **Late by at most one lease.** A reset, an override or a lowered limit set through another
///   instance is seen when this instance's lease ends: at most `ttl` later.
/// - **Units held are units others cannot take**: while one instance holds a slice, another may
///   be denied units that are unused; at most `instances × units` of a key are held at once.
///
/// Only charges of one key take leases (checks, reservations and batches of several rules are
/// always exact), and only the token bucket, the fixed window and the sliding window lease. A
/// rule with a lease has no penalty, queue or per-request limit (each needs every charge
/// decided exactly). The memory store is exact and ignores leases: the same rules move from one
/// process to a fleet unchanged.
///
/// ```
/// use std::time::Duration;
/// use tollgate::algorithm::Lease;
/// use tollgate::{Limit, Rule};
///
/// // Each instance takes 10 units at a time, for at most a second.
/// let rule = Rule::new("api", Limit::per_second(1000)).lease(Lease::new(10, Duration::from_secs(1)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    units: u64,
    ttl: Duration,
}

impl Lease {
    /// Each instance takes `units` of a key's quota at a time and holds them at most `ttl`.
    pub fn new(units: u64, ttl: Duration) -> Lease {
        Lease { units, ttl }
    }

    /// The units one lease takes.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// How long one lease lasts at most.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// What is wrong with this lease under `algorithm`, if anything: the field and why.
    pub(crate) fn problem(&self, algorithm: &Algorithm) -> Option<(&'static str, String)> {
        if !matches!(
            algorithm,
            Algorithm::TokenBucket(_) | Algorithm::FixedWindow(_) | Algorithm::SlidingWindow(_)
        ) {
            return Some((
                "lease",
                "only a token bucket, a fixed window or a sliding window can lease units".into(),
            ));
        }
        if self.units == 0 {
            return Some(("lease.units", "must be at least 1".into()));
        }
        if self.units > algorithm.capacity() {
            return Some((
                "lease.units",
                format!(
                    "{} exceeds the capacity ({}): no lease could ever be granted whole",
                    self.units,
                    algorithm.capacity()
                ),
            ));
        }
        if self.ttl.is_zero() || self.ttl > MAX_LEASE_TTL {
            return Some((
                "lease.ttl",
                format!(
                    "must be more than 0 and at most {} s (a change made elsewhere is seen at \
                     most one lease late)",
                    MAX_LEASE_TTL.as_secs()
                ),
            ));
        }
        None
    }
}
