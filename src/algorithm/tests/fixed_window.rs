use super::*;

fn aligned(limit: u64, period: Duration) -> FixedWindow {
    FixedWindow::new(limit, period).with_start(WindowStart::Aligned(Duration::ZERO))
}

#[test]
fn aligned_windows_start_on_whole_minutes() {
    let fw = aligned(5, secs(60));
    let offset = fw.start().offset(60 * SEC, "api", b"alice");
    assert_eq!(offset, 0);
    let t = T0 + 10 * SEC;
    let state = fw.fresh(t, offset);
    assert_eq!(
        state,
        FixedWindowState {
            window_start: T0,
            spent: 0
        }
    );
    let mut run = Run::new(&fw, state);
    for left in (0..5).rev() {
        assert_eq!(run.charge(t, 1), allowed(5, left, secs(50)));
    }
    assert_eq!(run.charge(t, 1), denied(5, 0, secs(50), secs(50)));
    assert_eq!(run.charge(T0 + 60 * SEC - 1, 1), denied(5, 0, us(1), us(1)));
    assert_eq!(run.charge(T0 + 60 * SEC, 1), allowed(5, 4, secs(60)));
    // An aligned offset is taken modulo the period and moves every key's windows alike.
    assert_eq!(
        WindowStart::Aligned(secs(75)).offset(60 * SEC, "api", b"alice"),
        15 * SEC
    );
    assert_eq!(fw.fresh(t, 15 * SEC).window_start, T0 - 45 * SEC);
    assert_eq!(
        fw.fresh(T0 + 15 * SEC, 15 * SEC).window_start,
        T0 + 15 * SEC
    );
}

#[test]
fn per_key_windows_start_at_a_stable_offset_of_the_key() {
    let fw = FixedWindow::new(5, secs(60));
    assert_eq!(fw.start(), WindowStart::PerKey);
    // stable_key_hash("api", b"alice") % 60 s.
    let alice = fw.start().offset(60 * SEC, "api", b"alice");
    assert_eq!(alice, 51_215_328);
    let bob = fw.start().offset(60 * SEC, "api", b"bob");
    assert_ne!(alice, bob);

    // Alice's windows start 51.215 328 s past each whole minute: at T0 + 30 s she is in the one
    // that started at T0 − 8.784 672 s.
    let t = T0 + 30 * SEC;
    let mut run = Run::new(&fw, fw.fresh(t, alice));
    assert_eq!(run.state.window_start, T0 + alice - 60 * SEC);
    assert_eq!(run.charge(t, 5).remaining, 0);
    let retry = us(T0 + alice - t); // 21.215 328 s
    assert_eq!(retry, Duration::from_micros(21_215_328));
    assert_eq!(run.charge(t, 1), denied(5, 0, retry, retry));

    // Bob's windows reset at his own instant.
    let mut bob_run = Run::new(&fw, fw.fresh(t, bob));
    bob_run.charge(t, 5);
    let bob_start = bob_run.state.window_start;
    assert!(bob_start <= t && t < bob_start + 60 * SEC);
    assert_eq!(bob_start % (60 * SEC), bob); // T0 is a whole minute
    let retry = us(bob_start + 60 * SEC - t);
    assert_eq!(bob_run.charge(t, 1), denied(5, 0, retry, retry));
}

#[test]
fn unused_units_roll_over_up_to_the_capacity() {
    let fw = aligned(10, secs(1)).with_capacity(25);
    let mut run = Run::new(&fw, fw.fresh(T0, 0));
    // A fresh key starts with a full capacity.
    assert_eq!(run.peek(T0), allowed(25, 25, Duration::ZERO));
    let t = T0 + 400 * MS;
    assert_eq!(run.charge(t, 25), allowed(25, 0, ms(600)));
    // v' = min(v + r·k, C) − n; retry_after = window_start' + p·ceil(−v'/r) − now.
    assert_eq!(run.charge(t, 10), denied(25, 0, ms(600), ms(600)));
    assert_eq!(run.charge(t, 11), denied(25, 0, ms(600), ms(1600)));
    assert_eq!(run.charge(t, 25), denied(25, 0, ms(600), ms(2600)));
    assert_eq!(run.peek(T0 + SEC), allowed(25, 10, secs(1)));
    assert_eq!(run.charge(T0 + SEC, 3), allowed(25, 7, secs(1)));
    assert_eq!(run.peek(T0 + 2500 * MS), allowed(25, 17, ms(500)));
    // min(7 + 2·10, 25).
    assert_eq!(run.peek(T0 + 3 * SEC), allowed(25, 25, Duration::ZERO));
    assert_eq!(run.charge(T0 + 3 * SEC, 14), allowed(25, 11, secs(1)));
    assert_eq!(
        run.charge(T0 + 3 * SEC, 12),
        denied(25, 11, secs(1), secs(1))
    );
}

