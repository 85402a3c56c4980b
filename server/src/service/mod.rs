//! The running service: gRPC (`RateLimitService`, `grpc.health.v1.Health`) on one port, HTTP
//! (`/healthcheck`, `/metrics`) on another, the reference's Prometheus listener on a third when
//! asked, the admin API (blocks and overrides, [`admin`]) on a fourth when asked, the
//! configuration reloaded when its files change, and a drain on `SIGTERM`.

pub mod admin;
mod connections;
pub(crate) mod decide;
mod grpc;
mod headers;
mod http_api;
mod metadata;
pub mod protocol;
mod reload;
mod tls;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tollgate::Limiter;

pub use crate::settings::{Answering, ReferenceHeaders};
pub use crate::stats::{Stats, MAX_SERIES};
pub use admin::AdminSettings;
pub use connections::Limits;
pub use decide::{MAX_DESCRIPTORS, MAX_ENTRIES};

use crate::load::{self, StoreFailure};
use crate::settings::TlsFiles;
use crate::source::xds;
use crate::source::Source;
use crate::stats::exporter::{Exporter, PrometheusSettings};
use crate::stats::statsd::{self, StatsdSettings};
use crate::tree::Domains;

/// What the server was started with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Where the configuration comes from.
    pub config: Source,
    /// Serve (healthy, with no limits) although the first configuration cannot be read; it
    /// takes over once it can (`FORCE_START_WITHOUT_INITIAL_CONFIG`).
    pub force_start: bool,
    /// TLS on the gRPC port (`GRPC_SERVER_USE_TLS`).
    pub grpc_tls: Option<TlsFiles>,
    /// Where gRPC is served.
    pub grpc_addr: SocketAddr,
    /// Where `/healthcheck` and `/metrics` are served.
    pub http_addr: SocketAddr,
    /// How often the configuration's files are compared with the ones in force.
    pub reload_interval: Duration,
    /// The bounds on each port's connections.
    pub connections: Limits,
    /// The threads that serve gRPC, each a single-threaded runtime with its share of the
    /// connections (one per core by default: [`default_grpc_workers`]).
    pub grpc_workers: usize,
    /// How answers are made: the reference's global switches.
    pub answering: Answering,
    /// Where statistics are also pushed, under the reference service's statsd names (none:
    /// only `/metrics`).
    pub statsd: Option<StatsdSettings>,
    /// Where the reference's statsd names are also served as Prometheus series, through a
    /// statsd-exporter mapping, as the reference's `USE_PROMETHEUS` serves them (none: only
    /// `/metrics` on the HTTP port).
    pub prometheus: Option<PrometheusSettings>,
    /// Where the admin API is served, and its token (none: off, the default).
    pub admin: Option<AdminSettings>,
}

/// One gRPC worker per core the process may use (one when that cannot be told).
pub fn default_grpc_workers() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// The configuration in force: the descriptor trees and the library's limiter holding the rules
/// they name, replaced as one value. A call reads both from one snapshot, so the trees never
/// name a rule of another configuration.
#[derive(Debug)]
pub(crate) struct Current {
    pub(crate) domains: Domains,
    /// The rules of this configuration, on the store the server started with (every
    /// configuration's limiter shares it, and the counts in it).
    pub(crate) limiter: Limiter,
    pub(crate) on_store_failure: StoreFailure,
}

