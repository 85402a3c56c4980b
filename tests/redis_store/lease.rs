//! Quota leases on real servers: two app instances on one server, each leasing slices of a hot
//! key's quota. The figures the docs state: one script call per `units` charges, a window never
//! over-admitted, a token bucket over-admitted by at most `instances × units`, unused units given
//! back when a lease ends. Time is a manual clock sent to the scripts (deterministic).

#![cfg(feature = "redis")]

use std::time::Duration;

use tollgate::algorithm::Lease;
use tollgate::clock::ManualClock;
use tollgate::{Limit, Limiter, RedisStore, Rule};

use super::ENGINE;
use crate::support::redis_server::RedisServer;

const HOUR: Duration = Duration::from_secs(3_600);

/// An app instance: a limiter with `rule` on its own store (its own leases) on `server`.
async fn instance(server: &RedisServer, clock: &ManualClock, prefix: &str, rule: Rule) -> Limiter {
    let store = RedisStore::builder()
        .url(server.url())
        .prefix(prefix)
        .clock(clock.clone())
        .build()
        .await
        .expect("connect");
    Limiter::builder().rule(rule).store(store).build().unwrap()
}

/// A clock on an hour's boundary, so a window of an hour holds the whole test.
fn clock() -> ManualClock {
    ManualClock::new(Duration::from_secs(1_900_000_000 / 3_600 * 3_600))
}

/// Charges `key` once through each instance in turn, `rounds` times; the admitted count of each.
async fn alternate(instances: &[&Limiter], key: &str, rounds: usize) -> Vec<u64> {
    let mut admitted = vec![0; instances.len()];
    for _ in 0..rounds {
        for (i, limiter) in instances.iter().enumerate() {
            if limiter.charge("api", key, 1).await.unwrap().is_allowed() {
                admitted[i] += 1;
            }
        }
    }
    admitted
}

#[tokio::test]
async fn ten_units_a_lease_is_one_script_call_per_ten_charges_and_redis_counts_every_unit() {
    let server = ENGINE.server();
    let clock = clock();
    let window = || Rule::new("api", Limit::fixed_window(1_000, HOUR));
    let leased = || window().lease(Lease::new(10, Duration::from_secs(1)));
    let a = instance(&server, &clock, "t", leased()).await;
    let b = instance(&server, &clock, "t", leased()).await;
    let exact = instance(&server, &clock, "t", window()).await;

    let calls = server.command_calls("evalsha");
    assert_eq!(alternate(&[&a, &b], "hot", 250).await, [250, 250]);
    let leased_calls = server.command_calls("evalsha") - calls;
    // Each instance: one call for each 10 of its 250 charges.
    assert_eq!(leased_calls, 50);
    // Every unit admitted was charged in Redis, none held back: 500 of 1,000 left.
    assert_eq!(exact.check("api", "hot", 0).await.unwrap().remaining, 500);

    // The same 500 charges, exact: one call each, ten times as many.
    let calls = server.command_calls("evalsha");
    assert_eq!(alternate(&[&exact, &exact], "other", 250).await, [250, 250]);
    assert_eq!(server.command_calls("evalsha") - calls, 500);
}

#[tokio::test]
async fn a_window_is_never_over_admitted_whatever_the_instances_hold() {
    let server = ENGINE.server();
    let clock = clock();
    let rule = || {
        Rule::new("api", Limit::fixed_window(100, HOUR))
            .lease(Lease::new(10, Duration::from_secs(60)))
    };
    let a = instance(&server, &clock, "w", rule()).await;
    let b = instance(&server, &clock, "w", rule()).await;
    // Uneven traffic: `a` three charges for each of `b`'s, until Redis has nothing left.
    let mut admitted = 0;
    for _ in 0..100 {
        for limiter in [&a, &a, &a, &b] {
            if limiter.charge("api", "hot", 1).await.unwrap().is_allowed() {
                admitted += 1;
            }
        }
    }
    // Whatever one instance held when the other ran dry is spent by its owner: exactly the
    // window's 100, never more.
    assert_eq!(admitted, 100);
    for limiter in [&a, &b] {
        let denied = limiter.charge("api", "hot", 1).await.unwrap();
        assert!(!denied.is_allowed());
    }
}

#[tokio::test]
async fn a_bucket_is_over_admitted_by_at_most_the_units_each_instance_holds() {
    let server = ENGINE.server();
    let clock = clock();
    // 10 a second, holding 10; each instance leases 5 for up to a minute.
    let rule = || {
        Rule::new("api", Limit::per_second(10).capacity(10))
            .lease(Lease::new(5, Duration::from_secs(60)))
    };
    let a = instance(&server, &clock, "b", rule()).await;
    let b = instance(&server, &clock, "b", rule()).await;
    // Each takes a lease of 5 with its first charge: the bucket is empty, 4 held each.
    assert_eq!(alternate(&[&a, &b], "hot", 1).await, [1, 1]);
    // A second later the bucket is full again; the held 8 come on top of its 10.
    clock.advance(Duration::from_secs(1));
    let admitted: u64 = alternate(&[&a, &b], "hot", 20).await.iter().sum();
    // Exact: 10. With leases: at most 10 + 2 instances × 5 units.
    assert!(admitted > 10, "the held units were spent: {admitted}");
    assert!(admitted <= 10 + 2 * 5, "{admitted}");
}

