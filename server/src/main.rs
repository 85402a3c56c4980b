//! `tollgate-server`: Envoy's rate-limit service on tollgate's engine.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tollgate_server::service::admin::{self, AdminSettings};
use tollgate_server::service::{
    default_grpc_workers, Answering, Limits, ReferenceHeaders, Settings,
};
use tollgate_server::settings;
use tollgate_server::source::Source;
use tollgate_server::stats::exporter::PrometheusSettings;
use tollgate_server::stats::statsd::{StatsdSettings, Transport};

/// The rate-limit service of Envoy, Istio and every client of
/// `envoy.service.ratelimit.v3.RateLimitService`, on tollgate's engine.
///
/// Without `--config`, it is configured as envoyproxy/ratelimit is, by the environment (below):
/// a Deployment written for the reference runs it unchanged. Flags given win over variables.
#[derive(Debug, Parser)]
#[command(name = "tollgate-server", version, after_help = environment_help())]
struct Args {
    /// The configuration: a reference-service YAML file, a directory of them, or tollgate's own
    /// file (TOML or YAML) with a `domain` and a `descriptors` match per rule. Reloaded when it
    /// changes. Without it, the reference's variables say where the configuration is.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where gRPC (RateLimitService and grpc.health.v1.Health) is served [default: 0.0.0.0:8081,
    /// or GRPC_HOST:GRPC_PORT].
    #[arg(long, value_name = "ADDR")]
    grpc_addr: Option<SocketAddr>,
    /// Where HTTP (/healthcheck, /metrics) is served [default: 0.0.0.0:8080, or HOST:PORT].
    #[arg(long, value_name = "ADDR")]
    http_addr: Option<SocketAddr>,
    /// How often the configuration's files are checked for changes, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    reload_interval_ms: u64,
    /// The most connections open at once on each port; one more is closed as soon as it is
    /// accepted.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_connections as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// How long a connection has to send a whole request head (HTTP) or its HTTP/2 preface
    /// (gRPC) before it is closed, in milliseconds.
    #[arg(long, value_name = "MS",
          default_value_t = Limits::default().header_read_timeout.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    header_read_timeout_ms: u64,
    /// The threads that serve gRPC, each a single-threaded runtime with its share of the
    /// connections [default: one per core].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    grpc_workers: Option<u32>,
    /// Every limit is a quota limit (the reference's QUOTA_MODE): a request is OVER_LIMIT only
    /// when every quota descriptor is.
    #[arg(long)]
    quota_mode: bool,
    /// Every answer is OK, decided and counted as usual (the reference's SHADOW_MODE).
    #[arg(long)]
    shadow_mode: bool,
    /// Answers carry dynamic_metadata: the domain, the descriptors and the metadata of the
    /// limits that passed (the reference's RESPONSE_DYNAMIC_METADATA).
    #[arg(long)]
    response_dynamic_metadata: bool,
    /// A limit is near (the near_limit statistic) once more than this share of it is used (the
    /// reference's NEAR_LIMIT_RATIO).
    /// [default: 0.8, or NEAR_LIMIT_RATIO]
    #[arg(long, value_name = "RATIO", value_parser = near_limit_ratio)]
    near_limit_ratio: Option<f32>,
    /// Answers also carry RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset for the
    /// descriptor closest to its limit (the reference's LIMIT_RESPONSE_HEADERS_ENABLED).
    #[arg(long)]
    limit_response_headers: bool,
    /// Also push statistics to this statsd server (HOST:PORT), under the reference service's
    /// names; over TCP unless --statsd-udp.
    #[arg(long, value_name = "HOST:PORT", value_parser = host_port)]
    statsd_addr: Option<(String, u16)>,
    /// Send statsd lines as UDP datagrams.
    #[arg(long, requires = "statsd_addr")]
    statsd_udp: bool,
    /// How often statsd counters are sent, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    stats_flush_interval_ms: u64,
    /// A tag appended to every statsd name (KEY:VALUE; repeatable).
    #[arg(long, value_name = "KEY:VALUE", value_parser = tag)]
    statsd_extra_tag: Vec<(String, String)>,
    /// Also serve the reference service's statistics as its Prometheus listener does (its
    /// statsd names through its statsd-exporter mapping, or PROMETHEUS_MAPPER_YAML's, on
    /// PROMETHEUS_PATH or /metrics) at this address (:PORT for every interface, or IP:PORT)
    /// [default: none, or PROMETHEUS_ADDR with USE_PROMETHEUS=true].
    #[arg(long, value_name = "ADDR", value_parser = prometheus_addr)]
    prometheus_addr: Option<SocketAddr>,
    /// Serve the admin API (list, read and lift blocks; list, read, set and remove overrides)
    /// at this address, every request asked for the bearer token TOLLGATE_ADMIN_TOKEN
    /// [default: off, or TOLLGATE_ADMIN_ADDR].
    #[arg(long, value_name = "ADDR")]
    admin_addr: Option<SocketAddr>,
}

/// `:PORT` or `IP:PORT`, as the reference's PROMETHEUS_ADDR.
fn prometheus_addr(text: &str) -> Result<SocketAddr, String> {
    settings::listen_address(text)
        .ok_or_else(|| format!("{text:?}: expected :PORT or IP:PORT (:19001, 127.0.0.1:9090)"))
}

/// A ratio between 0 and 1.
fn near_limit_ratio(text: &str) -> Result<f32, String> {
    match text.parse::<f32>() {
        Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
        _ => Err(format!("{text:?} is not a number between 0 and 1")),
    }
}

