//! The HTTP side: `/healthcheck` (as the reference service answers it: `OK`, or 503 once a drain
//! has started) and `/metrics` (Prometheus text).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State as Shared;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use super::State;

/// Serves HTTP on `listener` until `stop` turns true.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let app = Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/metrics", get(metrics))
        .with_state(state);
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|stop| *stop).await;
        })
        .await;
    if let Err(error) = served {
        tracing::error!(%error, "HTTP server failed");
    }
}

async fn healthcheck(Shared(state): Shared<Arc<State>>) -> (StatusCode, &'static str) {
    if state.draining.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
    } else {
        (StatusCode::OK, "OK\n")
    }
}

async fn metrics(
    Shared(state): Shared<Arc<State>>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        state.stats.render(),
    )
}
