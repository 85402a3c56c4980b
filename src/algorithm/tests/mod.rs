//! Tests of the algorithm module: exact numbers for each algorithm, and properties over random limits
//! and random request sequences.
//!
//! Every algorithm is driven the way a store drives it (see [`Run`]): evaluate, and commit only an
//! admitted charge that is not a [`Mode::Check`]. [`check_outcome`] holds the promises every outcome
//! makes (exact `retry_after`, exact `reset`, remaining as reported); the per-algorithm files add the
//! "never over-admit" bounds, refunds and expiry.

mod burst_pool;
mod fixed_window;
mod keys;
mod sliding_log;
mod sliding_window;
mod token_bucket;

use std::fmt::Debug;
use std::time::Duration;

use proptest::prelude::*;

use super::*;

/// A realistic "now": 2023-11-14T22:14:00Z. A whole minute, so aligned windows of a second, ten
/// seconds or a minute all start exactly here.
const T0: Micros = 1_700_000_040_000_000;
const MS: Micros = 1_000;
const SEC: Micros = 1_000_000;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// An outcome as the hand-written tests state it: verdict, limit, remaining and the time to the
/// next unit (`balance` and `full_in` are checked by [`check_outcome`] and tests of their own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Expect {
    verdict: Verdict,
    limit: u64,
    remaining: u64,
    next_unit_in: Duration,
}

impl PartialEq<Expect> for Outcome {
    fn eq(&self, other: &Expect) -> bool {
        Expect {
            verdict: self.verdict,
            limit: self.limit,
            remaining: self.remaining,
            next_unit_in: self.next_unit_in,
        } == *other
    }
}

fn allowed(limit: u64, remaining: u64, next_unit_in: Duration) -> Expect {
    Expect {
        verdict: Verdict::Allowed,
        limit,
        remaining,
        next_unit_in,
    }
}

fn denied(limit: u64, remaining: u64, next_unit_in: Duration, retry_after: Duration) -> Expect {
    Expect {
        verdict: Verdict::Denied { retry_after },
        limit,
        remaining,
        next_unit_in,
    }
}

fn reserved(limit: u64, remaining: u64, next_unit_in: Duration, wait: Duration) -> Expect {
    Expect {
        verdict: Verdict::Reserved { wait },
        limit,
        remaining,
        next_unit_in,
    }
}

/// What the tests need from an algorithm, with one state type for all of them.
trait Limiter {
    type State: Clone + Debug + PartialEq;
    /// `q`: the `limit` every outcome reports.
    fn quota(&self) -> u64;
    /// `(period, emission interval)`: the time scales random request gaps are drawn at.
    fn scale(&self) -> (Micros, Micros);
    /// The largest cost that can ever pass in `mode`.
    fn max_cost_in(&self, mode: Mode) -> u64 {
        let _ = mode;
        self.quota()
    }
    /// A key never seen before; `offset` is the window offset (ignored by buckets and logs).
    fn fresh_state(&self, now: Micros, offset: Micros) -> Self::State;
    fn eval(&self, state: &Self::State, now: Micros, cost: u64, mode: Mode) -> Outcome;
    fn apply(&self, state: &mut Self::State, now: Micros, cost: u64);
    fn give_back(&self, state: &mut Self::State, now: Micros, units: u64);
    /// From this moment on the state behaves exactly like a fresh key's.
    fn expiry(&self, state: &Self::State) -> Micros;
    /// The time the state records, before which a `now` counts as that time; `None` for the
    /// buckets, whose one number is the moment they were empty, and for fixed windows, whose
    /// window may be a later one a reservation holds (an earlier `now` reads the windows before
    /// it as held).
    fn stored_time(&self, state: &Self::State) -> Option<Micros>;
}

