//! Instructions per decision of tollgate's `MemoryStore` and governor's keyed limiter (foldhash),
//! each read as its layer reads it to write its fields, counted by callgrind:
//!
//! - `tollgate`: the verdict, the units left and the time to the next unit (`RateLimit`; an
//!   allowed decision's limit too), and a denial's wait (`Retry-After`);
//! - `governor`: with the middleware tower_governor's `use_headers()` installs
//!   (`StateInformationMiddleware`), an allowed decision's quota and units left
//!   (`x-ratelimit-limit`, `x-ratelimit-remaining`), or a denial's quota and wait from now
//!   (`x-ratelimit-after`, `retry-after`; governor reads its clock again for it).
//!
//! ```text
//! cargo build --release -p tollgate-bench --example fields_instructions
//! valgrind --tool=callgrind --toggle-collect='*measured*' \
//!     target/release/examples/fields_instructions tollgate hot allowed 1000000
//! ```
//!
//! A binary of its own, apart from `decision_instructions`: a second caller of a limiter's
//! decision in one binary changes what the compiler inlines into the first (governor's
//! verdict-only row there moves by 16 instructions when its fields row is built beside it).

use std::hint::black_box;

#[path = "../benches/support/peers.rs"]
mod peers;
use peers::{scenario, GovernorFields, Limiter, Tollgate, TollgateFields};
use tollgate::MemoryStore;

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
    let usage = "usage: fields_instructions tollgate|governor hot|100k allowed|denied DECISIONS";
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
            &TollgateFields(Tollgate::new(Box::new(MemoryStore::new()), denied)),
            &keys,
            denied,
            decisions,
        ),
        "governor" => run(&GovernorFields::new(denied), &keys, denied, decisions),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    }
}
