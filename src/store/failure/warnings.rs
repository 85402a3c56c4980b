//! The breaker's warning lines: at most one per interval while the store fails, counting the
//! failed decisions since the last; the opening and the closing each get a line of their own.
//!
//! It counts and writes, under the breaker's lock; when the breaker opens, closes or probes is
//! the breaker's decision, and it never sees the store.

use std::time::Duration;

use super::policy::FailurePolicy;
use crate::algorithm::{micros, Micros};
use crate::store::StoreError;

/// The counts behind the lines, and when the last was written.
pub(super) struct Warnings {
    every: Micros,
    /// Each line says what requests get meanwhile.
    policy: FailurePolicy,
    /// When the last line was written.
    last: Option<Micros>,
    /// Failed decisions since the last line.
    unreported: u64,
    /// The times the breaker opened again soon after closing since the last line.
    reopened: u64,
    /// Failed decisions since the breaker opened (for the line that says it closed).
    failed_while_open: u64,
}

impl Warnings {
    pub(super) fn new(every: Duration, policy: FailurePolicy) -> Self {
        Warnings {
            every: micros(every),
            policy,
            last: None,
            unreported: 0,
            reopened: 0,
            failed_while_open: 0,
        }
    }

    /// Whether a line may be written: one per interval.
    pub(super) fn due(&self, now: Micros) -> bool {
        self.last
            .is_none_or(|last| now.saturating_sub(last) >= self.every)
    }

    /// The breaker opened after being healthy: the counts of the outage start, with a line of its
    /// own.
    pub(super) fn opened(
        &mut self,
        now: Micros,
        error: &StoreError,
        failures: u32,
        next_probe: Duration,
    ) {
        self.failed_while_open = 0;
        self.reopened = 0;
        self.last = Some(now);
        tracing::warn!(
            %error,
            failures,
            next_probe_ms = next_probe.as_millis() as u64,
            "rate-limit store: circuit breaker opened after {failures} consecutive \
             failures; the store is not asked until it answers a probe, and {}",
            self.policy.what_happens()
        );
    }

    /// The breaker opened again soon after closing: no line of its own, the next one counts it.
    pub(super) fn reopened_soon(&mut self) {
        self.reopened += 1;
    }

    /// A failed decision (`open`: answered by the open breaker), with a line when one is due.
    pub(super) fn failed(&mut self, now: Micros, open: bool, error: &StoreError) {
        self.unreported += 1;
        if open {
            self.failed_while_open += 1;
        }
        if self.due(now) {
            let failed = std::mem::take(&mut self.unreported);
            let reopened = std::mem::take(&mut self.reopened);
            self.last = Some(now);
            let flaps = match reopened {
                0 => String::new(),
                n => format!(
                    "; the circuit breaker closed after a successful probe and opened again {n} \
                     time(s) (the store answers probes but fails requests)"
                ),
            };
            tracing::warn!(
                %error,
                failed,
                reopened,
                "rate-limit store failing: {failed} failed decision(s) since the last \
                 warning{flaps}; {}",
                self.policy.what_happens()
            );
        }
    }

    /// The line saying the breaker closed, and how long (`down`) the store failed.
    pub(super) fn closed(&mut self, now: Micros, down: Duration) {
        let reopened = std::mem::take(&mut self.reopened);
        let flaps = match reopened {
            0 => String::new(),
            n => format!(" (it had closed and opened again {n} time(s) since the last warning)"),
        };
        self.unreported = 0;
        self.last = Some(now);
        tracing::warn!(
            failed = self.failed_while_open,
            down_ms = down.as_millis() as u64,
            reopened,
            "rate-limit store answers again: circuit breaker closed after {:.1} s and {} failed \
             decision(s){flaps}; the shared store decides again",
            down.as_secs_f64(),
            self.failed_while_open
        );
    }
}

/// What the tests read.
#[cfg(test)]
impl Warnings {
    /// When the last line was written.
    pub(super) fn last(&self) -> Option<Micros> {
        self.last
    }

    /// Failed decisions since the last line.
    pub(super) fn unreported(&self) -> u64 {
        self.unreported
    }

    /// Reopenings since the last line.
    pub(super) fn reopened(&self) -> u64 {
        self.reopened
    }
}
