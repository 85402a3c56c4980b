//! Statistics pushed to a statsd server the test runs (a TCP listener, a UDP socket), read
//! line by line until what the calls made arrives: the reference service's names, values and
//! types, which Envoy Gateway's statsd-exporter mapping turns into its series.

use std::collections::BTreeMap;

use tokio::io::AsyncBufReadExt;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::time::Instant;
use tollgate_server::service::protocol::{code, RateLimitRequest};

use crate::support::{request, ConfigDir, Server, DEADLINE};

/// Every kind of name: a key alone, a detailed key holding an address, two levels in shadow
/// mode.
const SHOP: &str = "\
domain: shop
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: client_ip
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: plan
    value: free
    descriptors:
      - key: user
        shadow_mode: true
        rate_limit: { unit: minute, requests_per_unit: 1 }
";

const HITS: &str = "ratelimit.service.rate_limit.shop.remote_address";
const TIMER: &str = "ratelimit_server.ShouldRateLimit.response_time";

/// What a statsd server received: counters summed by name, timers' values by name.
#[derive(Debug, Default)]
struct Received {
    counters: BTreeMap<String, u64>,
    timers: BTreeMap<String, Vec<u64>>,
    lines: Vec<String>,
}

impl Received {
    /// Takes one line, which must be `name:value|c` or `name:value|ms`.
    fn take(&mut self, line: &str) {
        let (name, rest) = line.rsplit_once(':').unwrap_or_else(|| panic!("{line:?}"));
        let (value, kind) = rest.split_once('|').unwrap_or_else(|| panic!("{line:?}"));
        let value: u64 = value.parse().unwrap_or_else(|_| panic!("{line:?}"));
        match kind {
            "c" => *self.counters.entry(name.to_owned()).or_default() += value,
            "ms" => self.timers.entry(name.to_owned()).or_default().push(value),
            _ => panic!("neither a counter nor a timer: {line:?}"),
        }
        self.lines.push(line.to_owned());
    }

    /// Whether every expected counter and timer count has been reached.
    fn reached(&self, counters: &BTreeMap<String, u64>, timers: &BTreeMap<String, usize>) -> bool {
        counters
            .iter()
            .all(|(name, want)| self.counters.get(name).copied().unwrap_or(0) >= *want)
            && timers
                .iter()
                .all(|(name, want)| self.timers.get(name).map_or(0, Vec::len) >= *want)
    }
}

/// A statsd server on a loopback port.
enum Statsd {
    Tcp {
        listener: TcpListener,
        connection: Option<tokio::io::Lines<tokio::io::BufReader<TcpStream>>>,
    },
    Udp(UdpSocket),
}

impl Statsd {
    async fn tcp() -> Statsd {
        Statsd::Tcp {
            listener: TcpListener::bind("127.0.0.1:0").await.unwrap(),
            connection: None,
        }
    }

    async fn udp() -> Statsd {
        Statsd::Udp(UdpSocket::bind("127.0.0.1:0").await.unwrap())
    }

    fn port(&self) -> u16 {
        match self {
            Statsd::Tcp { listener, .. } => listener.local_addr().unwrap().port(),
            Statsd::Udp(socket) => socket.local_addr().unwrap().port(),
        }
    }

    /// The next lines received (a datagram's, or one line over TCP), or none by `deadline`.
    async fn next(&mut self, deadline: Instant) -> Option<Vec<String>> {
        match self {
            Statsd::Udp(socket) => {
                let mut datagram = vec![0; 65_536];
                let n = tokio::time::timeout_at(deadline, socket.recv(&mut datagram))
                    .await
                    .ok()?
                    .unwrap();
                let text = String::from_utf8(datagram[..n].to_vec()).unwrap();
                assert!(text.ends_with('\n'), "whole lines per datagram: {text:?}");
                assert!(n <= 1432, "a datagram of {n} bytes");
                Some(text.lines().map(str::to_owned).collect())
            }
            Statsd::Tcp {
                listener,
                connection,
            } => loop {
                if let Some(lines) = connection {
                    match tokio::time::timeout_at(deadline, lines.next_line()).await {
                        Err(_) => return None,
                        Ok(Ok(Some(line))) => return Some(vec![line]),
                        // The server closed its connection: it opens another.
                        Ok(_) => *connection = None,
                    }
                } else {
                    let (stream, _) = tokio::time::timeout_at(deadline, listener.accept())
                        .await
                        .ok()?
                        .unwrap();
                    *connection = Some(tokio::io::BufReader::new(stream).lines());
                }
            },
        }
    }

