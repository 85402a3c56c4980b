use super::*;

fn per_second(rate: u64) -> TokenBucket {
    TokenBucket::new(rate, secs(1))
}

fn reserve(max_units: Option<u64>, max_wait: Option<Duration>) -> Mode {
    Mode::Reserve(ReserveBound {
        max_units,
        max_wait,
    })
}

#[test]
fn ten_per_second_allows_ten_then_denies_for_exactly_100ms() {
    let tb = per_second(10);
    let mut run = Run::fresh(&tb, T0);
    assert_eq!(run.peek(T0), allowed(10, 10, Duration::ZERO));
    for left in (0..10).rev() {
        assert_eq!(run.charge(T0, 1), allowed(10, left, ms(100)));
    }
    assert_eq!(run.charge(T0, 1), denied(10, 0, ms(100), ms(100)));
    assert_eq!(
        run.charge(T0 + 100 * MS - 1, 1),
        denied(10, 0, us(1), us(1))
    );
    assert_eq!(run.charge(T0 + 100 * MS, 1), allowed(10, 0, ms(100)));
    // Full again one second after the last charge; half-way through a unit at 1.05 s.
    assert_eq!(run.peek(T0 + 1050 * MS), allowed(10, 9, ms(50)));
    assert_eq!(run.peek(T0 + 1100 * MS), allowed(10, 10, Duration::ZERO));
}

#[test]
fn capacity_above_rate_allows_a_burst_of_twenty_at_five_per_second() {
    let tb = per_second(5).with_capacity(20);
    assert_eq!(tb.refill_time(), secs(4));
    assert_eq!(Algorithm::TokenBucket(tb.clone()).window(), secs(4));
    assert_eq!(Algorithm::TokenBucket(tb.clone()).capacity(), 20);
    let mut run = Run::fresh(&tb, T0);
    for left in (0..20).rev() {
        assert_eq!(run.charge(T0, 1), allowed(20, left, ms(200)));
    }
    assert_eq!(run.charge(T0, 1), denied(20, 0, ms(200), ms(200)));
    assert_eq!(run.peek(T0 + SEC), allowed(20, 5, ms(200)));
    assert_eq!(run.peek(T0 + 4 * SEC - 1), allowed(20, 19, us(1)));
    assert_eq!(run.peek(T0 + 4 * SEC), allowed(20, 20, Duration::ZERO));
}

#[test]
fn a_fresh_key_starts_with_the_initial_balance() {
    let tb = per_second(10).with_initial(3);
    let mut run = Run::fresh(&tb, T0);
    assert_eq!(run.peek(T0), allowed(10, 3, ms(100)));
    assert_eq!(run.charge(T0, 2), allowed(10, 1, ms(100)));
    assert_eq!(run.charge(T0, 1), allowed(10, 0, ms(100)));
    assert_eq!(run.charge(T0, 1), denied(10, 0, ms(100), ms(100)));
    assert_eq!(run.peek(T0 + 700 * MS), allowed(10, 7, ms(100)));
    assert_eq!(run.peek(T0 + SEC), allowed(10, 10, Duration::ZERO));
    // An initial balance above the capacity is the capacity.
    let capped = per_second(10).with_initial(50);
    assert_eq!(Run::fresh(&capped, T0).peek(T0).remaining, 10);
}

#[test]
fn a_fresh_key_has_its_initial_balance_even_when_period_over_rate_is_fractional() {
    // 3/s: one unit is 333 334 µs (rounded up). A new key with one unit must pass its first request.
    let tb = per_second(3).with_initial(1);
    let mut run = Run::fresh(&tb, T0);
    assert_eq!(run.peek(T0).remaining, 1);
    assert!(run.charge(T0, 1).verdict.is_admitted());
    assert!(!run.charge(T0, 1).verdict.is_admitted());
    let tb = per_second(3).with_initial(2);
    assert_eq!(Run::fresh(&tb, T0).peek(T0).remaining, 2);
}