/// A state `fw` leaves after charging `cost` at `at`, from a fresh key at `at`.
fn spent(fw: &FixedWindow, at: Micros, cost: u64) -> FixedWindowState {
    let state = fw.fresh(at, 0);
    assert!(fw
        .evaluate(state, at, cost, Mode::Charge)
        .verdict
        .is_admitted());
    fw.commit(state, at, cost)
}

#[test]
fn a_larger_limit_compares_the_windows_count_with_it() {
    // A limit that changes: 60 of 100 used, moved to 80, leaves 20 (not the 40 the old limit left).
    let (hundred, eighty) = (aligned(100, secs(60)), aligned(80, secs(60)));
    let state = spent(&hundred, T0 + 10 * SEC, 60);
    let t = T0 + 20 * SEC;
    assert_eq!(
        eighty.evaluate(state, t, 0, Mode::Check),
        allowed(80, 20, secs(40))
    );
    let mut run = Run::new(&eighty, state);
    assert_eq!(run.charge(t, 20), allowed(80, 0, secs(40)));
    assert_eq!(run.charge(t, 1), denied(80, 0, secs(40), secs(40)));
    // The next window is a whole one under the limit in force.
    assert_eq!(run.peek(T0 + 60 * SEC), allowed(80, 80, Duration::ZERO));
    // Moved up to 150 instead: the 60 used leave 90.
    let more = aligned(150, secs(60));
    assert_eq!(more.evaluate(state, t, 0, Mode::Check).remaining, 90);
}

#[test]
fn a_count_above_a_lowered_limit_is_forgiven_when_its_window_ends() {
    // Issue 39 (a window's count under a lowered limit): 100 an hour, 60 used, moved to 20: denied for the rest of this
    // hour, 20 fresh the next hour, not two more hours of nothing.
    let hour = secs(3_600);
    let h = 1_699_999_200 * SEC; // a whole UTC hour
    let state = spent(&aligned(100, hour), h + 600 * SEC, 60);
    let twenty = aligned(20, hour);
    let t = h + 1_800 * SEC;
    let out = twenty.evaluate(state, t, 1, Mode::Charge);
    assert_eq!(out, denied(20, 0, secs(1_800), secs(1_800)));
    assert_eq!(out.balance, -40);
    assert_eq!(out.full_in, secs(1_800));
    let mut run = Run::new(&twenty, state);
    assert_eq!(
        run.charge(h + hour_us() - 1, 1),
        denied(20, 0, us(1), us(1))
    );
    assert_eq!(run.peek(h + hour_us()), allowed(20, 20, Duration::ZERO));
    let next = h + hour_us() + 100 * SEC;
    for left in (0..20).rev() {
        assert_eq!(run.charge(next, 1), allowed(20, left, secs(3_500)));
    }
    assert_eq!(run.charge(next, 1), denied(20, 0, secs(3_500), secs(3_500)));
    // The key is a fresh one's when its window ends.
    assert_eq!(twenty.expires_at(state), h + hour_us());

    // Moved to 50, 60 and 70 instead: 10 over (then 50 fresh the next hour), exactly used up,
    // 10 left.
    let fifty = aligned(50, hour);
    assert_eq!(fifty.evaluate(state, t, 0, Mode::Check).balance, -10);
    assert_eq!(
        fifty.evaluate(state, h + hour_us(), 0, Mode::Check),
        allowed(50, 50, Duration::ZERO)
    );
    assert_eq!(
        aligned(60, hour).evaluate(state, t, 0, Mode::Check).balance,
        0
    );
    assert_eq!(
        aligned(70, hour)
            .evaluate(state, t, 0, Mode::Check)
            .remaining,
        10
    );
}

fn hour_us() -> Micros {
    3_600 * SEC
}

