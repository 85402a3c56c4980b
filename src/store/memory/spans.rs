//! A token bucket's entry in the memory store: one `u64` holding both the bucket's state and what
//! the sweep needs to know when the key becomes idle.
//!
//! The state (`empty_at`, the moment the bucket was empty) does not depend on the limit, so that a
//! key whose limit changes keeps its balance; but the moment the key is idle (full again, equal to
//! a fresh key) is `empty_at` plus the refill span (capacity × interval) of the limit that wrote
//! it, which differs between rules and between the limits a request brings. The entry keeps
//! `empty_at` in its top 57 bits and, in the low 7, a code for that span: a slot of the store's
//! [`Spans`], exact, for the first spans the store meets (most applications have a handful), or
//! else the power of two at or above the span, which sweeps the key later, never earlier.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::algorithm::Micros;

/// An entry holds `empty_at` in its top 57 bits, in two's complement (±2^56 µs, 2,283 years,
/// around the epoch), and the span's code in the 7 below.
const CODE_BITS: u32 = 7;
const CODE_MASK: u64 = (1 << CODE_BITS) - 1;
const EARLIEST: i64 = i64::MIN >> CODE_BITS;
const LATEST: i64 = i64::MAX >> CODE_BITS;
/// Codes below this are slots of [`Spans`]; from it on, `2^(code − SLOTS)`.
const SLOTS: usize = 64;
/// The code of a span of 2^63 µs or more: the key is never idle (but may be evicted).
const ENDLESS: u8 = 127;

/// The refill spans a store's token buckets were written under, one per slot, a slot chosen by
/// the span's hash and claimed for good by the first span that needs it (zero: free).
pub(super) struct Spans {
    slots: [AtomicU64; SLOTS],
}

impl Spans {
    pub(super) fn new() -> Self {
        Spans {
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// The code of `span` for an entry.
    #[inline]
    pub(super) fn code(&self, span: Micros) -> SpanCode {
        let slot = slot_of(span);
        // Relaxed: the entry is written under its shard's lock after this, and a sweep reads it
        // under the same lock, so it sees the slot too. (A span of 0 meets a free slot: that
        // slot's span, 0 or whatever claims it later, is never below it.)
        let code = if self.slots[slot].load(Ordering::Relaxed) == span {
            slot as u8
        } else {
            self.claim(span, slot)
        };
        SpanCode(u64::from(code))
    }

    #[cold]
    fn claim(&self, span: Micros, slot: usize) -> u8 {
        match self.slots[slot].compare_exchange(0, span, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => slot as u8,
            Err(seen) if seen == span => slot as u8,
            // Another span holds the slot: the next power of two at or above this one.
            Err(_) if span <= 1 << 62 => {
                SLOTS as u8 + span.next_power_of_two().trailing_zeros() as u8
            }
            Err(_) => ENDLESS,
        }
    }

    /// The span `code` stands for: exact for a slot, at least the span otherwise.
    fn span(&self, code: u8) -> Micros {
        match usize::from(code) {
            slot if slot < SLOTS => self.slots[slot].load(Ordering::Relaxed),
            _ if code == ENDLESS => Micros::MAX,
            bits => 1 << (bits - SLOTS),
        }
    }
}

fn slot_of(span: Micros) -> usize {
    (span.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SLOTS.trailing_zeros())) as usize
}

/// A span's code, in its place in an entry (the low 7 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SpanCode(u64);

/// A token bucket's entry: `empty_at` and the code of the span it was written under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BucketEntry(u64);

impl BucketEntry {
    /// An entry for `empty_at`, clamped to the 2,283 years around the epoch that the entry holds
    /// exactly (a bucket refilling for longer reads as a little emptier than it is).
    #[inline]
    pub(super) fn new(empty_at: i64, code: SpanCode) -> Self {
        let time = empty_at << CODE_BITS;
        // In range, always but for refill times past 2,000 years: one comparison.
        let time = if time >> CODE_BITS == empty_at {
            time
        } else {
            clamped(empty_at)
        };
        BucketEntry(time as u64 | code.0)
    }

    #[inline]
    pub(super) fn empty_at(self) -> i64 {
        self.0 as i64 >> CODE_BITS
    }

    /// The moment the key is idle: full again under the limit it was written under (or later),
    /// before [`PINNED`](super::PINNED).
    pub(super) fn idle_at(self, spans: &Spans) -> Micros {
        let span = spans.span((self.0 & CODE_MASK) as u8);
        let idle = i128::from(self.empty_at()) + i128::from(span);
        idle.clamp(0, i128::from(super::PINNED - 1)) as Micros
    }
}

#[cold]
fn clamped(empty_at: i64) -> i64 {
    empty_at.clamp(EARLIEST, LATEST) << CODE_BITS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coded(code: u8) -> SpanCode {
        SpanCode(u64::from(code))
    }

    #[test]
    fn an_entry_keeps_empty_at_exactly_and_clamps_beyond_its_range() {
        let times = [
            0,
            1,
            -1,
            1_700_000_000_000_000,
            -600_000_000,
            EARLIEST,
            LATEST,
        ];
        for empty_at in times {
            for code in [0, 1, 63, 64, 126, ENDLESS] {
                let entry = BucketEntry::new(empty_at, coded(code));
                assert_eq!(entry.empty_at(), empty_at);
                assert_eq!(entry.0 & CODE_MASK, u64::from(code));
            }
        }
        for (beyond, clamped) in [
            (i64::MIN, EARLIEST),
            (EARLIEST - 1, EARLIEST),
            (LATEST + 1, LATEST),
            (i64::MAX, LATEST),
        ] {
            assert_eq!(BucketEntry::new(beyond, coded(5)).empty_at(), clamped);
        }
    }

    #[test]
    fn the_first_spans_are_exact_and_the_others_never_short() {
        let spans = Spans::new();
        let minute = 60_000_000;
        let code = spans.code(minute);
        assert_eq!(spans.code(minute), code);
        assert!(code.0 < SLOTS as u64, "a slot: {code:?}");
        let entry = BucketEntry::new(1_000, code);
        assert_eq!(entry.idle_at(&spans), 1_000 + minute);
        // Another span hashed to the same slot: a power of two at or above it.
        let other = (1..)
            .map(|k| minute + k)
            .find(|&s| slot_of(s) == slot_of(minute))
            .unwrap();
        let bound = spans.code(other);
        assert!(bound.0 >= SLOTS as u64, "a power of two: {bound:?}");
        let idle = BucketEntry::new(1_000, bound).idle_at(&spans);
        assert!(idle >= 1_000 + other && idle < 1_000 + 2 * other, "{idle}");
        // A span past 2^62 µs: never idle, yet below the pinned states.
        let pinned = super::super::PINNED;
        for code in [spans.code(u64::MAX), coded(ENDLESS)] {
            assert_eq!(BucketEntry::new(-5, code).idle_at(&spans), u64::MAX - 5);
            assert_eq!(BucketEntry::new(5, code).idle_at(&spans), pinned - 1);
        }
        // Before the epoch: idle at 0 at the latest.
        assert_eq!(
            BucketEntry::new(-2 * minute as i64, code).idle_at(&spans),
            0
        );
    }
}
