//! The reference's Prometheus listener (`USE_PROMETHEUS`), started as Envoy Gateway's
//! Deployment starts the reference: the statsd names through Envoy Gateway's statsd-exporter
//! mapping, scraped for the series its rate-limit dashboard queries.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tollgate_server::service::protocol::{code, RateLimitRequest};

use crate::support::{field, http_get, request, run_to_exit_env, Server};

/// Envoy Gateway's `statsd_conf.yaml` (`internal/infrastructure/kubernetes/ratelimit/`), which
/// its Deployment mounts at `/etc/statsd-exporter/conf.yaml` and names in
/// `PROMETHEUS_MAPPER_YAML`: the data the reference is given, written as it ships.
const GATEWAY_MAPPING: &str = r#"# Requires statsd exporter >= v0.6.0 since it uses the "drop" action.
mappings:
  - match: "ratelimit.service.rate_limit.*.*.near_limit"
    name: "ratelimit_service_rate_limit_near_limit"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
  - match: "ratelimit.service.rate_limit.*.*.over_limit"
    name: "ratelimit_service_rate_limit_over_limit"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "ratelimit_service_rate_limit_total_hits"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
  - match: "ratelimit.service.rate_limit.*.*.within_limit"
    name: "ratelimit_service_rate_limit_within_limit"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
  - match: "ratelimit.service.rate_limit.*.*.shadow_mode"
    name: "ratelimit_service_rate_limit_shadow_mode"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"

  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.near_limit"
    match_type: regex
    name: "ratelimit_service_rate_limit_near_limit"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
      key2: "$3"
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.over_limit"
    match_type: regex
    name: "ratelimit_service_rate_limit_over_limit"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
      key2: "$3"
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.total_hits"
    match_type: regex
    name: "ratelimit_service_rate_limit_total_hits"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
      key2: "$3"
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.within_limit"
    match_type: regex
    name: "ratelimit_service_rate_limit_within_limit"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
      key2: "$3"
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.shadow_mode"
    match_type: regex
    name: "ratelimit_service_rate_limit_shadow_mode"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
      key2: "$3"

  - match: "ratelimit.service.call.should_rate_limit.*"
    name: "ratelimit_service_should_rate_limit_error"
    match_metric_type: counter
    labels:
      err_type: "$1"

  - match: "ratelimit_server.*.total_requests"
    name: "ratelimit_service_total_requests"
    match_metric_type: counter
    labels:
      grpc_method: "$1"
  - match: "ratelimit_server.*.response_time"
    name: "ratelimit_service_response_time_seconds"
    timer_type: histogram
    labels:
      grpc_method: "$1"

  - match: "ratelimit.service.config_load_success"
    name: "ratelimit_service_config_load_success"
    match_metric_type: counter
  - match: "ratelimit.service.config_load_error"
    name: "ratelimit_service_config_load_error"
    match_metric_type: counter
"#;

/// The route and rule of Envoy Gateway's global rate-limit example, as its xDS translation
/// names the descriptors (and its dashboard's panels select them).
const DOMAIN: &str = "default/eg/http";
const ROUTE: &str = "httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example";
const RULE: &str = "rule-0-match-0";
const OTHER: &str = "httproute/default/other/rule/0/match/0/ratelimit_example";

/// The reference-format configuration Envoy Gateway would push for those routes.
fn gateway_config() -> String {
    format!(
        "domain: {DOMAIN}\ndescriptors:\n  - key: {ROUTE}\n    value: {ROUTE}\n    descriptors:\n      - key: {RULE}\n        value: {RULE}\n        rate_limit:\n          unit: hour\n          requests_per_unit: 3\n  - key: {OTHER}\n    value: {OTHER}\n    rate_limit:\n      unit: hour\n      requests_per_unit: 10\n"
    )
}

