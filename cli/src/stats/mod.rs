//! What a configuration did: counts per rule, per key and per second, and their JSON and text.
//!
//! Memory grows with the number of distinct keys (one entry per key and rule) and of seconds that
//! saw traffic (one entry per second and rule), never with the number of lines.

mod keys;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{json, Value};
use tollgate::algorithm::Verdict;
use tollgate::engine::Ruling;

use crate::log::Skip;
use crate::time::Micros;

pub use keys::Keys;

/// How many keys a rule's `top_keys` lists.
pub const TOP_KEYS: usize = 10;

/// Where the requests of a tally come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Input {
    /// The lines of a log (`replay`): some may be skipped.
    #[default]
    Log,
    /// Synthetic requests (`simulate`): one per arrival, none skipped.
    Synthetic,
}

/// The counts of one configuration over one log, or over synthetic traffic.
#[derive(Debug, Default)]
pub struct Tally {
    /// Where the requests come from: the text and the JSON say lines or requests.
    pub input: Input,
    /// Lines read (replayed or skipped), or synthetic requests sent.
    pub lines: u64,
    /// Lines not replayed, by reason.
    pub skipped: BTreeMap<Skip, u64>,
    /// Requests on an allow list (never counted by a rule).
    pub allow_listed: u64,
    /// Requests refused by a deny list.
    pub deny_listed: u64,
    /// One per rule, in the configuration's order.
    pub rules: Vec<RuleTally>,
}

/// The counts of one rule.
#[derive(Debug, Default)]
pub struct RuleTally {
    /// The rule's name.
    pub name: String,
    /// Requests the rule applied to.
    pub requests: u64,
    /// Admitted at once.
    pub allowed: u64,
    /// Denied (429).
    pub denied: u64,
    /// Admitted after a queue-mode wait.
    pub delayed: u64,
    /// Refused before counting: the key was missing, or the cost unreadable.
    pub refused: u64,
    /// Per key: denials, and whether it was ever denied or delayed.
    pub keys: Keys,
    /// Per second with traffic, in order: offered, admitted, denied.
    pub timeline: Vec<(u64, [u64; 3])>,
}

/// One key's counts under one rule.
#[derive(Clone, Copy, Debug, Default)]
pub struct KeyTally {
    /// Times denied.
    pub denied: u64,
    /// Denied or delayed at least once.
    pub limited: bool,
}

impl Tally {
    /// An empty tally for rules named `names`.
    pub fn new(names: &[String]) -> Tally {
        Tally {
            rules: names
                .iter()
                .map(|name| RuleTally {
                    name: name.clone(),
                    ..RuleTally::default()
                })
                .collect(),
            ..Tally::default()
        }
    }

    /// Counts a skipped line.
    pub fn skip(&mut self, reason: Skip) {
        *self.skipped.entry(reason).or_default() += 1;
    }

    /// Counts what the rules made of one request at `at`.
    pub fn record(&mut self, at: Micros, ruling: &Ruling) {
        let second = at / 1_000_000;
        match ruling {
            Ruling::Allowed => self.allow_listed += 1,
            Ruling::Refused { rule: None, .. } => self.deny_listed += 1,
            Ruling::Refused {
                rule: Some(rule), ..
            } => {
                if let Some(tally) = self.rule_mut(rule) {
                    tally.requests += 1;
                    tally.refused += 1;
                    tally.second(second)[0] += 1;
                }
            }
            Ruling::Decided { enforced, shadow } => {
                for entry in enforced.rules().iter().chain(shadow.rules()) {
                    let Some(tally) = self.rule_mut(entry.rule()) else {
                        continue;
                    };
                    tally.requests += 1;
                    let (admitted, denied, limited) = match entry.outcome.verdict {
                        Verdict::Allowed => {
                            tally.allowed += 1;
                            (1, 0, false)
                        }
                        Verdict::Reserved { wait } if wait.is_zero() => {
                            tally.allowed += 1;
                            (1, 0, false)
                        }
                        Verdict::Reserved { .. } => {
                            tally.delayed += 1;
                            (1, 0, true)
                        }
                        // A verdict added later counts as a denial until it has a column.
                        _ => {
                            tally.denied += 1;
                            (0, 1, true)
                        }
                    };
                    let counts = tally.second(second);
                    counts[0] += 1;
                    counts[1] += admitted;
                    counts[2] += denied;
                    let key_tally = tally.keys.entry(entry.key.as_bytes());
                    key_tally.denied += denied;
                    key_tally.limited |= limited;
                }
            }
            // `Ruling` may grow; a kind this command does not know is not counted.
            _ => {}
        }
    }

