//! The Redis store against real `redis-server` processes on loopback ports: the same answers as
//! the memory store, exact limits under concurrency from two app instances, and the failure
//! paths (killed, restarted, paused server).

#![cfg(feature = "redis")]

use crate::differential;
use crate::support::calendar;
use crate::support::hammer;
#[allow(dead_code)]
#[path = "../../examples/redis.rs"]
mod redis_example;
use crate::support::redis_server;
use crate::support::reservations;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use proptest::prelude::*;
use tollgate::algorithm::{Mode, Verdict};
use tollgate::clock::ManualClock;
use tollgate::config::Config;
use tollgate::store::{Charge, RuleName, Store, StoreErrorKind};
use tollgate::{
    FailurePolicy, Key, Limit, LimitError, Limiter, MemoryStore, Penalty, RateLimitLayer,
    RedisStore, Rule,
};
use tower::{service_fn, Layer, ServiceExt};

use super::ENGINE;
use hammer::hammer;
use redis_server::RedisServer;

const DAY: Duration = Duration::from_secs(86_400);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::builder()
        .url(server.url())
        .build()
        .await
        .expect("connect")
}

/// What the first rule answered at each step of `scenario` (admitted, units left, balance), on
/// Redis with its deny cache on and off.
async fn first_rule_answers(
    redis: impl Fn() -> tollgate::store::RedisStoreBuilder,
    prefix: &str,
    scenario: &differential::Scenario,
) -> Vec<Vec<(bool, u64, i64)>> {
    let runs = differential::run_with_and_without_deny_cache(redis, prefix, scenario).await;
    runs.iter()
        .map(|answers| {
            answers
                .iter()
                .map(|a| (a[0].verdict.is_admitted(), a[0].remaining, a[0].balance))
                .collect()
        })
        .collect()
}

/// Scenarios (`config`'s) against the memory store, each run with the store's defaults (deny
/// cache on) and with the deny cache off.
fn differential_cases(config: ProptestConfig) {
    differential_cases_on(&ENGINE.server(), config);
}

fn differential_cases_on(server: &RedisServer, config: ProptestConfig) {
    let rt = runtime();
    let case = AtomicU64::new(0);
    proptest!(config, |(scenario in differential::scenario())| {
        rt.block_on(async {
            let case = case.fetch_add(1, Ordering::Relaxed);
            let redis = || RedisStore::builder().url(server.url());
            differential::run_with_and_without_deny_cache(redis, &format!("diff{case}"), &scenario)
                .await;
        });
    });
}

#[test]
fn same_answers_as_the_memory_store_1024_scenarios() {
    differential_cases(differential::config(1_024));
}

/// Built lazily while Redis is down, the store answers `Unavailable` at once (the failure policy's
/// turn), and decides as soon as Redis is up, with no restart of the app; a configuration file
/// builds that way unless it fails closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connected_lazily_a_store_built_while_redis_is_down_decides_once_it_is_up() {
    let mut server = ENGINE.server();
    server.kill();
    let store = RedisStore::builder()
        .url(server.url())
        .connect_lazily(true)
        .build()
        .await
        .expect("built without Redis");
    let limiter = Limiter::builder()
        .rule(Rule::new("api", Limit::per_hour(3)))
        .store(store)
        .build()
        .unwrap();
    match limiter.charge("api", "k", 1).await {
        Err(LimitError::Store(error)) => assert_eq!(error.kind(), StoreErrorKind::Unavailable),
        other => panic!("{other:?}"),
    }
    server.restart();
    // A new attempt at most once a second: bounded polling for the first decision.
    let deadline = Instant::now() + Duration::from_secs(10);
    let outcome = loop {
        match limiter.charge("api", "k", 1).await {
            Ok(outcome) => break outcome,
            Err(LimitError::Store(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(other) => panic!("no recovery: {other}"),
        }
    };
    assert_eq!(outcome.remaining, 2);
    assert_eq!(limiter.charge("api", "k", 1).await.unwrap().remaining, 1);

    // From a file: failing open it starts without Redis, failing closed it does not.
    server.kill();
    let file = |policy: &str| {
        format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\non_failure = \"{policy}\"\n\n\
             [[rules]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\n",
            server.url()
        )
    };
    let parse =
        |policy: &str| Config::parse(tollgate::config::ConfigFormat::Toml, &file(policy)).unwrap();
    assert!(parse("open").connect().await.is_ok(), "fail open: starts");
    let refused = parse("closed")
        .connect()
        .await
        .expect_err("fail closed: no start");
    assert!(refused.to_string().contains("store.url"), "{refused}");
}

/// A managed service's Redis: `SCRIPT`, `FUNCTION`, `CONFIG` and `CLIENT` do not exist (renamed
/// away, as services that forbid them answer "unknown command"). The store connects, and decides
/// every scenario as the memory store does, with `EVALSHA` and `EVAL` alone: a script the server
/// does not know is sent once by its source.
#[test]
fn with_script_config_client_and_function_refused_same_answers_by_evalsha_and_eval_alone() {
    let forbidden = ["SCRIPT", "FUNCTION", "CONFIG", "CLIENT"];
    let renames: Vec<&str> = forbidden
        .iter()
        .flat_map(|command| ["--rename-command", command, ""])
        .collect();
    let server = ENGINE.server_with(&renames);
    assert!(
        server.run("SCRIPT FLUSH").contains("unknown command"),
        "SCRIPT is refused"
    );
    differential_cases_on(&server, differential::config(64));
    assert!(
        server.command_calls("eval") > 0,
        "scripts were sent by source"
    );
    assert!(
        server.command_calls("evalsha") > server.command_calls("eval"),
        "then by their hash"
    );
}

/// The soak: `cargo test --all-features --test redis_store redis::single -- --ignored`.
#[test]
#[ignore = "soak: 50 000 scenarios, several minutes"]
fn same_answers_as_the_memory_store_soak() {
    differential_cases(differential::soak_config(50_000));
}

/// Found by the differential test with the deny cache on: a key Redis holds no state for is a
/// new key whenever it is asked about, so a denial there (an initial balance of 1, a check of 4)
/// does not shrink with the clock: 326 µs later Redis still says 750 ms, and so must the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_of_a_key_without_state_is_not_cached_as_shrinking_750_ms_stays_750_ms() {
    use differential::Step;
    use tollgate::algorithm::{Algorithm, TokenBucket};
    let server = ENGINE.server();
    let bucket = Algorithm::TokenBucket(
        TokenBucket::new(4, Duration::from_secs(1))
            .with_capacity(8)
            .with_initial(1),
    );
    let steps = vec![
        Step::Apply(vec![(0, 1, 4, Mode::Check)]),
        Step::Advance(326),
        Step::Apply(vec![(0, 1, 4, Mode::Check)]),
    ];
    let scenario = (1_750_000_000_000_000, vec![(bucket, None)], steps);
    let redis = RedisStore::builder().url(server.url()).prefix("fresh");
    let answers = differential::run(redis, &scenario).await;
    assert_eq!(
        answers[1][0].verdict,
        Verdict::Denied {
            retry_after: Duration::from_millis(750)
        }
    );
}

