//! Penalties (DESIGN §10) with exact numbers, on the memory store and on Redis (deny cache off
//! and on): a block's start and end, escalation and its forgetting, denials during a block,
//! `Limiter::block` / `unblock`, and the answer the middleware gives a blocked key.

use std::time::Duration;

use tollgate::algorithm::Outcome;
use tollgate::algorithm::Verdict;
use tollgate::clock::ManualClock;
use tollgate::RateLimitLayer;
use tollgate::{Limit, LimitError, Limiter, MemoryStore, Penalty, Rule};

#[cfg(feature = "redis")]
use crate::support::pages::every_page;
use crate::support::redis_server;

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);
const START: Duration = Duration::from_secs(1_750_000_000);

/// Where the tests run: the memory store, and Redis with and without its deny cache.
#[derive(Clone, Copy, Debug)]
enum Backend {
    Memory,
    #[cfg(feature = "redis")]
    Redis {
        cache: bool,
    },
}

fn backends() -> Vec<Backend> {
    #[allow(unused_mut)]
    let mut all = vec![Backend::Memory];
    #[cfg(feature = "redis")]
    all.extend([
        Backend::Redis { cache: false },
        Backend::Redis { cache: true },
    ]);
    all
}

/// A Redis server for the whole test binary's run of one test, and the limiters on it.
struct Bench {
    #[cfg(feature = "redis")]
    server: redis_server::RedisServer,
    prefix: std::cell::Cell<u32>,
}

impl Bench {
    fn new() -> Bench {
        Bench {
            #[cfg(feature = "redis")]
            server: redis_server::RedisServer::start(),
            prefix: std::cell::Cell::new(0),
        }
    }

    async fn limiter(&self, backend: Backend, clock: &ManualClock, rule: Rule) -> Limiter {
        self.prefix.set(self.prefix.get() + 1);
        let builder = Limiter::builder().rule(rule);
        match backend {
            Backend::Memory => builder.store(MemoryStore::with_clock(clock.clone())),
            #[cfg(feature = "redis")]
            Backend::Redis { cache } => builder.store(
                tollgate::RedisStore::builder()
                    .url(self.server.url())
                    .prefix(format!("t{}", self.prefix.get()))
                    .clock(clock.clone())
                    .deny_cache(cache)
                    .timeout(Duration::from_secs(5))
                    .build()
                    .await
                    .unwrap(),
            ),
        }
        .build()
        .unwrap()
    }
}

/// A denial as these tests check it: the verdict, the numbers the headers carry, and whether
/// it was an offence.
#[derive(Debug)]
struct Denied {
    retry_after: Duration,
    limit: u64,
    offence: bool,
}

fn denied(retry_after: Duration, limit: u64, offence: bool) -> Denied {
    Denied {
        retry_after,
        limit,
        offence,
    }
}

impl PartialEq<Denied> for Outcome {
    fn eq(&self, other: &Denied) -> bool {
        self.verdict
            == Verdict::Denied {
                retry_after: other.retry_after,
            }
            && self.limit == other.limit
            && self.remaining == 0
            && self.next_unit_in == other.retry_after
            && self.offence == other.offence
    }
}

