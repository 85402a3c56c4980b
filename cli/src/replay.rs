//! `tollgate replay`: a log through one configuration, or two side by side (`--compare`).

use std::fmt::Write as _;
use std::io;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use tollgate::clock::ManualClock;
use tollgate::config::Config;
use tollgate::MemoryStore;

use crate::descriptors::{DescriptorMap, ServerRun};
use crate::log::Source;
use crate::run::{Runner, Spreader};
use crate::stats::{RuleTally, Tally, TOP_KEYS};

/// One row of the side-by-side table: a number of a rule.
type Column = fn(&RuleTally) -> u64;

/// A runner for the configuration file at `path`, with a manual clock and a memory store
/// (whatever store the file names: a replay never touches a shared store). A configuration of
/// tollgate-server is run on the descriptors `map` gives each line.
pub fn runner(path: &Path, map: &DescriptorMap) -> Result<Runner, Box<dyn std::error::Error>> {
    let clock = ManualClock::new(Duration::ZERO);
    let store = MemoryStore::with_clock(clock.clone());
    if tollgate_server::load::is_server_config(path) {
        if map.is_empty() {
            return Err(format!(
                "{}: a tollgate-server configuration: give --descriptor (and --domain when it \
                 has several) to say which descriptors each line sends",
                path.display()
            )
            .into());
        }
        let loaded = tollgate_server::load::load(path)?;
        let limiter = loaded.limiter_with_store(store)?;
        let domain = map.domain(&loaded.domains)?;
        let server = ServerRun {
            domains: loaded.domains,
            domain,
            map: map.clone(),
        };
        return Ok(Runner::new(limiter, clock).with_descriptors(server));
    }
    let layer = Config::read(path)?.layer_with_store(store)?;
    Ok(Runner::new(layer.limiter().clone(), clock))
}

/// Reads every entry of `source` and runs it through every runner.
pub fn replay(source: &mut dyn Source, runners: &mut [Runner]) -> io::Result<()> {
    let mut spreader = Spreader::default();
    // Each line is read where the spreader will hold it.
    while let Some(next) = source.next_into(spreader.slot()) {
        for runner in runners.iter_mut() {
            runner.tally.lines += 1;
        }
        let skipped = match next? {
            Ok(()) => spreader.push_slot(runners).err(),
            Err(reason) => Some(reason),
        };
        if let Some(reason) = skipped {
            for runner in runners.iter_mut() {
                runner.tally.skip(reason);
            }
        }
    }
    spreader.flush(runners);
    Ok(())
}

/// The keys one configuration's rule limited (denied or delayed at least once) and the other's
/// rule of the same name did not: the keys the difference between the two rules hits.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LimitedOnly {
    /// How many keys.
    pub count: usize,
    /// The requests of those keys the rule denied.
    pub denied: u64,
    /// The keys denied most, with their denials (ties by key), at most [`TOP_KEYS`].
    pub keys: Vec<(String, u64)>,
}

/// The keys `rule` limited that `other` (the rule of the same name in the other configuration,
/// if there is one) did not. Compared rule by rule: a key another rule limits on both sides
/// still counts here.
pub fn limited_only(rule: &RuleTally, other: Option<&RuleTally>) -> LimitedOnly {
    let mut keys: Vec<(&[u8], u64)> = rule
        .keys
        .iter()
        .filter(|(key, k)| {
            k.limited && other.is_none_or(|o| o.keys.get(key).is_none_or(|k| !k.limited))
        })
        .map(|(key, k)| (key, k.denied))
        .collect();
    keys.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    LimitedOnly {
        count: keys.len(),
        denied: keys.iter().map(|(_, denied)| denied).sum(),
        keys: keys
            .into_iter()
            .take(TOP_KEYS)
            .map(|(key, denied)| (String::from_utf8_lossy(key).into_owned(), denied))
            .collect(),
    }
}

/// One rule under both configurations (`None` where a configuration has no rule of that name).
pub struct RulePair<'t> {
    /// The rule's name.
    pub name: &'t str,
    /// The rule under the first configuration.
    pub a: Option<&'t RuleTally>,
    /// The rule under the second configuration.
    pub b: Option<&'t RuleTally>,
}

