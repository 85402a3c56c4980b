//! Per-key overrides on Redis: a key of an overridable rule charged under a limit of
//! its own until the override ends.
//!
//! An override is one string key beside the counters, `<prefix>:override:{<tag>}:<rule>` (the
//! counters' slot), written by the `OVERRIDE` script and read by the charge's own script call
//! (only for overridable rules): its value carries the numbers the script charges under, in the
//! encoding of the call's own numbers, so the script swaps them in for the rule's. The value,
//! all little-endian:
//!
//! | bytes | what |
//! |---|---|
//! | 0–7 | `until`: when the override ends (µs, by the clock of the call that set it), a double |
//! | 8–15 | the format's version, 1, a double |
//! | 16–23 | `S`, how many of the script's numbers follow, a double |
//! | 24–31 | the largest cost a charge or check can pass under the limit, a double |
//! | 32… | the `S` numbers the script charges under (those of `params::push` for an unbounded reservation of nothing: the script puts in what a request's cost and mode change) |
//! | then | the limit for the Rust side, as 64-bit integers (see `store::overrides::limit_words`) |
//!
//! The key's expiry (`PX`) is the override's TTL (plus a test clock's slack): it goes by
//! itself, and while it lasts the script applies it only while `until` is ahead. A value that
//! cannot be read is an error (a `Protocol` error on the Rust side, an error reply from the
//! script), never a panic or a silent limit.

use std::time::Duration;

use ::redis::{Cmd, Value};

use super::listing::At;
use super::params::{push_now, Packed};
use super::{conn, keys, params, Inner};
use crate::algorithm::{duration, micros, Algorithm, Limit, Micros, Mode, ReserveBound};
use crate::key::KeyValue;
use crate::store::{Cursor, OverrideEntry, Page, StoreError, StoreErrorKind};

/// The format's version, in every value.
const VERSION: f64 = 1.0;
/// The header: until, version, count of the script's numbers, largest cost.
const HEADER: usize = 32;

/// The value of an override of `limit` for `key` under `rule`, without its first eight bytes
/// (`until`, which the `OVERRIDE` script writes by its clock).
pub(super) fn encode(limit: &Limit, rule: &str, key: &[u8]) -> Vec<u8> {
    let algorithm = limit.algorithm();
    let mut numbers = params::Args::new();
    let unbounded = Mode::Reserve(ReserveBound::default());
    match algorithm {
        // A slot's lease and id are the request's: the script keeps them.
        Algorithm::Concurrency(slots) => params::push_slots(&mut numbers, slots, 0, 0),
        _ => params::push(&mut numbers, algorithm, rule, key, 0, unbounded),
    }
    let mut value = Packed(Vec::with_capacity(HEADER + 8 * numbers.len() + 80));
    value.0.extend_from_slice(&VERSION.to_le_bytes());
    value.push(numbers.len() as u64);
    value.push(algorithm.max_cost(Mode::Charge).min(params::EXACT));
    for &n in &numbers {
        value.push(n);
    }
    for word in crate::store::overrides::limit_words(algorithm) {
        value.0.extend_from_slice(&word.to_le_bytes());
    }
    value.0
}

