//! Blocks across a fleet (DESIGN §19): two app instances — two `Limiter`s, each with its own
//! `RedisStore` and deny cache — on one real server (and on a cluster) see the blocks set through
//! each other on their next decision, list them page by page with a cursor (`SCAN`, never
//! `KEYS`), with what is left of each block by the server's clock, and lift them.

#![cfg(feature = "redis")]

use std::collections::HashSet;
use std::time::Duration;

use tollgate::algorithm::Verdict;
use tollgate::clock::ManualClock;
use tollgate::store::BlockedKey;
use tollgate::{Limit, Limiter, Penalty, RedisStore, Rule};

use super::ENGINE;
use crate::support::pages::every_page;

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

fn login() -> Rule {
    Rule::new("login", Limit::per_minute(1)).block(Penalty::fixed(10 * MINUTE))
}

async fn instance(store: RedisStore, rules: impl IntoIterator<Item = Rule>) -> Limiter {
    let mut builder = Limiter::builder().store(store);
    for rule in rules {
        builder = builder.rule(rule);
    }
    builder.build().unwrap()
}

async fn on_server(url: &str, prefix: &str, rules: impl IntoIterator<Item = Rule>) -> Limiter {
    let store = RedisStore::builder()
        .url(url)
        .prefix(prefix)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    instance(store, rules).await
}

/// Every page of `rule`'s blocks, walked with the cursor; and the pages' sizes.
async fn walk(limiter: &Limiter, rule: &str) -> (Vec<BlockedKey>, Vec<usize>) {
    every_page(|cursor| limiter.blocks(rule, cursor)).await
}

fn is_denied_for(outcome: &tollgate::algorithm::Outcome, at_most: Duration, at_least: Duration) {
    match outcome.verdict {
        Verdict::Denied { retry_after } => assert!(
            retry_after <= at_most && retry_after >= at_least,
            "{retry_after:?} not in {at_least:?}..={at_most:?}"
        ),
        _ => panic!("admitted: {outcome:?}"),
    }
}

/// A block set through one instance — by its penalty or by hand — is seen by the other on its
/// next decision, listed by it with what is left by the server's clock, and lifted through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_set_through_one_instance_is_seen_and_listed_by_the_other() {
    let server = ENGINE.server();
    let a = on_server(&server.url(), "fleet", [login()]).await;
    let b = on_server(&server.url(), "fleet", [login()]).await;
    let scans = server.command_calls("scan");
    for _ in 0..2 {
        a.charge("login", "203.0.113.9", 1).await.unwrap();
    }
    a.block("login", "admin-pick", HOUR).await.unwrap();
    // B's first decision about either key sees its block.
    let seen = b.charge("login", "203.0.113.9", 1).await.unwrap();
    is_denied_for(&seen, 10 * MINUTE, 9 * MINUTE);
    let seen = b.charge("login", "admin-pick", 1).await.unwrap();
    is_denied_for(&seen, HOUR, HOUR - MINUTE);

    let (mut listed, _) = walk(&b, "login").await;
    listed.sort_by(|x, y| x.key.cmp(&y.key));
    let keys: Vec<&[u8]> = listed.iter().map(|b| b.key.as_slice()).collect();
    assert_eq!(keys, [&b"203.0.113.9"[..], b"admin-pick"]);
    // What is left, by the server's clock: at most the block, and not a minute less.
    assert!(listed[0].remaining <= 10 * MINUTE && listed[0].remaining > 9 * MINUTE);
    assert_eq!(listed[0].offences, 1);
    assert!(listed[1].remaining <= HOUR && listed[1].remaining > HOUR - MINUTE);
    assert_eq!(listed[1].offences, 0);
    assert!(server.command_calls("scan") > scans, "listed with SCAN");
    assert_eq!(server.command_calls("keys"), 0, "never KEYS");

    // Lifted through B: A's next decision admits the key, and neither lists it.
    b.unblock("login", "admin-pick").await.unwrap();
    assert!(a
        .charge("login", "admin-pick", 1)
        .await
        .unwrap()
        .verdict
        .is_admitted());
    assert_eq!(b.blocked("login", "admin-pick").await.unwrap(), None);
    let (listed, _) = walk(&a, "login").await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].key, b"203.0.113.9");
    let one = a.blocked("login", "203.0.113.9").await.unwrap().unwrap();
    assert!(one.remaining <= 10 * MINUTE && one.remaining > 9 * MINUTE);
}

