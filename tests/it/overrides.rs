//! Per-key overrides (DESIGN §19, issue 27 item 5) on the memory store: two app instances
//! sharing one store see an override set through the other on their next decision, reported in
//! `RateLimit-Policy`; it ends with its TTL, is listed a page at a time, and bad input is
//! refused with nothing written.

use crate::support::oneshot::{app, keyed_request as request, send, summary};
use crate::support::pages::every_page;

use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::{Key, Limit, LimitError, Limiter, MemoryStore, Rule};

const DAY: Duration = Duration::from_secs(86_400);

fn limiter(store: &MemoryStore) -> Limiter {
    Limiter::builder()
        .rule(
            Rule::new("api", Limit::per_minute(2))
                .key(Key::header(http::HeaderName::from_static("x-api-key")))
                .overridable(),
        )
        .rule(Rule::new("plain", Limit::per_minute(2)).path("/plain"))
        .store(store.clone())
        .build()
        .expect("valid rules")
}

#[tokio::test]
async fn an_override_set_through_one_instance_applies_on_the_others_next_decision() {
    let clock = ManualClock::new(Duration::from_secs(1_750_000_000));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let (one, two) = (limiter(&store), limiter(&store));
    let two_app = app(two.clone());
    assert_eq!(
        summary(&send(&two_app, request("acme")).await),
        "200 | \"api\";q=2;w=60 | \"api\";r=1;t=30"
    );
    one.set_override("api", "acme", Limit::per_minute(10), DAY)
        .await
        .unwrap();
    // The state carries over (DESIGN §13): the bucket was empty 30 s ago, which at 10 a
    // minute is 5 units; this request leaves 4.
    let seen = summary(&send(&two_app, request("acme")).await);
    assert_eq!(seen, "200 | \"api\";q=10;w=60 | \"api\";r=4;t=6");
    // Another key keeps the rule's own limit.
    assert_eq!(
        summary(&send(&two_app, request("other")).await),
        "200 | \"api\";q=2;w=60 | \"api\";r=1;t=30"
    );
    // Listed by either instance, with the time left.
    clock.advance(Duration::from_secs(3_600));
    let page = two.overrides("api", None).await.unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0].key.as_bytes(), b"acme");
    assert_eq!(page.items[0].limit, Limit::per_minute(10));
    assert_eq!(page.items[0].expires_in, DAY - Duration::from_secs(3_600));
    assert!(page.next.is_none());
    // Cleared through the other: the rule's own limit again at once.
    one.clear_override("api", "acme").await.unwrap();
    assert_eq!(
        summary(&send(&two_app, request("acme")).await),
        "200 | \"api\";q=2;w=60 | \"api\";r=1;t=30"
    );
    assert!(two.overrides("api", None).await.unwrap().items.is_empty());
}

