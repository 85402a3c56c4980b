//! The fixed-window reservation example (10 a minute, reservations queued across windows), with
//! its exact waits, for any store: the same scenario runs on the memory store and on Redis.

use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::{Limit, LimitError, Limiter, Queue, Rule};

/// A whole minute: aligned one-minute windows start here.
pub const W: Duration = Duration::from_secs(1_750_000_020);

const MINUTE: Duration = Duration::from_secs(60);

/// The rules the scenario needs: 10 per minute, queued (at most 11 units owed) and plain, and a
/// sliding window, which cannot reserve.
pub fn rules() -> Vec<Rule> {
    vec![
        Rule::new("queued", Limit::fixed_window(10, MINUTE).aligned()).queue(Queue::burst(11)),
        Rule::new("plain", Limit::fixed_window(10, MINUTE).aligned()),
        Rule::new("sliding", Limit::sliding_window(10, MINUTE)),
        Rule::new("bucket", Limit::per_minute(60)),
    ]
}

/// Runs the example on `limiter` (built with [`rules`], its store on `clock`, which reads `W`).
pub async fn example(limiter: &Limiter, clock: &ManualClock) {
    // 10 per minute, full at window start W: reserve 16 → v' = −6, wait until W + 60 s.
    let first = limiter.reserve("queued", "k", 16).await.unwrap();
    assert!(first.is_granted());
    assert_eq!(first.wait(), Duration::from_secs(60));
    // The outcome shows the debt, the next unit (at W + 60 s the balance is 4) and when the
    // window is full again (W + 120 s).
    let owed = first.outcome();
    assert_eq!((owed.remaining, owed.balance), (0, -6));
    assert_eq!(owed.next_unit_in, Duration::from_secs(60));
    assert_eq!(owed.full_in, Duration::from_secs(120));
    // At W + 30 s reserve 5 → v' = −11: wait until W + 120 s, 90 s from now.
    clock.advance(Duration::from_secs(30));
    let second = limiter.reserve("queued", "k", 5).await.unwrap();
    assert_eq!(second.wait(), Duration::from_secs(90));
    assert_eq!(second.outcome().balance, -11);
    assert_eq!(second.outcome().full_in, Duration::from_secs(150));
    // The queue's bound (11 owed) is reached: one more could queue once W + 60 s pays 10 back.
    let third = limiter.reserve("queued", "k", 1).await.unwrap();
    assert!(!third.is_granted());
    assert_eq!(third.retry_after(), Some(Duration::from_secs(30)));
    // A plain charge is denied until the debt is paid and a unit is left: W + 120 s.
    let charge = limiter.charge("queued", "k", 1).await.unwrap();
    assert_eq!(charge.retry_after(), Some(Duration::from_secs(90)));
    assert_eq!(charge.remaining, 0);
    // Cancelling the second reservation gives its 5 units back: the debt is 6 again.
    second.cancel().await.unwrap();
    let again = limiter.reserve("queued", "k", 5).await.unwrap();
    assert_eq!(again.wait(), Duration::from_secs(90));
    clock.advance(Duration::from_secs(90)); // W + 120 s: 20 units paid back, 9 left
    let now = limiter.check("queued", "k", 0).await.unwrap();
    assert_eq!((now.remaining, now.next_unit_in), (9, MINUTE));

    // The unbounded reservation: no queue needed, no bound applies.
    let big = limiter.reserve_unbounded("plain", "k", 45).await.unwrap();
    assert!(big.is_granted());
    // v' = 10 − 45 = −35: four more windows pay it back.
    assert_eq!(big.wait(), Duration::from_secs(4 * 60));
    assert_eq!(big.outcome().balance, -35);
    assert_eq!(big.outcome().full_in, Duration::from_secs(5 * 60));
    let more = limiter.reserve_unbounded("plain", "k", 1).await.unwrap();
    assert_eq!(more.wait(), Duration::from_secs(4 * 60));
    assert!(matches!(
        limiter.reserve("plain", "k", 1).await,
        Err(LimitError::NotQueued(_))
    ));
    assert!(matches!(
        limiter.reserve_unbounded("sliding", "k", 1).await,
        Err(LimitError::CannotReserve(_))
    ));
    // A token bucket of 60 a minute (one unit a second), full: 90 units owe 30, wait 30 s, the
    // next unit comes 1 s later, and the bucket is full after 90 s.
    let bucket = limiter.reserve_unbounded("bucket", "k", 90).await.unwrap();
    assert_eq!(bucket.wait(), Duration::from_secs(30));
    let owed = bucket.outcome();
    assert_eq!((owed.remaining, owed.balance), (0, -30));
    assert_eq!(owed.next_unit_in, Duration::from_secs(31));
    assert_eq!(owed.full_in, Duration::from_secs(90));
}

/// Several rules at once, all or nothing, through the limiter handle (at W + 120 s, after
/// [`example`]).
pub async fn several_rules(limiter: &Limiter) {
    let both = limiter
        .charge_all([("plain", "x", 8), ("bucket", "x", 8)])
        .await
        .unwrap();
    assert!(both.is_allowed());
    let left: Vec<_> = both.rules().iter().map(|r| r.outcome.remaining).collect();
    assert_eq!(left, [2, 52]);
    // 3 more do not fit the window (2 left, the next window in 60 s): neither rule is charged.
    let denied = limiter
        .charge_all([("plain", "x", 3), ("bucket", "x", 3)])
        .await
        .unwrap();
    assert!(!denied.is_allowed());
    assert_eq!(denied.retry_after(), Some(MINUTE));
    assert_eq!(limiter.check("bucket", "x", 0).await.unwrap().remaining, 52);
    let checked = limiter
        .check_all([("plain", "x", 2), ("bucket", "x", 2)])
        .await
        .unwrap();
    assert!(checked.is_allowed());
    assert_eq!(limiter.check("plain", "x", 0).await.unwrap().remaining, 2);
    // Each rule in its own mode: the queued window reserves (owing 2, it waits for the next
    // window), the bucket charges.
    let reserved = limiter
        .reserve_all([("queued", "y", 12), ("bucket", "y", 1)])
        .await
        .unwrap();
    assert!(reserved.is_granted());
    assert_eq!(reserved.wait(), MINUTE);
    assert_eq!(reserved.decision().rules()[0].outcome.balance, -2);
    assert_eq!(reserved.decision().rules()[1].outcome.remaining, 59);
    reserved.cancel().await.unwrap();
    assert_eq!(limiter.check("queued", "y", 0).await.unwrap().remaining, 10);
    assert_eq!(limiter.check("bucket", "y", 0).await.unwrap().remaining, 60);
    assert!(matches!(
        limiter
            .charge_all([("plain", "x", 1), ("plain", "x", 1)])
            .await,
        Err(LimitError::Repeated(_))
    ));
    assert!(matches!(
        limiter
            .charge_all([("plain", "x", 1), ("nope", "x", 1)])
            .await,
        Err(LimitError::UnknownRule(_))
    ));
    // A batch of no rule decides nothing: an error at the call, never a "granted" reservation
    // whose outcome does not exist.
    let nothing = || Vec::<(&str, &str, u64)>::new();
    assert!(matches!(
        limiter.reserve_all(nothing()).await,
        Err(LimitError::EmptyBatch)
    ));
    assert!(matches!(
        limiter.charge_all(nothing()).await,
        Err(LimitError::EmptyBatch)
    ));
    assert!(matches!(
        limiter.check_all(nothing()).await,
        Err(LimitError::EmptyBatch)
    ));
}
