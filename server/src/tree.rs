//! The descriptor trees of every domain, and how a request's descriptor finds its limit.
//!
//! Matching is the reference service's: a descriptor's entries walk the tree one level each; at
//! each level an entry takes the child with its key and the same value, else a child with its key
//! and a wildcard value that matches, else the child with its key and no value. The limit that
//! applies is the one at the level of the descriptor's **last** entry: a shorter or longer
//! descriptor, or a last level without a limit, has none (no fallback to a parent's limit).

use std::borrow::Cow;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

// Keys and values come from the configuration; a request only looks them up, so foldhash's
// seeded hash serves (a third of SipHash's work per lookup, on every call).
use foldhash::HashMap;

use crate::unit::Unit;

/// Every configured domain, by name.
#[derive(Debug, Default)]
pub struct Domains {
    domains: HashMap<String, Domain>,
}

/// One domain: its descriptor tree and how its answers carry headers.
#[derive(Debug, Default)]
pub struct Domain {
    /// The domain's name.
    pub(crate) name: String,
    pub(crate) root: Node,
    /// The fields `response_headers_to_add` carries for this domain.
    pub headers: Headers,
    /// Whether a level of the tree has `value_to_metric` (statistics keys are then built per
    /// call, from the values; otherwise never).
    pub(crate) value_to_metric: bool,
}

/// Which rate-limit fields a domain's answers ask Envoy to add to the response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Headers {
    /// draft-ietf-httpapi-ratelimit-headers-11's `RateLimit` and `RateLimit-Policy` (and
    /// `Retry-After` when over the limit).
    #[default]
    Draft,
    /// The legacy `X-RateLimit-Limit`, `-Remaining` and `-Reset` (and `Retry-After`).
    Legacy,
    /// Both.
    Both,
    /// None.
    Off,
}

/// One level of a descriptor tree.
#[derive(Debug, Default)]
pub(crate) struct Node {
    /// Children by key, then by exact value.
    exact: HashMap<String, HashMap<String, Node>>,
    /// Children whose value is a pattern with `*`, in the order configured.
    wildcard: Vec<(String, Pattern, Node)>,
    /// Children by key with no value: one counter per distinct value.
    any_value: HashMap<String, Node>,
    /// The limit at this level.
    pub(crate) limit: Option<LimitSpec>,
    /// For a wildcard level: every matching value shares one counter.
    share_threshold: bool,
    /// The statistics key names the request's value at this level (the reference's
    /// `value_to_metric`), not the configured one.
    pub(crate) value_to_metric: bool,
}

/// A configured limit, as a descriptor that reaches it is answered (or the limit a request's
/// descriptor brings, made for that request).
#[derive(Clone, Debug)]
pub struct LimitSpec {
    /// What the limit does with a charge.
    pub kind: LimitKind,
    /// The name shown to clients (`current_limit.name`, the `RateLimit` items): the
    /// configuration's `name`, else the library rule's name.
    pub name: String,
    /// The limit in the protocol's terms.
    pub requests_per_unit: u32,
    /// The unit of `requests_per_unit`.
    pub unit: Unit,
    /// The quota as clients are told it (`RateLimit-Policy`'s `q` and `w`): the limit as
    /// configured, not rounded to the protocol's units (3 per 90 s stays 3 per 90 s).
    pub policy: Policy,
    /// The largest cost that can ever pass (more is over the limit, whatever the count).
    pub max_cost: u64,
    /// Reported OK whatever it decides, and counted as shadowed.
    pub shadow: bool,
    /// Statistics per distinct descriptor value rather than per configured level.
    pub detailed_metric: bool,
    /// Names of limits this one replaces when both apply to one request.
    pub replaces: Vec<String>,
    /// The configured level's statistics key: `key_value.key` (the reference's).
    pub stat_key: String,
    /// `quota_mode`: over this limit, the descriptor is OVER_LIMIT, but the request only when
    /// every quota descriptor of it is.
    pub quota: bool,
    /// The level's `metadata`, returned in the answer's `dynamic_metadata` when this limit
    /// passes (and the service is asked to).
    pub metadata: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    /// Made for one request from its descriptor's own `limit`, not configured.
    pub from_request: bool,
    /// What the service derives from this limit once, on its first call, rather than per call.
    #[cfg_attr(not(feature = "service"), allow(dead_code))]
    pub(crate) memo: Memo,
}

/// A quota as the `RateLimit-Policy` field states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The most units the limit holds (`q`).
    pub quota: u64,
    /// Its window in whole seconds (`w`): the period for windows, the time to refill from
    /// empty for buckets.
    pub window_seconds: u64,
}

