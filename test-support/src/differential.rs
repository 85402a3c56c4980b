//! The differential test: the same scenario — rules, keys, costs, modes, refunds, resets, blocks,
//! overrides and times — against the memory store and the Redis store, comparing every field of
//! every outcome and the override each charge was decided under.

use std::time::Duration;

use proptest::prelude::*;
use tollgate::algorithm::{
    Algorithm, BurstPool, FixedWindow, Mode, ReserveBound, SlidingLog, SlidingWindow, TokenBucket,
    WindowStart,
};
use tollgate::clock::ManualClock;
#[cfg(feature = "redis")]
use tollgate::store::RedisStoreBuilder;
use tollgate::store::{Charge, Outcomes, RuleName, Store};
use tollgate::MemoryStore;
use tollgate::{Limit, Penalty};

/// One step of a scenario.
#[derive(Clone, Debug)]
pub enum Step {
    /// A request: (rule, key, cost, mode) per charge, rules distinct.
    Apply(Vec<(usize, usize, u64, Mode)>),
    /// A request whose limits come from the request (a tier's, say): (rule, key, cost, mode, limit)
    /// per charge, rules distinct, each charged under the limit it brings instead of its rule's.
    ApplyUnder(Vec<(usize, usize, u64, Mode, Algorithm)>),
    /// `Store::refund`: (rule, key, units).
    Refund(usize, usize, u64),
    /// `Store::reset`: (rule, key).
    Reset(usize, usize),
    /// The clock moves on by so many µs.
    Advance(u64),
    /// `Limiter::block` (µs) or `unblock` (`None`), for a rule with a penalty.
    Block(usize, usize, Option<u64>),
    /// A settlement's extra charge: units owed, into debt if need be (token buckets; others
    /// skip it).
    Owe(usize, usize, u64),
    /// `Limiter::set_override` (a limit of the rule's algorithm, for a TTL in µs) or
    /// `clear_override` (`None`). A rule with such a step is overridable: its charges read
    /// overrides, and make only unbounded reservations (an overridable rule cannot queue).
    Override(usize, usize, Option<(Algorithm, u64)>),
}

/// A rule of a scenario: its algorithm and, for some, a penalty.
pub type ScenarioRule = (Algorithm, Option<Penalty>);

/// A scenario: its start (microseconds since the epoch), its rules and its steps.
pub type Scenario = (u64, Vec<ScenarioRule>, Vec<Step>);

fn penalty() -> impl Strategy<Value = Penalty> {
    (
        prop::collection::vec(1u64..5_000_000, 1..4),
        prop_oneof![Just(0u64), 1u64..10_000_000],
    )
        .prop_map(|(durations, forget)| {
            Penalty::escalating(
                durations.into_iter().map(Duration::from_micros),
                Duration::from_micros(forget),
            )
        })
}

fn rule() -> impl Strategy<Value = ScenarioRule> {
    (algorithm(), prop::option::weighted(0.4, penalty()))
}

/// Key values: the global (empty) key, and two others.
pub const KEYS: [&[u8]; 3] = [b"", b"alice", b"10.0.0.7"];

fn period() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::from_millis(1)),
        Just(Duration::from_millis(7)),
        Just(Duration::from_secs(1)),
        Just(Duration::from_micros(1_300_001)),
        Just(Duration::from_secs(60)),
        (1u64..5_000_000).prop_map(Duration::from_micros),
    ]
}

fn bucket() -> impl Strategy<Value = TokenBucket> {
    (1u64..12, period(), 0u64..3, any::<prop::sample::Index>()).prop_map(
        |(rate, period, extra, initial)| {
            let capacity = rate + extra * rate / 2;
            TokenBucket::new(rate, period)
                .with_capacity(capacity)
                .with_initial(initial.index(capacity as usize + 1) as u64)
        },
    )
}

fn start() -> impl Strategy<Value = WindowStart> {
    prop_oneof![
        Just(WindowStart::PerKey),
        (0u64..10_000_000).prop_map(|us| WindowStart::Aligned(Duration::from_micros(us))),
    ]
}

