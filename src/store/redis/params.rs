//! What the Rust side computes for the script: every parameter that does not depend on a key's
//! state, and the bounds that keep the script's double arithmetic exact.
//!
//! The script counts in Lua numbers (doubles), exact for integers up to 2^53. Times are about
//! 1.7·10^15 µs today and stay below 2^52 until the year 2112; every configured span (a bucket's
//! refill time, a window's longest wait) is kept below 2^50 µs (35 years) and every count below
//! 2^50, so sums of a time and two spans, and every product the script forms, stay below 2^53.

use smallvec::SmallVec;

use crate::algorithm::error::ConfigError;
use crate::algorithm::{micros, Algorithm, Concurrency, Micros, Mode, Penalty, TokenBucket};

/// One candidate's parameters (seven numbers at most).
pub(super) type Args = SmallVec<[u64; 8]>;

/// The longest span a rule may configure, in µs (about 35.7 years).
pub(super) const MAX_SPAN: u64 = 1 << 50;
/// The most units a rule may hold.
pub(super) const MAX_UNITS: u64 = 1 << 50;
/// Integers up to here are exact in a double.
pub(super) const EXACT: u64 = 1 << 53;
/// The latest `now` the script accepts (the year 2112).
pub(super) const MAX_NOW: u64 = 1 << 52;
/// Extra lifetime of keys written with an injected clock (see "Tests" on
/// [`RedisStore`](super::RedisStore)).
pub(super) const TEST_GRACE_MS: u64 = 60_000;
/// How far a reservation may reach ahead: twice [`MAX_SPAN`] (71 years). (The fixed window's
/// script holds the same number: `fixed.eval`.)
const MAX_AFTER: u64 = 1 << 51;

/// Added to a calendar month's UTC offset (validated within 18 hours) for the script.
const MONTH_OFFSET_BIAS: i64 = 86_400_000_000;

const BUCKET: u64 = 1;
const FIXED: u64 = 2;
const SLIDING: u64 = 3;
const LOG: u64 = 4;
const POOL: u64 = 5;
const SLOTS: u64 = 6;

/// Rejects parameters whose intermediates could leave the exact range in the script.
pub(super) fn validate(rule: &str, algorithm: &Algorithm) -> Result<(), ConfigError> {
    let fail = |field: &'static str, message: String| Err(ConfigError::new(rule, field, message));
    let units = |field: &'static str, value: u64| {
        if value > MAX_UNITS {
            fail(
                field,
                format!("{value} is more than the Redis store counts exactly (2^50)"),
            )
        } else {
            Ok(())
        }
    };
    let span = |field: &'static str, what: &str, value: u128| {
        if value > u128::from(MAX_SPAN) {
            fail(
                field,
                format!(
                    "{what} is {value} µs, more than the Redis store's bound of 2^50 µs (35 years)"
                ),
            )
        } else {
            Ok(())
        }
    };
    let bucket = |prefix: &'static str, tb: &TokenBucket| {
        let (capacity, period) = match prefix {
            "" => ("capacity", "period"),
            _ => ("pool.capacity", "pool.period"),
        };
        units(capacity, tb.capacity())?;
        span(period, "the period", u128::from(micros(tb.period())))?;
        span(
            capacity,
            "the refill time (capacity × emission interval)",
            u128::from(tb.capacity()) * u128::from(tb.interval()),
        )
    };
    match algorithm {
        Algorithm::TokenBucket(tb) => bucket("", tb),
        Algorithm::BurstPool(p) => {
            bucket("", p.steady())?;
            bucket("pool", p.pool())?;
            units("pool.capacity", p.capacity())
        }
        Algorithm::FixedWindow(w) => {
            units("capacity", w.capacity())?;
            let period = u128::from(w.period_micros());
            span("period", "the period", period)?;
            let windows = u128::from(w.capacity().div_ceil(w.limit().max(1))) + 1;
            span(
                "capacity",
                "the longest wait (capacity / limit + 1 windows)",
                windows * period,
            )
        }
        Algorithm::SlidingWindow(w) => {
            units("limit", w.limit())?;
            span("period", "the period", u128::from(w.period_micros()))?;
            let product = (u128::from(w.limit()) + 1) * (u128::from(w.period_micros()) + 1);
            if product > u128::from(EXACT) {
                return fail(
                    "limit",
                    format!(
                        "limit × period ({} × {} µs) must stay below 2^53 for the Redis store's \
                         exact arithmetic; use a sliding log, a fixed window or a token bucket for \
                         this limit",
                        w.limit(),
                        w.period_micros()
                    ),
                );
            }
            Ok(())
        }
        Algorithm::SlidingLog(w) => {
            units("limit", w.limit())?;
            span("period", "the period", u128::from(micros(w.period())))
        }
        Algorithm::Concurrency(c) => units("concurrent", c.max()),
    }
}