fn admitted(outcome: &Outcome) -> bool {
    outcome.verdict.is_admitted()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_starts_at_the_denial_and_ends_exactly_d_later_unextended() {
    let bench = Bench::new();
    for backend in backends() {
        let clock = ManualClock::new(START);
        let rule = Rule::new("login", Limit::per_minute(3)).block(Penalty::fixed(10 * MINUTE));
        let limiter = bench.limiter(backend, &clock, rule).await;
        for _ in 0..3 {
            assert!(admitted(&limiter.charge("login", "k", 1).await.unwrap()));
        }
        // The fourth is the offence: blocked for ten minutes from this instant.
        let first = limiter.charge("login", "k", 1).await.unwrap();
        assert_eq!(first, denied(10 * MINUTE, 3, true), "{backend:?}");
        // Denials during the block report what is left of it and do not extend it.
        clock.advance(5 * MINUTE);
        for _ in 0..3 {
            let during = limiter.charge("login", "k", 1).await.unwrap();
            assert_eq!(during, denied(5 * MINUTE, 3, false), "{backend:?}");
        }
        clock.advance(5 * MINUTE - Duration::from_micros(1));
        let last = limiter.charge("login", "k", 1).await.unwrap();
        assert_eq!(
            last,
            denied(Duration::from_micros(1), 3, false),
            "{backend:?}"
        );
        // Ten minutes after the offence, the counters (refilled by then) decide again.
        clock.advance(Duration::from_micros(1));
        let after = limiter.charge("login", "k", 1).await.unwrap();
        assert!(admitted(&after), "{backend:?}: {after:?}");
        assert_eq!(after.remaining, 2, "{backend:?}");
        // Another key was never blocked.
        assert_eq!(
            limiter.charge("login", "other", 1).await.unwrap().remaining,
            2
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offences_escalate_the_last_duration_repeats_and_a_quiet_day_forgives() {
    let bench = Bench::new();
    for backend in backends() {
        let clock = ManualClock::new(START);
        let penalty = Penalty::escalating([MINUTE, 10 * MINUTE, HOUR], 24 * HOUR);
        let rule = Rule::new("api", Limit::per_hour(1)).block(penalty);
        let limiter = bench.limiter(backend, &clock, rule).await;
        let charge = || async { limiter.charge("api", "k", 1).await.unwrap() };
        assert!(admitted(&charge().await));
        // The bucket is empty for an hour: each denial after a block ends is a new offence.
        // (The retry is the longer of the block and the bucket's own wait.)
        assert_eq!(charge().await, denied(HOUR, 1, true), "{backend:?} 1st");
        clock.advance(MINUTE);
        assert_eq!(
            charge().await,
            denied(59 * MINUTE, 1, true),
            "{backend:?} 2nd"
        );
        clock.advance(10 * MINUTE);
        assert_eq!(charge().await, denied(HOUR, 1, true), "{backend:?} 3rd");
        clock.advance(HOUR);
        // 71 minutes in: the bucket has refilled, the block is over.
        assert!(admitted(&charge().await), "{backend:?}");
        assert_eq!(charge().await, denied(HOUR, 1, true), "{backend:?} 4th");
        // The last duration repeats; its block ends at 131 minutes.
        clock.advance(HOUR);
        assert!(admitted(&charge().await), "{backend:?}");
        // A day after the last block ended, less a microsecond: still remembered (5th: 1 h).
        clock.advance(24 * HOUR - Duration::from_micros(1));
        assert!(admitted(&charge().await), "{backend:?}");
        assert_eq!(charge().await, denied(HOUR, 1, true), "{backend:?} 5th");
        // A full day after that block: forgiven, the next offence is a first one again (1 min,
        // which the bucket's own wait of an hour outlasts; the block itself ends after 1 min).
        clock.advance(HOUR + 24 * HOUR);
        assert!(admitted(&charge().await), "{backend:?}");
        let first_again = charge().await;
        assert_eq!(first_again, denied(HOUR, 1, true), "{backend:?} forgiven");
        clock.advance(MINUTE - Duration::from_micros(1));
        assert_eq!(
            charge().await,
            denied(Duration::from_micros(1), 1, false),
            "{backend:?}: blocked for exactly one minute"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiter_block_and_unblock() {
    let bench = Bench::new();
    for backend in backends() {
        let clock = ManualClock::new(START);
        let rule = Rule::new("login", Limit::per_minute(3)).block(Penalty::fixed(10 * MINUTE));
        let limiter = bench.limiter(backend, &clock, rule).await;
        // An admin blocks a key that never offended: denied for exactly that long.
        limiter.block("login", "mallory", 2 * HOUR).await.unwrap();
        assert_eq!(
            limiter.charge("login", "mallory", 1).await.unwrap(),
            denied(2 * HOUR, 3, false),
            "{backend:?}"
        );
        clock.advance(HOUR);
        assert_eq!(
            limiter.check("login", "mallory", 1).await.unwrap(),
            denied(HOUR, 3, false),
            "{backend:?}: a check sees the block too"
        );
        // Unblocking lets the counters (never touched by the block) decide again.
        limiter.unblock("login", "mallory").await.unwrap();
        let after = limiter.charge("login", "mallory", 1).await.unwrap();
        assert!(admitted(&after), "{backend:?}");
        assert_eq!(after.remaining, 2);
        // An offence, then an unblock: its offence count is forgotten as well.
        for _ in 0..2 {
            limiter.charge("login", "mallory", 1).await.unwrap();
        }
        assert_eq!(
            limiter.charge("login", "mallory", 1).await.unwrap(),
            denied(10 * MINUTE, 3, true)
        );
        limiter.unblock("login", "mallory").await.unwrap();
        assert_eq!(
            limiter.charge("login", "mallory", 1).await.unwrap().verdict,
            Verdict::Denied {
                retry_after: 10 * MINUTE
            },
            "{backend:?}: still no units, so a new (first) offence"
        );
        // A reset forgets the block with the counters.
        limiter.reset("login", "mallory").await.unwrap();
        assert!(admitted(
            &limiter.charge("login", "mallory", 1).await.unwrap()
        ));
    }
}

#[tokio::test]
async fn blocking_needs_a_rule_with_a_penalty() {
    let limiter = Limiter::builder()
        .rule(Rule::new("plain", Limit::per_minute(3)))
        .build()
        .unwrap();
    let error = limiter.block("plain", "k", MINUTE).await.unwrap_err();
    assert!(matches!(error, LimitError::NoPenalty(ref rule) if rule == "plain"));
    assert_eq!(
        error.to_string(),
        "rate-limit rule \"plain\" has no penalty (block): its keys cannot be blocked"
    );
}

#[test]
fn a_zero_block_or_an_empty_escalation_is_a_configuration_error() {
    let error = |rule: Rule| RateLimitLayer::builder().rule(rule).build().unwrap_err();
    assert_eq!(
        error(Rule::new("login", Limit::per_minute(3)).block(Penalty::fixed(Duration::ZERO)))
            .to_string(),
        "rule \"login\": block: must be greater than zero (a block lasts at least 1 µs)"
    );
    assert_eq!(
        error(Rule::new("login", Limit::per_minute(3)).block(Penalty::escalating([], HOUR)))
            .to_string(),
        "rule \"login\": block.escalate: must list at least one duration"
    );
    assert_eq!(
        error(
            Rule::new("login", Limit::per_minute(3))
                .block(Penalty::escalating([MINUTE, Duration::ZERO], HOUR))
        )
        .to_string(),
        "rule \"login\": block.escalate: duration 2 of the list is zero: each block lasts at least 1 µs"
    );
}

/// A blocked key costs Redis one call per block and per second at most: the deny cache answers
/// it until the block ends, asking Redis again each second (a block lifted elsewhere).
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_answers_a_blocked_key_without_redis_until_the_block_ends() {
    let bench = Bench::new();
    let clock = ManualClock::new(START);
    let rule = Rule::new("login", Limit::per_minute(3)).block(Penalty::fixed(10 * MINUTE));
    let limiter = bench
        .limiter(Backend::Redis { cache: true }, &clock, rule)
        .await;
    let calls = || bench.server.command_calls("evalsha");
    let before = calls();
    for _ in 0..3 {
        limiter.charge("login", "k", 1).await.unwrap();
    }
    assert_eq!(
        limiter.charge("login", "k", 1).await.unwrap(),
        denied(10 * MINUTE, 3, true)
    );
    assert_eq!(calls() - before, 4);
    clock.advance(4 * MINUTE);
    for _ in 0..50 {
        assert_eq!(
            limiter.charge("login", "k", 1).await.unwrap(),
            denied(6 * MINUTE, 3, false)
        );
    }
    // The offence's answer is not cached (a denial after its block would be a new offence);
    // the first answer during the block is, until the block ends.
    assert_eq!(calls() - before, 5, "one call while the block lasts");
    clock.advance(6 * MINUTE);
    assert!(admitted(&limiter.charge("login", "k", 1).await.unwrap()));
    assert_eq!(calls() - before, 6);
    // `block` through this store replaces what the cache knew at once.
    limiter.block("login", "k", HOUR).await.unwrap();
    assert_eq!(
        limiter.charge("login", "k", 1).await.unwrap(),
        denied(HOUR, 3, false)
    );
    limiter.unblock("login", "k").await.unwrap();
    assert!(admitted(&limiter.charge("login", "k", 1).await.unwrap()));
}

/// A sharded rule spreads one key over several Redis keys: it cannot hold one block.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_rule_cannot_have_a_penalty_on_redis() {
    let server = redis_server::RedisServer::start();
    let store = tollgate::RedisStore::builder()
        .url(server.url())
        .shard_rule("hot", 4)
        .build()
        .await
        .unwrap();
    let error = Limiter::builder()
        .rule(Rule::new("hot", Limit::per_second(100)).block(Penalty::fixed(MINUTE)))
        .store(store)
        .build()
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "rule \"hot\": block: a rule sharded over several Redis keys cannot block keys"
    );
}

/// Every key blocked — by its rule's penalty or by hand — is listed with what is left of its
/// block; an ended or lifted block is not; bad names are errors. On every backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_keys_are_listed_with_what_is_left_of_their_blocks() {
    let bench = Bench::new();
    for backend in backends() {
        let clock = ManualClock::new(START);
        let rule = Rule::new("login", Limit::per_minute(1)).block(Penalty::fixed(10 * MINUTE));
        let limiter = bench.limiter(backend, &clock, rule).await;
        // `offender` is blocked by its second request, `admin` by hand.
        for _ in 0..2 {
            limiter.charge("login", "offender", 1).await.unwrap();
        }
        limiter.block("login", "admin", HOUR).await.unwrap();
        clock.advance(MINUTE);
        let listed = all_blocks(&limiter, "login").await;
        assert_eq!(
            listed,
            [
                ("admin".to_owned(), HOUR - MINUTE, 0),
                ("offender".to_owned(), 9 * MINUTE, 1)
            ],
            "{backend:?}"
        );
        let one = limiter.blocked("login", "offender").await.unwrap().unwrap();
        assert_eq!((one.remaining, one.offences), (9 * MINUTE, 1));
        assert_eq!(limiter.blocked("login", "nobody").await.unwrap(), None);

        limiter.unblock("login", "admin").await.unwrap();
        clock.advance(9 * MINUTE);
        assert!(
            all_blocks(&limiter, "login").await.is_empty(),
            "{backend:?}"
        );
        assert_eq!(limiter.blocked("login", "offender").await.unwrap(), None);

        assert!(matches!(
            limiter.blocks("nope", None).await,
            Err(LimitError::UnknownRule(name)) if name == "nope"
        ));
        let cursor = tollgate::store::Cursor::new("not a cursor");
        match limiter.blocks("login", Some(cursor)).await {
            Err(LimitError::Store(e)) => {
                assert_eq!(e.kind(), tollgate::store::StoreErrorKind::BadCursor)
            }
            other => panic!("{other:?}"),
        }
    }
    let plain = Limiter::builder()
        .rule(Rule::new("plain", Limit::per_minute(1)))
        .build()
        .unwrap();
    assert!(matches!(
        plain.blocks("plain", None).await,
        Err(LimitError::NoPenalty(_))
    ));
}

/// Every page of `rule`'s blocks, as (key, remaining, offences), sorted by key.
async fn all_blocks(limiter: &Limiter, rule: &str) -> Vec<(String, Duration, u64)> {
    let (blocks, _) = every_page(|cursor| limiter.blocks(rule, cursor)).await;
    let mut all: Vec<(String, Duration, u64)> = blocks
        .into_iter()
        .map(|b| (String::from_utf8(b.key).unwrap(), b.remaining, b.offences))
        .collect();
    all.sort();
    all
}
