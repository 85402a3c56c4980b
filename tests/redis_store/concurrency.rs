//! Concurrency limits (DESIGN §12) on a real `redis-server` shared by two app instances: exactly
//! `n` in flight across both, slots as leases renewed while a response streams, and the leases of
//! an instance that died coming back by themselves after their expiry.

#![cfg(feature = "redis")]

use crate::support::redis_server;
use crate::support::streams;

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, Request, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use tollgate::config::Config;
use tollgate::{FailurePolicy, Key, Limit, Limiter, Queue, RateLimitLayer, RedisStore, Rule};
use tower::ServiceExt;

use super::ENGINE;
use redis_server::RedisServer;
use streams::streaming;

const API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// A store on `server` whose calls may take long on a loaded machine: a timeout would fail the
/// request closed (503), never over-admit, but the counts below must be exact.
async fn store(server: &RedisServer, lease: Duration) -> RedisStore {
    RedisStore::builder()
        .url(server.url())
        .timeout(Duration::from_secs(10))
        .lease(lease)
        .build()
        .await
        .unwrap()
}

fn llm(n: u64) -> Rule {
    Rule::new("llm", Limit::concurrent(n)).key(Key::header(API_KEY))
}

async fn layer(server: &RedisServer, rules: Vec<Rule>, lease: Duration) -> RateLimitLayer {
    let mut builder = RateLimitLayer::builder()
        .store(store(server, lease).await)
        .on_store_failure(FailurePolicy::Closed);
    for rule in rules {
        builder = builder.rule(rule);
    }
    builder.build().unwrap()
}

fn request(id: u32) -> Request<Full<Bytes>> {
    Request::get("/v1/chat")
        .header(API_KEY, "alice")
        .header("x-id", id)
        .body(Full::default())
        .unwrap()
}

async fn free_slots(limiter: &Limiter) -> u64 {
    limiter.check("llm", "alice", 0).await.unwrap().remaining
}

