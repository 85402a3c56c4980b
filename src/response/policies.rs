//! What the response stage prepares once per rule set rather than once per request: each rule's
//! `RateLimit-Policy` item and the head of its `RateLimit` item, serialized once; the policy of
//! every rule together (most requests are charged by all of them); the last default 429s. The
//! middleware keeps it beside the rule set it was made for, and makes another at a reload.

use http::header::HeaderValue;

use super::headers::{self, PolicyItem};
use super::prepared::Prepared;
use crate::rules::set::RuleSet;

/// The response stage's part of one rule set, by rule index.
pub(crate) struct Policies {
    pub(crate) items: Box<[PolicyItem]>,
    /// `RateLimit-Policy` when every rule applies (the common case).
    pub(crate) all_rules: Option<HeaderValue>,
    /// The last default 429s, for floods of identical refusals.
    pub(crate) prepared: Prepared,
}

impl Policies {
    pub(crate) fn of(rules: &RuleSet) -> Self {
        let items: Box<[PolicyItem]> = rules
            .rules
            .iter()
            .map(|rule| PolicyItem::new(&rule.name, rule.algorithm()))
            .collect();
        let all_rules = headers::join(items.iter().map(|item| item.policy.as_str()));
        Policies {
            items,
            all_rules,
            prepared: Prepared::new(),
        }
    }
}
