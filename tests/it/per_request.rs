//! Limits chosen per request (DESIGN §13): from the request's extensions and from an async
//! resolver with a TTL cache, the rule's own limit as the fallback for every failure, the key's
//! state kept when its limit changes, and `RateLimit-Policy` reporting the limit that applied.
//! Tokio's paused time drives the limiter's clock, the resolvers' delays and the cache's TTL.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::rules::LimitResolver;
use tollgate::{Decision, Key, Limit, Queue, Rule};
use tower::{service_fn, Layer};

use crate::support::oneshot;
use oneshot::{send, Limited};

use crate::support::paused;

type Body = Full<Bytes>;

static API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// What an auth layer put in the request: the customer's plan.
#[derive(Clone)]
struct Plan {
    per_minute: u64,
}

fn service(rule: Rule) -> impl Limited<Body> {
    let inner = service_fn(|request: Request<Body>| async move {
        // The handler sees the limit that applied.
        let applied = request
            .extensions()
            .get::<Decision>()
            .and_then(|d| d.rules().first()?.limit().cloned());
        let body = format!("{applied:?}");
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
    });
    paused::layer(rule).layer(inner)
}

fn request(key: &str, plan: Option<u64>) -> Request<Body> {
    let mut request = Request::get("/")
        .header(&API_KEY, key)
        .body(Body::default())
        .unwrap();
    if let Some(per_minute) = plan {
        request.extensions_mut().insert(Plan { per_minute });
    }
    request
}

fn header<'a>(response: &'a Response<Bytes>, name: &str) -> &'a str {
    response
        .headers()
        .get(name)
        .map_or("", |v| v.to_str().unwrap())
}

fn from_plan(rule: Rule) -> Rule {
    rule.key(Key::header(API_KEY.clone()))
        .limit_from_extension(|plan: &Plan| Some(Limit::per_minute(plan.per_minute)))
}

#[tokio::test(start_paused = true)]
async fn a_limit_from_the_extensions_applies_and_is_reported() {
    let service = service(from_plan(Rule::new("customer", Limit::per_minute(2))));

    for left in (0..5).rev() {
        let ok = send(&service, request("big", Some(5))).await;
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(header(&ok, "ratelimit-policy"), "\"customer\";q=5;w=60");
        assert_eq!(
            header(&ok, "ratelimit"),
            format!("\"customer\";r={left};t=12")
        );
        assert_eq!(ok.body(), &format!("{:?}", Some(Limit::per_minute(5))));
    }
    let denied = send(&service, request("big", Some(5))).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "ratelimit-policy"), "\"customer\";q=5;w=60");

    // No plan in the request: the rule's own limit, reported as such.
    for _ in 0..2 {
        let ok = send(&service, request("small", None)).await;
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(header(&ok, "ratelimit-policy"), "\"customer\";q=2;w=60");
        assert_eq!(ok.body(), "None");
    }
    let denied = send(&service, request("small", None)).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "ratelimit-policy"), "\"customer\";q=2;w=60");
}

/// A key keeps its state when its limit changes: the moment its token bucket was empty carries
/// over, the time since read at the new rate, so the balance is never above the new capacity, an
/// idle key is full under its new limit, and changing the limit refills nothing.
#[tokio::test(start_paused = true)]
async fn a_key_whose_limit_changes_keeps_its_state() {
    let service = service(from_plan(Rule::new("customer", Limit::per_minute(2))));
    let ratelimit = |response: &Response<Bytes>| header(response, "ratelimit").to_owned();
    for left in [9, 8, 7] {
        let ok = send(&service, request("k", Some(10))).await;
        assert_eq!(ratelimit(&ok), format!("\"customer\";r={left};t=6"));
    }
    // The key was empty 42 s ago (7 units at 6 s). At 5 a minute (12 s a unit, capacity 5) that
    // is 3.5 units, 2.5 after this request.
    let shrunk = send(&service, request("k", Some(5))).await;
    assert_eq!(ratelimit(&shrunk), "\"customer\";r=2;t=6");
    assert_eq!(header(&shrunk, "ratelimit-policy"), "\"customer\";q=5;w=60");
    // Back to 10 a minute: empty 30 s ago, 5 units; this request leaves 4.
    let grown = send(&service, request("k", Some(10))).await;
    assert_eq!(ratelimit(&grown), "\"customer\";r=4;t=6");
    // Idle for a minute, then at 2 a minute: full at its new capacity of 2, never above it.
    tokio::time::advance(Duration::from_secs(60)).await;
    let small = send(&service, request("k", Some(2))).await;
    assert_eq!(ratelimit(&small), "\"customer\";r=1;t=30");
}

