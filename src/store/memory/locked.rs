//! The shards one batch holds, locked in one global order so that batches never deadlock.

use smallvec::SmallVec;
use spinning_top::guard::SpinlockGuard;

use super::blocks::BlockEntry;
use super::slots::Timed;
use super::spans::BucketEntry;
use super::table::{shard_index, ShardMap, Which};
use super::Inner;

/// The shards one batch holds, locked in (table, shard index) order.
pub(super) struct Locked<'s> {
    mask: usize,
    buckets: SmallVec<[(usize, SpinlockGuard<'s, ShardMap<BucketEntry>>); 2]>,
    others: SmallVec<[(usize, SpinlockGuard<'s, ShardMap<Timed>>); 2]>,
    blocks: SmallVec<[(usize, SpinlockGuard<'s, ShardMap<BlockEntry>>); 1]>,
}

impl<'s> Locked<'s> {
    pub(super) fn lock(inner: &'s Inner, keys: impl IntoIterator<Item = (Which, u64)>) -> Self {
        let mask = inner.buckets.mask;
        let mut order: SmallVec<[(Which, usize); 4]> = keys
            .into_iter()
            .map(|(which, hash)| (which, shard_index(hash, mask)))
            .collect();
        order.sort_unstable();
        order.dedup();
        let mut locked = Locked {
            mask,
            buckets: SmallVec::new(),
            others: SmallVec::new(),
            blocks: SmallVec::new(),
        };
        for (which, index) in order {
            locked.hold(inner, which, index);
        }
        locked
    }

    /// Holds the one shard of a single key.
    pub(super) fn one(inner: &'s Inner, which: Which, hash: u64) -> Self {
        let mask = inner.buckets.mask;
        let index = shard_index(hash, mask);
        let mut locked = Locked {
            mask,
            buckets: SmallVec::new(),
            others: SmallVec::new(),
            blocks: SmallVec::new(),
        };
        locked.hold(inner, which, index);
        locked
    }

    fn hold(&mut self, inner: &'s Inner, which: Which, index: usize) {
        match which {
            Which::Buckets => self.buckets.push((index, inner.buckets.lock(index))),
            Which::Others => self.others.push((index, inner.others.lock(index))),
            Which::Blocks => self.blocks.push((index, inner.blocks.lock(index))),
        }
    }

    pub(super) fn blocks(&mut self, hash: u64) -> &mut ShardMap<BlockEntry> {
        let index = shard_index(hash, self.mask);
        find(&mut self.blocks, index)
    }

    pub(super) fn buckets(&mut self, hash: u64) -> &mut ShardMap<BucketEntry> {
        let index = shard_index(hash, self.mask);
        find(&mut self.buckets, index)
    }

    pub(super) fn others(&mut self, hash: u64) -> &mut ShardMap<Timed> {
        let index = shard_index(hash, self.mask);
        find(&mut self.others, index)
    }
}

fn find<'a, 's, S>(
    guards: &'a mut [(usize, SpinlockGuard<'s, ShardMap<S>>)],
    index: usize,
) -> &'a mut ShardMap<S> {
    // Every cell's shard was locked in `Locked::lock`.
    let position = guards.iter().position(|(i, _)| *i == index).unwrap_or(0);
    &mut guards[position].1
}