/// The variables read without `--config`, for `--help`.
fn environment_help() -> String {
    let mut help = String::from(
        "Environment (read when --config is not given; envoyproxy/ratelimit's names and defaults; \
         every other variable of the reference is named once at start-up with what tollgate-server \
         does with it):\n",
    );
    for (name, meaning) in settings::READ {
        help.push_str(&format!("  {name:<36} {meaning}\n"));
    }
    help.push_str("\nRead whether --config is given or not (tollgate-server's own):\n");
    for (name, meaning) in [
        (
            admin::ADDR_VARIABLE,
            "(none): IP:PORT of the admin API; off without it",
        ),
        (
            admin::TOKEN_VARIABLE,
            "the admin API's bearer token, at least 16 characters: required with an address",
        ),
    ] {
        help.push_str(&format!("  {name:<36} {meaning}\n"));
    }
    help
}

/// `HOST:PORT`, the host possibly an IPv6 address in brackets.
fn host_port(text: &str) -> Result<(String, u16), String> {
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("{text:?}: expected HOST:PORT"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = port
        .parse()
        .map_err(|e| format!("{text:?}: the port: {e}"))?;
    if host.is_empty() {
        return Err(format!("{text:?}: no host"));
    }
    Ok((host.to_owned(), port))
}

/// `KEY:VALUE`.
fn tag(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?}: expected KEY:VALUE"))?;
    Ok((key.to_owned(), value.to_owned()))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let admin = match AdminSettings::read(args.admin_addr, |name| std::env::var(name).ok()) {
        Ok(admin) => admin,
        Err(error) => {
            eprintln!("tollgate-server: {error}");
            return ExitCode::FAILURE;
        }
    };
    let from_env = match args.config {
        Some(_) => None,
        None => match settings::read(std::env::vars()) {
            Ok(from_env) => Some(from_env),
            Err(error) => {
                eprintln!("tollgate-server: {error}");
                return ExitCode::FAILURE;
            }
        },
    };
    let (level, json) = from_env
        .as_ref()
        .map_or((tracing::Level::INFO, false), |env| {
            (env.log_level, env.log_json)
        });
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(level);
    if json {
        logs.json().init();
    } else {
        logs.init();
    }
    let settings = match (args.config, from_env) {
        (Some(path), _) => Settings {
            config: Source::Path(path),
            force_start: false,
            grpc_tls: None,
            answering: Answering::default(),
            statsd: None,
            prometheus: None,
            admin,
            grpc_addr: args.grpc_addr.unwrap_or(([0, 0, 0, 0], 8081).into()),
            http_addr: args.http_addr.unwrap_or(([0, 0, 0, 0], 8080).into()),
            reload_interval: Duration::ZERO,
            connections: Limits::default(),
            grpc_workers: default_grpc_workers(),
        },
        (None, Some(env)) => {
            for notice in &env.notices {
                tracing::warn!("{notice}");
            }
            Settings {
                config: match env.xds {
                    Some(xds) => Source::Xds(Box::new(xds)),
                    None => Source::Runtime {
                        dir: env.runtime,
                        store: env.store,
                    },
                },
                force_start: env.force_start,
                grpc_tls: env.grpc_tls,
                answering: env.answering,
                statsd: env.statsd,
                prometheus: env.prometheus,
                admin,
                grpc_addr: args.grpc_addr.unwrap_or(env.grpc_addr),
                http_addr: args.http_addr.unwrap_or(env.http_addr),
                reload_interval: Duration::ZERO,
                connections: Limits::default(),
                grpc_workers: default_grpc_workers(),
            }
        }
        (None, None) => unreachable!("the environment is read when --config is not given"),
    };
    let settings = Settings {
        reload_interval: Duration::from_millis(args.reload_interval_ms.max(1)),
        connections: Limits {
            max_connections: args.max_connections as usize,
            header_read_timeout: Duration::from_millis(args.header_read_timeout_ms),
        },
        grpc_workers: args
            .grpc_workers
            .map_or(settings.grpc_workers, |n| n as usize),
        // A switch given as a flag turns the behaviour on whatever the variable says.
        answering: Answering {
            quota_mode: args.quota_mode || settings.answering.quota_mode,
            shadow_mode: args.shadow_mode || settings.answering.shadow_mode,
            response_dynamic_metadata: args.response_dynamic_metadata
                || settings.answering.response_dynamic_metadata,
            near_limit_ratio: args
                .near_limit_ratio
                .unwrap_or(settings.answering.near_limit_ratio),
            reference_headers: match settings.answering.reference_headers.clone() {
                Some(names) => Some(names),
                None => args.limit_response_headers.then(ReferenceHeaders::default),
            },
        },
        // The flag wins over USE_STATSD and the STATSD_ variables.
        statsd: match args.statsd_addr {
            Some((host, port)) => Some(StatsdSettings {
                host,
                port,
                transport: if args.statsd_udp {
                    Transport::Udp
                } else {
                    Transport::Tcp
                },
                flush_interval: Duration::from_millis(args.stats_flush_interval_ms),
                extra_tags: args.statsd_extra_tag,
            }),
            None => settings.statsd.clone(),
        },
        // The flag's address wins; the mapping and path are the environment's, if any.
        prometheus: match (args.prometheus_addr, settings.prometheus.clone()) {
            (Some(addr), Some(from_env)) => Some(PrometheusSettings { addr, ..from_env }),
            (Some(addr), None) => Some(PrometheusSettings::at(addr)),
            (None, from_env) => from_env,
        },
        ..settings
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tollgate-server: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let ran = runtime.block_on(tollgate_server::service::run(settings));
    // A lookup still blocked in the resolver (a statsd host that does not answer) never holds
    // the exit.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tollgate-server: {error}");
            ExitCode::FAILURE
        }
    }
}
