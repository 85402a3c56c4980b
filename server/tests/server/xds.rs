//! `CONFIG_TYPE=GRPC_XDS_SOTW`, as Envoy Gateway deploys the reference: a real tollgate-server
//! process started with Envoy Gateway's default Deployment environment (addresses on loopback,
//! the certificates the test makes, the memory store), and a real management server the test
//! runs, a tonic `AggregatedDiscoveryService` over TLS that requires a client certificate.
//!
//! Events are observed, never waited for by sleeping: every stream the management server
//! accepts and every request (ACK, NACK) on it reaches the test through a channel; the
//! server's log lines through `wait_for_log`. Every wait is bounded.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::mpsc;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tollgate_server::service::protocol::code;
use tollgate_server::source::xds::{
    Any, DiscoveryRequest, DiscoveryResponse, RateLimitConfig, RateLimitDescriptor,
    RateLimitPolicy, RATE_LIMIT_CONFIG_TYPE, STREAM_AGGREGATED_RESOURCES,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity, ServerTlsConfig};

use crate::certificates::Authority;
use crate::support::{Client, Server, DEADLINE};

/// One stream the management server accepted: what the client sent on it, and the way to
/// push to it. Dropping it ends the stream.
struct AdsStream {
    metadata: tonic::metadata::MetadataMap,
    requests: mpsc::UnboundedReceiver<DiscoveryRequest>,
    responses: mpsc::UnboundedSender<Result<DiscoveryResponse, tonic::Status>>,
}

impl AdsStream {
    /// The next request on the stream (bounded).
    async fn request(&mut self) -> DiscoveryRequest {
        tokio::time::timeout(DEADLINE, self.requests.recv())
            .await
            .expect("a request within the deadline")
            .expect("the stream is open")
    }

    /// Pushes `configs` as version `version`, nonce `nonce`.
    fn push(&self, version: &str, nonce: &str, configs: &[RateLimitConfig]) {
        let response = DiscoveryResponse {
            version_info: version.into(),
            resources: configs
                .iter()
                .map(|config| Any {
                    type_url: RATE_LIMIT_CONFIG_TYPE.into(),
                    value: prost::Message::encode_to_vec(config),
                })
                .collect(),
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            nonce: nonce.into(),
        };
        self.responses
            .send(Ok(response))
            .expect("the stream is open");
    }
}

/// The management server: every stream it accepts is sent to the test.
#[derive(Clone)]
struct Ads {
    streams: mpsc::UnboundedSender<AdsStream>,
}

impl tonic::server::NamedService for Ads {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

impl tonic::server::StreamingService<DiscoveryRequest> for Ads {
    type Response = DiscoveryResponse;
    type ResponseStream = UnboundedReceiverStream<Result<DiscoveryResponse, tonic::Status>>;
    type Future = std::future::Ready<Result<tonic::Response<Self::ResponseStream>, tonic::Status>>;

    fn call(
        &mut self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Self::Future {
        let metadata = request.metadata().clone();
        let mut inbound = request.into_inner();
        let (requests_tx, requests) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(request)) = inbound.message().await {
                if requests_tx.send(request).is_err() {
                    break;
                }
            }
        });
        let (responses, outbound) = mpsc::unbounded_channel();
        let _ = self.streams.send(AdsStream {
            metadata,
            requests,
            responses,
        });
        std::future::ready(Ok(tonic::Response::new(UnboundedReceiverStream::new(
            outbound,
        ))))
    }
}

impl tower_service::Service<http::Request<tonic::body::Body>> for Ads {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request.uri().path() != STREAM_AGGREGATED_RESOURCES {
            return Box::pin(async {
                Ok(tonic::Status::unimplemented("no such method").into_http())
            });
        }
        let ads = self.clone();
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<DiscoveryResponse, DiscoveryRequest>::default();
            Ok(tonic::server::Grpc::new(codec)
                .streaming(ads, request)
                .await)
        })
    }
}

/// A running management server on loopback, over TLS requiring a client certificate of `ca`.
struct Management {
    addr: SocketAddr,
    streams: mpsc::UnboundedReceiver<AdsStream>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Management {
    /// Starts one on `addr` (port 0: a free one) with `identity` (certificate, key).
    async fn start(addr: SocketAddr, ca: &Authority, identity: &(String, String)) -> Management {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let (streams_tx, streams) = mpsc::unbounded_channel();
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(&identity.0, &identity.1))
            .client_ca_root(Certificate::from_pem(&ca.pem));
        let router = tonic::transport::Server::builder()
            .tls_config(tls)
            .expect("TLS")
            .add_service(Ads {
                streams: streams_tx,
            });
        let task = tokio::spawn(async move {
            let _ = router
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
        });
        Management {
            addr,
            streams,
            task: Some(task),
        }
    }