/// What every call shares.
pub(crate) struct State {
    pub(crate) current: ArcSwap<Current>,
    pub(crate) stats: Arc<Stats>,
    /// How answers are made.
    pub(crate) answering: Answering,
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
    // The Prometheus listener's mapping is read first: the counters keep the observations its
    // histograms need.
    let exporter = settings
        .prometheus
        .as_ref()
        .map(|prometheus| Arc::new(Exporter::new(prometheus.mapper.clone())));
    let stats = Arc::new(Stats::new(
        settings.statsd.is_some(),
        exporter
            .as_ref()
            .and_then(|exporter| exporter.observations()),
    ));
    // The files' content is taken before they are read: a change in between is then seen by
    // the first comparison, never mistaken for the content in force.
    let config_path = settings.config.path().to_owned();
    let mut in_force = settings.config.fingerprint();
    let mut xds = None;
    let mut first_push = None;
    let loaded = if let Source::Xds(client) = &settings.config {
        let endpoint = xds::endpoint(client).map_err(StartError)?;
        let (offer, mut offers) = tokio::sync::mpsc::channel(1);
        let task = tokio::spawn(xds::run((**client).clone(), endpoint, offer));
        let loaded = if settings.force_start {
            tracing::warn!(
                "no configuration yet (FORCE_START_WITHOUT_INITIAL_CONFIG): every call is \
                 answered OK until the xDS management server pushes one"
            );
            load::Loaded::nothing(settings.config.store(), settings.config.path())
        } else {
            // As the reference: nothing is served before the first configuration, however
            // long the management server takes.
            tracing::info!("waiting for the first configuration from the xDS management server");
            loop {
                let Some(offer) = offers.recv().await else {
                    return Err(StartError("the xDS client stopped".into()));
                };
                match offer.loaded {
                    Ok(loaded) => {
                        first_push = Some(offer.reply);
                        break loaded;
                    }
                    Err(error) => {
                        stats.reload(false);
                        let _ = offer.reply.send(Err(error.to_string()));
                    }
                }
            }
        };
        xds = Some((task, offers));
        loaded
    } else {
        match settings.config.load() {
            Ok(loaded) => loaded,
            Err(error) if settings.force_start => {
                // Serve with nothing configured; the first readable configuration takes over.
                tracing::warn!(
                    %error,
                    "no configuration yet (FORCE_START_WITHOUT_INITIAL_CONFIG): every call is \
                     answered OK until one can be read"
                );
                in_force.clear();
                load::Loaded::nothing(settings.config.store(), settings.config.path())
            }
            Err(error) => return Err(StartError(error.to_string())),
        }
    };
    if loaded.is_empty() && !(xds.is_some() && settings.force_start) {
        // It serves (a ConfigMap may be filled later; a reload then takes it), but says so.
        tracing::warn!(
            "{}: every call is answered OK until one is added",
            load::nothing_configured(&config_path)
        );
    }
    let limiter = loaded
        .connect(&config_path)
        .await
        .map_err(|e| StartError(e.to_string()))?;
    let tls = settings
        .grpc_tls
        .as_ref()
        .map(tls::acceptor)
        .transpose()
        .map_err(StartError)?;
    let grpc_listener = bind(settings.grpc_addr, "gRPC").await?;
    let http_listener = bind(settings.http_addr, "HTTP").await?;
    let prometheus = match (&settings.prometheus, exporter) {
        (Some(prometheus), Some(exporter)) => Some((
            bind(prometheus.addr, "Prometheus").await?,
            exporter,
            prometheus.path.clone(),
        )),
        _ => None,
    };
    let admin = match &settings.admin {
        Some(admin) => Some((bind(admin.addr, "the admin API").await?, admin.token())),
        None => None,
    };
    let state = Arc::new(State {
        current: ArcSwap::from_pointee(Current {
            domains: loaded.domains,
            limiter,
            on_store_failure: loaded.on_store_failure,
        }),
        stats,
        answering: settings.answering.clone(),
        draining: AtomicBool::new(false),
    });
    state.stats.loaded();
    if let Some(reply) = first_push {
        let _ = reply.send(Ok(()));
    }
    // Watched before the server says it serves: a SIGTERM from then on is a drain, never the
    // default action that kills the process.
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| StartError(format!("cannot watch SIGTERM: {e}")))?;
    let grpc_addr = grpc_listener.local_addr().unwrap_or(settings.grpc_addr);
    let http_addr = http_listener.local_addr().unwrap_or(settings.http_addr);
    if let Some((listener, _, path)) = &prometheus {
        tracing::info!(
            prometheus = %bound(listener),
            path = %path,
            "prometheus: the reference's series are served there"
        );
    }
    if let Some((listener, _)) = &admin {
        tracing::info!(
            admin = %bound(listener),
            "admin API: blocks and overrides served there (Authorization: Bearer)"
        );
    }
    tracing::info!(
        grpc = %grpc_addr,
        http = %http_addr,
        tls = settings.grpc_tls.is_some(),
        config = %config_path.display(),
        domains = ?domain_names(&state),
        "tollgate-server: serving"
    );

    // gRPC stops first and drains; HTTP answers until then, so `/healthcheck` says 503 while
    // the calls in flight finish (a load balancer stops sending meanwhile).
    let (stop_grpc, grpc_stopping) = tokio::sync::watch::channel(false);
    let (stop_http, http_stopping) = tokio::sync::watch::channel(false);
    let (reload, xds_client) = match xds {
        Some((client, offers)) => (
            tokio::spawn(reload::follow(state.clone(), config_path.clone(), offers)),
            Some(client),
        ),
        None => (
            tokio::spawn(reload::watch(
                state.clone(),
                settings.config.clone(),
                in_force,
                settings.reload_interval,
                grpc_stopping.clone(),
            )),
            None,
        ),
    };
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
        http_stopping.clone(),
    ));
    let prometheus = prometheus.map(|(listener, exporter, path)| {
        tokio::spawn(http_api::serve_prometheus(
            listener,
            gate(),
            state.clone(),
            exporter,
            path,
            http_stopping.clone(),
        ))
    });
    let admin = admin.map(|(listener, token)| {
        let shared = state.clone();
        let in_force = move || shared.current.load().limiter.clone();
        tokio::spawn(http_api::serve_app(
            listener,
            gate(),
            admin::router(in_force, token),
            state.clone(),
            http_stopping.clone(),
        ))
    });
    let grpc = tokio::spawn(grpc::serve(
        grpc_listener,
        gate(),
        tls,
        state.clone(),
        grpc_stopping,
        settings.grpc_workers,
    ));

    shutdown_signal(term).await;
    state.draining.store(true, Ordering::SeqCst);
    tracing::info!("tollgate-server: draining the calls in flight");
    let _ = stop_grpc.send(true);
    let _ = grpc.await;
    let _ = stop_http.send(true);
    let _ = http.await;
    for listener in [prometheus, admin].into_iter().flatten() {
        let _ = listener.await;
    }
    reload.abort();
    if let Some(client) = xds_client {
        client.abort();
    }
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

/// The address `listener` is bound to, as the log says it (`?` if the system cannot tell).
fn bound(listener: &tokio::net::TcpListener) -> String {
    listener
        .local_addr()
        .map_or_else(|_| "?".into(), |addr| addr.to_string())
}

/// Returns on SIGTERM or SIGINT.
async fn shutdown_signal(mut term: tokio::signal::unix::Signal) {
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