impl Limiter for TokenBucket {
    type State = i64;
    fn quota(&self) -> u64 {
        self.capacity()
    }
    fn scale(&self) -> (Micros, Micros) {
        (micros(self.period()), self.interval())
    }
    fn max_cost_in(&self, mode: Mode) -> u64 {
        self.max_cost(mode)
    }
    fn fresh_state(&self, now: Micros, _offset: Micros) -> i64 {
        self.fresh(now)
    }
    fn eval(&self, state: &i64, now: Micros, cost: u64, mode: Mode) -> Outcome {
        let out = self.evaluate(*state, now, cost, mode);
        // The memory store decides with `admits` under its lock: it must agree, always.
        assert_eq!(
            self.admits(*state, now, cost, mode),
            out.verdict.is_admitted()
        );
        out
    }
    fn apply(&self, state: &mut i64, now: Micros, cost: u64) {
        *state = self.commit(*state, now, cost);
    }
    fn give_back(&self, state: &mut i64, now: Micros, units: u64) {
        *state = self.refund(*state, now, units);
    }
    /// When the bucket is full again. (Equal to a fresh key's only when the initial balance is
    /// the capacity.)
    fn expiry(&self, state: &i64) -> Micros {
        self.expires_at(*state)
    }
    fn stored_time(&self, _state: &i64) -> Option<Micros> {
        None
    }
}

impl Limiter for FixedWindow {
    type State = FixedWindowState;
    fn quota(&self) -> u64 {
        self.capacity()
    }
    fn scale(&self) -> (Micros, Micros) {
        let period = self.period_micros();
        (period, (period / self.limit()).max(1))
    }
    fn max_cost_in(&self, mode: Mode) -> u64 {
        self.max_cost(mode)
    }
    fn fresh_state(&self, now: Micros, offset: Micros) -> FixedWindowState {
        self.fresh(now, offset)
    }
    fn eval(&self, state: &FixedWindowState, now: Micros, cost: u64, mode: Mode) -> Outcome {
        self.evaluate(*state, now, cost, mode)
    }
    fn apply(&self, state: &mut FixedWindowState, now: Micros, cost: u64) {
        *state = self.commit(*state, now, cost);
    }
    fn give_back(&self, state: &mut FixedWindowState, now: Micros, units: u64) {
        *state = self.refund(*state, now, units);
    }
    fn expiry(&self, state: &FixedWindowState) -> Micros {
        self.expires_at(*state)
    }
    fn stored_time(&self, _state: &FixedWindowState) -> Option<Micros> {
        None
    }
}

impl Limiter for SlidingWindow {
    type State = SlidingWindowState;
    fn quota(&self) -> u64 {
        self.limit()
    }
    fn scale(&self) -> (Micros, Micros) {
        let period = self.period_micros();
        (period, (period / self.limit()).max(1))
    }
    fn fresh_state(&self, now: Micros, offset: Micros) -> SlidingWindowState {
        self.fresh(now, offset)
    }
    fn eval(&self, state: &SlidingWindowState, now: Micros, cost: u64, _mode: Mode) -> Outcome {
        self.evaluate(*state, now, cost)
    }
    fn apply(&self, state: &mut SlidingWindowState, now: Micros, cost: u64) {
        *state = self.commit(*state, now, cost);
    }
    fn give_back(&self, state: &mut SlidingWindowState, now: Micros, units: u64) {
        *state = self.refund(*state, now, units);
    }
    fn expiry(&self, state: &SlidingWindowState) -> Micros {
        self.expires_at(*state)
    }
    fn stored_time(&self, state: &SlidingWindowState) -> Option<Micros> {
        Some(state.window_start)
    }
}

impl Limiter for SlidingLog {
    type State = SlidingLogState;
    fn quota(&self) -> u64 {
        self.limit()
    }
    fn scale(&self) -> (Micros, Micros) {
        let period = micros(self.period());
        (period, (period / self.limit()).max(1))
    }
    fn fresh_state(&self, _now: Micros, _offset: Micros) -> SlidingLogState {
        SlidingLogState::default()
    }
    fn eval(&self, state: &SlidingLogState, now: Micros, cost: u64, _mode: Mode) -> Outcome {
        self.evaluate(state, now, cost)
    }
    fn apply(&self, state: &mut SlidingLogState, now: Micros, cost: u64) {
        self.commit(state, now, cost);
    }
    fn give_back(&self, state: &mut SlidingLogState, now: Micros, units: u64) {
        self.refund(state, now, units);
    }
    fn expiry(&self, state: &SlidingLogState) -> Micros {
        self.expires_at(state)
    }
    fn stored_time(&self, state: &SlidingLogState) -> Option<Micros> {
        state.entries().last().map(|(at, _)| at)
    }
}

