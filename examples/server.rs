//! A server whose rate limits come only from a configuration file: try every setting without
//! writing Rust.
//!
//! ```text
//! cargo run --example server --features config -- --config examples/configs/public_api.toml
//! cargo run --example server --features config -- --config examples/configs/login_protection.yaml
//! cargo run --example server --features config,redis -- --config examples/configs/redis.toml
//! ```
//!
//! It listens on `127.0.0.1:3000` (set `ADDR` to change that) and answers every method and path
//! with the rules that applied and what they have left, so any `paths` and `methods` in the file
//! can be tried with `curl -i`; at start-up it prints a `curl` line for each scope of the file's
//! rules (the first method and path, the header a key reads set to `demo`) with the rules that
//! count it. `/metrics` (never limited) serves the counters in Prometheus
//! text format; `/_tollgate/top` (never limited) the keys each rule denied most, as JSON (with
//! `redact_keys`, each key is the hash the logs show):
//!
//! ```text
//! {"rules":[{"capacity":64,"denials":3,"guaranteed_above":0,
//!   "offenders":[{"denied":3,"error":0,"key":"alice"}],"rule":"per-key","utilisation":1.0}]}
//! ```
//!
//! Any valid file loads, a Redis store's included (with the `redis` feature; the file's
//! `store.url` names the server). The file is watched: save a change and the new rules apply
//! within two seconds (an invalid file is reported and the rules in force stay).
//!
//! The answer is shaped by query parameters, so rules that look at the response (`count_if`,
//! `settle`) and penalties (`block`) can be tried too:
//!
//! | parameter | effect | example |
//! |---|---|---|
//! | `status=N` | answers with status `N` (default 200) | `?status=401` |
//! | `delay=DURATION` | answers after that long (`ms`, `s` or `m`; at most a minute) | `?delay=500ms` |
//! | `header=NAME:VALUE` | adds a response header (repeatable) | `?header=x-tokens-used:1200` |
//!
//! ```text
//! curl -i -X POST 'http://127.0.0.1:3000/login?status=401'
//! curl -i 'http://127.0.0.1:3000/v1/chat?header=x-tokens-used:1200&delay=200ms'
//! ```
//!
//! A parameter that cannot be read (a status outside 100–999, an unknown unit) is answered with
//! `400` and says why.
//!
//! ## Blocks and overrides
//!
//! An operator's admin API (list, read and lift blocks; set, read and remove per-key overrides,
//! behind a bearer token) is `tollgate-server`'s: `--admin-addr` with `TOLLGATE_ADMIN_TOKEN`,
//! on the same configuration's rules (with a `domain` and `descriptors`). See the guide's
//! chapter on `tollgate-server`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::extract::Request;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::json;
use tollgate::config::{Config, ConfigFileError, ConfigWatch};
use tollgate::engine::Ruling;
use tollgate::rules::RuleSummary;
use tollgate::{Decision, MemoryStore, RateLimitLayer};

/// The limited app: any path, any method; plus `/metrics` and `/_tollgate/top`, outside the
/// limits.
pub(crate) fn app(limits: RateLimitLayer, metrics: PrometheusHandle) -> Router {
    let layer = limits.clone();
    let limited = Router::new().fallback(answer).layer(limits);
    let scraped = layer.clone();
    Router::new()
        .route(
            "/metrics",
            get(move || async move {
                // Reading the lists sets the top-offender utilisation gauges.
                top_offenders(&scraped).await;
                metrics.render()
            }),
        )
        .route(
            "/_tollgate/top",
            get(move || async move {
                let body = json!({ "rules": top_offenders(&layer).await });
                ([(CONTENT_TYPE, "application/json")], body.to_string())
            }),
        )
        .merge(limited)
}

/// Every rule's top offenders, as JSON values.
async fn top_offenders(layer: &RateLimitLayer) -> Vec<serde_json::Value> {
    let mut rules = Vec::new();
    for rule in layer.limiter().rules_in_force() {
        let name = rule.name;
        // A reload between the two calls may have removed the rule: it is left out.
        let Ok(top) = layer.top_offenders(&name).await else {
            continue;
        };
        let offenders: Vec<_> = top
            .offenders
            .iter()
            .map(|o| json!({ "key": o.key, "denied": o.denied, "error": o.error }))
            .collect();
        rules.push(json!({
            "rule": top.rule,
            "denials": top.denials,
            "capacity": top.capacity,
            "guaranteed_above": top.guaranteed_above(),
            "utilisation": top.utilisation,
            "offenders": offenders,
        }));
    }
    rules
}

