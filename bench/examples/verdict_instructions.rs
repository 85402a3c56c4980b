//! Instructions per decision of tollgate's `MemoryStore` when the caller reads only the verdict,
//! counted by callgrind: the scenarios of `decision_instructions.rs`, whose caller reads the whole
//! outcome.
//!
//! ```text
//! cargo build --release -p tollgate-bench --example verdict_instructions
//! valgrind --tool=callgrind --toggle-collect='*measured*' \
//!     target/release/examples/verdict_instructions hot allowed 1000000
//! ```
//!
//! governor's keyed limiter answers a decision with allowed or not (`Ok(())`, or a denial whose
//! wait its caller may compute later); tollgate's store answers with an `Outcome` that also holds
//! the units left, the balance and two waits. Here only the verdict is read, so the compiler leaves
//! out what computes the rest: the difference from `decision_instructions`' count is what the full
//! outcome costs. This is a binary of its own because a second caller of the store's decision in
//! the same binary changes what the compiler inlines into the first.
//!
//! Arguments: the keys (`hot` or `100k`), the path (`allowed` or `denied`) and the number of
//! decisions; the keys and limits are those of `decision_instructions`.

use std::hint::black_box;

#[path = "../benches/support/peers.rs"]
mod peers;
use peers::{scenario, Limiter, TollgateVerdict};

/// The decisions counted: not inlined, so that callgrind can switch its counting on around it.
#[inline(never)]
fn measured(tollgate: &TollgateVerdict, keys: &[u64], decisions: u64) -> u64 {
    let mut allowed = 0;
    let mut i = 0;
    for _ in 0..decisions {
        allowed += u64::from(black_box(tollgate.decide(black_box(keys[i]))));
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
    allowed
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: verdict_instructions hot|100k allowed|denied DECISIONS";
    let [keyset, path, decisions] = &args[..] else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let Some((keys, denied, decisions)) = scenario(keyset, path, decisions) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let tollgate = TollgateVerdict::new(denied);
    // Track every key and, on the denied path, spend its only unit, as the bench does.
    for &key in &keys {
        assert!(tollgate.decide(key), "a fresh key must be allowed");
        assert_eq!(tollgate.decide(key), !denied);
    }
    let allowed = measured(&tollgate, &keys, decisions);
    let expected = if denied { 0 } else { decisions };
    assert_eq!(allowed, expected, "every decision on the expected path");
    println!("{decisions} decisions, {allowed} allowed");
}
