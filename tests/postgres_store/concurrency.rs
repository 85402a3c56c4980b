//! Two app instances (two stores, two pools) on one hot key admit exactly the limit, in both
//! step modes: concurrent steps wait for the row's lock, or lose the race and read again.

use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::store::StepMode;
use tollgate::{FailurePolicy, Limit, Limiter, PostgresStore, Rule};

use crate::support::hammer::hammer;
use crate::support::postgres_server::PgServer;

async fn two_instances_admit_exactly_the_limit(mode: StepMode) {
    let server = PgServer::start().await;
    // A frozen clock: nothing refills while the tasks run, so exactly 100 may pass.
    let clock = ManualClock::new(Duration::from_secs(1_750_000_000));
    let instance = || async {
        let store = PostgresStore::builder()
            .url(server.url())
            .mode(mode)
            .clock(clock.clone())
            .create_schema(true)
            // Every task waits its turn: no request may fall to the failure policy here.
            .retries(100_000)
            .timeout(Duration::from_secs(60))
            .pool_size(8)
            .build()
            .await
            .unwrap();
        Limiter::builder()
            .rule(Rule::new("hot", Limit::per_day(100)))
            .store(store)
            .on_store_failure(FailurePolicy::Closed)
            .build()
            .unwrap()
    };
    let limiters = [instance().await, instance().await];
    let admitted = hammer(&limiters, "hot", 32, 5).await;
    assert_eq!(admitted, 100, "{mode:?}: 320 requests on a limit of 100");
    for limiter in &limiters {
        assert_eq!(limiter.check("hot", "", 1).await.unwrap().remaining, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_hot_key_admit_exactly_the_limit_with_locks() {
    two_instances_admit_exactly_the_limit(StepMode::Locks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_hot_key_admit_exactly_the_limit_with_versions() {
    two_instances_admit_exactly_the_limit(StepMode::Versions).await;
}

/// A request of two rules on two hot keys is charged on both or neither, under contention: the
/// per-user rule (10) runs out first, and the global rule is charged only with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_two_rules_is_charged_all_or_nothing_under_contention() {
    let server = PgServer::start().await;
    let clock = ManualClock::new(Duration::from_secs(1_750_000_000));
    let store = PostgresStore::builder()
        .url(server.url())
        .clock(clock.clone())
        .create_schema(true)
        .timeout(Duration::from_secs(60))
        .retries(100_000)
        .build()
        .await
        .unwrap();
    let limiter = Limiter::builder()
        .rule(Rule::new("user", Limit::per_day(10)))
        .rule(Rule::new("global", Limit::per_day(1_000)))
        .store(store)
        .build()
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let limiter = limiter.clone();
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..3 {
                let decision = limiter
                    .charge_all([("user", "alice", 1), ("global", "", 1)])
                    .await
                    .unwrap();
                if decision.is_allowed() {
                    admitted += 1;
                }
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    assert_eq!(admitted, 10);
    assert_eq!(limiter.check("global", "", 0).await.unwrap().remaining, 990);
}