/// Any algorithm, with small limits and periods (so scenarios reach every edge).
pub fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        3 => bucket().prop_map(Algorithm::TokenBucket),
        2 => (1u64..10, period(), 0u64..3, start()).prop_map(|(limit, period, extra, start)| {
            Algorithm::FixedWindow(
                FixedWindow::new(limit, period)
                    .with_capacity(limit + extra * limit / 2 + extra)
                    .with_start(start),
            )
        }),
        1 => (1u64..10, 0u64..3, -18i64..=18).prop_map(|(limit, extra, hours)| {
            Algorithm::FixedWindow(
                FixedWindow::calendar_months(limit, hours * 3_600_000_000)
                    .with_capacity(limit + extra),
            )
        }),
        2 => (1u64..10, period(), start()).prop_map(|(limit, period, start)| {
            Algorithm::SlidingWindow(SlidingWindow::new(limit, period).with_start(start))
        }),
        2 => (1u64..8, period())
            .prop_map(|(limit, period)| Algorithm::SlidingLog(SlidingLog::new(limit, period))),
        2 => (bucket(), bucket()).prop_map(|(steady, pool)| {
            Algorithm::BurstPool(BurstPool::new(steady, pool))
        }),
    ]
}

fn mode(algorithm: &Algorithm) -> BoxedStrategy<Mode> {
    let plain = prop_oneof![4 => Just(Mode::Charge), 1 => Just(Mode::Check)];
    if algorithm.reserves() {
        let bound = (
            prop::option::of(0u64..6),
            prop::option::of((0u64..3_000_000).prop_map(Duration::from_micros)),
        )
            .prop_map(|(max_units, max_wait)| {
                Mode::Reserve(ReserveBound {
                    max_units,
                    max_wait,
                })
            });
        prop_oneof![3 => plain, 1 => bound].boxed()
    } else {
        plain.boxed()
    }
}

fn charge(rules: &[Algorithm], rule: usize) -> BoxedStrategy<(usize, usize, u64, Mode)> {
    charge_under(rules[rule].clone(), rule)
}

fn charge_under(algorithm: Algorithm, rule: usize) -> BoxedStrategy<(usize, usize, u64, Mode)> {
    mode(&algorithm)
        .prop_flat_map(move |mode| {
            let max = algorithm.max_cost(mode).min(algorithm.capacity() * 2 + 2);
            (0..KEYS.len(), 0..=max, Just(mode))
        })
        .prop_map(move |(key, cost, mode)| (rule, key, cost, mode))
        .boxed()
}

/// A limit a request may bring instead of its rule's own token bucket: the same rate with
/// another capacity, rate and capacity scaled together, or any other bucket.
fn other_bucket(own: &TokenBucket) -> BoxedStrategy<TokenBucket> {
    let (rate, period, capacity) = (own.rate(), own.period(), own.capacity());
    prop_oneof![
        (1..=2 * capacity + 2).prop_map(move |c| TokenBucket::new(rate, period).with_capacity(c)),
        (1u64..=4, 1u64..=4).prop_map(move |(times, by)| {
            let scale = |n: u64| (n * times / by).max(1);
            TokenBucket::new(scale(rate), period).with_capacity(scale(capacity))
        }),
        bucket(),
    ]
    .boxed()
}

/// The limits a request may bring for a rule of this algorithm; `None` for the algorithms whose
/// per-request limits these scenarios leave out.
fn other_limit(own: &Algorithm) -> Option<BoxedStrategy<Algorithm>> {
    match own {
        Algorithm::TokenBucket(tb) => {
            Some(other_bucket(tb).prop_map(Algorithm::TokenBucket).boxed())
        }
        Algorithm::BurstPool(bp) => Some(
            (other_bucket(bp.steady()), other_bucket(bp.pool()))
                .prop_map(|(steady, pool)| Algorithm::BurstPool(BurstPool::new(steady, pool)))
                .boxed(),
        ),
        Algorithm::SlidingWindow(sw) => {
            let (period, start) = (sw.period(), sw.start());
            // Beside small limits, limits about 2^26, where the Redis store's key changes its
            // format (both counts packed in one field below, the previous count apart above),
            // and about where its fast path's answer stops fitting one integer
            // ((limit + 1)² × period below 2^51).
            let packed = 1u64 << 26;
            let answered = ((1u64 << 51) / (sw.period().as_micros() as u64).max(1)).isqrt();
            Some(
                prop_oneof![
                    4 => 1..=2 * sw.limit() + 2,
                    1 => packed - 2..=packed + 1,
                    1 => answered.saturating_sub(2).max(1)..=answered + 1,
                ]
                .prop_map(move |l| {
                    Algorithm::SlidingWindow(SlidingWindow::new(l, period).with_start(start))
                })
                .boxed(),
            )
        }
        // Windows of the same length and starts whose limit and roll-over change: a capacity
        // equal to the limit takes the Redis fast path for a lone charge, one above it the
        // general script (the window's count compared with the limit in force).
        Algorithm::FixedWindow(fw) => {
            let own = fw.clone();
            Some(
                (1..=2 * fw.capacity() + 2, 0u64..3)
                    .prop_map(move |(limit, extra)| {
                        let other = match own.months() {
                            Some(utc) => FixedWindow::calendar_months(limit, utc),
                            None => FixedWindow::new(limit, own.period()).with_start(own.start()),
                        };
                        Algorithm::FixedWindow(other.with_capacity(limit + extra * limit / 2))
                    })
                    .boxed(),
            )
        }
        _ => None,
    }
}

