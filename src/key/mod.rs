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
