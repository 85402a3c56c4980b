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
//! BENCHMARKS.md's figures are built with one codegen unit, so that they do not move with how the
//! compiler splits the binary: `./scripts/decision_instructions.sh` builds and counts every row.
//!
//! A binary of its own, apart from `decision_instructions`: a second caller of a limiter's
//! decision in one binary changes what the compiler inlines into the first (governor's
//! verdict-only row there moves by 16 instructions when its fields row is built beside it).

#[path = "support/counted.rs"]
mod counted;
#[path = "../benches/support/peers.rs"]
mod peers;
use counted::{arguments, misused, run};
use peers::{GovernorFields, Tollgate, TollgateFields};
use tollgate::MemoryStore;

fn main() {
    let usage = "usage: fields_instructions tollgate|governor hot|100k allowed|denied DECISIONS";
    let (limiter, keys, denied, decisions) = arguments(usage);
    match limiter.as_str() {
        "tollgate" => run(
            &TollgateFields(Tollgate::new(Box::new(MemoryStore::new()), denied)),
            &keys,
            denied,
            decisions,
        ),
        "governor" => run(&GovernorFields::new(denied), &keys, denied, decisions),
        _ => misused(usage),
    }
}