/// What an auth layer put in the request: the customer's tier, 10 a minute with this capacity.
#[derive(Clone)]
struct Tier {
    capacity: u64,
}

fn tiered(capacity: u64) -> Request<Body> {
    let mut request = Request::get("/")
        .header(&API_KEY, "customer-a")
        .body(Body::default())
        .unwrap();
    request.extensions_mut().insert(Tier { capacity });
    request
}

/// Issue 24 (DESIGN §13): 10 a minute with a capacity of 100, customer A spends 60 (40 left);
/// then the auth layer hands the rule a capacity of 20. A has 20 at once — not 0 for four
/// minutes — and then one more every 6 s, like any key of that tier.
#[tokio::test(start_paused = true)]
async fn a_downgraded_customer_has_what_fits_at_once() {
    let rule = Rule::new("customer", Limit::per_minute(10))
        .key(Key::header(API_KEY.clone()))
        .limit_from_extension(|tier: &Tier| Some(Limit::per_minute(10).capacity(tier.capacity)));
    let service = service(rule);
    for left in (40..100).rev() {
        let ok = send(&service, tiered(100)).await;
        assert_eq!(
            header(&ok, "ratelimit"),
            format!("\"customer\";r={left};t=6")
        );
    }
    for left in (0..20).rev() {
        let ok = send(&service, tiered(20)).await;
        assert_eq!(ok.status(), StatusCode::OK, "{left} left");
        assert_eq!(header(&ok, "ratelimit-policy"), "\"customer\";q=20;w=120");
        assert_eq!(
            header(&ok, "ratelimit"),
            format!("\"customer\";r={left};t=6")
        );
    }
    let denied = send(&service, tiered(20)).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "retry-after"), "6");
    // Upgraded back to 100 after a minute: 10 refilled, no more (the change refills nothing).
    tokio::time::advance(Duration::from_secs(60)).await;
    let ok = send(&service, tiered(100)).await;
    assert_eq!(header(&ok, "ratelimit"), "\"customer\";r=9;t=6");
}

#[tokio::test(start_paused = true)]
async fn unusable_limits_from_the_extensions_fall_back_to_the_rules_own() {
    let rule = Rule::new("customer", Limit::per_minute(4))
        .key(Key::header(API_KEY.clone()))
        .cost(3)
        .limit_from_extension(|plan: &Plan| Some(Limit::per_minute(plan.per_minute)));
    let service = service(rule);
    // A zero rate, and a capacity below the request's cost of 3.
    for plan in [0, 2] {
        let key = format!("k{plan}");
        let ok = send(&service, request(&key, Some(plan))).await;
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(header(&ok, "ratelimit-policy"), "\"customer\";q=4;w=60");
        assert_eq!(header(&ok, "ratelimit"), "\"customer\";r=1;t=15");
        assert_eq!(ok.body(), "None");
        let denied = send(&service, request(&key, Some(plan))).await;
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    }
}