#[test]
fn refill_is_continuous() {
    let tb = per_second(4);
    let mut run = Run::fresh(&tb, T0);
    assert_eq!(run.charge(T0, 4), allowed(4, 0, ms(250)));
    assert_eq!(run.peek(T0 + 250 * MS - 1), allowed(4, 0, us(1)));
    assert_eq!(run.peek(T0 + 250 * MS), allowed(4, 1, ms(250)));
    assert_eq!(run.peek(T0 + 400 * MS), allowed(4, 1, ms(100)));
    assert_eq!(run.charge(T0 + 250 * MS, 1), allowed(4, 0, ms(250)));
    assert_eq!(run.charge(T0 + 250 * MS, 1), denied(4, 0, ms(250), ms(250)));
}

#[test]
fn reservations_queue_up_to_max_units() {
    let tb = per_second(10);
    let mode = reserve(Some(3), None);
    let mut run = Run::fresh(&tb, T0);
    // A reservation that fits now is simply allowed.
    assert_eq!(run.step(T0, 10, mode), allowed(10, 0, ms(100)));
    // Then each unit waits one more emission interval; `reset` is when a whole unit is back.
    assert_eq!(run.step(T0, 1, mode), reserved(10, 0, ms(200), ms(100)));
    assert_eq!(run.step(T0, 1, mode), reserved(10, 0, ms(300), ms(200)));
    assert_eq!(run.step(T0, 1, mode), reserved(10, 0, ms(400), ms(300)));
    // The fourth would owe 4 units. Its retry_after is when it would be accepted into the queue:
    // once one unit of debt is paid, 100 ms (not the 400 ms until one unit fits outright).
    assert_eq!(run.step(T0, 1, mode), denied(10, 0, ms(400), ms(100)));
    assert_eq!(
        run.step(T0 + 100 * MS - 1, 1, mode).retry_after(),
        Some(us(1))
    );
    // A plain charge is denied until one unit fits outright: the balance is negative.
    assert_eq!(run.charge(T0, 1), denied(10, 0, ms(400), ms(400)));
    // 100 ms later one unit of debt is paid: one more reservation, behind the others.
    assert_eq!(
        run.step(T0 + 100 * MS, 1, mode),
        reserved(10, 0, ms(400), ms(300))
    );
    let starts: Vec<_> = run
        .charges()
        .iter()
        .map(|&(at, _)| (at - T0) / MS)
        .collect();
    assert_eq!(starts, [0, 100, 200, 300, 400]);
}

#[test]
fn reservations_respect_max_wait() {
    let tb = per_second(10);
    let mode = reserve(None, Some(ms(250)));
    let mut run = Run::fresh(&tb, T0);
    run.charge(T0, 10);
    assert_eq!(run.step(T0, 1, mode), reserved(10, 0, ms(200), ms(100)));
    assert_eq!(run.step(T0, 1, mode), reserved(10, 0, ms(300), ms(200)));
    // A wait of 300 ms is over the bound; 50 ms later it is exactly at the bound.
    assert_eq!(run.step(T0, 1, mode), denied(10, 0, ms(300), ms(50)));
    assert_eq!(
        run.step(T0 + 50 * MS - 1, 1, mode),
        denied(10, 0, us(250_001), us(1))
    );
    // Exactly at the bound is fine.
    assert_eq!(
        run.step(T0 + 50 * MS, 1, mode),
        reserved(10, 0, ms(350), ms(250))
    );
}

#[test]
fn an_unbounded_reservation_may_exceed_the_capacity() {
    let tb = per_second(10);
    let mut run = Run::fresh(&tb, T0);
    assert_eq!(
        run.step(T0, 12, reserve(None, None)),
        reserved(10, 0, ms(300), ms(200))
    );
    assert_eq!(run.peek(T0 + 200 * MS), allowed(10, 0, ms(100)));
    assert_eq!(run.peek(T0 + 300 * MS), allowed(10, 1, ms(100)));
}

