//! `MemoryStore` against governor's keyed limiter, side by side, in the same run: governor as
//! `RateLimiter::dashmap` builds it (std's SipHash, row `governor`) and with the hasher tollgate's
//! memory store uses (`dashmap_with_hasher` with foldhash, row `governor_foldhash`), so the hasher
//! is not what the comparison measures.
//!
//! All three limit `u64` keys with a token bucket (GCRA), read their default clocks, and decide one
//! unit per call. Tollgate's key bytes are the key's eight little-endian bytes under rule `bench`;
//! governor's key is the `u64` itself. Tollgate's whole outcome is read (units left, balance,
//! waits: what the middleware's fields need); `benches/verdict.rs` reads only its verdict, the
//! answer governor gives. The scenarios are described in `support/rows.rs`.

use criterion::{criterion_group, criterion_main, Criterion};
use tollgate::MemoryStore;

#[path = "support/peers.rs"]
mod peers;
#[path = "support/rows.rs"]
mod rows;

fn store(c: &mut Criterion) {
    rows::every_scenario(c, "store", "tollgate", |denied| {
        peers::Tollgate::new(Box::new(MemoryStore::new()), denied)
    });
}

criterion_group! {
    name = benches;
    config = rows::config();
    targets = store
}
criterion_main!(benches);
