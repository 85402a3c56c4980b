//! Two server processes sharing one real redis-server share one set of limits, exactly.

use tollgate_server::service::protocol::code;

use crate::numbers::REFERENCE;
use crate::redis_server;
use crate::support::{admitted_alternating, shared_store_file, ConfigDir, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_on_one_redis_admit_exactly_the_limit() {
    let mut redis = redis_server::RedisServer::start();
    let dir = ConfigDir::new();
    dir.write("edge.yaml", REFERENCE);
    let config = |name: &str, on_failure: &str| {
        dir.write(
            name,
            &shared_store_file("redis", &redis.url(), "", on_failure),
        )
    };
    let closed = config("closed.toml", "closed");
    let (server_a, server_b) = (Server::start(&closed), Server::start(&closed));
    let open = Server::start(&config("open.toml", "open"));
    let (a, b) = (server_a.client().await, server_b.client().await);
    // Charged through both servers at once: a sliding log of tollgate's file.
    let admitted = admitted_alternating(&a, &b, 40).await;
    assert_eq!(admitted, 10);
    // The reference form's limits are shared too.
    let mut reference = Vec::new();
    for client in [&a, &b, &a, &b] {
        let answer = client
            .ask("edge", &[&[("remote_address", "10.0.0.1")]])
            .await;
        reference.push(answer.overall_code);
    }
    assert_eq!(reference, [code::OK, code::OK, code::OK, code::OVER_LIMIT]);

    // The store gone: each server answers by its file's failure policy, and counts the failure.
    redis.kill();
    let fresh = [("tenant", "globex")];
    assert_eq!(
        a.ask("shared", &[&fresh]).await.overall_code,
        code::OVER_LIMIT
    );
    let answer = open.client().await.ask("shared", &[&fresh]).await;
    assert_eq!(answer.overall_code, code::OK);
    assert_eq!(answer.statuses[0].current_limit, None);
    assert!(server_a.metric("tollgate_server_store_errors_total") >= 1);
    assert!(open.metric("tollgate_server_store_errors_total") >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_a_call_in_flight() {
    let redis = redis_server::RedisServer::start();
    let dir = ConfigDir::new();
    dir.write("edge.yaml", REFERENCE);
    let config = dir.write(
        "server.toml",
        &format!(
            "domain = \"shared\"\nreference = [\"edge.yaml\"]\nrules = []\n\n[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"60s\"\n",
            redis.url()
        ),
    );
    let mut server = Server::start(&config);
    let client = server.client().await;
    let ask = move || async move {
        client
            .ask("edge", &[&[("remote_address", "10.0.0.1")]])
            .await
    };
    assert_eq!(ask.clone()().await.overall_code, code::OK);

    // The store frozen, a call waits on it inside the server.
    redis.pause();
    let call = tokio::spawn(ask());
    let deadline = std::time::Instant::now() + crate::support::DEADLINE;
    while server.metric("tollgate_server_calls_in_flight") != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the call never reached the server"
        );
        tokio::task::yield_now().await;
    }
    server.terminate();
    server.wait_for_log("draining");
    assert!(
        server.is_running(),
        "the server left a call in flight behind"
    );
    // Meanwhile a load balancer's health check is told to stop sending.
    assert_eq!(server.get("/healthcheck").0, 503);

    // Once the store answers, the call is answered, and only then does the server stop.
    redis.resume();
    let answer = call.await.unwrap();
    assert_eq!(answer.overall_code, code::OK);
    assert_eq!(answer.statuses[0].limit_remaining, 1);
    assert!(server.wait_exit().success());
}
