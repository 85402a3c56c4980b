//! A charge as the scripts see it: its record (candidate keys, numbers, block and override
//! keys), an item of one script call, what a charge took (for an undo), and the operations.

use std::sync::Arc;

use smallvec::SmallVec;

use super::lua::{Lua, Scripts};
use super::shard::{self, Sharding};
use super::{keys, leases, overrides, params, Inner};
use crate::algorithm::{micros, Algorithm, Limit, Micros, Mode};
use crate::store::Charge;

/// One charge as the script sees it: its candidate keys (two for a sharded rule's choice).
pub(super) struct Record {
    pub(super) mode: Mode,
    pub(super) cost: u64,
    pub(super) limit: u64,
    pub(super) candidates: SmallVec<[Candidate; 2]>,
    pub(super) sharding: Option<Arc<Sharding>>,
    /// A rule with a penalty: its block's key, and the script's numbers (see `params`).
    pub(super) penalty: Option<(Vec<u8>, params::Args)>,
    /// A rule with overrides: its override's key (read when deciding), and what an undo needs
    /// to take back a charge made under the override.
    pub(super) overrides: Option<Overridable>,
}

/// A charge of a rule with overrides, as its record keeps it.
pub(super) struct Overridable {
    pub(super) name: Vec<u8>,
    pub(super) rule: Box<str>,
    pub(super) key: Box<[u8]>,
}

impl Record {
    /// This record with its candidates' numbers under `limit`, the override its charge was
    /// decided under: what an undo of that charge takes back.
    pub(super) fn under(&self, limit: &Limit) -> Record {
        let (rule, key) = match &self.overrides {
            Some(o) => (&*o.rule, &*o.key),
            None => ("", &[][..]),
        };
        Record {
            mode: self.mode,
            cost: self.cost,
            limit: limit.algorithm().capacity(),
            candidates: self
                .candidates
                .iter()
                .map(|c| Candidate {
                    name: c.name.clone(),
                    slot: c.slot,
                    shard: c.shard,
                    args: overrides::numbers_under(limit, &c.args, rule, key, self.cost, self.mode),
                    lease: c.lease,
                })
                .collect(),
            sharding: self.sharding.clone(),
            penalty: None,
            overrides: None,
        }
    }
}

pub(super) struct Candidate {
    pub(super) name: Vec<u8>,
    pub(super) slot: u16,
    pub(super) shard: u32,
    pub(super) args: params::Args,
    /// The concurrency lease this charge adds, if admitted.
    pub(super) lease: Option<u64>,
}

/// A record in one script call, with the mode and cost that call uses; `only` restricts it to
/// one candidate (the shard an earlier call chose); `undo` is what an undo needs to know.
#[derive(Clone, Copy)]
pub(super) struct Item<'r> {
    pub(super) record: &'r Record,
    pub(super) mode: Mode,
    pub(super) cost: u64,
    pub(super) only: Option<usize>,
    pub(super) undo: Taken,
}

/// What one record's charge took: the candidate it chose, what a burst pool took from its steady
/// bucket, when, whether the key held no state (for a charge: before it, so that an undo of a
/// charge that created the key removes it again while any other undo keeps the key; for a check
/// or an undo: after it), and the state a token bucket's, burst pool's or fixed window's charge
/// found, which an undo restores when nothing changed the key since (a charge from full forgets
/// how long the bucket had been full, and a window's charge pays a debt back at the limit it
/// brought: a limit chosen per request would read either differently).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Taken {
    pub(super) chosen: usize,
    pub(super) steady: u64,
    pub(super) at: Micros,
    pub(super) missing: bool,
    pub(super) found: [i64; 2],
}

/// Per outcome of a batch: whether its key holds no state (see [`Inner::decide`]).
pub(super) type Missing = SmallVec<[bool; 2]>;

impl<'r> Item<'r> {
    pub(super) fn apply(record: &'r Record) -> Self {
        Item {
            record,
            mode: record.mode,
            cost: record.cost,
            only: None,
            undo: Taken::default(),
        }
    }

    pub(super) fn candidates(&self) -> &'r [Candidate] {
        match self.only {
            Some(i) => std::slice::from_ref(&self.record.candidates[i]),
            None => &self.record.candidates,
        }
    }
}

#[derive(Clone, Copy)]
pub(super) enum Op {
    /// Decide and charge, all or nothing.
    Apply,
    /// Decide without charging; admitted records report what they have left.
    Check,
    /// Give units back.
    Refund,
    /// Take back an earlier charge exactly.
    Undo,
}

impl Op {
    /// Whether the operation decides (and so reads blocks and overrides).
    pub(super) fn decides(self) -> bool {
        matches!(self, Op::Apply | Op::Check)
    }

    /// The script that runs the operation.
    pub(super) fn script(self, scripts: &Scripts) -> &Lua {
        match self {
            Op::Apply => &scripts.charge,
            Op::Check => &scripts.check,
            Op::Refund => &scripts.refund,
            Op::Undo => &scripts.undo,
        }
    }
}

impl Inner {
    pub(super) fn candidate(
        &self,
        charge: &Charge<'_>,
        algorithm: &Algorithm,
        shard: Option<u32>,
    ) -> Candidate {
        let name = keys::key_name(&self.prefix, &charge.rule, charge.key, shard);
        let mut args = params::Args::new();
        let mut lease = None;
        match algorithm {
            // A slot taken is a lease (a check takes none).
            Algorithm::Concurrency(slots) if charge.mode != Mode::Check && charge.cost > 0 => {
                let id = leases::new_id();
                params::push_slots(&mut args, slots, micros(self.lease), id);
                lease = Some(id);
            }
            _ => params::push(
                &mut args,
                algorithm,
                &charge.rule,
                charge.key,
                charge.cost,
                charge.mode,
            ),
        }
        Candidate {
            lease,
            slot: if self.is_cluster() {
                keys::slot(&name)
            } else {
                0
            },
            name,
            shard: shard.unwrap_or(0),
            args,
        }
    }

    /// The record of a charge; for a sharded rule, its candidate shards.
    pub(super) fn record(&self, charge: &Charge<'_>, refund: bool) -> Record {
        let sharding = self.shards.get(charge.rule.as_str()).cloned();
        let candidates = match &sharding {
            None => SmallVec::from_iter([self.candidate(charge, charge.algorithm, None)]),
            Some(sharding) => {
                let (a, b) = sharding.two();
                let make = |i: u32| {
                    let part = shard::split(charge.algorithm, sharding.n, i);
                    self.candidate(charge, &part, Some(i))
                };
                let (first, second) = (make(a), make(b));
                if first.slot == second.slot {
                    SmallVec::from_iter([first, second])
                } else if refund || sharding.likelier((a, b)) == a {
                    // Different nodes: one script cannot read both, so choose by what this
                    // instance last saw (refunds go to the first at random).
                    SmallVec::from_iter([first])
                } else {
                    SmallVec::from_iter([second])
                }
            }
        };
        Record {
            mode: charge.mode,
            cost: charge.cost,
            limit: charge.algorithm.capacity(),
            candidates,
            sharding,
            penalty: charge.penalty.map(|penalty| {
                (
                    keys::block_name(&self.prefix, &charge.rule, charge.key),
                    params::penalty(penalty),
                )
            }),
            overrides: charge.read_overrides.then(|| Overridable {
                name: keys::override_name(&self.prefix, &charge.rule, charge.key),
                rule: charge.rule.as_str().into(),
                key: charge.key.into(),
            }),
        }
    }
}