/// Found by the differential soak: a window counting far more than a lowered capacity (37,529,998
/// units counted under a limit brought by a request, then the rule's own one a minute) owes what
/// is forgiven when the window ends, so a reservation of 0 units there waits for the next window
/// on both stores. Redis used to deny it: it bounded the debt by what the windows of 71 years pay
/// back (37,529,996 at one a minute) where the bound is on how far the reservation reaches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_of_nothing_on_an_over_counted_window_waits_for_the_next_window() {
    use differential::Step;
    use tollgate::algorithm::{Algorithm, FixedWindow, ReserveBound};
    let server = ENGINE.server();
    let minute = Duration::from_secs(60);
    let own = Algorithm::FixedWindow(FixedWindow::new(1, minute));
    let brought =
        Algorithm::FixedWindow(FixedWindow::new(37_529_995, minute).with_capacity(75_059_990));
    let unbounded = Mode::Reserve(ReserveBound::default());
    let steps = vec![
        Step::ApplyUnder(vec![(0, 1, 37_529_998, unbounded, brought)]),
        Step::Apply(vec![(0, 1, 0, unbounded)]),
    ];
    let scenario = (1_708_162_835_317_705, vec![(own, None)], steps);
    let redis = RedisStore::builder().url(server.url()).prefix("forgiven");
    let answers = differential::run(redis, &scenario).await;
    assert!(
        matches!(answers[1][0].verdict, Verdict::Reserved { wait } if wait < minute),
        "{:?}",
        answers[1][0]
    );
}

/// A fixed window's charge inside its window is answered by Redis as one integer while the units
/// left times the period stay below 2^51, as three doubles above: windows of a minute whose units
/// left are 37,529,996 (2^51 / 60,000,000, rounded down: one integer), 37,529,997 and 37,529,998
/// (three doubles) before a charge give the memory store's answers, allowed and denied, within a
/// window and after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_answers_alike_on_both_sides_of_its_one_integer_answer() {
    use differential::Step;
    use tollgate::algorithm::{Algorithm, FixedWindow};
    let server = ENGINE.server();
    let minute = Duration::from_secs(60);
    let rules = [37_529_997, 37_529_998, 37_529_999]
        .map(|limit| {
            (
                Algorithm::FixedWindow(FixedWindow::new(limit, minute)),
                None,
            )
        })
        .to_vec();
    let mut steps = Vec::new();
    for rule in 0..rules.len() {
        steps.extend([
            // The first charge makes the key; the next ones count in place, with 37,529,996 +
            // `rule` left before the second.
            Step::Apply(vec![(rule, 0, 1, Mode::Charge)]),
            Step::Apply(vec![(rule, 0, 1, Mode::Charge)]),
            Step::Apply(vec![(rule, 0, 37_529_990, Mode::Charge)]),
            Step::Apply(vec![(rule, 0, 37_529_990, Mode::Charge)]),
            Step::Advance(30_000_000),
            Step::Apply(vec![(rule, 0, 4, Mode::Charge)]),
            Step::Advance(60_000_000),
            Step::Apply(vec![(rule, 0, 3, Mode::Charge)]),
            Step::Apply(vec![(rule, 0, 2, Mode::Charge)]),
        ]);
    }
    let scenario = (1_750_000_000_000_000, rules, steps);
    let redis = RedisStore::builder().url(server.url()).prefix("integer");
    let answers = differential::run(redis, &scenario).await;
    let admitted: Vec<bool> = answers
        .iter()
        .map(|outcomes| outcomes[0].verdict.is_admitted())
        .collect();
    let one_rule = [true, true, true, false, true, true, true];
    assert_eq!(admitted, one_rule.repeat(3));
}

/// DESIGN §13 on both stores: a key keeps what it has when the request brings another limit, at
/// most the new capacity (10 a minute: 40 of 100 left, then a capacity of 20, is 20 at once, not
/// a lockout of four minutes), and the time accrued is read at a new rate (40 of 100 a minute,
/// then 20 a minute, is 8). Through the general code (a check, a reservation, a batch) and the
/// fast path (a single charge), with the stores' defaults (the deny cache on) and without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_limit_changes_keeps_what_fits_on_both_stores() {
    use differential::Step;
    use tollgate::algorithm::{Algorithm, ReserveBound, TokenBucket};
    let server = ENGINE.server();
    let minute = Duration::from_secs(60);
    let bucket = |rate, capacity| {
        Algorithm::TokenBucket(TokenBucket::new(rate, minute).with_capacity(capacity))
    };
    let (plan, small, large) = (bucket(10, 100), bucket(10, 20), bucket(10, 200));
    let (hundred, twenty) = (bucket(100, 100), bucket(20, 20));
    let check = |limit: &Algorithm| Step::ApplyUnder(vec![(0, 1, 0, Mode::Check, limit.clone())]);
    let charge =
        |cost, limit: &Algorithm| Step::ApplyUnder(vec![(0, 1, cost, Mode::Charge, limit.clone())]);
    let steps = vec![
        // Capacity only: 40 of 100, then 20 at once, then one more unit every 6 s.
        charge(60, &plan),
        check(&large),
        check(&small),
        charge(20, &small),
        charge(1, &small),
        Step::ApplyUnder(vec![(
            0,
            1,
            1,
            Mode::Reserve(ReserveBound::default()),
            small.clone(),
        )]),
        Step::Advance(12_000_000),
        check(&plan),
        // Idle: full under the smaller limit.
        Step::Advance(600_000_000),
        check(&small),
        check(&plan),
        // Rate and capacity together: 40 of 100 a minute, then 20 a minute: 8.
        Step::Reset(0, 1),
        charge(60, &hundred),
        check(&twenty),
        Step::ApplyUnder(vec![(0, 1, 8, Mode::Charge, twenty.clone())]),
        charge(1, &twenty),
    ];
    let scenario = (1_750_000_000_000_000, vec![(plan.clone(), None)], steps);
    let redis = || RedisStore::builder().url(server.url());
    for seen in first_rule_answers(redis, "limits", &scenario).await {
        assert_eq!(
            seen,
            [
                (true, 40, 40),
                (true, 40, 40),
                (true, 20, 20),
                (true, 0, 0),
                (false, 0, 0),
                (true, 0, -1),
                (true, 1, 1),
                (true, 20, 20),
                (true, 100, 100),
                (true, 40, 40),
                (true, 8, 8),
                (true, 0, 0),
                (false, 0, 0),
            ]
        );
    }
}

