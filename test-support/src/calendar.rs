//! Calendar windows with exact numbers across month lengths, leap years and UTC offsets, for any
//! store: the same scenario runs on the memory store (tests/it/queue.rs) and on Redis
//! (tests/redis_store/single.rs).

use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::{Limit, Limiter, Rule};

const DAY: u64 = 86_400;

/// 2024-02-10T00:00:00Z, a Saturday in a leap year's February.
pub const START: Duration = Duration::from_secs(1_707_523_200);

fn days(n: u64) -> Duration {
    Duration::from_secs(n * DAY)
}

/// The rules the scenario needs.
pub fn rules() -> Vec<Rule> {
    vec![
        Rule::new("monthly", Limit::calendar_month(3, 0)),
        Rule::new("monthly-utc+2", Limit::calendar_month(3, 2 * 3600)),
        Rule::new("weekly", Limit::calendar_week(2, 0)),
    ]
}

/// Runs the scenario on `limiter` (built with [`rules`], its store on `clock`, which reads
/// [`START`]).
pub async fn scenario(limiter: &Limiter, clock: &ManualClock) {
    // February 2024 has 29 days: from the 10th, the quota comes back on 1 March, 20 days on.
    assert!(limiter
        .charge("monthly", "k", 3)
        .await
        .unwrap()
        .is_allowed());
    let denied = limiter.charge("monthly", "k", 1).await.unwrap();
    assert_eq!(denied.retry_after(), Some(days(20)));
    assert_eq!(denied.next_unit_in, days(20));
    // Reserving 4 owes 4: March's 3 units leave 1 owed, April's pay it (20 + 31 days); the
    // quota is full again on 1 May (20 + 31 + 30 days).
    let reserved = limiter.reserve_unbounded("monthly", "k", 4).await.unwrap();
    assert_eq!(reserved.wait(), days(51));
    assert_eq!(reserved.outcome().balance, -4);
    assert_eq!(reserved.outcome().full_in, days(81));

    // Weeks start on Monday: the 10th is a Saturday, the next window two days on.
    assert!(limiter.charge("weekly", "k", 2).await.unwrap().is_allowed());
    let weekly = limiter.charge("weekly", "k", 1).await.unwrap();
    assert_eq!(weekly.retry_after(), Some(days(2)));

    // 2024-02-29T21:59:59Z is 23:59:59 in UTC+2: one second before March there.
    clock.set(Duration::from_secs(1_709_243_999));
    assert!(limiter
        .charge("monthly-utc+2", "k", 3)
        .await
        .unwrap()
        .is_allowed());
    let plus_two = limiter.charge("monthly-utc+2", "k", 1).await.unwrap();
    assert_eq!(plus_two.retry_after(), Some(Duration::from_secs(1)));
    clock.advance(Duration::from_secs(1));
    let march = limiter.charge("monthly-utc+2", "k", 1).await.unwrap();
    assert!(march.is_allowed());
    assert_eq!(march.remaining, 2);
    // In UTC, March (and the quota) is two hours away.
    let utc = limiter.check("monthly", "other", 3).await.unwrap();
    assert_eq!(utc.remaining, 0);
    assert_eq!(utc.next_unit_in, Duration::from_secs(7200));

    // February 2025 has 28 days: from the 10th, 19 days (one fewer than in 2024). (Forward in
    // time: a store never lets its clock go back.)
    clock.set(Duration::from_secs(1_739_145_600));
    assert!(limiter
        .charge("monthly", "2025", 3)
        .await
        .unwrap()
        .is_allowed());
    let denied = limiter.charge("monthly", "2025", 1).await.unwrap();
    assert_eq!(denied.retry_after(), Some(days(19)));
}
