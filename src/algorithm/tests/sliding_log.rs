use super::*;

#[test]
fn an_entry_leaves_exactly_one_period_after_it_was_admitted() {
    let log = SlidingLog::new(3, secs(1));
    let mut run = Run::new(&log, SlidingLogState::default());
    assert_eq!(run.charge(T0, 1), allowed(3, 2, secs(1)));
    assert_eq!(run.charge(T0 + 100 * MS, 1), allowed(3, 1, ms(900)));
    assert_eq!(run.charge(T0 + 200 * MS, 1), allowed(3, 0, ms(800)));
    let t = T0 + 500 * MS;
    assert_eq!(run.charge(t, 1), denied(3, 0, ms(500), ms(500)));
    // Two units need the two oldest entries gone.
    assert_eq!(run.charge(t, 2), denied(3, 0, ms(500), ms(600)));
    assert_eq!(run.charge(T0 + SEC - 1, 1), denied(3, 0, us(1), us(1)));
    assert_eq!(run.charge(T0 + SEC, 1), allowed(3, 0, ms(100)));
    let entries: Vec<_> = run.state.entries().collect();
    assert_eq!(
        entries,
        [(T0 + 100 * MS, 1), (T0 + 200 * MS, 1), (T0 + SEC, 1)]
    );
}

#[test]
fn charges_at_the_same_instant_share_an_entry() {
    let log = SlidingLog::new(5, secs(1));
    let mut run = Run::new(&log, SlidingLogState::default());
    run.charge(T0, 2);
    run.charge(T0, 1);
    assert_eq!(run.state.entries().collect::<Vec<_>>(), [(T0, 3)]);
    run.charge(T0 + 1, 1);
    run.charge(T0 + 1, 0);
    assert_eq!(
        run.state.entries().collect::<Vec<_>>(),
        [(T0, 3), (T0 + 1, 1)]
    );
    assert_eq!(
        run.charge(T0 + 1, 2),
        denied(5, 1, us(SEC - 1), us(SEC - 1))
    );

    // Refunds take the newest units first.
    log.refund(&mut run.state, T0 + 1, 2);
    assert_eq!(run.state.entries().collect::<Vec<_>>(), [(T0, 2)]);
}

#[test]
fn expires_when_the_newest_entry_leaves() {
    let log = SlidingLog::new(5, secs(1));
    let state = SlidingLogState::from_entries([(T0, 3), (T0 + 1, 1)]);
    assert_eq!(log.expires_at(&state), T0 + 1 + SEC);
    assert_eq!(log.expires_at(&SlidingLogState::default()), 0);
    let at = T0 + 1 + SEC;
    for cost in 0..=5 {
        assert_eq!(
            log.evaluate(&state, at, cost),
            log.evaluate(&SlidingLogState::default(), at, cost)
        );
    }
    assert_eq!(log.evaluate(&state, at - 1, 0), allowed(5, 4, us(1)));
}

#[test]
fn a_log_over_the_limit_is_denied_not_a_panic() {
    // E.g. a state kept while the rule's limit was lowered from 5 to 3.
    let log = SlidingLog::new(3, secs(1));
    let state = SlidingLogState::from_entries([(T0, 5)]);
    assert_eq!(
        log.evaluate(&state, T0 + MS, 1),
        denied(3, 0, ms(999), ms(999))
    );
    assert_eq!(log.evaluate(&state, T0 + SEC, 3), allowed(3, 0, secs(1)));
}

#[test]
fn clock_skew_admits_nothing_more() {
    check_clock_skew(&SlidingLog::new(5, secs(1)), T0 + MS, 5 * MS);
}

fn log() -> impl Strategy<Value = SlidingLog> {
    (1u64..50, period()).prop_map(|(limit, period)| SlidingLog::new(limit, us(period)))
}

proptest! {
    #[test]
    fn admits_exactly_what_fits_in_the_last_period(
        log in log(),
        start in start(),
        events in events(),
    ) {
        let run = drive(&log, start, 0, &events, |_| Mode::Charge)?;
        let (period, limit) = (micros(log.period()), log.limit());
        // The model: units admitted in (now − p, now], from the history alone.
        let mut admitted: Vec<(Micros, u64)> = Vec::new();
        for step in &run.steps {
            let used: u64 = admitted
                .iter()
                .filter(|&&(at, _)| at + period > step.at)
                .map(|&(_, units)| units)
                .sum();
            let fits = used + step.cost <= limit;
            prop_assert_eq!(step.out.verdict.is_admitted(), fits, "{:?} with {} used", step, used);
            if fits {
                admitted.push((step.at, step.cost));
            }
        }
        // Any half-open interval of one period holds at most the limit.
        let limit = u128::from(limit);
        assert_bounded(&run.charges(), |a, b| if b - a < period { limit } else { u128::MAX })?;
        // The log keeps one entry per instant, in order, all inside the period at the last commit.
        let entries: Vec<_> = run.state.entries().collect();
        for pair in entries.windows(2) {
            prop_assert!(pair[0].0 < pair[1].0, "{:?}", entries);
        }
        if let Some(last) = run.steps.iter().rev().find(|s| s.out.verdict.is_admitted()) {
            for &(at, units) in &entries {
                prop_assert!(units > 0 && at + period > last.at, "{:?} at {}", entries, last.at);
            }
        }
    }

    #[test]
    fn refunds_never_exceed_capacity(log in log(), start in start(), events in events()) {
        check_refunds(&log, start, 0, &events, true)?;
    }

    #[test]
    fn an_expired_state_is_a_fresh_key(
        log in log(),
        start in start(),
        history in events(),
        later in any::<u64>(),
        follow_up in events(),
    ) {
        check_expiry(&log, start, 0, &history, later, &follow_up)?;
    }
}

#[test]
fn a_period_beyond_the_clock_saturates() {
    // Found by the `config` fuzz target: `period = "500000000y"` overflowed the moment an entry
    // leaves the window.
    let log = SlidingLog::new(1, Duration::MAX);
    let never = us(u64::MAX - T0);
    let mut run = Run::new(&log, SlidingLogState::default());
    assert_eq!(run.charge(T0, 1), allowed(1, 0, never));
    assert_eq!(
        run.charge(T0 + 1, 1),
        denied(1, 0, us(u64::MAX - T0 - 1), us(u64::MAX - T0 - 1))
    );
    assert_eq!(log.expires_at(&run.state), u64::MAX);
}

#[test]
fn a_limit_of_u64_max_still_counts() {
    // Found by the `config` fuzz target: the fit check saturated, so with a limit of `u64::MAX`
    // every charge fit and the log's entry overflowed.
    let log = SlidingLog::new(u64::MAX, secs(1));
    let mut run = Run::new(&log, SlidingLogState::default());
    assert_eq!(run.charge(T0, u64::MAX), allowed(u64::MAX, 0, secs(1)));
    assert_eq!(run.charge(T0, 1), denied(u64::MAX, 0, secs(1), secs(1)));
    assert_eq!(
        run.charge(T0, u64::MAX),
        denied(u64::MAX, 0, secs(1), secs(1))
    );
    assert_eq!(run.state.entries().collect::<Vec<_>>(), [(T0, u64::MAX)]);
}