/// DESIGN §13 for fixed windows on both stores: a window keeps its count and compares it with
/// the limit in force (60 of 100 used, moved to 80, leaves 20; 80 used, moved to 50, none and a
/// balance of −30, the next window a whole 50: the count over the limit is forgiven when its
/// window ends); with roll-over the units not paid back are read under the new capacity; a
/// reservation holds the windows it reaches into under any limit. Through the fast path (a lone
/// charge of a window without roll-over), the general script (checks, roll-over, reservations, a
/// rule with a penalty), with the deny cache on and off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_whose_limit_changes_counts_alike_on_both_stores() {
    use differential::Step;
    use tollgate::algorithm::{Algorithm, FixedWindow, ReserveBound, WindowStart};
    use tollgate::Penalty;
    let server = ENGINE.server();
    let minute = Duration::from_secs(60);
    let window = |limit, capacity| {
        Algorithm::FixedWindow(
            FixedWindow::new(limit, minute)
                .with_capacity(capacity)
                .with_start(WindowStart::Aligned(Duration::ZERO)),
        )
    };
    let (hundred, eighty, fifty) = (window(100, 100), window(80, 80), window(50, 50));
    let (ten, twenty, five) = (window(10, 10), window(20, 20), window(5, 5));
    let (roll30, roll20) = (window(10, 30), window(10, 20));
    let on = |rule, cost, mode, limit: &Algorithm| {
        Step::ApplyUnder(vec![(rule, 1, cost, mode, limit.clone())])
    };
    let charge = |cost, limit: &Algorithm| on(0, cost, Mode::Charge, limit);
    let check = |limit: &Algorithm| on(0, 0, Mode::Check, limit);
    let reserve = Mode::Reserve(ReserveBound::default());
    let steps = vec![
        // Up: 60 of 100, then 80: 20 left, then none.
        charge(60, &hundred),
        check(&eighty),
        charge(20, &eighty),
        charge(1, &eighty),
        // Down below the count: 80 used, moved to 50, −30 (even a check is refused); the next
        // window is a whole 50: the 30 over the limit are forgiven when their window ends.
        check(&fifty),
        charge(1, &fifty),
        Step::Advance(60_000_000),
        check(&fifty),
        charge(20, &fifty),
        // Roll-over: 10 a minute up to 30, 25 spent; a window later 15 spent, and one more:
        // 14 left under 30, 4 under 20.
        Step::Advance(60_000_000),
        Step::Reset(0, 1),
        charge(25, &roll30),
        Step::Advance(60_000_000),
        charge(1, &roll30),
        check(&roll20),
        charge(4, &roll20),
        charge(1, &roll20),
        // A reservation: 16 at 10 a minute holds this window and 6 of the next, under any
        // limit: none left now under 20 or 5; the next window has 4 under 10, and under 5 it is
        // over by 1, forgiven when it ends: a whole 5 the window after.
        Step::Advance(180_000_000),
        Step::Reset(0, 1),
        on(0, 16, reserve, &ten),
        check(&twenty),
        check(&five),
        Step::Advance(60_000_000),
        check(&ten),
        check(&five),
        Step::Advance(60_000_000),
        check(&five),
        // A rule with a penalty takes the general script: 60 of 100, then 80: 20 left, taken.
        on(1, 60, Mode::Charge, &hundred),
        on(1, 20, Mode::Charge, &eighty),
        on(1, 1, Mode::Charge, &eighty),
    ];
    let rules = vec![
        (hundred.clone(), None),
        (
            hundred.clone(),
            Some(Penalty::fixed(Duration::from_secs(1))),
        ),
    ];
    // A whole minute: aligned windows start with the scenario.
    let scenario = (1_750_000_020_000_000, rules, steps);
    let redis = || RedisStore::builder().url(server.url());
    for seen in first_rule_answers(redis, "fixed", &scenario).await {
        assert_eq!(
            seen,
            [
                (true, 40, 40),
                (true, 20, 20),
                (true, 0, 0),
                (false, 0, 0),
                (false, 0, -30),
                (false, 0, -30),
                (true, 50, 50),
                (true, 30, 30),
                (true, 5, 5),
                (true, 14, 14),
                (true, 4, 4),
                (true, 0, 0),
                (false, 0, 0),
                (true, 0, -6),
                (false, 0, -6),
                (false, 0, -6),
                (true, 4, 4),
                (false, 0, -1),
                (true, 5, 5),
                (true, 40, 40),
                (true, 0, 0),
                (false, 0, 0),
            ]
        );
    }
}