impl Limiter for BurstPool {
    type State = BurstPoolState;
    fn quota(&self) -> u64 {
        self.capacity()
    }
    fn scale(&self) -> (Micros, Micros) {
        self.steady().scale()
    }
    fn fresh_state(&self, now: Micros, _offset: Micros) -> BurstPoolState {
        self.fresh(now)
    }
    fn eval(&self, state: &BurstPoolState, now: Micros, cost: u64, _mode: Mode) -> Outcome {
        self.evaluate(*state, now, cost)
    }
    fn apply(&self, state: &mut BurstPoolState, now: Micros, cost: u64) {
        *state = self.commit(*state, now, cost);
    }
    fn give_back(&self, state: &mut BurstPoolState, now: Micros, units: u64) {
        *state = self.refund(*state, now, units);
    }
    fn expiry(&self, state: &BurstPoolState) -> Micros {
        self.expires_at(*state)
    }
    fn stored_time(&self, _state: &BurstPoolState) -> Option<Micros> {
        None
    }
}

/// One request of a run and the answer it got.
#[derive(Clone, Debug)]
struct Step {
    at: Micros,
    cost: u64,
    mode: Mode,
    out: Outcome,
}

impl Step {
    /// When the units of this request are used, if they were charged: now, or after a reservation's
    /// wait.
    fn start(&self) -> Option<Micros> {
        if self.mode == Mode::Check {
            return None;
        }
        match self.out.verdict {
            Verdict::Allowed => Some(self.at),
            Verdict::Reserved { wait } => Some(self.at + micros(wait)),
            Verdict::Denied { .. } => None,
        }
    }
}

/// One key driven the way a store drives it: evaluate, then commit an admitted charge unless it was
/// only a check. Every step is recorded.
struct Run<'a, L: Limiter> {
    limiter: &'a L,
    state: L::State,
    steps: Vec<Step>,
}

impl<'a, L: Limiter> Run<'a, L> {
    fn new(limiter: &'a L, state: L::State) -> Self {
        Run {
            limiter,
            state,
            steps: Vec::new(),
        }
    }

    /// A key first seen at `now` (offset zero for windows).
    fn fresh(limiter: &'a L, now: Micros) -> Self {
        Self::new(limiter, limiter.fresh_state(now, 0))
    }

    fn step(&mut self, at: Micros, cost: u64, mode: Mode) -> Outcome {
        let out = self.limiter.eval(&self.state, at, cost, mode);
        if out.verdict.is_admitted() && mode != Mode::Check {
            self.limiter.apply(&mut self.state, at, cost);
        }
        self.steps.push(Step {
            at,
            cost,
            mode,
            out: out.clone(),
        });
        out
    }

    fn charge(&mut self, at: Micros, cost: u64) -> Outcome {
        self.step(at, cost, Mode::Charge)
    }

    /// [`step`](Self::step), then [`check_outcome`] on it.
    fn checked_step(
        &mut self,
        at: Micros,
        cost: u64,
        mode: Mode,
    ) -> Result<Outcome, TestCaseError> {
        let before = self.state.clone();
        self.step(at, cost, mode);
        let step = self.steps.last().unwrap().clone();
        check_outcome(self.limiter, &before, &self.state, &step)?;
        Ok(step.out)
    }

    /// What a cost-0 check sees at `at`, without recording it.
    fn peek(&self, at: Micros) -> Outcome {
        self.limiter.eval(&self.state, at, 0, Mode::Check)
    }

    /// `(start, units)` of every charge, in request order.
    fn charges(&self) -> Vec<(Micros, u64)> {
        self.steps
            .iter()
            .filter_map(|s| Some((s.start()?, s.cost)))
            .collect()
    }
}

