//! A failing limit resolver's warnings: at most one line per 10 seconds, counting the failures
//! since the last. Alone in this test binary, like `logging.rs`: `tracing` caches per call site
//! whether anyone listens.

use crate::support::log_lines;
use log_lines::Lines;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::rules::LimitResolver;
use tollgate::{Key, Limit, Rule};
use tower::{service_fn, Layer};

use crate::support::paused;

use crate::support::oneshot;
use oneshot::send;

type Body = Full<Bytes>;

#[tokio::test(start_paused = true)]
async fn a_failing_resolver_is_logged_once_per_interval() {
    let lines = Lines::default();
    let _guard = lines.listen(tracing::Level::INFO);

    let resolver = LimitResolver::new(|_key| async { Err::<Option<Limit>, _>("database down") });
    let rule = Rule::new("customer", Limit::per_minute(100))
        .key(Key::header(HeaderName::from_static("x-api-key")))
        .limit_from(resolver);
    let service = paused::layer(rule).layer(service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::default()))
    }));
    let send_as = |key: String| {
        let request = Request::get("/")
            .header("x-api-key", key)
            .body(Body::default())
            .unwrap();
        send(&service, request)
    };

    // Fifty keys, each its own failed lookup, within one interval: one line.
    for i in 0..50 {
        let answer = send_as(format!("k{i}")).await;
        assert_eq!(answer.status(), StatusCode::OK);
    }
    let warnings = lines.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(warnings[0].contains("rule=\"customer\""), "{}", warnings[0]);
    assert!(warnings[0].contains("database down"), "{}", warnings[0]);
    assert!(warnings[0].contains("failures=1"), "{}", warnings[0]);

    tokio::time::advance(Duration::from_secs(9)).await;
    send_as("late".to_owned()).await;
    assert_eq!(lines.warnings().len(), 1);

    // The interval has passed: the next failure is logged with the count since the last line.
    tokio::time::advance(Duration::from_secs(1)).await;
    send_as("next".to_owned()).await;
    let warnings = lines.warnings();
    assert_eq!(warnings.len(), 2, "{warnings:#?}");
    assert!(warnings[1].contains("failures=51"), "{}", warnings[1]);
}
