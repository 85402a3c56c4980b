//! Top offenders: the keys each rule denied most, read from the layer that denied them, with the
//! gauge of how much of its limit the most denied key has used.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::Full;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tollgate::middleware::TopOffenders;
use tollgate::{Key, Limit, LimitError, Limiter, RateLimitLayer, Rule};
use tower::{service_fn, Layer};

use crate::support::oneshot;
use oneshot::{send, Limited};

use crate::support::metric;
use crate::support::paused;

#[cfg(feature = "redis")]
use crate::support::redis_server;

type Body = Full<Bytes>;

/// A rule keyed by the `x-api-key` header.
fn per_key(name: &str, limit: Limit) -> Rule {
    Rule::new(name, limit).key(Key::header(HeaderName::from_static("x-api-key")))
}

async fn ok(_request: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::default()))
}

fn app(layer: &RateLimitLayer) -> impl Limited<Body> {
    layer.layer(service_fn(ok))
}

/// Sends `n` requests with `api_key`; how many were denied.
async fn send_as<S: Limited<Body>>(service: &S, api_key: &str, n: u64) -> u64 {
    let mut denied = 0;
    for _ in 0..n {
        let request = Request::get("/")
            .header("x-api-key", api_key)
            .body(Body::default())
            .unwrap();
        match send(service, request).await.status() {
            StatusCode::OK => {}
            StatusCode::TOO_MANY_REQUESTS => denied += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    denied
}

/// (key, denied, error) of each listed offender, in order.
fn listed(top: &TopOffenders) -> Vec<(&str, u64, u64)> {
    top.offenders
        .iter()
        .map(|o| (o.key.as_str(), o.denied, o.error))
        .collect()
}

/// The value of gauge `name` for `rule`.
fn gauge(snapshotter: &Snapshotter, name: &str, rule: &str) -> Option<f64> {
    match metric::of_rule(snapshotter, name, rule)? {
        DebugValue::Gauge(v) => Some(v.into_inner()),
        _ => None,
    }
}

#[tokio::test(start_paused = true)]
async fn denied_keys_are_listed_with_their_counts_and_allowed_ones_are_not() {
    let layer = paused::layer(per_key("per-key", Limit::per_minute(2)));
    let service = app(&layer);
    assert_eq!(send_as(&service, "carol", 2).await, 0);
    assert_eq!(send_as(&service, "alice", 5).await, 3);
    assert_eq!(send_as(&service, "bob", 4).await, 2);
    assert_eq!(send_as(&service, "alice", 1).await, 1);

    let top = layer.top_offenders("per-key").await.unwrap();
    assert_eq!(top.rule, "per-key");
    assert_eq!(top.denials, 6);
    assert_eq!(top.capacity, 64);
    assert_eq!(listed(&top), [("alice", 4, 0), ("bob", 2, 0)]);
    // Fewer keys than counters: nothing was evicted, so every denied key is listed.
    assert_eq!(top.guaranteed_above(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_gauge_reads_how_much_of_its_limit_the_most_denied_key_has_used() {
    let recorder = DebuggingRecorder::new();
    let metrics = recorder.snapshotter();
    let layer = metrics::with_local_recorder(&recorder, || {
        paused::builder()
            .rule(per_key("per-key", Limit::per_minute(4)))
            .rule(per_key("roomy", Limit::per_minute(100)))
            .build()
            .unwrap()
    });
    let service = app(&layer);
    const GAUGE: &str = "tollgate_top_offender_utilisation";
    assert_eq!(send_as(&service, "alice", 6).await, 2);
    assert_eq!(send_as(&service, "bob", 5).await, 1);
    // Registered with the rules, set only when a list is read.
    assert_eq!(gauge(&metrics, GAUGE, "per-key"), Some(0.0));

    let top = layer.top_offenders("per-key").await.unwrap();
    assert_eq!(listed(&top)[0], ("alice", 2, 0));
    assert_eq!(top.utilisation, Some(1.0));
    assert_eq!(gauge(&metrics, GAUGE, "per-key"), Some(1.0));

    // Four a minute: half a minute later two units are back, half the limit.
    tokio::time::advance(Duration::from_secs(30)).await;
    let top = layer.top_offenders("per-key").await.unwrap();
    assert_eq!(top.utilisation, Some(0.5));
    assert_eq!(gauge(&metrics, GAUGE, "per-key"), Some(0.5));
    // Reading charged nothing: alice still has exactly those two units.
    assert_eq!(send_as(&service, "alice", 3).await, 1);

    // A rule that denied nothing has no offender: no utilisation, and the gauge says 0.
    let roomy = layer.top_offenders("roomy").await.unwrap();
    assert!(roomy.offenders.is_empty());
    assert_eq!((roomy.denials, roomy.utilisation), (0, None));
    assert_eq!(gauge(&metrics, GAUGE, "roomy"), Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn shadow_rules_list_the_keys_they_would_have_denied() {
    let layer = paused::builder()
        .rule(per_key("trial", Limit::per_minute(1)).shadow(true))
        .build()
        .unwrap();
    let service = app(&layer);
    assert_eq!(send_as(&service, "alice", 4).await, 0, "never enforced");
    let top = layer.top_offenders("trial").await.unwrap();
    assert_eq!(listed(&top), [("alice", 3, 0)]);

    // The layer's shadow switch: every rule would deny, none does, all are listed.
    let layer = paused::builder()
        .rule(per_key("new-limit", Limit::per_minute(2)))
        .shadow(true)
        .build()
        .unwrap();
    let service = app(&layer);
    assert_eq!(send_as(&service, "bob", 5).await, 0);
    let top = layer.top_offenders("new-limit").await.unwrap();
    assert_eq!(listed(&top), [("bob", 3, 0)]);
}

#[tokio::test(start_paused = true)]
async fn a_rule_is_charged_with_the_denials_it_made_not_those_of_other_rules() {
    let layer = paused::builder()
        .rule(per_key("per-key", Limit::per_minute(2)))
        .rule(Rule::new("everyone", Limit::per_minute(3)))
        .build()
        .unwrap();
    let service = app(&layer);
    // alice: 2 admitted, then 2 denied by her own rule ("everyone" would admit them, and is not
    // charged). bob: 1 admitted, the third of "everyone"; then "everyone" denies him twice
    // while his own rule would admit him.
    assert_eq!(send_as(&service, "alice", 4).await, 2);
    assert_eq!(send_as(&service, "bob", 3).await, 2);
    let per_key = layer.top_offenders("per-key").await.unwrap();
    let everyone = layer.top_offenders("everyone").await.unwrap();
    assert_eq!(listed(&per_key), [("alice", 2, 0)]);
    // The "everyone" rule has one key, the empty one.
    assert_eq!(listed(&everyone), [("", 2, 0)]);
}

#[tokio::test(start_paused = true)]
async fn the_capacity_bounds_the_list_and_the_heavy_key_stays_in_it() {
    let layer = paused::builder()
        .rule(per_key("per-key", Limit::per_minute(1)))
        .top_offenders(2)
        .build()
        .unwrap();
    let service = app(&layer);
    for key in ["b", "c", "d"] {
        assert_eq!(send_as(&service, key, 2).await, 1);
    }
    assert_eq!(send_as(&service, "a", 11).await, 10);
    let top = layer.top_offenders("per-key").await.unwrap();
    assert_eq!((top.denials, top.capacity), (13, 2));
    // a was denied 10 times, more than 13 / 2 = 6: it must be listed. It took over a counter
    // holding 1 (c's, the error), so it reads 11. d took over b's: 2, error 1.
    assert_eq!(top.guaranteed_above(), 6);
    assert_eq!(listed(&top), [("a", 11, 1), ("d", 2, 1)]);
    // Off: nothing is kept.
    let layer = paused::builder()
        .rule(per_key("per-key", Limit::per_minute(1)))
        .top_offenders(0)
        .build()
        .unwrap();
    assert_eq!(send_as(&app(&layer), "a", 3).await, 2);
    let top = layer.top_offenders("per-key").await.unwrap();
    assert!(top.offenders.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_reload_keeps_the_lists_of_rules_that_keep_their_name() {
    let layer = paused::layer(per_key("per-key", Limit::per_minute(1)));
    let service = app(&layer);
    assert_eq!(send_as(&service, "alice", 3).await, 2);
    layer
        .reload([
            per_key("per-key", Limit::per_minute(1)),
            per_key("new", Limit::per_minute(1)),
        ])
        .unwrap();
    assert_eq!(send_as(&service, "alice", 1).await, 1);
    let kept = layer.top_offenders("per-key").await.unwrap();
    assert_eq!(listed(&kept), [("alice", 3, 0)]);
    // "new" would have admitted that request; per-key denied it, so only per-key counts it.
    assert!(layer
        .top_offenders("new")
        .await
        .unwrap()
        .offenders
        .is_empty());
    layer
        .reload([per_key("new", Limit::per_minute(1))])
        .unwrap();
    match layer.top_offenders("per-key").await {
        Err(LimitError::UnknownRule(name)) => assert_eq!(name, "per-key"),
        other => panic!("expected an unknown rule, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn keys_are_redacted_when_the_layer_redacts_them() {
    let limiter = Limiter::builder()
        .store(paused::store())
        .rule(per_key("per-key", Limit::per_minute(1)))
        .build()
        .unwrap();
    let layer = RateLimitLayer::from_limiter(limiter.clone())
        .redact_keys(true)
        .build()
        .unwrap();
    assert_eq!(send_as(&app(&layer), "alice", 2).await, 1);
    let top = layer.top_offenders("per-key").await.unwrap();
    let [offender] = &top.offenders[..] else {
        panic!("{top:?}")
    };
    assert_eq!(offender.denied, 1);
    assert!(!offender.key.contains("alice"), "{offender:?}");
    let hash = offender.key.strip_prefix('#').expect("a # and the hash");
    assert_eq!(hash.len(), 16);
    assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()), "{hash}");
    // The same key gets the same hash, so it can be followed in the logs.
    let again = layer.top_offenders("per-key").await.unwrap();
    assert_eq!(again.offenders[0].key, offender.key);

    // Built redacting, without a layer.
    let layer = paused::builder()
        .rule(per_key("per-key", Limit::per_minute(1)))
        .redact_keys(true)
        .build()
        .unwrap();
    assert_eq!(send_as(&app(&layer), "alice", 2).await, 1);
    let top = layer.top_offenders("per-key").await.unwrap();
    assert_eq!(top.offenders[0].key, offender.key);
}

/// The key `203.0.113.9`, denied once by a rule of a layer from `builder`, as its top-offender
/// list shows it.
async fn shown(builder: tollgate::RateLimitLayerBuilder) -> String {
    let layer = builder
        .rule(per_key("per-key", Limit::per_minute(1)))
        .build()
        .unwrap();
    assert_eq!(send_as(&app(&layer), "203.0.113.9", 2).await, 1);
    let top = layer.top_offenders("per-key").await.unwrap();
    top.offenders[0].key.clone()
}

/// FNV-1a of the key as the rule-less stable hash takes it: what anyone can compute for every
/// IPv4 address in seconds, and what redacted keys used to be.
fn unkeyed(key: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in [0xff].iter().chain(key) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("#{hash:016x}")
}

/// Issue 39: a redacted key was an unkeyed hash, which anyone can compute for every candidate
/// key and look up; it is now a keyed one.
#[tokio::test(start_paused = true)]
async fn a_redacted_key_is_no_hash_anyone_can_recompute() {
    let redacted = shown(paused::builder().redact_keys(true)).await;
    assert_ne!(redacted, unkeyed(b"203.0.113.9"));
    // Nor is it found by trying addresses near it, as an attacker would try them all.
    for last in 0..=255u8 {
        let candidate = format!("203.0.113.{last}");
        assert_ne!(redacted, unkeyed(candidate.as_bytes()), "{candidate}");
    }
}

/// Set in a second run of this test binary that a test starts, to redact in another process.
const SECOND_PROCESS: &str = "TOLLGATE_TEST_REDACT_IN_A_SECOND_PROCESS";

const SECRET: &str = "9c1e0f4b7a2d48e6b35f0c9a71d2e8f4";

/// Without a secret, each process redacts under a random secret of its own: a key shows the same
/// within the process, and otherwise in another. With a shared secret, alike in both.
#[tokio::test(start_paused = true)]
async fn each_process_redacts_under_its_own_secret_unless_one_is_shared() {
    let own = shown(paused::builder().redact_keys(true)).await;
    let shared = shown(paused::builder().redact_keys_secret(SECRET)).await;
    if std::env::var_os(SECOND_PROCESS).is_some() {
        println!("\nredacted {own} {shared}");
        return;
    }
    // The same process: the same secret, whichever layer.
    assert_eq!(shown(paused::builder().redact_keys(true)).await, own);
    assert_ne!(own, shared);
    let test = "top_offenders::each_process_redacts_under_its_own_secret_unless_one_is_shared";
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(SECOND_PROCESS, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let (second_own, second_shared) = stdout
        .lines()
        .find_map(|line| line.strip_prefix("redacted "))
        .and_then(|line| line.split_once(' '))
        .unwrap_or_else(|| panic!("no redactions from the second process: {stdout}"));
    assert_ne!(second_own, own, "a second process has a secret of its own");
    assert_eq!(
        second_shared, shared,
        "a shared secret redacts alike in every process"
    );
}

#[tokio::test(start_paused = true)]
async fn another_secret_redacts_otherwise_and_a_short_one_is_an_error() {
    let one = shown(paused::builder().redact_keys_secret(SECRET)).await;
    let again = shown(paused::builder().redact_keys_secret(SECRET.as_bytes())).await;
    let other =
        shown(paused::builder().redact_keys_secret("another secret of 32 characters")).await;
    assert_eq!(one, again);
    assert_ne!(one, other);
    // `redact_keys(true)` after a secret keeps the secret.
    assert_eq!(
        shown(
            paused::builder()
                .redact_keys_secret(SECRET)
                .redact_keys(true)
        )
        .await,
        one
    );
    let error = paused::builder()
        .redact_keys_secret("hunter2")
        .build()
        .unwrap_err();
    assert_eq!((error.rule(), error.field()), ("redact_keys", "secret"));
    assert!(error.message().contains("at least 16"), "{error}");
    // A secret that nothing would read is an error, not silently ignored.
    let error = paused::builder()
        .redact_keys_secret(SECRET)
        .redact_keys(false)
        .build()
        .unwrap_err();
    assert_eq!((error.rule(), error.field()), ("redact_keys", "secret"));
}

#[tokio::test(start_paused = true)]
async fn layers_sharing_a_limiter_list_their_own_denials() {
    let limiter = Limiter::builder()
        .store(paused::store())
        .rule(per_key("per-key", Limit::per_minute(1)))
        .build()
        .unwrap();
    let on_limiter = || {
        RateLimitLayer::from_limiter(limiter.clone())
            .build()
            .unwrap()
    };
    let (public, admin) = (on_limiter(), on_limiter());
    // One budget: alice's one request of the minute goes through the public layer, and each
    // layer then denies her its own number of times.
    assert_eq!(send_as(&app(&public), "alice", 3).await, 2);
    assert_eq!(send_as(&app(&admin), "alice", 1).await, 1);
    let top = public.top_offenders("per-key").await.unwrap();
    assert_eq!(listed(&top), [("alice", 2, 0)]);
    let top = admin.top_offenders("per-key").await.unwrap();
    assert_eq!(listed(&top), [("alice", 1, 0)]);
    // A reload through the limiter reaches both layers' lists.
    limiter
        .reload([per_key("renamed", Limit::per_minute(1))])
        .unwrap();
    for layer in [&public, &admin] {
        assert!(matches!(
            layer.top_offenders("per-key").await,
            Err(LimitError::UnknownRule(_))
        ));
        assert_eq!(layer.top_offenders("renamed").await.unwrap().denials, 0);
    }
}

/// Denials from many tasks at once are all counted: the sum of the counts is the number of 429s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_denials_from_many_tasks_loses_no_count() {
    let layer = RateLimitLayer::new(per_key("per-key", Limit::per_hour(1)));
    let tasks: Vec<_> = (0..8)
        .map(|task| {
            // Built here, not by `app`, so the compiler sees that its futures can move threads.
            let service = layer.layer(service_fn(ok));
            tokio::spawn(async move {
                let mut denied = 0;
                for i in 0..250 {
                    denied += send_as(&service, &format!("key-{}", (task * 7 + i) % 40), 1).await;
                }
                denied
            })
        })
        .collect();
    let mut denied = 0;
    for task in tasks {
        denied += task.await.unwrap();
    }
    // 2,000 requests over 40 keys, one admitted per key.
    assert_eq!(denied, 2_000 - 40);
    let top = layer.top_offenders("per-key").await.unwrap();
    assert_eq!(top.denials, denied);
    assert_eq!(top.offenders.len(), 40);
    assert_eq!(top.offenders.iter().map(|o| o.denied).sum::<u64>(), denied);
    assert!(top.offenders.iter().all(|o| o.error == 0));
}

/// The sketch lives in the process: denials decided by Redis feed it the same way.
#[cfg(feature = "redis")]
#[tokio::test]
async fn denials_decided_in_redis_are_listed_too() {
    let server = redis_server::RedisServer::start();
    let store = tollgate::RedisStore::builder()
        .url(server.url())
        .build()
        .await
        .expect("connect");
    let layer = RateLimitLayer::builder()
        .store(store)
        .rule(per_key("per-key", Limit::per_minute(1)))
        .build()
        .unwrap();
    let service = app(&layer);
    assert_eq!(send_as(&service, "alice", 4).await, 3);
    assert_eq!(send_as(&service, "bob", 1).await, 0);
    let top = layer.top_offenders("per-key").await.unwrap();
    assert_eq!(listed(&top), [("alice", 3, 0)]);
    // One unit a minute: alice's is spent, read back from Redis.
    assert_eq!(top.utilisation, Some(1.0));
    assert!(server.command_calls("evalsha") > 0, "decided in Redis");
}
