//! The differential tests on Postgres: random scenarios (every algorithm, limits chosen per
//! request, reservations, refunds, debts, resets, blocks, overrides) give the memory store's
//! answers, field by field, in both step modes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::clock::ManualClock;
use tollgate::store::StepMode;
use tollgate::PostgresStore;

use crate::support::differential;
use crate::support::postgres_server::PgServer;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn cases(mode: StepMode, config: ProptestConfig) {
    let rt = runtime();
    let server = rt.block_on(PgServer::start());
    let url = server.url();
    rt.block_on(async {
        PostgresStore::builder()
            .url(&url)
            .create_schema(true)
            .build()
            .await
            .unwrap();
    });
    let case = AtomicU64::new(0);
    proptest!(config, |(scenario in differential::scenario())| {
        rt.block_on(async {
            let case = case.fetch_add(1, Ordering::Relaxed);
            // A store per scenario: its clock starts at the scenario's start, as the memory
            // store's does.
            let clock = ManualClock::new(Duration::from_micros(scenario.0));
            let store = PostgresStore::builder()
                .url(&url)
                .mode(mode)
                .clock(clock.clone())
                .timeout(Duration::from_secs(5))
                .pool_size(2)
                .build()
                .await
                .unwrap();
            differential::run_against(&store, &clock, &format!("c{case}."), &scenario).await;
        });
    });
}

#[test]
fn same_answers_as_the_memory_store_with_locks_512_scenarios() {
    cases(StepMode::Locks, differential::config(512));
}

#[test]
fn same_answers_as_the_memory_store_with_versions_128_scenarios() {
    cases(StepMode::Versions, differential::config(128));
}
