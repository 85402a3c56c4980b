//! Hot reload: a changed file takes over while calls flow; a bad one keeps the rules in force.

use tollgate_server::service::protocol::RateLimitResponse;

use crate::support::{ConfigDir, Server};

fn limit(answer: &RateLimitResponse) -> u32 {
    answer.statuses[0]
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit)
}

fn config(per_unit: u32) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {{ unit: year, requests_per_unit: {per_unit} }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_takes_over_and_a_bad_one_changes_nothing() {
    let dir = ConfigDir::new();
    let path = dir.write("edge.yaml", &config(3));
    let mut server = Server::start(&path);
    let client = server.client().await;
    let ask = || client.ask("edge", &[&[("remote_address", "10.0.0.1")]]);
    assert_eq!(limit(&ask().await), 3);

    dir.write("edge.yaml", &config(5));
    server.wait_for_log("configuration reloaded");
    let answer = ask().await;
    assert_eq!(limit(&answer), 5);
    // The new rules decide on the store in force: the key's count of 1 is kept.
    assert_eq!(answer.statuses[0].limit_remaining, 3);
    // The statistics of a key go on counting across the reload: a counter never restarts.
    let hits = r#"ratelimit_service_rate_limit_total_hits{domain="edge",key="remote_address"}"#;
    assert_eq!(server.metric(hits), 2);

    dir.write("edge.yaml", "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n");
    let warning = server.wait_for_log("configuration not reloaded");
    assert!(
        warning.contains("edge.yaml:4:25: descriptors[0].rate_limit.unit: unknown unit"),
        "{warning}"
    );
    let answer = ask().await;
    assert_eq!(limit(&answer), 5);
    assert_eq!(answer.statuses[0].limit_remaining, 2);
    assert_eq!(server.metric(hits), 3);
    assert_eq!(
        server.metric("tollgate_server_config_reload_failures_total"),
        1
    );
    assert_eq!(server.metric("tollgate_server_config_reloads_total"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_added_to_a_directory_adds_its_domain() {
    let dir = ConfigDir::new();
    dir.write("edge.yaml", &config(3));
    let mut server = Server::start(dir.dir.path());
    let client = server.client().await;
    let other = || client.ask("other", &[&[("k", "v")]]);
    assert_eq!(other().await.statuses[0].current_limit, None);
    dir.write(
        "other.yaml",
        "domain: other\ndescriptors:\n  - key: k\n    rate_limit: { unit: year, requests_per_unit: 9 }\n",
    );
    server.wait_for_log("configuration reloaded");
    assert_eq!(limit(&other().await), 9);
    assert_eq!(
        limit(&client.ask("edge", &[&[("remote_address", "a")]]).await),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_directory_is_said_to_be_one_and_emptying_it_keeps_the_limits() {
    let dir = ConfigDir::new();
    let mut server = Server::start(dir.dir.path());
    // The warning comes before the server says it serves.
    assert!(
        server.log.iter().any(|line| line.contains("WARN")
            && line.contains("holds no configuration file (*.yaml, *.yml)")),
        "{:#?}",
        server.log
    );
    let path = dir.write("edge.yaml", &config(3));
    server.wait_for_log("configuration reloaded");
    let client = server.client().await;
    let ask = || client.ask("edge", &[&[("remote_address", "10.0.0.1")]]);
    assert_eq!(limit(&ask().await), 3);

    // The file removed (a ConfigMap swapped badly): the limits in force stay, said once.
    std::fs::remove_file(&path).unwrap();
    let warning = server.wait_for_log("configuration not reloaded");
    assert!(warning.contains("holds no configuration file"), "{warning}");
    assert_eq!(limit(&ask().await), 3);
    assert_eq!(
        server.metric("tollgate_server_config_reload_failures_total"),
        1
    );
}