/// The deny cache answers a blocked key locally, but for at most a second at a time: a block
/// lifted through another instance is seen here within that second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_lifted_elsewhere_reaches_a_cached_instance_within_a_second() {
    let server = ENGINE.server();
    let clock = ManualClock::new(Duration::from_secs(1_750_000_000));
    let store = || {
        RedisStore::builder()
            .url(server.url())
            .prefix("cached")
            .clock(clock.clone())
            .timeout(Duration::from_secs(5))
            .build()
    };
    let a = instance(store().await.unwrap(), [login()]).await;
    let b = instance(store().await.unwrap(), [login()]).await;
    a.block("login", "k", HOUR).await.unwrap();
    let calls = || server.command_calls("evalsha");
    let before = calls();
    for _ in 0..20 {
        assert!(!b
            .charge("login", "k", 1)
            .await
            .unwrap()
            .verdict
            .is_admitted());
    }
    assert_eq!(
        calls() - before,
        1,
        "B answers the blocked key from its cache"
    );
    a.unblock("login", "k").await.unwrap();
    clock.advance(Duration::from_secs(1));
    assert!(b
        .charge("login", "k", 1)
        .await
        .unwrap()
        .verdict
        .is_admitted());
}

/// Hundreds of blocks, among other rules' blocks and counters, with keys that need escaping in
/// a key name and a rule and prefix with glob characters: a walk lists each exactly, a page at a
/// time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_walk_lists_every_blocked_key_of_the_rule_and_nothing_else() {
    let server = ENGINE.server();
    let rule =
        |name: &str| Rule::new(name, Limit::per_minute(1)).block(Penalty::fixed(10 * MINUTE));
    let limiter = on_server(&server.url(), "p[1]*", [rule("log*in"), rule("logXin")]).await;
    let mut keys: Vec<Vec<u8>> = (0..250)
        .map(|i| format!("10.0.0.{i}").into_bytes())
        .collect();
    keys.extend([
        b"".to_vec(),
        b"a{b}c".to_vec(),
        b"=x".to_vec(),
        b"pipe|d".to_vec(),
        vec![0xff, 0x00, b'}'],
    ]);
    for key in &keys {
        limiter.block("log*in", key, HOUR).await.unwrap();
    }
    for i in 0..50 {
        limiter
            .block("logXin", format!("x{i}"), HOUR)
            .await
            .unwrap();
        // Counters of the listed rule, beside its blocks.
        limiter.charge("log*in", format!("c{i}"), 1).await.unwrap();
    }
    let (listed, sizes) = walk(&limiter, "log*in").await;
    assert!(sizes.len() >= 2, "{sizes:?}");
    assert!(sizes.iter().all(|&n| n <= 200), "{sizes:?}");
    let unique: HashSet<Vec<u8>> = listed.iter().map(|b| b.key.clone()).collect();
    assert_eq!(unique.len(), listed.len(), "no key listed twice");
    assert_eq!(unique, keys.iter().cloned().collect::<HashSet<_>>());
    let (others, _) = walk(&limiter, "logXin").await;
    assert_eq!(others.len(), 50);
}

/// On a cluster every master is scanned in turn: the walk lists the blocks of all three, and the
/// other instance sees each block on its next decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_walk_on_a_cluster_visits_every_master() {
    let cluster = ENGINE.cluster();
    let store = || {
        RedisStore::builder()
            .cluster(cluster.urls())
            .timeout(Duration::from_secs(2))
            .build()
    };
    let a = instance(store().await.unwrap(), [login()]).await;
    let b = instance(store().await.unwrap(), [login()]).await;
    let keys: Vec<String> = (0..60).map(|i| format!("user-{i}")).collect();
    for key in &keys {
        a.block("login", key, HOUR).await.unwrap();
    }
    let mut nodes_holding = 0;
    for node in &cluster.nodes {
        if node.run("DBSIZE").trim_start_matches(':').trim() != "0" {
            nodes_holding += 1;
        }
    }
    assert_eq!(nodes_holding, 3, "the keys spread over the masters");
    let (listed, sizes) = walk(&b, "login").await;
    assert!(sizes.len() >= 3, "{sizes:?}");
    let unique: HashSet<Vec<u8>> = listed.iter().map(|b| b.key.clone()).collect();
    assert_eq!(
        unique,
        keys.iter()
            .map(|k| k.clone().into_bytes())
            .collect::<HashSet<_>>()
    );
    assert!(listed
        .iter()
        .all(|b| b.remaining <= HOUR && b.remaining > HOUR - MINUTE));
    for key in keys.iter().step_by(7) {
        let seen = b.charge("login", key, 1).await.unwrap();
        is_denied_for(&seen, HOUR, HOUR - MINUTE);
        b.unblock("login", key).await.unwrap();
        assert_eq!(a.blocked("login", key).await.unwrap(), None);
    }
    let (left, _) = walk(&a, "login").await;
    assert_eq!(left.len(), 60 - keys.iter().step_by(7).count());
}