/// Issue 39 (DESIGN §13) on both stores, with their defaults (the deny cache on) and without
/// the deny cache: 100 an hour, 60 used, moved to 20: denied for the rest of the hour, then 20
/// fresh the next hour, not two more hours of nothing; a reservation made in the over-counted
/// hour is paid by the next one and holds 5 of its 20. Key 1 through the fast path (lone
/// charges), key 2 through the general script (a check, a reservation). Key 0, a sliding window:
/// the next hour the 60 weigh as a full window of 20 (one unit 3 minutes in, not 41).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_above_a_lowered_window_limit_is_forgiven_when_its_window_ends_on_both_stores() {
    use differential::Step;
    use tollgate::algorithm::{Algorithm, FixedWindow, ReserveBound, SlidingWindow, WindowStart};
    let server = ENGINE.server();
    let hour = Duration::from_secs(3_600);
    let per_hour = |limit| {
        Algorithm::FixedWindow(
            FixedWindow::new(limit, hour).with_start(WindowStart::Aligned(Duration::ZERO)),
        )
    };
    let (hundred, twenty) = (per_hour(100), per_hour(20));
    let sliding = |limit| {
        Algorithm::SlidingWindow(
            SlidingWindow::new(limit, hour).with_start(WindowStart::Aligned(Duration::ZERO)),
        )
    };
    let on = |key, cost, mode, limit: &Algorithm| {
        Step::ApplyUnder(vec![(0, key, cost, mode, limit.clone())])
    };
    let charge = |cost| on(1, cost, Mode::Charge, &twenty);
    let steps = vec![
        on(1, 60, Mode::Charge, &hundred),
        on(2, 60, Mode::Charge, &hundred),
        on(0, 60, Mode::Charge, &sliding(100)),
        Step::Advance(1_800_000_000),
        charge(1),
        on(2, 0, Mode::Check, &twenty),
        on(2, 5, Mode::Reserve(ReserveBound::default()), &twenty),
        on(0, 1, Mode::Charge, &sliding(20)),
        Step::Advance(1_799_999_999),
        charge(1),
        Step::Advance(1),
        charge(1),
        charge(19),
        charge(1),
        on(2, 0, Mode::Check, &twenty),
        on(0, 0, Mode::Check, &sliding(20)),
        Step::Advance(180_000_000),
        on(0, 1, Mode::Charge, &sliding(20)),
    ];
    // A whole UTC hour: aligned windows start with the scenario.
    let scenario = (1_750_003_200_000_000, vec![(hundred.clone(), None)], steps);
    let redis = || RedisStore::builder().url(server.url());
    let secs = Duration::from_secs;
    let denied = |retry_after| Verdict::Denied { retry_after };
    let expected = [
        (Verdict::Allowed, 40, 40),
        (Verdict::Allowed, 40, 40),
        (Verdict::Allowed, 40, 40),
        (denied(secs(1_800)), 0, -40),
        (denied(secs(1_800)), 0, -40),
        (Verdict::Reserved { wait: secs(1_800) }, 0, -5),
        (denied(secs(1_980)), 0, 0),
        (denied(Duration::from_micros(1)), 0, -40),
        (Verdict::Allowed, 19, 19),
        (Verdict::Allowed, 0, 0),
        (denied(secs(3_600)), 0, 0),
        (Verdict::Allowed, 15, 15),
        (Verdict::Allowed, 0, 0),
        (Verdict::Allowed, 0, 0),
    ];
    for answers in differential::run_with_and_without_deny_cache(redis, "forgiven", &scenario).await
    {
        let seen: Vec<(Verdict, u64, i64)> = answers
            .iter()
            .map(|a| (a[0].verdict, a[0].remaining, a[0].balance))
            .collect();
        assert_eq!(seen, expected);
    }
}

/// The memory store's exact numbers, through Redis: a hand-picked scenario that the property
/// test might take long to find (a sliding log at the edge of its window, a burst pool split).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_picked_edges_match() {
    use tollgate::algorithm::{Algorithm, BurstPool, SlidingLog, TokenBucket};
    let server = ENGINE.server();
    let clock = ManualClock::new(Duration::from_secs(1_750_000_000));
    let redis = RedisStore::builder()
        .url(server.url())
        .clock(clock.clone())
        .deny_cache(false)
        .build()
        .await
        .unwrap();
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let log = Algorithm::SlidingLog(SlidingLog::new(3, Duration::from_secs(1)));
    let pool = Algorithm::BurstPool(BurstPool::new(
        TokenBucket::new(2, Duration::from_secs(1)),
        TokenBucket::new(1, Duration::from_secs(3)).with_capacity(3),
    ));
    for step in 0..40 {
        for (rule, algorithm, cost) in [("log", &log, 1), ("pool", &pool, 2)] {
            let batch = [Charge::new(RuleName::new(rule), algorithm, b"k", cost)];
            let expected = memory.apply(&batch).await.unwrap();
            let got = redis.apply(&batch).await.unwrap();
            assert_eq!(got, expected, "step {step}, rule {rule}");
        }
        clock.advance(Duration::from_micros(if step % 3 == 0 {
            1_000_000
        } else {
            333_333
        }));
    }
}

/// Two app instances (two stores, two connections) hammering one key concurrently: exactly the
/// limit passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_hammering_one_key_admit_exactly_the_limit() {
    let server = ENGINE.server();
    let limiters: Vec<Limiter> = futures::future::join_all((0..2).map(|_| async {
        Limiter::builder()
            .rule(Rule::new("api", Limit::per_day(100)))
            .store(store(&server).await)
            .build()
            .unwrap()
    }))
    .await;
    assert_eq!(hammer(&limiters, "api", 8, 40).await, 100);
}

type Body = Full<Bytes>;

fn ok_service(
) -> impl tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send>
       + Clone {
    service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    })
}

fn request(ip: &str) -> Request<Body> {
    let mut req = Request::get("/").body(Body::default()).unwrap();
    req.extensions_mut()
        .insert(SocketAddr::new(ip.parse().unwrap(), 40_000));
    req
}

/// The layer as users meet it, on two instances sharing one Redis: two rules (per IP and
/// global) are one script call per request, and the headers carry Redis's numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_on_two_instances_share_the_limits_in_one_call_per_request() {
    let server = ENGINE.server();
    let mut services = Vec::new();
    for _ in 0..2 {
        let layer = RateLimitLayer::builder()
            .rule(Rule::new("per-ip", Limit::per_day(3)).key(Key::peer_ip()))
            .rule(Rule::new("global", Limit::per_day(5)))
            .store(
                RedisStore::builder()
                    .url(server.url())
                    .deny_cache(false)
                    .build()
                    .await
                    .unwrap(),
            )
            .build()
            .unwrap();
        services.push(layer.layer(ok_service()));
    }
    let calls_before = server.command_calls("evalsha");
    let mut statuses = Vec::new();
    for (i, ip) in [
        "10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.3",
    ]
    .iter()
    .enumerate()
    {
        let response = services[i % 2].clone().oneshot(request(ip)).await.unwrap();
        statuses.push(response.status().as_u16());
        if i == 0 {
            assert_eq!(
                response.headers()["ratelimit"],
                "\"per-ip\";r=2;t=28800, \"global\";r=4;t=17280"
            );
        }
    }
    // 10.0.0.1 gets three, 10.0.0.2 two; the global five are then gone.
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    assert_eq!(server.command_calls("evalsha") - calls_before, 7);
}