/// A charge of `rule` under a limit the request brings, or under its own.
fn limited_charge(
    rules: &[Algorithm],
    rule: usize,
) -> BoxedStrategy<(usize, usize, u64, Mode, Algorithm)> {
    let own = rules[rule].clone();
    let limit = match other_limit(&own) {
        Some(other) => prop_oneof![1 => Just(own), 3 => other].boxed(),
        None => Just(own).boxed(),
    };
    limit
        .prop_flat_map(move |limit| {
            charge_under(limit.clone(), rule)
                .prop_map(move |(rule, key, cost, mode)| (rule, key, cost, mode, limit.clone()))
        })
        .boxed()
}

/// One charge of each of some distinct rules, in order, drawn by `charge`.
fn batch<T: std::fmt::Debug>(
    n: usize,
    charge: impl Fn(usize) -> BoxedStrategy<T> + 'static,
) -> impl Strategy<Value = Vec<T>> {
    prop::sample::subsequence((0..n).collect::<Vec<_>>(), 1..=n)
        .prop_flat_map(move |chosen| chosen.into_iter().map(&charge).collect::<Vec<_>>())
}

fn step(rules: Vec<Algorithm>, overrides: bool) -> BoxedStrategy<Step> {
    let n = rules.len();
    let limited = rules.clone();
    let overridden = rules.clone();
    // Overrides of the rule's own algorithm (the state carries over), or none.
    let set_override = (0..n, 0..KEYS.len())
        .prop_flat_map(move |(r, k)| {
            let own = overridden[r].clone();
            let limit = other_limit(&own).unwrap_or_else(|| Just(own).boxed());
            prop::option::weighted(0.8, (limit, 1u64..5_000_000))
                .prop_map(move |o| Step::Override(r, k, o))
        })
        .boxed();
    let block = prop_oneof![Just(None), (1u64..3_000_000).prop_map(Some),];
    let apply = batch(n, move |rule| charge(&rules, rule)).prop_map(Step::Apply);
    let apply_under =
        batch(n, move |rule| limited_charge(&limited, rule)).prop_map(Step::ApplyUnder);
    prop_oneof![
        8 => apply,
        4 => apply_under,
        4 => prop_oneof![
            Just(0u64),
            1u64..2_000,
            1u64..400_000,
            1u64..3_000_000,
            (1u64..120).prop_map(|s| s * 1_000_000),
        ]
        .prop_map(Step::Advance),
        1 => (0..n, 0..KEYS.len(), 0u64..5).prop_map(|(r, k, u)| Step::Refund(r, k, u)),
        1 => (0..n, 0..KEYS.len()).prop_map(|(r, k)| Step::Reset(r, k)),
        1 => (0..n, 0..KEYS.len(), block).prop_map(|(r, k, b)| Step::Block(r, k, b)),
        1 => (0..n, 0..KEYS.len(), 1u64..30).prop_map(|(r, k, u)| Step::Owe(r, k, u)),
        // Only some scenarios: an overridable rule takes neither Redis's fast path nor the deny
        // cache, which the others keep testing.
        (if overrides { 2 } else { 0 }) => set_override,
    ]
    .boxed()
}

/// The settings of a differential test of `cases` scenarios: in the test command, the same
/// scenarios on every run (a fixed seed, or the one `PROPTEST_RNG_SEED` names), so that a
/// difference found once is found again, and a run passes or fails whatever machine it is on;
/// new scenarios are the soaks' (`soak_config`). A difference names its scenario in full.
pub fn config(cases: u32) -> ProptestConfig {
    let from_environment = ProptestConfig::default();
    let rng_seed = match from_environment.rng_seed {
        proptest::test_runner::RngSeed::Random => {
            proptest::test_runner::RngSeed::Fixed(0x7011_6a7e)
        }
        seed => seed,
    };
    ProptestConfig {
        cases,
        rng_seed,
        failure_persistence: None,
        ..from_environment
    }
}

