//! The store wrapper: a remote store behind the circuit breaker, with the local fallback of
//! [`FailurePolicy::Local`].
//!
//! It routes each call: to the store while the breaker is closed (telling the breaker how it
//! went), to the fallback or an error while it is open or the store failed. When to open, probe
//! or warn is the breaker's; how the fallback decides is the fallback's.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::breaker::{Breaker, CircuitBreaker};
use super::fallback::Local;
use super::policy::FailurePolicy;
use crate::algorithm::error::ConfigError;
use crate::algorithm::{Algorithm, Outcome, Penalty};
use crate::store::{BlockedKey, Charge, Cursor, Outcomes, Page, Store, StoreError, StoreFuture};

/// A remote store behind the circuit breaker, with the local fallback of
/// [`FailurePolicy::Local`].
pub(crate) struct Guarded {
    store: Arc<dyn Store>,
    breaker: Arc<Breaker>,
    local: Option<Local>,
    policy: FailurePolicy,
}

impl Guarded {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        config: &CircuitBreaker,
        policy: FailurePolicy,
    ) -> Self {
        Guarded {
            breaker: Arc::new(Breaker::new(store.clone(), config, policy)),
            local: match policy {
                FailurePolicy::Local { share } => Some(Local::new(share)),
                _ => None,
            },
            store,
            policy,
        }
    }

    /// The store's `answer` to `batch`, counted by the breaker; a failure is answered by the
    /// local fallback when there is one (`from_local` puts its outcomes in the answer's shape).
    fn guard<T: Send + 'static>(
        &self,
        batch: &[Charge<'_>],
        answer: StoreFuture<T>,
        from_local: fn(Outcomes) -> Result<T, StoreError>,
    ) -> StoreFuture<T> {
        let breaker = &self.breaker;
        match answer.into_ready() {
            Ok(Ok(answer)) => {
                breaker.succeeded();
                StoreFuture::ready(Ok(answer))
            }
            Ok(Err(error)) => {
                breaker.failed(&error);
                self.fallback(batch, error, from_local)
            }
            Err(pending) => {
                let breaker = breaker.clone();
                // Only the local fallback needs the batch after the store's answer.
                let kept = self.local.as_ref().map(|local| local.keep(batch));
                StoreFuture::pending(async move {
                    match pending.await {
                        Ok(answer) => {
                            breaker.succeeded();
                            Ok(answer)
                        }
                        Err(error) => {
                            breaker.failed(&error);
                            match kept {
                                Some(kept) => from_local(kept.decide()),
                                None => Err(error),
                            }
                        }
                    }
                })
            }
        }
    }

    /// The answer for `batch` when the store failed with `error` (or was not asked).
    fn fallback<T>(
        &self,
        batch: &[Charge<'_>],
        error: StoreError,
        from_local: fn(Outcomes) -> Result<T, StoreError>,
    ) -> StoreFuture<T> {
        StoreFuture::ready(match &self.local {
            Some(local) => from_local(local.decide(batch)),
            None => Err(error),
        })
    }
}