#[tokio::test]
async fn an_override_ends_with_its_ttl() {
    let clock = ManualClock::new(Duration::from_secs(1_750_000_000));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let limiter = limiter(&store);
    limiter
        .set_override(
            "api",
            "acme",
            Limit::per_minute(60),
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    assert_eq!(limiter.charge("api", "acme", 1).await.unwrap().limit, 60);
    clock.advance(Duration::from_secs(600));
    assert_eq!(limiter.charge("api", "acme", 1).await.unwrap().limit, 2);
    assert!(limiter
        .overrides("api", None)
        .await
        .unwrap()
        .items
        .is_empty());
}

/// The batch calls (tollgate-server charges every call with one) decide under an override too.
#[tokio::test]
async fn the_batch_calls_decide_under_an_override() {
    let limiter = limiter(&MemoryStore::new());
    limiter
        .set_override("api", "acme", Limit::per_minute(60), DAY)
        .await
        .unwrap();
    let both = limiter
        .charge_all([("api", "acme", 1), ("plain", "", 1)])
        .await
        .unwrap();
    let limits: Vec<u64> = both.rules().iter().map(|r| r.outcome.limit).collect();
    assert_eq!(limits, [60, 2]);
    let under = limiter
        .check_all_under([("api", "acme", 1, None)])
        .await
        .unwrap();
    assert_eq!(under.rules()[0].outcome.limit, 60);
    // One unit charged above, one more looked at.
    assert_eq!(under.rules()[0].outcome.remaining, 58);
}

#[tokio::test]
async fn overrides_are_listed_a_page_at_a_time() {
    let store = MemoryStore::new();
    let limiter = limiter(&store);
    for i in 0..250 {
        limiter
            .set_override("api", format!("k{i:03}"), Limit::per_minute(5), DAY)
            .await
            .unwrap();
    }
    let (entries, sizes) = every_page(|cursor| limiter.overrides("api", cursor)).await;
    assert_eq!(sizes, [100, 100, 50]);
    let seen: Vec<Vec<u8>> = entries.iter().map(|e| e.key.as_bytes().to_vec()).collect();
    let expected: Vec<Vec<u8>> = (0..250).map(|i| format!("k{i:03}").into_bytes()).collect();
    assert_eq!(seen, expected);
}

#[tokio::test]
async fn bad_overrides_are_refused_and_nothing_is_written() {
    let store = MemoryStore::new();
    let limiter = limiter(&store);
    let ok = Limit::per_minute(10);
    let refused = |result: Result<(), LimitError>| result.unwrap_err().to_string();

    let zero = refused(
        limiter
            .set_override("api", "a", Limit::per_minute(0), DAY)
            .await,
    );
    assert!(zero.contains("override refused"), "{zero}");
    let unknown = limiter.set_override("nope", "a", ok.clone(), DAY).await;
    assert!(matches!(unknown, Err(LimitError::UnknownRule(_))));
    let plain = limiter.set_override("plain", "a", ok.clone(), DAY).await;
    assert!(matches!(plain, Err(LimitError::NotOverridable(_))));
    assert!(refused(plain).contains("overridable()"));
    let long = "k".repeat(129);
    let too_long = refused(limiter.set_override("api", &long, ok.clone(), DAY).await);
    assert!(too_long.contains("129 bytes"), "{too_long}");
    let never = refused(
        limiter
            .set_override("api", "a", ok.clone(), Duration::ZERO)
            .await,
    );
    assert!(never.contains("TTL"), "{never}");
    let century = Duration::from_secs(100 * 365 * 86_400);
    let forever = refused(limiter.set_override("api", "a", ok.clone(), century).await);
    assert!(forever.contains("TTL"), "{forever}");
    let family = limiter
        .set_override("api", "a", Limit::concurrent(3), DAY)
        .await;
    assert!(matches!(family, Err(LimitError::BadOverride { .. })));

    // Nothing written: nothing listed, and the key is charged under the rule's own limit.
    assert!(limiter
        .overrides("api", None)
        .await
        .unwrap()
        .items
        .is_empty());
    assert_eq!(limiter.charge("api", "a", 1).await.unwrap().limit, 2);
    assert_eq!(limiter.charge("api", &long, 1).await.unwrap().limit, 2);
    assert!(matches!(
        limiter.overrides("plain", None).await,
        Err(LimitError::NotOverridable(_))
    ));
}

#[test]
fn a_rule_with_overrides_cannot_queue() {
    // Refused like a per-request rule's queue: it would charge again under its own limit.
    let queued = Limiter::builder()
        .rule(
            Rule::new("api", Limit::per_minute(2))
                .overridable()
                .queue(tollgate::Queue::burst(2)),
        )
        .build();
    let error = queued.unwrap_err().to_string();
    assert!(
        error.contains("not available on a rule with overrides"),
        "{error}"
    );
}

#[tokio::test]
async fn batch_charges_read_a_key_s_override_over_a_limit_given_with_them() {
    let store = MemoryStore::new();
    let limiter = limiter(&store);
    limiter
        .set_override("api", "acme", Limit::per_minute(10), DAY)
        .await
        .unwrap();
    // As the key API and the layer: the override's limit decides the charge.
    let batch = limiter.charge_all([("api", "acme", 2)]).await.unwrap();
    let charged = &batch.rules()[0];
    assert_eq!(charged.limit(), Some(&Limit::per_minute(10)));
    assert_eq!(charged.outcome.remaining, 8);
    // A look too: what a charge of 1 would leave under the override, nothing charged.
    let looked = limiter.check_all([("api", "acme", 1)]).await.unwrap();
    assert_eq!(looked.rules()[0].limit(), Some(&Limit::per_minute(10)));
    assert_eq!(looked.rules()[0].outcome.remaining, 7);
    // Over a limit given with the charge too, as over a request's own limit.
    let under = limiter
        .charge_all_under([("api", "acme", 1, Some(Limit::per_minute(20)))])
        .await
        .unwrap();
    assert_eq!(under.rules()[0].limit(), Some(&Limit::per_minute(10)));
    assert_eq!(under.rules()[0].outcome.remaining, 7);
    // Another key keeps the rule's own limit.
    let other = limiter.charge_all([("api", "other", 1)]).await.unwrap();
    assert_eq!(other.rules()[0].limit(), None);
    assert_eq!(other.rules()[0].outcome.remaining, 1);
}
