//! `MemoryStore` read as governor's keyed limiter is read — allowed or not — against governor
//! with foldhash and with its default SipHash, in the same run: the scenarios of
//! `benches/store.rs` (see `support/rows.rs`), with only the verdict of tollgate's outcome read.
//!
//! governor's `check_key` answers `Ok(())`, or a denial from which its caller may compute the wait
//! later. tollgate's store answers an `Outcome` with the units left, the balance and two waits as
//! well; when only the verdict is read, the compiler leaves out what computes the rest, so this
//! bench measures the decision itself, and its difference from `benches/store.rs`' tollgate row
//! is what the whole outcome costs. A binary of its own: a second caller of the store's decision
//! in one binary changes what the compiler inlines into the first.

use criterion::{criterion_group, criterion_main, Criterion};

#[path = "support/peers.rs"]
mod peers;
#[path = "support/rows.rs"]
mod rows;

fn verdict(c: &mut Criterion) {
    rows::every_scenario(
        c,
        "verdict",
        "tollgate_verdict",
        peers::TollgateVerdict::new,
    );
}

criterion_group! {
    name = benches;
    config = rows::config();
    targets = verdict
}
criterion_main!(benches);