#[test]
fn a_reservation_in_an_over_counted_window_waits_for_the_next_one() {
    // 60 of 100 an hour used, moved to 20: a reservation of 5 is paid by the next hour, which
    // does not owe the 40 over the limit; it holds 5 of that hour's 20.
    let hour = secs(3_600);
    let h = 1_699_999_200 * SEC;
    let state = spent(&aligned(100, hour), h, 60);
    let twenty = aligned(20, hour);
    let unbounded = Mode::Reserve(ReserveBound::default());
    let t = h + 1_800 * SEC;
    let out = twenty.evaluate(state, t, 5, unbounded);
    assert_eq!(out, reserved(20, 0, secs(1_800), secs(1_800)));
    assert_eq!(out.balance, -5);
    let state = twenty.commit(state, t, 5);
    assert_eq!(
        state,
        FixedWindowState {
            window_start: h + hour_us(),
            spent: 5,
        }
    );
    assert_eq!(
        twenty.evaluate(state, h + hour_us(), 0, Mode::Check),
        allowed(20, 15, secs(3_600))
    );
    // At most 5 owed: 5 more would owe 10; the unit bound is met once that hour begins.
    let by_units = Mode::Reserve(ReserveBound {
        max_units: Some(5),
        max_wait: None,
    });
    assert_eq!(
        twenty.evaluate(state, t, 5, by_units),
        denied(20, 0, secs(1_800), secs(1_800))
    );
}

#[test]
fn a_reservation_carries_its_debt_into_later_windows_under_any_limit() {
    // 10 a minute, 16 reserved from a full window at W: W is held, and 6 of W + 60 s.
    let ten = aligned(10, secs(60));
    let unbounded = Mode::Reserve(ReserveBound::default());
    let state = ten.fresh(T0, 0);
    assert_eq!(
        ten.evaluate(state, T0, 16, unbounded),
        reserved(10, 0, secs(60), secs(60))
    );
    let state = ten.commit(state, T0, 16);
    assert_eq!(
        state,
        FixedWindowState {
            window_start: T0 + 60 * SEC,
            spent: 6,
        }
    );
    // The debt is carried: W + 60 s has 4 left.
    assert_eq!(
        ten.evaluate(state, T0 + 60 * SEC, 0, Mode::Check),
        allowed(10, 4, secs(60))
    );
    // Moved to 5 a minute: still held until W + 60 s, whose 6 counted are above 5: nothing
    // until W + 120 s, which is a whole window.
    let five = aligned(5, secs(60));
    let out = five.evaluate(state, T0 + SEC, 1, Mode::Charge);
    assert_eq!(out, denied(5, 0, secs(119), secs(119)));
    assert_eq!(out.balance, -6);
    assert_eq!(
        five.evaluate(state, T0 + 60 * SEC, 1, Mode::Charge),
        denied(5, 0, secs(60), secs(60))
    );
    assert_eq!(
        five.evaluate(state, T0 + 120 * SEC, 0, Mode::Check),
        allowed(5, 5, Duration::ZERO)
    );
    assert_eq!(five.expires_at(state), T0 + 120 * SEC);
    // Moved to 20 a minute: the windows it holds stay held, as a bucket's reservation holds
    // the time until it is paid: nothing left in W, 14 at W + 60 s.
    let twenty = aligned(20, secs(60));
    assert_eq!(
        twenty.evaluate(state, T0 + SEC, 0, Mode::Check).remaining,
        0
    );
    assert_eq!(
        twenty
            .evaluate(state, T0 + 60 * SEC, 0, Mode::Check)
            .remaining,
        14
    );
}

#[test]
fn an_idle_key_is_full_under_any_limit() {
    let state = aligned(100, secs(60)).fresh(T0, 0);
    for limit in [1, 20, 100, 1_000] {
        let fw = aligned(limit, secs(60));
        assert_eq!(
            fw.evaluate(state, T0 + SEC, 0, Mode::Check),
            allowed(limit, limit, Duration::ZERO)
        );
    }
    // A key whose windows paid back all it spent is as idle.
    let state = spent(&aligned(100, secs(60)), T0, 100);
    let later = aligned(30, secs(60)).evaluate(state, T0 + 240 * SEC, 0, Mode::Check);
    assert_eq!(later, allowed(30, 30, Duration::ZERO));
}

