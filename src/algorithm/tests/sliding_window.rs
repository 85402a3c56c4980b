use super::*;

fn ten_per_second() -> SlidingWindow {
    SlidingWindow::new(10, secs(1)).with_start(WindowStart::Aligned(Duration::ZERO))
}

/// 8 units in the previous window, 2 so far in the current one (which starts at T0).
const EIGHT_THEN_TWO: SlidingWindowState = SlidingWindowState {
    window_start: T0,
    current: 2,
    previous: 8,
};

#[test]
fn the_previous_window_weighs_by_its_overlap() {
    let sw = ten_per_second();
    let run = Run::new(&sw, EIGHT_THEN_TWO);
    // estimate = 8·(1 − elapsed/p) + 2; remaining = floor(10 − estimate); reset = when the
    // estimate has dropped by one more unit.
    assert_eq!(run.peek(T0), allowed(10, 0, ms(125)));
    assert_eq!(run.peek(T0 + 250 * MS), allowed(10, 2, ms(125))); // estimate 8
    assert_eq!(run.peek(T0 + 500 * MS), allowed(10, 4, ms(125))); // estimate 6
    assert_eq!(run.peek(T0 + 750 * MS), allowed(10, 6, ms(125))); // estimate 4
    assert_eq!(run.peek(T0 + 800 * MS), allowed(10, 6, ms(75))); // estimate 3.6
                                                                 // Next window: the current 2 become the previous ones.
    assert_eq!(run.peek(T0 + 1250 * MS), allowed(10, 8, ms(250))); // estimate 1.5
    assert_eq!(run.peek(T0 + 2 * SEC), allowed(10, 10, Duration::ZERO));
}

#[test]
fn denials_are_exact_and_not_counted() {
    let sw = ten_per_second();
    let mut run = Run::new(&sw, EIGHT_THEN_TWO);
    let t = T0 + 250 * MS;
    // 3 more fit once 8·(p − e) ≤ (10 − 2 − 3)·p, at e = 375 ms.
    assert_eq!(run.charge(t, 3), denied(10, 2, ms(125), ms(125)));
    assert_eq!(
        run.charge(T0 + 375 * MS - 1, 3),
        denied(10, 2, us(1), us(1))
    );
    // 8 more fit only in the next window, where the previous count is the current 2.
    assert_eq!(run.charge(t, 8), denied(10, 2, ms(125), ms(750)));
    assert_eq!(run.state, EIGHT_THEN_TWO);
    assert_eq!(run.charge(t, 2), allowed(10, 0, ms(125)));
    // At 375 ms the estimate is 8·0.625 + 4 = 9: one more fits, then none until 500 ms.
    assert_eq!(run.charge(T0 + 375 * MS, 1), allowed(10, 0, ms(125)));
    assert_eq!(
        run.charge(T0 + 375 * MS, 1),
        denied(10, 0, ms(125), ms(125))
    );
    assert_eq!(run.charge(T0 + 500 * MS, 1), allowed(10, 0, ms(125)));
    assert_eq!(
        run.state,
        SlidingWindowState {
            window_start: T0,
            current: 6,
            previous: 8,
        }
    );
}

#[test]
fn a_full_window_slides_into_the_next() {
    let sw = ten_per_second();
    let mut run = Run::new(&sw, sw.fresh(T0 + 100 * MS, 0));
    assert_eq!(run.charge(T0 + 100 * MS, 10), allowed(10, 0, ms(1000)));
    // At T0 + 1.1 s: 10·0.9 + 1 = 10.
    assert_eq!(
        run.charge(T0 + 100 * MS, 1),
        denied(10, 0, secs(1), secs(1))
    );
    assert_eq!(run.charge(T0 + 1100 * MS, 1), allowed(10, 0, ms(100)));
    assert_eq!(
        run.charge(T0 + 1100 * MS, 1),
        denied(10, 0, ms(100), ms(100))
    );
}

#[test]
fn a_count_above_a_lowered_limit_weighs_as_a_full_window_once_its_window_ends() {
    // Issue 39 (a window's count under a lowered limit): 100 an hour, 60 used, moved to 20: denied for the rest of the
    // hour; the next hour the 60 weigh as a full window of 20 would, not as 60 (which would
    // refuse everything until 41 minutes into it).
    let hour = secs(3_600);
    let h = 1_699_999_200 * SEC; // a whole UTC hour
    let per_hour =
        |limit| SlidingWindow::new(limit, hour).with_start(WindowStart::Aligned(Duration::ZERO));
    let hundred = per_hour(100);
    let mut used = Run::new(&hundred, hundred.fresh(h, 0));
    assert!(used.charge(h + 600 * SEC, 60).verdict.is_admitted());
    let twenty = per_hour(20);
    let mut run = Run::new(&twenty, used.state);
    assert_eq!(
        run.charge(h + 1_800 * SEC, 1),
        denied(20, 0, secs(1_980), secs(1_980))
    );
    assert_eq!(run.peek(h + 3_600 * SEC), allowed(20, 0, secs(180)));
    assert_eq!(
        run.charge(h + 3_780 * SEC - 1, 1),
        denied(20, 0, us(1), us(1))
    );
    assert_eq!(run.charge(h + 3_780 * SEC, 1), allowed(20, 0, secs(180)));
    // The window after that one is a whole one.
    assert_eq!(run.peek(h + 7_200 * SEC).remaining, 19);
}