#[test]
fn max_cost_follows_the_mode() {
    let tb = per_second(10);
    assert_eq!(tb.max_cost(Mode::Charge), 10);
    assert_eq!(tb.max_cost(Mode::Check), 10);
    assert_eq!(tb.max_cost(reserve(Some(3), None)), 13);
    assert_eq!(tb.max_cost(reserve(None, None)), u64::MAX);
    // 250 ms of wait is 2.5 units beyond a full bucket: 12 can be reserved (wait 200 ms), 13 never.
    assert_eq!(tb.max_cost(reserve(None, Some(ms(250)))), 12);
    assert_eq!(tb.max_cost(reserve(Some(1), Some(ms(250)))), 11);
    assert_eq!(tb.max_cost(reserve(Some(5), Some(Duration::ZERO))), 10);
    let (full, mode) = (tb.fresh(T0), reserve(None, Some(ms(250))));
    assert_eq!(
        tb.evaluate(full, T0, 12, mode),
        reserved(10, 0, ms(300), ms(200))
    );
    assert!(!tb.evaluate(full, T0, 13, mode).verdict.is_admitted());
    let err = CostTooLarge { cost: 13, max: 12 };
    assert_eq!(Algorithm::TokenBucket(tb).check_cost(13, mode), Err(err));
}

#[test]
fn a_reservation_of_exactly_max_cost_passes_when_period_over_rate_is_fractional() {
    // 7/s, capacity 7, up to 3 owed: 10 units from a full bucket owe exactly 3 units, three
    // emission intervals of 142 858 µs (1/7 s rounded up).
    let tb = per_second(7);
    assert_eq!(tb.interval(), 142_858);
    let mode = reserve(Some(3), None);
    assert_eq!(tb.max_cost(mode), 10);
    let out = tb.evaluate(tb.fresh(T0), T0, 10, mode);
    assert_eq!(out.verdict, Verdict::Reserved { wait: us(428_574) });
    assert!(!tb.evaluate(tb.fresh(T0), T0, 11, mode).is_allowed());
    // Bounded by wait instead: 3 intervals is 428 574 µs; a microsecond less allows only 2.
    assert_eq!(tb.max_cost(reserve(None, Some(us(428_574)))), 10);
    assert_eq!(tb.max_cost(reserve(None, Some(us(428_573)))), 9);
}

#[test]
fn refunds_are_capped_at_the_capacity() {
    let tb = per_second(10);
    let mut run = Run::fresh(&tb, T0);
    run.charge(T0, 10);
    let t = T0 + 500 * MS;
    assert_eq!(run.peek(t), allowed(10, 5, ms(100)));
    run.state = tb.refund(run.state, t, 3);
    assert_eq!(run.peek(t), allowed(10, 8, ms(100)));
    run.state = tb.refund(run.state, t, 8);
    assert_eq!(run.peek(t), allowed(10, 10, Duration::ZERO));
    // Nothing is banked: the next second still holds only ten.
    for _ in 0..10 {
        assert!(run.charge(t, 1).verdict.is_admitted());
    }
    assert_eq!(run.charge(t, 1), denied(10, 0, ms(100), ms(100)));
}

#[test]
fn cost_zero_and_check_charge_nothing() {
    let tb = per_second(10);
    let mut run = Run::fresh(&tb, T0);
    assert_eq!(run.charge(T0, 4), allowed(10, 6, ms(100)));
    let state = run.state;
    assert_eq!(run.charge(T0, 0), allowed(10, 6, ms(100)));
    assert_eq!(run.step(T0, 3, Mode::Check), allowed(10, 3, ms(100)));
    assert_eq!(
        run.step(T0, 7, Mode::Check),
        denied(10, 6, ms(100), ms(100))
    );
    assert_eq!(run.state, state);
    assert_eq!(run.peek(T0), allowed(10, 6, ms(100)));
}

