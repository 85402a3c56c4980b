//! Health, metrics, start-up failures and the drain on SIGTERM.

use std::net::TcpListener;

use tollgate_server::service::protocol::code;

use crate::numbers::REFERENCE;
use crate::support::{run_to_exit, Client, ConfigDir, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_over_http_and_grpc() {
    let dir = ConfigDir::new();
    let server = Server::start(&dir.write("edge.yaml", REFERENCE));
    assert_eq!(server.get("/healthcheck"), (200, "OK\n".to_owned()));
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let answer = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            answer.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_as_the_reference_names_them() {
    let dir = ConfigDir::new();
    let server = Server::start(&dir.write("edge.yaml", REFERENCE));
    let client = server.client().await;
    for _ in 0..5 {
        client
            .ask("edge", &[&[("remote_address", "10.0.0.1")]])
            .await;
    }
    let sample = |name: &str| {
        server.metric(&format!(
            "ratelimit_service_rate_limit_{name}{{domain=\"edge\",key=\"remote_address\"}}"
        ))
    };
    assert_eq!(sample("total_hits"), 5);
    assert_eq!(sample("within_limit"), 3);
    assert_eq!(sample("over_limit"), 2);
    // Remaining 0 of 3 after the third: within a fifth of the limit.
    assert_eq!(sample("near_limit"), 1);
    assert_eq!(sample("shadow_mode"), 0);
    assert_eq!(server.metric("tollgate_server_decision_seconds_count"), 5);
    assert_eq!(server.metric("tollgate_server_store_errors_total"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_under_load_exits_cleanly() {
    let dir = ConfigDir::new();
    let mut server = Server::start(&dir.write("edge.yaml", REFERENCE));
    let client = server.client().await;
    // Calls keep coming while the signal arrives. Those the server took are answered whole;
    // the others are refused at the connection (GOAWAY, or closed before they were sent: a
    // call Envoy retries elsewhere). A call held in flight through the drain: `redis.rs`.
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let client: Client = client.clone();
            tokio::spawn(async move {
                let address = format!("10.3.0.{}", i % 50);
                client
                    .call(crate::support::request(
                        "edge",
                        &[&[("remote_address", &address)]],
                    ))
                    .await
            })
        })
        .collect();
    server.terminate();
    for call in calls {
        if let Ok(answer) = call.await.unwrap() {
            assert!([code::OK, code::OVER_LIMIT].contains(&answer.overall_code));
            assert_eq!(answer.statuses.len(), 1);
        }
    }
    let status = server.wait_exit();
    assert!(status.success(), "{status:?}");
    assert!(server.log.iter().any(|l| l.contains("draining")));
    assert!(server.log.iter().any(|l| l.contains("stopped")));
}

#[test]
fn help_names_the_default_addresses_and_every_variable_read() {
    let output = std::process::Command::new(crate::support::BINARY)
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    assert!(help.contains("[default: 0.0.0.0:8081"), "{help}");
    assert!(help.contains("[default: 0.0.0.0:8080"), "{help}");
    for (variable, _) in tollgate_server::settings::READ {
        assert!(
            help.contains(&format!("  {variable} ")),
            "{variable}: {help}"
        );
    }
    for variable in [
        "RUNTIME_ROOT",
        "GRPC_SERVER_USE_TLS",
        "REDIS_URL",
        "QUOTA_MODE",
    ] {
        assert!(help.contains(variable), "{variable}");
    }
}

#[test]
fn start_up_failures_exit_with_a_clear_message() {
    let dir = ConfigDir::new();
    let bad = dir.write(
        "bad.yaml",
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: { unti: minute, requests_per_unit: 3 }\n",
    );
    let (status, stderr) = run_to_exit(&["--config", bad.to_str().unwrap()]);
    assert!(!status.success());
    assert!(stderr.contains("bad.yaml:4:"), "{stderr}");
    assert!(stderr.contains("unknown field `unti`"), "{stderr}");

    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let good = dir.write("edge.yaml", REFERENCE);
    let (status, stderr) = run_to_exit(&[
        "--config",
        good.to_str().unwrap(),
        "--grpc-addr",
        &port,
        "--http-addr",
        "127.0.0.1:0",
    ]);
    assert!(!status.success());
    assert!(
        stderr.contains(&format!("cannot listen for gRPC on {port}")),
        "{stderr}"
    );

    // Nothing listens on the Redis port, and the file says fail closed.
    let closed_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let redis = dir.write(
        "redis.toml",
        &format!(
            "domain = \"other\"\nreference = [\"edge.yaml\"]\nrules = []\n\n[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{closed_port}\"\non_failure = \"closed\"\n"
        ),
    );
    let (status, stderr) = run_to_exit(&[
        "--config",
        redis.to_str().unwrap(),
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
    ]);
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("redis.toml:7:7: store.url: rate-limit store unavailable"),
        "{stderr}"
    );
}

/// Failing open, the server starts while Redis cannot be reached and answers by its policy (OK,
/// no limit) until Redis can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_at_start_failing_open_the_server_starts_and_answers_ok() {
    let dir = ConfigDir::new();
    dir.write("edge.yaml", REFERENCE);
    let closed_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.write(
        "open.toml",
        &format!(
            "domain = \"other\"\nreference = [\"edge.yaml\"]\nrules = []\n\n[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{closed_port}\"\non_failure = \"open\"\n"
        ),
    );
    let mut server = Server::start(&config);
    let client = server.client().await;
    let answer = client.ask("edge", &[&[("remote_address", "a")]]).await;
    assert_eq!(answer.overall_code, code::OK);
    assert_eq!(server.get("/healthcheck").0, 200);

    // The outage is told in the store's bounded lines (one per 10 s with a count, and the
    // breaker's opening), not in one line per call.
    for _ in 0..40 {
        let answer = client.ask("edge", &[&[("remote_address", "a")]]).await;
        assert_eq!(answer.overall_code, code::OK);
    }
    assert_eq!(
        server.metric("tollgate_server_store_errors_total"),
        41,
        "every failed call is counted"
    );
    server.terminate();
    server.wait_for_log("tollgate-server: stopped");
    let warnings: Vec<&String> = server
        .log
        .iter()
        .filter(|line| line.contains("WARN"))
        .collect();
    assert!(
        (1..=3).contains(&warnings.len()),
        "{} warning lines for 41 calls: {warnings:#?}",
        warnings.len()
    );
}
