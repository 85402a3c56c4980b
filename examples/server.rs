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
//! can be tried with `curl -i`. `/metrics` (never limited) serves the counters in Prometheus
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

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::extract::Request;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::json;
use tollgate::config::Config;
use tollgate::config::{ConfigFileError, ConfigWatch};
use tollgate::{Decision, RateLimitLayer};

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
    for name in layer.limiter().rule_names() {
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
    // The recorder comes first: the layer registers its counters when it is built.
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
    println!(
        "{} rules from {}:",
        limits.limiter().rule_names().len(),
        path.display()
    );
    for name in limits.limiter().rule_names() {
        println!("  {name}");
    }
    println!("listening on http://{addr}; any method and path answers, for example:");
    println!("  curl -i http://{addr}/v1/items -H 'x-api-key: demo-free'");
    println!("  curl -i -X POST 'http://{addr}/login?status=401'      # answer with 401");
    println!("  curl -i 'http://{addr}/v1/chat?header=x-tokens-used:1200&delay=200ms'");
    println!("  curl http://{addr}/metrics");
    println!("  curl http://{addr}/_tollgate/top                      # keys denied most");
    let app = app(limits, metrics).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}