/// The rows of a test "database": per-minute limits by key.
type Rows = Arc<Mutex<Vec<(&'static str, u64)>>>;

/// A resolver over a "database" of per-minute limits that answers after `delay`, counting its
/// lookups.
fn database(
    rows: &[(&'static str, u64)],
    delay: Duration,
) -> (Rows, Arc<AtomicUsize>, LimitResolver) {
    let rows = Arc::new(Mutex::new(rows.to_vec()));
    let lookups = Arc::new(AtomicUsize::new(0));
    let (table, count) = (rows.clone(), lookups.clone());
    let resolver = LimitResolver::new(move |key| {
        count.fetch_add(1, Ordering::SeqCst);
        let row = table
            .lock()
            .unwrap()
            .iter()
            .find(|(k, _)| k.as_bytes() == key.as_bytes())
            .map(|(_, n)| *n);
        async move {
            tokio::time::sleep(delay).await;
            match row {
                Some(n) => Ok(Some(Limit::per_minute(n))),
                None if key.as_bytes() == b"broken" => Err("connection reset"),
                None => Ok(None),
            }
        }
    });
    (rows, lookups, resolver)
}

#[tokio::test(start_paused = true)]
async fn a_resolver_is_asked_once_per_key_and_ttl() {
    let (rows, lookups, resolver) = database(&[("acme", 3)], Duration::from_millis(50));
    let rule = Rule::new("customer", Limit::per_minute(1))
        .key(Key::header(API_KEY.clone()))
        .limit_from(resolver.ttl(Duration::from_secs(30)));
    let service = service(rule);

    // Ten concurrent requests of a key not cached yet: one lookup, and its limit for all ten.
    let answers =
        futures::future::join_all((0..10).map(|_| send(&service, request("acme", None)))).await;
    assert_eq!(lookups.load(Ordering::SeqCst), 1);
    let admitted = answers
        .iter()
        .filter(|r| r.status() == StatusCode::OK)
        .count();
    assert_eq!(admitted, 3);
    for answer in &answers {
        assert_eq!(header(answer, "ratelimit-policy"), "\"customer\";q=3;w=60");
    }

    // A key the database does not know: the rule's own limit, cached too.
    for _ in 0..2 {
        let other = send(&service, request("unknown", None)).await;
        assert_eq!(header(&other, "ratelimit-policy"), "\"customer\";q=1;w=60");
    }
    assert_eq!(lookups.load(Ordering::SeqCst), 2);

    // The customer upgrades; the cached answer holds until its TTL.
    rows.lock().unwrap()[0].1 = 60;
    tokio::time::advance(Duration::from_secs(29)).await;
    let cached = send(&service, request("acme", None)).await;
    assert_eq!(header(&cached, "ratelimit-policy"), "\"customer\";q=3;w=60");
    assert_eq!(lookups.load(Ordering::SeqCst), 2);
    tokio::time::advance(Duration::from_secs(1)).await;
    let fresh = send(&service, request("acme", None)).await;
    assert_eq!(fresh.status(), StatusCode::OK);
    assert_eq!(header(&fresh, "ratelimit-policy"), "\"customer\";q=60;w=60");
    assert_eq!(lookups.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_failing_panicking_hanging_or_absurd_resolver_gives_the_fallback() {
    let lookups = Arc::new(AtomicUsize::new(0));
    let count = lookups.clone();
    let resolver = LimitResolver::new(move |key| {
        count.fetch_add(1, Ordering::SeqCst);
        async move {
            match key.as_bytes() {
                b"error" => Err("database down"),
                b"panic" => panic!("resolver bug"),
                b"hang" => std::future::pending().await,
                b"zero" => Ok(Some(Limit::per_minute(0))),
                b"small" => Ok(Some(Limit::per_minute(1))),
                _ => Ok(Some(Limit::per_minute(u64::MAX).capacity(0))),
            }
        }
    })
    .timeout(Duration::from_millis(300))
    .retry_after(Duration::from_secs(5));
    let rule = Rule::new("customer", Limit::per_minute(6))
        .key(Key::header(API_KEY.clone()))
        .cost(2)
        .limit_from(resolver);
    let service = service(rule);

    for key in ["error", "panic", "hang", "zero", "small", "absurd"] {
        let started = tokio::time::Instant::now();
        let answer =
            tokio::time::timeout(Duration::from_secs(10), send(&service, request(key, None)))
                .await
                .expect("bounded by the resolver's timeout");
        assert_eq!(answer.status(), StatusCode::OK, "{key}");
        assert_eq!(
            header(&answer, "ratelimit-policy"),
            "\"customer\";q=6;w=60",
            "{key}"
        );
        assert_eq!(
            header(&answer, "ratelimit"),
            "\"customer\";r=4;t=10",
            "{key}"
        );
        let waited = started.elapsed();
        if key == "hang" {
            assert_eq!(waited, Duration::from_millis(300));
        } else {
            assert_eq!(waited, Duration::ZERO, "{key}");
        }
    }
    assert_eq!(lookups.load(Ordering::SeqCst), 6);
    // A failure is remembered for `retry_after`: the next requests do not wait for the resolver.
    let started = tokio::time::Instant::now();
    let again = send(&service, request("hang", None)).await;
    assert_eq!(header(&again, "ratelimit"), "\"customer\";r=2;t=10");
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(lookups.load(Ordering::SeqCst), 6);
    tokio::time::advance(Duration::from_secs(5)).await;
    send(&service, request("hang", None)).await;
    assert_eq!(lookups.load(Ordering::SeqCst), 7);
}

#[test]
fn a_per_request_rule_cannot_queue() {
    let err = paused::builder()
        .rule(
            from_plan(Rule::new("customer", Limit::per_minute(2)))
                .queue(Queue::max_delay(Duration::from_secs(1))),
        )
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "rule \"customer\": queue: not available on a rule whose limit comes from the request"
    );
}

/// Two passes over 200 keys: with the default bound the second pass is all cache hits; with
/// `max_keys(10)` nearly all of it is looked up again.
#[tokio::test(start_paused = true)]
async fn the_cache_keeps_at_most_max_keys_answers() {
    for (max_keys, most_cached) in [(None, 200), (Some(10), 20)] {
        let (_, lookups, resolver) = database(&[], Duration::ZERO);
        let resolver = match max_keys {
            Some(n) => resolver.max_keys(n),
            None => resolver,
        };
        let rule = Rule::new("customer", Limit::per_minute(100))
            .key(Key::header(API_KEY.clone()))
            .limit_from(resolver);
        let service = service(rule);
        for _ in 0..2 {
            for key in 0..200 {
                send(&service, request(&key.to_string(), None)).await;
            }
        }
        let hits = 400 - lookups.load(Ordering::SeqCst);
        assert!(hits <= most_cached, "{max_keys:?}: {hits} second-pass hits");
        if max_keys.is_none() {
            assert_eq!(hits, 200);
        }
    }
}

/// Settings at their extremes: nothing overflows, "forever" is a valid TTL.
#[tokio::test(start_paused = true)]
async fn extreme_resolver_settings_neither_panic_nor_hang() {
    let (_, lookups, resolver) = database(&[("acme", 3)], Duration::from_millis(10));
    let resolver = resolver
        .ttl(Duration::MAX)
        .timeout(Duration::MAX)
        .retry_after(Duration::MAX)
        .max_keys(usize::MAX);
    let forever = service(
        Rule::new("customer", Limit::per_minute(1))
            .key(Key::header(API_KEY.clone()))
            .limit_from(resolver),
    );
    for _ in 0..2 {
        let ok = send(&forever, request("acme", None)).await;
        assert_eq!(header(&ok, "ratelimit-policy"), "\"customer\";q=3;w=60");
    }
    let broken = send(&forever, request("broken", None)).await;
    assert_eq!(header(&broken, "ratelimit-policy"), "\"customer\";q=1;w=60");
    assert_eq!(lookups.load(Ordering::SeqCst), 2);

    // A zero timeout: every lookup falls back at once.
    let (_, _, resolver) = database(&[("acme", 3)], Duration::from_millis(10));
    let service = service(
        Rule::new("customer", Limit::per_minute(1))
            .key(Key::header(API_KEY.clone()))
            .limit_from(resolver.timeout(Duration::ZERO).max_keys(0)),
    );
    let ok = send(&service, request("acme", None)).await;
    assert_eq!(header(&ok, "ratelimit-policy"), "\"customer\";q=1;w=60");
}

/// A queued request dropped while it waits gives its units back, a per-request rule's under the
/// limit it was charged under.
#[tokio::test(start_paused = true)]
async fn a_cancelled_queued_request_refunds_under_the_limit_it_was_charged() {
    let inner = service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::default()))
    });
    let service = paused::builder()
        .rule(
            Rule::new("paced", Limit::per_second(1))
                .queue(Queue::max_delay(Duration::from_secs(10))),
        )
        .rule(from_plan(Rule::new("customer", Limit::per_minute(2))))
        .build()
        .unwrap()
        .layer(inner);
    let first = send(&service, request("k", Some(10))).await;
    assert_eq!(
        header(&first, "ratelimit"),
        "\"paced\";r=0;t=1, \"customer\";r=9;t=6"
    );
    // Queued for a second; its client goes away after 100 ms.
    let gone = tokio::time::timeout(
        Duration::from_millis(100),
        send(&service, request("k", Some(10))),
    )
    .await;
    assert!(gone.is_err(), "the request was still waiting");
    // The customer's unit came back at 6 s a unit (not at the rule's own 30 s, which would
    // have refilled the bucket).
    let third = send(&service, request("k", Some(10))).await;
    assert_eq!(third.status(), StatusCode::OK);
    let ratelimit = header(&third, "ratelimit");
    assert!(ratelimit.ends_with("\"customer\";r=8;t=6"), "{ratelimit}");
}

#[test]
fn a_per_request_rule_cannot_count_by_outcome_or_settle() {
    let count_if = paused::builder()
        .rule(
            from_plan(Rule::new("customer", Limit::per_minute(2)))
                .count_if(tollgate::CountIf::status([401])),
        )
        .build()
        .unwrap_err();
    assert_eq!(
        count_if.to_string(),
        "rule \"customer\": count_if: not available on a rule whose limit comes from the request"
    );
    let settle = paused::builder()
        .rule(
            from_plan(Rule::new("customer", Limit::per_minute(2)))
                .settle(tollgate::Settle::header(HeaderName::from_static("x-used"))),
        )
        .build()
        .unwrap_err();
    assert_eq!(
        settle.to_string(),
        "rule \"customer\": settle: not available on a rule whose limit comes from the request"
    );
}