#[test]
fn three_per_second_over_three_seconds() {
    // One unit is 1/3 s rounded up to a whole interval: T = 333 334 µs. Every charge and the
    // capacity are whole intervals, so bursts are exact: a full bucket takes three single charges
    // at one instant, and one unit leaves two. The rate is a hair slower than 3/s: a greedy client
    // gets a unit every 333 334 µs.
    let tb = per_second(3);
    assert_eq!(tb.interval(), 333_334);
    assert_eq!(tb.refill_time(), us(1_000_002));
    let fresh = tb.fresh(T0);
    // Full: it was empty one refill time ago.
    assert_eq!(fresh, (T0 - 1_000_002) as i64);
    assert_eq!(
        tb.evaluate(fresh, T0, 3, Mode::Charge),
        allowed(3, 0, us(333_334))
    );
    assert_eq!(
        tb.evaluate(fresh, T0, 1, Mode::Charge),
        allowed(3, 2, us(333_334))
    );
    let mut run = Run::fresh(&tb, T0);
    let mut t = T0;
    let mut times = Vec::new();
    while times.len() < 12 {
        match run.charge(t, 1).verdict {
            Verdict::Allowed => times.push(t - T0),
            Verdict::Denied { retry_after } => {
                assert_eq!(retry_after, us(333_334));
                let early = run.charge(t + 333_333, 1).verdict;
                assert_eq!(early, Verdict::Denied { retry_after: us(1) });
                t += 333_334;
            }
            Verdict::Reserved { .. } => unreachable!(),
        }
    }
    let expected: Vec<u64> = (0..12)
        .map(|k| if k < 3 { 0 } else { (k - 2) * 333_334 })
        .collect();
    assert_eq!(times, expected);
    // The exact schedule would give the 12th unit at 3 s; it comes 6 µs later.
    assert_eq!(times[11], 3 * SEC + 6);
    // Idle for a second and a bit: full, exactly three, at once.
    assert_eq!(run.peek(T0 + 5 * SEC), allowed(3, 3, Duration::ZERO));
    for left in (0..3).rev() {
        assert_eq!(run.charge(T0 + 5 * SEC, 1), allowed(3, left, us(333_334)));
    }
    assert!(!run.charge(T0 + 5 * SEC, 1).is_allowed());
}

#[test]
fn a_reservation_past_its_bound_retries_when_it_would_be_queued() {
    // 3/s, up to 2 owed or 500 ms of wait, whichever is stricter (T = 333 334 µs).
    let tb = per_second(3);
    let both = reserve(Some(2), Some(ms(500)));
    let mut run = Run::fresh(&tb, T0);
    assert!(run.charge(T0, 3).is_allowed());
    // One more owes 1 unit and waits one interval: within both bounds.
    assert_eq!(
        run.step(T0, 1, both),
        reserved(3, 0, us(666_668), us(333_334))
    );
    // Another would wait two intervals (666 668 µs > 500 ms): queued once 166 668 µs have passed.
    assert_eq!(
        run.step(T0, 1, both),
        denied(3, 0, us(666_668), us(166_668))
    );
    assert_eq!(run.step(T0 + 166_667, 1, both).retry_after(), Some(us(1)));
    assert_eq!(
        run.step(T0 + 166_668, 1, both),
        reserved(3, 0, us(833_334), ms(500))
    );
    // By units: 2 owed at most. Two more would owe 3 units: queued once one unit of debt is paid.
    let units = reserve(Some(2), None);
    assert_eq!(
        run.step(T0 + 166_668, 2, units),
        denied(3, 0, us(833_334), us(500_000))
    );
    assert_eq!(
        run.step(T0 + 666_668, 2, units),
        reserved(3, 0, us(1_000_002), us(666_668))
    );
    // With nothing to queue (a zero wait bound), a reservation retries exactly when the cost fits
    // outright, like a plain charge.
    let mut run = Run::fresh(&tb, T0);
    run.charge(T0, 3);
    let no_wait = reserve(None, Some(Duration::ZERO));
    assert_eq!(
        run.step(T0, 2, no_wait),
        denied(3, 0, us(333_334), us(666_668))
    );
    assert_eq!(run.charge(T0, 2).retry_after(), Some(us(666_668)));
    assert!(run.step(T0 + 666_668, 2, no_wait).is_allowed());
}

/// 10 a minute with a capacity of `capacity`.
fn ten_a_minute(capacity: u64) -> TokenBucket {
    TokenBucket::new(10, secs(60)).with_capacity(capacity)
}

/// A key that had 100 and spent 60 (40 left, at 6 s a unit).
fn spent_60_of_100(tb: &TokenBucket) -> i64 {
    tb.commit(tb.fresh(T0), T0, 60)
}

