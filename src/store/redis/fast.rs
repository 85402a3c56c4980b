//! The fast paths: one charge of one key under one rule without a penalty, for a token bucket, a
//! sliding window or a fixed window with a period in µs and no roll-over — what nearly every
//! request is. Each is a script of its own (`lua/fast_*.lua`), and the call carries only the
//! numbers its algorithm needs; the script decides, commits, and answers the key's state rolled
//! to its time, before the charge. The outcome's fields are computed here from that state, by the algorithm's own
//! `evaluate` (the memory store's code), so Redis spends its time on the decision alone.
//!
//! Everything else (batches, sharded rules, penalties, checks, reservations, a token bucket's
//! charges of 0, calendar months, roll-over, other algorithms) goes through the general scripts
//! (the charge's, `lua/charge.lua`).

use std::time::Duration;

use ::redis::{Cmd, Value};

use super::lua::{Lua, Scripts};
use super::params::{push_now, Packed};
use super::{conn, keys, params, Inner};
use crate::algorithm::{
    Algorithm, FixedWindow, FixedWindowState, Micros, Mode, Outcome, SlidingWindow,
    SlidingWindowState, TokenBucket,
};
use crate::store::{Charge, RuleName, StoreError, StoreErrorKind};

/// The window start the outcome is computed against: the script answers times relative to the
/// window's start (the windows' math depends on nothing else), and this keeps them positive.
const BASE: Micros = 1 << 53;

/// One charge for a fast path: the key, and the algorithm that reads the script's answer.
pub(super) struct Fast {
    pub(super) name: Vec<u8>,
    cost: u64,
    kind: Kind,
}

enum Kind {
    Bucket(TokenBucket),
    Sliding(SlidingWindow),
    Fixed(FixedWindow),
}

impl Fast {
    /// The fast path for `charge`, when one applies (`sharded`: the rule is split over keys).
    pub(super) fn new(prefix: &str, charge: &Charge<'_>, sharded: bool) -> Option<Fast> {
        // A rule with overrides reads its key's override in the general script.
        if sharded
            || charge.penalty.is_some()
            || charge.read_overrides
            || charge.mode != Mode::Charge
        {
            return None;
        }
        let kind = match charge.algorithm {
            // The fast path rounds the expiry up from at least 1 µs of debt, which a charge of
            // 0 may not leave (Redis refuses an expiry of 0 ms): the general code takes it.
            Algorithm::TokenBucket(tb) if charge.cost > 0 => Kind::Bucket(tb.clone()),
            Algorithm::SlidingWindow(w) => Kind::Sliding(w.clone()),
            // A window that rolls units over (capacity above the limit) grows its key's expiry
            // with every charge: the general code writes it whole.
            Algorithm::FixedWindow(w) if w.months().is_none() && w.capacity() == w.limit() => {
                Kind::Fixed(w.clone())
            }
            _ => return None,
        };
        Some(Fast {
            name: keys::key_name(prefix, &charge.rule, charge.key, None),
            cost: charge.cost,
            kind,
        })
    }

