//! DESIGN §2's fixed-window reservation example, with its exact waits, for any store: the same
//! scenario runs on the memory store (tests/queue.rs) and on Redis (tests/redis.rs).

#![allow(dead_code)]

use std::time::Duration;

use tollgate::{Limit, LimitError, Limiter, ManualClock, Queue, Rule};

/// A whole minute: aligned one-minute windows start here.
pub(crate) const W: Duration = Duration::from_secs(1_750_000_020);

const MINUTE: Duration = Duration::from_secs(60);

/// The rules the scenario needs: 10 per minute, queued (at most 11 units owed) and plain, and a
/// sliding window, which cannot reserve.
pub(crate) fn rules() -> Vec<Rule> {
    vec![
        Rule::new("queued", Limit::fixed_window(10, MINUTE).aligned()).queue(Queue::burst(11)),
        Rule::new("plain", Limit::fixed_window(10, MINUTE).aligned()),
        Rule::new("sliding", Limit::sliding_window(10, MINUTE)),
    ]
}

/// Runs the example on `limiter` (built with [`rules`], its store on `clock`, which reads `W`).
pub(crate) async fn example(limiter: &Limiter, clock: &ManualClock) {
    // 10 per minute, full at window start W: reserve 16 → v' = −6, wait until W + 60 s.
    let first = limiter.reserve("queued", "k", 16).await.unwrap();
    assert!(first.is_granted());
    assert_eq!(first.wait(), Duration::from_secs(60));
    // At W + 30 s reserve 5 → v' = −11: wait until W + 120 s, 90 s from now.
    clock.advance(Duration::from_secs(30));
    let second = limiter.reserve("queued", "k", 5).await.unwrap();
    assert_eq!(second.wait(), Duration::from_secs(90));
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
    assert_eq!((now.remaining, now.reset), (9, MINUTE));

    // The unbounded reservation: no queue needed, no bound applies.
    let big = limiter.reserve_unbounded("plain", "k", 45).await.unwrap();
    assert!(big.is_granted());
    // v' = 10 − 45 = −35: four more windows pay it back.
    assert_eq!(big.wait(), Duration::from_secs(4 * 60));
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
}
