//! The guide's `tollgate-server` command (`src/guide/server.md`, once the README's), on the
//! configuration the repository ships.

use std::path::Path;

use tollgate_server::service::protocol::code;
use tollgate_server::unit::Unit;

use crate::support::Server;

/// The guide starts the server on `examples/ratelimit/config/` (issue 39: it named a directory
/// the repository did not have). That directory ships, and a server started on it, on free ports
/// rather than the guide's defaults, answers with its limits.
#[tokio::test]
async fn the_readmes_server_command_serves_the_shipped_configuration() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let readme = std::fs::read_to_string(root.join("src/guide/server.md")).unwrap();
    let dir = "examples/ratelimit/config/";
    let command = format!("cargo run --release -p tollgate-server -- --config {dir}");
    assert!(
        readme.lines().any(|line| line == command),
        "the guide no longer runs `{command}`"
    );
    let server = Server::start(&root.join(dir));
    let client = server.client().await;

    // Every address: 60 a minute.
    let answer = client
        .ask("edge", &[&[("remote_address", "192.0.2.1")]])
        .await;
    assert_eq!(answer.overall_code, code::OK);
    let status = &answer.statuses[0];
    let limit = status.current_limit.as_ref().expect("a limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (60, Unit::Minute as i32)
    );
    assert_eq!(status.limit_remaining, 59);

    // The health checker's address: unlimited.
    let health = client
        .ask("edge", &[&[("remote_address", "10.0.0.5")]])
        .await;
    assert_eq!(health.overall_code, code::OK);
    assert_eq!(health.statuses[0].limit_remaining, u32::MAX);
    assert_eq!(health.statuses[0].current_limit, None);

    // Exports: 5 an hour per address, the nested descriptor's limit.
    let export = [("generic_key", "export"), ("remote_address", "192.0.2.1")];
    let answer = client.ask("edge", &[&export]).await;
    assert_eq!(answer.overall_code, code::OK);
    let limit = answer.statuses[0].current_limit.as_ref().expect("a limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (5, Unit::Hour as i32)
    );
    assert_eq!(answer.statuses[0].limit_remaining, 4);

    assert_eq!(server.get("/healthcheck"), (200, "OK\n".to_owned()));
}
