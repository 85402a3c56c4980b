//! Ready-made 429s. In a flood most refusals are alike — the same rules, nothing left, the same
//! whole seconds to wait — so the layer keeps the last few default rejections it wrote and answers
//! a refusal identical to one of them with a copy: no body to write, no field to serialize.
//!
//! Only the layer's own problem+json rejection is kept, and only without the legacy fields (whose
//! reset is a wall-clock moment): everything in it then follows from the [`Fingerprint`].

use std::hash::BuildHasher;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use smallvec::SmallVec;

use super::headers;
use crate::engine::decision::Decision;

/// Distinct refusals kept at once (e.g. several clients refused in the same second).
const SLOTS: usize = 8;

/// The last default rejections, by fingerprint.
pub(crate) struct Prepared {
    slots: [ArcSwapOption<Rejection>; SLOTS],
}

/// Everything a default rejection is made of, besides the rule set's fixed names and policies.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Fingerprint {
    status: StatusCode,
    retry_seconds: u64,
    /// Per rule of the decision: its index, whether it denied, and the `r` and `t` it reports.
    rules: SmallVec<[(usize, bool, u64, u64); 2]>,
}

impl Fingerprint {
    pub(crate) fn of(status: StatusCode, retry_seconds: u64, decision: &Decision) -> Self {
        Fingerprint {
            status,
            retry_seconds,
            rules: decision
                .rules()
                .iter()
                .map(|entry| {
                    let (r, t) = headers::reported(&entry.outcome);
                    (entry.index, !entry.outcome.is_allowed(), r, t)
                })
                .collect(),
        }
    }
}

struct Rejection {
    fingerprint: Fingerprint,
    headers: HeaderMap,
    body: Bytes,
}

impl Prepared {
    pub(crate) fn new() -> Self {
        Prepared {
            slots: Default::default(),
        }
    }

    /// The rejection for `fingerprint`: a copy of the one kept, or a new one from `build`, which
    /// is then kept in its place.
    pub(crate) fn get_or_build(
        &self,
        fingerprint: Fingerprint,
        build: impl FnOnce() -> Response<Bytes>,
    ) -> Response<Bytes> {
        let hash = foldhash::fast::FixedState::default().hash_one(&fingerprint);
        let slot = &self.slots[hash as usize % SLOTS];
        if let Some(kept) = &*slot.load() {
            if kept.fingerprint == fingerprint {
                let mut response = Response::new(kept.body.clone());
                *response.status_mut() = fingerprint.status;
                *response.headers_mut() = kept.headers.clone();
                return response;
            }
        }
        let response = build();
        slot.store(Some(Arc::new(Rejection {
            fingerprint,
            headers: response.headers().clone(),
            body: response.body().clone(),
        })));
        response
    }
}
