//! Two server processes on one real Postgres share one set of limits, exactly, and keep them
//! when the servers go: a file's `[store]` of kind `postgres`.

use tollgate_server::service::protocol::code;

use crate::numbers::REFERENCE;
use crate::postgres_server::PgServer;
use crate::support::{admitted_alternating, shared_store_file, ConfigDir, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_on_one_postgres_admit_exactly_the_limit_and_keep_it() {
    let postgres = PgServer::start().await;
    let dir = ConfigDir::new();
    dir.write("edge.yaml", REFERENCE);
    let config = dir.write(
        "shared.toml",
        &shared_store_file(
            "postgres",
            &postgres.url(),
            "create_schema = true\n",
            "closed",
        ),
    );
    let (server_a, server_b) = (Server::start(&config), Server::start(&config));
    let (a, b) = (server_a.client().await, server_b.client().await);
    let admitted = admitted_alternating(&a, &b, 30).await;
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