#[test]
fn rolled_over_units_are_what_the_new_capacity_leaves_above_the_spent() {
    // 10 a second rolling over up to 30: 25 spent at T0, one window pays 10 back (15 spent).
    let thirty = aligned(10, secs(1)).with_capacity(30);
    let state = spent(&thirty, T0, 25);
    let t = T0 + SEC + 100 * MS;
    assert_eq!(thirty.evaluate(state, t, 0, Mode::Check).remaining, 15);
    // Under a capacity of 40 the same 15 spent leave 25; written at T0 + 1 s, under 20, 5.
    let forty = aligned(10, secs(1)).with_capacity(40);
    assert_eq!(forty.evaluate(state, t, 0, Mode::Check).remaining, 25);
    let twenty = aligned(10, secs(1)).with_capacity(20);
    let written = thirty.refund(state, t, 0);
    assert_eq!(twenty.evaluate(written, t, 0, Mode::Check).remaining, 5);
    // Read under 20 from T0, the 25 counted at T0 were 5 over it, forgiven when T0's window
    // ended: 10 spent, 10 left.
    assert_eq!(twenty.evaluate(state, t, 0, Mode::Check).remaining, 10);
    // Windows pay back at the limit in force: 20 a second pays the 25 back in two windows.
    let fast = aligned(20, secs(1)).with_capacity(30);
    assert_eq!(fast.evaluate(state, T0 + SEC, 0, Mode::Check).remaining, 25);
    assert_eq!(
        fast.evaluate(state, T0 + 2 * SEC, 0, Mode::Check).remaining,
        30
    );
}

#[test]
fn expires_when_the_window_would_be_full_again() {
    let fw = aligned(10, secs(1)).with_capacity(25);
    let state = FixedWindowState {
        window_start: T0,
        spent: 22,
    };
    // 22 missing: three windows of 10.
    assert_eq!(fw.expires_at(state), T0 + 3 * SEC);
    let at = T0 + 3 * SEC;
    for cost in 0..=25 {
        assert_eq!(
            fw.evaluate(state, at, cost, Mode::Charge),
            fw.evaluate(fw.fresh(at, 0), at, cost, Mode::Charge)
        );
    }
    assert_eq!(fw.evaluate(state, at - 1, 0, Mode::Charge).remaining, 23);

    let plain = aligned(5, secs(1));
    let drained = FixedWindowState {
        window_start: T0,
        spent: 5,
    };
    assert_eq!(plain.expires_at(drained), T0 + SEC);
    let full = FixedWindowState {
        window_start: T0,
        spent: 0,
    };
    assert_eq!(plain.expires_at(full), T0);
}

#[test]
fn clock_skew_admits_nothing_more() {
    check_clock_skew(&aligned(5, secs(1)), T0 + MS, 5 * MS);
    check_clock_skew(&aligned(5, secs(1)).with_capacity(12), T0 + MS, 5 * MS);
}

