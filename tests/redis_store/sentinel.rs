//! Redis behind Sentinel: one master, one replica and three sentinels on loopback ports. The store
//! finds the master through `redis+sentinel://`, and when the master is killed mid-traffic it
//! follows the failover: no panic, no call past the store's timeout, decisions on the promoted
//! replica within a bound measured here, and no count made up (what a failover loses is at most
//! what the old master acknowledged and had not yet sent to the replica).

use std::time::{Duration, Instant};

use tollgate::{Limit, LimitError, Limiter, RedisStore, Rule};

use super::ENGINE;
use crate::support::redis_server::{RedisServer, SentinelProcess};

/// How long a test waits for something Sentinel does (promotions take about a second here).
const PATIENCE: Duration = Duration::from_secs(30);

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A master, its replica (in sync), and three sentinels that all know both and each other.
fn sentinel_set() -> (RedisServer, RedisServer, Vec<SentinelProcess>) {
    let master = ENGINE.server();
    let replica = ENGINE.server_with(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    wait_for("the replica in sync", || {
        replica
            .run("INFO replication")
            .contains("master_link_status:up")
    });
    let sentinels: Vec<SentinelProcess> = (0..3).map(|_| ENGINE.sentinel(master.port)).collect();
    wait_for("the sentinels see the replica and each other", || {
        sentinels.iter().all(|s| {
            let info = s.run("INFO sentinel");
            info.contains("status=ok") && info.contains("slaves=1") && info.contains("sentinels=3")
        })
    });
    (master, replica, sentinels)
}

fn url(sentinels: &[SentinelProcess]) -> String {
    let hosts: Vec<String> = sentinels
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    format!("redis+sentinel://{}/mymaster", hosts.join(","))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_the_store_follows_a_failover_and_keeps_deciding() {
    let (mut master, replica, sentinels) = sentinel_set();
    let timeout = Duration::from_millis(200);
    let store = RedisStore::builder()
        .url(url(&sentinels))
        .timeout(timeout)
        .build()
        .await
        .expect("the sentinels name the master");
    let limiter = Limiter::builder()
        // A window (not a bucket, which refills while the failover runs): the count is exact.
        .rule(Rule::new(
            "api",
            Limit::fixed_window(1_000_000, Duration::from_secs(86_400)),
        ))
        .store(store)
        .build()
        .unwrap();
    // Decisions on the master, replicated.
    let mut acknowledged = 0u64;
    for _ in 0..200 {
        limiter.charge("api", "k", 1).await.unwrap();
        acknowledged += 1;
    }
    assert_eq!(
        limiter.check("api", "k", 0).await.unwrap().remaining,
        1_000_000 - 200
    );

    master.kill();
    let killed = Instant::now();
    let mut failed = 0u64;
    let recovered = loop {
        let asked = Instant::now();
        let answer = limiter.charge("api", "k", 1).await;
        // Never past the store's timeout (with room for a loaded machine): no hang.
        assert!(
            asked.elapsed() < timeout + Duration::from_secs(2),
            "a call hung"
        );
        match answer {
            Ok(_) => break killed.elapsed(),
            Err(LimitError::Store(_)) => failed += 1,
            Err(other) => panic!("{other}"),
        }
        assert!(
            killed.elapsed() < PATIENCE,
            "no decision on a new master; the replica: {}; a sentinel: {}",
            replica.run("ROLE"),
            sentinels[0].run("INFO sentinel")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    acknowledged += 1;
    // The replica is the master now, and it holds every count the old one had replicated.
    assert!(replica.run("INFO replication").contains("role:master"));
    let counted = 1_000_000 - limiter.check("api", "k", 0).await.unwrap().remaining;
    assert!(
        counted <= acknowledged,
        "no count made up: {counted} > {acknowledged}"
    );
    let lost = acknowledged - counted;
    eprintln!(
        "sentinel failover: decisions again {recovered:?} after the kill ({failed} calls refused \
         meanwhile); {lost} of {acknowledged} acknowledged decisions lost"
    );
    // The old master's last acknowledged writes may not have reached the replica; everything
    // the replica had is there.
    assert!(lost <= 1, "{lost} decisions lost");
    assert!(counted >= 200, "the replicated counts survive");
}