#[test]
fn a_smaller_capacity_leaves_what_fits_at_once_never_a_lockout() {
    // A capacity that changes: 40 of 100 left, then a capacity of 20 (a downgrade, same rate): 20 at once.
    let (plan, downgraded) = (ten_a_minute(100), ten_a_minute(20));
    let state = spent_60_of_100(&plan);
    assert_eq!(
        plan.evaluate(state, T0, 0, Mode::Check),
        allowed(100, 40, secs(6))
    );
    assert_eq!(
        downgraded.evaluate(state, T0, 0, Mode::Check),
        allowed(20, 20, Duration::ZERO)
    );
    let mut run = Run::new(&downgraded, state);
    for left in (0..20).rev() {
        assert_eq!(run.charge(T0, 1), allowed(20, left, secs(6)));
    }
    // Then the new rate, as for any key of that limit.
    assert_eq!(run.charge(T0, 1), denied(20, 0, secs(6), secs(6)));
    assert_eq!(run.peek(T0 + 60 * SEC), allowed(20, 10, secs(6)));
    // Exactly 20, not more: reserving 21 owes one.
    assert_eq!(
        downgraded
            .evaluate(state, T0, 21, reserve(None, None))
            .balance,
        -1
    );
}

#[test]
fn a_larger_capacity_keeps_the_balance_and_an_idle_key_is_full_under_a_smaller_one() {
    let (plan, upgraded, downgraded) = (ten_a_minute(100), ten_a_minute(200), ten_a_minute(20));
    let state = spent_60_of_100(&plan);
    // A larger capacity keeps the 40 (nothing is refilled by the change), and refills at the rate.
    assert_eq!(
        upgraded.evaluate(state, T0, 0, Mode::Check),
        allowed(200, 40, secs(6))
    );
    assert_eq!(
        upgraded.evaluate(state, T0 + 60 * SEC, 0, Mode::Check),
        allowed(200, 50, secs(6))
    );
    // Idle long enough to be full under 100: full under 20, 20 at once.
    let idle = T0 + 360 * SEC;
    assert_eq!(
        plan.evaluate(state, idle, 0, Mode::Check),
        allowed(100, 100, Duration::ZERO)
    );
    assert_eq!(
        downgraded.evaluate(state, idle, 0, Mode::Check),
        allowed(20, 20, Duration::ZERO)
    );
    // A fresh key of the larger limit is full under the smaller one too.
    assert_eq!(
        downgraded.evaluate(plan.fresh(T0), T0, 0, Mode::Check),
        allowed(20, 20, Duration::ZERO)
    );
}

#[test]
fn a_new_rate_reads_the_time_accrued_since_the_bucket_was_empty() {
    // Rate and capacity that change: 40 of 100 a minute, moving to 20 a minute with a capacity of 20 (rate and
    // capacity together, Bucket4j's PROPORTIONALLY): the 24 s accrued are 8 units at 3 s a unit.
    let plan = TokenBucket::new(100, secs(60));
    let state = plan.commit(plan.fresh(T0), T0, 60);
    assert_eq!(
        plan.evaluate(state, T0, 0, Mode::Check),
        allowed(100, 40, ms(600))
    );
    let slower = TokenBucket::new(20, secs(60));
    assert_eq!(
        slower.evaluate(state, T0, 0, Mode::Check),
        allowed(20, 8, secs(3))
    );
    // The same 8 whatever the new capacity holds above it (the rate alone changing included),
    // and at most the capacity below it.
    for (capacity, left) in [(10, 8), (100, 8), (5, 5)] {
        let other = slower.clone().with_capacity(capacity);
        let next = if left == capacity {
            Duration::ZERO
        } else {
            secs(3)
        };
        assert_eq!(
            other.evaluate(state, T0, 0, Mode::Check),
            allowed(capacity, left, next),
            "capacity {capacity}"
        );
    }
    // And back: 8 units of 20 a minute (24 s) are 40 units of 100 a minute.
    let mut run = Run::new(&slower, state);
    assert_eq!(run.charge(T0, 2), allowed(20, 6, secs(3)));
    assert_eq!(
        plan.evaluate(run.state, T0, 0, Mode::Check),
        allowed(100, 30, ms(600))
    );
}

#[test]
fn clock_skew_admits_nothing_more() {
    check_clock_skew(&per_second(10), T0 + MS, 5 * MS);
    check_clock_skew(&per_second(3).with_capacity(7), T0 + MS, SEC);
}

