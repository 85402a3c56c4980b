//! The reference's `CONFIG_TYPE=GRPC_XDS_SOTW`: the configuration is pushed by an xDS management
//! server (Envoy Gateway's, say), a client of its aggregated discovery service
//! (`StreamAggregatedResources`, state of the world) asking for every
//! `ratelimit.config.ratelimit.v3.RateLimitConfig`.
//!
//! - Every resource of a response is one domain, as a reference file is; the response is the
//!   whole configuration, read by [`crate::reference`] as the files are ([`load_push`]).
//! - A response that loads and is put in force is acknowledged (ACK: its `version_info` and
//!   `nonce` echoed); one that does not is refused (NACK: the last accepted version, its nonce,
//!   and `error_detail` naming the resource and the error) while the limits in force stay.
//! - The node (`CONFIG_GRPC_XDS_NODE_ID`, `CONFIG_GRPC_XDS_NODE_METADATA`), extra gRPC metadata
//!   on the stream (`CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`), TLS with a CA and a client
//!   certificate (`CONFIG_GRPC_XDS_SERVER_USE_TLS` and its files).
//! - A connection that cannot be made is tried again every
//!   `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL` (±50%, as the reference's retry option
//!   says); a stream that ends is opened again after the reference's backoff
//!   (`XDS_CLIENT_BACKOFF_*`, see [`Backoff`]). Never a hot loop; one warning per failure
//!   streak, one line when connected again.

mod messages;

use std::path::{Path, PathBuf};
use std::time::Duration;

use http::uri::PathAndQuery;
use serde_json::{json, Map, Value as Json};
use tokio::sync::{mpsc, oneshot};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

pub use messages::*;

use crate::load::{self, Error, Loaded};

/// How the client reaches its management server and what it asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct XdsSettings {
    /// `host:port` (`CONFIG_GRPC_XDS_SERVER_URL`, default `localhost:18000`).
    pub server_url: String,
    /// The node's id (`CONFIG_GRPC_XDS_NODE_ID`, default `default`): the management server keys
    /// its snapshots by it.
    pub node_id: String,
    /// The node's metadata, string values (`CONFIG_GRPC_XDS_NODE_METADATA`).
    pub node_metadata: Vec<(String, String)>,
    /// gRPC metadata sent with the stream (`CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`).
    pub headers: Vec<(String, String)>,
    /// The wait before another attempt to connect (`CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`,
    /// 3s), ±50%.
    pub connect_retry_interval: Duration,
    /// TLS to the management server (`CONFIG_GRPC_XDS_SERVER_USE_TLS`).
    pub tls: Option<XdsTls>,
    /// The wait before a stream that ended is opened again.
    pub backoff: Backoff,
    /// The largest response accepted (`XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`; none: gRPC's 4 MiB).
    pub max_message_size: Option<usize>,
    /// Resources naming one domain are merged rather than refused (`MERGE_DOMAIN_CONFIG`).
    pub merge_domains: bool,
    /// The library's `[store]` table the reference's variables name.
    pub store: Json,
}

/// TLS to the management server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdsTls {
    /// The client's certificate chain (`CONFIG_GRPC_XDS_CLIENT_TLS_CERT`, PEM), with `key`.
    pub cert: Option<PathBuf>,
    /// Its private key (`CONFIG_GRPC_XDS_CLIENT_TLS_KEY`, PEM).
    pub key: Option<PathBuf>,
    /// The CA the server's certificate must chain to (`CONFIG_GRPC_XDS_SERVER_TLS_CACERT`);
    /// none: the system's roots.
    pub ca: Option<PathBuf>,
    /// The name the server's certificate must hold (`CONFIG_GRPC_XDS_SERVER_TLS_SAN`); none:
    /// the host of the server's URL.
    pub san: Option<String>,
}

/// The reference's reconnection backoff (`XDS_CLIENT_BACKOFF_INITIAL_INTERVAL` 10s,
/// `XDS_CLIENT_BACKOFF_MAX_INTERVAL` 60s, `XDS_CLIENT_BACKOFF_RANDOM_FACTOR` 0.5,
/// `XDS_CLIENT_BACKOFF_JITTER` true), computed as the library the reference uses
/// (jpillora/backoff) computes it: attempt `n` waits `initial × factor^n`, with jitter a random
/// point between `initial` and that, kept within `[initial, max]`. The reference passes the
/// "random factor" as that multiplier, so with its defaults (0.5) every wait is the initial
/// interval; a factor above 1 grows the wait towards the maximum.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// The first wait, and the shortest.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
    /// The multiplier per attempt.
    pub factor: f64,
    /// A random wait between `initial` and the computed one.
    pub jitter: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(60),
            factor: 0.5,
            jitter: true,
        }
    }
}