/// A random window and a key's offset in it: limit 1..50, half the time a roll-over capacity up to
/// three times the limit.
fn window() -> impl Strategy<Value = (FixedWindow, Micros)> {
    (
        1u64..50,
        period(),
        any::<bool>(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(limit, period, rolls, extra, offset)| {
            let capacity = if rolls {
                limit + extra % (2 * limit + 1)
            } else {
                limit
            };
            let fw = FixedWindow::new(limit, us(period)).with_capacity(capacity);
            (fw, offset % period)
        })
}

#[test]
fn reservations_wait_for_the_window_that_pays_them_back() {
    // The reservation example: 10 per minute, full at window start W.
    let fw = aligned(10, secs(60));
    let unbounded = Mode::Reserve(ReserveBound::default());
    let mut run = Run::new(&fw, fw.fresh(T0, 0));
    // Reserve 16 → v' = −6: wait until W + 60 s.
    assert_eq!(
        run.step(T0, 16, unbounded),
        reserved(10, 0, secs(60), secs(60))
    );
    // The reservation holds W, and 6 of the window that pays it back.
    assert_eq!(
        run.state,
        FixedWindowState {
            window_start: T0 + 60 * SEC,
            spent: 6,
        }
    );
    // At W + 30 s reserve 5 → v' = −11: wait until W + 120 s, 90 s from now.
    let t = T0 + 30 * SEC;
    assert_eq!(
        run.step(t, 5, unbounded),
        reserved(10, 0, secs(90), secs(90))
    );
    assert_eq!(
        run.state,
        FixedWindowState {
            window_start: T0 + 120 * SEC,
            spent: 1,
        }
    );
    // Nothing passes before the debt is paid: at W + 60 s the balance is −1.
    assert_eq!(
        run.charge(T0 + 60 * SEC, 1),
        denied(10, 0, secs(60), secs(60))
    );
    assert_eq!(run.peek(T0 + 120 * SEC), allowed(10, 9, secs(60)));
    // The key is fresh again once the debt is paid and the window refilled: at W + 180 s.
    assert_eq!(fw.expires_at(run.state), T0 + 180 * SEC);
    // A refund pays the debt back first.
    assert_eq!(
        fw.refund(run.state, t, 11),
        FixedWindowState {
            window_start: T0,
            spent: 10,
        }
    );
}

#[test]
fn a_bounded_reservation_is_denied_until_the_queue_would_take_it() {
    let fw = aligned(10, secs(60));
    // At most 5 units owed.
    let by_units = Mode::Reserve(ReserveBound {
        max_units: Some(5),
        max_wait: None,
    });
    assert_eq!(fw.max_cost(by_units), 15);
    let mut run = Run::new(&fw, fw.fresh(T0, 0));
    assert_eq!(
        run.step(T0, 15, by_units),
        reserved(10, 0, secs(60), secs(60))
    );
    // Owing 5, one more would owe 6: it can queue once the next window pays 10 back.
    assert_eq!(
        run.step(T0 + 10 * SEC, 1, by_units),
        denied(10, 0, secs(50), secs(50))
    );

    // At most 30 s of waiting: from a full window, 12 units wait until W + 60 s, which is
    // within 30 s from W + 30 s on.
    let by_wait = Mode::Reserve(ReserveBound {
        max_units: None,
        max_wait: Some(secs(30)),
    });
    // From a full window in its last µs, one more window's 10 units wait 1 µs + 0 windows.
    assert_eq!(fw.max_cost(by_wait), 20);
    let state = fw.fresh(T0, 0);
    assert_eq!(
        fw.evaluate(state, T0 + 10 * SEC, 12, by_wait),
        denied(10, 10, Duration::ZERO, secs(20))
    );
    assert_eq!(
        fw.evaluate(state, T0 + 30 * SEC, 12, by_wait),
        reserved(10, 0, secs(30), secs(30))
    );
    // Drained: 5 units wait for W + 60 s, within 30 s from W + 30 s on.
    let drained = FixedWindowState {
        window_start: T0,
        spent: 10,
    };
    assert_eq!(
        fw.evaluate(drained, T0 + 10 * SEC, 5, by_wait),
        denied(10, 0, secs(50), secs(20))
    );
    // Queue mode never reserves beyond its bound, and a plain charge never reserves.
    assert_eq!(
        fw.evaluate(drained, T0 + 10 * SEC, 5, Mode::Charge),
        denied(10, 0, secs(50), secs(50))
    );
}

fn bound() -> impl Strategy<Value = ReserveBound> {
    (
        prop::option::of(0u64..30),
        prop::option::of((0u64..3 * SEC).prop_map(us)),
    )
        .prop_map(|(max_units, max_wait)| ReserveBound {
            max_units,
            max_wait,
        })
}

/// Calendar months at an offset of whole hours within ±18 h.
fn months() -> impl Strategy<Value = FixedWindow> {
    (1u64..20, 0u64..3, -18i64..=18).prop_map(|(limit, extra, hours)| {
        FixedWindow::calendar_months(limit, hours * 3_600_000_000)
            .with_capacity(limit * (1 + extra))
    })
}

#[test]
fn calendar_months_reset_on_the_first() {
    // 2024-02-10T00:00Z; February 2024 has 29 days.
    let t = 1_707_523_200 * SEC;
    let fw = FixedWindow::calendar_months(3, 0);
    // `RateLimit-Policy`'s `w`: the longest month.
    assert_eq!(
        Algorithm::FixedWindow(fw.clone()).window(),
        secs(31 * 86_400)
    );
    let mut run = Run::new(&fw, fw.fresh(t, 0));
    assert_eq!(run.state.window_start, 1_706_745_600 * SEC); // 1 February
    assert_eq!(run.charge(t, 3), allowed(3, 0, secs(20 * 86_400)));
    // Owing 4 → March pays 3, April the last one: 20 + 31 days.
    let out = run.step(t, 4, Mode::Reserve(ReserveBound::default()));
    assert_eq!(out, reserved(3, 0, secs(51 * 86_400), secs(51 * 86_400)));
    assert_eq!(out.full_in, secs(81 * 86_400));
    // Midnight on the 1st in UTC+5:30 is 18:30 UTC the day before.
    let india = FixedWindow::calendar_months(3, 19_800_000_000);
    assert_eq!(india.fresh(t, 0).window_start, 1_706_725_800 * SEC);
}

proptest! {
    #[test]
    fn calendar_months_keep_every_promise(
        fw in months(),
        bound in bound(),
        start in start(),
        events in events(),
    ) {
        let mode = Mode::Reserve(bound);
        let run = drive(&fw, start, 0, &events, |e| match e.mode_raw % 4 {
            0 => Mode::Check,
            1 => Mode::Charge,
            _ => mode,
        })?;
        prop_assert!(fw.expires_at(run.state) >= run.state.window_start);
    }

    #[test]
    fn a_calendar_month_expired_is_a_fresh_key(
        fw in months(),
        start in start(),
        history in events(),
        later in any::<u64>(),
        follow_up in events(),
    ) {
        check_expiry(&fw, start, 0, &history, later, &follow_up)?;
    }

    #[test]
    fn reservations_are_fifo_and_never_over_admit(
        (fw, offset) in window(),
        bound in bound(),
        start in start(),
        events in events(),
    ) {
        let mode = Mode::Reserve(bound);
        let run = drive(&fw, start, offset, &events, |e| match e.mode_raw % 4 {
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
        // Counted when they start (at the window that pays them back), charges are first in,
        // first out, and windows i..=j start at most C + (j − i + 1)·r units: the window before
        // `i` may have paid for reservations that start with `i`; plus what a first reservation
        // larger than the capacity brings.
        let charges = run.charges();
        assert_bounded(&charges, |_, _| u128::MAX)?;
        let first = fw.fresh(start, offset).window_start;
        let period = micros(fw.period());
        let (capacity, limit) = (u128::from(fw.capacity()), u128::from(fw.limit()));
        let window = move |t: Micros| u128::from((t - first) / period);
        for (i, &(a, head)) in charges.iter().enumerate() {
            let extra = capacity.max(u128::from(head)) - capacity;
            let mut sum = 0u128;
            for &(b, units) in &charges[i..] {
                sum += u128::from(units);
                let max = capacity + extra + limit * (window(b) - window(a) + 1);
                prop_assert!(sum <= max, "{} units started in [{}, {}], at most {}", sum, a, b, max);
            }
        }
    }

    #[test]
    fn never_over_admits((fw, offset) in window(), start in start(), events in events()) {
        let run = drive(&fw, start, offset, &events, |_| Mode::Charge)?;
        let first = fw.fresh(start, offset).window_start;
        prop_assert!(first <= start && start < first + micros(fw.period()));
        prop_assert_eq!((first + micros(fw.period()) - offset) % micros(fw.period()), 0);
        // Windows i..=j hold at most C + (j − i)·r: C in one window, C = r without roll-over.
        let period = micros(fw.period());
        let (capacity, limit) = (u128::from(fw.capacity()), u128::from(fw.limit()));
        let window = move |t: Micros| u128::from((t - first) / period);
        assert_bounded(&run.charges(), |a, b| capacity + limit * (window(b) - window(a)))?;
    }

    #[test]
    fn refunds_never_exceed_capacity((fw, offset) in window(), start in start(), events in events()) {
        check_refunds(&fw, start, offset, &events, true)?;
    }

    #[test]
    fn an_expired_state_is_a_fresh_key(
        (fw, offset) in window(),
        start in start(),
        history in events(),
        later in any::<u64>(),
        follow_up in events(),
    ) {
        check_expiry(&fw, start, offset, &history, later, &follow_up)?;
    }
}

#[test]
fn a_period_beyond_the_clock_saturates() {
    // Found by the `config` fuzz target: `period = "500000000y"` (microseconds saturate at
    // `u64::MAX`) with a per-key start overflowed the end of the window.
    let fw = FixedWindow::new(1, Duration::MAX);
    let state = fw.fresh(T0, 1);
    assert_eq!(state.window_start, 1);
    let never = us(u64::MAX - T0);
    let mut run = Run::new(&fw, state);
    assert_eq!(run.charge(T0, 1), allowed(1, 0, never));
    assert_eq!(run.charge(T0, 1), denied(1, 0, never, never));
    assert_eq!(fw.expires_at(run.state), u64::MAX);
}