/// Waits (bounded) for something Redis does by itself or a background task finishes: a lease's
/// expiry, a slot given back. Not a measure of speed: only that it happens.
async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    mut check: impl FnMut() -> F,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "{what} did not happen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_n_in_flight_across_two_instances_under_1000_concurrent_requests() {
    let server = ENGINE.server();
    let lease = Duration::from_secs(60);
    let first = layer(&server, vec![llm(8)], lease).await;
    let second = layer(&server, vec![llm(8)], lease).await;
    let (open_first, app_first) = streaming(&first);
    let (open_second, app_second) = streaming(&second);
    let tasks: Vec<_> = (0..1000)
        .map(|id| {
            let (first, second) = (app_first.clone(), app_second.clone());
            tokio::spawn(async move {
                if id % 2 == 0 {
                    first.oneshot(request(id)).await.unwrap()
                } else {
                    second.oneshot(request(id)).await.unwrap()
                }
            })
        })
        .collect();
    let mut admitted = Vec::new();
    let mut denied = 0;
    for task in tasks {
        let response = task.await.unwrap();
        match response.status() {
            StatusCode::OK => admitted.push(response),
            StatusCode::TOO_MANY_REQUESTS => denied += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!((admitted.len(), denied), (8, 992));
    let reached = open_first.lock().unwrap().len() + open_second.lock().unwrap().len();
    assert_eq!(reached, 8);
    // Redis holds exactly eight leases for the key.
    assert_eq!(server.run("ZCARD tollgate:{alice}:llm").trim(), ":8");
    assert_eq!(free_slots(first.limiter()).await, 0);
    assert_eq!(free_slots(second.limiter()).await, 0);

    // The bodies end: every lease is removed, on both instances.
    drop(admitted);
    eventually("every slot given back", || async {
        free_slots(first.limiter()).await == 8
    })
    .await;
    assert_eq!(server.run("EXISTS tollgate:{alice}:llm").trim(), ":0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_body_keeps_its_lease_renewed_past_the_expiry() {
    let server = ENGINE.server();
    // Renewed every 2/3 s: a loaded machine would have to stall a renewal for 4/3 s to lose it.
    let lease = Duration::from_secs(2);
    let first = layer(&server, vec![llm(1)], lease).await;
    let second = layer(&server, vec![llm(1)], lease).await;
    let (open, app_first) = streaming(&first);
    let (_, app_second) = streaming(&second);
    let response = app_first.clone().oneshot(request(1)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let sender = open.lock().unwrap()[0].1.clone();
    // The stream outlives its lease three times over; renewed, the slot stays taken.
    for chunk in ["a", "b", "c"] {
        tokio::time::sleep(lease).await;
        sender
            .unbounded_send(Ok(Frame::data(Bytes::from(chunk))))
            .unwrap();
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            chunk
        );
        let refused = app_second.clone().oneshot(request(2)).await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    // The stream ends: the lease goes, and the other instance gets the slot.
    drop(sender);
    open.lock().unwrap().clear();
    assert!(body.frame().await.is_none());
    eventually("the slot given back", || async {
        app_second
            .clone()
            .oneshot(request(3))
            .await
            .unwrap()
            .status()
            == StatusCode::OK
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instance_s_leases_come_back_after_their_expiry() {
    let server = ENGINE.server();
    let lease = Duration::from_secs(1);
    // An instance on its own runtime takes both slots, then dies: its runtime stops (with the
    // renewal task and the connection), and nothing gives its slots back.
    let crashed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let url = server.url();
    let guards = crashed
        .spawn(async move {
            let store = RedisStore::builder()
                .url(url)
                .timeout(Duration::from_secs(10))
                .lease(Duration::from_secs(1))
                .build()
                .await
                .unwrap();
            let limiter = Limiter::builder()
                .rule(llm(2))
                .store(store)
                .build()
                .unwrap();
            let a = limiter.acquire("llm", "alice").await.unwrap().unwrap();
            let b = limiter.acquire("llm", "alice").await.unwrap().unwrap();
            (a, b)
        })
        .await
        .unwrap();
    std::mem::forget(guards);
    crashed.shutdown_background();

    let survivor = Limiter::builder()
        .rule(llm(2))
        .store(store(&server, lease).await)
        .build()
        .unwrap();
    assert!(survivor.acquire("llm", "alice").await.unwrap().is_none());
    assert_eq!(server.run("ZCARD tollgate:{alice}:llm").trim(), ":2");
    // Nobody renews them: after the expiry the next look purges both, and both slots are free.
    eventually("the dead instance's leases expiring", || async {
        free_slots(&survivor).await == 2
    })
    .await;
    let a = survivor.acquire("llm", "alice").await.unwrap();
    let b = survivor.acquire("llm", "alice").await.unwrap();
    assert!(a.is_some() && b.is_some());
    assert!(survivor.acquire("llm", "alice").await.unwrap().is_none());
}

/// A customer's plan, put in the request's extensions by an auth layer.
#[derive(Clone)]
struct InFlight(u64);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_customer_has_the_number_of_slots_its_plan_gives_across_two_instances() {
    let server = ENGINE.server();
    let rule = || llm(1).limit_from_extension(|plan: &InFlight| Some(Limit::concurrent(plan.0)));
    let one = layer(&server, vec![rule()], Duration::from_secs(60)).await;
    let two = layer(&server, vec![rule()], Duration::from_secs(60)).await;
    let (_, first) = streaming(&one);
    let (_, second) = streaming(&two);
    let on_plan = |id| {
        let mut request = request(id);
        request.extensions_mut().insert(InFlight(3));
        request
    };
    let mut held = Vec::new();
    let mut statuses = Vec::new();
    for id in 0..4 {
        let app = if id % 2 == 0 { &first } else { &second };
        let response = app.clone().oneshot(on_plan(id)).await.unwrap();
        statuses.push(response.status());
        held.push(response);
    }
    let (ok, over) = (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(statuses, [ok, ok, ok, over]);
    // Without the plan, the rule's own limit of one: three are already in flight.
    let plain = second.clone().oneshot(request(9)).await.unwrap();
    assert_eq!(plain.status(), over);
    drop(held);
    eventually("the three slots given back", || async {
        free_slots(one.limiter()).await == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_is_taken_all_or_nothing_with_the_other_rules() {
    let server = ENGINE.server();
    let daily = Rule::new("daily", Limit::per_day(2)).key(Key::header(API_KEY));
    let layer = layer(&server, vec![llm(1), daily], Duration::from_secs(60)).await;
    let limiter = layer.limiter().clone();
    let (_open, app) = streaming(&layer);
    let remaining = |rule: &'static str| {
        let limiter = limiter.clone();
        async move { limiter.check(rule, "alice", 0).await.unwrap().remaining }
    };
    let a = app.clone().oneshot(request(1)).await.unwrap();
    assert_eq!(a.status(), StatusCode::OK);
    // Denied for lack of a slot: the daily quota is not charged.
    let b = app.clone().oneshot(request(2)).await.unwrap();
    assert_eq!(b.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(remaining("daily").await, 1);
    drop(a);
    eventually("the slot given back", || async {
        remaining("llm").await == 1
    })
    .await;
    let c = app.clone().oneshot(request(3)).await.unwrap();
    assert_eq!(c.status(), StatusCode::OK);
    drop(c);
    eventually("the slot given back", || async {
        remaining("llm").await == 1
    })
    .await;
    // Denied by the daily quota: no lease is added.
    let d = app.clone().oneshot(request(4)).await.unwrap();
    assert_eq!(d.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = d.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("\"violated-policies\":[\"daily\"]"));
    assert_eq!(server.run("EXISTS tollgate:{alice}:llm").trim(), ":0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_gets_a_slot_given_back_by_another_instance() {
    let server = ENGINE.server();
    let lease = Duration::from_secs(60);
    let first = layer(&server, vec![llm(1)], lease).await;
    let queued = llm(1).queue(Queue::burst(2));
    let second = layer(&server, vec![queued], lease).await;
    let (open_first, app_first) = streaming(&first);
    let (open_second, app_second) = streaming(&second);
    let held = app_first.clone().oneshot(request(1)).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let asked = server.command_calls("evalsha");
    let waiting = tokio::spawn(app_second.clone().oneshot(request(2)));
    // The second instance asked for the slot, was refused, and looks again while it waits in
    // line: two calls of the script, and the request still waiting.
    eventually("the waiting instance looking again", || async {
        server.command_calls("evalsha") >= asked + 2
    })
    .await;
    assert!(!waiting.is_finished());
    assert!(open_second.lock().unwrap().is_empty());
    // The first instance's response ends; the second finds the slot free when it looks again.
    drop(held);
    open_first.lock().unwrap().clear();
    let response = waiting.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().contains_key("tollgate-delay"));
    assert_eq!(open_second.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_sharded_concurrency_rule_is_an_error() {
    let server = ENGINE.server();
    let store = RedisStore::builder()
        .url(server.url())
        .shard_rule("llm", 4)
        .build()
        .await
        .unwrap();
    let error = Limiter::builder()
        .rule(llm(8))
        .store(store)
        .build()
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "rule \"llm\": concurrent: a concurrency rule cannot be sharded over several Redis keys: \
         its leases live in one"
    );
}

#[cfg(feature = "config")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_from_a_config_file() {
    let server = ENGINE.server();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    std::fs::write(
        &path,
        format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\nlease = \"2s\"\n\n[[rules]]\nname = \"llm\"\n\
             concurrent = 1\nkey = {{ header = \"x-api-key\" }}\n",
            server.url()
        ),
    )
    .unwrap();
    let layer = Config::read(&path).unwrap().connect().await.unwrap();
    let slot = layer.limiter().acquire("llm", "alice").await.unwrap();
    assert!(slot.is_some());
    // The lease expires two seconds after it was taken (or last renewed), by the server's clock.
    let ttl: u64 = server
        .run("PTTL tollgate:{alice}:llm")
        .trim()
        .trim_start_matches(':')
        .parse()
        .unwrap();
    assert!((1..=2_000).contains(&ttl), "{ttl}");
    assert!(layer
        .limiter()
        .acquire("llm", "alice")
        .await
        .unwrap()
        .is_none());
}

/// On a Redis Cluster a concurrency rule and a rule of another key value live in different
/// slots: the request is applied slot by slot, and a slot taken in the first is given back
/// (its lease removed) when the second denies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_lease_is_undone_when_a_later_slot_denies() {
    let cluster = ENGINE.cluster();
    let store = RedisStore::builder()
        .cluster(cluster.urls())
        .timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let slot = |name: &[u8]| -> u16 {
        let name = String::from_utf8(name.to_vec()).unwrap();
        cluster.nodes[0].run(&format!("CLUSTER KEYSLOT {name}"))[1..]
            .trim()
            .parse()
            .unwrap()
    };
    let daily_slot = slot(&store.key_names("daily", b"")[0]);
    // A key whose slot comes first: its group (the slot) is applied before the daily one's.
    let key = (0..100)
        .map(|i| format!("k{i}"))
        .find(|key| slot(&store.key_names("llm", key.as_bytes())[0]) < daily_slot)
        .expect("a key in a lower slot");
    let name = String::from_utf8(store.key_names("llm", key.as_bytes())[0].clone()).unwrap();
    let node = &cluster.nodes[cluster.node_of_slot(slot(name.as_bytes()))];
    let limiter = Limiter::builder()
        .rule(Rule::new("llm", Limit::concurrent(1)))
        .rule(Rule::new("daily", Limit::per_day(1)))
        .store(store)
        .build()
        .unwrap();
    let both = || [("llm", key.clone()), ("daily", String::new())].map(|(r, k)| (r, k, 1));

    let first = limiter.charge_all(both()).await.unwrap();
    assert!(first.is_allowed());
    assert_eq!(node.run(&format!("ZCARD {name}")).trim(), ":1");
    limiter.refund("llm", &key, 1).await.unwrap();
    assert_eq!(node.run(&format!("EXISTS {name}")).trim(), ":0");

    // The daily quota is spent: the slot taken in the first group is undone.
    let second = limiter.charge_all(both()).await.unwrap();
    assert!(!second.is_allowed());
    assert!(!second.rule("daily").unwrap().outcome.is_allowed());
    assert_eq!(node.run(&format!("EXISTS {name}")).trim(), ":0");
    assert_eq!(limiter.check("llm", &key, 0).await.unwrap().remaining, 1);
}
