//! The running service: gRPC (`RateLimitService`, `grpc.health.v1.Health`) on one port, HTTP
//! (`/healthcheck`, `/metrics`) on another, the configuration reloaded when its files change, and
//! a drain on `SIGTERM`.

mod connections;
pub(crate) mod decide;
mod grpc;
mod headers;
mod http_api;
pub mod protocol;
mod reload;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tollgate::RateLimitLayer;

pub use crate::stats::{Stats, MAX_SERIES};
pub use connections::Limits;
pub use decide::{MAX_DESCRIPTORS, MAX_ENTRIES};

use crate::load::{self, StoreFailure};
use crate::stats::statsd::{self, StatsdSettings};
use crate::tree::Domains;

/// What the server was started with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The configuration: a file, or a directory of reference files.
    pub config: PathBuf,
    /// Where gRPC is served.
    pub grpc_addr: SocketAddr,
    /// Where `/healthcheck` and `/metrics` are served.
    pub http_addr: SocketAddr,
    /// How often the configuration's files are compared with the ones in force.
    pub reload_interval: Duration,
    /// The bounds on each port's connections.
    pub connections: Limits,
    /// Where statistics are also pushed, under the reference service's statsd names (none:
    /// only `/metrics`).
    pub statsd: Option<StatsdSettings>,
}

/// The descriptor trees in force, with the store failure policy they were read with.
#[derive(Debug)]
pub(crate) struct Current {
    pub(crate) domains: Domains,
    pub(crate) on_store_failure: StoreFailure,
}

/// What every call shares.
pub(crate) struct State {
    pub(crate) current: ArcSwap<Current>,
    /// The library's layer, kept for its limiter and for reloads.
    pub(crate) layer: RateLimitLayer,
    pub(crate) stats: Arc<Stats>,
    /// Set once a drain starts: `/healthcheck` answers 503 from then on.
    pub(crate) draining: AtomicBool,
}

/// Why the server could not start.
#[derive(Debug)]
pub struct StartError(pub String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

/// Runs the server until `SIGTERM` or `SIGINT`, then drains the calls in flight and returns.
pub async fn run(settings: Settings) -> Result<(), StartError> {
    // The files' content is taken before they are read: a change in between is then seen by
    // the first comparison, never mistaken for the content in force.
    let in_force = load::fingerprint(&settings.config);
    let loaded = load::load(&settings.config).map_err(|e| StartError(e.to_string()))?;
    if loaded.is_empty() {
        // It serves (a ConfigMap may be filled later; a reload then takes it), but says so.
        tracing::warn!(
            "{}: every call is answered OK until one is added",
            load::nothing_configured(&settings.config)
        );
    }
    let layer = loaded
        .config
        .connect()
        .await
        .map_err(|e| StartError(load::library_error(&settings.config, &e).to_string()))?;
    let grpc_listener = bind(settings.grpc_addr, "gRPC").await?;
    let http_listener = bind(settings.http_addr, "HTTP").await?;
    let state = Arc::new(State {
        current: ArcSwap::from_pointee(Current {
            domains: loaded.domains,
            on_store_failure: loaded.on_store_failure,
        }),
        layer,
        stats: Arc::new(if settings.statsd.is_some() {
            Stats::with_response_times()
        } else {
            Stats::default()
        }),
        draining: AtomicBool::new(false),
    });
    state.stats.loaded();
    // Watched before the server says it serves: a SIGTERM from then on is a drain, never the
    // default action that kills the process.
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| StartError(format!("cannot watch SIGTERM: {e}")))?;
    let grpc_addr = grpc_listener.local_addr().unwrap_or(settings.grpc_addr);
    let http_addr = http_listener.local_addr().unwrap_or(settings.http_addr);
    tracing::info!(
        grpc = %grpc_addr,
        http = %http_addr,
        config = %settings.config.display(),
        domains = ?domain_names(&state),
        "tollgate-server: serving"
    );

    // gRPC stops first and drains; HTTP answers until then, so `/healthcheck` says 503 while
    // the calls in flight finish (a load balancer stops sending meanwhile).
    let (stop_grpc, grpc_stopping) = tokio::sync::watch::channel(false);
    let (stop_http, http_stopping) = tokio::sync::watch::channel(false);
    let reload = tokio::spawn(reload::watch(
        state.clone(),
        settings.config.clone(),
        in_force,
        settings.reload_interval,
        grpc_stopping.clone(),
    ));
    let (stop_statsd, statsd_stopping) = tokio::sync::watch::channel(false);
    let statsd_sink = settings
        .statsd
        .clone()
        .map(|sink| statsd::start(state.stats.clone(), sink, statsd_stopping));
    let gate = || connections::Gate::new(settings.connections);
    let http = tokio::spawn(http_api::serve(
        http_listener,
        gate(),
        state.clone(),
        http_stopping,
    ));
    let grpc = tokio::spawn(grpc::serve(
        grpc_listener,
        gate(),
        state.clone(),
        grpc_stopping,
    ));

    shutdown_signal(term).await;
    state.draining.store(true, Ordering::SeqCst);
    tracing::info!("tollgate-server: draining the calls in flight");
    let _ = stop_grpc.send(true);
    let _ = grpc.await;
    let _ = stop_http.send(true);
    let _ = http.await;
    reload.abort();
    // The last counts leave before the process ends (bounded by the sink).
    let _ = stop_statsd.send(true);
    if let Some(sink) = statsd_sink {
        let _ = sink.await;
    }
    tracing::info!("tollgate-server: stopped");
    Ok(())
}

fn domain_names(state: &State) -> Vec<String> {
    let current = state.current.load();
    let mut names: Vec<String> = current.domains.names().map(str::to_owned).collect();
    names.sort();
    names
}

async fn bind(addr: SocketAddr, what: &str) -> Result<tokio::net::TcpListener, StartError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| StartError(format!("cannot listen for {what} on {addr}: {e}")))
}

/// Returns on SIGTERM or SIGINT.
async fn shutdown_signal(mut term: tokio::signal::unix::Signal) {
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