/// The promises of one outcome, for a request that took the state from `before` to `after`:
/// `remaining` and `reset` describe the state left behind, `reset` and `retry_after` are exact to
/// the microsecond, a check answers what a charge would. A denied reservation's `retry_after` is
/// exactly when it would be queued (reserved or allowed), never later than when the cost fits.
fn check_outcome<L: Limiter>(
    limiter: &L,
    before: &L::State,
    after: &L::State,
    step: &Step,
) -> Result<(), TestCaseError> {
    let Step {
        at,
        cost,
        mode,
        out,
    } = step.clone();
    prop_assert_eq!(out.limit, limiter.quota());
    prop_assert!(out.remaining <= out.limit, "{:?}", out);

    // The state the outcome describes: what a charge would leave for a check.
    let left = if mode == Mode::Check {
        prop_assert_eq!(
            &out,
            &limiter.eval(before, at, cost, Mode::Charge),
            "check vs charge"
        );
        let mut left = before.clone();
        if out.verdict.is_admitted() {
            limiter.apply(&mut left, at, cost);
        }
        left
    } else {
        if !out.verdict.is_admitted() {
            prop_assert_eq!(before, after, "a denial changed the state");
        }
        after.clone()
    };

    let peek = limiter.eval(&left, at, 0, Mode::Check);
    prop_assert_eq!(
        (out.remaining, out.next_unit_in, out.balance, out.full_in),
        (
            peek.remaining,
            peek.next_unit_in,
            peek.balance,
            peek.full_in
        ),
        "outcome vs a peek at the state left"
    );

    // The signed balance is `remaining` unless units are owed.
    if out.balance >= 0 {
        prop_assert_eq!(out.balance as u64, out.remaining, "{:?}", out);
    } else {
        prop_assert_eq!(out.remaining, 0, "owes units but has some: {:?}", out);
    }
    // `full_in` is exactly when the quota is full again.
    if out.full_in.is_zero() {
        prop_assert_eq!(out.remaining, out.limit, "full_in is zero only when full");
    } else {
        let full = micros(out.full_in);
        let just_before = limiter.eval(&left, at + full - 1, 0, Mode::Check);
        let then = limiter.eval(&left, at + full, 0, Mode::Check);
        prop_assert!(
            just_before.remaining < out.limit,
            "full before full_in: {:?}",
            out
        );
        prop_assert_eq!(then.remaining, out.limit, "not full at full_in: {:?}", out);
        prop_assert!(out.full_in >= out.next_unit_in);
    }

    if out.next_unit_in.is_zero() {
        prop_assert_eq!(out.remaining, out.limit, "reset is zero only when full");
    } else {
        let reset = micros(out.next_unit_in);
        let just_before = limiter.eval(&left, at + reset - 1, 0, Mode::Check);
        let then = limiter.eval(&left, at + reset, 0, Mode::Check);
        prop_assert_eq!(
            just_before.remaining,
            out.remaining,
            "grew before reset {:?}",
            out
        );
        prop_assert!(
            then.remaining > out.remaining,
            "no new unit at reset: {:?} then {:?}",
            out,
            then
        );
    }

    match out.verdict {
        Verdict::Allowed => {}
        Verdict::Reserved { wait } => {
            // The wait ends exactly when the balance is back at zero: a zero cost fits then.
            let wait = micros(wait);
            prop_assert!(wait > 0, "reserved with no wait");
            let early = limiter.eval(&left, at + wait - 1, 0, Mode::Check);
            prop_assert!(
                !early.verdict.is_admitted(),
                "balance back 1 µs before the wait: {:?}",
                early
            );
            prop_assert!(limiter
                .eval(&left, at + wait, 0, Mode::Check)
                .verdict
                .is_admitted());
        }
        Verdict::Denied { retry_after } => {
            let retry = micros(retry_after);
            prop_assert!(retry > 0, "denied with nothing to wait for: {:?}", out);
            // For a reservation: the moment it would be accepted into the queue (reserved or
            // allowed); for a charge or check: the moment the cost fits outright.
            let probe = match mode {
                // (A cost above the capacity never fits outright.)
                Mode::Reserve(_) if cost <= limiter.quota() => {
                    let outright = limiter.eval(before, at, cost, Mode::Check).retry_after();
                    prop_assert!(
                        outright.is_some_and(|outright| retry_after <= outright),
                        "a reservation waits longer than the cost takes to fit: {:?} vs {:?}",
                        out,
                        outright
                    );
                    mode
                }
                Mode::Reserve(_) => mode,
                _ => Mode::Check,
            };
            let early = limiter.eval(before, at + retry - 1, cost, probe);
            let then = limiter.eval(before, at + retry, cost, probe);
            prop_assert!(
                !early.verdict.is_admitted(),
                "admitted 1 µs before retry_after: {:?}",
                early
            );
            prop_assert!(
                then.verdict.is_admitted(),
                "still denied at retry_after: {:?}",
                then
            );
        }
    }
    Ok(())
}

