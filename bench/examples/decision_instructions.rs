//! Instructions per decision of tollgate's `MemoryStore` and governor's keyed limiter (SipHash and
//! foldhash), counted by callgrind: a figure the machine's changing speed does not move, for the
//! scenarios of `bench/benches/store.rs` (one thread).
//!
//! ```text
//! cargo build --release -p tollgate-bench --example decision_instructions
//! valgrind --tool=callgrind --toggle-collect='*measured*' \
//!     target/release/examples/decision_instructions tollgate 100k allowed 1000000
//! ```
//!
//! Arguments: the limiter (`tollgate`, its outcome read whole; `governor`, `governor_foldhash`,
//! read for the verdict; `fields_instructions` reads both as their layers do for their fields),
//! the keys (`hot` or `100k`),
//! the path (`allowed` or `denied`) and the number of decisions. With `--toggle-collect` callgrind
//! counts only the instructions of the measured loop (the keys are tracked before it, as in the
//! bench); divide its total by the decisions. The count includes the loop's own few instructions per
//! decision, and whatever part of the decision the compiler inlined into it.

use std::hint::black_box;

use tollgate::MemoryStore;

#[path = "../benches/support/peers.rs"]
mod peers;
use peers::{scenario, Governor, GovernorFoldhash, Limiter, Tollgate};

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

fn run(limiter: &impl Limiter, keys: &[u64], denied: bool, decisions: u64) {
    // Track every key and, on the denied path, spend its only unit, as the bench does.
    for &key in keys {
        assert!(limiter.decide(key), "a fresh key must be allowed");
        assert_eq!(limiter.decide(key), !denied);
    }
    let allowed = measured(limiter, keys, decisions);
    let expected = if denied { 0 } else { decisions };
    assert_eq!(allowed, expected, "every decision on the expected path");
    println!("{decisions} decisions, {allowed} allowed");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: decision_instructions tollgate|governor|governor_foldhash hot|100k \
                 allowed|denied DECISIONS";
    let [limiter, keyset, path, decisions] = &args[..] else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let Some((keys, denied, decisions)) = scenario(keyset, path, decisions) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    match limiter.as_str() {
        "tollgate" => run(
            &Tollgate::new(Box::new(MemoryStore::new()), denied),
            &keys,
            denied,
            decisions,
        ),
        "governor" => run(&Governor::new(denied), &keys, denied, decisions),
        "governor_foldhash" => run(
            &GovernorFoldhash::with_foldhash(denied),
            &keys,
            denied,
            decisions,
        ),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    }
}
