//! Listing what a store holds, a page at a time: the keys blocked now ([`Store::blocks`]).
//!
//! A listing is walked with an opaque [`Cursor`]: each [`Page`] carries the cursor of the next
//! one, which the caller gives back, so no call scans more than a bounded part of the store.
//!
//! [`Store::blocks`]: super::Store::blocks

use std::fmt;
use std::time::Duration;

/// Where a listing goes on: taken from one [`Page`] and given back to ask for the next.
///
/// Opaque text that only the store which made it reads (the memory store's names a shard and a
/// position in it, the Redis store's a node and its `SCAN` cursor). It can travel through a URL
/// or a form as [`as_str`](Cursor::as_str) and come back with [`new`](Cursor::new); a cursor the
/// store cannot read is an error of kind
/// [`BadCursor`](super::StoreErrorKind::BadCursor), never a page of something else.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cursor(Box<str>);

impl Cursor {
    /// A cursor from its text (as a previous page's [`as_str`](Cursor::as_str) gave it).
    pub fn new(text: impl Into<String>) -> Self {
        Cursor(text.into().into_boxed_str())
    }

    /// The cursor's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A cursor that goes on after `key`: `tag` and the key's bytes in hex (the stores that list
    /// by key order write theirs this way).
    pub(crate) fn after_key(tag: char, key: &[u8]) -> Self {
        let mut text = String::with_capacity(1 + 2 * key.len());
        text.push(tag);
        for byte in key {
            text.push_str(&format!("{byte:02x}"));
        }
        Cursor::new(text)
    }

    /// The key an [`after_key`](Self::after_key) cursor of `tag` goes on after; `None` for
    /// another text.
    pub(crate) fn key_after(&self, tag: char) -> Option<Vec<u8>> {
        let hex = self.0.strip_prefix(tag)?;
        if hex.len() % 2 != 0 {
            return None;
        }
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect()
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One page of a listing: its entries, and the cursor of the next page (`None` at the end).
///
/// A page holds a bounded number of entries (the memory store at most 100; the Redis store
/// what one `SCAN … COUNT 100` finds on one node), and it may be empty while `next` is still
/// `Some`: the part of the store it looked at held nothing to list.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Page<T> {
    /// The entries of this page.
    pub items: Vec<T>,
    /// The cursor that asks for the next page; `None` when the listing is complete.
    pub next: Option<Cursor>,
}

impl<T> Page<T> {
    /// A page of `items`, followed by the page `next` asks for (`None`: the last page).
    pub fn new(items: Vec<T>, next: Option<Cursor>) -> Self {
        Page { items, next }
    }
}

/// A key blocked now under a rule's penalty, as a listing reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BlockedKey {
    /// The key's bytes, as the rule counts them (a key longer than
    /// [`MAX_KEY_LEN`](crate::key::MAX_KEY_LEN) is listed as the `sha256:<hex>` digest that
    /// replaced it).
    pub key: Vec<u8>,
    /// What is left of the block, by the store's clock (the Redis server's, on Redis).
    pub remaining: Duration,
    /// The offences the key has committed without being forgiven (0 for a key blocked by
    /// hand that never offended).
    pub offences: u64,
}

impl BlockedKey {
    /// A key blocked for `remaining` more, after `offences` offences.
    pub fn new(key: impl Into<Vec<u8>>, remaining: Duration, offences: u64) -> Self {
        BlockedKey {
            key: key.into(),
            remaining,
            offences,
        }
    }
}