    /// The script of this path, on the server's time (`now` is `None`) or on an injected one.
    pub(super) fn script<'s>(&self, scripts: &'s Scripts, now: Option<Micros>) -> &'s Lua {
        match (&self.kind, now) {
            (Kind::Bucket(_), None) => &scripts.bucket_now,
            (Kind::Bucket(_), Some(_)) => &scripts.bucket_at,
            (Kind::Sliding(_), _) => &scripts.sliding,
            (Kind::Fixed(_), _) => &scripts.fixed,
        }
    }

    /// The script's numbers: the time and the expiries' grace (a token bucket on the server's
    /// time leaves them out), then the algorithm's (see `lua/fast_*.lua`).
    pub(super) fn packed(&self, charge: &Charge<'_>, now: Option<Micros>) -> Packed {
        let mut packed = Packed(Vec::with_capacity(8 * 7));
        // A token bucket on the server's time leaves out the time and the grace: its script
        // (`lua/fast_bucket_now.lua`) reads the server's clock.
        if now.is_some() || !matches!(self.kind, Kind::Bucket(_)) {
            push_now(&mut packed, now);
        }
        let cost = params::units_arg(self.cost);
        match &self.kind {
            Kind::Bucket(tb) => {
                let span = |units: u64| u128::from(units) * u128::from(tb.interval());
                // Beyond the capacity's span a cost never fits: clamping keeps the numbers exact.
                let cost_span = span(cost).min(u128::from(params::MAX_SPAN) + 1) as u64;
                // A new key was empty its initial balance's span ago; the capacity's span is the
                // most a key may owe after a charge (both at most `MAX_SPAN`).
                packed.push(span(tb.initial().min(tb.capacity())) as u64);
                packed.push(cost_span);
                packed.push(tb.full_span());
            }
            Kind::Sliding(w) => {
                let period = w.period_micros();
                packed.push(w.limit());
                packed.push(period);
                packed.push(w.start().offset(period, &charge.rule, charge.key));
                packed.push(cost);
            }
            Kind::Fixed(w) => {
                let period = w.period_micros();
                packed.push(w.limit());
                packed.push(period);
                packed.push(w.capacity());
                packed.push(w.start().offset(period, &charge.rule, charge.key));
                packed.push(cost);
            }
        }
        packed
    }

    /// The cost a window's script adds with `HINCRBY`, sent as a second argument in decimal:
    /// Redis formats a Lua number passed to a command with `%.17g`, at more than a tenth of a
    /// window's whole call. (A token bucket's script passes no number to a command.)
    pub(super) fn units(&self) -> Option<u64> {
        match self.kind {
            Kind::Bucket(_) => None,
            Kind::Sliding(_) | Kind::Fixed(_) => Some(params::units_arg(self.cost)),
        }
    }

    /// The outcome from the script's answer, and whether the key held no state before the call.
    pub(super) fn outcome(&self, reply: &Value) -> Result<(Outcome, bool), StoreError> {
        let (flags, outcome) = match (&self.kind, reply) {
            // The debt before the charge × 4, + 2 when denied, + 1 when the key was missing.
            (Kind::Bucket(tb), &Value::Int(v)) if v >= 0 => {
                let debt = (v >> 2) as u64;
                (v & 3, tb.evaluate_owing(debt, self.cost, Mode::Charge))
            }
            (Kind::Sliding(w), reply) => {
                let [flags, into, current, previous] = match reply {
                    // A charge inside its window: one integer (see `lua/fast_sliding.lua`).
                    &Value::Int(v) if v >= 0 => {
                        let (flags, into, counts) = unpack(v, w.period_micros());
                        let radix = w.limit() as i64 + 1;
                        [flags, into, counts % radix, counts / radix]
                    }
                    Value::BulkString(bytes) => numbers(bytes)?,
                    _ => return Err(protocol(format!("unexpected answer {reply:?}"))),
                };
                let state = SlidingWindowState {
                    window_start: BASE,
                    current: count(current)?,
                    previous: count(previous)?,
                };
                (flags, w.evaluate(state, at(into)?, self.cost))
            }
            (Kind::Fixed(w), reply) => {
                let [flags, into, balance] = match reply {
                    // A charge inside its window: one integer (see `lua/fast_fixed.lua`).
                    &Value::Int(v) if v >= 0 => {
                        let (flags, into, left) = unpack(v, w.period_micros());
                        [flags, into, left]
                    }
                    Value::BulkString(bytes) => numbers(bytes)?,
                    _ => return Err(protocol(format!("unexpected answer {reply:?}"))),
                };
                // The script answers the units left under this call's capacity; the state
                // keeps what was spent. A window a reservation holds starts after now
                // (`into` negative): the state reads the windows before it as held.
                let spent = i128::from(w.capacity()) - i128::from(balance);
                let state = FixedWindowState {
                    window_start: BASE,
                    spent: u64::try_from(spent)
                        .map_err(|_| protocol(format!("{balance} left above the capacity")))?,
                };
                (flags, w.evaluate(state, at(into)?, self.cost, Mode::Charge))
            }
            _ => return Err(protocol(format!("unexpected answer {reply:?}"))),
        };
        // The script committed what it decided: the outcome must say the same.
        if !(0..4).contains(&flags) || outcome.verdict.is_admitted() != (flags & 2 == 0) {
            return Err(protocol(format!(
                "the script's verdict ({flags}) disagrees with {outcome:?}"
            )));
        }
        Ok((outcome, flags & 1 == 1))
    }
}