async fn answer(request: Request) -> Response {
    let shape = match Shape::of(request.uri().query().unwrap_or("")) {
        Ok(shape) => shape,
        Err(why) => return (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response(),
    };
    let mut text = format!("{} {}\n", request.method(), request.uri().path());
    match request.extensions().get::<Decision>() {
        Some(decision) if !decision.rules().is_empty() => {
            for rule in decision.rules() {
                text += &format!("  {}: {} left\n", rule.rule(), rule.outcome.remaining);
            }
        }
        _ => text += "  no rule applied\n",
    }
    if !shape.delay.is_zero() {
        tokio::time::sleep(shape.delay).await;
    }
    let mut response = (shape.status, text).into_response();
    for (name, value) in shape.headers {
        response.headers_mut().append(name, value);
    }
    response
}

/// How the query asks the answer to look.
struct Shape {
    status: StatusCode,
    delay: Duration,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Shape {
    fn of(query: &str) -> Result<Shape, String> {
        let mut shape = Shape {
            status: StatusCode::OK,
            delay: Duration::ZERO,
            headers: Vec::new(),
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "status" => {
                    shape.status = value
                        .parse::<u16>()
                        .ok()
                        .and_then(|code| StatusCode::from_u16(code).ok())
                        .ok_or_else(|| format!("status={value}: not a status (100-999)"))?
                }
                "delay" => shape.delay = delay(value)?,
                "header" => {
                    let bad = || format!("header={value}: expected NAME:VALUE");
                    let (name, value) = value.split_once(':').ok_or_else(bad)?;
                    let name = HeaderName::try_from(name).map_err(|_| bad())?;
                    let value = HeaderValue::try_from(value).map_err(|_| bad())?;
                    shape.headers.push((name, value));
                }
                _ => {}
            }
        }
        Ok(shape)
    }
}

/// `500ms`, `2s`, `1m`: a whole number and a unit, at most a minute.
fn delay(text: &str) -> Result<Duration, String> {
    let bad = || format!("delay={text}: expected e.g. 500ms, 2s or 1m (at most a minute)");
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let n: u64 = text[..digits].parse().map_err(|_| bad())?;
    let d = match &text[digits..] {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => return Err(bad()),
    };
    if d > Duration::from_secs(60) {
        return Err(bad());
    }
    Ok(d)
}

/// The layer the file describes, watched for changes. `Config::connect` builds it with any store:
/// it connects to Redis when the file names it (the synchronous `Config::layer` cannot).
pub(crate) async fn load(path: &Path) -> Result<(RateLimitLayer, ConfigWatch), ConfigFileError> {
    let limits = Config::read(path)?.connect().await?;
    let watch = Config::watch(&limits, path, Duration::from_secs(2))?;
    Ok((limits, watch))
}

/// A request to try on the file's rules, made from one rule's scope: its first method and path
/// (each `*` segment standing for `demo`), and the headers its key and cost read.
#[derive(Debug, PartialEq)]
pub(crate) struct Probe {
    method: Method,
    path: String,
    headers: Vec<(String, String)>,
}

impl Probe {
    fn of(rule: &RuleSummary) -> Probe {
        let path = rule.paths.first().map_or_else(
            || "/".to_owned(),
            |pattern| {
                let segments: Vec<&str> = pattern
                    .split('/')
                    .map(|s| if s == "*" { "demo" } else { s })
                    .collect();
                segments.join("/")
            },
        );
        let mut headers = Vec::new();
        if rule.key.can_be_missing() {
            headers.extend(key_header(&rule.key.describe()));
        }
        if let Some(name) = rule.cost.header_name() {
            headers.push((name.to_string(), "1".to_owned()));
        }
        Probe {
            method: rule.methods.first().cloned().unwrap_or(Method::GET),
            path,
            headers,
        }
    }

    fn request(&self) -> axum::http::Request<()> {
        let mut request = axum::http::Request::new(());
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self
            .path
            .parse()
            .expect("a path made of the rule's pattern");
        for (name, value) in &self.headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::try_from(name.as_str()),
                HeaderValue::try_from(value.as_str()),
            ) {
                request.headers_mut().append(name, value);
            }
        }
        // curl on this host: the peer is the loopback address.
        let peer = SocketAddr::from(([127, 0, 0, 1], 40000));
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        request
    }

    /// The `curl` command that sends this request to `addr`.
    fn curl(&self, addr: SocketAddr) -> String {
        let mut line = "curl -i".to_owned();
        if self.method != Method::GET {
            line += &format!(" -X {}", self.method);
        }
        line += &format!(" http://{addr}{}", self.path);
        for (name, value) in &self.headers {
            line += &format!(" -H '{name}: {value}'");
        }
        line
    }
}

/// The header that gives a key a value, from the key's description (`Key::describe`), when a
/// header can.
fn key_header(key: &str) -> Option<(String, String)> {
    if let Some(keys) = key.strip_prefix("first-of(") {
        return key_header(keys.split([',', ')']).next()?);
    }
    match key.split_once(':') {
        Some(("header", name)) => Some((name.to_owned(), "demo".to_owned())),
        Some(("cookie", name)) => Some(("cookie".to_owned(), format!("{name}=demo"))),
        _ if key == "bearer" => Some(("authorization".to_owned(), "Bearer demo".to_owned())),
        _ => None,
    }
}