/// A value the store cannot read — written by an earlier version in its format, or by a
/// rule of another algorithm under the same name (a hash where a string is expected, or the
/// reverse) — is a new key: the charge is decided as for a key never seen, never an error, and
/// the key is written again in its own format, with its expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_of_another_format_or_type_are_new_keys() {
    let server = ENGINE.server();
    let redis = store(&server).await;
    let limiter = Limiter::builder()
        .rule(Rule::new("bucket", Limit::per_minute(10)))
        .rule(Rule::new(
            "pool",
            Limit::per_minute(10).pool(5, 1, Duration::from_secs(60)),
        ))
        .rule(Rule::new(
            "window",
            Limit::fixed_window(5, Duration::from_secs(60)),
        ))
        .rule(Rule::new(
            "sliding",
            Limit::sliding_window(5, Duration::from_secs(60)),
        ))
        .store(redis.clone())
        .build()
        .unwrap();
    let name = |rule: &str, key: &str| {
        String::from_utf8(redis.key_names(rule, key.as_bytes()).remove(0)).unwrap()
    };
    // The earlier formats, each an exhausted key there: the token bucket's time as text, then
    // (before it kept the moment it was empty) a tag `T` and the moment it is full again as a
    // double; the burst pool's two such moments.
    let far = 4_000_000_000_000_000u64;
    server.run(&format!("SET {} {far}", name("bucket", "old")));
    let full_again: String = [b'T']
        .into_iter()
        .chain((far as f64).to_le_bytes())
        .map(|b| format!("\\x{b:02x}"))
        .collect();
    server.run(&format!(
        "SET {} \"{full_again}\"",
        name("bucket", "previous")
    ));
    let strlen = server.run(&format!("STRLEN {}", name("bucket", "previous")));
    assert_eq!(strlen.trim(), ":9", "a tag byte and a double");
    server.run(&format!("SET {} p{far},{far}", name("pool", "old")));
    server.run(&format!("SET {} w{far},0", name("window", "old")));
    server.run(&format!("SET {} s{far},5,5", name("sliding", "old")));
    // Another algorithm's type of value.
    server.run(&format!("HSET {} field 7", name("bucket", "other")));
    server.run(&format!("SET {} 12345", name("pool", "other")));
    server.run(&format!("SET {} 12345", name("window", "other")));
    server.run(&format!("HSET {} field 7", name("sliding", "other")));
    let earlier = [("bucket", "previous", 10)].into_iter();
    for (rule, key, limit) in ["old", "other"]
        .into_iter()
        .flat_map(|key| {
            [("bucket", 10), ("pool", 15), ("window", 5), ("sliding", 5)]
                .map(|(rule, limit)| (rule, key, limit))
        })
        .chain(earlier)
    {
        // A check goes through the script's general code; a charge, through its fast path.
        let checked = limiter.check(rule, key, limit).await.unwrap();
        assert!(checked.is_allowed(), "{rule} {key}: {checked:?}");
        let outcome = limiter.charge(rule, key, 1).await.unwrap();
        assert!(outcome.is_allowed(), "{rule} {key}: {outcome:?}");
        assert_eq!(outcome.remaining, limit - 1, "{rule} {key}");
        let ttl: i64 = server.run(&format!("PTTL {}", name(rule, key)))[1..]
            .trim()
            .parse()
            .unwrap();
        assert!((1..=120_000).contains(&ttl), "{rule} {key} expires: {ttl}");
        let again = limiter.charge(rule, key, 1).await.unwrap();
        assert_eq!(again.remaining, limit - 2, "{rule} {key}: counted on");
    }
}