/// A random bucket: rate 1..50 per period, capacity 1..100, any initial balance.
fn bucket() -> impl Strategy<Value = TokenBucket> {
    (1u64..50, period(), 1u64..100, any::<u64>()).prop_map(|(rate, period, capacity, initial)| {
        TokenBucket::new(rate, us(period))
            .with_capacity(capacity)
            .with_initial(initial % (capacity + 1))
    })
}

fn bound() -> impl Strategy<Value = ReserveBound> {
    (
        prop::option::of(0u64..20),
        prop::option::of((0u64..3 * SEC).prop_map(us)),
    )
        .prop_map(|(max_units, max_wait)| ReserveBound {
            max_units,
            max_wait,
        })
}

/// `units ≤ C + floor(Δ·r/p)`: never faster than the rate.
fn bucket_bound(tb: &TokenBucket) -> impl Fn(Micros, Micros) -> u128 {
    let (rate, period, capacity) = (tb.rate(), micros(tb.period()), tb.capacity());
    move |a, b| u128::from(capacity) + u128::from(b - a) * u128::from(rate) / u128::from(period)
}

/// `units ≤ C + floor(Δ/T)`: one unit per whole emission interval, exactly (tighter than
/// [`bucket_bound`], as `T ≥ p/r`).
fn interval_bound(tb: &TokenBucket) -> impl Fn(Micros, Micros) -> u128 {
    let (interval, capacity) = (tb.interval(), tb.capacity());
    move |a, b| u128::from(capacity) + u128::from((b - a) / interval)
}

