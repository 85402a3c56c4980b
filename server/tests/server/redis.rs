//! Two server processes sharing one real redis-server share one set of limits, exactly.

#[path = "../../../tests/support/redis_server.rs"]
mod redis_server;

use tollgate_server::service::protocol::code;

use crate::numbers::REFERENCE;
use crate::support::{ConfigDir, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_on_one_redis_admit_exactly_the_limit() {
    let redis = redis_server::RedisServer::start();
    let dir = ConfigDir::new();
    dir.write("edge.yaml", REFERENCE);
    let config = dir.write(
        "server.toml",
        &format!(
            "domain = \"shared\"\nreference = [\"edge.yaml\"]\n\n[store]\nkind = \"redis\"\nurl = \"{}\"\non_failure = \"closed\"\n\n[[rules]]\nname = \"shared\"\nalgorithm = \"sliding_log\"\nlimit = 10\nperiod = \"24h\"\ndescriptors = [{{ key = \"tenant\" }}]\n",
            redis.url()
        ),
    );
    let (a, b) = (Server::start(&config), Server::start(&config));
    let (a, b) = (a.client().await, b.client().await);
    let calls: Vec<_> = (0..40)
        .map(|i| {
            let client = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                // One descriptor of each form: a sliding log of tollgate's file and the
                // reference's fixed window (3 a year), charged together.
                let tenant = [("tenant", "acme")];
                client.ask("shared", &[&tenant]).await.overall_code
            })
        })
        .collect();
    let mut admitted = 0;
    for call in calls {
        if call.await.unwrap() == code::OK {
            admitted += 1;
        }
    }
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
}
