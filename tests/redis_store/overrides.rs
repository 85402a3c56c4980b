//! Per-key overrides on Redis (DESIGN §19, issue 27 item 5): two app instances — two
//! `Limiter`s, each with its own `RedisStore` and deny cache — on one real server (and on a
//! cluster) see an override set through the other on their next decision, reported in
//! `RateLimit-Policy`; it is cleared likewise, ends with its TTL by the store's clock, is listed
//! a page at a time with a cursor, and bad input is refused with nothing written.

#![cfg(feature = "redis")]

use crate::differential::{self, Step};
use crate::support::oneshot::{app, keyed_request as request, send, summary};
use crate::support::pages::every_page;

use std::collections::HashSet;
use std::time::Duration;

use tollgate::algorithm::{Algorithm, Mode, TokenBucket};
use tollgate::clock::ManualClock;
use tollgate::store::OverrideEntry;
use tollgate::{Key, Limit, LimitError, Limiter, RedisStore, Rule};

use super::ENGINE;

const DAY: Duration = Duration::from_secs(86_400);
const START: Duration = Duration::from_secs(1_750_000_000);

fn rules() -> [Rule; 2] {
    [
        Rule::new("api", Limit::per_minute(2))
            .key(Key::header(http::HeaderName::from_static("x-api-key")))
            .overridable(),
        Rule::new("plain", Limit::per_minute(2)).path("/plain"),
    ]
}

async fn instance(store: RedisStore) -> Limiter {
    let [api, plain] = rules();
    Limiter::builder()
        .rule(api)
        .rule(plain)
        .store(store)
        .build()
        .expect("valid rules")
}

/// An instance on `url` (or a cluster's nodes) under `prefix`, on `clock`.
async fn on(target: Target<'_>, prefix: &str, clock: &ManualClock) -> Limiter {
    let builder = match target {
        Target::Server(url) => RedisStore::builder().url(url),
        Target::Cluster(urls) => RedisStore::builder().cluster(urls.to_vec()),
    };
    let store = builder
        .prefix(prefix)
        .clock(clock.clone())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    instance(store).await
}