    /// The next stream a client opens (bounded).
    async fn stream(&mut self) -> AdsStream {
        tokio::time::timeout(DEADLINE, self.streams.recv())
            .await
            .expect("a stream within the deadline")
            .expect("the server runs")
    }

    /// Stops listening, its port closed on return (the streams end when their handles are
    /// dropped).
    async fn stop(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Management {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// One domain whose `remote_address` level allows `per_minute` a minute.
fn config(name: &str, per_minute: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: name.into(),
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "remote_address".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: 2, // MINUTE
                requests_per_unit: per_minute,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

/// The test's certificates, as files, and the management server's identity.
struct Certificates {
    dir: tempfile::TempDir,
    ca: Authority,
    server: (String, String),
}

impl Certificates {
    /// A CA, tollgate-server's certificate from it (for its gRPC port and as the xDS client's,
    /// as Envoy Gateway mounts one secret for both) signed by `client_ca` (the CA unless
    /// given), and the management server's.
    fn new(client_ca: Option<&Authority>) -> Certificates {
        let ca = Authority::new();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = client_ca.unwrap_or(&ca).sign(&["localhost", "127.0.0.1"]);
        std::fs::write(dir.path().join("tls.crt"), cert).unwrap();
        std::fs::write(dir.path().join("tls.key"), key).unwrap();
        std::fs::write(dir.path().join("ca.crt"), &ca.pem).unwrap();
        // Where Envoy Gateway mounts its statsd-exporter mapping; an empty one serves here.
        std::fs::write(dir.path().join("conf.yaml"), "mappings: []\n").unwrap();
        let server = ca.sign(&["localhost", "127.0.0.1"]);
        Certificates { dir, ca, server }
    }

    fn file(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

/// Envoy Gateway's default Deployment's environment (`internal/infrastructure/kubernetes/
/// ratelimit/testdata/deployments/default.yaml`), exactly, but for: the addresses on loopback
/// and free ports, the management server at `xds`, the certificates and the mapping at the
/// test's files, and the memory store rather than a Redis Service.
fn envoy_gateway(certs: &Certificates, xds: SocketAddr) -> Vec<(String, String)> {
    let pairs = [
        ("RUNTIME_ROOT", "/data".to_owned()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
        ("RUNTIME_IGNOREDOTFILES", "true".to_owned()),
        ("RUNTIME_WATCH_ROOT", "false".to_owned()),
        ("LOG_LEVEL", "info".to_owned()),
        ("USE_STATSD", "false".to_owned()),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_owned()),
        ("CONFIG_GRPC_XDS_SERVER_URL", xds.to_string()),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".to_owned()),
        ("GRPC_SERVER_USE_TLS", "true".to_owned()),
        ("GRPC_SERVER_TLS_CERT", certs.file("tls.crt")),
        ("GRPC_SERVER_TLS_KEY", certs.file("tls.key")),
        ("GRPC_SERVER_TLS_CA_CERT", certs.file("ca.crt")),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".to_owned()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", certs.file("tls.crt")),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", certs.file("tls.key")),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", certs.file("ca.crt")),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".to_owned()),
        ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
        ("REDIS_URL", "redis.redis.svc:6379".to_owned()),
        ("USE_PROMETHEUS", "true".to_owned()),
        ("PROMETHEUS_MAPPER_YAML", certs.file("conf.yaml")),
        // Moved: loopback and free ports, the memory store.
        ("PROMETHEUS_ADDR", "127.0.0.1:0".to_owned()),
        ("HOST", "127.0.0.1".to_owned()),
        ("GRPC_HOST", "127.0.0.1".to_owned()),
        ("PORT", "0".to_owned()),
        ("GRPC_PORT", "0".to_owned()),
        ("BACKEND_TYPE", "memory".to_owned()),
    ];
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// `env` with `changes` set (replaced, or added) and `removed` taken out.
fn with(
    env: &[(String, String)],
    changes: &[(&str, &str)],
    removed: &[&str],
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = env
        .iter()
        .filter(|(k, _)| !removed.contains(&k.as_str()))
        .filter(|(k, _)| !changes.iter().any(|(name, _)| name == k))
        .cloned()
        .collect();
    env.extend(
        changes
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    env
}

fn borrowed(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// A client of tollgate-server's TLS gRPC port.
async fn client(server: &Server, certs: &Certificates) -> Client {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&certs.ca.pem))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://{}", server.grpc))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("connect to tollgate-server over TLS");
    Client::from_channel(channel)
}

/// The limit and what is left of it for one call from `address`.
async fn limit_for(client: &Client, address: &str) -> Option<(u32, u32)> {
    let answer = client.ask("edge", &[&[("remote_address", address)]]).await;
    assert_eq!(answer.overall_code, code::OK);
    let status = &answer.statuses[0];
    status
        .current_limit
        .as_ref()
        .map(|limit| (limit.requests_per_unit, status.limit_remaining))
}

/// A loopback address no one listens on (now).
fn free_address() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_deployment_takes_pushes_acks_them_and_nacks_one_that_does_not_load() {
    let certs = Certificates::new(None);
    let mut management =
        Management::start("127.0.0.1:0".parse().unwrap(), &certs.ca, &certs.server).await;
    let env = envoy_gateway(&certs, management.addr);
    let mut server = Server::start_env(&borrowed(&env));
    let client = client(&server, &certs).await;

    // FORCE_START_WITHOUT_INITIAL_CONFIG: healthy, and no limit, before the first push.
    assert_eq!(server.get("/healthcheck").0, 200);
    assert_eq!(limit_for(&client, "10.0.0.1").await, None);

    // The stream opens with the node, the type, no version and no nonce.
    let mut stream = management.stream().await;
    let first = stream.request().await;
    let node = first.node.as_ref().expect("the node");
    assert_eq!(node.id, "envoy-ratelimit");
    assert_eq!(first.type_url, RATE_LIMIT_CONFIG_TYPE);
    assert_eq!(
        (first.version_info.as_str(), first.response_nonce.as_str()),
        ("", "")
    );
    assert!(first.resource_names.is_empty(), "a wildcard subscription");

    // The first push applies and is ACKed with its version and nonce.
    stream.push("1", "nonce-1", &[config("edge", 2)]);
    let ack = stream.request().await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("1", "nonce-1")
    );
    assert_eq!(ack.error_detail, None);
    assert_eq!(limit_for(&client, "10.0.0.1").await, Some((2, 1)));

    // A second push replaces the limits.
    stream.push("2", "nonce-2", &[config("edge", 5)]);
    let ack = stream.request().await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("2", "nonce-2")
    );
    assert_eq!(ack.error_detail, None);
    assert_eq!(limit_for(&client, "10.0.0.2").await, Some((5, 4)));

    // One that does not load (a limit with no unit) is NACKed: the last accepted version, this
    // nonce, and why, naming the resource; the limits in force stay.
    let mut broken = config("edge-broken", 1);
    broken.descriptors[0].rate_limit.as_mut().unwrap().unit = 0;
    stream.push("3", "nonce-3", &[broken]);
    let nack = stream.request().await;
    assert_eq!(
        (nack.version_info.as_str(), nack.response_nonce.as_str()),
        ("2", "nonce-3")
    );
    let detail = nack.error_detail.expect("error_detail");
    assert!(
        detail.message.contains("RateLimitConfig \"edge-broken\"")
            && detail.message.contains("unit"),
        "{}",
        detail.message
    );
    assert_ne!(detail.code, 0);
    let logged = server.wait_for_log("NACK");
    assert!(logged.contains("edge-broken"), "{logged}");
    assert_eq!(limit_for(&client, "10.0.0.2").await, Some((5, 3)));
    assert_eq!(
        server.metric("tollgate_server_config_reload_failures_total"),
        1
    );
    // One line per NACK.
    let nacks = server.log.iter().filter(|l| l.contains("NACK")).count();
    assert_eq!(nacks, 1, "{:?}", server.log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_reconnects_when_the_management_server_comes_back() {
    let certs = Certificates::new(None);
    let mut management =
        Management::start("127.0.0.1:0".parse().unwrap(), &certs.ca, &certs.server).await;
    let addr = management.addr;
    let env = with(
        &envoy_gateway(&certs, addr),
        &[
            // Short waits, so that the test is quick.
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "50ms"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "100ms"),
            ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "50ms"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=eu-1,cluster=blue"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-tenant:acme"),
        ],
        &[],
    );
    let mut server = Server::start_env(&borrowed(&env));
    let client = client(&server, &certs).await;
    let mut stream = management.stream().await;
    assert_eq!(stream.metadata.get("x-tenant").unwrap(), "acme");
    let first = stream.request().await;
    let metadata = first.node.unwrap().metadata.unwrap();
    let text = |name: &str| match &metadata.fields[name].kind {
        Some(tollgate_server::source::xds::Kind::StringValue(s)) => s.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (text("zone"), text("cluster")),
        ("eu-1".into(), "blue".into())
    );
    stream.push("7", "a", &[config("edge", 3)]);
    assert_eq!(stream.request().await.version_info, "7");

    // The management server goes away: the stream ends, the limits in force stay.
    management.stop().await;
    drop(stream);
    server.wait_for_log("stream from the management server ended");
    assert_eq!(limit_for(&client, "10.0.0.1").await, Some((3, 2)));

    // It comes back on its address: the client opens a new stream, saying the version in
    // force and no nonce (a new stream's first request).
    let mut management = Management::start(addr, &certs.ca, &certs.server).await;
    let mut stream = management.stream().await;
    let again = stream.request().await;
    assert_eq!(
        (again.version_info.as_str(), again.response_nonce.as_str()),
        ("7", "")
    );
    server.wait_for_log("connected to the management server");
    stream.push("8", "b", &[config("edge", 4)]);
    assert_eq!(stream.request().await.version_info, "8");
    assert_eq!(limit_for(&client, "10.0.0.3").await, Some((4, 3)));
    // One warning for the whole outage, however many attempts it took.
    let warnings = server
        .log
        .iter()
        .filter(|l| l.contains("WARN") && l.contains("xDS") && !l.contains("FORCE_START"))
        .count();
    assert_eq!(warnings, 1, "{:#?}", server.log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_force_start_nothing_is_served_until_the_first_push() {
    // As the reference: without FORCE_START_WITHOUT_INITIAL_CONFIG the server waits for its
    // first configuration however long the management server takes, here unreachable at
    // first; its ports open only then.
    let certs = Certificates::new(None);
    let addr = free_address();
    let env = with(
        &envoy_gateway(&certs, addr),
        &[("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "50ms")],
        &["FORCE_START_WITHOUT_INITIAL_CONFIG"],
    );
    let mut server = Server::launch_env(&borrowed(&env));
    let warning = server.wait_for_log("cannot be reached");
    assert!(warning.contains("WARN"), "{warning}");
    assert!(server.is_running());
    assert!(
        !server.log.iter().any(|l| l.contains("serving")),
        "{:?}",
        server.log
    );

    let mut management = Management::start(addr, &certs.ca, &certs.server).await;
    let mut stream = management.stream().await;
    stream.request().await;
    // Still not serving: a push that does not load is NACKed and waited past.
    let mut broken = config("broken", 1);
    broken.descriptors[0].key = String::new();
    stream.push("1", "n1", &[broken]);
    let nack = stream.request().await;
    assert!(nack.error_detail.is_some());
    assert_eq!(nack.version_info, "");
    assert!(
        !server.log.iter().any(|l| l.contains("serving")),
        "{:?}",
        server.log
    );

    stream.push("2", "n2", &[config("edge", 2)]);
    server.wait_serving();
    let ack = stream.request().await;
    assert_eq!((ack.version_info.as_str(), ack.error_detail), ("2", None));
    let client = client(&server, &certs).await;
    assert_eq!(limit_for(&client, "10.0.0.1").await, Some((2, 1)));
    assert_eq!(
        server.metric("tollgate_server_config_reload_failures_total"),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_force_start_an_unreachable_management_server_still_serves_healthy() {
    let certs = Certificates::new(None);
    let env = envoy_gateway(&certs, free_address());
    let mut server = Server::start_env(&borrowed(&env));
    assert_eq!(server.get("/healthcheck").0, 200);
    seen_or_wait(&mut server, "cannot be reached");
    let client = client(&server, &certs).await;
    assert_eq!(limit_for(&client, "10.0.0.1").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_the_management_server_does_not_trust_gets_no_stream() {
    let stranger = Authority::new();
    let certs = Certificates::new(Some(&stranger));
    let mut management =
        Management::start("127.0.0.1:0".parse().unwrap(), &certs.ca, &certs.server).await;
    let env = envoy_gateway(&certs, management.addr);
    let mut server = Server::start_env(&borrowed(&env));
    let warning = seen_or_wait(&mut server, "cannot be reached");
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        management.streams.try_recv().is_err(),
        "a stream opened with an untrusted certificate"
    );
    assert_eq!(server.get("/healthcheck").0, 200);
}

/// The log line with `text`, already read (it may come before the server says it serves) or
/// waited for.
fn seen_or_wait(server: &mut Server, text: &str) -> String {
    match server.log.iter().find(|line| line.contains(text)) {
        Some(line) => line.clone(),
        None => server.wait_for_log(text),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_management_servers_certificate_must_name_the_url_host_or_the_san() {
    let certs = Certificates::new(None);
    let named = certs.ca.sign(&["xds.internal"]);
    let mut management = Management::start("127.0.0.1:0".parse().unwrap(), &certs.ca, &named).await;
    let env = envoy_gateway(&certs, management.addr);

    // Its certificate does not name 127.0.0.1: refused by the client.
    let mut server = Server::start_env(&borrowed(&env));
    let warning = seen_or_wait(&mut server, "cannot be reached");
    assert!(warning.contains("not valid for name"), "{warning}");
    drop(server);

    // CONFIG_GRPC_XDS_SERVER_TLS_SAN names the one it holds.
    let env = with(
        &env,
        &[("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.internal")],
        &[],
    );
    let _server = Server::start_env(&borrowed(&env));
    let mut stream = management.stream().await;
    assert_eq!(stream.request().await.node.unwrap().id, "envoy-ratelimit");
}
