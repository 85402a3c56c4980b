//! Two server processes sharing one real redis-server share one set of limits, exactly.

use tollgate_server::service::protocol::code;

use crate::admin::{json, send, start_with_admin, TOKEN};
use crate::numbers::REFERENCE;
use crate::redis_server::{self, Engine};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_of_one_server_sees_and_lifts_blocks_made_by_another_on_redis() {
    blocks_across_servers(Engine::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_of_one_server_sees_and_lifts_blocks_made_by_another_on_valkey() {
    blocks_across_servers(Engine::Valkey).await;
}

/// Two servers on one server of `engine`, each from the same file: a key blocked by the first
/// one's penalty is listed, read and lifted through the second one's admin API, and the second
/// one's calls are then admitted.
async fn blocks_across_servers(engine: Engine) {
    let redis = redis_server::RedisServer::start_on(engine, &[]);
    let dir = ConfigDir::new();
    let config = dir.write(
        "login.toml",
        &format!(
            "domain = \"login\"\n[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\n\
             [[rules]]\nname = \"login\"\nrate = 1\nperiod = \"1h\"\nblock = \"10m\"\n\
             descriptors = [{{ key = \"user\" }}]\n",
            redis.url()
        ),
    );
    let server_a = Server::start(&config);
    let (server_b, admin_b) = start_with_admin(&config);
    let (a, b) = (server_a.client().await, server_b.client().await);
    let bearer = format!("Bearer {TOKEN}");
    let as_admin = |method: &str, path: &str| send(admin_b, method, path, Some(&bearer), "");

    let mallory = [("user", "mallory")];
    assert_eq!(a.ask("login", &[&mallory]).await.overall_code, code::OK);
    assert_eq!(
        a.ask("login", &[&mallory]).await.overall_code,
        code::OVER_LIMIT
    );
    let refused = send(admin_b, "GET", "/_tollgate/blocks/login", None, "");
    assert_eq!(refused.status, 401);

    let listed = as_admin("GET", "/_tollgate/blocks/login");
    assert_eq!(listed.status, 200, "{}", listed.body);
    let listed = json(&listed);
    let blocks = listed["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 1, "{listed}");
    assert_eq!(blocks[0]["key"], "mallory");
    assert_eq!(blocks[0]["offences"], 1);
    let left = blocks[0]["remaining_ms"].as_u64().unwrap();
    assert!((540_000..=600_000).contains(&left), "{listed}");
    assert!(listed["next"].is_null(), "{listed}");

    // B's calls see the block on its first decision about the key.
    assert_eq!(
        b.ask("login", &[&mallory]).await.overall_code,
        code::OVER_LIMIT
    );
    let one = "/_tollgate/blocks/login/mallory";
    assert_eq!(as_admin("GET", one).status, 200);
    assert_eq!(as_admin("DELETE", one).status, 204);
    assert_eq!(as_admin("GET", one).status, 404);
    // Lifted: nothing is listed. (Mallory's hour still holds no unit, and the offences were
    // forgotten with the block: the next call is denied by the counter, a first offence.)
    let listed = as_admin("GET", "/_tollgate/blocks/login");
    assert_eq!(listed.status, 200);
    assert_eq!(json(&listed)["blocks"], serde_json::json!([]));

    // A key blocked by hand on the same store (a limiter of the same file), with its unit
    // unspent: B denies it at once, and admits it once B's admin API has lifted the block.
    let loaded = tollgate_server::load::load(&config).unwrap();
    let by_hand = loaded.connect(&config).await.unwrap();
    by_hand
        .block("login", "eve", std::time::Duration::from_secs(600))
        .await
        .unwrap();
    let eve = [("user", "eve")];
    assert_eq!(b.ask("login", &[&eve]).await.overall_code, code::OVER_LIMIT);
    let read = as_admin("GET", "/_tollgate/blocks/login/eve");
    assert_eq!(read.status, 200, "{}", read.body);
    assert_eq!(
        as_admin("DELETE", "/_tollgate/blocks/login/eve").status,
        204
    );
    assert_eq!(b.ask("login", &[&eve]).await.overall_code, code::OK);
}
