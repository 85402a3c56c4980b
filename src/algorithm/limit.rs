//! `Limit`: which algorithm, with which numbers.

use std::time::Duration;

use super::error::ConfigError;
use super::{
    Algorithm, BurstPool, Concurrency, FixedWindow, SlidingLog, SlidingWindow, TokenBucket,
    WindowStart,
};

/// How much traffic a rule lets through: an algorithm and its numbers.
///
/// The `per_*` constructors build a token bucket: `Limit::per_minute(60)` refills one unit every
/// second and holds at most 60 (so a quiet client may burst 60 at once). Use
/// [`capacity`](Self::capacity) for a different capacity, or pick a window algorithm with the other constructors.
///
/// Nonsense values (a zero rate, a zero period, an initial balance above the capacity) are reported
/// when the layer is built, naming the rule and the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    algorithm: Algorithm,
    /// The first setting given that does not apply to the algorithm (`capacity` on a sliding
    /// window, …): an error when the rule is built, rather than a setting silently dropped.
    misapplied: Option<&'static str>,
}

impl Limit {
    /// A token bucket of `n` units per second, capacity `n`.
    pub fn per_second(n: u64) -> Limit {
        Limit::token_bucket(n, Duration::from_secs(1))
    }

    /// A token bucket of `n` units per minute, capacity `n`.
    pub fn per_minute(n: u64) -> Limit {
        Limit::token_bucket(n, Duration::from_secs(60))
    }

    /// A token bucket of `n` units per hour, capacity `n`.
    pub fn per_hour(n: u64) -> Limit {
        Limit::token_bucket(n, Duration::from_secs(3600))
    }

    /// A token bucket of `n` units per day, capacity `n`.
    pub fn per_day(n: u64) -> Limit {
        Limit::token_bucket(n, Duration::from_secs(86_400))
    }

    /// A token bucket refilling `rate` units per `period` continuously; capacity `rate`.
    pub fn token_bucket(rate: u64, period: Duration) -> Limit {
        Limit {
            misapplied: None,
            algorithm: Algorithm::TokenBucket(TokenBucket::new(rate, period)),
        }
    }

    /// A fixed window: `limit` units per window of `period`. Windows start at a per-key offset
    /// unless [`aligned`](Self::aligned).
    pub fn fixed_window(limit: u64, period: Duration) -> Limit {
        Limit {
            misapplied: None,
            algorithm: Algorithm::FixedWindow(FixedWindow::new(limit, period)),
        }
    }

    /// A fixed window per calendar month: `limit` units from midnight on the 1st to midnight on
    /// the next 1st, at `utc_offset_secs` seconds east of UTC (negative: west; at most 18 hours
    /// either way). Real months — 28 to 31 days, leap years included — not 30-day periods:
    /// "10,000 a month, reset on the 1st" is `Limit::calendar_month(10_000, 0)`.
    ///
    /// `RateLimit-Policy` reports `w` as 31 days (the longest month); `t` counts to the next 1st.
    pub fn calendar_month(limit: u64, utc_offset_secs: i32) -> Limit {
        Limit {
            misapplied: None,
            algorithm: Algorithm::FixedWindow(FixedWindow::calendar_months(
                limit,
                i64::from(utc_offset_secs) * 1_000_000,
            )),
        }
    }

    /// A fixed window per calendar week: `limit` units from Monday 00:00 to the next Monday
    /// 00:00, at `utc_offset_secs` seconds east of UTC (negative: west).
    pub fn calendar_week(limit: u64, utc_offset_secs: i32) -> Limit {
        const WEEK: i64 = 7 * 86_400;
        // 1970-01-05, four days after the epoch, was a Monday.
        let monday = (4 * 86_400 - i64::from(utc_offset_secs)).rem_euclid(WEEK);
        Limit::fixed_window(limit, Duration::from_secs(WEEK as u64))
            .aligned_at(Duration::from_secs(monday as u64))
    }

    /// A sliding window counter: about `limit` units in any `period` (weighted approximation).
    pub fn sliding_window(limit: u64, period: Duration) -> Limit {
        Limit {
            misapplied: None,
            algorithm: Algorithm::SlidingWindow(SlidingWindow::new(limit, period)),
        }
    }

