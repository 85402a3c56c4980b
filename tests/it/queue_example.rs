//! The `queue` example under paused time: clients wait instead of failing, and the upstream never
//! sees more than its cap — even when calls reach it late, as they do on a busy machine.

#[allow(dead_code)]
#[path = "../../examples/queue.rs"]
mod queue;

use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use tower::ServiceExt;

/// `n` clients at once; their statuses, in order.
async fn burst(app: &axum::Router, n: usize) -> Vec<StatusCode> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                app.oneshot(Request::get("/").body(Body::empty()).unwrap())
                    .await
                    .unwrap()
                    .status()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    statuses
}

/// The most calls the upstream accepted within any one second.
fn busiest_second(log: &[tokio::time::Instant]) -> usize {
    (0..log.len())
        .map(|i| {
            log[i..]
                .iter()
                .take_while(|&&later| later - log[i] < Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// The worst lateness for a one-second window: one call 240 ms late and the five after it on
/// time, so the late call and the fifth after it are as close as lateness can bring them.
fn one_in_six_late(n: usize) -> Duration {
    if n % 6 == 0 {
        Duration::from_millis(240)
    } else {
        Duration::ZERO
    }
}

#[tokio::test(start_paused = true)]
async fn clients_wait_and_the_upstream_never_sees_more_than_its_cap() {
    let upstream = queue::Upstream::default();
    let app = queue::app(upstream.clone());
    // 60 clients at once: the first 41 fit in the 10 s queue bound (one now, then one per 250 ms).
    let statuses = burst(&app, 60).await;
    let served = statuses.iter().filter(|&&s| s == StatusCode::OK).count();
    assert_eq!(served, 41);
    assert!(statuses
        .iter()
        .all(|&s| s == StatusCode::OK || s == StatusCode::TOO_MANY_REQUESTS));
    let log = upstream.log.lock().unwrap().clone();
    assert_eq!(
        log.len(),
        41,
        "every admitted client reached the upstream, none was refused by it"
    );
    assert!(busiest_second(&log) <= queue::CAP);
    assert_eq!(*log.last().unwrap() - log[0], Duration::from_secs(10));
}

/// The example's promise — 20 requests at once, all 200 — with calls reaching the upstream up to
/// 240 ms late. Paced exactly at the cap (one per 200 ms), this pattern got 429s from the upstream.
#[tokio::test(start_paused = true)]
async fn twenty_at_once_all_succeed_even_when_calls_arrive_late() {
    let upstream = queue::Upstream::with_lateness(one_in_six_late);
    let app = queue::app(upstream.clone());
    let statuses = burst(&app, 20).await;
    assert_eq!(statuses, vec![StatusCode::OK; 20]);
    let log = upstream.log.lock().unwrap().clone();
    assert_eq!(log.len(), 20);
    assert!(busiest_second(&log) <= queue::CAP);
}
