use std::time::Duration;

use super::{duration, Micros, Mode, Outcome, TokenBucket, Verdict};

/// A steady token bucket with a fallback pool: units come from the steady bucket first and from the
/// pool only for what the steady one cannot pay (e.g. 10/s always, plus a pool of 100 refilling at
/// 1/s for bursts).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BurstPool {
    steady: TokenBucket,
    pool: TokenBucket,
}

/// The state of one key under a [`BurstPool`]: each bucket's [`TokenBucket`] state, the moment it
/// was (or will be) empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BurstPoolState {
    /// The moment the steady bucket was empty (µs since the Unix epoch, signed).
    pub steady: i64,
    /// The moment the pool was empty (µs since the Unix epoch, signed).
    pub pool: i64,
}

impl BurstPool {
    /// A steady bucket and a pool.
    pub fn new(steady: TokenBucket, pool: TokenBucket) -> Self {
        BurstPool { steady, pool }
    }

    /// The steady bucket.
    pub fn steady(&self) -> &TokenBucket {
        &self.steady
    }

    /// The fallback pool.
    pub fn pool(&self) -> &TokenBucket {
        &self.pool
    }

    /// Steady capacity plus pool capacity.
    pub fn capacity(&self) -> u64 {
        self.steady.capacity().saturating_add(self.pool.capacity())
    }

    /// The state of a key never seen before.
    pub fn fresh(&self, now: Micros) -> BurstPoolState {
        BurstPoolState {
            steady: self.steady.fresh(now),
            pool: self.pool.fresh(now),
        }
    }

    /// Whole units each bucket has at `now`.
    fn available(&self, state: BurstPoolState, now: Micros) -> (u64, u64) {
        let units = |bucket: &TokenBucket, empty_at: i64| {
            bucket.evaluate(empty_at, now, 0, Mode::Check).remaining
        };
        (
            units(&self.steady, state.steady),
            units(&self.pool, state.pool),
        )
    }

    /// How `cost` splits between the buckets: as much as possible from the steady one.
    fn split(&self, state: BurstPoolState, now: Micros, cost: u64) -> Option<(u64, u64)> {
        let (steady, pool) = self.available(state, now);
        let from_steady = cost.min(steady);
        let from_pool = cost - from_steady;
        (from_pool <= pool).then_some((from_steady, from_pool))
    }

    /// The wait until `units` whole units of `bucket` are available.
    fn wait_in(bucket: &TokenBucket, empty_at: i64, now: Micros, units: u64) -> Micros {
        if units == 0 {
            return 0;
        }
        if units > bucket.capacity() {
            return Micros::MAX;
        }
        match bucket.evaluate(empty_at, now, units, Mode::Check).verdict {
            Verdict::Denied { retry_after } => super::micros(retry_after),
            _ => 0,
        }
    }

    /// Smallest wait until `units` fit: the best split `k` from steady, `units − k` from the pool.
    fn wait_for(&self, state: BurstPoolState, now: Micros, units: u64) -> Micros {
        let steady_wait = |k: u64| Self::wait_in(&self.steady, state.steady, now, k);
        let pool_wait = |k: u64| Self::wait_in(&self.pool, state.pool, now, units - k);
        // steady_wait grows with k and pool_wait shrinks: find the first k where steady is the
        // slower side; the best split is there or just before it.
        let (mut lo, mut hi) = (0, units.min(self.steady.capacity()));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if steady_wait(mid) >= pool_wait(mid) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let at = |k: u64| steady_wait(k).max(pool_wait(k));
        if lo > 0 {
            at(lo).min(at(lo - 1))
        } else {
            at(lo)
        }
    }

    /// The outcome of charging `cost` at `now`, without changing the state.
    pub fn evaluate(&self, state: BurstPoolState, now: Micros, cost: u64) -> Outcome {
        let (verdict, left) = match self.split(state, now, cost) {
            Some(_) => (Verdict::Allowed, self.commit(state, now, cost)),
            None => {
                let retry_after = duration(self.wait_for(state, now, cost));
                (Verdict::Denied { retry_after }, state)
            }
        };
        let (steady, pool) = self.available(left, now);
        let remaining = steady.saturating_add(pool);
        let reset = if remaining >= self.capacity() {
            Duration::ZERO
        } else {
            duration(self.wait_for(left, now, remaining + 1))
        };
        Outcome {
            verdict,
            limit: self.capacity(),
            remaining,
            balance: i64::try_from(remaining).unwrap_or(i64::MAX),
            next_unit_in: reset,
            full_in: duration(
                self.steady
                    .debt(left.steady, now)
                    .max(self.pool.debt(left.pool, now)),
            ),
            offence: false,
            overridden: None,
        }
    }

    /// Applies an allowed charge.
    pub fn commit(&self, state: BurstPoolState, now: Micros, cost: u64) -> BurstPoolState {
        let (from_steady, from_pool) = self.split(state, now, cost).unwrap_or((cost, 0));
        BurstPoolState {
            steady: self.steady.commit(state.steady, now, from_steady),
            pool: self.pool.commit(state.pool, now, from_pool),
        }
    }

    /// Gives `units` back: to the pool first (it refills slower), the rest to the steady bucket.
    pub fn refund(&self, state: BurstPoolState, now: Micros, units: u64) -> BurstPoolState {
        // The whole units the pool misses, rounded down so that none is lost to its cap.
        let room = self.pool.debt(state.pool, now) / self.pool.interval();
        let to_pool = units.min(room.min(self.pool.capacity()));
        BurstPoolState {
            steady: self.steady.refund(state.steady, now, units - to_pool),
            pool: self.pool.refund(state.pool, now, to_pool),
        }
    }

    /// The moment both buckets are full again.
    pub fn expires_at(&self, state: BurstPoolState) -> Micros {
        self.steady
            .expires_at(state.steady)
            .max(self.pool.expires_at(state.pool))
    }
}
