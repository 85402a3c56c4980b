//! `tollgate-server`: Envoy's rate-limit service on tollgate's engine.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tollgate_server::service::Limits;
use tollgate_server::stats::statsd::{StatsdSettings, Transport};

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
        statsd: args.statsd_addr.map(|(host, port)| StatsdSettings {
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
