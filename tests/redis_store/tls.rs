//! `rediss://`: the store over TLS (rustls) to a real server listening on a TLS port, with a
//! certificate authority, a server certificate for 127.0.0.1 and a client certificate the test
//! makes. A server whose certificate the given CA did not sign, and a server that wants a client
//! certificate the store does not have, are errors when the store is built.

#![cfg(feature = "redis-tls")]

use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use tollgate::config::{Config, ConfigFormat};
use tollgate::store::StoreErrorKind;
use tollgate::{Limit, Limiter, RedisStore, Rule};

use super::ENGINE;
use crate::support::certificates::Authority;
use crate::support::redis_server::RedisServer;

/// A server of the engine under test with a TLS port beside its plain one (the plain one is the
/// tests' way to look inside), asking clients for a certificate signed by `ca`.
struct TlsServer {
    server: RedisServer,
    tls_port: u16,
    _dir: tempfile::TempDir,
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

fn tls_server(ca: &Authority) -> TlsServer {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca.sign(&["127.0.0.1"]);
    let files = [
        write(dir.path(), "server.crt", &cert),
        write(dir.path(), "server.key", &key),
        write(dir.path(), "ca.crt", &ca.pem),
    ];
    let tls_port = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port().to_string()
    };
    let server = ENGINE.server_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &files[0],
        "--tls-key-file",
        &files[1],
        "--tls-ca-cert-file",
        &files[2],
        "--tls-auth-clients",
        "yes",
    ]);
    TlsServer {
        server,
        tls_port: tls_port.parse().unwrap(),
        _dir: dir,
    }
}

impl TlsServer {
    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_custom_ca_and_a_client_certificate_decides_as_over_plain_tcp() {
    let ca = Authority::new();
    let server = tls_server(&ca);
    let (cert, key) = ca.sign(&["tollgate-client"]);
    let store = RedisStore::builder()
        .url(server.url())
        .ca_certificate(ca.pem.as_bytes())
        .client_certificate(cert.as_bytes(), key.as_bytes())
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("connects over TLS");
    let limiter = Limiter::builder()
        .rule(Rule::new("api", Limit::per_hour(3)))
        .store(store)
        .build()
        .unwrap();
    let remaining: Vec<u64> = [
        limiter.charge("api", "k", 1).await.unwrap(),
        limiter.charge("api", "k", 1).await.unwrap(),
        limiter.charge("api", "k", 1).await.unwrap(),
    ]
    .iter()
    .map(|o| o.remaining)
    .collect();
    assert_eq!(remaining, [2, 1, 0]);
    assert!(!limiter.charge("api", "k", 1).await.unwrap().is_allowed());
    // The decisions reached the server through its TLS port.
    assert!(server.server.command_calls("evalsha") >= 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_a_server_certificate_of_another_ca_is_an_error_at_build_not_per_request() {
    let server = tls_server(&Authority::new());
    let other = Authority::new();
    let (cert, key) = other.sign(&["tollgate-client"]);
    let built = RedisStore::builder()
        .url(server.url())
        .ca_certificate(other.pem.as_bytes())
        .client_certificate(cert.as_bytes(), key.as_bytes())
        .timeout(Duration::from_millis(500))
        .build()
        .await;
    let error = built.expect_err("an unknown issuer is refused");
    assert_ne!(error.kind(), StoreErrorKind::Config, "{error}");
    assert!(
        error.to_string().to_lowercase().contains("certificate"),
        "the error says why: {error}"
    );
    assert_eq!(server.server.command_calls("evalsha"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_without_the_client_certificate_the_server_asks_for_is_an_error_at_build() {
    let ca = Authority::new();
    let server = tls_server(&ca);
    let built = RedisStore::builder()
        .url(server.url())
        .ca_certificate(ca.pem.as_bytes())
        .timeout(Duration::from_millis(500))
        .build()
        .await;
    assert!(built.is_err(), "the server wants a client certificate");
    assert_eq!(server.server.command_calls("evalsha"), 0);
}

/// The same from a configuration file: `[store]` with `rediss://`, `ca_file`, `client_cert_file`
/// and `client_key_file`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_from_a_configuration_file_the_layer_connects_and_counts() {
    let ca = Authority::new();
    let server = tls_server(&ca);
    let (cert, key) = ca.sign(&["tollgate-client"]);
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\non_failure = \"closed\"\nca_file = {:?}\n\
         client_cert_file = {:?}\nclient_key_file = {:?}\n\n\
         [[rules]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\n",
        server.url(),
        write(dir.path(), "ca.crt", &ca.pem),
        write(dir.path(), "client.crt", &cert),
        write(dir.path(), "client.key", &key),
    );
    let config = Config::parse(ConfigFormat::Toml, &text).unwrap();
    // Failing closed, the layer connects (and loads the scripts) before it is built.
    config.connect().await.expect("the layer connects over TLS");
    assert_eq!(server.server.command_calls("script|load"), 10);
}

/// TLS files beside a plain `redis://` URL are a mistake the file's check names, before any
/// connection is tried.
#[tokio::test]
async fn tls_files_with_a_plain_redis_url_are_refused_naming_the_field() {
    let text = "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n\
                ca_file = \"ca.crt\"\n\n[[rules]]\nname = \"api\"\nalgorithm = \"fixed_window\"\n\
                limit = 2\nperiod = \"1h\"\n";
    let config = Config::parse(ConfigFormat::Toml, text).unwrap();
    let error = config.connect().await.expect_err("refused");
    let message = error.to_string();
    assert!(message.contains("store.ca_file"), "{message}");
    assert!(message.contains("rediss://"), "{message}");
}
