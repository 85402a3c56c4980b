//! Two server processes on one real Postgres share one set of limits, exactly, and keep them
//! when the servers go: a file's `[store]` of kind `postgres`.

use tollgate_server::service::protocol::code;

use crate::numbers::REFERENCE;
use crate::postgres_server::PgServer;
use crate::support::{ConfigDir, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_on_one_postgres_admit_exactly_the_limit_and_keep_it() {
    let postgres = PgServer::start().await;
    let dir = ConfigDir::new();
    dir.write("edge.yaml", REFERENCE);
    let config = dir.write(
        "shared.toml",
        &format!(
            "domain = \"shared\"\nreference = [\"edge.yaml\"]\n\n[store]\nkind = \"postgres\"\n\
             url = \"{}\"\ncreate_schema = true\non_failure = \"closed\"\ntimeout = \"10s\"\n\n\
             [[rules]]\nname = \"shared\"\nalgorithm = \"sliding_log\"\nlimit = 10\n\
             period = \"24h\"\ndescriptors = [{{ key = \"tenant\" }}]\n",
            postgres.url()
        ),
    );
    let (server_a, server_b) = (Server::start(&config), Server::start(&config));
    let (a, b) = (server_a.client().await, server_b.client().await);
    let calls: Vec<_> = (0..30)
        .map(|i| {
            let client = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
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
    // Both servers gone, a new one reads the same counts from the database.
    drop((a, b, server_a, server_b));
    let server_c = Server::start(&config);
    let c = server_c.client().await;
    let tenant = [("tenant", "acme")];
    assert_eq!(
        c.ask("shared", &[&tenant]).await.overall_code,
        code::OVER_LIMIT
    );
}
