//! The `queue` example under paused time: clients wait instead of failing, and the upstream never
//! sees more than its cap.

#[allow(dead_code)]
#[path = "../examples/queue.rs"]
mod queue;

use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use tower::ServiceExt;

#[tokio::test(start_paused = true)]
async fn clients_wait_and_the_upstream_never_sees_more_than_its_cap() {
    let upstream = queue::Upstream::default();
    let app = queue::app(upstream.clone());
    // 60 clients at once: the first 51 fit in the 10 s queue bound (one now, then one per 200 ms).
    let tasks: Vec<_> = (0..60)
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
    let served = statuses.iter().filter(|&&s| s == StatusCode::OK).count();
    assert_eq!(served, 51);
    assert!(statuses
        .iter()
        .all(|&s| s == StatusCode::OK || s == StatusCode::TOO_MANY_REQUESTS));
    let log = upstream.log.lock().unwrap().clone();
    assert_eq!(
        log.len(),
        51,
        "every admitted client reached the upstream, none was refused by it"
    );
    for (i, &at) in log.iter().enumerate() {
        let in_window = log[i..]
            .iter()
            .take_while(|&&later| later - at < Duration::from_secs(1))
            .count();
        assert!(
            in_window <= queue::CAP,
            "{in_window} calls within one second"
        );
    }
    assert_eq!(*log.last().unwrap() - log[0], Duration::from_secs(10));
}
