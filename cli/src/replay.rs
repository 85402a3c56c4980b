//! `tollgate replay`: a log through one configuration, or two side by side (`--compare`).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use tollgate::config::ConfigFileError;
use tollgate::{ManualClock, MemoryStore, RateLimitLayer};

use crate::log::Source;
use crate::run::{Runner, Spreader};
use crate::stats::{RuleTally, Tally};

/// One row of the side-by-side table: a number of a rule.
type Column = fn(&RuleTally) -> u64;

/// A runner for the configuration file at `path`, with a manual clock and a memory store
/// (whatever store the file names: a replay never touches a shared store).
pub fn runner(path: &Path) -> Result<Runner, ConfigFileError> {
    let clock = ManualClock::new(Duration::ZERO);
    let store = MemoryStore::with_clock(clock.clone());
    let layer = RateLimitLayer::from_config_file_with_store(path, store)?;
    Ok(Runner::new(layer.limiter().clone(), clock))
}

/// Reads every entry of `source` and runs it through every runner.
pub fn replay(source: &mut dyn Source, runners: &mut [Runner]) -> io::Result<()> {
    let mut spreader = Spreader::default();
    while let Some(next) = source.next_entry() {
        for runner in runners.iter_mut() {
            runner.tally.lines += 1;
        }
        let skipped = match next? {
            Ok(entry) => spreader.push(entry, runners).err(),
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

/// Keys limited (denied or delayed at least once, under any rule) by `a` and not by `b`.
pub fn limited_only(a: &Tally, b: &Tally) -> Vec<String> {
    let limited = |t: &Tally| -> BTreeSet<Vec<u8>> {
        t.rules
            .iter()
            .flat_map(|r| r.keys.iter().filter(|(_, k)| k.limited))
            .map(|(key, _)| key.to_vec())
            .collect()
    };
    let (in_a, in_b) = (limited(a), limited(b));
    in_a.difference(&in_b)
        .map(|key| String::from_utf8_lossy(key).into_owned())
        .collect()
}

/// How many of the keys limited by only one side are listed by name.
const LISTED: usize = 20;

/// The JSON of `--compare`.
pub fn compare_json(a: &Tally, b: &Tally) -> Value {
    let only = |keys: Vec<String>| json!({"count": keys.len(), "keys": keys.into_iter().take(LISTED).collect::<Vec<_>>()});
    json!({
        "a": a.to_json(),
        "b": b.to_json(),
        "limited_only_by_a": only(limited_only(a, b)),
        "limited_only_by_b": only(limited_only(b, a)),
    })
}

/// The text of `--compare`: each rule's numbers under both configurations.
pub fn compare_text(a: &Tally, b: &Tally, a_name: &str, b_name: &str) -> String {
    let mut out = format!(
        "{} lines, {} skipped\n",
        a.lines,
        a.skipped.values().sum::<u64>()
    );
    let mut names: Vec<&str> = a.rules.iter().map(|r| r.name.as_str()).collect();
    for rule in &b.rules {
        if !names.contains(&rule.name.as_str()) {
            names.push(&rule.name);
        }
    }
    let _ = writeln!(out, "\n{:<24} {:>14} {:>14}", "", a_name, b_name);
    for name in names {
        let (ra, rb) = (
            a.rules.iter().find(|r| r.name == name),
            b.rules.iter().find(|r| r.name == name),
        );
        let _ = writeln!(out, "rule {name:?}");
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
            let _ = writeln!(out, "  {label:<22} {:>14} {:>14}", cell(ra, f), cell(rb, f));
        }
    }
    for (who, keys) in [(a_name, limited_only(a, b)), (b_name, limited_only(b, a))] {
        let _ = writeln!(out, "\nkeys limited only by {who}: {}", keys.len());
        for key in keys.iter().take(LISTED) {
            let _ = writeln!(out, "  {key}");
        }
    }
    out
}
