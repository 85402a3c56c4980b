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
//! BENCHMARKS.md's figures are built with one codegen unit, so that they do not move with how the
//! compiler splits the binary: `./scripts/decision_instructions.sh` builds and counts every row.
//!
//! Arguments: the limiter (`tollgate`, its outcome read whole; `governor`, `governor_foldhash`,
//! read for the verdict; `fields_instructions` reads both as their layers do for their fields),
//! the keys (`hot` or `100k`),
//! the path (`allowed` or `denied`) and the number of decisions. With `--toggle-collect` callgrind
//! counts only the instructions of the measured loop (the keys are tracked before it, as in the
//! bench); divide its total by the decisions. The count includes the loop's own few instructions per
//! decision, and whatever part of the decision the compiler inlined into it.

use tollgate::MemoryStore;

#[path = "support/counted.rs"]
mod counted;
#[path = "../benches/support/peers.rs"]
mod peers;
use counted::{arguments, misused, run};
use peers::{Governor, GovernorFoldhash, Tollgate};

fn main() {
    let usage = "usage: decision_instructions tollgate|governor|governor_foldhash hot|100k \
                 allowed|denied DECISIONS";
    let (limiter, keys, denied, decisions) = arguments(usage);
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
        _ => misused(usage),
    }
}
