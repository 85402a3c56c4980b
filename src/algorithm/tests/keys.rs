//! `stable_key_hash`, window offsets and the [`Algorithm`] facade.

use super::*;

/// FNV-1a, 64 bits, written out from the spec: offset basis 14695981039346656037,
/// prime 1099511628211.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(14_695_981_039_346_656_037, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(1_099_511_628_211)
    })
}

/// What `stable_key_hash` hashes: the rule, a 0xff separator (never in UTF-8), the key.
fn fnv1a_of(rule: &str, key: &[u8]) -> u64 {
    fnv1a(&[rule.as_bytes(), &[0xff], key].concat())
}

#[test]
fn stable_key_hash_is_fnv1a_of_rule_separator_key() {
    // Computed once, independently; must never change (fleets share window offsets).
    assert_eq!(stable_key_hash("api", b"alice"), 0x844f_d5ab_ec89_ece0);
    assert_eq!(stable_key_hash("", b""), 0xaf64_724c_8602_eb6e);
    // FNV-1a test vectors, through the helper.
    assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    // The separator keeps the rule and the key apart.
    assert_ne!(stable_key_hash("ab", b"c"), stable_key_hash("a", b"bc"));
}

#[test]
fn algorithm_facade() {
    let tb = TokenBucket::new(10, secs(1)).with_capacity(30);
    let algorithms = [
        (Algorithm::TokenBucket(tb), 30, secs(3)),
        (
            Algorithm::FixedWindow(FixedWindow::new(5, secs(60)).with_capacity(8)),
            8,
            secs(60),
        ),
        (
            Algorithm::SlidingWindow(SlidingWindow::new(7, secs(10))),
            7,
            secs(10),
        ),
        (
            Algorithm::SlidingLog(SlidingLog::new(4, secs(2))),
            4,
            secs(2),
        ),
        (
            Algorithm::BurstPool(BurstPool::new(
                TokenBucket::new(10, secs(1)),
                TokenBucket::new(1, secs(1)).with_capacity(100),
            )),
            110,
            secs(1),
        ),
    ];
    let reserve = Mode::Reserve(ReserveBound {
        max_units: Some(5),
        max_wait: None,
    });
    for (algorithm, capacity, window) in algorithms {
        assert_eq!(algorithm.capacity(), capacity);
        assert_eq!(algorithm.window(), window);
        let reserves = algorithm.reserves();
        assert_eq!(
            reserves,
            matches!(
                algorithm,
                Algorithm::TokenBucket(_) | Algorithm::FixedWindow(_)
            )
        );
        for mode in [Mode::Charge, Mode::Check, reserve] {
            let max = if reserves && mode == reserve {
                capacity + 5
            } else {
                capacity
            };
            assert_eq!(algorithm.max_cost(mode), max);
            assert_eq!(algorithm.check_cost(max, mode), Ok(()));
            let err = CostTooLarge { cost: max + 1, max };
            assert_eq!(algorithm.check_cost(max + 1, mode), Err(err));
        }
    }
    let err = CostTooLarge { cost: 11, max: 10 };
    assert_eq!(err.to_string(), "cost 11 can never pass: at most 10 fits");
}

proptest! {
    #[test]
    fn stable_key_hash_matches_an_independent_fnv1a(rule in ".{0,12}", key in prop::collection::vec(any::<u8>(), 0..24)) {
        prop_assert_eq!(stable_key_hash(&rule, &key), fnv1a_of(&rule, &key));
    }

    #[test]
    fn offsets_are_within_the_period(
        period in 1u64..=u64::MAX / 2,
        rule in "[a-z]{0,8}",
        key in prop::collection::vec(any::<u8>(), 0..16),
        aligned in any::<u64>(),
    ) {
        let per_key = WindowStart::PerKey.offset(period, &rule, &key);
        prop_assert!(per_key < period);
        prop_assert_eq!(per_key, stable_key_hash(&rule, &key) % period);
        prop_assert_eq!(per_key, WindowStart::PerKey.offset(period, &rule, &key));
        let start = WindowStart::Aligned(us(aligned));
        prop_assert_eq!(start.offset(period, &rule, &key), aligned % period);
    }

    #[test]
    fn a_window_contains_now(now in T0..T0 + 1_000_000 * SEC, period in 1u64..=100 * SEC, offset in any::<u64>()) {
        let start = window_containing(now, offset, period);
        prop_assert!(start <= now && now - start < period);
        prop_assert_eq!((start % period + period - offset % period) % period, 0);
    }
}