impl Store for Guarded {
    fn apply(&self, batch: &[Charge<'_>]) -> StoreFuture<Outcomes> {
        if self.breaker.is_open() {
            return self.fallback(batch, self.breaker.refused(), Ok);
        }
        self.guard(batch, self.store.apply(batch), Ok)
    }

    /// As [`apply`](Self::apply) for one charge, through the store's own `apply_one` (the Redis
    /// store's single-key call: no batch to build or read back).
    fn apply_one(&self, charge: &Charge<'_>) -> StoreFuture<Outcome> {
        let batch = std::slice::from_ref(charge);
        if self.breaker.is_open() {
            return self.fallback(batch, self.breaker.refused(), Outcomes::into_first);
        }
        self.guard(batch, self.store.apply_one(charge), Outcomes::into_first)
    }

    fn refund(&self, charge: &Charge<'_>) -> StoreFuture<()> {
        if charge.algorithm.is_concurrency() {
            // A slot given back leaves the books whatever the breaker says: the remote store
            // would go on renewing a lease it still counts as held. It may have been taken by
            // the local fallback instead.
            if let Some(local) = &self.local {
                local.give_back(charge);
            }
            return self.store.refund(charge);
        }
        if self.breaker.is_open() {
            return StoreFuture::ready(Err(self.breaker.refused()));
        }
        self.store.refund(charge)
    }

    fn reset(&self, rule: &str, algorithm: &Algorithm, key: &[u8]) -> StoreFuture<()> {
        if self.breaker.is_open() {
            return StoreFuture::ready(Err(self.breaker.refused()));
        }
        self.store.reset(rule, algorithm, key)
    }

    fn set_block(
        &self,
        rule: &str,
        penalty: &Penalty,
        key: &[u8],
        block: Option<Duration>,
    ) -> StoreFuture<()> {
        if self.breaker.is_open() {
            return StoreFuture::ready(Err(self.breaker.refused()));
        }
        self.store.set_block(rule, penalty, key, block)
    }

    fn blocks(&self, rule: &str, cursor: Option<&Cursor>) -> StoreFuture<Page<BlockedKey>> {
        if self.breaker.is_open() {
            return StoreFuture::ready(Err(self.breaker.refused()));
        }
        self.store.blocks(rule, cursor)
    }

    fn block_of(&self, rule: &str, key: &[u8]) -> StoreFuture<Option<BlockedKey>> {
        if self.breaker.is_open() {
            return StoreFuture::ready(Err(self.breaker.refused()));
        }
        self.store.block_of(rule, key)
    }

    fn set_override(
        &self,
        rule: &str,
        key: &[u8],
        limit: Option<(&crate::algorithm::Limit, Duration)>,
    ) -> StoreFuture<()> {
        if self.breaker.is_open() {
            return StoreFuture::ready(Err(self.breaker.refused()));
        }
        self.store.set_override(rule, key, limit)
    }

    fn override_of(
        &self,
        rule: &str,
        key: &[u8],
    ) -> StoreFuture<Option<crate::store::OverrideEntry>> {
        if self.breaker.is_open() {
            return StoreFuture::ready(Err(self.breaker.refused()));
        }
        self.store.override_of(rule, key)
    }

    fn overrides(
        &self,
        rule: &str,
        cursor: Option<&crate::store::Cursor>,
        count: usize,
    ) -> StoreFuture<crate::store::Page<crate::store::OverrideEntry>> {
        if self.breaker.is_open() {
            return StoreFuture::ready(Err(self.breaker.refused()));
        }
        self.store.overrides(rule, cursor, count)
    }

    fn validate_overrides(&self, rule: &str) -> Result<(), ConfigError> {
        self.store.validate_overrides(rule)
    }

    fn validate(&self, rule: &str, algorithm: &Algorithm) -> Result<(), ConfigError> {
        self.store.validate(rule, algorithm)
    }

    fn validate_penalty(&self, rule: &str, penalty: &Penalty) -> Result<(), ConfigError> {
        self.store.validate_penalty(rule, penalty)
    }

    fn probe(&self) -> StoreFuture<()> {
        self.store.probe()
    }
}

impl fmt::Debug for Guarded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guarded")
            .field("store", &self.store)
            .field("open", &self.breaker.is_open())
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use super::*;
    use crate::algorithm::{Concurrency, Mode, TokenBucket, Verdict};
    use crate::clock::{Clock, ManualClock};
    use crate::store::RuleName;
    use crate::store::{MemoryStore, StoreErrorKind};

    /// A store that fails while `down` is set (its probes too, unless `answers_probes` is set)
    /// and counts the calls that reach it.
    #[derive(Debug, Default)]
    struct Flaky {
        down: AtomicBool,
        answers_probes: AtomicBool,
        calls: AtomicU32,
        memory: MemoryStore,
    }

    impl Store for Flaky {
        fn apply(&self, batch: &[Charge<'_>]) -> StoreFuture<Outcomes> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.down.load(Ordering::Relaxed) {
                return StoreFuture::ready(Err(StoreError::new(StoreErrorKind::Timeout, "late")));
            }
            self.memory.apply(batch)
        }
        fn refund(&self, charge: &Charge<'_>) -> StoreFuture<()> {
            self.memory.refund(charge)
        }
        fn reset(&self, rule: &str, algorithm: &Algorithm, key: &[u8]) -> StoreFuture<()> {
            self.memory.reset(rule, algorithm, key)
        }
        fn probe(&self) -> StoreFuture<()> {
            if self.down.load(Ordering::Relaxed) && !self.answers_probes.load(Ordering::Relaxed) {
                return StoreFuture::ready(Err(StoreError::new(StoreErrorKind::Timeout, "late")));
            }
            StoreFuture::ready(Ok(()))
        }
    }