    /// A sliding window log: exactly at most `limit` units in any `period`. Memory per key grows
    /// with `limit`.
    pub fn sliding_log(limit: u64, period: Duration) -> Limit {
        Limit {
            misapplied: None,
            algorithm: Algorithm::SlidingLog(SlidingLog::new(limit, period)),
        }
    }

    /// A concurrency limit: at most `n` requests of a key in flight at once, e.g. 8
    /// LLM completions per API key. Not a quota over time: a request takes a slot in the same
    /// atomic step as its other rules and gives it back when its response body ends or is
    /// dropped (a streaming body holds its slot to its end), or when the service fails or the
    /// request is dropped. A request finding no free slot is denied with `Retry-After: 1`, or,
    /// with a [`Queue`](crate::Queue), waits for one (first come, first served). No `RateLimit`
    /// fields are sent for it (the draft defines quotas over time only); a `429` body names the
    /// rule. Each request takes one slot: a cost is not allowed. `n = 0` is an error when the
    /// layer is built.
    ///
    /// With a [`RedisStore`](crate::RedisStore), a slot is a lease that expires unless renewed
    /// (see [`lease`](crate::store::RedisStoreBuilder::lease)), so the slots of an instance that
    /// crashed come back by themselves.
    pub fn concurrent(n: u64) -> Limit {
        Limit {
            misapplied: None,
            algorithm: Algorithm::Concurrency(Concurrency::new(n)),
        }
    }

    /// The capacity: the largest burst of a token bucket, or how far a fixed window may roll unused
    /// units over. A burst pool's steady bucket takes it. On another algorithm it would change
    /// nothing: the rule is then an error when it is built (likewise `initial`, `pool` and
    /// `aligned` where they do not apply).
    ///
    /// (Formerly `burst`: that word now means only what a [`Queue`](crate::Queue) lets wait.)
    pub fn capacity(mut self, capacity: u64) -> Limit {
        self.algorithm = match self.algorithm {
            Algorithm::TokenBucket(tb) => Algorithm::TokenBucket(tb.with_capacity(capacity)),
            Algorithm::FixedWindow(w) => Algorithm::FixedWindow(w.with_capacity(capacity)),
            Algorithm::BurstPool(p) => Algorithm::BurstPool(BurstPool::new(
                p.steady().clone().with_capacity(capacity),
                p.pool().clone(),
            )),
            other => return Limit::from(other).misapplied(self.misapplied, "capacity"),
        };
        self
    }

    /// The balance a new key starts with (token buckets; default: full).
    pub fn initial(mut self, units: u64) -> Limit {
        match self.algorithm {
            Algorithm::TokenBucket(tb) => {
                self.algorithm = Algorithm::TokenBucket(tb.with_initial(units));
                self
            }
            other => Limit::from(other).misapplied(self.misapplied, "initial"),
        }
    }

    /// Adds a fallback pool to a token bucket: a pool of `capacity` units refilling `rate` per
    /// `period`, used only for what the steady bucket cannot pay.
    pub fn pool(mut self, capacity: u64, rate: u64, period: Duration) -> Limit {
        let pool = TokenBucket::new(rate, period).with_capacity(capacity);
        self.algorithm = match self.algorithm {
            Algorithm::TokenBucket(steady) => Algorithm::BurstPool(BurstPool::new(steady, pool)),
            Algorithm::BurstPool(p) => {
                Algorithm::BurstPool(BurstPool::new(p.steady().clone(), pool))
            }
            other => return Limit::from(other).misapplied(self.misapplied, "pool"),
        };
        self
    }

    /// Aligns windows to multiples of the period since the Unix epoch (UTC minutes, hours,
    /// midnight) instead of a per-key start.
    pub fn aligned(self) -> Limit {
        self.window_start(WindowStart::Aligned(Duration::ZERO))
    }

    /// Windows start at `offset + k·period` after the Unix epoch (e.g. midnight in UTC+2 for a daily
    /// window: `Duration::from_secs(22 * 3600)`).
    pub fn aligned_at(self, offset: Duration) -> Limit {
        self.window_start(WindowStart::Aligned(offset))
    }

    fn window_start(mut self, start: WindowStart) -> Limit {
        self.algorithm = match self.algorithm {
            Algorithm::FixedWindow(w) => Algorithm::FixedWindow(w.with_start(start)),
            Algorithm::SlidingWindow(w) => Algorithm::SlidingWindow(w.with_start(start)),
            other => return Limit::from(other).misapplied(self.misapplied, "aligned"),
        };
        self
    }

