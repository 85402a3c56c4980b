//! The Redis store on a real three-master Redis Cluster on loopback ports: rules of one request in
//! one slot are one script call; rules in several slots are applied slot by slot and never
//! over-admit; sharded rules spread over the nodes.

#![cfg(feature = "redis")]

use crate::differential;
use crate::support::hammer;
use crate::support::redis_server;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use tollgate::algorithm::{Algorithm, Mode, TokenBucket, Verdict};
use tollgate::store::{Charge, Outcomes, RuleName, Store};
use tollgate::{Key, Limit, Limiter, RedisStore, Rule};

use super::ENGINE;
use hammer::hammer;
use redis_server::RedisCluster;

fn slot_of(cluster: &RedisCluster, name: &[u8]) -> u16 {
    let name = String::from_utf8(name.to_vec()).unwrap();
    cluster.nodes[0].run(&format!("CLUSTER KEYSLOT {name}"))[1..]
        .trim()
        .parse()
        .unwrap()
}

async fn cluster_store(cluster: &RedisCluster) -> RedisStore {
    prefixed(cluster, "tollgate").await
}

async fn prefixed(cluster: &RedisCluster, prefix: &str) -> RedisStore {
    RedisStore::builder()
        .cluster(cluster.urls())
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
        .deny_cache(false)
        .build()
        .await
        .expect("connect to the cluster")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_with_one_key_value_share_a_slot_and_one_call() {
    let cluster = ENGINE.cluster();
    let store = cluster_store(&cluster).await;
    // Our slot computation is the cluster's.
    for (rule, key) in [
        ("per-user", "alice"),
        ("x", ""),
        ("y", "a{b}c"),
        ("z", "=q"),
    ] {
        for name in store.key_names(rule, key.as_bytes()) {
            let ours = slot_of(&cluster, &name);
            let name_text = String::from_utf8(name.clone()).unwrap();
            assert_eq!(
                cluster.nodes[0].run(&format!("CLUSTER KEYSLOT {name_text}"))[1..].trim(),
                ours.to_string()
            );
        }
    }
    let a = store.key_names("per-user", b"alice").remove(0);
    let b = store.key_names("per-user-writes", b"alice").remove(0);
    assert_eq!(slot_of(&cluster, &a), slot_of(&cluster, &b));
    let limiter = Limiter::builder()
        .rule(
            Rule::new("per-user", Limit::per_day(5))
                .key(Key::header(http::HeaderName::from_static("x-user"))),
        )
        .rule(
            Rule::new("per-user-writes", Limit::per_day(2))
                .key(Key::header(http::HeaderName::from_static("x-user"))),
        )
        .store(store.clone())
        .build()
        .unwrap();
    let layer = tollgate::RateLimitLayer::from_limiter(limiter)
        .build()
        .unwrap();
    use tower::{Layer, ServiceExt};
    let service = layer.layer(tower::service_fn(|_req: http::Request<String>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    }));
    let before = cluster.command_calls("evalsha");
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let request = http::Request::get("/")
            .header("x-user", "alice")
            .body(String::new())
            .unwrap();
        statuses.push(
            service
                .clone()
                .oneshot(request)
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
    assert_eq!(
        cluster.command_calls("evalsha") - before,
        4,
        "one call per request"
    );
}

const DAY: Duration = Duration::from_secs(86_400);

/// A request charging `per-user` for `user` and `global`, straight through the store.
async fn request(store: &RedisStore, user: &str, per_user: u64, global: u64) -> Outcomes {
    let per_user = Algorithm::TokenBucket(TokenBucket::new(per_user, DAY));
    let global = Algorithm::TokenBucket(TokenBucket::new(global, DAY));
    let batch = [
        Charge::new(RuleName::new("per-user"), &per_user, user.as_bytes(), 1),
        Charge::new(RuleName::new("global"), &global, b"", 1),
    ];
    store.apply(&batch).await.expect("the cluster answers")
}

async fn global_left(store: &RedisStore, global: u64) -> u64 {
    let global = Algorithm::TokenBucket(TokenBucket::new(global, DAY));
    let peek = [Charge::new(RuleName::new("global"), &global, b"", 0).with_mode(Mode::Check)];
    store.apply(&peek).await.unwrap()[0].remaining
}

/// A per-user rule and a global rule live in different slots: the request is applied slot by
/// slot, and a denial in a later slot gives back what the earlier one took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_slot_requests_are_compensated_and_never_over_admit() {
    let cluster = ENGINE.cluster();
    let store = cluster_store(&cluster).await;
    let global_slot = slot_of(&cluster, &store.key_names("global", b"")[0]);
    // Users whose slot comes after the global key's (global charged first, then undone) and
    // before it (the user's denial stops the request before the global slot).
    for global_first in [true, false] {
        let user = (0..)
            .map(|i| format!("user{i}"))
            .find(|user| {
                let slot = slot_of(&cluster, &store.key_names("per-user", user.as_bytes())[0]);
                slot != global_slot && (slot > global_slot) == global_first
            })
            .unwrap();
        let before = global_left(&store, 40).await;
        let first = request(&store, &user, 1, 40).await;
        assert!(first.iter().all(|o| o.verdict.is_admitted()), "{first:?}");
        assert_eq!(first[1].remaining, before - 1);
        let calls = cluster.command_calls("evalsha");
        let second = request(&store, &user, 1, 40).await;
        let used = cluster.command_calls("evalsha") - calls;
        assert!(!second[0].verdict.is_admitted(), "{second:?}");
        assert_eq!(second[1].verdict, Verdict::Allowed);
        assert_eq!(second[1].remaining, before - 1, "reported uncharged");
        assert_eq!(
            global_left(&store, 40).await,
            before - 1,
            "global first: {global_first}"
        );
        // Global first: charge global, deny user, undo global. User first: deny user, check
        // global.
        let expected = if global_first { 3 } else { 2 };
        assert_eq!(used, expected);
    }

    // Many users from two app instances: the global limit holds exactly, no user passes its own,
    // and once the compensations are done every global unit is accounted for.
    let instances = [
        prefixed(&cluster, "crowd").await,
        prefixed(&cluster, "crowd").await,
    ];
    let per_user: Arc<Vec<AtomicUsize>> = Arc::new((0..12).map(|_| AtomicUsize::new(0)).collect());
    let mut tasks = Vec::new();
    for (i, store) in instances.iter().enumerate() {
        for t in 0..4 {
            let (store, per_user) = (store.clone(), per_user.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..12 {
                    let user = (i * 4 + t + round) % 12;
                    let outcomes = request(&store, &format!("crowd{user}"), 3, 20).await;
                    if outcomes.iter().all(|o| o.verdict.is_admitted()) {
                        per_user[user].fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let counts: Vec<usize> = per_user.iter().map(|c| c.load(Ordering::SeqCst)).collect();
    let admitted: usize = counts.iter().sum();
    assert!(counts.iter().all(|&c| c <= 3), "{counts:?}");
    assert!(admitted <= 20, "never over the global limit: {admitted}");
    assert_eq!(
        admitted as u64 + global_left(&instances[0], 20).await,
        20,
        "{counts:?}"
    );
}

/// The scripts of a cross-slot request (the charge, the undo of an earlier slot's charge, the
/// check of a later slot) are sent again after `NOSCRIPT` on every node (here `SCRIPT FLUSH`):
/// by their source, once to each node that needs one, then by hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_slot_request_s_scripts_are_sent_again_after_noscript() {
    let cluster = ENGINE.cluster();
    let store = cluster_store(&cluster).await;
    let global_slot = slot_of(&cluster, &store.key_names("global", b"")[0]);
    let user = |global_first: bool| {
        (0..)
            .map(|i| format!("user{i}"))
            .find(|user| {
                let slot = slot_of(&cluster, &store.key_names("per-user", user.as_bytes())[0]);
                slot != global_slot && (slot > global_slot) == global_first
            })
            .unwrap()
    };
    let (after, before) = (user(true), user(false));
    for user in [&after, &before] {
        assert!(request(&store, user, 1, 40)
            .await
            .iter()
            .all(|o| o.verdict.is_admitted()));
    }
    for node in &cluster.nodes {
        node.run("SCRIPT FLUSH");
    }
    let (loads, evals) = (
        cluster.command_calls("script|load"),
        cluster.command_calls("eval"),
    );
    // Global first: charge global, deny the user, undo global. The user first: deny the user,
    // check global.
    for user in [&after, &before] {
        let outcomes = request(&store, user, 1, 40).await;
        assert!(!outcomes[0].verdict.is_admitted(), "{outcomes:?}");
        assert_eq!(outcomes[1].verdict, Verdict::Allowed, "{outcomes:?}");
        assert_eq!(outcomes[1].remaining, 38, "reported uncharged");
    }
    // Three scripts, each sent by its source once to each node that did not know it.
    let masters = cluster.nodes.len() as u64;
    let sent = cluster.command_calls("eval") - evals;
    assert!((3..=3 * masters).contains(&sent), "{sent} EVALs");
    assert_eq!(cluster.command_calls("script|load") - loads, 0);
    for user in [&after, &before] {
        request(&store, user, 1, 40).await;
    }
    assert_eq!(
        cluster.command_calls("eval") - evals,
        sent,
        "known by hash since"
    );
}

/// Scenarios (`config`'s) through the cluster (cross-slot batches, compensations) against the
/// memory store, each run with the store's defaults (deny cache on) and with the deny cache off.
fn differential_cases(config: ProptestConfig) {
    let cluster = ENGINE.cluster();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(config);
    let case = AtomicUsize::new(0);
    runner
        .run(&differential::scenario(), |scenario| {
            rt.block_on(async {
                let case = case.fetch_add(1, Ordering::Relaxed);
                let redis = || RedisStore::builder().cluster(cluster.urls());
                let prefix = format!("diff{case}");
                differential::run_with_and_without_deny_cache(redis, &prefix, &scenario).await;
            });
            Ok(())
        })
        .unwrap();
}

/// 1 024 scenarios in the test command (each with the deny cache on and off), the same ones on
/// every run (`differential::config`); the soak below draws new ones. The undo heuristic of
/// issue 13 (bug 2) failed about one run in 30 at 32 random scenarios, and 2 runs in 4 at 512 —
/// random scenarios find such a case only now and then, so the shrunk case below is kept as its
/// own test, which catches it on every run.
#[test]
fn same_answers_as_the_memory_store_across_slots_1024_scenarios() {
    differential_cases(differential::config(1_024));
}

/// The soak: `cargo test --all-features --test redis_store redis::cluster -- --ignored`.
#[test]
#[ignore = "soak: 20 000 scenarios, several minutes"]
fn same_answers_as_the_memory_store_across_slots_soak() {
    differential_cases(differential::soak_config(20_000));
}

/// Issue 13, bug 2, shrunk: a refund of 0 creates a burst pool's key (initial balance below the
/// capacity) at t; at the same instant a cross-slot batch charges it and the other rule denies,
/// so the charge is undone. The key existed before the charge: the undo must keep it (it refills
/// from t), not delete it because it equals a new key's state at t. 232 ms later a charge of 8
/// leaves 18 (2 + 2 steady units, 20 + 2 pool units, minus 8), not 14.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undoing_a_charge_keeps_a_key_a_refund_created_and_8_more_leave_18() {
    use differential::Step;
    use tollgate::algorithm::{BurstPool, FixedWindow};
    let cluster = ENGINE.cluster();
    let second = Duration::from_secs(1);
    let pool = Algorithm::BurstPool(BurstPool::new(
        TokenBucket::new(10, second).with_initial(2),
        TokenBucket::new(10, second)
            .with_capacity(30)
            .with_initial(20),
    ));
    let window = Algorithm::FixedWindow(FixedWindow::new(1, Duration::from_secs(60)));
    // Both orders of the two key values: in one, the pool's slot comes first and is undone.
    for (case, (a, b)) in [(1, 2), (2, 1)].into_iter().enumerate() {
        let steps = vec![
            Step::Apply(vec![(1, b, 1, Mode::Charge)]),
            Step::Refund(0, a, 0),
            Step::Apply(vec![(0, a, 1, Mode::Charge), (1, b, 1, Mode::Charge)]),
            Step::Advance(232_000),
            Step::Apply(vec![(0, a, 8, Mode::Charge)]),
        ];
        let scenario = (
            1_750_000_000_000_000,
            vec![(pool.clone(), None), (window.clone(), None)],
            steps,
        );
        let redis = || RedisStore::builder().cluster(cluster.urls());
        let prefix = format!("undo{case}");
        for outcomes in
            differential::run_with_and_without_deny_cache(redis, &prefix, &scenario).await
        {
            assert_eq!(outcomes.last().unwrap()[0].remaining, 18);
        }
    }
}

/// Found by the differential test once requests brought their own limits (DESIGN §13): a
/// cross-slot batch denied in one slot undoes the charge made in another, and that undo must
/// leave the state the charge found. A bucket full for longer than its refill time (10 a
/// second, idle for 5 s) is charged from full; given the units back, it read as full since the
/// undo, and a capacity of 20 then found 10 there instead of the 20 the memory store has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undone_charge_leaves_the_state_it_found_for_a_larger_limit_to_read() {
    use differential::Step;
    let cluster = ENGINE.cluster();
    let second = Duration::from_secs(1);
    let bucket = Algorithm::TokenBucket(TokenBucket::new(10, second));
    let larger = Algorithm::TokenBucket(TokenBucket::new(10, second).with_capacity(20));
    let single = Algorithm::TokenBucket(TokenBucket::new(1, Duration::from_secs(60)));
    // Both orders of the two key values: in one, the bucket's slot comes first and is undone.
    for (case, (a, b)) in [(1, 2), (2, 1)].into_iter().enumerate() {
        let steps = vec![
            Step::Apply(vec![(0, b, 1, Mode::Charge)]),
            Step::Advance(5_000_000),
            Step::Apply(vec![(1, a, 1, Mode::Charge)]),
            Step::Apply(vec![(1, a, 1, Mode::Charge), (0, b, 1, Mode::Charge)]),
            Step::ApplyUnder(vec![(0, b, 0, Mode::Check, larger.clone())]),
        ];
        let scenario = (
            1_750_000_000_000_000,
            vec![(bucket.clone(), None), (single.clone(), None)],
            steps,
        );
        let redis = || RedisStore::builder().cluster(cluster.urls());
        let prefix = format!("found{case}");
        for outcomes in
            differential::run_with_and_without_deny_cache(redis, &prefix, &scenario).await
        {
            assert!(!outcomes[2][0].verdict.is_admitted());
            assert_eq!(outcomes.last().unwrap()[0].remaining, 20);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_global_rule_spreads_over_nodes() {
    let cluster = ENGINE.cluster();
    let store = RedisStore::builder()
        .cluster(cluster.urls())
        .shard_rule("global", 6)
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let nodes: HashSet<usize> = store
        .key_names("global", b"")
        .iter()
        .map(|name| cluster.node_of_slot(slot_of(&cluster, name)))
        .collect();
    assert!(nodes.len() >= 2, "shards on nodes {nodes:?}");
    let limiter = Limiter::builder()
        .rule(Rule::new("global", Limit::per_day(60)))
        .store(store)
        .build()
        .unwrap();
    let admitted = hammer(std::slice::from_ref(&limiter), "global", 4, 60).await;
    assert!(admitted <= 60, "never over the limit: {admitted}");
    assert!(
        admitted >= 50,
        "the shards are used evenly enough: {admitted}"
    );
}
