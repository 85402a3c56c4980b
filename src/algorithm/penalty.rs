//! Penalties: a key that a rule denies is blocked for a while.
//!
//! A block is two numbers kept beside the key's counters: the moment it ends and how many
//! offences led to it. While it lasts, every request of the key under the rule is denied without
//! touching the counters, and a denial during a block does not extend it. With an escalating
//! list, the n-th offence blocks for the n-th duration (the last one repeats); the count is
//! forgotten once `forget_after` has passed since the end of the last block.

use std::time::Duration;

use super::{duration, micros, Micros, Outcome, Verdict};

/// How long a rule blocks a key it denied.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Penalty;
///
/// let minute = Duration::from_secs(60);
/// // 1 minute, then 10, then an hour for every further offence; forgiven after a quiet day.
/// let penalty = Penalty::escalating([minute, 10 * minute, 60 * minute], 24 * 60 * minute);
/// assert_eq!(penalty.durations().len(), 3);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Penalty {
    durations: Box<[Duration]>,
    forget_after: Duration,
}

/// A key's block: until when, and the offences counted so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// The moment the block ends (µs since the Unix epoch).
    pub until: Micros,
    /// How many offences the key has committed without being forgiven.
    pub offences: u64,
}

impl Penalty {
    /// Every offence blocks for `d`.
    pub fn fixed(d: Duration) -> Penalty {
        Penalty {
            durations: Box::new([d]),
            forget_after: Duration::ZERO,
        }
    }

    /// The n-th offence blocks for the n-th of `durations` (the last repeats); the count is
    /// forgotten `forget_after` after the end of the key's last block.
    pub fn escalating(
        durations: impl IntoIterator<Item = Duration>,
        forget_after: Duration,
    ) -> Penalty {
        Penalty {
            durations: durations.into_iter().collect(),
            forget_after,
        }
    }

    /// The block durations, in order of offence.
    pub fn durations(&self) -> &[Duration] {
        &self.durations
    }

    /// How long after a block ends its offences are forgotten.
    pub fn forget_after(&self) -> Duration {
        self.forget_after
    }

    /// What is wrong with this penalty, if anything: the field and why.
    pub(crate) fn problem(&self) -> Option<(&'static str, String)> {
        if self.durations.is_empty() {
            return Some((
                "block.escalate",
                "must list at least one duration".to_owned(),
            ));
        }
        if let Some(i) = self.durations.iter().position(|d| micros(*d) == 0) {
            return Some(match self.durations.len() {
                1 => (
                    "block",
                    "must be greater than zero (a block lasts at least 1 µs)".to_owned(),
                ),
                _ => (
                    "block.escalate",
                    format!(
                        "duration {} of the list is zero: each block lasts at least 1 µs",
                        i + 1
                    ),
                ),
            });
        }
        None
    }

    /// The block that starts `now` for an offence, given the key's previous block.
    pub fn offend(&self, previous: Option<Block>, now: Micros) -> Block {
        let offences = match previous {
            Some(block) if now < self.forgotten_at(&block) => block.offences.saturating_add(1),
            _ => 1,
        };
        let index = usize::try_from(offences - 1)
            .unwrap_or(usize::MAX)
            .min(self.durations.len().saturating_sub(1));
        let d = self.durations.get(index).copied().unwrap_or_default();
        Block {
            until: now.saturating_add(micros(d)),
            offences,
        }
    }

    /// When a block's state equals no block at all (its offences are forgotten).
    pub fn forgotten_at(&self, block: &Block) -> Micros {
        block.until.saturating_add(micros(self.forget_after))
    }

    /// The answer for a request of a key blocked until `until`, for a limit of `limit` units.
    pub fn blocked(until: Micros, now: Micros, limit: u64) -> Outcome {
        let left = duration(until.saturating_sub(now));
        Outcome {
            verdict: Verdict::Denied { retry_after: left },
            limit,
            remaining: 0,
            // The counters are not read: a blocked key reports nothing available until the
            // block ends.
            balance: 0,
            next_unit_in: left,
            full_in: left,
            offence: false,
            overridden: None,
        }
    }

    /// A denial that started a block ending at `until`: nothing is available until then.
    pub fn punish(outcome: Outcome, until: Micros, now: Micros) -> Outcome {
        let left = duration(until.saturating_sub(now));
        match outcome.verdict {
            Verdict::Denied { retry_after } => Outcome {
                verdict: Verdict::Denied {
                    retry_after: retry_after.max(left),
                },
                remaining: 0,
                next_unit_in: outcome.next_unit_in.max(left),
                full_in: outcome.full_in.max(left),
                offence: true,
                ..outcome
            },
            _ => outcome,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Micros = 1_000_000;

    #[test]
    fn offences_escalate_then_repeat_the_last_and_are_forgotten() {
        let penalty = Penalty::escalating(
            [60, 600, 3600].map(Duration::from_secs),
            Duration::from_secs(86_400),
        );
        let first = penalty.offend(None, 0);
        assert_eq!(
            first,
            Block {
                until: 60 * S,
                offences: 1
            }
        );
        let second = penalty.offend(Some(first), 100 * S);
        assert_eq!(
            second,
            Block {
                until: 700 * S,
                offences: 2
            }
        );
        let third = penalty.offend(Some(second), 800 * S);
        assert_eq!(third.until, 800 * S + 3600 * S);
        let fourth = penalty.offend(Some(third), 5000 * S);
        assert_eq!((fourth.until, fourth.offences), (5000 * S + 3600 * S, 4));
        // A day after the last block ended, the count starts again.
        let later = penalty.forgotten_at(&fourth);
        assert_eq!(later, 8600 * S + 86_400 * S);
        assert_eq!(penalty.offend(Some(fourth), later - 1).offences, 5);
        assert_eq!(
            penalty.offend(Some(fourth), later),
            Block {
                until: later + 60 * S,
                offences: 1
            }
        );
    }

    #[test]
    fn zero_and_empty_penalties_are_problems() {
        assert_eq!(
            Penalty::fixed(Duration::ZERO).problem().map(|p| p.0),
            Some("block")
        );
        assert_eq!(
            Penalty::escalating([], Duration::ZERO)
                .problem()
                .map(|p| p.0),
            Some("block.escalate")
        );
        assert!(Penalty::fixed(Duration::from_secs(1)).problem().is_none());
    }
}