    /// This limit, remembering the first setting given that does not apply to its algorithm.
    fn misapplied(mut self, earlier: Option<&'static str>, setting: &'static str) -> Limit {
        self.misapplied = earlier.or(Some(setting));
        self
    }

    /// Checks that the numbers can work and that every setting given applies to the algorithm;
    /// the error names the rule and the field.
    pub(crate) fn check(&self, rule: &str) -> Result<(), ConfigError> {
        if let Some(setting) = self.misapplied {
            return Err(ConfigError::new(
                rule,
                setting,
                format!(
                    "does not apply to {}: it would change nothing",
                    named(&self.algorithm)
                ),
            ));
        }
        check_algorithm(rule, &self.algorithm)
    }

    /// The algorithm and its parameters.
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }
}

impl From<Algorithm> for Limit {
    fn from(algorithm: Algorithm) -> Self {
        Limit {
            algorithm,
            misapplied: None,
        }
    }
}

/// An algorithm's name in a sentence.
fn named(algorithm: &Algorithm) -> &'static str {
    match algorithm {
        Algorithm::TokenBucket(_) => "a token bucket",
        Algorithm::FixedWindow(_) => "a fixed window",
        Algorithm::SlidingWindow(_) => "a sliding window",
        Algorithm::SlidingLog(_) => "a sliding log",
        Algorithm::BurstPool(_) => "a burst pool",
        Algorithm::Concurrency(_) => "a concurrency limit",
    }
}

/// Checks that an algorithm's numbers can work; the error names the rule and the field.
fn check_algorithm(name: &str, algorithm: &Algorithm) -> Result<(), ConfigError> {
    let err = |field: &'static str, message: String| Err(ConfigError::new(name, field, message));
    match algorithm {
        Algorithm::TokenBucket(tb) => {
            positive(name, "rate", tb.rate())?;
            positive(name, "period", tb.period().as_micros())?;
            positive(name, "capacity", tb.capacity())?;
            if tb.initial() > tb.capacity() {
                return err(
                    "initial",
                    format!("must be at most the capacity ({})", tb.capacity()),
                );
            }
        }
        Algorithm::FixedWindow(w) => {
            positive(name, "limit", w.limit())?;
            const MAX_OFFSET: i64 = 18 * 3_600_000_000;
            if w.months().is_some_and(|utc| utc.abs() > MAX_OFFSET) {
                return err("utc_offset", "must be within 18 hours of UTC".into());
            }
            positive(name, "period", w.period().as_micros())?;
            if w.capacity() < w.limit() {
                return err(
                    "capacity",
                    format!("must be at least the per-window limit ({})", w.limit()),
                );
            }
        }
        Algorithm::SlidingWindow(w) => {
            positive(name, "limit", w.limit())?;
            positive(name, "period", w.period().as_micros())?;
        }
        Algorithm::SlidingLog(w) => {
            positive(name, "limit", w.limit())?;
            positive(name, "period", w.period().as_micros())?;
        }
        Algorithm::BurstPool(p) => {
            for (part, tb) in [("steady", p.steady()), ("pool", p.pool())] {
                positive(name, field_of(part, "rate"), tb.rate())?;
                positive(name, field_of(part, "period"), tb.period().as_micros())?;
                positive(name, field_of(part, "capacity"), tb.capacity())?;
            }
        }
        Algorithm::Concurrency(c) => positive(name, "concurrent", c.max())?,
    }
    Ok(())
}

fn field_of(part: &'static str, field: &'static str) -> &'static str {
    match (part, field) {
        ("steady", "rate") => "rate",
        ("steady", "period") => "period",
        ("steady", _) => "capacity",
        (_, "rate") => "pool.rate",
        (_, "period") => "pool.period",
        _ => "pool.capacity",
    }
}

fn positive(rule: &str, field: &'static str, value: impl Into<u128>) -> Result<(), ConfigError> {
    if value.into() == 0 {
        // Periods are counted in whole microseconds.
        let what = if field.ends_with("period") {
            "must be at least 1 µs"
        } else {
            "must be greater than 0"
        };
        Err(ConfigError::new(rule, field, what))
    } else {
        Ok(())
    }
}