/// The settings of a soak of `cases` scenarios: new ones on every run (a random seed, unless
/// `PROPTEST_RNG_SEED` names one).
pub fn soak_config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A scenario: a start time (near today's, so the script's numbers are as large as in
/// production), rules, and steps.
pub fn scenario() -> impl Strategy<Value = Scenario> {
    (
        1_700_000_000_000_000u64..1_800_000_000_000_000,
        prop::collection::vec(rule(), 1..=3),
        prop::bool::weighted(0.3),
    )
        .prop_flat_map(|(start, rules, overrides)| {
            let algorithms = rules.iter().map(|(a, _)| a.clone()).collect();
            let steps = prop::collection::vec(step(algorithms, overrides), 1..40);
            (Just(start), Just(rules), steps)
        })
}

fn name(rule: usize) -> String {
    format!("r{rule}")
}

async fn apply(store: &dyn Store, batch: &[Charge<'_>]) -> Outcomes {
    store.apply(batch).await.expect("the store answers")
}

/// A charge's mode as an overridable rule makes it: a bounded reservation would be a queue's,
/// which such a rule cannot have.
fn mode_of(mode: Mode, overridable: bool) -> Mode {
    match mode {
        Mode::Reserve(_) if overridable => Mode::Reserve(ReserveBound::default()),
        mode => mode,
    }
}

/// Applies `batch` to both stores, each charge of an overridable rule reading its override,
/// and checks that they answer alike; the outcomes.
async fn both(
    memory: &dyn Store,
    redis: &dyn Store,
    batch: &[Charge<'_>],
    overridable: &[bool],
    what: &dyn Fn() -> String,
) -> Outcomes {
    let batch: Vec<Charge<'_>> = batch
        .iter()
        .zip(overridable)
        .map(|(charge, &o)| if o { charge.with_overrides() } else { *charge })
        .collect();
    let expected = apply(memory, &batch).await;
    let got = apply(redis, &batch).await;
    assert_eq!(got, expected, "{} (left: Redis, right: memory)", what());
    let applied = |outcomes: &Outcomes| -> Vec<Option<Limit>> {
        outcomes
            .iter()
            .map(|outcome| outcome.override_limit().cloned())
            .collect()
    };
    assert_eq!(
        applied(&got),
        applied(&expected),
        "{}: overrides applied (left: Redis, right: memory)",
        what()
    );
    got
}

#[cfg(feature = "redis")]
/// [`run`] with the Redis store's deny cache on (its default), then off, each run's keys under
/// a prefix of its own (`prefix` followed by `true` or `false`); `redis` makes the builder of the
/// server or cluster. Returns the outcomes of each run, cache on first.
pub async fn run_with_and_without_deny_cache(
    redis: impl Fn() -> RedisStoreBuilder,
    prefix: &str,
    scenario: &Scenario,
) -> Vec<Vec<Outcomes>> {
    let mut runs = Vec::new();
    for cache in [true, false] {
        let builder = redis().prefix(format!("{prefix}{cache}")).deny_cache(cache);
        runs.push(run(builder, scenario).await);
    }
    runs
}

/// Runs a scenario on a memory store and on the Redis store `redis` builds, both on one manual
/// clock, with the builder's settings otherwise (the defaults include the deny cache, whose
/// local answers must be Redis's exactly); panics on the first difference. Returns the outcomes
/// of the requests, in order.
#[cfg(feature = "redis")]
pub async fn run(redis: RedisStoreBuilder, scenario: &Scenario) -> Vec<Outcomes> {
    let clock = ManualClock::new(Duration::from_micros(scenario.0));
    let redis = redis
        .clock(clock.clone())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    run_against(&redis, &clock, "", scenario).await
}

/// Runs a scenario on a memory store and on `other`, a store reading time from `clock` (set to
/// the scenario's start), with every rule's name after `names` (so that runs on one database do
/// not share keys); panics on the first difference. Returns the outcomes of the requests.
pub async fn run_against(
    redis: &dyn Store,
    clock: &ManualClock,
    names: &str,
    (start, rules, steps): &Scenario,
) -> Vec<Outcomes> {
    clock.set(Duration::from_micros(*start));
    // A difference names the whole scenario, so that it can be replayed as a test of its own.
    let scenario = move || format!("({start}, {rules:?}, {steps:?})");
    let penalties: Vec<Option<Penalty>> = rules.iter().map(|(_, p)| p.clone()).collect();
    let rules: Vec<Algorithm> = rules.iter().map(|(a, _)| a.clone()).collect();
    let rules = &rules;
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let memory = &memory;
    let names: Vec<String> = (0..rules.len())
        .map(|rule| format!("{names}{}", name(rule)))
        .collect();
    let overridable: Vec<bool> = (0..rules.len())
        .map(|r| {
            steps
                .iter()
                .any(|step| matches!(step, Step::Override(o, ..) if *o == r))
        })
        .collect();
    let mut answers = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        match step {
            Step::Apply(charges) => {
                let batch: Vec<Charge<'_>> = charges
                    .iter()
                    .map(|&(rule, key, cost, mode)| {
                        let mut charge =
                            Charge::new(RuleName::new(&names[rule]), &rules[rule], KEYS[key], cost)
                                .with_mode(mode_of(mode, overridable[rule]));
                        charge.penalty = penalties[rule].as_ref();
                        charge
                    })
                    .collect();
                let which: Vec<bool> = charges.iter().map(|c| overridable[c.0]).collect();
                let what = || format!("step {i} {step:?} differs in scenario {}", scenario());
                answers.push(both(memory, redis, &batch, &which, &what).await);
            }
            Step::ApplyUnder(charges) => {
                let batch: Vec<Charge<'_>> = charges
                    .iter()
                    .map(|(rule, key, cost, mode, limit)| {
                        let mut charge =
                            Charge::new(RuleName::new(&names[*rule]), limit, KEYS[*key], *cost)
                                .with_mode(mode_of(*mode, overridable[*rule]));
                        charge.penalty = penalties[*rule].as_ref();
                        charge
                    })
                    .collect();
                let which: Vec<bool> = charges.iter().map(|c| overridable[c.0]).collect();
                let what = || format!("step {i} {step:?} differs in scenario {}", scenario());
                answers.push(both(memory, redis, &batch, &which, &what).await);
            }
            Step::Refund(rule, key, units) => {
                let mut charge = Charge::new(
                    RuleName::new(&names[*rule]),
                    &rules[*rule],
                    KEYS[*key],
                    *units,
                );
                charge.penalty = penalties[*rule].as_ref();
                memory.refund(&charge).await.unwrap();
                redis.refund(&charge).await.unwrap();
            }
            Step::Reset(rule, key) => {
                memory
                    .reset(&names[*rule], &rules[*rule], KEYS[*key])
                    .await
                    .unwrap();
                redis
                    .reset(&names[*rule], &rules[*rule], KEYS[*key])
                    .await
                    .unwrap();
            }
            Step::Advance(us) => clock.advance(Duration::from_micros(*us)),
            Step::Owe(rule, key, units) if rules[*rule].reserves() => {
                let charge = Charge::new(
                    RuleName::new(&names[*rule]),
                    &rules[*rule],
                    KEYS[*key],
                    *units,
                )
                .with_mode(Mode::Reserve(ReserveBound::default()));
                let expected = apply(memory, &[charge]).await;
                let got = apply(redis, &[charge]).await;
                assert_eq!(
                    got,
                    expected,
                    "step {i} {step:?} in scenario {} (left: Redis, right: memory)",
                    scenario()
                );
            }
            Step::Owe(..) => {}
            Step::Override(rule, key, limit) => {
                let (name, key) = (&names[*rule], KEYS[*key]);
                let limit = limit
                    .as_ref()
                    .map(|(a, ttl)| (Limit::from(a.clone()), Duration::from_micros(*ttl)));
                let limit = limit.as_ref().map(|(limit, ttl)| (limit, *ttl));
                memory.set_override(name, key, limit).await.unwrap();
                redis.set_override(name, key, limit).await.unwrap();
            }
            Step::Block(rule, key, block) => {
                if let Some(penalty) = &penalties[*rule] {
                    let block = block.map(Duration::from_micros);
                    let (name, key) = (&names[*rule], KEYS[*key]);
                    memory.set_block(name, penalty, key, block).await.unwrap();
                    redis.set_block(name, penalty, key, block).await.unwrap();
                }
            }
        }
    }
    answers
}