impl Backoff {
    /// The wait before attempt `attempt` (from 0), `random` in `[0, 1)`.
    pub fn delay(&self, attempt: u32, random: f64) -> Duration {
        // The library's own defaults for values left at zero.
        let min = if self.initial.is_zero() {
            Duration::from_millis(100)
        } else {
            self.initial
        };
        let max = if self.max.is_zero() {
            Duration::from_secs(10)
        } else {
            self.max
        };
        if min >= max {
            return max;
        }
        let factor = if self.factor <= 0.0 { 2.0 } else { self.factor };
        let min_nanos = min.as_nanos() as f64;
        let mut nanos = min_nanos * factor.powf(f64::from(attempt));
        if self.jitter {
            nanos = random * (nanos - min_nanos) + min_nanos;
        }
        if !nanos.is_finite() || nanos >= max.as_nanos() as f64 {
            return max;
        }
        Duration::from_nanos(nanos.max(0.0) as u64).clamp(min, max)
    }
}

/// A push, loaded (or why it cannot be), offered to the service; the service answers whether
/// it is now in force.
#[derive(Debug)]
pub struct Offer {
    /// The configuration, or why the push does not load (naming the resource).
    pub loaded: Result<Loaded, Error>,
    /// Whether it was put in force (else why not).
    pub reply: oneshot::Sender<Result<(), String>>,
}

