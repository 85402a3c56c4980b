//! The local fallback of [`FailurePolicy::Local`](super::FailurePolicy::Local): an in-process
//! [`MemoryStore`] deciding with every limit scaled by the share while the shared store fails.
//!
//! It only decides the batches it is handed; when to hand them over (a failure, an open breaker)
//! is the wrapper's business, and it never sees the shared store or the breaker.

use std::time::Duration;

use smallvec::SmallVec;

use crate::algorithm::{
    Algorithm, BurstPool, Concurrency, FixedWindow, Mode, Outcome, Penalty, SlidingLog,
    SlidingWindow, TokenBucket, Verdict,
};
use crate::store::{Charge, MemoryStore, Outcomes, RuleName, Store};

/// The local store and the share of each limit it grants.
#[derive(Clone)]
pub(super) struct Local {
    store: MemoryStore,
    share: f64,
}

impl Local {
    /// An empty local store granting `share` of each limit.
    pub(super) fn new(share: f64) -> Self {
        Local {
            store: MemoryStore::new(),
            share,
        }
    }

    /// The same batch against the local store, every limit scaled by the share.
    pub(super) fn decide(&self, batch: &[Charge<'_>]) -> Outcomes {
        let scaled: SmallVec<[Algorithm; 2]> = batch
            .iter()
            .map(|c| scale(c.algorithm, self.share))
            .collect();
        let charges: SmallVec<[Charge<'_>; 2]> = batch
            .iter()
            .zip(&scaled)
            .map(|(charge, algorithm)| Charge {
                algorithm,
                // A cost above the scaled limit is denied by the algorithm, never charged.
                ..*charge
            })
            .collect();
        match self.store.apply(&charges).into_ready() {
            Ok(Ok(outcomes)) => outcomes,
            // The memory store answers at once and never fails; should it, deny rather than
            // admit unlimited.
            _ => batch
                .iter()
                .map(|c| Outcome {
                    verdict: Verdict::Denied {
                        retry_after: Duration::from_secs(1),
                    },
                    limit: c.algorithm.capacity(),
                    remaining: 0,
                    balance: 0,
                    next_unit_in: Duration::from_secs(1),
                    full_in: Duration::from_secs(1),
                    offence: false,
                    overridden: None,
                })
                .collect(),
        }
    }

    /// Gives back a slot the local store may hold (giving back one it does not hold changes
    /// nothing).
    pub(super) fn give_back(&self, charge: &Charge<'_>) {
        let _ = self.store.refund(charge).into_ready();
    }

    /// Keeps `batch` to decide it locally once the shared store has answered, which the batch's
    /// borrows do not outlive.
    pub(super) fn keep(&self, batch: &[Charge<'_>]) -> Kept {
        Kept {
            local: self.clone(),
            batch: batch.iter().map(OwnedCharge::new).collect(),
        }
    }
}

/// A batch kept by [`Local::keep`], with the local store that decides it.
pub(super) struct Kept {
    local: Local,
    batch: SmallVec<[OwnedCharge; 2]>,
}

impl Kept {
    /// [`Local::decide`] for the kept batch.
    pub(super) fn decide(&self) -> Outcomes {
        let batch: SmallVec<[Charge<'_>; 2]> = self.batch.iter().map(OwnedCharge::charge).collect();
        self.local.decide(&batch)
    }
}

/// A charge whose borrowed parts are owned, to decide it locally after an await.
struct OwnedCharge {
    rule: Box<str>,
    digest: u64,
    algorithm: Algorithm,
    key: Box<[u8]>,
    cost: u64,
    mode: Mode,
    penalty: Option<Penalty>,
}

impl OwnedCharge {
    fn new(charge: &Charge<'_>) -> Self {
        OwnedCharge {
            rule: charge.rule.as_str().into(),
            digest: charge.rule.digest(),
            algorithm: charge.algorithm.clone(),
            key: charge.key.into(),
            cost: charge.cost,
            mode: charge.mode,
            penalty: charge.penalty.cloned(),
        }
    }

    fn charge(&self) -> Charge<'_> {
        Charge {
            rule: RuleName::known(&self.rule, self.digest),
            algorithm: &self.algorithm,
            key: &self.key,
            cost: self.cost,
            mode: self.mode,
            penalty: self.penalty.as_ref(),
            // The fallback is the memory store: exact, it takes no leases.
            lease: None,
            read_overrides: false,
        }
    }
}

/// `algorithm` with every count scaled by `share` (rounded down, at least 1; an initial balance
/// of 0 stays 0); times unchanged.
fn scale(algorithm: &Algorithm, share: f64) -> Algorithm {
    let part = |n: u64| ((n as f64 * share).floor() as u64).max(1);
    let bucket = |tb: &TokenBucket| {
        let initial = match tb.initial() {
            0 => 0,
            n => part(n).min(part(tb.capacity())),
        };
        TokenBucket::new(part(tb.rate()), tb.period())
            .with_capacity(part(tb.capacity()))
            .with_initial(initial)
    };
    match algorithm {
        Algorithm::TokenBucket(tb) => Algorithm::TokenBucket(bucket(tb)),
        Algorithm::BurstPool(p) => {
            Algorithm::BurstPool(BurstPool::new(bucket(p.steady()), bucket(p.pool())))
        }
        Algorithm::FixedWindow(w) => {
            // A calendar month stays one: its windows are not `period`s.
            let window = match w.months() {
                Some(utc_offset) => FixedWindow::calendar_months(part(w.limit()), utc_offset),
                None => FixedWindow::new(part(w.limit()), w.period()),
            };
            Algorithm::FixedWindow(
                window
                    .with_capacity(part(w.capacity()))
                    .with_start(w.start()),
            )
        }
        Algorithm::SlidingWindow(w) => Algorithm::SlidingWindow(
            SlidingWindow::new(part(w.limit()), w.period()).with_start(w.start()),
        ),
        Algorithm::SlidingLog(w) => {
            Algorithm::SlidingLog(SlidingLog::new(part(w.limit()), w.period()))
        }
        Algorithm::Concurrency(c) => Algorithm::Concurrency(Concurrency::new(part(c.max()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_to_local_keeps_a_calendar_month_a_calendar_month() {
        let month = Algorithm::FixedWindow(FixedWindow::calendar_months(10, 3_600_000_000));
        let Algorithm::FixedWindow(scaled) = scale(&month, 0.5) else {
            panic!("not a fixed window: {month:?}");
        };
        assert_eq!(scaled.months(), Some(3_600_000_000));
        assert_eq!((scaled.limit(), scaled.capacity()), (5, 5));
    }
}
