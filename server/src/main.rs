//! `tollgate-server`: Envoy's rate-limit service on tollgate's engine.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tollgate_server::service::{Answering, Limits, ReferenceHeaders};

/// The rate-limit service of Envoy, Istio and every client of
/// `envoy.service.ratelimit.v3.RateLimitService`, on tollgate's engine.
#[derive(Debug, Parser)]
#[command(name = "tollgate-server", version)]
struct Args {
    /// The configuration: a reference-service YAML file, a directory of them, or tollgate's own
    /// file (TOML or YAML) with a `domain` and a `descriptors` match per rule. Reloaded when it
    /// changes.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Where gRPC (RateLimitService and grpc.health.v1.Health) is served.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8081")]
    grpc_addr: SocketAddr,
    /// Where HTTP (/healthcheck, /metrics) is served.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8080")]
    http_addr: SocketAddr,
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
    #[arg(long, value_name = "RATIO", default_value_t = Answering::default().near_limit_ratio,
          value_parser = near_limit_ratio)]
    near_limit_ratio: f32,
    /// Answers also carry RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset for the
    /// descriptor closest to its limit (the reference's LIMIT_RESPONSE_HEADERS_ENABLED).
    #[arg(long)]
    limit_response_headers: bool,
}

/// A ratio between 0 and 1.
fn near_limit_ratio(text: &str) -> Result<f32, String> {
    match text.parse::<f32>() {
        Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
        _ => Err(format!("{text:?} is not a number between 0 and 1")),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let settings = tollgate_server::service::Settings {
        config: args.config,
        grpc_addr: args.grpc_addr,
        http_addr: args.http_addr,
        reload_interval: Duration::from_millis(args.reload_interval_ms.max(1)),
        connections: Limits {
            max_connections: args.max_connections as usize,
            header_read_timeout: Duration::from_millis(args.header_read_timeout_ms),
        },
        answering: Answering {
            quota_mode: args.quota_mode,
            shadow_mode: args.shadow_mode,
            response_dynamic_metadata: args.response_dynamic_metadata,
            near_limit_ratio: args.near_limit_ratio,
            reference_headers: args.limit_response_headers.then(ReferenceHeaders::default),
        },
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
    match runtime.block_on(tollgate_server::service::run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tollgate-server: {error}");
            ExitCode::FAILURE
        }
    }
}