    fn rule_mut(&mut self, name: &str) -> Option<&mut RuleTally> {
        self.rules.iter_mut().find(|r| r.name == name)
    }

    /// The JSON of `--json`: `lines` and `skipped` of a log, `requests` of synthetic traffic.
    pub fn to_json(&self) -> Value {
        let mut json = json!({
            "allow_listed": self.allow_listed,
            "deny_listed": self.deny_listed,
            "rules": self.rules.iter().map(RuleTally::to_json).collect::<Vec<_>>(),
        });
        match self.input {
            Input::Log => {
                json["lines"] = json!(self.lines);
                json["skipped"] = self
                    .skipped
                    .iter()
                    .map(|(k, v)| (k.name().to_owned(), json!(v)))
                    .collect::<serde_json::Map<_, _>>()
                    .into();
            }
            Input::Synthetic => json["requests"] = json!(self.lines),
        }
        json
    }

    /// How many lines or requests, in words: `12 lines, 1 skipped`, `300 requests sent`.
    pub fn summary(&self) -> String {
        match self.input {
            Input::Log => {
                let skipped: u64 = self.skipped.values().sum();
                format!("{} lines, {skipped} skipped", self.lines)
            }
            Input::Synthetic => format!("{} requests sent", self.lines),
        }
    }

    /// The text for a terminal.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.summary());
        for (reason, n) in &self.skipped {
            let _ = writeln!(out, "  skipped {n}: {reason}");
        }
        if self.allow_listed + self.deny_listed > 0 {
            let _ = writeln!(
                out,
                "{} on an allow list, {} refused by a deny list",
                self.allow_listed, self.deny_listed
            );
        }
        for rule in &self.rules {
            let _ = writeln!(out, "\nrule {:?}", rule.name);
            let _ = writeln!(
                out,
                "  requests {:>10}  allowed {:>10}  denied {:>10}  delayed {:>8}  refused {:>8}",
                rule.requests, rule.allowed, rule.denied, rule.delayed, rule.refused
            );
            let _ = writeln!(
                out,
                "  keys     {:>10}  limited at least once {:>10}",
                rule.keys.len(),
                rule.keys_limited()
            );
            let top = rule.top_keys(TOP_KEYS);
            if !top.is_empty() {
                let _ = writeln!(out, "  denied most:");
                for (key, denied) in top {
                    let _ = writeln!(out, "    {denied:>10}  {key}");
                }
            }
        }
        out
    }
}

impl RuleTally {
    fn second(&mut self, second: u64) -> &mut [u64; 3] {
        if self.timeline.last().is_none_or(|(s, _)| *s != second) {
            self.timeline.push((second, [0; 3]));
        }
        &mut self.timeline.last_mut().expect("just pushed").1
    }

    /// Keys denied or delayed at least once.
    pub fn keys_limited(&self) -> usize {
        self.keys.values().filter(|k| k.limited).count()
    }

    /// The `n` keys denied most (ties by key), with their denials.
    pub fn top_keys(&self, n: usize) -> Vec<(String, u64)> {
        let mut denied: Vec<(&[u8], u64)> = self
            .keys
            .iter()
            .filter(|(_, k)| k.denied > 0)
            .map(|(key, k)| (key, k.denied))
            .collect();
        denied.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        denied
            .into_iter()
            .take(n)
            .map(|(key, d)| (String::from_utf8_lossy(key).into_owned(), d))
            .collect()
    }

    fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "requests": self.requests,
            "allowed": self.allowed,
            "denied": self.denied,
            "delayed": self.delayed,
            "refused": self.refused,
            "keys": self.keys.len(),
            "keys_limited": self.keys_limited(),
            "top_keys": self.top_keys(TOP_KEYS).into_iter().map(|(key, denied)| json!({"key": key, "denied": denied})).collect::<Vec<_>>(),
        })
    }
}
