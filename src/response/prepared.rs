//! Ready-made 429s. In a flood most refusals are alike — the same rules, nothing left, the same
//! whole seconds to wait — so the layer keeps the last few default rejections it wrote and answers
//! a refusal identical to one of them with a copy: no body to write, no field to serialize.
//!
//! Only the layer's own problem+json rejection is kept, and only without the legacy fields (whose
//! reset is a wall-clock moment): everything in it then follows from the [`Fingerprint`].

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::{Response, StatusCode};
use smallvec::SmallVec;

use super::headers;
use crate::engine::decision::Decision;

/// Distinct refusals kept at once (e.g. several clients refused in the same second); a power
/// of two.
const SLOTS: usize = 8;

/// The last default rejections, by fingerprint.
pub(crate) struct Prepared {
    slots: [ArcSwapOption<Rejection>; SLOTS],
}

/// Everything a default rejection is made of, besides the rule set's fixed names and policies.
struct Fingerprint {
    status: StatusCode,
    retry_seconds: u64,
    rules: SmallVec<[RuleMark; 2]>,
}

/// A rule's part of a fingerprint: its index, whether it denied, and the `r` and `t` it reports.
type RuleMark = (usize, bool, u64, u64);

fn marks(decision: &Decision) -> impl Iterator<Item = RuleMark> + '_ {
    decision.rules().iter().map(|entry| {
        let (r, t) = headers::reported(&entry.outcome);
        (entry.index, !entry.outcome.is_allowed(), r, t)
    })
}

impl Fingerprint {
    /// The fingerprint of a refusal with `status`, `retry_seconds` and `decision`'s rules.
    fn of(status: StatusCode, retry_seconds: u64, decision: &Decision) -> Self {
        Fingerprint {
            status,
            retry_seconds,
            rules: marks(decision).collect(),
        }
    }

    /// Whether this is the fingerprint of such a refusal, read off the decision without
    /// collecting it: the lookup of every refusal, most of which find their copy.
    fn matches(&self, status: StatusCode, retry_seconds: u64, decision: &Decision) -> bool {
        self.status == status
            && self.retry_seconds == retry_seconds
            && self.rules.len() == decision.rules().len()
            && self.rules.iter().copied().eq(marks(decision))
    }
}

/// The slot of a refusal: a few multiplications over what varies between refusals in a flood
/// (the wait, and which rules denied), not a hash of the whole fingerprint. Two fingerprints
/// sharing a slot only take turns in it; a copy is answered only on an exact match.
fn slot_of(retry_seconds: u64, decision: &Decision) -> usize {
    const MIX: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut mixed = retry_seconds.wrapping_mul(MIX);
    for entry in decision.rules() {
        let denied = u64::from(!entry.outcome.is_allowed());
        mixed = (mixed ^ ((entry.index as u64) << 1 | denied)).wrapping_mul(MIX);
    }
    // The top bits, the best mixed: as many as index the slots.
    (mixed >> (u64::BITS - SLOTS.trailing_zeros())) as usize
}

struct Rejection {
    fingerprint: Fingerprint,
    response: Response<Bytes>,
}

impl Prepared {
    pub(crate) fn new() -> Self {
        Prepared {
            slots: Default::default(),
        }
    }

    /// The rejection with `status`, `retry_seconds` and `decision`'s rules: a copy of the one
    /// kept, or a new one from `build`, which is then kept in its place.
    pub(crate) fn get_or_build(
        &self,
        status: StatusCode,
        retry_seconds: u64,
        decision: &Decision,
        build: impl FnOnce() -> Response<Bytes>,
    ) -> Response<Bytes> {
        let slot = &self.slots[slot_of(retry_seconds, decision)];
        if let Some(kept) = &*slot.load() {
            if kept.fingerprint.matches(status, retry_seconds, decision) {
                return kept.response.clone();
            }
        }
        let response = build();
        slot.store(Some(Arc::new(Rejection {
            fingerprint: Fingerprint::of(status, retry_seconds, decision),
            response: response.clone(),
        })));
        response
    }
}