#[derive(Clone, Copy)]
enum Target<'a> {
    Server(&'a str),
    Cluster(&'a [String]),
}

/// Every page of `rule`'s overrides, walked with the cursor; and the pages' sizes.
async fn walk(limiter: &Limiter, rule: &str) -> (Vec<OverrideEntry>, Vec<usize>) {
    every_page(|cursor| limiter.overrides(rule, cursor)).await
}

/// What the memory store's test of the same name checks, through Redis: the state carries over
/// (DESIGN §13), another key keeps the rule's limit, both instances list it, a clear applies at
/// once.
async fn seen_through_the_other(target: Target<'_>, prefix: &str) {
    let clock = ManualClock::new(START);
    let one = on(target, prefix, &clock).await;
    let two = on(target, prefix, &clock).await;
    let two_app = app(two.clone());
    assert_eq!(
        summary(&send(&two_app, request("acme")).await),
        "200 | \"api\";q=2;w=60 | \"api\";r=1;t=30"
    );
    one.set_override("api", "acme", Limit::per_minute(10), DAY)
        .await
        .unwrap();
    // The bucket was empty 30 s ago, which at 10 a minute is 5 units; this request leaves 4.
    assert_eq!(
        summary(&send(&two_app, request("acme")).await),
        "200 | \"api\";q=10;w=60 | \"api\";r=4;t=6"
    );
    assert_eq!(
        summary(&send(&two_app, request("other")).await),
        "200 | \"api\";q=2;w=60 | \"api\";r=1;t=30"
    );
    // The Limiter's own decisions report the limit too.
    let outcome = two.charge("api", "acme", 1).await.unwrap();
    assert_eq!((outcome.limit, outcome.remaining), (10, 3));
    clock.advance(Duration::from_secs(3_600));
    for instance in [&one, &two] {
        let (entries, _) = walk(instance, "api").await;
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].key.as_bytes(), b"acme");
        assert_eq!(entries[0].limit, Limit::per_minute(10));
        assert_eq!(entries[0].expires_in, DAY - Duration::from_secs(3_600));
        // One key read alone, as the admin API reads it.
        let read = instance.override_of("api", "acme").await.unwrap().unwrap();
        assert_eq!(
            (read.limit, read.expires_in),
            (Limit::per_minute(10), DAY - Duration::from_secs(3_600))
        );
        assert_eq!(instance.override_of("api", "other").await.unwrap(), None);
    }
    one.clear_override("api", "acme").await.unwrap();
    assert_eq!(two.override_of("api", "acme").await.unwrap(), None);
    // The bucket is full again after an hour: 2, less this request.
    assert_eq!(
        summary(&send(&two_app, request("acme")).await),
        "200 | \"api\";q=2;w=60 | \"api\";r=1;t=30"
    );
    assert!(walk(&two, "api").await.0.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_set_through_one_instance_applies_on_the_others_next_decision() {
    let server = ENGINE.server();
    seen_through_the_other(Target::Server(&server.url()), "ov-seen").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_an_override_applies_and_is_listed() {
    let cluster = ENGINE.cluster();
    seen_through_the_other(Target::Cluster(&cluster.urls()), "ov-cluster").await;
}

/// The override ends when the store's clock passes its end (the script compares the time it
/// decides at with the `until` the override was written with), on both instances, and is no
/// longer listed; the key's state carries back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_ends_with_its_ttl() {
    let server = ENGINE.server();
    let clock = ManualClock::new(START);
    let one = on(Target::Server(&server.url()), "ov-ttl", &clock).await;
    let two = on(Target::Server(&server.url()), "ov-ttl", &clock).await;
    one.set_override(
        "api",
        "acme",
        Limit::per_minute(60),
        Duration::from_secs(600),
    )
    .await
    .unwrap();
    assert_eq!(two.charge("api", "acme", 1).await.unwrap().limit, 60);
    clock.advance(Duration::from_secs(599));
    assert_eq!(two.charge("api", "acme", 1).await.unwrap().limit, 60);
    assert_eq!(
        walk(&one, "api").await.0[0].expires_in,
        Duration::from_secs(1)
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(two.charge("api", "acme", 1).await.unwrap().limit, 2);
    assert_eq!(one.charge("api", "acme", 1).await.unwrap().limit, 2);
    assert!(walk(&one, "api").await.0.is_empty());
}

/// 250 overrides listed a page at a time: each page a bounded `SCAN` step (at most 100 entries),
/// every override listed once, on one server and on a cluster (every master in turn).
async fn listed_by_pages(target: Target<'_>, prefix: &str) {
    let clock = ManualClock::new(START);
    let limiter = on(target, prefix, &clock).await;
    let expected: HashSet<Vec<u8>> = (0..250).map(|i| format!("k{i:03}").into_bytes()).collect();
    for key in &expected {
        limiter
            .set_override("api", key, Limit::per_minute(5), DAY)
            .await
            .unwrap();
    }
    // Other rules' keys and counters beside them are not listed.
    limiter.charge("api", "k000", 1).await.unwrap();
    let (entries, sizes) = walk(&limiter, "api").await;
    assert!(sizes.len() >= 3, "{sizes:?}");
    assert!(sizes.iter().all(|&n| n <= 100), "{sizes:?}");
    let seen: Vec<Vec<u8>> = entries.iter().map(|e| e.key.as_bytes().to_vec()).collect();
    assert_eq!(seen.len(), 250, "each once");
    assert_eq!(seen.into_iter().collect::<HashSet<_>>(), expected);
    assert!(entries.iter().all(|e| e.limit == Limit::per_minute(5)));
    assert!(entries.iter().all(|e| e.expires_in == DAY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_are_listed_a_page_at_a_time() {
    let server = ENGINE.server();
    listed_by_pages(Target::Server(&server.url()), "ov-pages").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_overrides_are_listed_a_page_at_a_time() {
    let cluster = ENGINE.cluster();
    listed_by_pages(Target::Cluster(&cluster.urls()), "ov-cpages").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_overrides_are_refused_and_nothing_is_written() {
    let server = ENGINE.server();
    let clock = ManualClock::new(START);
    let limiter = on(Target::Server(&server.url()), "ov-bad", &clock).await;
    let ok = Limit::per_minute(10);
    let refused = |result: Result<(), LimitError>| result.unwrap_err().to_string();
    let zero = limiter
        .set_override("api", "a", Limit::per_minute(0), DAY)
        .await;
    assert!(refused(zero).contains("override refused"));
    let plain = limiter.set_override("plain", "a", ok.clone(), DAY).await;
    assert!(matches!(plain, Err(LimitError::NotOverridable(_))));
    let long = "k".repeat(129);
    let too_long = limiter.set_override("api", &long, ok.clone(), DAY).await;
    assert!(refused(too_long).contains("129 bytes"));
    let never = limiter
        .set_override("api", "a", ok.clone(), Duration::ZERO)
        .await;
    assert!(refused(never).contains("TTL"));
    let century = Duration::from_secs(100 * 365 * 86_400);
    let forever = limiter.set_override("api", "a", ok.clone(), century).await;
    assert!(refused(forever).contains("TTL"));
    let family = limiter
        .set_override("api", "a", Limit::concurrent(3), DAY)
        .await;
    assert!(matches!(family, Err(LimitError::BadOverride { .. })));
    // Numbers the Redis store cannot count exactly.
    let years = Duration::from_secs(40 * 365 * 86_400);
    let inexact = limiter
        .set_override("api", "a", Limit::token_bucket(1, years), DAY)
        .await;
    assert!(matches!(inexact, Err(LimitError::BadOverride { .. })));

    assert!(walk(&limiter, "api").await.0.is_empty());
    assert_eq!(server.run("KEYS ov-bad:override:*"), "*0\r\n");
    assert_eq!(limiter.charge("api", "a", 1).await.unwrap().limit, 2);
}

/// A value in an override's key that is no override is an error of the store (`Protocol`),
/// not a panic and not a limit: the charge writes nothing, and the listing says so too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_override_is_an_error_not_a_limit() {
    let server = ENGINE.server();
    let clock = ManualClock::new(START);
    let store = RedisStore::builder()
        .url(server.url())
        .prefix("ov-junk")
        .clock(clock.clone())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let [api, _] = rules();
    let limiter = Limiter::builder()
        .rule(api)
        .store(store)
        .on_store_failure(tollgate::FailurePolicy::Closed)
        .build()
        .unwrap();
    server.run("SET ov-junk:override:{acme}:api junk-that-is-32-bytes-long-xxxxxx");
    let error = limiter.charge("api", "acme", 1).await.unwrap_err();
    assert!(error.to_string().contains("override"), "{error}");
    assert_eq!(server.run("EXISTS ov-junk:{acme}:api"), ":0\r\n");
    assert!(limiter.overrides("api", None).await.is_err());
}

/// The differential test's override steps, scripted: the same answers on both stores, and the
/// override in force reported by both — set, carried over, ended by its TTL, set again, cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_overrides_answer_as_on_the_memory_store() {
    let server = ENGINE.server();
    let second = Duration::from_secs(1);
    let own = Algorithm::TokenBucket(TokenBucket::new(2, second));
    let more = Algorithm::TokenBucket(TokenBucket::new(10, second));
    let charge = |cost| Step::Apply(vec![(0, 1, cost, Mode::Charge)]);
    let steps = vec![
        charge(1),
        Step::Override(0, 1, Some((more.clone(), 2_000_000))),
        charge(2),
        charge(5),
        Step::Apply(vec![(0, 2, 1, Mode::Charge)]),
        Step::Advance(2_000_000),
        charge(1),
        Step::Override(0, 1, Some((more, 10_000_000))),
        charge(9),
        Step::Override(0, 1, None),
        charge(1),
    ];
    let scenario = (1_750_000_000_000_000, vec![(own, None)], steps);
    let redis = || RedisStore::builder().url(server.url());
    for answers in differential::run_with_and_without_deny_cache(redis, "ov-diff", &scenario).await
    {
        let limits: Vec<Vec<u64>> = answers
            .iter()
            .map(|outcomes| outcomes.iter().map(|o| o.limit).collect())
            .collect();
        assert_eq!(
            limits,
            [
                vec![2],
                vec![10],
                vec![10],
                vec![2],
                vec![2],
                vec![10],
                vec![2]
            ]
        );
    }
}
