//! The blocks of a rule, listed a page at a time.
//!
//! A listing walks the blocks table shard by shard, and each shard in the order of its keys'
//! hashes: a cursor is a shard and the last hash listed in it (`m<shard>` or
//! `m<shard>.<hash in hex>`). That order does not change while the walk goes on, so a key blocked
//! during the whole walk is listed exactly once, whatever is added or removed meanwhile. A page
//! holds at most [`PAGE`] keys and stops after the shard in which it has looked at [`LOOK`]
//! entries, so a call holds one shard's lock at a time, for one pass over that shard.

use std::time::Duration;

use super::{BlockEntry, MemoryStore, RuleName};
use crate::algorithm::{duration, Micros};
use crate::store::{BlockedKey, Cursor, Page, StoreError, StoreErrorKind};

/// The most keys a page lists.
pub(super) const PAGE: usize = 100;
/// A page looks at no further shard once it has looked at this many entries.
const LOOK: usize = 4096;

/// Where a walk is: the shard, and the last hash listed in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct At {
    shard: usize,
    after: Option<u64>,
}

impl At {
    fn cursor(self) -> Cursor {
        match self.after {
            Some(hash) => Cursor::new(format!("m{}.{hash:x}", self.shard)),
            None => Cursor::new(format!("m{}", self.shard)),
        }
    }

    fn read(cursor: &Cursor, shards: usize) -> Result<At, StoreError> {
        let bad = || {
            StoreError::new(
                StoreErrorKind::BadCursor,
                format!("{cursor:?} is not a cursor of this memory store's listings"),
            )
        };
        let text = cursor.as_str().strip_prefix('m').ok_or_else(bad)?;
        let (shard, after) = match text.split_once('.') {
            Some((shard, hash)) => (
                shard,
                Some(u64::from_str_radix(hash, 16).map_err(|_| bad())?),
            ),
            None => (text, None),
        };
        let shard: usize = shard.parse().map_err(|_| bad())?;
        if shard >= shards {
            return Err(bad());
        }
        Ok(At { shard, after })
    }
}

impl MemoryStore {
    /// One page of the keys blocked now under `rule`; see [`Store::blocks`](crate::store::Store::blocks).
    pub(super) fn list_blocks(
        &self,
        rule: &str,
        cursor: Option<&Cursor>,
    ) -> Result<Page<BlockedKey>, StoreError> {
        let shards = self.inner.blocks.shards.len();
        let mut at = match cursor {
            Some(cursor) => At::read(cursor, shards)?,
            None => At {
                shard: 0,
                after: None,
            },
        };
        let digest = RuleName::new(rule).digest();
        let now = self.now();
        let mut items = Vec::new();
        let mut looked = 0;
        while at.shard < shards && items.len() < PAGE && looked < LOOK {
            let shard = self.inner.blocks.lock(at.shard);
            looked += shard.map.len();
            let mut found: Vec<(u64, &BlockEntry)> = shard
                .map
                .iter()
                .filter(|(&hash, entry)| {
                    entry.rule == digest
                        && entry.block.until > now
                        && at.after.is_none_or(|after| hash > after)
                })
                .map(|(&hash, entry)| (hash, entry))
                .collect();
            let room = PAGE - items.len();
            let full = found.len() > room;
            if full {
                found.select_nth_unstable_by_key(room, |&(hash, _)| hash);
                found.truncate(room);
            }
            found.sort_unstable_by_key(|&(hash, _)| hash);
            items.extend(found.iter().map(|(_, entry)| listed(entry, now)));
            at = match (full, found.last()) {
                (true, Some(&(hash, _))) => At {
                    shard: at.shard,
                    after: Some(hash),
                },
                _ => At {
                    shard: at.shard + 1,
                    after: None,
                },
            };
        }
        let next = (at.shard < shards).then(|| at.cursor());
        Ok(Page::new(items, next))
    }

    /// The block of `key` under `rule`, if it is blocked now.
    pub(super) fn block_now(&self, rule: &str, key: &[u8]) -> Option<BlockedKey> {
        let hash = self.hash(RuleName::new(rule), key);
        let now = self.now();
        let shard = self.inner.blocks.shard(hash);
        let entry = shard.map.get(&hash)?;
        (entry.block.until > now).then(|| listed(entry, now))
    }
}

fn listed(entry: &BlockEntry, now: Micros) -> BlockedKey {
    let remaining: Duration = duration(entry.block.until.saturating_sub(now));
    BlockedKey::new(entry.key.to_vec(), remaining, entry.block.offences)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_read_back_and_foreign_ones_are_refused() {
        for at in [
            At {
                shard: 3,
                after: None,
            },
            At {
                shard: 0,
                after: Some(u64::MAX),
            },
        ] {
            assert_eq!(At::read(&at.cursor(), 4).unwrap(), at);
        }
        for text in ["", "m", "m4", "mx", "m1.", "m1.zz", "r:0", "m-1"] {
            let error = At::read(&Cursor::new(text), 4).unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::BadCursor, "{text}");
        }
    }
}