/// What a running service derives from a limit once and keeps with it: the limit's
/// `RateLimit-Policy` item and its name as a Structured Field string, and its statistics'
/// counters (shared with the same statistics key in the trees before a reload, so counters never
/// restart).
#[derive(Clone, Debug, Default)]
#[cfg_attr(not(feature = "service"), allow(dead_code))]
pub(crate) struct Memo {
    pub(crate) sf_name: OnceLock<String>,
    pub(crate) policy_item: OnceLock<String>,
    pub(crate) counts: OnceLock<Arc<Counts>>,
}

/// The reference's counters of one statistics key: `total_hits`, `over_limit`, `near_limit`,
/// `within_limit`, `shadow_mode`, `total_negative_hits`.
pub(crate) type Counts = [AtomicU64; 6];

/// What a limit does with a charge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitKind {
    /// Charged under this rule of the library's limiter.
    Rule(Arc<str>),
    /// `unlimited: true`: always OK, never charged.
    Unlimited,
    /// `requests_per_unit: 0`: always over the limit, never charged.
    Blocked,
}

/// A `*` pattern: each `*` matches any run of characters.
#[derive(Debug)]
pub(crate) struct Pattern(String);

impl Pattern {
    fn matches(&self, value: &str) -> bool {
        let mut parts = self.0.split('*');
        let first = parts.next().unwrap_or("");
        let Some(mut rest) = value.strip_prefix(first) else {
            return false;
        };
        let parts: Vec<&str> = parts.collect();
        let Some((last, middle)) = parts.split_last() else {
            return rest.is_empty();
        };
        for part in middle {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        rest.len() >= last.len() && rest.ends_with(last)
    }
}

/// One entry of a request's descriptor.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    /// The entry's key.
    pub key: &'a str,
    /// The entry's value.
    pub value: &'a str,
}

/// The limit a descriptor reached (borrowed from the tree in force, or made for the request
/// from its descriptor's own `limit`), with the key it is counted under.
#[derive(Debug)]
pub struct Matched<'t> {
    /// The limit.
    pub limit: Reached<'t>,
    /// The counter's key in the store: the values that select it, joined by `/` (a wildcard
    /// level with `share_threshold` contributes its pattern instead). Borrowed from the request
    /// or the tree when it is one value written as it is (the usual descriptor: no allocation).
    pub key: Cow<'t, [u8]>,
    /// The statistics key when `value_to_metric` makes it differ from the limit's own: the
    /// request's values in place of the configured ones.
    pub stat_key: Option<String>,
}

/// A limit a descriptor reached: the tree's own, or one made for the request. The one made is
/// boxed so that a request's plan, which keeps a few of these in place, stays a few words per
/// descriptor (a limit is a few hundred bytes, and a plan is moved on every call).
#[derive(Debug)]
pub enum Reached<'t> {
    /// The configuration's limit, in the tree in force.
    Configured(&'t LimitSpec),
    /// Made for this request from its descriptor's own `limit`.
    FromRequest(Box<LimitSpec>),
}

impl std::ops::Deref for Reached<'_> {
    type Target = LimitSpec;

    fn deref(&self) -> &LimitSpec {
        match self {
            Reached::Configured(limit) => limit,
            Reached::FromRequest(limit) => limit,
        }
    }
}

impl Domains {
    /// The domain named `name`.
    pub fn get(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// The names of the configured domains.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// The domains, by name in order.
    pub fn sorted(&self) -> Vec<(&str, &Domain)> {
        let mut all: Vec<_> = self.domains.iter().map(|(n, d)| (n.as_str(), d)).collect();
        all.sort_by_key(|(name, _)| *name);
        all
    }

    pub(crate) fn get_mut(&mut self, name: &str) -> Option<&mut Domain> {
        self.domains.get_mut(name)
    }

    pub(crate) fn entry(&mut self, name: &str) -> &mut Domain {
        self.domains
            .entry(name.to_owned())
            .or_insert_with(|| Domain {
                name: name.to_owned(),
                ..Domain::default()
            })
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.domains.contains_key(name)
    }
}

impl Domain {
    /// Every configured limit of this domain, ordered by statistics key.
    pub fn limits(&self) -> Vec<&LimitSpec> {
        let mut limits = Vec::new();
        self.root.collect(&mut limits);
        limits.sort_by(|a, b| a.stat_key.cmp(&b.stat_key));
        limits
    }