/// Requests to try on `config`'s rules, one per rule scope, each with what the rules make of it.
/// A layer of the same file on a memory store of its own decides them, so the server's counts
/// start untouched (called before the metrics recorder is installed, they count in no metric).
pub(crate) async fn probes(config: &Config) -> Result<Vec<(Probe, String)>, ConfigFileError> {
    let scratch = config.layer_with_store(MemoryStore::new())?;
    let limiter = scratch.limiter();
    let mut probes: Vec<Probe> = Vec::new();
    for rule in limiter.rules_in_force() {
        let probe = Probe::of(&rule);
        if !probes.contains(&probe) {
            probes.push(probe);
        }
    }
    let mut told = Vec::new();
    for probe in probes {
        let told_of = match limiter.decide(&probe.request()).await {
            Ok(Ruling::Decided { enforced, shadow }) => {
                let mut names: Vec<String> = enforced
                    .rules()
                    .iter()
                    .map(|r| r.rule().to_owned())
                    .collect();
                names.extend(
                    shadow
                        .rules()
                        .iter()
                        .map(|r| format!("{} (shadow)", r.rule())),
                );
                if names.is_empty() {
                    "counted by no rule".to_owned()
                } else {
                    format!("counted by {}", names.join(", "))
                }
            }
            Ok(Ruling::Allowed) => "on an allow list: not counted".to_owned(),
            Ok(Ruling::Refused { status, reason, .. }) => format!("{status}: {reason}"),
            Ok(_) | Err(_) => continue,
        };
        told.push((probe, told_of));
    }
    Ok(told)
}

/// The lines printed at start-up: `probes` as `curl` commands on `addr`, each followed by what
/// the rules make of it, then the lines that hold for any file.
pub(crate) fn try_lines(addr: SocketAddr, probes: &[(Probe, String)]) -> String {
    let mut lines = Vec::new();
    for (probe, told) in probes {
        lines.push(probe.curl(addr));
        lines.push(format!("# {told}"));
    }
    lines.extend([
        format!(
            "curl -i 'http://{addr}/any/path?status=401&delay=200ms&header=x-tokens-used:1200'"
        ),
        "# any method and path answers; the query shapes the answer".to_owned(),
        format!("curl http://{addr}/metrics"),
        format!("curl http://{addr}/_tollgate/top"),
        "# the keys each rule denied most".to_owned(),
    ]);
    lines.iter().map(|line| format!("  {line}\n")).collect()
}

/// The value of `--config FILE` (or `--config=FILE`).
fn config_path() -> Result<PathBuf, String> {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--config" {
            return args.next().map(PathBuf::from).ok_or_else(usage);
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            return Ok(PathBuf::from(path));
        }
    }
    Err(usage())
}

fn usage() -> String {
    "usage: server --config FILE (a .toml, .yaml or .yml file; ADDR sets the address)".to_owned()
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let path = config_path()?;
    tracing_subscriber::fmt().with_target(false).init();
    let probes = probes(&Config::read(&path)?).await?;
    // The recorder comes next: the layer registers its counters when it is built.
    let metrics = PrometheusBuilder::new().install_recorder()?;
    let (limits, _watch) = load(&path).await?;
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });

    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let rules = limits.limiter().rules_in_force();
    println!("{} rules from {}:", rules.len(), path.display());
    for rule in rules {
        println!("  {}", rule.name);
    }
    println!("listening on http://{addr}; try, with this file's rules:");
    print!("{}", try_lines(addr, &probes));
    serve(listener, app(limits, metrics), CLIENT_HEADER_TIMEOUT).await;
    Ok(())
}

/// How long a client has to send a whole request head; then its connection is closed.
const CLIENT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The most connections open at once; one more is closed as soon as it is accepted.
const MAX_CONNECTIONS: usize = 10_000;

/// Serves `app` over HTTP/1 with the peer address the keys read. Unlike `axum::serve`, a client
/// must send each request head whole within `header_timeout` and at most [`MAX_CONNECTIONS`]
/// are open, so connections that trickle bytes or say nothing (slowloris) hold nothing for
/// long: rate limits count requests, and these never become one.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    header_timeout: Duration,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let open = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors, most often: try again in a moment.
                eprintln!("warning: accept: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            continue; // dropped: closed at once
        };
        let app = app
            .clone()
            .layer(axum::Extension(axum::extract::ConnectInfo(peer)));
        let service = hyper_util::service::TowerToHyperService::new(app);
        let connection = http.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            let _open = permit;
            let _ = connection.await;
        });
    }
}

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}