proptest! {
    #[test]
    fn charges_and_checks_never_over_admit(
        tb in bucket(),
        start in start(),
        events in events(),
    ) {
        let run = drive(&tb, start, 0, &events, |e| {
            if e.mode_raw % 4 == 0 { Mode::Check } else { Mode::Charge }
        })?;
        let initial = tb.initial().min(tb.capacity());
        prop_assert_eq!(tb.evaluate(tb.fresh(start), start, 0, Mode::Check).remaining, initial);
        prop_assert_eq!(tb.interval(), micros(tb.period()).div_ceil(tb.rate()));
        let charges = run.charges();
        assert_bounded(&charges, bucket_bound(&tb))?;
        assert_bounded(&charges, interval_bound(&tb))?;
        // From its first sight, a key gets its initial balance plus one unit per whole interval:
        // units ≤ initial + floor(Δ/T) (hence units·p ≤ initial·p + Δ·r).
        let (rate, period) = (u128::from(tb.rate()), u128::from(micros(tb.period())));
        let interval = u128::from(tb.interval());
        let mut sum = 0u128;
        for &(at, units) in &charges {
            sum += u128::from(units);
            let elapsed = u128::from(at - start);
            prop_assert!(
                sum * interval <= u128::from(initial) * interval + elapsed,
                "{} units by {} from {}", sum, at, start
            );
            prop_assert!(sum * period <= u128::from(initial) * period + elapsed * rate);
        }
    }

    #[test]
    fn reservations_are_fifo_and_never_over_admit(
        tb in bucket(),
        bound in bound(),
        start in start(),
        events in events(),
    ) {
        let mode = Mode::Reserve(bound);
        let run = drive(&tb, start, 0, &events, |e| match e.mode_raw % 4 {
            0 => Mode::Check,
            1 => Mode::Charge,
            _ => mode,
        })?;
        for step in &run.steps {
            if let Verdict::Reserved { wait } = step.out.verdict {
                if let Some(max) = bound.max_wait {
                    prop_assert!(wait <= max, "waits {:?} > {:?}", wait, max);
                }
            }
        }
        // Counted when they start (after their wait), charges are first in, first out, and within
        // the bound. A reservation may be larger than the capacity, so the bound starts from the
        // larger of the first charge and the capacity. A reservation starts exactly when its
        // balance is back at zero, so no rounding slack is needed.
        let charges = run.charges();
        assert_bounded(&charges, |_, _| u128::MAX)?; // start times never decrease
        let capacity = u128::from(tb.capacity());
        let (refill, per_interval) = (bucket_bound(&tb), interval_bound(&tb));
        for (i, &(a, first)) in charges.iter().enumerate() {
            let mut sum = 0u128;
            for &(b, units) in &charges[i..] {
                sum += u128::from(units);
                let extra = capacity.max(u128::from(first)) - capacity;
                let max = per_interval(a, b) + extra;
                prop_assert!(sum <= max, "{} units started in [{}, {}], at most {}", sum, a, b, max);
                prop_assert!(max <= refill(a, b) + extra);
            }
        }
    }

    #[test]
    fn a_cost_within_max_cost_passes_on_a_full_bucket_and_one_more_never_does(
        tb in bucket(),
        bound in bound(),
        reserving in any::<bool>(),
        raw in any::<u64>(),
    ) {
        let mode = if reserving { Mode::Reserve(bound) } else { Mode::Charge };
        let max = tb.max_cost(mode);
        // A full bucket, the best state there is: empty at least a refill time ago.
        let full = tb.fresh(T0).min((T0 - micros(tb.refill_time())) as i64);
        let cost = if raw % 2 == 0 { max.min(10_000) } else { raw % (max.min(10_000) + 1) };
        let out = tb.evaluate(full, T0, cost, mode);
        prop_assert!(out.verdict.is_admitted(), "cost {} (max {}) {:?}", cost, max, out);
        let algorithm = Algorithm::TokenBucket(tb.clone());
        prop_assert_eq!(algorithm.check_cost(cost, mode), Ok(()));
        if max < 10_000 {
            let out = tb.evaluate(full, T0, max + 1, mode);
            prop_assert!(!out.verdict.is_admitted(), "cost {} above max {} {:?}", max + 1, max, out);
            prop_assert_eq!(
                algorithm.check_cost(max + 1, mode),
                Err(CostTooLarge { cost: max + 1, max })
            );
        }
    }

    #[test]
    fn refunds_never_exceed_capacity(
        tb in bucket(),
        start in start(),
        events in events(),
    ) {
        check_refunds(&tb, start, 0, &events, true)?;
    }

    #[test]
    fn another_capacity_at_the_same_rate_keeps_what_fits(
        tb in bucket(),
        capacity in 1u64..100,
        start in start(),
        events in events(),
        later in 0u64..3 * SEC,
    ) {
        // A capacity that changes (Bucket4j's AS_IS): whatever a key went through, another capacity leaves it
        // what it has, at most the new capacity; one in credit stays in credit.
        let other = TokenBucket::new(tb.rate(), tb.period()).with_capacity(capacity);
        let run = drive(&tb, start, 0, &events, |e| {
            if e.mode_raw % 4 == 0 { Mode::Reserve(ReserveBound::default()) } else { Mode::Charge }
        })?;
        let t = run.steps.last().map_or(start, |s| s.at) + later;
        let (before, after) = (run.peek(t), other.evaluate(run.state, t, 0, Mode::Check));
        prop_assert!(after.remaining <= capacity);
        if before.remaining < tb.capacity() {
            prop_assert_eq!(after.remaining, before.remaining.min(capacity));
        } else {
            // Full under the old capacity: at least as much, up to the time since it was empty.
            prop_assert!(after.remaining >= before.remaining.min(capacity));
        }
        if before.balance >= 0 {
            prop_assert!(after.balance >= 0, "{:?} became {:?}", before, after);
        } else {
            prop_assert_eq!(after.balance, before.balance, "a debt is the same time owed");
        }
    }

    #[test]
    fn a_full_bucket_is_a_fresh_key(
        tb in bucket(),
        start in start(),
        history in events(),
        later in any::<u64>(),
        follow_up in events(),
    ) {
        // Only when fresh keys start full; see `initial_below_capacity_never_expires`.
        let tb = tb.clone().with_initial(tb.capacity());
        check_expiry(&tb, start, 0, &history, later, &follow_up)?;
    }
}

#[test]
fn initial_below_capacity_never_expires() {
    // With `initial < capacity`, a bucket that refilled is fuller than a fresh key: dropping its
    // state makes the key stricter, never laxer.
    let tb = per_second(10).with_initial(2);
    let mut run = Run::fresh(&tb, T0);
    run.charge(T0, 1);
    let later = T0 + 10 * SEC;
    assert_eq!(run.peek(later).remaining, 10);
    assert_eq!(Run::fresh(&tb, later).peek(later).remaining, 2);
}