#[tokio::test]
async fn a_lease_that_ends_gives_its_unused_units_back() {
    let server = ENGINE.server();
    let clock = clock();
    let bucket = || Rule::new("api", Limit::per_hour(100).capacity(100));
    let a = instance(
        &server,
        &clock,
        "r",
        bucket().lease(Lease::new(10, Duration::from_secs(1))),
    )
    .await;
    let exact = instance(&server, &clock, "r", bucket()).await;
    let remaining = || async { exact.check("api", "k", 0).await.unwrap().remaining };

    assert!(a.charge("api", "k", 1).await.unwrap().is_allowed());
    // One used, nine held by `a`: Redis has 90.
    assert_eq!(remaining().await, 90);
    // The lease ends; the next charge gives the 9 back and takes a new lease of 10.
    clock.advance(Duration::from_secs(2));
    assert!(a.charge("api", "k", 1).await.unwrap().is_allowed());
    assert_eq!(remaining().await, 100 - 2 - 9);
}

#[tokio::test]
async fn near_the_limit_a_charge_is_decided_exactly_and_the_units_held_go_back() {
    let server = ENGINE.server();
    let clock = clock();
    let window = || Rule::new("api", Limit::fixed_window(12, HOUR));
    let a = instance(
        &server,
        &clock,
        "n",
        window().lease(Lease::new(10, Duration::from_secs(60))),
    )
    .await;
    let exact = instance(&server, &clock, "n", window()).await;
    // `a` leases 10 (2 left in Redis), spends them all.
    for _ in 0..10 {
        assert!(a.charge("api", "k", 1).await.unwrap().is_allowed());
    }
    // A lease of 10 no longer fits: each charge is then exact, and the last two pass.
    let outcomes = [
        a.charge("api", "k", 1).await.unwrap(),
        a.charge("api", "k", 1).await.unwrap(),
        a.charge("api", "k", 1).await.unwrap(),
    ];
    let allowed: Vec<bool> = outcomes.iter().map(|o| o.is_allowed()).collect();
    assert_eq!(allowed, [true, true, false]);
    assert_eq!(exact.check("api", "k", 0).await.unwrap().remaining, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_hot_key_one_charge_asks_for_the_lease_and_the_others_wait_for_it() {
    let server = ENGINE.server();
    let clock = clock();
    let rule = Rule::new("api", Limit::fixed_window(100_000, HOUR))
        .lease(Lease::new(10, Duration::from_secs(60)));
    let limiter = instance(&server, &clock, "c", rule).await;
    let calls = server.command_calls("evalsha");
    // 64 callers at once on one key, 10 charges each.
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                for _ in 0..10 {
                    assert!(limiter.charge("api", "hot", 1).await.unwrap().is_allowed());
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let used = server.command_calls("evalsha") - calls;
    // 640 charges: at most 64 calls (leases of 10), fewer when charges queue behind the one
    // asking, as a slice asked for then covers them.
    assert!(used <= 64, "{used} calls for 640 charges");
    let exact = instance(
        &server,
        &clock,
        "c",
        Rule::new("api", Limit::fixed_window(100_000, HOUR)),
    )
    .await;
    // Everything admitted was charged, nothing more held back than one lease.
    let remaining = exact.check("api", "hot", 0).await.unwrap().remaining;
    assert!(
        (100_000 - 650..=100_000 - 640).contains(&remaining),
        "{remaining}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_fails_every_charge_waiting_for_a_lease_within_the_timeout() {
    let server = ENGINE.server();
    let clock = clock();
    let store = RedisStore::builder()
        .url(server.url())
        .prefix("p")
        .clock(clock.clone())
        .timeout(Duration::from_millis(100))
        .build()
        .await
        .expect("connect");
    let rule = Rule::new("api", Limit::fixed_window(1_000, HOUR))
        .lease(Lease::new(10, Duration::from_secs(60)));
    let limiter = Limiter::builder()
        .rule(rule)
        .store(store)
        .on_store_failure(tollgate::FailurePolicy::Closed)
        .build()
        .unwrap();
    server.pause();
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.charge("api", "hot", 1).await })
        })
        .collect();
    // A guard against a hang, not a measure: each charge fails after one call's timeout, the
    // one asking by its own and those waiting for it with it.
    let all = tokio::time::timeout(Duration::from_secs(10), async {
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.unwrap());
        }
        results
    })
    .await
    .expect("no charge waits past the store's timeout for a lease");
    server.resume();
    let mut waited = 0;
    for result in all {
        match result {
            Err(tollgate::LimitError::Store(error)) => {
                waited += usize::from(error.to_string().contains("quota lease failed"));
            }
            other => panic!("{other:?}"),
        }
    }
    // One charge asked; those that came while it was asking failed with it, not after asking
    // again one by one.
    assert!(waited > 0);
}