/// A runtime directory holding `gateway_config()`, and a mapping file beside it.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("runtime/config");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(config.join("gateway.yaml"), gateway_config()).unwrap();
        Files { dir }
    }

    fn root(&self) -> String {
        self.dir.path().join("runtime").display().to_string()
    }

    /// Writes a mapping file as Envoy Gateway's ConfigMap volume holds it; returns its path.
    fn mapping(&self, text: &str) -> PathBuf {
        let dir = self.dir.path().join("etc/statsd-exporter");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("conf.yaml");
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// The statistics variables of Envoy Gateway's Deployment of the reference (with the
/// listeners moved to loopback and free ports), the store in memory.
fn gateway_env<'a>(root: &'a str, mapping: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("USE_STATSD", "false"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
        ("RUNTIME_ROOT", root),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("BACKEND_TYPE", "memory"),
        ("HOST", "127.0.0.1"),
        ("GRPC_HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_PORT", "0"),
    ];
    if let Some(mapping) = mapping {
        env.push(("PROMETHEUS_MAPPER_YAML", mapping));
    }
    env
}

/// Where the server said it serves the reference's series.
fn prometheus_addr(server: &Server) -> SocketAddr {
    let line = server
        .log
        .iter()
        .find(|line| line.contains("prometheus="))
        .unwrap_or_else(|| {
            panic!(
                "no Prometheus listener in the log:\n{}",
                server.log.join("\n")
            )
        });
    field(line, "prometheus=").parse().expect("its address")
}

/// The calls of the tests: the dashboard's rule four times (the fourth over its limit of 3),
/// the other route once, an unknown domain with two descriptors, a request without a domain.
/// Returns how many calls were made.
async fn calls(server: &Server) -> u64 {
    let client = server.client().await;
    let rule = [(ROUTE, ROUTE), (RULE, RULE)];
    for i in 0..4 {
        let answer = client.ask(DOMAIN, &[&rule]).await;
        let expected = if i < 3 { code::OK } else { code::OVER_LIMIT };
        assert_eq!(answer.overall_code, expected, "call {i}");
    }
    client.ask(DOMAIN, &[&[(OTHER, OTHER)]]).await;
    client.ask("nowhere", &[&[("a", "1")], &[("b", "2")]]).await;
    let refused = client
        .call(RateLimitRequest {
            domain: Vec::new(),
            ..request(DOMAIN, &[&rule])
        })
        .await;
    assert_eq!(refused.unwrap_err().code(), tonic::Code::InvalidArgument);
    7
}