/// Raw random material for one request, scaled to a limit by [`Event::gap`] and [`Event::cost`].
#[derive(Clone, Copy, Debug)]
struct Event {
    gap: u8,
    gap_raw: u64,
    cost_raw: u64,
    mode_raw: u8,
}

impl Event {
    /// The time since the previous request: often none (a burst), exactly what the previous answer
    /// said to wait (a greedy client, which lands on every rounding edge), a few µs, about an
    /// emission interval, or up to two periods.
    fn gap(&self, (period, interval): (Micros, Micros), previous: Option<&Step>) -> Micros {
        match self.gap % 8 {
            0 | 1 => 0,
            2 => previous.map_or(0, |step| match step.out.verdict {
                Verdict::Denied { retry_after } => micros(retry_after),
                Verdict::Reserved { wait } => micros(wait),
                Verdict::Allowed => micros(step.out.next_unit_in),
            }),
            3 => self.gap_raw % 3,
            4..=6 => self.gap_raw % (2 * interval + 1),
            _ => self.gap_raw % (2 * period + 1),
        }
    }

    /// A cost in `0..=max`: mostly one, sometimes zero, sometimes anything.
    fn cost(&self, max: u64) -> u64 {
        match self.cost_raw % 5 {
            0 => 0,
            1 | 2 => (self.cost_raw / 5) % (max + 1),
            _ => max.min(1),
        }
    }
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    prop::collection::vec(
        any::<(u8, u64, u64, u8)>().prop_map(|(gap, gap_raw, cost_raw, mode_raw)| Event {
            gap,
            gap_raw,
            cost_raw,
            mode_raw,
        }),
        1..40,
    )
}

/// A period from 1 ms to 10 s: mostly an arbitrary number of microseconds (so `period / rate` is
/// rarely whole), sometimes a round one.
fn period() -> impl Strategy<Value = Micros> {
    prop_oneof![
        3 => MS..=10 * SEC,
        1 => prop::sample::select(vec![MS, 100 * MS, SEC, 10 * SEC]),
    ]
}

/// When a random key is first seen.
fn start() -> impl Strategy<Value = Micros> {
    T0..T0 + 1_000 * SEC
}

/// Drives a fresh key (first seen at `start`) through `events`, checking every outcome.
fn drive<'a, L: Limiter>(
    limiter: &'a L,
    start: Micros,
    offset: Micros,
    events: &[Event],
    mode_of: impl Fn(&Event) -> Mode,
) -> Result<Run<'a, L>, TestCaseError> {
    let mut run = Run::new(limiter, limiter.fresh_state(start, offset));
    let mut t = start;
    for event in events {
        t += event.gap(limiter.scale(), run.steps.last());
        let mode = mode_of(event);
        let max = limiter.max_cost_in(mode).min(3 * limiter.quota());
        run.checked_step(t, event.cost(max), mode)?;
    }
    Ok(run)
}

/// For every run of consecutive charges `i..=j` (in time order), the units charged are at most
/// `bound(time_i, time_j)`.
fn assert_bounded(
    charges: &[(Micros, u64)],
    bound: impl Fn(Micros, Micros) -> u128,
) -> Result<(), TestCaseError> {
    for pair in charges.windows(2) {
        prop_assert!(pair[0].0 <= pair[1].0, "charges out of order: {:?}", pair);
    }
    for (i, &(a, _)) in charges.iter().enumerate() {
        let mut sum = 0u128;
        for &(b, units) in &charges[i..] {
            sum += u128::from(units);
            let max = bound(a, b);
            prop_assert!(
                sum <= max,
                "{} units in [{}, {}], at most {} allowed",
                sum,
                a,
                b,
                max
            );
        }
    }
    Ok(())
}

