use super::*;

/// 10/s always, plus a pool of 100 refilling at 1/s.
fn ten_plus_pool() -> BurstPool {
    BurstPool::new(
        TokenBucket::new(10, secs(1)),
        TokenBucket::new(1, secs(1)).with_capacity(100),
    )
}

#[test]
fn the_steady_bucket_pays_first_then_the_pool() {
    let bp = ten_plus_pool();
    assert_eq!(bp.capacity(), 110);
    assert_eq!(Algorithm::BurstPool(bp.clone()).window(), secs(1));
    let mut run = Run::fresh(&bp, T0);
    assert_eq!(run.peek(T0), allowed(110, 110, Duration::ZERO));
    assert_eq!(run.charge(T0, 10), allowed(110, 100, ms(100)));
    // Each bucket's state is the moment it was empty: the steady one now, the full pool (100 s
    // of refill) 100 s ago.
    assert_eq!(
        run.state,
        BurstPoolState {
            steady: T0 as i64,
            pool: (T0 - 100 * SEC) as i64
        }
    );
    assert_eq!(run.charge(T0, 1), allowed(110, 99, ms(100)));
    assert_eq!(run.state.pool, (T0 - 99 * SEC) as i64);
    assert_eq!(run.charge(T0, 99), allowed(110, 0, ms(100)));
    // The steady bucket comes back first.
    assert_eq!(run.charge(T0, 1), denied(110, 0, ms(100), ms(100)));
    // Twelve units: ten from a full steady bucket (1 s) and two from the pool (2 s).
    assert_eq!(run.charge(T0, 12), denied(110, 0, ms(100), secs(2)));
    assert_eq!(run.peek(T0 + SEC), allowed(110, 11, secs(1)));
    assert_eq!(run.peek(T0 + 100 * SEC), allowed(110, 110, Duration::ZERO));
}

#[test]
fn one_charge_may_take_from_both() {
    let bp = ten_plus_pool();
    let mut run = Run::fresh(&bp, T0);
    assert_eq!(run.charge(T0, 15), allowed(110, 95, ms(100)));
    assert_eq!(
        run.state,
        BurstPoolState {
            steady: T0 as i64,
            pool: (T0 - 95 * SEC) as i64
        }
    );
    // Both refill: after 2 s the steady bucket is full and the pool has 97.
    assert_eq!(run.peek(T0 + 2 * SEC), allowed(110, 107, secs(1)));
}

#[test]
fn retry_after_is_exact_when_only_the_pool_refills() {
    // The steady bucket (3/s) was drained by three single charges: its next unit is 333 334 µs
    // away. The pool gets its one unit back 1 µs from now. Nothing is needed from the steady
    // bucket, so the wait is the pool's: 1 µs.
    let steady = TokenBucket::new(3, secs(1));
    let pool = TokenBucket::new(1, secs(1));
    let bp = BurstPool::new(steady.clone(), pool.clone());
    let mut steady_state = steady.fresh(T0);
    for _ in 0..3 {
        steady_state = steady.commit(steady_state, T0, 1);
    }
    let earlier = T0 - SEC + 1;
    let state = BurstPoolState {
        steady: steady_state,
        pool: pool.commit(pool.fresh(earlier), earlier, 1),
    };
    assert_eq!(bp.evaluate(state, T0, 1), denied(4, 0, us(1), us(1)));
    assert!(bp.evaluate(state, T0 + 1, 1).verdict.is_admitted());
}

#[test]
fn refunds_go_to_the_pool_first_and_are_capped() {
    let bp = ten_plus_pool();
    let mut run = Run::fresh(&bp, T0);
    run.charge(T0, 30); // 10 steady + 20 pool
    run.state = bp.refund(run.state, T0, 5);
    assert_eq!(
        run.state,
        BurstPoolState {
            steady: T0 as i64,
            pool: (T0 - 85 * SEC) as i64
        }
    );
    run.state = bp.refund(run.state, T0, 1_000);
    assert_eq!(run.peek(T0), allowed(110, 110, Duration::ZERO));
}