/// The sample lines of a scrape (no comments), each `name{labels} value`.
fn samples(body: &str) -> BTreeSet<String> {
    body.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The value of every sample of `name` whose labels include `selector` (a panel's
/// `name{label="value", …}`), as Prometheus selects them.
fn select(body: &str, name: &str, selector: &[(&str, &str)]) -> Vec<String> {
    samples(body)
        .into_iter()
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let labels = match series.split_once('{') {
                Some((metric, labels)) if metric == name => labels.strip_suffix('}')?.to_owned(),
                None if series == name => String::new(),
                _ => return None,
            };
            selector
                .iter()
                .all(|(key, want)| {
                    labels
                        .split(',')
                        .any(|pair| pair == format!("{key}=\"{want}\""))
                })
                .then(|| value.to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_deployment_fills_its_rate_limit_dashboard() {
    let files = Files::new();
    let root = files.root();
    let mapping = files.mapping(GATEWAY_MAPPING).display().to_string();
    let server = Server::start_env(&gateway_env(&root, Some(&mapping)));
    // Every variable of the Deployment is acted on: none is named as ignored.
    assert!(
        !server.log.iter().any(|line| line.contains(" is set: ")),
        "{:#?}",
        server.log
    );
    let calls = calls(&server).await;
    let (status, body) = http_get(prometheus_addr(&server), "/metrics");
    assert_eq!(status, 200, "{body}");

    // The three panels of Envoy Gateway's global rate-limit dashboard, their queries exactly.
    let key1 = format!("{ROUTE}_{ROUTE}");
    let key2 = format!("{RULE}_{RULE}");
    let panel = [("domain", DOMAIN), ("key1", &key1), ("key2", &key2)];
    for (name, value) in [
        ("ratelimit_service_rate_limit_total_hits", "4"),
        ("ratelimit_service_rate_limit_near_limit", "1"),
        ("ratelimit_service_rate_limit_over_limit", "1"),
    ] {
        assert_eq!(select(&body, name, &panel), [value], "{name}:\n{body}");
    }
    let all = samples(&body);
    let labels = format!("{{domain=\"{DOMAIN}\",key1=\"{key1}\",key2=\"{key2}\"}}");
    let other = format!("{{domain=\"{DOMAIN}\",key1=\"{OTHER}_{OTHER}\"}}");
    let serves = |line: String| assert!(all.contains(&line), "{line} in\n{body}");
    serves(format!("ratelimit_service_rate_limit_total_hits{labels} 4"));
    serves(format!(
        "ratelimit_service_rate_limit_within_limit{labels} 3"
    ));
    serves(format!("ratelimit_service_rate_limit_over_limit{labels} 1"));
    serves(format!("ratelimit_service_rate_limit_near_limit{labels} 1"));
    // One key: `domain` and `key1` (the glob mappings); a counter still at zero is not shown.
    serves(format!("ratelimit_service_rate_limit_total_hits{other} 1"));
    serves(format!(
        "ratelimit_service_rate_limit_within_limit{other} 1"
    ));
    assert!(!body.contains(&format!("ratelimit_service_rate_limit_over_limit{other}")));
    serves(format!(
        "ratelimit_service_total_requests{{grpc_method=\"ShouldRateLimit\"}} {calls}"
    ));
    serves("ratelimit_service_should_rate_limit_error{err_type=\"service_error\"} 1".into());
    serves("ratelimit_service_config_load_success 1".into());
    // A name the mapping does not match is converted whole, as the exporter converts it.
    serves("ratelimit_service_rate_limit_nowhere_domain_not_found 2".into());
    // The response time: a histogram of the timer's milliseconds (this mapping has no scale).
    assert!(body.contains("# TYPE ratelimit_service_response_time_seconds histogram\n"));
    let timer = "{grpc_method=\"ShouldRateLimit\"";
    serves(format!(
        "ratelimit_service_response_time_seconds_bucket{timer},le=\"+Inf\"}} {calls}"
    ));
    serves(format!(
        "ratelimit_service_response_time_seconds_count{timer}}} {calls}"
    ));
    let buckets: Vec<&str> = body
        .lines()
        .filter_map(|line| {
            line.strip_prefix("ratelimit_service_response_time_seconds_bucket")?
                .split("le=\"")
                .nth(1)?
                .split('"')
                .next()
        })
        .collect();
    assert_eq!(
        buckets,
        ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"]
    );
    for (name, kind) in [
        ("ratelimit_service_rate_limit_total_hits", "counter"),
        ("ratelimit_service_total_requests", "counter"),
    ] {
        assert!(body.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
    }
    // The dashboard's memory panels.
    assert_eq!(select(&body, "process_resident_memory_bytes", &[]).len(), 1);
    assert_eq!(select(&body, "process_virtual_memory_bytes", &[]).len(), 1);
    // The reference's series only: none of the HTTP port's own.
    assert!(!body.contains("tollgate_server_"), "{body}");
    assert!(!body.contains("key=\""), "{body}");
    // Only its path is served.
    assert_eq!(http_get(prometheus_addr(&server), "/healthcheck").0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_mapping_file_the_references_own_mapping_in_seconds() {
    let files = Files::new();
    let root = files.root();
    let mut env = gateway_env(&root, None);
    env.push(("PROMETHEUS_PATH", "/stats"));
    let server = Server::start_env(&env);
    let calls = calls(&server).await;
    let addr = prometheus_addr(&server);
    assert_eq!(http_get(addr, "/metrics").0, 404);
    let (status, body) = http_get(addr, "/stats");
    assert_eq!(status, 200);
    let all = samples(&body);
    let serves = |line: String| assert!(all.contains(&line), "{line} in\n{body}");
    let key1 = format!("{ROUTE}_{ROUTE}");
    let labels = format!("{{domain=\"{DOMAIN}\",key1=\"{key1}\",key2=\"{RULE}_{RULE}\"}}");
    serves(format!("ratelimit_service_rate_limit_total_hits{labels} 4"));
    serves(format!("ratelimit_service_rate_limit_over_limit{labels} 1"));
    serves(format!(
        "ratelimit_service_total_requests{{grpc_method=\"ShouldRateLimit\"}} {calls}"
    ));
    serves("ratelimit_service_config_load_success 1".into());
    // Seconds: the milliseconds times 0.001; every call here takes well under ten seconds.
    let timer = "{grpc_method=\"ShouldRateLimit\"";
    serves(format!(
        "ratelimit_service_response_time_seconds_bucket{timer},le=\"10\"}} {calls}"
    ));
    serves(format!(
        "ratelimit_service_response_time_seconds_count{timer}}} {calls}"
    ));
}

/// The HTTP port's `/metrics` with and without the reference's listener: the same series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_ports_metrics_are_unchanged() {
    let files = Files::new();
    let root = files.root();
    let mut series = Vec::new();
    for prometheus in ["true", "false"] {
        let mut env = gateway_env(&root, None);
        env[1] = ("USE_PROMETHEUS", prometheus);
        let server = Server::start_env(&env);
        calls(&server).await;
        if prometheus == "true" {
            assert_eq!(http_get(prometheus_addr(&server), "/metrics").0, 200);
        }
        let (status, body) = server.get("/metrics");
        assert_eq!(status, 200);
        let key1 = format!("{ROUTE}_{ROUTE}");
        let key = format!("{key1}.{RULE}_{RULE}");
        let line = format!(
            "ratelimit_service_rate_limit_total_hits{{domain=\"{DOMAIN}\",key=\"{key}\"}} 4"
        );
        assert!(samples(&body).contains(&line), "{line} in\n{body}");
        // Each series without its value.
        let keys: Vec<String> = samples(&body)
            .into_iter()
            .map(|line| line.rsplit_once(' ').unwrap().0.to_owned())
            .collect();
        series.push(keys);
    }
    assert_eq!(series[0], series[1]);
    assert!(series[0].contains(&"tollgate_server_decision_seconds_count".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_config_mode_the_flag_serves_the_references_mapping() {
    let files = Files::new();
    let config = Path::new(&files.root()).join("config/gateway.yaml");
    let server = Server::start_with(&config, &["--prometheus-addr", "127.0.0.1:0"]);
    let client = server.client().await;
    client.ask(DOMAIN, &[&[(OTHER, OTHER)]]).await;
    let (status, body) = http_get(prometheus_addr(&server), "/metrics");
    assert_eq!(status, 200);
    let line = format!(
        "ratelimit_service_rate_limit_total_hits{{domain=\"{DOMAIN}\",key1=\"{OTHER}_{OTHER}\"}} 1"
    );
    assert!(samples(&body).contains(&line), "{line} in\n{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapping_file_that_cannot_be_used_stops_the_start_naming_it() {
    let files = Files::new();
    let root = files.root();
    for (text, says) in [
        // Not YAML: the parser's place.
        (
            "mappings:\n  - match: \"a.*\"\n    labels: { domain: \"$1\"\n",
            ":4:1: ",
        ),
        // YAML, but not a mapping file.
        (
            "mappings:\n  - match: \"a.*\"\n    labels: [domain]\n",
            ":3:13: mappings[0].labels: invalid type: sequence, expected a map",
        ),
        // YAML, but a regular expression that does not compile: the mapping's place.
        (
            "mappings:\n  - match: \"a.*\"\n    name: a\n  - match: \"(\"\n    match_type: regex\n    name: b\n",
            ":4:12: mappings[1].match: invalid regex",
        ),
    ] {
        let path = files.mapping(text);
        let mapping = path.display().to_string();
        let (status, stderr) = run_to_exit_env(&gateway_env(&root, Some(&mapping)));
        assert!(!status.success(), "{stderr}");
        let expected = format!("PROMETHEUS_MAPPER_YAML: {mapping}{says}");
        assert!(stderr.contains(&expected), "{expected} in {stderr}");
    }
    let missing = files.dir.path().join("absent.yaml").display().to_string();
    let (status, stderr) = run_to_exit_env(&gateway_env(&root, Some(&missing)));
    assert!(!status.success());
    assert!(
        stderr.contains(&format!(
            "PROMETHEUS_MAPPER_YAML={missing:?}: cannot read it"
        )),
        "{stderr}"
    );
}
