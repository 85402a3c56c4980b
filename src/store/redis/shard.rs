//! Hot-key sharding: one rule's limit split over `n` Redis keys.
//!
//! Shard `i` gets an `n`-th of every quantity (rate, capacity, initial balance, window limit), the
//! first shards one unit more when it does not divide evenly, so the shards add up to exactly the
//! rule's limit. Each request picks two distinct shards at random and charges the one with more
//! units left (the power of two choices), which keeps the shards evenly used.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::algorithm::error::ConfigError;
use crate::algorithm::{Algorithm, BurstPool, FixedWindow, SlidingLog, SlidingWindow, TokenBucket};

/// A sharded rule: its shard count, and the units each shard had when this instance last saw it
/// (the cluster-mode choice uses them; `u64::MAX` means not seen yet).
#[derive(Debug)]
pub(super) struct Sharding {
    pub(super) n: u32,
    seen: Box<[AtomicU64]>,
}

impl Sharding {
    pub(super) fn new(n: u32) -> Self {
        Sharding {
            n,
            seen: (0..n).map(|_| AtomicU64::new(u64::MAX)).collect(),
        }
    }

    /// Two distinct shards, at random.
    pub(super) fn two(&self) -> (u32, u32) {
        let first = fastrand::u32(0..self.n);
        let second = (first + fastrand::u32(1..self.n)) % self.n;
        (first, second)
    }

    /// Of two shards, the one this instance last saw with more units left.
    pub(super) fn likelier(&self, (a, b): (u32, u32)) -> u32 {
        let seen = |i: u32| self.seen[i as usize].load(Ordering::Relaxed);
        if seen(b) > seen(a) {
            b
        } else {
            a
        }
    }

    pub(super) fn saw(&self, shard: u32, remaining: u64) {
        if let Some(seen) = self.seen.get(shard as usize) {
            seen.store(remaining, Ordering::Relaxed);
        }
    }

    /// Checks that every shard gets at least one unit of every quantity.
    pub(super) fn validate(&self, rule: &str, algorithm: &Algorithm) -> Result<(), ConfigError> {
        let n = u64::from(self.n);
        let check = |field: &'static str, value: u64| {
            if value < n {
                Err(ConfigError::new(
                    rule,
                    field,
                    format!(
                        "{value} cannot be split over {n} Redis shards (each needs at least 1); \
                         use fewer shards"
                    ),
                ))
            } else {
                Ok(())
            }
        };
        match algorithm {
            Algorithm::TokenBucket(tb) => {
                check("rate", tb.rate())?;
                check("capacity", tb.capacity())
            }
            Algorithm::BurstPool(p) => {
                check("rate", p.steady().rate())?;
                check("capacity", p.steady().capacity())?;
                check("pool.rate", p.pool().rate())?;
                check("pool.capacity", p.pool().capacity())
            }
            Algorithm::FixedWindow(w) => check("limit", w.limit()),
            Algorithm::SlidingWindow(w) => check("limit", w.limit()),
            Algorithm::SlidingLog(w) => check("limit", w.limit()),
            Algorithm::Concurrency(_) => Err(ConfigError::new(
                rule,
                "concurrent",
                "a concurrency rule cannot be sharded over several Redis keys: its leases live \
                 in one",
            )),
        }?;
        (0..self.n).try_for_each(|i| super::params::validate(rule, &split(algorithm, self.n, i)))
    }
}

/// Shard `i`'s part of `total` over `n` shards.
fn part(total: u64, n: u32, i: u32) -> u64 {
    let (n, i) = (u64::from(n), u64::from(i));
    total / n + u64::from(i < total % n)
}

/// Shard `i` of `n` of a rule's algorithm.
pub(super) fn split(algorithm: &Algorithm, n: u32, i: u32) -> Algorithm {
    let bucket = |tb: &TokenBucket| {
        TokenBucket::new(part(tb.rate(), n, i), tb.period())
            .with_capacity(part(tb.capacity(), n, i))
            .with_initial(part(tb.initial(), n, i))
    };
    match algorithm {
        Algorithm::TokenBucket(tb) => Algorithm::TokenBucket(bucket(tb)),
        Algorithm::BurstPool(p) => {
            Algorithm::BurstPool(BurstPool::new(bucket(p.steady()), bucket(p.pool())))
        }
        Algorithm::FixedWindow(w) => Algorithm::FixedWindow(
            FixedWindow::new(part(w.limit(), n, i), w.period())
                .with_capacity(part(w.capacity(), n, i))
                .with_start(w.start()),
        ),
        Algorithm::SlidingWindow(w) => Algorithm::SlidingWindow(
            SlidingWindow::new(part(w.limit(), n, i), w.period()).with_start(w.start()),
        ),
        Algorithm::SlidingLog(w) => {
            Algorithm::SlidingLog(SlidingLog::new(part(w.limit(), n, i), w.period()))
        }
        // Refused by `validate`.
        Algorithm::Concurrency(c) => Algorithm::Concurrency(c.clone()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn shards_add_up_to_the_rule() {
        let rule = Algorithm::TokenBucket(
            TokenBucket::new(1_000, Duration::from_secs(1))
                .with_capacity(1_003)
                .with_initial(500),
        );
        let shards: Vec<Algorithm> = (0..4).map(|i| split(&rule, 4, i)).collect();
        let sum = |f: fn(&TokenBucket) -> u64| -> u64 {
            shards
                .iter()
                .map(|s| match s {
                    Algorithm::TokenBucket(tb) => f(tb),
                    _ => unreachable!(),
                })
                .sum()
        };
        assert_eq!(sum(TokenBucket::rate), 1_000);
        assert_eq!(sum(TokenBucket::capacity), 1_003);
        assert_eq!(sum(TokenBucket::initial), 500);
        assert_eq!(shards[0].capacity(), 251);
        assert_eq!(shards[3].capacity(), 250);
    }

    #[test]
    fn two_choices_are_distinct_and_the_fuller_one_wins() {
        let sharding = Sharding::new(3);
        for _ in 0..100 {
            let (a, b) = sharding.two();
            assert_ne!(a, b);
            assert!(a < 3 && b < 3);
        }
        sharding.saw(0, 5);
        sharding.saw(1, 9);
        assert_eq!(sharding.likelier((0, 1)), 1);
        assert_eq!(sharding.likelier((1, 0)), 1);
        // Not seen yet counts as full.
        assert_eq!(sharding.likelier((1, 2)), 2);
    }

    #[test]
    fn too_many_shards_are_rejected() {
        let rule = Algorithm::TokenBucket(TokenBucket::new(3, Duration::from_secs(1)));
        let error = Sharding::new(4).validate("hot", &rule).unwrap_err();
        assert_eq!(error.field(), "rate");
        assert!(Sharding::new(3).validate("hot", &rule).is_ok());
    }
}