/// Rejects block durations the script could not add to a time exactly.
pub(super) fn validate_penalty(rule: &str, penalty: &Penalty) -> Result<(), ConfigError> {
    let too_long = |field: &'static str, d: std::time::Duration| {
        (micros(d) > MAX_SPAN).then(|| {
            ConfigError::new(
                rule,
                field,
                format!(
                    "{} µs is more than the Redis store's bound of 2^50 µs (35 years)",
                    micros(d)
                ),
            )
        })
    };
    let field = if penalty.durations().len() == 1 {
        "block"
    } else {
        "block.escalate"
    };
    match penalty
        .durations()
        .iter()
        .find_map(|&d| too_long(field, d))
        .or_else(|| too_long("block.forget_after", penalty.forget_after()))
    {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// The script's numbers for a penalty: how long after a block its offences are forgotten, then
/// the durations in order of offence (µs).
pub(super) fn penalty(penalty: &Penalty) -> Args {
    let mut args = Args::new();
    args.push(micros(penalty.forget_after()).min(MAX_SPAN));
    args.extend(penalty.durations().iter().map(|&d| micros(d).min(MAX_SPAN)));
    args
}

/// The script's arguments for one candidate key: algorithm code and parameters.
pub(super) fn push(
    args: &mut Args,
    algorithm: &Algorithm,
    rule: &str,
    key: &[u8],
    cost: u64,
    mode: Mode,
) {
    match algorithm {
        Algorithm::TokenBucket(tb) => {
            args.push(BUCKET);
            push_bucket(args, tb);
            let span = |units: u64| u128::from(units) * u128::from(tb.interval());
            // Beyond MAX_AFTER a reservation can never be within bounds: clamping keeps the
            // script's sum exact without changing the answer.
            args.push(span(cost).min(u128::from(MAX_AFTER) + 1) as u64);
            let (max_after, max_wait) = match mode {
                Mode::Reserve(bound) => (
                    bound.max_units.map_or(u128::from(MAX_AFTER), |units| {
                        span(tb.capacity().saturating_add(units)).min(u128::from(MAX_AFTER))
                    }) as u64,
                    bound.max_wait.map_or(EXACT, |wait| micros(wait).min(EXACT)),
                ),
                _ => (0, 0),
            };
            args.push(max_after);
            args.push(max_wait);
        }
        Algorithm::FixedWindow(w) => {
            let period = w.period_micros();
            let (owed, max_wait) = match mode {
                Mode::Reserve(bound) => {
                    // A reservation owes at most MAX_UNITS and reaches at most MAX_AFTER µs
                    // ahead (the script checks its wait: `fixed.eval`), so the script's sums stay
                    // exact; one past either is denied. The reach bounds the wait, not the debt:
                    // a window counting more than a lowered capacity owes what is forgiven when
                    // it ends (a charge of 0 there waits for the next window, whatever it
                    // counted).
                    (
                        bound
                            .max_units
                            .map_or(MAX_UNITS, |units| units.min(MAX_UNITS)),
                        bound.max_wait.map_or(EXACT, |wait| micros(wait).min(EXACT)),
                    )
                }
                _ => (0, 0),
            };
            // Calendar months go as period 0, their UTC offset shifted by a day to stay positive.
            let (period, offset) = match w.months() {
                Some(utc) => (0, u64::try_from(utc + MONTH_OFFSET_BIAS).unwrap_or(0)),
                None => (period, w.start().offset(period, rule, key)),
            };
            args.extend([
                FIXED,
                w.limit(),
                period,
                w.capacity(),
                offset,
                owed,
                max_wait,
            ]);
        }
        Algorithm::SlidingWindow(w) => {
            let period = w.period_micros();
            args.extend([
                SLIDING,
                w.limit(),
                period,
                w.start().offset(period, rule, key),
            ]);
        }
        Algorithm::SlidingLog(w) => args.extend([LOG, w.limit(), micros(w.period())]),
        Algorithm::BurstPool(p) => {
            args.push(POOL);
            push_bucket(args, p.steady());
            push_bucket(args, p.pool());
        }
        // Without a lease: a check, which takes no slot.
        Algorithm::Concurrency(c) => push_slots(args, c, 0, 0),
    }
}

/// A concurrency limit's numbers: the most slots, the lease's length (µs) and the lease's id
/// (below 2^53, so exact in a double), which the script adds to the key's leases if admitted.
pub(super) fn push_slots(args: &mut Args, slots: &Concurrency, lease: Micros, id: u64) {
    args.extend([SLOTS, slots.max(), lease.min(MAX_SPAN), id]);
}

fn push_bucket(args: &mut Args, tb: &TokenBucket) {
    // The initial balance's span: a new key was empty that long ago. Validated rules keep it
    // below 2^50; saturating keeps an unvalidated one from panicking.
    let initial_span = tb
        .initial()
        .min(tb.capacity())
        .saturating_mul(tb.interval());
    args.extend([tb.interval(), tb.capacity(), initial_span]);
}

/// The mode's code in the script.
pub(super) fn mode_code(mode: Mode) -> u64 {
    match mode {
        Mode::Charge => 0,
        Mode::Check => 1,
        Mode::Reserve(_) => 2,
    }
}

/// A cost or refund as the script reads it: anything above 2^53 acts the same as 2^53 there.
pub(super) fn units_arg(units: u64) -> u64 {
    units.min(EXACT)
}

/// Checks an injected time against the script's range.
pub(super) fn check_now(now: Micros) -> Result<Micros, String> {
    if now < MAX_NOW {
        Ok(now)
    } else {
        Err(format!(
            "time {now} µs is past the Redis store's range (2^52 µs)"
        ))
    }
}

/// The time for the script, and the milliseconds its expiries get on top: an injected time, or
/// the server's.
pub(super) fn push_now(packed: &mut Packed, now: Option<Micros>) {
    match now {
        Some(now) => packed.push(now),
        None => packed.0.extend_from_slice(&(-1f64).to_le_bytes()),
    }
    packed.push(if now.is_some() { TEST_GRACE_MS } else { 0 });
}

/// Numbers for the script, as it reads them: little-endian doubles.
pub(super) struct Packed(pub(super) Vec<u8>);

impl Packed {
    /// Integers below 2^53 convert exactly; the rules are validated to stay there.
    pub(super) fn push(&mut self, value: u64) {
        self.0.extend_from_slice(&(value as f64).to_le_bytes());
    }

    /// Like `push`, for a number that may be negative.
    pub(super) fn push_signed(&mut self, value: i64) {
        self.0.extend_from_slice(&(value as f64).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::{FixedWindow, SlidingLog, SlidingWindow};

    fn error(algorithm: Algorithm) -> String {
        validate("r", &algorithm).unwrap_err().to_string()
    }

    #[test]
    fn usual_limits_pass() {
        let day = Duration::from_secs(86_400);
        for algorithm in [
            Algorithm::TokenBucket(TokenBucket::new(1_000_000, day)),
            Algorithm::FixedWindow(FixedWindow::new(10_000_000, day)),
            Algorithm::SlidingWindow(SlidingWindow::new(100_000, day)),
            Algorithm::SlidingLog(SlidingLog::new(1_000, day)),
        ] {
            assert!(validate("r", &algorithm).is_ok(), "{algorithm:?}");
        }
    }

    #[test]
    fn inexact_parameters_are_rejected_naming_the_field() {
        let day = Duration::from_secs(86_400);
        let message = error(Algorithm::SlidingWindow(SlidingWindow::new(1_000_000, day)));
        assert!(
            message.starts_with("rule \"r\": limit: limit × period"),
            "{message}"
        );
        let years = Duration::from_secs(40 * 365 * 86_400);
        let message = error(Algorithm::TokenBucket(TokenBucket::new(1, years)));
        assert!(message.starts_with("rule \"r\": period:"), "{message}");
        let message = error(Algorithm::TokenBucket(
            TokenBucket::new(1, Duration::from_secs(3600)).with_capacity(400_000),
        ));
        assert!(
            message.starts_with("rule \"r\": capacity: the refill time"),
            "{message}"
        );
        let message = error(Algorithm::FixedWindow(
            FixedWindow::new(1, Duration::from_secs(1)).with_capacity(1 << 51),
        ));
        assert!(message.starts_with("rule \"r\": capacity:"), "{message}");
    }
}
