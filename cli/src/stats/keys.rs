//! One rule's counts per key, in a table whose slot holds the key's full hash, its counts and
//! the key itself when it is short (an IPv4 address, an IPv6 prefix): a lookup then reads one
//! slot, and compares bytes only when the hashes agree. Longer keys are kept one after the other
//! in one buffer, not in an allocation each.

use std::fmt;
use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::KeyTally;

/// The keys a rule counted, each with its [`KeyTally`].
pub struct Keys<S = foldhash::fast::RandomState> {
    table: HashTable<Slot>,
    /// The bytes of every key too long for its slot, one after the other.
    bytes: Vec<u8>,
    hasher: S,
}

/// One key: its hash, its counts, and its bytes or where they are (48 bytes).
struct Slot {
    hash: u64,
    tally: KeyTally,
    key: [u8; INLINE + 1],
}

/// The longest key kept in its slot; the slot's last byte is its length, or [`LONG`] for a
/// key in the buffer, whose start and length the slot's first 16 bytes then hold.
const INLINE: usize = 23;
const LONG: u8 = u8::MAX;

impl<S: Default> Default for Keys<S> {
    fn default() -> Self {
        Keys {
            table: HashTable::new(),
            bytes: Vec::new(),
            hasher: S::default(),
        }
    }
}

impl<S: BuildHasher> Keys<S> {
    /// How many keys.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// The counts of `key`, if it was counted.
    pub fn get(&self, key: &[u8]) -> Option<&KeyTally> {
        let hash = self.hasher.hash_one(key);
        let bytes = &self.bytes;
        self.table
            .find(hash, |slot| slot.hash == hash && slot.key(bytes) == key)
            .map(|slot| &slot.tally)
    }

    /// The counts of `key`, empty ones added if it has none yet.
    pub fn entry(&mut self, key: &[u8]) -> &mut KeyTally {
        let hash = self.hasher.hash_one(key);
        let bytes = &mut self.bytes;
        let entry = self.table.entry(
            hash,
            |slot| slot.hash == hash && slot.key(bytes) == key,
            |slot| slot.hash,
        );
        let slot = entry.or_insert_with(|| Slot::new(hash, key, bytes));
        &mut slot.into_mut().tally
    }
}

impl<S> Keys<S> {
    /// Every key and its counts, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &KeyTally)> {
        self.table
            .iter()
            .map(|slot| (slot.key(&self.bytes), &slot.tally))
    }

    /// Every key's counts, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &KeyTally> {
        self.table.iter().map(|slot| &slot.tally)
    }
}

impl Slot {
    fn new(hash: u64, key: &[u8], bytes: &mut Vec<u8>) -> Slot {
        let mut inline = [0; INLINE + 1];
        if key.len() <= INLINE {
            inline[..key.len()].copy_from_slice(key);
            inline[INLINE] = key.len() as u8;
        } else {
            inline[..8].copy_from_slice(&(bytes.len() as u64).to_ne_bytes());
            inline[8..16].copy_from_slice(&(key.len() as u64).to_ne_bytes());
            inline[INLINE] = LONG;
            bytes.extend_from_slice(key);
        }
        Slot {
            hash,
            tally: KeyTally::default(),
            key: inline,
        }
    }

    fn key<'a>(&'a self, bytes: &'a [u8]) -> &'a [u8] {
        match self.key[INLINE] {
            LONG => {
                let word = |at: usize| {
                    let word: [u8; 8] = self.key[at..at + 8].try_into().expect("8 bytes");
                    u64::from_ne_bytes(word) as usize
                };
                let start = word(0);
                &bytes[start..start + word(8)]
            }
            len => &self.key[..usize::from(len)],
        }
    }
}

impl<S> fmt::Debug for Keys<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.iter()
                    .map(|(key, tally)| (String::from_utf8_lossy(key), tally)),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::hash::{BuildHasherDefault, Hasher};

    use super::*;

    /// Every key hashes alike: each lookup has to tell keys apart by their bytes.
    #[derive(Default)]
    struct Same;

    impl Hasher for Same {
        fn finish(&self) -> u64 {
            7
        }
        fn write(&mut self, _: &[u8]) {}
    }

    /// The keys of a random stream of counts, with `hasher`, against a `HashMap` of the same
    /// counts.
    fn counts_as_a_map_does<S: BuildHasher + Default>(keys: usize, steps: usize) {
        let mut rng = fastrand::Rng::with_seed(keys as u64);
        let mut table = Keys::<S>::default();
        let mut map: HashMap<Vec<u8>, KeyTally> = HashMap::new();
        // Empty, short, long keys, and keys that are prefixes of others.
        let names: Vec<Vec<u8>> = (0..keys)
            .map(|i| match i % 4 {
                0 => format!("10.0.{}.{}", i >> 8 & 0xff, i & 0xff).into_bytes(),
                1 => vec![b'k'; i % 70],
                2 if i % 3 == 0 => vec![b'i'; INLINE + i % 3 - 1],
                2 => format!("sha256:{:064x}", i).into_bytes(),
                _ => format!("{i}").into_bytes(),
            })
            .collect();
        for _ in 0..steps {
            let key = &names[rng.usize(0..names.len())];
            let denied = u64::from(rng.bool());
            let limited = rng.u8(0..8) == 0;
            for tally in [table.entry(key), map.entry(key.clone()).or_default()] {
                tally.denied += denied;
                tally.limited |= limited;
            }
            let probe = &names[rng.usize(0..names.len())];
            assert_eq!(
                table.get(probe).map(|t| (t.denied, t.limited)),
                map.get(probe).map(|t| (t.denied, t.limited))
            );
        }
        assert_eq!(table.len(), map.len());
        let mut listed: Vec<(Vec<u8>, u64, bool)> = table
            .iter()
            .map(|(k, t)| (k.to_vec(), t.denied, t.limited))
            .collect();
        let mut expected: Vec<(Vec<u8>, u64, bool)> = map
            .iter()
            .map(|(k, t)| (k.clone(), t.denied, t.limited))
            .collect();
        listed.sort();
        expected.sort();
        assert_eq!(listed, expected);
        assert_eq!(
            table.values().filter(|t| t.limited).count(),
            map.values().filter(|t| t.limited).count()
        );
    }

    #[test]
    fn a_slot_is_48_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 48);
    }

    #[test]
    fn counts_as_a_hash_map_does() {
        counts_as_a_map_does::<foldhash::fast::RandomState>(20_000, 200_000);
    }

    #[test]
    fn keys_of_one_hash_are_told_apart_by_their_bytes() {
        counts_as_a_map_does::<BuildHasherDefault<Same>>(300, 20_000);
    }
}