/// The endpoint `settings` describe, its files read: an error names the variable.
pub fn endpoint(settings: &XdsSettings) -> Result<Endpoint, String> {
    let scheme = if settings.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{}", settings.server_url))
        .map_err(|error| {
            format!(
                "CONFIG_GRPC_XDS_SERVER_URL={:?}: {error}",
                settings.server_url
            )
        })?
        .connect_timeout(Duration::from_secs(10))
        // A management server gone silent (a dead node, a dropped route) is noticed.
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let Some(tls) = &settings.tls else {
        return Ok(endpoint);
    };
    let read = |variable: &str, path: &Path| {
        std::fs::read(path).map_err(|error| format!("{variable} {}: {error}", path.display()))
    };
    let host = settings
        .server_url
        .rsplit_once(':')
        .map_or(settings.server_url.as_str(), |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let mut config =
        ClientTlsConfig::new().domain_name(tls.san.clone().unwrap_or_else(|| host.to_owned()));
    config = match &tls.ca {
        Some(ca) => {
            let pem = read("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca)?;
            check_pem("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca, &pem, false)?;
            config.ca_certificate(Certificate::from_pem(pem))
        }
        None => config.with_native_roots(),
    };
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let cert_pem = read("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert)?;
            check_pem("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert, &cert_pem, false)?;
            let key_pem = read("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key)?;
            check_pem("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key, &key_pem, true)?;
            config = config.identity(Identity::from_pem(cert_pem, key_pem));
        }
        (None, None) => {}
        (Some(_), None) => {
            return Err("CONFIG_GRPC_XDS_CLIENT_TLS_KEY: required with \
                        CONFIG_GRPC_XDS_CLIENT_TLS_CERT (a PEM file)"
                .into())
        }
        (None, Some(_)) => {
            return Err("CONFIG_GRPC_XDS_CLIENT_TLS_CERT: required with \
                        CONFIG_GRPC_XDS_CLIENT_TLS_KEY (a PEM file)"
                .into())
        }
    }
    endpoint
        .tls_config(config)
        .map_err(|error| format!("CONFIG_GRPC_XDS_SERVER_USE_TLS: {}", chain(&error)))
}

/// Whether `pem` (the file `path` of `variable`) holds a certificate, or a private key.
fn check_pem(variable: &str, path: &Path, pem: &[u8], key: bool) -> Result<(), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let fail = |what: String| format!("{variable} {}: {what}", path.display());
    if key {
        PrivateKeyDer::from_pem_slice(pem).map_err(|error| fail(error.to_string()))?;
        return Ok(());
    }
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|error| fail(error.to_string()))?;
    if certs.is_empty() {
        return Err(fail("no certificate in the file".into()));
    }
    Ok(())
}

/// Loads a push: every resource a `RateLimitConfig`, each one domain.
pub fn load_push(response: &DiscoveryResponse, settings: &XdsSettings) -> Result<Loaded, Error> {
    if !response.type_url.is_empty() && response.type_url != RATE_LIMIT_CONFIG_TYPE {
        return Err(Error(format!(
            "a response of type {:?}; only {RATE_LIMIT_CONFIG_TYPE} is asked for",
            response.type_url
        )));
    }
    let mut configs = Vec::with_capacity(response.resources.len());
    for (i, resource) in response.resources.iter().enumerate() {
        let wanted = RATE_LIMIT_CONFIG_TYPE
            .rsplit('/')
            .next()
            .unwrap_or_default();
        if resource.type_url.rsplit('/').next() != Some(wanted) {
            return Err(Error(format!(
                "resources[{i}]: of type {:?}, not {RATE_LIMIT_CONFIG_TYPE}",
                resource.type_url
            )));
        }
        let config = <RateLimitConfig as prost::Message>::decode(resource.value.as_slice())
            .map_err(|error| Error(format!("resources[{i}]: not a RateLimitConfig: {error}")))?;
        let name = if config.name.is_empty() {
            format!("resources[{i}]")
        } else {
            format!("RateLimitConfig {:?}", config.name)
        };
        configs.push((name, reference_value(&config)));
    }
    load::load_reference_values(
        configs,
        &settings.store,
        settings.merge_domains,
        Path::new(&settings.server_url),
    )
}

/// A `RateLimitConfig` in the reference's YAML structure, as the reference converts it.
fn reference_value(config: &RateLimitConfig) -> Json {
    json!({
        "domain": config.domain,
        "descriptors": config.descriptors.iter().map(descriptor_value).collect::<Vec<_>>(),
    })
}

fn descriptor_value(descriptor: &RateLimitDescriptor) -> Json {
    let mut out = Map::new();
    out.insert("key".into(), Json::from(descriptor.key.clone()));
    // Protobuf's empty string is the reference's absent value.
    if !descriptor.value.is_empty() {
        out.insert("value".into(), Json::from(descriptor.value.clone()));
    }
    if let Some(policy) = &descriptor.rate_limit {
        let mut limit = Map::new();
        // UNKNOWN (0) is no unit; a number no unit has stays one, refused as unknown.
        if policy.unit != 0 {
            let unit = crate::unit::Unit::from_number(policy.unit)
                .map_or_else(|| policy.unit.to_string(), |unit| unit.name().to_owned());
            limit.insert("unit".into(), Json::from(unit));
        }
        limit.insert(
            "requests_per_unit".into(),
            Json::from(policy.requests_per_unit),
        );
        if !policy.name.is_empty() {
            limit.insert("name".into(), Json::from(policy.name.clone()));
        }
        limit.insert("unlimited".into(), Json::from(policy.unlimited));
        let replaces: Vec<Json> = policy
            .replaces
            .iter()
            .map(|r| json!({ "name": r.name }))
            .collect();
        limit.insert("replaces".into(), Json::from(replaces));
        out.insert("rate_limit".into(), Json::Object(limit));
    }
    out.insert(
        "descriptors".into(),
        Json::from(
            descriptor
                .descriptors
                .iter()
                .map(descriptor_value)
                .collect::<Vec<_>>(),
        ),
    );
    out.insert("shadow_mode".into(), Json::from(descriptor.shadow_mode));
    out.insert(
        "detailed_metric".into(),
        Json::from(descriptor.detailed_metric),
    );
    out.insert("quota_mode".into(), Json::from(descriptor.quota_mode));
    if let Some(metadata) = &descriptor.metadata {
        out.insert("metadata".into(), struct_value(metadata));
    }
    Json::Object(out)
}

fn struct_value(s: &Struct) -> Json {
    Json::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(value: &Value) -> Json {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(Json::Null, Json::Number)
        }
        Some(Kind::StringValue(s)) => Json::from(s.clone()),
        Some(Kind::BoolValue(b)) => Json::from(*b),
        Some(Kind::StructValue(s)) => struct_value(s),
        Some(Kind::ListValue(list)) => Json::Array(list.values.iter().map(value_json).collect()),
    }
}

/// The node this client says it is.
fn node(settings: &XdsSettings) -> Node {
    Node {
        id: settings.node_id.clone(),
        cluster: String::new(),
        metadata: Some(Struct {
            fields: settings
                .node_metadata
                .iter()
                .map(|(k, v)| (k.clone(), Value::of(Kind::StringValue(v.clone()))))
                .collect(),
        }),
        user_agent_name: "tollgate-server".into(),
    }
}

/// An error with its causes, `: `-separated (tonic's transport errors say little alone).
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A number in `[0, 1)`, different on every call (for jitter; not for secrets).
fn random() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let bits = RandomState::new().hash_one(CALLS.fetch_add(1, Ordering::Relaxed));
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// How one stream ended.
enum Ended {
    /// No stream was opened: the server could not be reached (or refused the call).
    NotConnected(String),
    /// A stream was open and ended; whether it delivered a response.
    Lost { error: String, responded: bool },
    /// The service stopped listening: the client stops.
    Stopped,
}

/// What the client keeps across streams.
struct Client {
    settings: XdsSettings,
    endpoint: Endpoint,
    offers: mpsc::Sender<Offer>,
    /// The version of the last configuration put in force (empty before the first).
    accepted_version: String,
}

/// Runs the client until the service stops: streams, reconnects, offers every push to
/// `offers` and ACKs or NACKs it as the service answers.
pub async fn run(settings: XdsSettings, endpoint: Endpoint, offers: mpsc::Sender<Offer>) {
    tracing::info!(
        server = %settings.server_url,
        node = %settings.node_id,
        tls = settings.tls.is_some(),
        "xDS: connecting to the management server"
    );
    let mut client = Client {
        settings,
        endpoint,
        offers,
        accepted_version: String::new(),
    };
    let mut attempt = 0u32;
    // Whether the current failure streak was told (one warning per streak).
    let mut warned = false;
    loop {
        let wait = match client.stream().await {
            Ended::Stopped => return,
            Ended::NotConnected(error) => {
                if warned {
                    tracing::debug!(%error, "xDS: the management server still cannot be reached");
                } else {
                    warned = true;
                    tracing::warn!(
                        server = %client.settings.server_url,
                        %error,
                        "xDS: the management server cannot be reached; retrying (the limits in \
                         force stay)"
                    );
                }
                let interval = client.settings.connect_retry_interval;
                interval
                    .mul_f64(0.5 + random())
                    .max(Duration::from_millis(1))
            }
            Ended::Lost { error, responded } => {
                // A stream that delivered configurations was healthy: the next failure starts
                // the backoff afresh. A lost stream starts a streak (it was connected, which
                // ended the last one).
                if responded {
                    attempt = 0;
                }
                warned = true;
                tracing::warn!(
                    server = %client.settings.server_url,
                    %error,
                    "xDS: the stream from the management server ended; reconnecting (the \
                     limits in force stay)"
                );
                let wait = client.settings.backoff.delay(attempt, random());
                attempt = attempt.saturating_add(1);
                wait
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = client.offers.closed() => return,
        }
    }
}

impl Client {
    /// One stream, from connecting to its end.
    async fn stream(&mut self) -> Ended {
        let channel = match self.endpoint.connect().await {
            Ok(channel) => channel,
            Err(error) => return Ended::NotConnected(chain(&error)),
        };
        let mut grpc = tonic::client::Grpc::new(channel);
        if let Some(size) = self.settings.max_message_size {
            grpc = grpc.max_decoding_message_size(size);
        }
        if let Err(error) = grpc.ready().await {
            return Ended::NotConnected(chain(&error));
        }
        let (requests, outbound) = mpsc::channel::<DiscoveryRequest>(4);
        // A new stream starts with the version in force and no nonce.
        let _ = requests.try_send(self.request(String::new(), None));
        let mut request =
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(outbound));
        for (name, value) in &self.settings.headers {
            if let (Ok(name), Ok(value)) = (
                name.parse::<tonic::metadata::MetadataKey<tonic::metadata::Ascii>>(),
                value.parse(),
            ) {
                request.metadata_mut().insert(name, value);
            }
        }
        let codec = tonic_prost::ProstCodec::<DiscoveryRequest, DiscoveryResponse>::default();
        let path = PathAndQuery::from_static(STREAM_AGGREGATED_RESOURCES);
        let mut inbound = match grpc.streaming(request, path, codec).await {
            Ok(response) => response.into_inner(),
            Err(status) => return Ended::NotConnected(status_text(&status)),
        };
        tracing::info!(
            server = %self.settings.server_url,
            "xDS: connected to the management server"
        );
        let mut responded = false;
        loop {
            let response = match inbound.message().await {
                Ok(Some(response)) => response,
                Ok(None) => {
                    return Ended::Lost {
                        error: "the server closed the stream".into(),
                        responded,
                    }
                }
                Err(status) => {
                    return Ended::Lost {
                        error: status_text(&status),
                        responded,
                    }
                }
            };
            responded = true;
            let Some(answer) = self.answer(response).await else {
                return Ended::Stopped;
            };
            if requests.send(answer).await.is_err() {
                return Ended::Lost {
                    error: "the stream closed".into(),
                    responded,
                };
            }
        }
    }

    /// The ACK or NACK of `response`, once the service took it or refused it (`None`: the
    /// service stopped).
    async fn answer(&mut self, response: DiscoveryResponse) -> Option<DiscoveryRequest> {
        let loaded = load_push(&response, &self.settings);
        let (reply, replied) = oneshot::channel();
        self.offers.send(Offer { loaded, reply }).await.ok()?;
        match replied.await.ok()? {
            Ok(()) => {
                self.accepted_version = response.version_info.clone();
                tracing::info!(
                    version = %response.version_info,
                    resources = response.resources.len(),
                    "xDS: configuration applied (ACK)"
                );
                Some(self.request(response.nonce, None))
            }
            Err(error) => {
                tracing::warn!(
                    version = %response.version_info,
                    nonce = %response.nonce,
                    %error,
                    "xDS: configuration refused (NACK): the limits in force stay"
                );
                let detail = Status {
                    // google.rpc.Code INVALID_ARGUMENT: the configuration is at fault.
                    code: 3,
                    message: error,
                };
                Some(self.request(response.nonce, Some(detail)))
            }
        }
    }

    fn request(&self, nonce: String, error_detail: Option<Status>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: self.accepted_version.clone(),
            node: Some(node(&self.settings)),
            resource_names: Vec::new(),
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            response_nonce: nonce,
            error_detail,
        }
    }
}

/// A status as one line: its code and message, and the transport error under it.
fn status_text(status: &tonic::Status) -> String {
    use std::error::Error as _;
    let mut text = format!("{:?}: {}", status.code(), status.message());
    if let Some(source) = status.source() {
        let causes = chain(source);
        // tonic's message is often its source's first words.
        let causes = causes
            .strip_prefix(status.message())
            .map_or(causes.as_str(), |rest| rest.trim_start_matches(": "));
        if !causes.is_empty() {
            text.push_str(": ");
            text.push_str(causes);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_references_backoff() {
        let defaults = Backoff::default();
        // Factor 0.5: every wait is the initial interval, jitter or not.
        for attempt in 0..5 {
            for random in [0.0, 0.5, 0.99] {
                assert_eq!(defaults.delay(attempt, random), Duration::from_secs(10));
            }
        }
        let growing = Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
            factor: 2.0,
            jitter: false,
        };
        let waits: Vec<u64> = (0..8).map(|n| growing.delay(n, 0.0).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
        let jittered = Backoff {
            jitter: true,
            ..growing
        };
        // Between the initial interval and the computed one.
        assert_eq!(jittered.delay(3, 0.0), Duration::from_secs(1));
        assert_eq!(jittered.delay(3, 0.5), Duration::from_millis(4500));
        assert_eq!(jittered.delay(1000, 0.5), Duration::from_secs(60));
    }

    fn settings() -> XdsSettings {
        XdsSettings {
            server_url: "xds:18000".into(),
            node_id: "default".into(),
            node_metadata: Vec::new(),
            headers: Vec::new(),
            connect_retry_interval: Duration::from_secs(3),
            tls: None,
            backoff: Backoff::default(),
            max_message_size: None,
            merge_domains: false,
            store: json!({ "kind": "memory" }),
        }
    }

    fn push(configs: &[RateLimitConfig]) -> DiscoveryResponse {
        DiscoveryResponse {
            version_info: "1".into(),
            resources: configs
                .iter()
                .map(|config| Any {
                    type_url: RATE_LIMIT_CONFIG_TYPE.into(),
                    value: prost::Message::encode_to_vec(config),
                })
                .collect(),
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            nonce: "n".into(),
        }
    }

    fn limit(unit: i32, requests_per_unit: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit,
            requests_per_unit,
            ..Default::default()
        })
    }

    #[test]
    fn a_push_is_read_as_the_references_files_are() {
        let metadata = Struct {
            fields: [(
                "team".to_owned(),
                Value::of(Kind::StringValue("payments".into())),
            )]
            .into(),
        };
        let config = RateLimitConfig {
            name: "edge".into(),
            domain: "edge".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    key: "remote_address".into(),
                    rate_limit: limit(2, 10),
                    shadow_mode: true,
                    quota_mode: true,
                    metadata: Some(metadata),
                    ..Default::default()
                },
                RateLimitDescriptor {
                    key: "path".into(),
                    value: "/admin".into(),
                    descriptors: vec![RateLimitDescriptor {
                        key: "user".into(),
                        rate_limit: Some(RateLimitPolicy {
                            unlimited: true,
                            name: "admins".into(),
                            replaces: vec![RateLimitReplace {
                                name: "other".into(),
                            }],
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ],
        };
        let other = RateLimitConfig {
            name: "api".into(),
            domain: "api".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                rate_limit: limit(7, 3),
                ..Default::default()
            }],
        };
        let loaded = load_push(&push(&[config, other]), &settings()).unwrap();
        let mut names: Vec<&str> = loaded.domains.names().collect();
        names.sort();
        assert_eq!(names, ["api", "edge"]);
        let edge = loaded.domains.get("edge").unwrap();
        let mut limits = edge.limits();
        limits.sort_by(|a, b| a.stat_key.cmp(&b.stat_key));
        let keys: Vec<&str> = limits.iter().map(|l| l.stat_key.as_str()).collect();
        assert_eq!(keys, ["path_/admin.user", "remote_address"]);
        let (admins, address) = (limits[0], limits[1]);
        assert_eq!(admins.name, "admins");
        assert_eq!(admins.replaces, ["other"]);
        assert!(matches!(admins.kind, crate::tree::LimitKind::Unlimited));
        assert_eq!(
            (address.requests_per_unit, address.unit),
            (10, crate::unit::Unit::Minute)
        );
        assert!(address.shadow && address.quota);
        assert_eq!(
            Json::Object((**address.metadata.as_ref().unwrap()).clone()),
            json!({ "team": "payments" })
        );
        let api = loaded.domains.get("api").unwrap().limits();
        assert_eq!(api[0].unit, crate::unit::Unit::Week);
    }

    #[test]
    fn a_push_that_does_not_load_says_which_resource_and_why() {
        let error =
            |configs: &[RateLimitConfig]| load_push(&push(configs), &settings()).unwrap_err().0;
        let config = |name: &str, unit: i32| RateLimitConfig {
            name: name.into(),
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                rate_limit: limit(unit, 1),
                ..Default::default()
            }],
        };
        assert_eq!(
            error(&[config("a", 0)]),
            "RateLimitConfig \"a\": descriptors[0].rate_limit.unit: missing (second, minute, \
             hour, day, week, month or year)"
        );
        assert!(error(&[config("a", 9)]).contains("unknown unit \"9\""));
        // Two resources of one domain, as two files: refused unless MERGE_DOMAIN_CONFIG.
        let twice = [config("a", 1), config("b", 2)];
        assert!(error(&twice)
            .starts_with("RateLimitConfig \"b\": domain: \"edge\" is configured twice"));
        let merged = XdsSettings {
            merge_domains: true,
            ..settings()
        };
        let twice = [
            config("a", 1),
            RateLimitConfig {
                descriptors: vec![RateLimitDescriptor {
                    key: "other".into(),
                    rate_limit: limit(1, 1),
                    ..Default::default()
                }],
                ..config("b", 1)
            },
        ];
        let loaded = load_push(&push(&twice), &merged).unwrap();
        assert_eq!(loaded.domains.get("edge").unwrap().limits().len(), 2);
        // Not a RateLimitConfig.
        let mut wrong = push(&[config("a", 1)]);
        wrong.resources[0].type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster".into();
        assert!(load_push(&wrong, &settings())
            .unwrap_err()
            .0
            .starts_with("resources[0]: of type"));
    }

    #[test]
    fn random_numbers_are_in_range_and_vary() {
        let numbers: Vec<f64> = (0..100).map(|_| random()).collect();
        assert!(numbers.iter().all(|n| (0.0..1.0).contains(n)));
        assert!(numbers.windows(2).any(|w| w[0] != w[1]));
    }
}