    /// A store that fails when told to, behind a default breaker on a manual clock.
    fn flaky_behind_a_breaker(policy: FailurePolicy) -> (ManualClock, Arc<Flaky>, Guarded) {
        let clock = ManualClock::new(Duration::from_secs(1_000));
        let flaky = Arc::new(Flaky::default());
        let guarded = Guarded::new(
            flaky.clone(),
            &CircuitBreaker::new().clock(clock.clone()),
            policy,
        );
        (clock, flaky, guarded)
    }

    fn apply(guarded: &Guarded, algorithm: &Algorithm) -> Result<Outcomes, StoreError> {
        let charge = Charge {
            rule: RuleName::new("r"),
            algorithm,
            key: b"k",
            cost: 1,
            mode: Mode::Charge,
            penalty: None,
            lease: None,
            read_overrides: false,
        };
        guarded
            .apply(&[charge])
            .into_ready()
            .expect("the breaker and the test store answer at once")
    }

    #[tokio::test]
    async fn the_probe_interval_starts_and_stops_where_it_is_set() {
        let clock = ManualClock::new(Duration::from_secs(1_000));
        let flaky = Arc::new(Flaky::default());
        let breaker = CircuitBreaker::new()
            .failures(1)
            .probe_interval(Duration::from_secs(3), Duration::from_secs(5))
            .clock(clock.clone());
        let guarded = Guarded::new(flaky.clone(), &breaker, FailurePolicy::Open);
        let algorithm = Algorithm::TokenBucket(TokenBucket::new(100, Duration::from_secs(1)));
        flaky.down.store(true, Ordering::Relaxed);
        apply(&guarded, &algorithm).unwrap_err();
        let next_probe = |guarded: &Guarded| apply(guarded, &algorithm).unwrap_err().retry_after();
        assert_eq!(next_probe(&guarded), Some(Duration::from_secs(3)));
        // Each failed probe doubles the interval, up to the maximum: 3 s, then 5 s (not 6).
        for expected in [5, 5] {
            let wait = next_probe(&guarded).unwrap();
            clock.advance(wait);
            apply(&guarded, &algorithm).unwrap_err();
            tokio::task::yield_now().await;
            assert_eq!(next_probe(&guarded), Some(Duration::from_secs(expected)));
        }
    }

