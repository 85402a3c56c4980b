//! The counted loop of the decision-counting examples (`decision_instructions`,
//! `fields_instructions`): the keys tracked first, as the store bench does, then the decisions
//! callgrind counts.

use std::hint::black_box;

use super::peers::{scenario, Limiter};

/// The decisions counted: not inlined, so that callgrind can switch its counting on around it.
#[inline(never)]
fn measured(limiter: &impl Limiter, keys: &[u64], decisions: u64) -> u64 {
    let mut allowed = 0;
    let mut i = 0;
    for _ in 0..decisions {
        allowed += u64::from(limiter.decide(black_box(keys[i])));
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
    allowed
}

/// Tracks every key (and, on the denied path, spends its only unit), then makes `decisions`
/// decisions over the keys in turn, each on the expected path.
pub(crate) fn run(limiter: &impl Limiter, keys: &[u64], denied: bool, decisions: u64) {
    for &key in keys {
        assert!(limiter.decide(key), "a fresh key must be allowed");
        assert_eq!(limiter.decide(key), !denied);
    }
    let allowed = measured(limiter, keys, decisions);
    let expected = if denied { 0 } else { decisions };
    assert_eq!(allowed, expected, "every decision on the expected path");
    println!("{decisions} decisions, {allowed} allowed");
}

/// The arguments `LIMITER KEYS PATH DECISIONS`: the limiter's name, the keys, whether the path is
/// the denied one, and the number of decisions. Exits with `usage` on anything else.
pub(crate) fn arguments(usage: &str) -> (String, Vec<u64>, bool, u64) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [limiter, keyset, path, decisions] = &args[..] {
        if let Some((keys, denied, decisions)) = scenario(keyset, path, decisions) {
            return (limiter.clone(), keys, denied, decisions);
        }
    }
    misused(usage)
}

/// Says how to call the example and exits.
pub(crate) fn misused(usage: &str) -> ! {
    eprintln!("{usage}");
    std::process::exit(2)
}