#[test]
fn a_refund_is_not_lost_to_the_pool_cap() {
    // The pool (1/s, 2) holds half a unit, the steady bucket (10/s) is empty. Of a refund of 2, the
    // pool can take one whole unit (to 1.5); the other goes to the steady bucket.
    let bp = BurstPool::new(
        TokenBucket::new(10, secs(1)),
        TokenBucket::new(1, secs(1)).with_capacity(2),
    );
    let state = BurstPoolState {
        steady: T0 as i64,
        pool: (T0 - 500 * MS) as i64,
    };
    let refunded = bp.refund(state, T0, 2);
    assert_eq!(
        refunded,
        BurstPoolState {
            steady: (T0 - 100 * MS) as i64,
            pool: (T0 - 1500 * MS) as i64
        }
    );
    // Half a second later: 1 + 5 steady, 2 in the pool.
    assert_eq!(bp.evaluate(refunded, T0 + 500 * MS, 0).remaining, 8);
}

#[test]
fn expires_when_both_buckets_are_full() {
    let bp = ten_plus_pool();
    let mut run = Run::fresh(&bp, T0);
    run.charge(T0, 15);
    assert_eq!(bp.expires_at(run.state), T0 + 5 * SEC);
    assert_eq!(run.peek(T0 + 5 * SEC - 1).remaining, 109);
    assert_eq!(run.peek(T0 + 5 * SEC), allowed(110, 110, Duration::ZERO));
}

#[test]
fn a_smaller_pool_keeps_what_fits() {
    // 70 left in the pool of 100; then a pool of 20 (a smaller capacity): 20 at once, not 0 for 50 s.
    let bp = ten_plus_pool();
    let mut run = Run::fresh(&bp, T0);
    assert_eq!(run.charge(T0, 40), allowed(110, 70, ms(100)));
    let smaller = BurstPool::new(
        TokenBucket::new(10, secs(1)),
        TokenBucket::new(1, secs(1)).with_capacity(20),
    );
    assert_eq!(smaller.evaluate(run.state, T0, 0), allowed(30, 20, ms(100)));
    assert_eq!(
        smaller.evaluate(run.state, T0, 20).verdict,
        Verdict::Allowed
    );
}

#[test]
fn clock_skew_admits_nothing_more() {
    check_clock_skew(&ten_plus_pool(), T0 + MS, 5 * MS);
}

fn burst_pool() -> impl Strategy<Value = BurstPool> {
    let bucket = |rates: std::ops::Range<u64>, capacities: std::ops::Range<u64>| {
        (rates, period(), capacities, any::<u64>()).prop_map(|(rate, period, capacity, initial)| {
            TokenBucket::new(rate, us(period))
                .with_capacity(capacity)
                .with_initial(initial % (capacity + 1))
        })
    };
    (bucket(1..50, 1..50), bucket(1..20, 1..100))
        .prop_map(|(steady, pool)| BurstPool::new(steady, pool))
}

/// Both buckets refilled to their capacity.
fn starting_full(bp: &BurstPool) -> BurstPool {
    let full = |b: &TokenBucket| b.clone().with_initial(b.capacity());
    BurstPool::new(full(bp.steady()), full(bp.pool()))
}

proptest! {
    #[test]
    fn never_over_admits(bp in burst_pool(), start in start(), events in events()) {
        let run = drive(&bp, start, 0, &events, |_| Mode::Charge)?;
        let refill = |b: &TokenBucket, a: Micros, z: Micros| {
            u128::from(z - a) * u128::from(b.rate()) / u128::from(micros(b.period()))
        };
        let capacity = u128::from(bp.capacity());
        assert_bounded(&run.charges(), |a, b| {
            capacity + refill(bp.steady(), a, b) + refill(bp.pool(), a, b)
        })?;
    }

    #[test]
    fn refunds_never_exceed_capacity(bp in burst_pool(), start in start(), events in events()) {
        // Not undone exactly: refunds go to the pool first, whichever bucket paid, so the split
        // (and with it `reset`) may change; the units available right after are the same.
        check_refunds(&bp, start, 0, &events, false)?;
    }

    #[test]
    fn an_expired_state_is_a_fresh_key(
        bp in burst_pool(),
        start in start(),
        history in events(),
        later in any::<u64>(),
        follow_up in events(),
    ) {
        check_expiry(&starting_full(&bp), start, 0, &history, later, &follow_up)?;
    }
}