impl RulePair<'_> {
    /// The keys limited by the first configuration's rule only, if it has the rule.
    pub fn only_a(&self) -> Option<LimitedOnly> {
        self.a.map(|a| limited_only(a, self.b))
    }

    /// The keys limited by the second configuration's rule only, if it has the rule.
    pub fn only_b(&self) -> Option<LimitedOnly> {
        self.b.map(|b| limited_only(b, self.a))
    }
}

/// The rules of both configurations, paired by name: the first's in order, then the second's
/// own.
pub fn pairs<'t>(a: &'t Tally, b: &'t Tally) -> Vec<RulePair<'t>> {
    let mut names: Vec<&str> = a.rules.iter().map(|r| r.name.as_str()).collect();
    for rule in &b.rules {
        if !names.contains(&rule.name.as_str()) {
            names.push(&rule.name);
        }
    }
    names
        .into_iter()
        .map(|name| RulePair {
            name,
            a: a.rules.iter().find(|r| r.name == name),
            b: b.rules.iter().find(|r| r.name == name),
        })
        .collect()
}

/// The JSON of `--compare`: each configuration's, and per rule the keys limited by one only.
pub fn compare_json(a: &Tally, b: &Tally) -> Value {
    let only = |only: Option<LimitedOnly>| match only {
        None => Value::Null,
        Some(only) => json!({
            "count": only.count,
            "denied": only.denied,
            "keys": only.keys.into_iter().map(|(key, denied)| json!({"key": key, "denied": denied})).collect::<Vec<_>>(),
        }),
    };
    let rules: Vec<Value> = pairs(a, b)
        .iter()
        .map(|pair| {
            json!({
                "name": pair.name,
                "limited_only_by_a": only(pair.only_a()),
                "limited_only_by_b": only(pair.only_b()),
            })
        })
        .collect();
    json!({
        "a": a.to_json(),
        "b": b.to_json(),
        "rules": rules,
    })
}

/// The text of `--compare`: each rule's numbers under both configurations, and the keys only
/// one of them limits.
pub fn compare_text(a: &Tally, b: &Tally, a_name: &str, b_name: &str) -> String {
    let mut out = format!("{}\n", a.summary());
    let _ = writeln!(out, "\n{:<24} {:>14} {:>14}", "", a_name, b_name);
    for pair in pairs(a, b) {
        let _ = match (pair.a, pair.b) {
            (Some(_), None) => writeln!(out, "rule {:?} (only in {a_name})", pair.name),
            (None, Some(_)) => writeln!(out, "rule {:?} (only in {b_name})", pair.name),
            _ => writeln!(out, "rule {:?}", pair.name),
        };
        let cell =
            |r: Option<&RuleTally>, f: Column| r.map_or("-".to_owned(), |r| f(r).to_string());
        let rows: [(&str, Column); 6] = [
            ("requests", |r| r.requests),
            ("allowed", |r| r.allowed),
            ("denied", |r| r.denied),
            ("delayed", |r| r.delayed),
            ("keys", |r| r.keys.len() as u64),
            ("keys limited", |r| r.keys_limited() as u64),
        ];
        for (label, f) in rows {
            let _ = writeln!(
                out,
                "  {label:<22} {:>14} {:>14}",
                cell(pair.a, f),
                cell(pair.b, f)
            );
        }
        for (who, only) in [(a_name, pair.only_a()), (b_name, pair.only_b())] {
            let Some(only) = only else { continue };
            let _ = write!(out, "  keys limited only by {who}: {}", only.count);
            match only.denied {
                _ if only.count == 0 => {}
                1 => out.push_str(" (1 request denied)"),
                denied => {
                    let _ = write!(out, " ({denied} requests denied)");
                }
            }
            out.push('\n');
            for (key, denied) in &only.keys {
                let _ = writeln!(out, "    {denied:>10}  {key}");
            }
        }
    }
    out
}
