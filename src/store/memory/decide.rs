//! Deciding in the memory store: a batch locks the shards of all its keys in one order, decides
//! every rule, and commits all or nothing; a batch of one charge (the usual request) takes a
//! shorter path, and a token bucket's charge the shortest.

use smallvec::SmallVec;

use super::cell::Cell;
use super::locked::Locked;
use super::spans::BucketEntry;
use super::table::{table_of, Which};
use super::MemoryStore;
use crate::algorithm::{Algorithm, Block, Micros, Mode, Outcome, Penalty, TokenBucket, Verdict};
use crate::store::{Charge, Outcomes};

impl MemoryStore {
    /// Decides a batch against the current time; see [`Store::apply`].
    pub(super) fn apply_now(&self, batch: &[Charge<'_>]) -> Outcomes {
        match batch {
            [charge] => Outcomes::from(self.decide_one(charge)),
            _ if batch.iter().any(|c| c.read_overrides) => self.overridden(batch),
            _ => self.apply_batch(batch),
        }
    }

    /// A charge with a penalty or whose rule has overrides.
    #[cold]
    fn special_one(&self, charge: &Charge<'_>) -> Outcome {
        if charge.read_overrides {
            let outcomes = self.overridden(std::slice::from_ref(charge));
            return outcomes.into_iter().next().expect("one outcome per charge");
        }
        penalised_one(self, charge)
    }

    /// Any batch: lock every shard involved in order, decide all, commit all or nothing.
    pub(super) fn apply_batch(&self, batch: &[Charge<'_>]) -> Outcomes {
        let now = self.now();
        let cells: SmallVec<[Cell<'_, '_>; 2]> = batch
            .iter()
            .map(|charge| Cell::new(charge, self.hash(charge.rule, charge.key), now))
            .collect();
        let blocks = cells
            .iter()
            .filter(|c| c.charge.penalty.is_some())
            .map(|c| (Which::Blocks, c.hash));
        let mut locked = Locked::lock(
            &self.inner,
            cells.iter().map(|c| (c.table, c.hash)).chain(blocks),
        );
        // A blocked key is denied without looking at its counters.
        let blocked: SmallVec<[Option<Block>; 2]> = cells
            .iter()
            .map(|c| {
                c.charge.penalty?;
                let block = locked.blocks(c.hash).map.get(&c.hash)?.block;
                Some(block)
            })
            .collect();
        let mut outcomes: Outcomes = cells
            .iter()
            .zip(&blocked)
            .map(|(c, block)| match block {
                Some(block) if block.until > now => {
                    Penalty::blocked(block.until, now, c.charge.algorithm.capacity())
                }
                _ => c.evaluate(&mut locked, c.charge.cost),
            })
            .collect();
        if outcomes.iter().all(|o| o.verdict.is_admitted()) {
            for cell in cells.iter().filter(|c| c.charge.mode != Mode::Check) {
                cell.commit(&mut locked);
            }
        } else {
            // All or nothing: report what the admitted rules have left, uncharged.
            for ((cell, outcome), block) in cells.iter().zip(outcomes.iter_mut()).zip(&blocked) {
                if outcome.verdict.is_admitted() {
                    let peek = cell.evaluate(&mut locked, 0);
                    *outcome = Outcome {
                        verdict: Verdict::Allowed,
                        ..peek
                    };
                } else if let Some(penalty) = cell.charge.penalty {
                    if offends(cell.charge) && block.is_none_or(|b| b.until <= now) {
                        let block = penalty.offend(*block, now);
                        let expires = penalty.forgotten_at(&block);
                        let (rule, key) = (cell.charge.rule, cell.charge.key);
                        locked
                            .blocks(cell.hash)
                            .set_block(cell.hash, rule, key, block, expires, now);
                        *outcome = Penalty::punish(outcome.clone(), block.until, now);
                    }
                }
            }
        }
        outcomes
    }

    /// [`apply_batch`](Self::apply_batch) for a batch of one charge, the usual case: the same
    /// decision, without collecting cells, sorting shards or searching the held guards.
    #[inline]
    pub(super) fn decide_one(&self, charge: &Charge<'_>) -> Outcome {
        if charge.penalty.is_some() || charge.read_overrides {
            return self.special_one(charge);
        }
        let now = self.now();
        let hash = self.hash(charge.rule, charge.key);
        if let Algorithm::TokenBucket(tb) = charge.algorithm {
            return self.apply_bucket(tb, charge, hash, now);
        }
        let cell = Cell::new(charge, hash, now);
        let mut locked = Locked::one(&self.inner, cell.table, cell.hash);
        // A denied charge changes nothing; an admitted one is committed unless it only looks.
        let outcome = cell.charge_alone(&mut locked);
        drop(locked);
        outcome
    }

    /// Gives `charge.cost` units back to the key (see
    /// [`Store::refund`](crate::store::Store::refund)).
    pub(super) fn refund_now(&self, charge: &Charge<'_>) {
        let now = self.now();
        let hash = self.hash(charge.rule, charge.key);
        let mut locked = Locked::lock(&self.inner, [(table_of(charge.algorithm), hash)]);
        let cell = Cell::new(charge, hash, now);
        cell.refund(&mut locked, charge.cost);
    }

    /// One token-bucket charge: what `Cell::evaluate` and `Cell::commit` do, with one lookup of the
    /// key instead of three. Only the verdict is decided while the shard is held; the outcome
    /// (units left, waits) is a pure function of the state seen and is built after the shard is
    /// released, so threads on one hot shard wait for each other as briefly as possible.
    #[inline]
    fn apply_bucket(
        &self,
        tb: &TokenBucket,
        charge: &Charge<'_>,
        hash: u64,
        now: Micros,
    ) -> Outcome {
        let (cost, mode) = (charge.cost, charge.mode);
        let charges = |empty_at: i64| mode != Mode::Check && tb.admits(empty_at, now, cost, mode);
        // Outside the lock: the code of the span a written entry records.
        let code = self.inner.spans.code(tb.full_span());
        let seen = {
            let mut shard = self.inner.buckets.shard(hash);
            match shard.map.get_mut(&hash) {
                Some(entry) => {
                    let seen = entry.empty_at();
                    if charges(seen) {
                        *entry = BucketEntry::new(tb.commit(seen, now, cost), code);
                    }
                    seen
                }
                None => {
                    let seen = tb.fresh(now);
                    if charges(seen) {
                        let entry = BucketEntry::new(tb.commit(seen, now, cost), code);
                        shard.put(hash, entry, now);
                    }
                    seen
                }
            }
        };
        tb.evaluate(seen, now, cost, mode)
    }
}

/// A charge under a rule with a penalty: the batch path, which also holds the key's block.
#[cold]
fn penalised_one(store: &MemoryStore, charge: &Charge<'_>) -> Outcome {
    store
        .apply_batch(std::slice::from_ref(charge))
        .pop()
        .unwrap_or_else(|| Outcome::unreachable(charge.algorithm))
}

/// Whether a denial of this charge is an offence: a real charge, not a look.
fn offends(charge: &Charge<'_>) -> bool {
    charge.mode != Mode::Check && charge.cost > 0
}