    #[tokio::test]
    async fn opens_after_5_failures_skips_the_store_probes_with_backoff_and_closes() {
        let (clock, flaky, guarded) = flaky_behind_a_breaker(FailurePolicy::Open);
        let algorithm = Algorithm::TokenBucket(TokenBucket::new(100, Duration::from_secs(1)));
        flaky.down.store(true, Ordering::Relaxed);
        for _ in 0..5 {
            assert_eq!(
                apply(&guarded, &algorithm).unwrap_err().kind(),
                StoreErrorKind::Timeout
            );
        }
        // Open: 100 calls, none reaches the store; each says when the next probe is.
        for _ in 0..100 {
            let error = apply(&guarded, &algorithm).unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::CircuitOpen);
            assert_eq!(error.retry_after(), Some(Duration::from_secs(1)));
        }
        assert_eq!(flaky.calls.load(Ordering::Relaxed), 5);
        // The probe (in the background) fails: the next comes 2 s later.
        clock.advance(Duration::from_secs(1));
        apply(&guarded, &algorithm).unwrap_err();
        tokio::task::yield_now().await;
        assert_eq!(
            apply(&guarded, &algorithm).unwrap_err().retry_after(),
            Some(Duration::from_secs(2))
        );
        // The store is back: the next probe closes the breaker, and calls reach the store.
        flaky.down.store(false, Ordering::Relaxed);
        clock.advance(Duration::from_secs(2));
        apply(&guarded, &algorithm).unwrap_err();
        tokio::task::yield_now().await;
        assert!(apply(&guarded, &algorithm).is_ok());
        assert_eq!(flaky.calls.load(Ordering::Relaxed), 6);
    }

    #[tokio::test]
    async fn a_slot_given_back_during_an_outage_leaves_the_books_of_both_stores() {
        let (_, flaky, guarded) = flaky_behind_a_breaker(FailurePolicy::Local { share: 0.5 });
        let slots = Algorithm::Concurrency(Concurrency::new(4));
        let release = Charge {
            rule: RuleName::new("r"),
            algorithm: &slots,
            key: b"k",
            cost: 1,
            mode: Mode::Charge,
            penalty: None,
            lease: None,
            read_overrides: false,
        };
        // One slot taken in the shared store, then the store goes down and the breaker opens.
        assert!(apply(&guarded, &slots).unwrap()[0].is_allowed());
        flaky.down.store(true, Ordering::Relaxed);
        for _ in 0..5 {
            apply(&guarded, &slots).unwrap();
        }
        // The local fallback holds half of the four: the five above took both, and three were
        // denied.
        assert!(!apply(&guarded, &slots).unwrap()[0].is_allowed());
        // Both come back to the local store though the breaker is open, and the shared store
        // is told of the one it holds.
        for _ in 0..2 {
            guarded.refund(&release).into_ready().unwrap().unwrap();
        }
        assert!(apply(&guarded, &slots).unwrap()[0].is_allowed());
        flaky.down.store(false, Ordering::Relaxed);
        let check = Charge {
            mode: Mode::Check,
            cost: 0,
            ..release
        };
        let left = flaky
            .memory
            .apply_one(&check)
            .into_ready()
            .unwrap()
            .unwrap();
        assert_eq!(left.remaining, 4);
    }

    #[tokio::test]
    async fn fail_to_local_decides_with_the_scaled_limit_and_returns_to_the_store() {
        let (clock, flaky, guarded) = flaky_behind_a_breaker(FailurePolicy::Local { share: 0.5 });
        let algorithm = Algorithm::TokenBucket(TokenBucket::new(10, Duration::from_secs(3_600)));
        flaky.down.store(true, Ordering::Relaxed);
        let verdicts: Vec<bool> = (0..8)
            .map(|_| {
                apply(&guarded, &algorithm).unwrap()[0]
                    .verdict
                    .is_admitted()
            })
            .collect();
        // Half of 10 locally: 5 admitted, then denied.
        assert_eq!(
            verdicts,
            [true, true, true, true, true, false, false, false]
        );
        assert!(matches!(
            apply(&guarded, &algorithm).unwrap()[0].verdict,
            Verdict::Denied { .. }
        ));
        flaky.down.store(false, Ordering::Relaxed);
        clock.advance(Duration::from_secs(1));
        apply(&guarded, &algorithm).unwrap();
        tokio::task::yield_now().await;
        // The shared store again: its own count (untouched while it was down).
        assert_eq!(apply(&guarded, &algorithm).unwrap()[0].remaining, 9);
    }

    #[tokio::test]
    async fn one_warning_line_per_interval_counts_the_failures_since_the_last() {
        let clock = ManualClock::new(Duration::from_secs(1_000));
        let flaky = Arc::new(Flaky::default());
        let guarded = Guarded::new(
            flaky.clone(),
            &CircuitBreaker::new()
                .clock(clock.clone())
                .warn_interval(Duration::from_secs(10)),
            FailurePolicy::Open,
        );
        let algorithm = Algorithm::TokenBucket(TokenBucket::new(100, Duration::from_secs(1)));
        flaky.down.store(true, Ordering::Relaxed);
        let lines = || {
            guarded
                .breaker
                .warnings(|warnings| (warnings.last(), warnings.unreported()))
        };
        // The first failure is reported at once; 104 more within 10 s are only counted.
        for _ in 0..105 {
            apply(&guarded, &algorithm).unwrap_err();
        }
        assert_eq!(lines(), (Some(1_000_000_000), 104));
        clock.advance(Duration::from_secs(9));
        apply(&guarded, &algorithm).unwrap_err();
        assert_eq!(lines(), (Some(1_000_000_000), 105));
        // 10 s after the last line: one line saying 106, and the count starts again.
        clock.advance(Duration::from_secs(1));
        apply(&guarded, &algorithm).unwrap_err();
        assert_eq!(lines(), (Some(1_010_000_000), 0));
    }

    /// The store answers probes but fails every request: each probe closes the breaker and five
    /// failures open it again. The backoff holds across these cycles (1, 2, 4, … 30 s between
    /// probes, not 1 s each time), and the warnings stay at one line per 10 s, counting the
    /// reopenings; once the store has answered for 30 s, a new outage is probed after 1 s again.
    #[tokio::test]
    async fn a_breaker_that_opens_again_soon_after_closing_keeps_its_backoff_and_its_warning_interval(
    ) {
        let (clock, flaky, guarded) = flaky_behind_a_breaker(FailurePolicy::Open);
        let algorithm = Algorithm::TokenBucket(TokenBucket::new(100, Duration::from_secs(1)));
        let breaker = &guarded.breaker;
        let is_open = || breaker.is_open();
        flaky.down.store(true, Ordering::Relaxed);
        flaky.answers_probes.store(true, Ordering::Relaxed);
        for _ in 0..5 {
            apply(&guarded, &algorithm).unwrap_err();
        }
        assert!(is_open());
        let start = clock.now();
        let mut intervals = Vec::new();
        let last_warning = || breaker.warnings(|warnings| warnings.last());
        let mut lines = vec![last_warning()];
        while clock.now() - start < 200_000_000 {
            let wait = apply(&guarded, &algorithm)
                .unwrap_err()
                .retry_after()
                .unwrap();
            intervals.push(wait.as_secs());
            clock.advance(wait);
            apply(&guarded, &algorithm).unwrap_err();
            tokio::task::yield_now().await;
            assert!(!is_open(), "the probe closed it");
            for _ in 0..5 {
                let error = apply(&guarded, &algorithm).unwrap_err();
                assert_eq!(error.kind(), StoreErrorKind::Timeout);
            }
            assert!(is_open(), "five failures opened it again");
            let last = last_warning();
            if lines.last() != Some(&last) {
                lines.push(last);
            }
        }
        assert_eq!(intervals, [1, 2, 4, 8, 16, 30, 30, 30, 30, 30, 30]);
        // The first failure and the opening at the start, the first closing 1 s later (a
        // recovery, for all the breaker knew), then one line per 10 s at most.
        let lines: Vec<u64> = lines
            .into_iter()
            .map(|at| (at.unwrap() - start) / 1_000_000)
            .collect();
        assert_eq!(lines, [0, 1, 15, 31, 61, 91, 121, 151, 181, 211]);
        // Each line counted the reopenings before it; the one after the last waits for the next.
        assert_eq!(breaker.warnings(|warnings| warnings.reopened()), 1);
        // The store answers again. The call that starts the probe fails (the breaker is open)
        // and its line is due: the closing waits for the next, written by a call that succeeds.
        flaky.down.store(false, Ordering::Relaxed);
        clock.advance(Duration::from_secs(30));
        apply(&guarded, &algorithm).unwrap_err();
        tokio::task::yield_now().await;
        assert!(!is_open());
        assert_eq!(last_warning(), Some(clock.now()));
        assert!(apply(&guarded, &algorithm).is_ok());
        assert!(breaker.untold_close());
        clock.advance(Duration::from_secs(10));
        assert!(apply(&guarded, &algorithm).is_ok());
        assert!(!breaker.untold_close());
        assert_eq!(last_warning(), Some(clock.now()));
        // Healthy for the longest interval (30 s) since it closed: the next outage starts over
        // at 1 s.
        clock.advance(Duration::from_secs(20));
        flaky.down.store(true, Ordering::Relaxed);
        flaky.answers_probes.store(false, Ordering::Relaxed);
        for _ in 0..5 {
            apply(&guarded, &algorithm).unwrap_err();
        }
        let error = apply(&guarded, &algorithm).unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::CircuitOpen);
        assert_eq!(error.retry_after(), Some(Duration::from_secs(1)));
    }
}
