//! A script's reply read: per item, its outcome and what its charge took; then, for the items of
//! overridable rules, the override each was decided under.

use smallvec::SmallVec;

use super::overrides;
use super::record::{Item, Taken};
use crate::algorithm::{duration, Limit, Outcome, Verdict};
use crate::store::{StoreError, StoreErrorKind};

/// Per record (or item) of a call: the override it was decided under, if any.
pub(super) type Applied = SmallVec<[Option<Limit>; 2]>;

/// Reads the script's reply: twelve integers per item, then the time the script used, as
/// little-endian doubles; then, `deciding` items of overridable rules, the overrides' part.
pub(super) fn decode(
    reply: &[u8],
    items: &[Item<'_>],
    deciding: bool,
) -> Result<(Vec<(Outcome, Taken)>, Applied), StoreError> {
    let fixed = 8 * (12 * items.len() + 1);
    let (reply, applied) = if deciding && items.iter().any(|i| i.record.overrides.is_some()) {
        let (head, tail) = reply.split_at(fixed.min(reply.len()));
        (head, read_applied(tail, items)?)
    } else {
        (reply, items.iter().map(|_| None).collect())
    };
    if reply.len() != fixed {
        return Err(protocol(format!(
            "the script answered {} bytes for {} charges",
            reply.len(),
            items.len()
        )));
    }
    let reply: SmallVec<[f64; 8]> = reply
        .chunks_exact(8)
        .map(|bytes| f64::from_le_bytes(bytes.try_into().expect("8 bytes")))
        .collect();
    let number = |value: f64| {
        // The script's numbers are integers below 2^53, where the conversion is exact.
        if value.is_finite() && value >= 0.0 {
            Ok(value as u64)
        } else {
            Err(protocol(format!(
                "a value in the script's reply is not a count: {reply:?}"
            )))
        }
    };
    let signed = |value: f64| {
        if value.is_finite() && value.abs() < 9.0e15 {
            Ok(value as i64)
        } else {
            Err(protocol(format!(
                "a value in the script's reply is not a balance: {reply:?}"
            )))
        }
    };
    let at = number(reply[reply.len() - 1])?;
    items
        .iter()
        .zip(reply.chunks_exact(12))
        .map(|(item, values)| {
            let wait = duration(number(values[1])?);
            let verdict = match number(values[0])? {
                0 => Verdict::Allowed,
                1 => Verdict::Reserved { wait },
                2 | 3 => Verdict::Denied { retry_after: wait },
                other => return Err(protocol(format!("unknown verdict {other}"))),
            };
            let candidates = item.candidates();
            let index = usize::try_from(number(values[5])?)
                .ok()
                .filter(|&i| i < candidates.len())
                .ok_or_else(|| protocol(format!("unknown candidate {}", values[5])))?;
            let mut outcome = Outcome {
                verdict,
                limit: number(values[2])?,
                remaining: number(values[3])?,
                balance: signed(values[7])?,
                next_unit_in: duration(number(values[4])?),
                full_in: duration(number(values[8])?),
                offence: values[0] == 3.0,
                overridden: None,
            };
            if let Some(sharding) = &item.record.sharding {
                sharding.saw(candidates[index].shard, outcome.remaining);
                outcome.limit = item.record.limit;
            }
            let taken = Taken {
                chosen: item.only.unwrap_or(index),
                steady: number(values[6])?,
                at,
                missing: number(values[9])? == 1,
                found: [signed(values[10])?, signed(values[11])?],
            };
            Ok((outcome, taken))
        })
        .collect::<Result<_, _>>()
        .map(|results| (results, applied))
}

/// The overrides' part of a reply: per overridable item, the length of the value applied (0:
/// none) as a double, then the value.
fn read_applied(mut tail: &[u8], items: &[Item<'_>]) -> Result<Applied, StoreError> {
    let mut applied = Applied::with_capacity(items.len());
    for item in items {
        if item.record.overrides.is_none() {
            applied.push(None);
            continue;
        }
        let (length, rest) = tail
            .split_first_chunk::<8>()
            .ok_or_else(|| protocol("the script's reply ends before its overrides".to_owned()))?;
        let length = f64::from_le_bytes(*length);
        if !(length >= 0.0 && length <= rest.len() as f64) || length.fract() != 0.0 {
            return Err(protocol(format!(
                "the script answered an override of {length} bytes"
            )));
        }
        let (value, rest) = rest.split_at(length as usize);
        applied.push(match value {
            [] => None,
            value => Some(overrides::decode(value)?.1),
        });
        tail = rest;
    }
    if !tail.is_empty() {
        return Err(protocol(format!(
            "the script answered {} bytes after its overrides",
            tail.len()
        )));
    }
    Ok(applied)
}

fn protocol(message: String) -> StoreError {
    StoreError::new(StoreErrorKind::Protocol, message)
}