/// Charges and refunds: a refund never lifts the key above its capacity nor lowers it, and a charge
/// refunded at once gives back exactly the units it took (when `exact_undo`, it leaves the key
/// exactly as it was).
fn check_refunds<L: Limiter>(
    limiter: &L,
    start: Micros,
    offset: Micros,
    events: &[Event],
    exact_undo: bool,
) -> Result<(), TestCaseError> {
    let mut run = Run::new(limiter, limiter.fresh_state(start, offset));
    let mut t = start;
    for event in events {
        t += event.gap(limiter.scale(), run.steps.last());
        let before = run.peek(t);
        match event.mode_raw % 3 {
            0 => {
                let units = event.cost(2 * limiter.quota());
                limiter.give_back(&mut run.state, t, units);
                let after = run.peek(t);
                prop_assert!(after.remaining <= limiter.quota(), "refund above capacity");
                prop_assert!(after.remaining >= before.remaining, "refund took units");
            }
            1 => {
                let cost = event.cost(limiter.quota());
                if run
                    .checked_step(t, cost, Mode::Charge)?
                    .verdict
                    .is_admitted()
                {
                    limiter.give_back(&mut run.state, t, cost);
                    let after = run.peek(t);
                    prop_assert!(after.remaining <= limiter.quota(), "refund above capacity");
                    if exact_undo {
                        prop_assert_eq!(after, before, "undo changed the outcome");
                    } else {
                        prop_assert_eq!(after.remaining, before.remaining, "undo lost units");
                    }
                }
            }
            _ => {
                run.checked_step(t, event.cost(limiter.quota()), Mode::Charge)?;
            }
        }
    }
    Ok(())
}

/// After a random `history`, from [`Limiter::expiry`] (or later, by `later`) on, the kept state
/// answers every follow-up request exactly as a fresh key would: a store may drop it.
fn check_expiry<L: Limiter>(
    limiter: &L,
    start: Micros,
    offset: Micros,
    history: &[Event],
    later: u64,
    follow_up: &[Event],
) -> Result<(), TestCaseError> {
    let run = drive(limiter, start, offset, history, |_| Mode::Charge)?;
    let last = run.steps.last().map_or(start, |s| s.at);
    let (period, _) = limiter.scale();
    let extra = if later % 2 == 0 {
        0
    } else {
        later % (2 * period)
    };
    let at = limiter.expiry(&run.state).max(last) + extra;
    let mut kept = Run::new(limiter, run.state.clone());
    let mut dropped = Run::new(limiter, limiter.fresh_state(at, offset));
    let mut t = at;
    for (i, event) in follow_up.iter().enumerate() {
        if i > 0 {
            t += event.gap(limiter.scale(), kept.steps.last());
        }
        let cost = event.cost(limiter.quota());
        let (a, b) = (kept.charge(t, cost), dropped.charge(t, cost));
        prop_assert_eq!(
            a,
            b,
            "kept vs fresh at {} (expiry {}), cost {}",
            t,
            at,
            cost
        );
    }
    Ok(())
}

/// Drains a key at `t`, then asks again at `t - skew` (another instance's clock, slightly behind):
/// no panic, and nothing more is admitted.
fn check_clock_skew<L: Limiter>(limiter: &L, t: Micros, skew: Micros) {
    let mut run = Run::fresh(limiter, t);
    while run.charge(t, 1).verdict.is_admitted() {}
    let out = run.charge(t - skew, 1);
    assert!(
        !out.verdict.is_admitted(),
        "admitted past the limit at an earlier time: {out:?}"
    );
    assert!(out.remaining <= out.limit);
}