/// A window's answer as one integer, `(rest × period + into) × 4 + flags`: flags, into, rest.
fn unpack(v: i64, period: u64) -> (i64, i64, i64) {
    // A period is below 2^53 µs (`params::validate`), so it is an `i64`; `max` keeps 0 out.
    let period = period.max(1) as i64;
    let rest = v >> 2;
    (v & 3, rest % period, rest / period)
}

/// The script's little-endian doubles, each an integer of at most 2^53 in magnitude.
fn numbers<const N: usize>(bytes: &[u8]) -> Result<[i64; N], StoreError> {
    if bytes.len() != 8 * N {
        return Err(protocol(format!(
            "the script answered {} bytes instead of {}",
            bytes.len(),
            8 * N
        )));
    }
    let mut out = [0; N];
    for (slot, chunk) in out.iter_mut().zip(bytes.chunks_exact(8)) {
        let value = f64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        if !(value.abs() <= BASE as f64 && value.fract() == 0.0) {
            return Err(protocol(format!(
                "{value} in the script's answer is not a count"
            )));
        }
        *slot = value as i64;
    }
    Ok(out)
}

fn count(value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| protocol(format!("negative count {value}")))
}

/// The script's time, `into` µs after the window's start.
fn at(into: i64) -> Result<Micros, StoreError> {
    BASE.checked_add_signed(into)
        .ok_or_else(|| protocol(format!("time {into} is out of range")))
}

fn protocol(message: String) -> StoreError {
    StoreError::new(StoreErrorKind::Protocol, message)
}

impl Inner {
    /// The `EVALSHA` of a fast path's call, with its script.
    fn fast_command(&self, fast: &Fast, now: Option<Micros>, packed: Packed) -> (&Lua, Cmd) {
        let script = fast.script(&self.scripts, now);
        let mut cmd = Cmd::with_capacity(5, 64 + fast.name.len() + packed.0.len());
        cmd.arg("EVALSHA").arg(script.hash()).arg(1);
        cmd.arg(&fast.name).arg(packed.0.as_slice());
        // A window's script counts in place with the cost as text (see `lua/fast_sliding.lua`).
        if let Some(units) = fast.units() {
            cmd.arg(units);
        }
        (script, cmd)
    }

    /// One call of a fast path (see `fast`): the outcome, and whether the key held no state
    /// before the call.
    pub(super) async fn fast(
        &self,
        fast: &Fast,
        now: Option<Micros>,
        packed: Packed,
    ) -> Result<(Outcome, bool), StoreError> {
        let (script, cmd) = self.fast_command(fast, now, packed);
        let mut conn = self.conn.clone();
        let reply: Value = conn.eval(script, &cmd).await.map_err(conn::error)?;
        fast.outcome(&reply)
    }

    /// The circuit breaker's probe: what a request does, so that it fails when requests fail.
    /// One unit of a bucket refilling a million a second (never denied, so always written, and
    /// full again within a millisecond) on the probe key, through the script's fast path: the
    /// script must be there (or is sent again), and Redis must take a write (a `PING` still
    /// answers when Redis is out of memory and refuses every charge). On a stale connection
    /// failure it tries again on the new connection (see `Conn::eval_afresh`).
    pub(super) async fn probe(&self) -> Result<(), StoreError> {
        let bucket = Algorithm::TokenBucket(TokenBucket::new(1_000_000, Duration::from_secs(1)));
        let charge = Charge {
            rule: RuleName::new("probe"),
            algorithm: &bucket,
            key: b"probe",
            cost: 1,
            mode: Mode::Charge,
            penalty: None,
            lease: None,
            read_overrides: false,
        };
        let mut fast =
            Fast::new(&self.prefix, &charge, false).expect("a bucket's charge of 1 is a fast path");
        fast.name = keys::probe_name(&self.prefix);
        let now = self.injected_now()?;
        let (script, cmd) = self.fast_command(&fast, now, fast.packed(&charge, now));
        let mut conn = self.conn.clone();
        let reply: Value = conn.eval_afresh(script, &cmd).await.map_err(conn::error)?;
        fast.outcome(&reply)?;
        Ok(())
    }
}
