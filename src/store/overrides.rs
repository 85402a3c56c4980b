//! Per-key overrides: a key of an overridable rule charged under a limit of its own
//! for a while, kept in the store so every instance sees it on its next decision, and listed a
//! page at a time (a [`Page`](super::Page) walked with a [`Cursor`](super::Cursor), as blocks are).

use std::time::Duration;

use crate::algorithm::{
    micros, Algorithm, BurstPool, Concurrency, FixedWindow, Limit, SlidingLog, SlidingWindow,
    TokenBucket, WindowStart,
};
use crate::key::KeyValue;

/// One key's override, as [`Limiter::overrides`](crate::Limiter::overrides) lists it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct OverrideEntry {
    /// The key.
    pub key: KeyValue,
    /// The limit the key is charged under instead of its rule's.
    pub limit: Limit,
    /// How long the override has left.
    pub expires_in: Duration,
}

/// The most a page of overrides holds, whatever size is asked for.
pub(crate) const MAX_OVERRIDE_PAGE: usize = 1_000;

/// The limit as 64-bit integers: the algorithm's code (as in the script), then its numbers as
/// its constructors take them (periods and offsets in µs, a window start as its kind — 0 per
/// key, 1 aligned — and offset in seconds and nanoseconds, a calendar month's UTC offset as a
/// signed µs count after a flag).
pub(crate) fn limit_words(algorithm: &Algorithm) -> Vec<u64> {
    let bucket = |tb: &TokenBucket| [tb.rate(), micros(tb.period()), tb.capacity(), tb.initial()];
    let start = |start: WindowStart| match start {
        WindowStart::PerKey => [0, 0, 0],
        WindowStart::Aligned(at) => [1, at.as_secs(), u64::from(at.subsec_nanos())],
    };
    let mut words = Vec::with_capacity(12);
    match algorithm {
        Algorithm::TokenBucket(tb) => {
            words.push(1);
            words.extend(bucket(tb));
        }
        Algorithm::FixedWindow(w) => {
            words.extend([2, w.limit(), micros(w.period()), w.capacity()]);
            words.extend(start(w.start()));
            match w.months() {
                Some(utc) => words.extend([1, utc as u64]),
                None => words.extend([0, 0]),
            }
        }
        Algorithm::SlidingWindow(w) => {
            words.extend([3, w.limit(), micros(w.period())]);
            words.extend(start(w.start()));
        }
        Algorithm::SlidingLog(w) => words.extend([4, w.limit(), micros(w.period())]),
        Algorithm::BurstPool(p) => {
            words.push(5);
            words.extend(bucket(p.steady()));
            words.extend(bucket(p.pool()));
        }
        Algorithm::Concurrency(c) => words.extend([6, c.max()]),
    }
    words
}

/// The limit [`limit_words`] describes, or `None` for words it never writes.
pub(crate) fn limit_from_words(words: &[u64]) -> Option<Limit> {
    let period = |us: u64| Duration::from_micros(us);
    let bucket = |w: &[u64]| {
        TokenBucket::new(w[0], period(w[1]))
            .with_capacity(w[2])
            .with_initial(w[3])
    };
    let start = |w: &[u64]| match w[0] {
        0 => Some(WindowStart::PerKey),
        1 => Some(WindowStart::Aligned(Duration::new(
            w[1],
            u32::try_from(w[2]).ok().filter(|&n| n < 1_000_000_000)?,
        ))),
        _ => None,
    };
    let algorithm = match *words.first()? {
        1 if words.len() == 5 => Algorithm::TokenBucket(bucket(&words[1..])),
        2 if words.len() == 9 => {
            let w = match words[7] {
                0 => FixedWindow::new(words[1], period(words[2])),
                1 => FixedWindow::calendar_months(words[1], words[8] as i64),
                _ => return None,
            };
            Algorithm::FixedWindow(w.with_capacity(words[3]).with_start(start(&words[4..7])?))
        }
        3 if words.len() == 6 => Algorithm::SlidingWindow(
            SlidingWindow::new(words[1], period(words[2])).with_start(start(&words[3..6])?),
        ),
        4 if words.len() == 3 => Algorithm::SlidingLog(SlidingLog::new(words[1], period(words[2]))),
        5 if words.len() == 9 => {
            Algorithm::BurstPool(BurstPool::new(bucket(&words[1..5]), bucket(&words[5..9])))
        }
        6 if words.len() == 2 => Algorithm::Concurrency(Concurrency::new(words[1])),
        _ => return None,
    };
    Some(Limit::from(algorithm))
}
