//! TLS on the gRPC port, as Envoy Gateway deploys the reference: `GRPC_SERVER_USE_TLS` with the
//! server's certificate, and client certificates required and checked (`GRPC_CLIENT_TLS_CACERT`,
//! `GRPC_CLIENT_TLS_SAN`). Certificates made by the test; a real tonic client over TLS.

use std::path::Path;

use tollgate_server::service::protocol::code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::certificates::Authority;
use crate::numbers::REFERENCE;
use crate::support::{run_to_exit_env, Client, Server};

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// A client of `server` over TLS trusting `ca`, with `identity` (certificate, key) if any.
async fn connect(
    server: &Server,
    ca: &Authority,
    identity: Option<&(String, String)>,
) -> Result<Client, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca.pem))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Channel::from_shared(format!("https://{}", server.grpc))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(Client::from_channel(channel))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_serves_clients_whose_certificate_names_the_san_and_no_other() {
    let ca = Authority::new();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    write(&dir.path().join("config"), "edge.yaml", REFERENCE);
    let (cert, key) = ca.sign(&["localhost", "127.0.0.1"]);
    let root = dir.path().display().to_string();
    let cert_file = write(dir.path(), "tls.crt", &cert);
    let key_file = write(dir.path(), "tls.key", &key);
    let ca_file = write(dir.path(), "ca.crt", &ca.pem);
    let mut env = vec![
        ("RUNTIME_ROOT", root.as_str()),
        ("BACKEND_TYPE", "memory"),
        ("HOST", "127.0.0.1"),
        ("GRPC_HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_PORT", "0"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", cert_file.as_str()),
        ("GRPC_SERVER_TLS_KEY", key_file.as_str()),
    ];

    // TLS alone: any client that trusts the server is served.
    let server = Server::start_env(&env);
    let client = connect(&server, &ca, None).await.expect("a TLS client");
    let answer = client
        .ask("edge", &[&[("remote_address", "10.0.0.1")]])
        .await;
    assert_eq!(answer.overall_code, code::OK);
    // Plain text to the TLS port is not served.
    let plain = Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await;
    if let Ok(plain) = plain {
        let call = Client::from_channel(plain)
            .call(crate::support::request(
                "edge",
                &[&[("remote_address", "a")]],
            ))
            .await;
        assert!(call.is_err(), "plain text served on a TLS port");
    }
    drop(server);

    // Mutual TLS: a certificate from the CA naming the SAN.
    env.push(("GRPC_CLIENT_TLS_CACERT", ca_file.as_str()));
    env.push(("GRPC_CLIENT_TLS_SAN", "envoy.client"));
    let server = Server::start_env(&env);
    let envoy = ca.sign(&["envoy.client"]);
    let client = connect(&server, &ca, Some(&envoy)).await.expect("mTLS");
    let answer = client
        .ask("edge", &[&[("remote_address", "10.0.0.1")]])
        .await;
    assert_eq!(answer.overall_code, code::OK);

    // Without a certificate, with one naming another SAN, or with one of another CA: refused
    // in the handshake, counted, and the server keeps serving.
    let stranger = Authority::new().sign(&["envoy.client"]);
    let other_name = ca.sign(&["someone.else"]);
    for identity in [None, Some(&other_name), Some(&stranger)] {
        let refused = match connect(&server, &ca, identity).await {
            Err(_) => true,
            Ok(client) => client
                .call(crate::support::request(
                    "edge",
                    &[&[("remote_address", "a")]],
                ))
                .await
                .is_err(),
        };
        assert!(refused, "a client with {identity:?} was served");
    }
    // (A client may try its handshake more than once before it gives up.)
    let failed = server.wait_for_metric("tollgate_server_tls_handshake_failures_total", 3);
    assert!(failed >= 3, "{failed}");
    let again = client
        .ask("edge", &[&[("remote_address", "10.0.0.1")]])
        .await;
    assert_eq!(again.statuses[0].limit_remaining, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_certificates_stop_the_start_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().display().to_string();
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    let not_pem = write(dir.path(), "tls.crt", "not a certificate");
    let missing = dir.path().join("missing.key").display().to_string();
    let (status, stderr) = run_to_exit_env(&[
        ("RUNTIME_ROOT", &root),
        ("BACKEND_TYPE", "memory"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", &not_pem),
        ("GRPC_SERVER_TLS_KEY", &missing),
        ("HOST", "127.0.0.1"),
        ("GRPC_HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_PORT", "0"),
    ]);
    assert!(!status.success());
    assert!(stderr.contains("GRPC_SERVER_TLS_CERT"), "{stderr}");
}