    /// Reads until the counters sum to at least `counters` and the timers have as many
    /// values as `timers` (bounded by the tests' deadline), then returns all received.
    async fn until(&mut self, counters: &[(&str, u64)], timers: &[(&str, usize)]) -> Received {
        let counters: BTreeMap<String, u64> = counters
            .iter()
            .map(|(n, v)| ((*n).to_owned(), *v))
            .collect();
        let timers: BTreeMap<String, usize> =
            timers.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect();
        let deadline = Instant::now() + DEADLINE;
        let mut received = Received::default();
        while !received.reached(&counters, &timers) {
            let Some(lines) = self.next(deadline).await else {
                panic!(
                    "not received within {DEADLINE:?}: {counters:?} {timers:?}; received:\n{}",
                    received.lines.join("\n")
                );
            };
            for line in lines {
                received.take(&line);
            }
        }
        received
    }
}

fn start(config: &std::path::Path, statsd: &Statsd, extra: &[&str]) -> Server {
    let address = format!("127.0.0.1:{}", statsd.port());
    let mut args = vec![
        "--statsd-addr",
        address.as_str(),
        "--stats-flush-interval-ms",
        "100",
    ];
    args.extend_from_slice(extra);
    Server::start_with(config, &args)
}

/// The calls of the first test, and the counters they make.
async fn shop_calls(server: &Server) -> (Vec<(String, u64)>, usize) {
    let client = server.client().await;
    for _ in 0..3 {
        client
            .ask("shop", &[&[("remote_address", "10.0.0.1")]])
            .await;
    }
    client.ask("shop", &[&[("client_ip", "10.1.2.3")]]).await;
    for _ in 0..2 {
        let answer = client
            .ask("shop", &[&[("plan", "free"), ("user", "ann")]])
            .await;
        assert_eq!(answer.overall_code, code::OK, "shadow mode never refuses");
    }
    client.ask("nowhere", &[&[("a", "1")], &[("b", "2")]]).await;
    let refused = client
        .call(RateLimitRequest {
            domain: Vec::new(),
            ..request("shop", &[&[("remote_address", "x")]])
        })
        .await;
    assert_eq!(refused.unwrap_err().code(), tonic::Code::InvalidArgument);
    let rl = "ratelimit.service.rate_limit.shop";
    let expected = [
        (format!("{HITS}.total_hits"), 3),
        (format!("{HITS}.within_limit"), 2),
        (format!("{HITS}.over_limit"), 1),
        // Remaining 0 of 2 after the second call: within a fifth of the limit.
        (format!("{HITS}.near_limit"), 1),
        // detailed_metric: the value is in the name, its address's dots made `_`.
        (format!("{rl}.client_ip_10_1_2_3.total_hits"), 1),
        (format!("{rl}.client_ip_10_1_2_3.within_limit"), 1),
        (format!("{rl}.plan_free.user.total_hits"), 2),
        (format!("{rl}.plan_free.user.within_limit"), 1),
        (format!("{rl}.plan_free.user.near_limit"), 1),
        (format!("{rl}.plan_free.user.over_limit"), 1),
        (format!("{rl}.plan_free.user.shadow_mode"), 1),
        // Once per descriptor, as the reference.
        (
            "ratelimit.service.rate_limit.nowhere.domain_not_found".into(),
            2,
        ),
        (
            "ratelimit.service.call.should_rate_limit.service_error".into(),
            1,
        ),
        ("ratelimit.service.config_load_success".into(), 1),
        ("ratelimit_server.ShouldRateLimit.total_requests".into(), 8),
    ];
    (expected.to_vec(), 8)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_lines_carry_the_reference_names_values_and_types() {
    let dir = ConfigDir::new();
    let mut statsd = Statsd::tcp().await;
    let server = start(&dir.write("shop.yaml", SHOP), &statsd, &[]);
    let (expected, calls) = shop_calls(&server).await;
    let counters: Vec<(&str, u64)> = expected.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    let received = statsd.until(&counters, &[(TIMER, calls)]).await;
    let expected: BTreeMap<String, u64> = expected.into_iter().collect();
    assert_eq!(received.counters, expected, "{:#?}", received.lines);
    // One timer value per call, whole milliseconds, and no other timer.
    assert_eq!(received.timers.keys().collect::<Vec<_>>(), [TIMER]);
    assert_eq!(received.timers[TIMER].len(), calls);
    assert!(received.timers[TIMER].iter().all(|ms| *ms < 5_000));
    // The names map as Envoy Gateway's exporter maps the reference's.
    check_gateway_mapping(&received);
    // Prometheus is unchanged beside it.
    assert_eq!(
        server.metric(
            "ratelimit_service_rate_limit_total_hits{domain=\"shop\",key=\"remote_address\"}"
        ),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_datagrams_with_extra_tags() {
    let dir = ConfigDir::new();
    let mut statsd = Statsd::udp().await;
    let server = start(
        &dir.write("shop.yaml", SHOP),
        &statsd,
        &[
            "--statsd-udp",
            "--statsd-extra-tag",
            "version:1.2",
            "--statsd-extra-tag",
            "app:rl",
        ],
    );
    let client = server.client().await;
    for _ in 0..3 {
        client
            .ask("shop", &[&[("remote_address", "10.0.0.1")]])
            .await;
    }
    // Tags are appended to every name, sorted by key, dots in values made `_` (gostats).
    let tags = ".__app=rl.__version=1_2";
    let counters = [
        (format!("{HITS}.total_hits{tags}"), 3),
        (format!("{HITS}.within_limit{tags}"), 2),
        (format!("{HITS}.over_limit{tags}"), 1),
        (format!("{HITS}.near_limit{tags}"), 1),
        (format!("ratelimit.service.config_load_success{tags}"), 1),
        (
            format!("ratelimit_server.ShouldRateLimit.total_requests{tags}"),
            3,
        ),
    ];
    let wanted: Vec<(&str, u64)> = counters.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    let timer = format!("{TIMER}{tags}");
    let received = statsd.until(&wanted, &[(&timer, 3)]).await;
    assert_eq!(
        received.counters,
        counters.into_iter().collect::<BTreeMap<_, _>>()
    );
    assert_eq!(received.timers[&timer].len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_with_nothing_listening_then_something() {
    let dir = ConfigDir::new();
    // A port nothing listens on, until the test listens there.
    let port = Statsd::udp().await.port();
    let address = format!("127.0.0.1:{port}");
    let mut server = Server::start_with(
        &dir.write("shop.yaml", SHOP),
        &[
            "--statsd-addr",
            &address,
            "--statsd-udp",
            "--stats-flush-interval-ms",
            "20",
        ],
    );
    let client = server.client().await;
    // Calls keep coming (and keep being answered) while the datagrams are refused.
    let calls = tokio::spawn(async move {
        loop {
            let answer = client
                .ask("shop", &[&[("remote_address", "10.0.0.1")]])
                .await;
            assert_eq!(answer.statuses.len(), 1);
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    });
    let warning = server.wait_for_log("statsd: datagrams refused");
    assert!(warning.contains("WARN"), "{warning}");
    let mut statsd = Statsd::Udp(UdpSocket::bind(("127.0.0.1", port)).await.unwrap());
    statsd
        .until(&[(&format!("{HITS}.total_hits"), 1)], &[])
        .await;
    calls.abort();
    assert!(
        calls.await.unwrap_err().is_cancelled(),
        "every call answered"
    );
    assert!(server.metric("tollgate_server_statsd_lines_dropped_total") > 0);
    server.terminate();
    assert!(server.wait_exit().success());
    // Told once, and no outage flapping: a datagram socket has nothing to open again.
    let told = |text: &str| server.log.iter().filter(|l| l.contains(text)).count();
    assert_eq!(told("datagrams refused"), 1, "{:#?}", server.log);
    assert_eq!(told("statistics cannot be sent"), 0, "{:#?}", server.log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_connection_lost_then_sent_again() {
    let dir = ConfigDir::new();
    let mut statsd = Statsd::tcp().await;
    let port = statsd.port();
    let mut server = start(&dir.write("shop.yaml", SHOP), &statsd, &[]);
    let client = server.client().await;
    client
        .ask("shop", &[&[("remote_address", "10.0.0.1")]])
        .await;
    statsd
        .until(&[(&format!("{HITS}.total_hits"), 1)], &[])
        .await;

    // The statsd server goes away and comes back on the same port.
    drop(statsd);
    let mut statsd = Statsd::Tcp {
        listener: TcpListener::bind(("127.0.0.1", port)).await.unwrap(),
        connection: None,
    };
    let warning = server.wait_for_log("statsd: statistics cannot be sent");
    assert!(warning.contains("WARN"), "{warning}");
    server.wait_for_log("statsd: statistics are sent again");
    client
        .ask("shop", &[&[("remote_address", "10.0.0.1")]])
        .await;
    let (hits, within) = (format!("{HITS}.total_hits"), format!("{HITS}.within_limit"));
    let received = statsd
        .until(&[(&hits, 1), (&within, 1)], &[(TIMER, 1)])
        .await;
    // Only what changed since the last flush that left: nothing counted twice.
    assert_eq!(received.counters[&hits], 1);
    assert_eq!(received.counters[&within], 1);
    let warnings = server
        .log
        .iter()
        .filter(|l| l.contains("statistics cannot be sent"))
        .count();
    assert_eq!(warnings, 1, "{:#?}", server.log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_loads_are_counted_and_the_last_counts_leave_on_sigterm() {
    let dir = ConfigDir::new();
    let mut statsd = Statsd::tcp().await;
    let path = dir.write("shop.yaml", SHOP);
    let address = format!("127.0.0.1:{}", statsd.port());
    // No counter flush comes in the test's time: what arrives is the drain's last flush.
    let mut server = Server::start_with(
        &path,
        &[
            "--statsd-addr",
            &address,
            "--stats-flush-interval-ms",
            "3600000",
        ],
    );
    dir.write("shop.yaml", "domain: shop\ndescriptors: [");
    server.wait_for_log("configuration not reloaded");
    dir.write(
        "shop.yaml",
        &SHOP.replace("requests_per_unit: 2", "requests_per_unit: 3"),
    );
    server.wait_for_log("configuration reloaded");
    let client = server.client().await;
    client
        .ask("shop", &[&[("remote_address", "10.0.0.1")]])
        .await;
    server.terminate();
    let received = statsd
        .until(
            &[
                ("ratelimit.service.config_load_success", 2),
                ("ratelimit.service.config_load_error", 1),
                ("ratelimit_server.ShouldRateLimit.total_requests", 1),
                (&format!("{HITS}.within_limit"), 1),
            ],
            &[],
        )
        .await;
    assert_eq!(
        received.counters["ratelimit.service.config_load_success"],
        2
    );
    assert!(server.wait_exit().success(), "{:#?}", server.log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_store_call_is_the_references_redis_error() {
    let dir = ConfigDir::new();
    dir.write("shop.yaml", SHOP);
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.write(
        "open.toml",
        &format!(
            "domain = \"other\"\nreference = [\"shop.yaml\"]\nrules = []\n\n[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{closed_port}\"\non_failure = \"open\"\n"
        ),
    );
    let mut statsd = Statsd::tcp().await;
    let server = start(&config, &statsd, &[]);
    let client = server.client().await;
    for _ in 0..2 {
        let answer = client
            .ask("shop", &[&[("remote_address", "10.0.0.1")]])
            .await;
        assert_eq!(answer.overall_code, code::OK, "failing open");
    }
    let received = statsd
        .until(
            &[
                ("ratelimit.service.call.should_rate_limit.redis_error", 2),
                ("ratelimit_server.ShouldRateLimit.total_requests", 2),
            ],
            &[(TIMER, 2)],
        )
        .await;
    assert_eq!(
        received.counters["ratelimit.service.call.should_rate_limit.redis_error"],
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_does_not_resolve_is_one_warning_and_calls_are_answered() {
    let dir = ConfigDir::new();
    let mut server = Server::start_with(
        &dir.write("shop.yaml", SHOP),
        &[
            "--statsd-addr",
            "statsd.invalid:8125",
            "--stats-flush-interval-ms",
            "20",
        ],
    );
    let warning = server.wait_for_log("statsd: statistics cannot be sent");
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        warning.contains("cannot resolve statsd.invalid"),
        "{warning}"
    );
    let client = server.client().await;
    for _ in 0..3 {
        let answer = client
            .ask("shop", &[&[("remote_address", "10.0.0.1")]])
            .await;
        assert_eq!(answer.statuses.len(), 1);
    }
    assert_eq!(server.get("/healthcheck").0, 200);
    server.terminate();
    assert!(server.wait_exit().success(), "{:#?}", server.log);
    let warnings = server
        .log
        .iter()
        .filter(|l| l.contains("statsd: statistics cannot be sent"))
        .count();
    assert_eq!(
        warnings, 1,
        "one warning, however many retries: {:#?}",
        server.log
    );
    assert!(
        !server.log.iter().any(|l| l.contains("panicked")),
        "{:#?}",
        server.log
    );
}

/// How Envoy Gateway's statsd exporter maps the reference's names
/// (`internal/infrastructure/kubernetes/ratelimit/statsd_conf.yaml`): its patterns, copied as
/// data, in its order; the first that matches names the series.
struct Mapping {
    /// A glob (`*` is one dot-separated part) or, with `regex`, a regular expression.
    pattern: &'static str,
    regex: bool,
    /// `match_metric_type: counter`: only counters.
    counter_only: bool,
    name: &'static str,
    labels: &'static [(&'static str, &'static str)],
}

const GATEWAY: &[Mapping] = &[
    Mapping {
        pattern: "ratelimit.service.rate_limit.*.*.near_limit",
        regex: false,
        counter_only: false,
        name: "ratelimit_service_rate_limit_near_limit",
        labels: &[("domain", "$1"), ("key1", "$2")],
    },
    Mapping {
        pattern: "ratelimit.service.rate_limit.*.*.over_limit",
        regex: false,
        counter_only: false,
        name: "ratelimit_service_rate_limit_over_limit",
        labels: &[("domain", "$1"), ("key1", "$2")],
    },
    Mapping {
        pattern: "ratelimit.service.rate_limit.*.*.total_hits",
        regex: false,
        counter_only: false,
        name: "ratelimit_service_rate_limit_total_hits",
        labels: &[("domain", "$1"), ("key1", "$2")],
    },
    Mapping {
        pattern: "ratelimit.service.rate_limit.*.*.within_limit",
        regex: false,
        counter_only: false,
        name: "ratelimit_service_rate_limit_within_limit",
        labels: &[("domain", "$1"), ("key1", "$2")],
    },
    Mapping {
        pattern: "ratelimit.service.rate_limit.*.*.shadow_mode",
        regex: false,
        counter_only: false,
        name: "ratelimit_service_rate_limit_shadow_mode",
        labels: &[("domain", "$1"), ("key1", "$2")],
    },
    Mapping {
        pattern: r"ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.near_limit",
        regex: true,
        counter_only: false,
        name: "ratelimit_service_rate_limit_near_limit",
        labels: &[("domain", "$1"), ("key1", "$2"), ("key2", "$3")],
    },
    Mapping {
        pattern: r"ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.over_limit",
        regex: true,
        counter_only: false,
        name: "ratelimit_service_rate_limit_over_limit",
        labels: &[("domain", "$1"), ("key1", "$2"), ("key2", "$3")],
    },
    Mapping {
        pattern: r"ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.total_hits",
        regex: true,
        counter_only: false,
        name: "ratelimit_service_rate_limit_total_hits",
        labels: &[("domain", "$1"), ("key1", "$2"), ("key2", "$3")],
    },
    Mapping {
        pattern: r"ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.within_limit",
        regex: true,
        counter_only: false,
        name: "ratelimit_service_rate_limit_within_limit",
        labels: &[("domain", "$1"), ("key1", "$2"), ("key2", "$3")],
    },
    Mapping {
        pattern: r"ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.shadow_mode",
        regex: true,
        counter_only: false,
        name: "ratelimit_service_rate_limit_shadow_mode",
        labels: &[("domain", "$1"), ("key1", "$2"), ("key2", "$3")],
    },
    Mapping {
        pattern: "ratelimit.service.call.should_rate_limit.*",
        regex: false,
        counter_only: true,
        name: "ratelimit_service_should_rate_limit_error",
        labels: &[("err_type", "$1")],
    },
    Mapping {
        pattern: "ratelimit_server.*.total_requests",
        regex: false,
        counter_only: true,
        name: "ratelimit_service_total_requests",
        labels: &[("grpc_method", "$1")],
    },
    Mapping {
        pattern: "ratelimit_server.*.response_time",
        regex: false,
        counter_only: false,
        name: "ratelimit_service_response_time_seconds",
        labels: &[("grpc_method", "$1")],
    },
    Mapping {
        pattern: "ratelimit.service.config_load_success",
        regex: false,
        counter_only: true,
        name: "ratelimit_service_config_load_success",
        labels: &[],
    },
    Mapping {
        pattern: "ratelimit.service.config_load_error",
        regex: false,
        counter_only: true,
        name: "ratelimit_service_config_load_error",
        labels: &[],
    },
];

/// The series the mapping gives a statsd name of this type: its name and labels.
fn gateway_series(name: &str, counter: bool) -> Option<(&'static str, Vec<(String, String)>)> {
    for mapping in GATEWAY {
        if mapping.counter_only && !counter {
            continue;
        }
        // A glob's `*` is one part of the dotted name, and the whole name must match; a
        // regular expression is searched in the name, as the exporter does.
        let source = if mapping.regex {
            mapping.pattern.to_owned()
        } else {
            format!(
                "^{}$",
                mapping.pattern.replace('.', r"\.").replace('*', r"([^.]*)")
            )
        };
        let pattern = regex::Regex::new(&source).unwrap();
        let Some(captures) = pattern.captures(name) else {
            continue;
        };
        let labels = mapping
            .labels
            .iter()
            .map(|(label, value)| {
                let mut expanded = String::new();
                captures.expand(value, &mut expanded);
                ((*label).to_owned(), expanded)
            })
            .collect();
        return Some((mapping.name, labels));
    }
    None
}

fn check_gateway_mapping(received: &Received) {
    let labels = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let rl = "ratelimit.service.rate_limit.shop";
    for (name, counter, series, with) in [
        (
            format!("{rl}.remote_address.total_hits"),
            true,
            "ratelimit_service_rate_limit_total_hits",
            labels(&[("domain", "shop"), ("key1", "remote_address")]),
        ),
        (
            format!("{rl}.client_ip_10_1_2_3.within_limit"),
            true,
            "ratelimit_service_rate_limit_within_limit",
            labels(&[("domain", "shop"), ("key1", "client_ip_10_1_2_3")]),
        ),
        (
            format!("{rl}.plan_free.user.shadow_mode"),
            true,
            "ratelimit_service_rate_limit_shadow_mode",
            labels(&[("domain", "shop"), ("key1", "plan_free"), ("key2", "user")]),
        ),
        (
            "ratelimit.service.call.should_rate_limit.service_error".into(),
            true,
            "ratelimit_service_should_rate_limit_error",
            labels(&[("err_type", "service_error")]),
        ),
        (
            "ratelimit_server.ShouldRateLimit.total_requests".into(),
            true,
            "ratelimit_service_total_requests",
            labels(&[("grpc_method", "ShouldRateLimit")]),
        ),
        (
            TIMER.into(),
            false,
            "ratelimit_service_response_time_seconds",
            labels(&[("grpc_method", "ShouldRateLimit")]),
        ),
        (
            "ratelimit.service.config_load_success".into(),
            true,
            "ratelimit_service_config_load_success",
            Vec::new(),
        ),
    ] {
        assert_eq!(
            gateway_series(&name, counter),
            Some((series, with)),
            "{name}"
        );
    }
    // Every name sent is one the mapping knows, but `domain_not_found`, which it does not map
    // for the reference either.
    for name in received.counters.keys() {
        let mapped = gateway_series(name, true).is_some();
        assert_eq!(mapped, !name.ends_with(".domain_not_found"), "{name}");
    }
    for name in received.timers.keys() {
        assert!(gateway_series(name, false).is_some(), "{name}");
    }
}