    /// The limit `entries` reach in this domain, if any.
    pub fn find<'t>(&'t self, entries: &[Entry<'t>]) -> Option<Matched<'t>> {
        let mut node = &self.root;
        // Most descriptors have one entry, whose value needs no escape: the key is that value,
        // borrowed. (An empty `Vec` allocates nothing.)
        let mut key: Cow<'t, [u8]> = Cow::Owned(Vec::new());
        // The reference's `value_to_metric` statistics key, built only where a level asks.
        let mut stat_key = self.value_to_metric.then(String::new);
        for (i, entry) in entries.iter().enumerate() {
            let (child, counted_as, via) = node.child(entry)?;
            let part = counted_as.as_bytes();
            if entries.len() == 1 && !needs_escape(part) {
                key = Cow::Borrowed(part);
            } else {
                let key = key.to_mut();
                if i == 0 {
                    key.reserve(entries.iter().map(|e| e.value.len() + 1).sum());
                } else {
                    key.push(b'/');
                }
                push_part(key, part);
            }
            if let Some(stat_key) = &mut stat_key {
                if i > 0 {
                    stat_key.push('.');
                }
                stat_key.push_str(entry.key);
                // The value a level's statistics name: the request's where `value_to_metric`
                // asks for it (a `share_threshold` pattern still names its pattern), else the
                // configured one (none for a key alone).
                let value = match via {
                    Via::Exact => Some(entry.value),
                    Via::Wildcard(pattern) if child.share_threshold => Some(pattern),
                    Via::Wildcard(_) | Via::AnyValue if child.value_to_metric => Some(entry.value),
                    Via::Wildcard(pattern) => Some(pattern),
                    Via::AnyValue => None,
                };
                if let Some(value) = value {
                    stat_key.push('_');
                    stat_key.push_str(value);
                }
            }
            node = child;
        }
        if entries.is_empty() {
            return None;
        }
        let limit = node.limit.as_ref()?;
        let stat_key = stat_key.filter(|k| !limit.detailed_metric && *k != limit.stat_key);
        Some(Matched {
            limit: Reached::Configured(limit),
            key,
            stat_key,
        })
    }
}

/// How an entry selected a level.
#[derive(Clone, Copy, Debug)]
enum Via<'n> {
    /// Its key and the same value.
    Exact,
    /// Its key and this wildcard pattern.
    Wildcard(&'n str),
    /// Its key alone.
    AnyValue,
}

/// Whether a part of a key is written escaped (it holds `%` or `/`).
fn needs_escape(part: &[u8]) -> bool {
    part.iter().any(|&byte| byte == b'%' || byte == b'/')
}

/// Appends one part of a key: parts are joined by `/`, with `%` and `/` in a value
/// percent-encoded, so `("a", "b/c")` and `("a/b", "c")` stay apart and a key reads as its values
/// (`10.0.0.1`, `slowpath/10.0.0.1`) in logs and reports.
fn push_part(key: &mut Vec<u8>, part: &[u8]) {
    if !needs_escape(part) {
        key.extend_from_slice(part);
        return;
    }
    for &byte in part {
        match byte {
            b'%' => key.extend_from_slice(b"%25"),
            b'/' => key.extend_from_slice(b"%2F"),
            _ => key.push(byte),
        }
    }
}

impl Node {
    /// The child `entry` selects, and what it is counted as at this level.
    /// (What it is counted as lives as long as the shorter of the two: the entry's value, or
    /// this level's pattern.)
    fn child<'n, 's>(&'n self, entry: &Entry<'s>) -> Option<(&'n Node, &'s str, Via<'n>)>
    where
        'n: 's,
    {
        if let Some(child) = self.exact.get(entry.key).and_then(|v| v.get(entry.value)) {
            return Some((child, entry.value, Via::Exact));
        }
        if let Some((_, pattern, child)) = self
            .wildcard
            .iter()
            .find(|(key, pattern, _)| key == entry.key && pattern.matches(entry.value))
        {
            let counted_as = if child.share_threshold {
                pattern.0.as_str()
            } else {
                entry.value
            };
            return Some((child, counted_as, Via::Wildcard(&pattern.0)));
        }
        self.any_value
            .get(entry.key)
            .map(|child| (child, entry.value, Via::AnyValue))
    }

    /// The child for a configured `key` and optional `value`, created when new.
    pub(crate) fn child_mut(&mut self, key: &str, value: Option<&str>) -> &mut Node {
        match value {
            None => self.any_value.entry(key.to_owned()).or_default(),
            Some(value) if value.contains('*') => {
                let at = self
                    .wildcard
                    .iter()
                    .position(|(k, p, _)| k == key && p.0 == value);
                let at = at.unwrap_or_else(|| {
                    let pattern = Pattern(value.to_owned());
                    self.wildcard
                        .push((key.to_owned(), pattern, Node::default()));
                    self.wildcard.len() - 1
                });
                &mut self.wildcard[at].2
            }
            Some(value) => self
                .exact
                .entry(key.to_owned())
                .or_default()
                .entry(value.to_owned())
                .or_default(),
        }
    }

    /// Whether a child for a configured `key` and optional `value` exists.
    pub(crate) fn has_child(&self, key: &str, value: Option<&str>) -> bool {
        match value {
            None => self.any_value.contains_key(key),
            Some(value) if value.contains('*') => self
                .wildcard
                .iter()
                .any(|(k, p, _)| k == key && p.0 == value),
            Some(value) => self.exact.get(key).is_some_and(|v| v.contains_key(value)),
        }
    }

    fn collect<'t>(&'t self, limits: &mut Vec<&'t LimitSpec>) {
        limits.extend(self.limit.as_ref());
        let exact = self.exact.values().flat_map(HashMap::values);
        let wildcard = self.wildcard.iter().map(|(_, _, node)| node);
        for child in exact.chain(wildcard).chain(self.any_value.values()) {
            child.collect(limits);
        }
    }

