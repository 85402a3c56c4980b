//! One charge bound to its key: evaluated, committed or refunded in the shards a batch holds.

use super::locked::Locked;
use super::slots::{change_slot, evaluate_slot, slot_matches, Change, Slot, Timed};
use super::spans::BucketEntry;
use super::table::{table_of, Which};
use crate::algorithm::{Algorithm, Micros, Mode, Outcome, WindowStart};
use crate::store::Charge;

/// One charge bound to its key's hash and the time of the batch.
pub(super) struct Cell<'c, 'a> {
    pub(super) charge: &'c Charge<'a>,
    pub(super) hash: u64,
    pub(super) table: Which,
    now: Micros,
}

impl<'c, 'a> Cell<'c, 'a> {
    pub(super) fn new(charge: &'c Charge<'a>, hash: u64, now: Micros) -> Self {
        Cell {
            charge,
            hash,
            table: table_of(charge.algorithm),
            now,
        }
    }

    fn window_offset(&self, period: Micros, start: WindowStart) -> Micros {
        start.offset(period, &self.charge.rule, self.charge.key)
    }

    /// The state of a key never seen before.
    fn fresh(&self) -> Slot {
        let now = self.now;
        match self.charge.algorithm {
            Algorithm::FixedWindow(a) => {
                Slot::Window(a.fresh(now, self.window_offset(a.period_micros(), a.start())))
            }
            Algorithm::SlidingWindow(a) => {
                Slot::Sliding(a.fresh(now, self.window_offset(a.period_micros(), a.start())))
            }
            Algorithm::BurstPool(a) => Slot::Pool(a.fresh(now)),
            Algorithm::Concurrency(_) => Slot::InFlight(0),
            Algorithm::SlidingLog(_) | Algorithm::TokenBucket(_) => Slot::Log(Box::default()),
        }
    }

    /// The outcome of charging `cost` now, without changing anything.
    pub(super) fn evaluate(&self, locked: &mut Locked<'_>, cost: u64) -> Outcome {
        let (now, mode) = (self.now, self.charge.mode);
        match self.charge.algorithm {
            Algorithm::TokenBucket(tb) => {
                let entry = locked.buckets(self.hash).map.get(&self.hash).copied();
                let empty_at = entry.map_or_else(|| tb.fresh(now), BucketEntry::empty_at);
                tb.evaluate(empty_at, now, cost, mode)
            }
            algorithm => {
                let shard = locked.others(self.hash);
                let stored = shard.map.get(&self.hash).map(|t| &t.state);
                let fresh;
                let slot = match stored {
                    Some(slot) if slot_matches(slot, algorithm) => slot,
                    _ => {
                        fresh = self.fresh();
                        &fresh
                    }
                };
                evaluate_slot(algorithm, slot, now, cost, mode)
            }
        }
    }

    /// [`evaluate`](Self::evaluate), then [`commit`](Self::commit) when admitted and the mode
    /// charges: a charge decided alone (not a bucket's, which has its own path), with one lookup
    /// of a key that exists instead of three (the batch needs the two steps apart).
    pub(super) fn charge_alone(&self, locked: &mut Locked<'_>) -> Outcome {
        let algorithm = self.charge.algorithm;
        let (now, cost, mode) = (self.now, self.charge.cost, self.charge.mode);
        let charges = |outcome: &Outcome| outcome.verdict.is_admitted() && mode != Mode::Check;
        {
            let shard = locked.others(self.hash);
            if let Some(timed) = shard.map.get_mut(&self.hash) {
                if slot_matches(&timed.state, algorithm) {
                    let outcome = evaluate_slot(algorithm, &timed.state, now, cost, mode);
                    if charges(&outcome) {
                        timed.expires =
                            change_slot(algorithm, &mut timed.state, now, Change::Charge(cost));
                    }
                    return outcome;
                }
            }
        }
        let outcome = self.evaluate(locked, cost);
        if charges(&outcome) {
            self.commit(locked);
        }
        outcome
    }

    /// Charges the cost (the batch was admitted).
    pub(super) fn commit(&self, locked: &mut Locked<'_>) {
        let (now, cost) = (self.now, self.charge.cost);
        match self.charge.algorithm {
            Algorithm::TokenBucket(tb) => {
                let shard = locked.buckets(self.hash);
                let code = shard.spans.code(tb.full_span());
                let empty_at = shard
                    .map
                    .get(&self.hash)
                    .map_or_else(|| tb.fresh(now), |entry| entry.empty_at());
                let entry = BucketEntry::new(tb.commit(empty_at, now, cost), code);
                shard.put(self.hash, entry, now);
            }
            algorithm => self.update(locked, |slot| {
                change_slot(algorithm, slot, now, Change::Charge(cost))
            }),
        }
    }

    /// Gives units back.
    pub(super) fn refund(&self, locked: &mut Locked<'_>, units: u64) {
        let now = self.now;
        match self.charge.algorithm {
            Algorithm::TokenBucket(tb) => {
                let shard = locked.buckets(self.hash);
                let code = shard.spans.code(tb.full_span());
                if let Some(entry) = shard.map.get_mut(&self.hash) {
                    *entry = BucketEntry::new(tb.refund(entry.empty_at(), now, units), code);
                }
            }
            algorithm => self.update(locked, |slot| {
                change_slot(algorithm, slot, now, Change::Refund(units))
            }),
        }
    }

    /// Changes the key's non-bucket state in place (creating it fresh if needed); `change` returns
    /// the state's new expiry.
    fn update(&self, locked: &mut Locked<'_>, change: impl FnOnce(&mut Slot) -> Micros) {
        let algorithm = self.charge.algorithm;
        let shard = locked.others(self.hash);
        if !shard.map.contains_key(&self.hash) {
            shard.make_room(self.now);
        }
        let timed = shard.map.entry(self.hash).or_insert_with(|| Timed {
            state: self.fresh(),
            expires: 0,
        });
        if !slot_matches(&timed.state, algorithm) {
            // A rule changed its algorithm under the same name: start over.
            timed.state = self.fresh();
        }
        timed.expires = change(&mut timed.state);
    }
}