/// A sliding window's key as the version before wrote it (the current count in a field of its
/// own, the previous window's under `p`: what this version still writes for limits of 2^26 or
/// more a window) is read as written, so an upgrade resets no sliding window; the next window's
/// first charge keeps both counts in one field. The same charges on the memory store give the
/// same answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_window_stored_by_the_version_before_keeps_its_counts() {
    let server = ENGINE.server();
    // A minute's start (1_750_000_020 = 60 × 29_166_667), in µs.
    let window = 1_750_000_020_000_000u64;
    let clock = ManualClock::new(Duration::from_micros(window - 50_000_000));
    let limit = Limit::sliding_window(10, Duration::from_secs(60)).aligned();
    let redis = RedisStore::builder()
        .url(server.url())
        .clock(clock.clone())
        .build()
        .await
        .unwrap();
    let on_redis = Limiter::builder()
        .rule(Rule::new("sliding", limit.clone()))
        .store(redis.clone())
        .build()
        .unwrap();
    let in_memory = Limiter::builder()
        .rule(Rule::new("sliding", limit))
        .store(MemoryStore::builder().clock(clock.clone()).build())
        .build()
        .unwrap();
    // In memory: 4 units in the window before, 2 in this one.
    in_memory.charge("sliding", "k", 4).await.unwrap();
    clock.advance(Duration::from_secs(55));
    in_memory.charge("sliding", "k", 2).await.unwrap();
    clock.advance(Duration::from_secs(25));
    // In Redis, the same counts as the version before stored them.
    let name = String::from_utf8(redis.key_names("sliding", b"k").remove(0)).unwrap();
    let field: String = [b'S']
        .into_iter()
        .chain((window as f64).to_le_bytes())
        .map(|b| format!("\\x{b:02x}"))
        .collect();
    server.run(&format!("HSET {name} \"{field}\" 2 p 4"));
    server.run(&format!("PEXPIRE {name} 120000"));
    // Half-way through the window: 2 + 4 × 1/2 used, 1 more.
    let upgraded = on_redis.charge("sliding", "k", 1).await.unwrap();
    assert_eq!(upgraded.remaining, 5, "{upgraded:?}");
    assert_eq!(upgraded, in_memory.charge("sliding", "k", 1).await.unwrap());
    // The next window: the 3 units of this one weigh on it, now from one field.
    clock.advance(Duration::from_secs(40));
    let next = on_redis.charge("sliding", "k", 1).await.unwrap();
    assert_eq!(next, in_memory.charge("sliding", "k", 1).await.unwrap());
    assert_eq!(server.run(&format!("HLEN {name}")).trim(), ":1");
    let later = on_redis.check("sliding", "k", 6).await.unwrap();
    assert_eq!(later, in_memory.check("sliding", "k", 6).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_expire_when_their_state_equals_a_new_keys() {
    let server = ENGINE.server();
    let redis = store(&server).await;
    let limiter = Limiter::builder()
        .rule(Rule::new("bucket", Limit::per_second(10)))
        .rule(Rule::new(
            "window",
            Limit::fixed_window(5, Duration::from_secs(60)).aligned(),
        ))
        .rule(Rule::new(
            "sliding",
            Limit::sliding_window(5, Duration::from_secs(10)),
        ))
        .rule(Rule::new(
            "log",
            Limit::sliding_log(5, Duration::from_secs(20)),
        ))
        .store(redis.clone())
        .build()
        .unwrap();
    let pttl = |rule: &str| -> i64 {
        let name = redis.key_names(rule, b"k").remove(0);
        let name = String::from_utf8(name).unwrap();
        server.run(&format!("PTTL {name}"))[1..]
            .trim()
            .parse()
            .unwrap()
    };
    limiter.charge("bucket", "k", 3).await.unwrap();
    let ttl = pttl("bucket");
    assert!(
        (250..=300).contains(&ttl),
        "3 of 10/s refill in 300 ms: {ttl}"
    );
    limiter.charge("window", "k", 1).await.unwrap();
    let ttl = pttl("window");
    assert!((0..=60_000).contains(&ttl), "until the minute ends: {ttl}");
    limiter.charge("sliding", "k", 1).await.unwrap();
    let ttl = pttl("sliding");
    assert!(
        (10_000..=20_000).contains(&ttl),
        "two windows from this one's start: {ttl}"
    );
    limiter.charge("log", "k", 1).await.unwrap();
    let ttl = pttl("log");
    assert!(
        (19_000..=20_000).contains(&ttl),
        "one period after the entry: {ttl}"
    );
    // A check writes nothing.
    limiter.check("bucket", "other", 1).await.unwrap();
    let name = String::from_utf8(redis.key_names("bucket", b"other").remove(0)).unwrap();
    assert_eq!(server.run(&format!("EXISTS {name}")).trim(), ":0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_answers_empty_keys_without_redis_until_they_refill() {
    let server = ENGINE.server();
    let clock = ManualClock::new(Duration::from_secs(1_750_000_000));
    let cached = RedisStore::builder()
        .url(server.url())
        .clock(clock.clone())
        .build()
        .await
        .unwrap();
    let limiter = Limiter::builder()
        .rule(Rule::new("hourly", Limit::per_hour(2)))
        .store(cached)
        .build()
        .unwrap();
    let before = server.command_calls("evalsha");
    for _ in 0..2 {
        assert!(limiter
            .charge("hourly", "k", 1)
            .await
            .unwrap()
            .verdict
            .is_admitted());
    }
    let denied = limiter.charge("hourly", "k", 1).await.unwrap();
    assert_eq!(
        denied.verdict,
        Verdict::Denied {
            retry_after: Duration::from_secs(1800)
        }
    );
    assert_eq!(server.command_calls("evalsha") - before, 3);
    clock.advance(Duration::from_secs(600));
    for _ in 0..20 {
        let local = limiter.charge("hourly", "k", 1).await.unwrap();
        assert_eq!(
            local,
            tollgate::algorithm::Outcome::new(
                Verdict::Denied {
                    retry_after: Duration::from_secs(1200)
                },
                2,
                0,
            )
            .with_balance(0)
            .with_next_unit_in(Duration::from_secs(1200))
            .with_full_in(Duration::from_secs(3000))
            .with_offence(false)
        );
    }
    assert_eq!(
        server.command_calls("evalsha") - before,
        3,
        "zero calls for cached denials"
    );
    // A peek still asks Redis; so does the key once it has refilled.
    assert_eq!(limiter.check("hourly", "k", 0).await.unwrap().remaining, 0);
    clock.advance(Duration::from_secs(1200));
    assert!(limiter
        .charge("hourly", "k", 1)
        .await
        .unwrap()
        .verdict
        .is_admitted());
    assert_eq!(server.command_calls("evalsha") - before, 5);
    // A reset through this store forgets the cached denial at once.
    assert!(!limiter
        .charge("hourly", "k", 1)
        .await
        .unwrap()
        .verdict
        .is_admitted());
    limiter.reset("hourly", "k").await.unwrap();
    assert!(limiter
        .charge("hourly", "k", 1)
        .await
        .unwrap()
        .verdict
        .is_admitted());

    // Without the cache, every request is a call.
    let uncached = Limiter::builder()
        .rule(Rule::new("hourly", Limit::per_hour(2)))
        .store(
            RedisStore::builder()
                .url(server.url())
                .prefix("nocache")
                .clock(clock.clone())
                .deny_cache(false)
                .build()
                .await
                .unwrap(),
        )
        .build()
        .unwrap();
    let before = server.command_calls("evalsha");
    for _ in 0..10 {
        uncached.charge("hourly", "k", 1).await.unwrap();
    }
    assert_eq!(server.command_calls("evalsha") - before, 10);
}

/// Issue 13, bug 1: a cached denial of a cost above one must say what Redis would say for that
/// cost. `per_minute(10)` refills one unit per 6 s; with the budget spent, a charge of 5 needs
/// 30 s, 1 s later 29 s, and at 6 s (one unit back) 24 s. Every answer of the cached store equals
/// the uncached store's, field by field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_answers_a_cost_of_5_with_retry_after_30_then_29_then_24() {
    let server = ENGINE.server();
    let clock = ManualClock::new(Duration::from_secs(1_750_000_000));
    let limiter = |prefix: &'static str, cache: bool| {
        let clock = clock.clone();
        let url = server.url();
        async move {
            let store = RedisStore::builder()
                .url(url)
                .prefix(prefix)
                .clock(clock)
                .deny_cache(cache)
                .build()
                .await
                .unwrap();
            Limiter::builder()
                .rule(Rule::new("api", Limit::per_minute(10)))
                .store(store)
                .build()
                .unwrap()
        }
    };
    let cached = limiter("cached", true).await;
    let truth = limiter("truth", false).await;
    let secs = Duration::from_secs;
    let mut calls = Vec::new();
    let mut retry_after = Vec::new();
    for advance in [0, 0, 0, 1, 0, 5, 0, 3] {
        clock.advance(secs(advance));
        let before = server.command_calls("evalsha");
        let got = cached.charge("api", "k", 5).await.unwrap();
        calls.push(server.command_calls("evalsha") - before);
        let expected = truth.charge("api", "k", 5).await.unwrap();
        assert_eq!(got, expected, "after {advance} s more");
        if let Verdict::Denied { retry_after: wait } = got.verdict {
            retry_after.push(wait.as_secs_f64());
        }
    }
    // Two charges of 5 spend the budget; then 30 s, 1 s later 29 s (locally), at 6 s one unit
    // is back (Redis is asked: 24 s, then locally again), 3 s later 21 s.
    assert_eq!(retry_after, [30.0, 29.0, 29.0, 24.0, 24.0, 21.0]);
    assert_eq!(calls, [1, 1, 1, 0, 0, 1, 0, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_rule_spreads_over_keys_and_never_exceeds_its_limit() {
    let server = ENGINE.server();
    let mut limiters = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::builder()
            .url(server.url())
            .shard_rule("global", 4)
            .build()
            .await
            .unwrap();
        limiters.push(
            Limiter::builder()
                .rule(Rule::new("global", Limit::per_day(100)))
                .store(store.clone())
                .build()
                .unwrap(),
        );
        assert_eq!(store.key_names("global", b"").len(), 4);
    }
    // 480 attempts on 4 shards of 25: every shard is drained, none over.
    assert_eq!(hammer(&limiters, "global", 4, 60).await, 100);
    // A rule that cannot be split that many ways is refused when the limiter is built.
    let error = Limiter::builder()
        .rule(Rule::new("global", Limit::per_second(3)))
        .store(
            RedisStore::builder()
                .url(server.url())
                .shard_rule("global", 4)
                .build()
                .await
                .unwrap(),
        )
        .build()
        .unwrap_err();
    assert_eq!((error.rule(), error.field()), ("global", "rate"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_the_script_cannot_count_exactly_are_refused_at_build_time() {
    let server = ENGINE.server();
    let error = Limiter::builder()
        .rule(Rule::new("daily", Limit::sliding_window(1_000_000, DAY)))
        .store(store(&server).await)
        .build()
        .unwrap_err();
    assert_eq!((error.rule(), error.field()), ("daily", "limit"));
    // The same rule is fine in memory, and a smaller one in Redis.
    assert!(Limiter::builder()
        .rule(Rule::new("daily", Limit::sliding_window(1_000_000, DAY)))
        .build()
        .is_ok());
    assert!(Limiter::builder()
        .rule(Rule::new("daily", Limit::sliding_window(100_000, DAY)))
        .store(store(&server).await)
        .build()
        .is_ok());
    // A bad prefix is a configuration error.
    let error = RedisStore::builder()
        .url(server.url())
        .prefix("a{b")
        .build()
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Config);
}

fn failing_layer(store: RedisStore, policy: FailurePolicy) -> RateLimitLayer {
    RateLimitLayer::builder()
        .rule(Rule::new("global", Limit::per_day(1_000)))
        .store(store)
        .on_store_failure(policy)
        .build()
        .unwrap()
}

/// Redis killed mid-traffic: every request gets the failure policy's answer (how long they wait
/// is shown without a clock in `tests/redis_outage.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_applies_the_failure_policy_within_the_timeout() {
    let mut server = ENGINE.server();
    let timeout = Duration::from_millis(100);
    let store = RedisStore::builder()
        .url(server.url())
        .timeout(timeout)
        .build()
        .await
        .unwrap();
    let closed = failing_layer(store.clone(), FailurePolicy::Closed).layer(ok_service());
    let open = failing_layer(store, FailurePolicy::Open).layer(ok_service());
    let response = closed.clone().oneshot(request("10.0.0.1")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().contains_key("ratelimit"));
    server.kill();
    for _ in 0..5 {
        let response = closed.clone().oneshot(request("10.0.0.1")).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let response = open.clone().oneshot(request("10.0.0.1")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(!response.headers().contains_key("ratelimit"));
    }
}

/// A limiter with one rule, "api" (10 a day), on `store`.
fn api_limiter(store: RedisStore) -> Limiter {
    Limiter::builder()
        .rule(Rule::new("api", Limit::per_day(10)))
        .store(store)
        .build()
        .unwrap()
}

/// Redis restarted (empty, without the script): the same store recovers by itself, and the
/// script is loaded again after `NOSCRIPT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_redis_is_found_again_and_the_script_sent_again() {
    let mut server = ENGINE.server();
    let store = RedisStore::builder()
        .url(server.url())
        .deny_cache(false)
        .build();
    let limiter = api_limiter(store.await.unwrap());
    assert_eq!(limiter.charge("api", "k", 4).await.unwrap().remaining, 6);
    server.restart();
    assert_eq!(server.command_calls("eval"), 0);
    // Bounded wait for the reconnection (it backs off up to a second).
    let deadline = Instant::now() + Duration::from_secs(10);
    let outcome = loop {
        match limiter.charge("api", "k", 1).await {
            Ok(outcome) => break outcome,
            Err(LimitError::Store(error)) => {
                assert!(Instant::now() < deadline, "no recovery: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(other) => panic!("{other}"),
        }
    };
    // The new server is empty: a new key.
    assert_eq!(outcome.remaining, 9);
    assert_eq!(
        server.command_calls("eval"),
        1,
        "NOSCRIPT led to one EVAL with the script's source"
    );
    assert_eq!(server.command_calls("script|load"), 0);
    assert_eq!(limiter.charge("api", "k", 1).await.unwrap().remaining, 8);
}

/// Every script is sent again after `NOSCRIPT` (here a `SCRIPT FLUSH`): each operation works at
/// once, each script sent once by its source (`EVAL`), by the call that needed it, and by its
/// hash again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_script_is_sent_again_after_noscript() {
    let server = ENGINE.server();
    let limiter = |clock: Option<ManualClock>| {
        let builder = RedisStore::builder().url(server.url()).deny_cache(false);
        let builder = match clock {
            Some(clock) => builder.clock(clock),
            None => builder,
        };
        async move {
            Limiter::builder()
                .rule(Rule::new("bucket", Limit::per_minute(10)))
                .rule(Rule::new("fixed", Limit::fixed_window(10, DAY)))
                .rule(Rule::new("sliding", Limit::sliding_window(10, DAY)))
                .rule(Rule::new("log", Limit::sliding_log(10, DAY)))
                .rule(Rule::new("guarded", Limit::per_day(10)).block(Penalty::fixed(DAY)))
                .store(builder.build().await.unwrap())
                .build()
                .unwrap()
        }
    };
    let on_server = limiter(None).await;
    let clock = ManualClock::new(Duration::from_secs(1_750_000_000));
    let on_clock = limiter(Some(clock)).await;
    server.run("SCRIPT FLUSH");
    let (loads, evals) = (
        server.command_calls("script|load"),
        server.command_calls("eval"),
    );
    let remaining =
        |outcome: Result<tollgate::algorithm::Outcome, LimitError>| outcome.unwrap().remaining;
    // One script each: the token bucket's (on the server's time, then on a test clock), the
    // windows', the general charge (a sliding log), the refund and the block.
    assert_eq!(remaining(on_server.charge("bucket", "k", 1).await), 9);
    assert_eq!(remaining(on_clock.charge("bucket", "c", 1).await), 9);
    assert_eq!(remaining(on_server.charge("fixed", "k", 2).await), 8);
    assert_eq!(remaining(on_server.charge("sliding", "k", 3).await), 7);
    assert_eq!(remaining(on_server.charge("log", "k", 4).await), 6);
    on_server.refund("log", "k", 1).await.unwrap();
    assert_eq!(remaining(on_server.check("log", "k", 0).await), 7);
    on_server.block("guarded", "k", DAY).await.unwrap();
    let blocked = on_server.charge("guarded", "k", 1).await.unwrap();
    assert!(!blocked.verdict.is_admitted(), "{blocked:?}");
    assert_eq!(server.command_calls("eval") - evals, 7);
    assert_eq!(server.command_calls("script|load") - loads, 0);
    // Known again: the same calls go by hash.
    assert_eq!(remaining(on_server.charge("fixed", "k", 2).await), 6);
    assert_eq!(server.command_calls("eval") - evals, 7);
}

/// Redis paused (SIGSTOP): calls time out instead of hanging, and work again once it resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_times_out_and_recovers() {
    let server = ENGINE.server();
    let timeout = Duration::from_millis(100);
    let store = RedisStore::builder()
        .url(server.url())
        .timeout(timeout)
        .build();
    let limiter = api_limiter(store.await.unwrap());
    assert_eq!(limiter.charge("api", "k", 1).await.unwrap().remaining, 9);
    server.pause();
    for _ in 0..3 {
        match limiter.charge("api", "k", 1).await {
            Err(LimitError::Store(error)) => assert_eq!(error.kind(), StoreErrorKind::Timeout),
            other => panic!("expected a timeout, got {other:?}"),
        }
    }
    server.resume();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match limiter.charge("api", "k", 1).await {
            Ok(outcome) => {
                // The timed-out calls may or may not have been applied once Redis resumed.
                assert!(outcome.remaining <= 8, "{outcome:?}");
                break;
            }
            Err(error) => {
                assert!(Instant::now() < deadline, "no recovery: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The circuit breaker's probe asks what a request asks: one charge through the script, whose
/// `PSETEX` writes the key `<prefix>:probe` for a millisecond (gone again at once), and no `PING`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_is_one_charge_on_its_own_key_gone_within_a_millisecond() {
    let server = ENGINE.server();
    let store = store(&server).await;
    // The test's own PING found the server up.
    let pings = server.command_calls("ping");
    store.probe().await.unwrap();
    assert_eq!(server.command_calls("evalsha"), 1);
    assert_eq!(server.command_calls("psetex"), 1);
    assert_eq!(server.command_calls("ping"), pings);
    // The key's time to live, in ms: at most 1, or -2 when it has gone already.
    let ttl = server.run("PTTL tollgate:probe");
    assert!(matches!(ttl.trim(), ":-2" | ":1" | ":0"), "{ttl}");
}

/// A limiter of `rules` over a Redis store (its defaults, deny cache included) on `clock`.
async fn on_clock(server: &RedisServer, clock: &ManualClock, rules: Vec<Rule>) -> Limiter {
    let store = RedisStore::builder()
        .url(server.url())
        .clock(clock.clone())
        .build()
        .await
        .unwrap();
    rules
        .into_iter()
        .fold(Limiter::builder().store(store), |builder, rule| {
            builder.rule(rule)
        })
        .build()
        .unwrap()
}

/// DESIGN §2's fixed-window reservations with their exact waits, on Redis (the same scenario as
/// tests/it/queue.rs runs on the memory store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_reservations_have_the_exact_waits_of_the_design() {
    let server = ENGINE.server();
    let clock = ManualClock::new(reservations::W);
    let limiter = on_clock(&server, &clock, reservations::rules()).await;
    reservations::example(&limiter, &clock).await;
    reservations::several_rules(&limiter).await;
}

/// Calendar months and weeks across month lengths, leap years and offsets, on Redis (the same
/// scenario as tests/it/queue.rs runs on the memory store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calendar_windows_follow_the_calendar() {
    let server = ENGINE.server();
    let clock = ManualClock::new(calendar::START);
    let limiter = on_clock(&server, &clock, calendar::rules()).await;
    calendar::scenario(&limiter, &clock).await;
}

/// Refunds and resets go through Redis, and a refund never exceeds the capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_and_resets() {
    let server = ENGINE.server();
    let limiter = Limiter::builder()
        .rule(Rule::new("tokens", Limit::per_day(100)))
        .store(store(&server).await)
        .build()
        .unwrap();
    assert_eq!(
        limiter.charge("tokens", "u", 60).await.unwrap().remaining,
        40
    );
    limiter.refund("tokens", "u", 25).await.unwrap();
    assert_eq!(limiter.check("tokens", "u", 0).await.unwrap().remaining, 65);
    limiter.refund("tokens", "u", 1_000).await.unwrap();
    assert_eq!(
        limiter.check("tokens", "u", 0).await.unwrap().remaining,
        100
    );
    limiter.charge("tokens", "u", 100).await.unwrap();
    limiter.reset("tokens", "u").await.unwrap();
    assert_eq!(
        limiter.check("tokens", "u", 0).await.unwrap().remaining,
        100
    );
}

/// The `redis` example, twice on two loopback ports with one Redis, through real HTTP: the two
/// copies share one limit per client IP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_copies_of_the_example_share_one_limit() {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let server = ENGINE.server();
    let mut addresses = Vec::new();
    for _ in 0..2 {
        let app = redis_example::app(RedisStore::connect(&server.url()).await.unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addresses.push(listener.local_addr().unwrap());
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let mut statuses = Vec::new();
    for i in 0..6 {
        let uri = format!("http://{}/expensive", addresses[i % 2]);
        let response =
            tokio::time::timeout(Duration::from_secs(10), client.get(uri.parse().unwrap()))
                .await
                .expect("bounded")
                .unwrap();
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429, 429, 429, 429]);
}

/// A configuration file naming a Redis store: `Config::connect` connects, and the limit is Redis's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_file_can_name_the_redis_store() {
    let server = ENGINE.server();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    let text = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"200ms\"\non_failure = \"closed\"\n\n\
         [[rules]]\nname = \"global\"\nrate = 2\nperiod = \"1h\"\n",
        server.url()
    );
    std::fs::write(&path, text).unwrap();
    // The synchronous loaders cannot connect and say so.
    let refused = Config::read(&path)
        .and_then(|config| config.layer())
        .unwrap_err()
        .to_string();
    assert!(refused.contains("Config::connect"), "{refused}");
    let layer = Config::read(&path).unwrap().connect().await.unwrap();
    let service = layer.layer(ok_service());
    let calls_before = server.command_calls("evalsha");
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(
            service
                .clone()
                .oneshot(request("10.0.0.1"))
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 429]);
    assert!(
        server.command_calls("evalsha") - calls_before >= 2,
        "decided by Redis"
    );
}

/// `on_failure = { local = { share = 0.5 } }` in a file: with Redis killed, the instance grants
/// half of the limit on its own (2 of 4 an hour), then 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_file_can_fail_to_local_with_half_of_each_limit() {
    let mut server = ENGINE.server();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.toml");
    let text = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\non_failure = {{ local = {{ share = 0.5 }} }}\n\n\
         [[rules]]\nname = \"global\"\nrate = 4\nperiod = \"1h\"\n",
        server.url()
    );
    std::fs::write(&path, text).unwrap();
    let service = Config::read(&path)
        .unwrap()
        .connect()
        .await
        .unwrap()
        .layer(ok_service());
    server.kill();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let response = service.clone().oneshot(request("10.0.0.1")).await.unwrap();
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
}