    pub(crate) fn set_share_threshold(&mut self, share: bool) {
        self.share_threshold = share;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> LimitSpec {
        LimitSpec {
            kind: LimitKind::Rule(name.into()),
            name: name.to_owned(),
            requests_per_unit: 1,
            unit: Unit::Minute,
            policy: Policy {
                quota: 1,
                window_seconds: 60,
            },
            max_cost: 1,
            shadow: false,
            detailed_metric: false,
            replaces: Vec::new(),
            stat_key: name.into(),
            quota: false,
            metadata: None,
            from_request: false,
            memo: Memo::default(),
        }
    }

    fn find(domain: &Domain, entries: &[(&str, &str)]) -> Option<String> {
        let entries: Vec<Entry<'_>> = entries
            .iter()
            .map(|&(key, value)| Entry { key, value })
            .collect();
        domain.find(&entries).map(|m| m.limit.name.clone())
    }

    #[test]
    fn exact_then_wildcard_then_key_alone() {
        let mut domain = Domain::default();
        domain.root.child_mut("path", Some("/login")).limit = Some(spec("exact"));
        domain.root.child_mut("path", Some("/api/*")).limit = Some(spec("wildcard"));
        domain.root.child_mut("path", None).limit = Some(spec("any"));
        assert_eq!(find(&domain, &[("path", "/login")]).unwrap(), "exact");
        assert_eq!(find(&domain, &[("path", "/api/v1")]).unwrap(), "wildcard");
        assert_eq!(find(&domain, &[("path", "/other")]).unwrap(), "any");
        assert_eq!(find(&domain, &[("user", "x")]), None);
    }

    #[test]
    fn the_last_entry_decides_with_no_fallback_to_a_parent() {
        let mut domain = Domain::default();
        let parent = domain.root.child_mut("key", Some("value"));
        parent.limit = Some(spec("parent"));
        parent.child_mut("user", None);
        assert_eq!(find(&domain, &[("key", "value")]).unwrap(), "parent");
        // The nested level has no limit: none applies, not the parent's.
        assert_eq!(find(&domain, &[("key", "value"), ("user", "a")]), None);
        // Deeper than the tree: none.
        assert_eq!(
            find(&domain, &[("key", "value"), ("user", "a"), ("x", "y")]),
            None
        );
        assert_eq!(find(&domain, &[]), None);
    }

    #[test]
    fn wildcards_match_any_run() {
        let matches = |p: &str, v: &str| Pattern(p.to_owned()).matches(v);
        assert!(matches("foo*", "foobar"));
        assert!(matches("*bar", "foobar"));
        assert!(matches("f*o*r", "foobar"));
        assert!(matches("*", ""));
        assert!(!matches("foo*", "fo"));
        assert!(!matches("a*a", "a"));
    }

    #[test]
    fn keys_keep_values_apart() {
        let mut domain = Domain::default();
        domain.root.child_mut("a", None).child_mut("b", None).limit = Some(spec("x"));
        let key = |a: &str, b: &str| {
            let entries = [Entry { key: "a", value: a }, Entry { key: "b", value: b }];
            domain.find(&entries).unwrap().key.into_owned()
        };
        assert_ne!(key("a", "b/c"), key("a/b", "c"));
        assert_eq!(key("10.0.0.1", "x%y"), b"10.0.0.1/x%25y");
        // One value needing no escape is the key as it is; one that needs it is escaped.
        let one = |value: &str| {
            let mut domain = Domain::default();
            domain.root.child_mut("a", None).limit = Some(spec("x"));
            let entries = [Entry { key: "a", value }];
            domain.find(&entries).unwrap().key.into_owned()
        };
        assert_eq!(one("10.0.0.1"), b"10.0.0.1");
        assert_eq!(one("a/b%"), b"a%2Fb%25");
        assert_ne!(key("", "a"), key("a", ""));
    }
}
