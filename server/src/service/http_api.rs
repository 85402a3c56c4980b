//! The HTTP side: `/healthcheck` (as the reference service answers it: `OK`, or 503 once a drain
//! has started) and `/metrics` (Prometheus text); and, with `USE_PROMETHEUS`, the reference's
//! Prometheus listener (its statsd names through a statsd-exporter mapping, on its own port).
//!
//! Both served over HTTP/1 by hyper with a bound on every request head's arrival (the first on a
//! connection and each kept-alive one's), under the port's connection limit.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State as Shared;
use axum::http::{StatusCode, Uri};
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;

use super::connections::Gate;
use super::State;
use crate::stats::exporter::Exporter;

/// Serves HTTP on `listener` until `stop` turns true, then lets the requests in flight finish.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    gate: Gate,
    state: Arc<State>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let app = Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/metrics", get(metrics))
        .with_state(state.clone());
    serve_app(listener, gate, app, state, stop).await;
}

/// Serves the reference's series on `path` (every path under it when it ends with `/`, as Go's
/// server matches a pattern) until `stop` turns true; any other path is 404.
pub(crate) async fn serve_prometheus(
    listener: tokio::net::TcpListener,
    gate: Gate,
    state: Arc<State>,
    exporter: Arc<Exporter>,
    path: String,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let shared = state.clone();
    let app = Router::new().fallback(move |uri: Uri| {
        let state = shared.clone();
        let exporter = exporter.clone();
        let served = uri.path() == path || (path.ends_with('/') && uri.path().starts_with(&*path));
        async move {
            if !served {
                return (
                    StatusCode::NOT_FOUND,
                    [(CONTENT_TYPE, "text/plain")],
                    "404 page not found\n".to_owned(),
                );
            }
            (
                StatusCode::OK,
                [(CONTENT_TYPE, TEXT_FORMAT)],
                exporter.render(&state.stats),
            )
        }
    });
    serve_app(listener, gate, app, state, stop).await;
}

const CONTENT_TYPE: axum::http::HeaderName = axum::http::header::CONTENT_TYPE;
/// Prometheus' text format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves `app` on `listener`'s admitted connections until `stop` turns true, then lets the
/// requests in flight finish.
pub(super) async fn serve_app(
    listener: tokio::net::TcpListener,
    gate: Gate,
    app: Router,
    state: Arc<State>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(gate.limits().header_read_timeout);
    let open = GracefulShutdown::new();
    loop {
        let refused = || state.stats.connection_refused();
        let accepted = tokio::select! {
            accepted = gate.accept(&listener, refused) => accepted,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let Some((stream, permit)) = accepted else {
            break;
        };
        let connection =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = open.watch(connection);
        let state = state.clone();
        tokio::spawn(async move {
            let _open = permit;
            if let Err(error) = connection.await {
                if error.is_timeout() {
                    state.stats.connection_timed_out();
                }
                tracing::debug!(%error, "HTTP connection ended");
            }
        });
    }
    drop(listener);
    open.shutdown().await;
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
        crate::stats::prometheus::render(&state.stats),
    )
}