#[test]
fn expires_when_neither_count_weighs() {
    let sw = ten_per_second();
    assert_eq!(sw.expires_at(EIGHT_THEN_TWO), T0 + 2 * SEC);
    let only_previous = SlidingWindowState {
        current: 0,
        ..EIGHT_THEN_TWO
    };
    assert_eq!(sw.expires_at(only_previous), T0 + SEC);
    assert_eq!(sw.expires_at(sw.fresh(T0, 0)), T0);
    let fresh_later = sw.fresh(T0 + 2 * SEC, 0);
    for cost in 0..=10 {
        let at = T0 + 2 * SEC;
        assert_eq!(
            sw.evaluate(EIGHT_THEN_TWO, at, cost),
            sw.evaluate(fresh_later, at, cost)
        );
    }
}

#[test]
fn clock_skew_admits_nothing_more() {
    // Another instance, 5 ms behind, asks just after a new window started.
    check_clock_skew(&ten_per_second(), T0 + MS, 5 * MS);
    let sw = ten_per_second();
    let state = SlidingWindowState {
        window_start: T0,
        current: 4,
        previous: 3,
    };
    // Before the window started, the previous window weighs fully: 3 + 4 + 3 = 10 fits. One more
    // unit fits once 3·(p − e) ≤ 2·p, at e = 333 334 µs.
    let out = sw.evaluate(state, T0 - MS, 3);
    assert_eq!(out, allowed(10, 0, us(MS + 333_334)));
    assert!(!sw.evaluate(state, T0 - MS, 4).verdict.is_admitted());
}

/// A random sliding window and a key's offset in it.
fn window() -> impl Strategy<Value = (SlidingWindow, Micros)> {
    (1u64..50, period(), any::<u64>()).prop_map(|(limit, period, offset)| {
        (SlidingWindow::new(limit, us(period)), offset % period)
    })
}

proptest! {
    #[test]
    fn admits_exactly_what_the_estimate_allows(
        (sw, offset) in window(),
        start in start(),
        events in events(),
    ) {
        let run = drive(&sw, start, offset, &events, |_| Mode::Charge)?;
        // The model: counts per fixed window from the history alone.
        let period = micros(sw.period());
        let first = sw.fresh(start, offset).window_start;
        let window = |t: Micros| (t - first) / period;
        let mut counts: Vec<u128> = Vec::new();
        for step in &run.steps {
            let k = window(step.at) as usize;
            if counts.len() <= k {
                counts.resize(k + 1, 0);
            }
            let previous = if k == 0 { 0 } else { counts[k - 1] };
            let elapsed = u128::from(step.at - first - k as u64 * period);
            let estimate = previous * (u128::from(period) - elapsed) + counts[k] * u128::from(period);
            let fits = estimate + u128::from(step.cost) * u128::from(period)
                <= u128::from(sw.limit()) * u128::from(period);
            prop_assert_eq!(step.out.verdict.is_admitted(), fits, "{:?}", step);
            if fits {
                counts[k] += u128::from(step.cost);
            }
        }
        // Hence never more than the limit within one fixed window.
        let limit = u128::from(sw.limit());
        assert_bounded(&run.charges(), |a, b| if window(a) == window(b) { limit } else { u128::MAX })?;
    }

    #[test]
    fn refunds_never_exceed_capacity((sw, offset) in window(), start in start(), events in events()) {
        check_refunds(&sw, start, offset, &events, true)?;
    }

    #[test]
    fn an_expired_state_is_a_fresh_key(
        (sw, offset) in window(),
        start in start(),
        history in events(),
        later in any::<u64>(),
        follow_up in events(),
    ) {
        check_expiry(&sw, start, offset, &history, later, &follow_up)?;
    }
}

#[test]
fn a_period_beyond_the_clock_saturates() {
    // Found by the `config` fuzz target: `period = "500000000y"` with a per-key start overflowed
    // the end of the window, both for the reset and for the moment the state expires.
    let sw = SlidingWindow::new(2, Duration::MAX);
    let state = sw.fresh(T0, 1);
    assert_eq!(state.window_start, 1);
    let never = us(u64::MAX - T0);
    let mut run = Run::new(&sw, state);
    assert_eq!(run.charge(T0, 1), allowed(2, 1, never));
    assert_eq!(run.charge(T0, 1), allowed(2, 0, never));
    assert_eq!(run.charge(T0, 1), denied(2, 0, never, never));
    assert_eq!(sw.expires_at(run.state), u64::MAX);
    // A previous window's count that will not decay within the clock's range.
    let run = Run::new(
        &sw,
        SlidingWindowState {
            window_start: T0,
            current: 0,
            previous: 1,
        },
    );
    assert_eq!(run.peek(T0), allowed(2, 1, us(u64::MAX - T0)));
}
