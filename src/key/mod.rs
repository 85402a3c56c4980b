//! Keys: what identifies the party a rule limits.
//!
//! A [`Key`] turns the head of a request into a [`KeyValue`], a short byte string
//! such as `203.0.113.7`, `2001:db8:1:2::/64` or the value of an API-key header. A missing key is
//! reported as `None` and the rule decides what that means.
//!
//! `Key` and [`ClientIp`](crate::ClientIp) are at the crate's root; this module holds what a
//! closer look needs: the [`KeyValue`] a key reads, the [`RequestHead`] it reads it from, the
//! forwarding headers a proxy may set, and the request's [`Protocol`]. It reads the algorithms
//! only; it never touches rules or stores.

pub(crate) mod client_ip;
pub(crate) mod extract;
pub(crate) mod forwarded;
pub(crate) mod protocol;

pub(crate) use extract::{peer_addr, Key, KeyFault};
pub use extract::{KeyValue, RequestHead, MAX_KEY_LEN};
pub use forwarded::{CdnHeader, ForwardedHeader};
pub use protocol::Protocol;

/// The namespace a rule's keys are counted in: a 64-bit digest of the rule's name, computed
/// once per rule (a compiled rule keeps it beside its name) so that a store hashing
/// `(rule, key)` on every charge hashes this instead of the name (`store::RuleName`). foldhash
/// with a fixed seed: the digest is no secret, the store seeds its own hash of it at random.
pub(crate) fn namespace(rule: &str) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::default().hash_one(rule)
}
