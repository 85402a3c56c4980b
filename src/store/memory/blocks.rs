//! The blocks of rules with a penalty in the memory store: a third table beside the counters,
//! whose entries keep their key's bytes so that a rule's blocks can be listed (`listing`).

use std::time::Duration;

use super::spans::Spans;
use super::table::{Expiring, ShardMap};
use super::MemoryStore;
use crate::algorithm::{micros, Block, Micros, Penalty};
use crate::key::KeyValue;
#[cfg(doc)]
use crate::key::MAX_KEY_LEN;
use crate::store::RuleName;

/// A key's block, with the moment it is forgotten, and whose it is: the rule's digest and the
/// key's bytes (at most [`MAX_KEY_LEN`]), so that the blocks of a rule can be listed.
pub(super) struct BlockEntry {
    pub(super) block: Block,
    pub(super) expires: Micros,
    pub(super) rule: u64,
    pub(super) key: Box<[u8]>,
}

impl ShardMap<BlockEntry> {
    /// Stores the block of `(rule, key)`, whose hash is `hash`; the key's bytes are copied only
    /// when it had no entry.
    pub(super) fn set_block(
        &mut self,
        hash: u64,
        rule: RuleName<'_>,
        key: &[u8],
        block: Block,
        expires: Micros,
        now: Micros,
    ) {
        if let Some(entry) = self.map.get_mut(&hash) {
            (entry.block, entry.expires) = (block, expires);
            return;
        }
        let entry = BlockEntry {
            block,
            expires,
            rule: rule.digest(),
            key: KeyValue::new(key).as_bytes().into(),
        };
        self.put(hash, entry, now);
    }
}

impl Expiring for BlockEntry {
    fn expires(&self, _: &Spans) -> Micros {
        self.expires
    }
}

impl MemoryStore {
    /// Blocks `key` under `rule` for `block` from now, or lifts its block (see
    /// [`Store::set_block`](crate::store::Store::set_block)).
    pub(super) fn set_block_now(
        &self,
        rule: &str,
        penalty: &Penalty,
        key: &[u8],
        block: Option<Duration>,
    ) {
        let hash = self.hash(RuleName::new(rule), key);
        let mut shard = self.inner.blocks.shard(hash);
        match block {
            None => {
                shard.map.remove(&hash);
            }
            Some(d) => {
                let now = self.now();
                let offences = shard.map.get(&hash).map_or(0, |b| b.block.offences);
                let block = Block {
                    until: now.saturating_add(micros(d)),
                    offences,
                };
                let expires = penalty.forgotten_at(&block);
                shard.set_block(hash, RuleName::new(rule), key, block, expires, now);
            }
        }
    }
}