/// A key driven by a clock that sometimes steps backwards (by up to two periods, below the key's
/// first time too): nothing panics, an earlier time never admits more or leaves more than the
/// latest time seen (no refill is invented), and where the state records a time, a `now` before
/// it is answered exactly as that time (the time between counts as none: no early denial).
fn check_backward_time<L: Limiter>(
    limiter: &L,
    start: Micros,
    events: &[Event],
    back: &[u64],
) -> Result<(), TestCaseError> {
    let mut run = Run::fresh(limiter, start);
    let (period, _) = limiter.scale();
    let (mut t, mut latest) = (start, start);
    for (i, event) in events.iter().enumerate() {
        let step_back = back.get(i).copied().unwrap_or(0);
        if step_back % 3 == 0 {
            t = t.saturating_sub(step_back % (2 * period + 1));
        } else {
            t += event.gap(limiter.scale(), run.steps.last());
        }
        latest = latest.max(t);
        let cost = event.cost(limiter.quota());
        let at_t = limiter.eval(&run.state, t, cost, Mode::Charge);
        let at_latest = limiter.eval(&run.state, latest, cost, Mode::Charge);
        prop_assert!(at_t.remaining <= at_t.limit, "{:?}", at_t);
        prop_assert!(
            !at_t.verdict.is_admitted() || at_latest.verdict.is_admitted(),
            "admitted at {} but not at the latest time {}: refill invented",
            t,
            latest
        );
        let (peek_t, peek_latest) = (
            limiter.eval(&run.state, t, 0, Mode::Check),
            limiter.eval(&run.state, latest, 0, Mode::Check),
        );
        prop_assert!(
            peek_t.remaining <= peek_latest.remaining,
            "more left at {} than at the latest time {}",
            t,
            latest
        );
        if let Some(stored) = limiter.stored_time(&run.state).filter(|&s| t < s) {
            let at_stored = limiter.eval(&run.state, stored, cost, Mode::Charge);
            prop_assert_eq!(
                (at_t.verdict.is_admitted(), at_t.remaining),
                (at_stored.verdict.is_admitted(), at_stored.remaining),
                "an earlier now than the stored time {} is not that time",
                stored
            );
        }
        run.step(t, cost, Mode::Charge);
        if i % 4 == 3 {
            limiter.give_back(&mut run.state, t, 1);
            prop_assert!(limiter.eval(&run.state, t, 0, Mode::Check).remaining <= limiter.quota());
        }
    }
    Ok(())
}

fn backward_steps() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(any::<u64>(), 40)
}

proptest! {
    #[test]
    fn a_clock_stepping_back_invents_nothing_token_bucket(
        rate in 1u64..50, capacity in 1u64..60, period in period(),
        start in start(), events in events(), back in backward_steps(),
    ) {
        let limit = TokenBucket::new(rate, us(period)).with_capacity(capacity);
        check_backward_time(&limit, start, &events, &back)?;
    }

    #[test]
    fn a_clock_stepping_back_invents_nothing_fixed_window(
        limit in 1u64..50, period in period(), start in start(), events in events(),
        back in backward_steps(),
    ) {
        let limit = FixedWindow::new(limit, us(period));
        check_backward_time(&limit, start, &events, &back)?;
    }

    #[test]
    fn a_clock_stepping_back_invents_nothing_sliding_window(
        limit in 1u64..50, period in period(), start in start(), events in events(),
        back in backward_steps(),
    ) {
        let limit = SlidingWindow::new(limit, us(period));
        check_backward_time(&limit, start, &events, &back)?;
    }

    #[test]
    fn a_clock_stepping_back_invents_nothing_sliding_log(
        limit in 1u64..50, period in period(), start in start(), events in events(),
        back in backward_steps(),
    ) {
        let limit = SlidingLog::new(limit, us(period));
        check_backward_time(&limit, start, &events, &back)?;
    }

    #[test]
    fn a_clock_stepping_back_invents_nothing_burst_pool(
        rate in 1u64..20, pool in 1u64..50, start in start(), events in events(),
        back in backward_steps(),
    ) {
        let limit = BurstPool::new(
            TokenBucket::new(rate, secs(1)),
            TokenBucket::new(1, secs(1)).with_capacity(pool),
        );
        check_backward_time(&limit, start, &events, &back)?;
    }
}