/// Reads a value back: when it ends, and the limit. Anything malformed is a `Protocol` error.
pub(super) fn decode(raw: &[u8]) -> Result<(Micros, Limit), StoreError> {
    let bad = |what: &str| protocol(format!("an override's value is malformed: {what}"));
    if raw.len() < HEADER || raw.len() % 8 != 0 {
        return Err(bad("too short"));
    }
    let double = |i: usize| f64::from_le_bytes(raw[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    let until = double(0);
    if double(1) != VERSION {
        return Err(bad("unknown version"));
    }
    let count = double(2);
    if !(until.is_finite() && until >= 0.0 && (0.0..=16.0).contains(&count)) {
        return Err(bad("header"));
    }
    let words_at = HEADER + 8 * count as usize;
    if raw.len() < words_at {
        return Err(bad("too short"));
    }
    let words: Vec<u64> = raw[words_at..]
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        .collect();
    let limit =
        crate::store::overrides::limit_from_words(&words).ok_or_else(|| bad("unknown limit"))?;
    // A limit that would not pass the checks a set passes is no limit to charge under.
    if limit.check("override").is_err() {
        return Err(bad("unusable limit"));
    }
    Ok((until as Micros, limit))
}

impl Inner {
    /// Sets (`Some`) or removes (`None`) the override of `key` under `rule`.
    pub(super) async fn set_override(
        &self,
        rule: &str,
        key: &[u8],
        limit: Option<(&Limit, Duration)>,
        now: Option<Micros>,
    ) -> Result<(), StoreError> {
        let name = keys::override_name(&self.prefix, rule, key);
        let mut conn = self.conn.clone();
        match limit {
            None => {
                let mut cmd = ::redis::cmd("DEL");
                cmd.arg(&name);
                conn.query::<i64>(&cmd).await.map_err(conn::error)?;
            }
            Some((limit, ttl)) => {
                // The script writes `until` by its clock, in the same step as the key.
                let script = &self.scripts.set_override;
                let mut cmd = Cmd::new();
                cmd.arg("EVALSHA").arg(script.hash()).arg(1).arg(&name);
                let mut packed = Packed(Vec::with_capacity(8 * 3));
                push_now(&mut packed, now);
                packed.push(micros(ttl).clamp(1, params::MAX_SPAN));
                cmd.arg(packed.0.as_slice());
                cmd.arg(encode(limit, rule, key));
                let _: Vec<u8> = conn.eval(script, &cmd).await.map_err(conn::error)?;
            }
        }
        Ok(())
    }

    /// Up to `count` of `rule`'s overrides in force: one `SCAN` step of one node, from `cursor`.
    pub(super) async fn list_overrides(
        &self,
        rule: &str,
        cursor: Option<&Cursor>,
        count: usize,
    ) -> Result<Page<OverrideEntry>, StoreError> {
        let count = count.clamp(1, crate::store::MAX_OVERRIDE_PAGE);
        let mut masters = None;
        let Some(at) = self.walk_from(cursor, &mut masters).await? else {
            return Ok(Page::new(Vec::new(), None));
        };
        let (next, mut listed) = self.scan_step(at.scan, at.slot, "override", rule).await?;
        let total = listed.len();
        let page: Vec<(Vec<u8>, Vec<u8>)> = listed.drain(..).skip(at.skip).take(count).collect();
        let names: Vec<&[u8]> = page.iter().map(|(_, name)| name.as_slice()).collect();
        let (now, values) = self.read_values(&names, at.slot).await?;
        let mut entries = Vec::with_capacity(page.len());
        for ((key, _), value) in page.into_iter().zip(values) {
            let Some(raw) = value else { continue };
            let (until, limit) = decode(&raw)?;
            if until > now {
                entries.push(OverrideEntry {
                    key: KeyValue::new(&key),
                    limit,
                    expires_in: duration(until - now),
                });
            }
        }
        let next = if at.skip + count < total {
            Some(At {
                skip: at.skip + count,
                ..at
            })
        } else {
            self.after_step(at, next, &mut masters).await?
        };
        Ok(Page::new(entries, next.map(At::cursor)))
    }

    /// The override of `key` under `rule` in force now, if any: its value and the time, in one
    /// pipeline on the key's node.
    pub(super) async fn override_now(
        &self,
        rule: &str,
        key: &[u8],
    ) -> Result<Option<OverrideEntry>, StoreError> {
        let name = keys::override_name(&self.prefix, rule, key);
        let slot = self.is_cluster().then(|| keys::slot(&name));
        let (now, mut values) = self.read_values(&[&name], slot).await?;
        let Some(raw) = values.pop().flatten() else {
            return Ok(None);
        };
        let (until, limit) = decode(&raw)?;
        Ok((until > now).then(|| OverrideEntry {
            key: KeyValue::new(key),
            limit,
            expires_in: duration(until - now),
        }))
    }

    /// The time (the injected clock's, or the server's `TIME`) and each of `names`' values, in
    /// one pipeline on the node of `slot`.
    async fn read_values(
        &self,
        names: &[&[u8]],
        slot: Option<u16>,
    ) -> Result<(Micros, Vec<Option<Vec<u8>>>), StoreError> {
        let (now, answers) = self.time_and_values(names, slot).await?;
        let values = answers
            .map(|value| match value {
                Value::BulkString(raw) => Ok(Some(raw)),
                Value::Nil => Ok(None),
                other => Err(protocol(format!("GET of an override answered {other:?}"))),
            })
            .collect::<Result<_, _>>()?;
        Ok((now, values))
    }
}

/// What an override changes in a charge's script numbers when the script did not (an undo of a
/// charge made under it, on a cluster): the candidate's numbers under `limit`.
pub(super) fn numbers_under(
    limit: &Limit,
    own: &params::Args,
    rule: &str,
    key: &[u8],
    cost: u64,
    mode: Mode,
) -> params::Args {
    let mut args = params::Args::new();
    match limit.algorithm() {
        Algorithm::Concurrency(slots) => {
            let (lease, id) = (own.get(2).copied(), own.get(3).copied());
            params::push_slots(&mut args, slots, lease.unwrap_or(0), id.unwrap_or(0));
        }
        algorithm => params::push(&mut args, algorithm, rule, key, cost, mode),
    }
    args
}

fn protocol(message: String) -> StoreError {
    StoreError::new(StoreErrorKind::Protocol, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(limit: Limit) {
        let mut raw = 1_750_000_000_000_000f64.to_le_bytes().to_vec();
        raw.extend(encode(&limit, "r", b"k"));
        let (until, back) = decode(&raw).unwrap();
        assert_eq!(until, 1_750_000_000_000_000);
        assert_eq!(back, limit);
    }

    #[test]
    fn every_limit_reads_back() {
        let minute = Duration::from_secs(60);
        for limit in [
            Limit::per_minute(10),
            Limit::token_bucket(3, Duration::from_millis(1_500))
                .capacity(7)
                .initial(2),
            Limit::fixed_window(100, minute),
            Limit::fixed_window(100, minute).capacity(250).aligned(),
            Limit::fixed_window(5, Duration::from_secs(3_600))
                .aligned_at(Duration::new(1_800, 250_000_000)),
            Limit::calendar_month(10_000, -5 * 3_600),
            Limit::calendar_week(700, 3_600),
            Limit::sliding_window(50, minute),
            Limit::sliding_window(50, minute).aligned(),
            Limit::sliding_log(20, Duration::from_secs(10)),
            Limit::per_second(5).pool(100, 10, minute),
            Limit::concurrent(8),
        ] {
            round_trip(limit);
        }
    }

    #[test]
    fn malformed_values_are_protocol_errors() {
        let mut good = 1.0f64.to_le_bytes().to_vec();
        good.extend(encode(&Limit::per_minute(10), "r", b"k"));
        let mut cases: Vec<Vec<u8>> = vec![
            Vec::new(),
            b"1,2".to_vec(),
            good[..good.len() - 8].to_vec(),
            good[..good.len() - 3].to_vec(),
            good[..40].to_vec(),
        ];
        let mut version = good.clone();
        version[8..16].copy_from_slice(&2f64.to_le_bytes());
        cases.push(version);
        let mut count = good.clone();
        count[16..24].copy_from_slice(&1e9f64.to_le_bytes());
        cases.push(count);
        let mut kind = good.clone();
        let at = good.len() - 40;
        kind[at..at + 8].copy_from_slice(&9u64.to_le_bytes());
        cases.push(kind);
        let mut zero = good.clone();
        zero[at + 8..at + 16].copy_from_slice(&0u64.to_le_bytes());
        cases.push(zero);
        for raw in cases {
            let error = decode(&raw).unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::Protocol, "{raw:?}");
        }
        assert!(decode(&good).is_ok());
    }
}
