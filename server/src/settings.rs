//! The reference service's environment (envoyproxy/ratelimit's variables) into tollgate-server's
//! settings: what a Deployment written for the reference (Istio's sample, Envoy Gateway's) sets
//! is read with the reference's names, defaults and meaning, so changing the image is the whole
//! migration. Flags, when given, win (the binary applies them over what this returns).
//!
//! Every variable the reference defines is known here: read and honoured, or named once at
//! start-up as meaningless here or not supported (never silently ignored). A value that cannot
//! be read stops the start, naming the variable.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use crate::source::xds::{Backoff, XdsSettings, XdsTls};
use crate::stats::exporter::PrometheusSettings;
use crate::stats::mapper::Mapper;
use crate::stats::statsd::{StatsdSettings, Transport};

pub use crate::load::RuntimeDir;

/// The settings the environment gives.
#[derive(Clone, Debug, PartialEq)]
pub struct FromEnvironment {
    /// Where HTTP (`/healthcheck`, `/metrics`) is served: `HOST`:`PORT`.
    pub http_addr: SocketAddr,
    /// Where gRPC is served: `GRPC_HOST`:`GRPC_PORT`.
    pub grpc_addr: SocketAddr,
    /// The configuration's directory and how it is read.
    pub runtime: RuntimeDir,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`: serve (healthy, no limits) although the first
    /// configuration cannot be read, and take it when it can.
    pub force_start: bool,
    /// The store the reference's variables name (`BACKEND_TYPE`, `REDIS_*`,
    /// `CACHE_KEY_PREFIX`), as the library's `[store]` table.
    pub store: Value,
    /// `LOG_LEVEL`.
    pub log_level: tracing::Level,
    /// `LOG_FORMAT`: `json` (else text).
    pub log_json: bool,
    /// `TLS on the gRPC port`: `GRPC_SERVER_USE_TLS` with its certificate and key, and
    /// `GRPC_CLIENT_TLS_CACERT` (+ `GRPC_CLIENT_TLS_SAN`) for client certificates.
    pub grpc_tls: Option<TlsFiles>,
    /// Where statistics are pushed under the reference's statsd names (`USE_STATSD`, default
    /// on as in the reference, `STATSD_HOST`, `STATSD_PORT`, `STATSD_PROTOCOL`, `EXTRA_TAGS`,
    /// `STATS_FLUSH_INTERVAL`).
    pub statsd: Option<StatsdSettings>,
    /// Where the reference's statsd names are served as Prometheus series, through a
    /// statsd-exporter mapping (`USE_PROMETHEUS`, `PROMETHEUS_ADDR`, `PROMETHEUS_PATH`,
    /// `PROMETHEUS_MAPPER_YAML`, `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`).
    pub prometheus: Option<PrometheusSettings>,
    /// How answers are written: `QUOTA_MODE`, `SHADOW_MODE`, `RESPONSE_DYNAMIC_METADATA`,
    /// `NEAR_LIMIT_RATIO`, `LIMIT_RESPONSE_HEADERS_ENABLED` and its three header names.
    pub answering: Answering,
    /// `CONFIG_TYPE=GRPC_XDS_SOTW`: the configuration is pushed by this xDS management server
    /// (the `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*` variables) rather than read from
    /// `runtime`.
    pub xds: Option<XdsSettings>,
    /// Variables that are set and that tollgate-server does not act on, each with why: said
    /// once at start-up.
    pub notices: Vec<String>,
}

/// How answers are made: the switches the reference service reads from its environment
/// (`QUOTA_MODE`, `SHADOW_MODE`, `RESPONSE_DYNAMIC_METADATA`, `NEAR_LIMIT_RATIO`,
/// `LIMIT_RESPONSE_HEADERS_ENABLED` and its header names). [`Default`] is the reference's
/// defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Answering {
    /// Every limit is a quota limit (`QUOTA_MODE`): a request is OVER_LIMIT only when every
    /// quota descriptor is; as in the reference, a descriptor with no limit is one, and passes.
    pub quota_mode: bool,
    /// Every answer is OK (`SHADOW_MODE`): decided and counted as usual, the descriptors' own
    /// codes kept, `overall_code` OK; counted in `ratelimit_service_global_shadow_mode`.
    pub shadow_mode: bool,
    /// Answers carry `dynamic_metadata` (`RESPONSE_DYNAMIC_METADATA`): the domain, the
    /// descriptors, `hitsAddend`, and the `metadata` of the limits that passed.
    pub response_dynamic_metadata: bool,
    /// A limit is near once more than this share of it is used (`NEAR_LIMIT_RATIO`, 0.8):
    /// the `near_limit` statistic.
    pub near_limit_ratio: f32,
    /// The reference's three fields for the descriptor closest to its limit
    /// (`LIMIT_RESPONSE_HEADERS_ENABLED`), beside tollgate's own; `None`: not written.
    pub reference_headers: Option<ReferenceHeaders>,
}

impl Default for Answering {
    fn default() -> Self {
        Answering {
            quota_mode: false,
            shadow_mode: false,
            response_dynamic_metadata: false,
            near_limit_ratio: 0.8,
            reference_headers: None,
        }
    }
}

/// The names of the reference's response fields (`LIMIT_LIMIT_HEADER`,
/// `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReferenceHeaders {
    /// The limit's `requests_per_unit` (default `RateLimit-Limit`).
    pub limit: String,
    /// What is left (default `RateLimit-Remaining`).
    pub remaining: String,
    /// Seconds until the limit resets (default `RateLimit-Reset`).
    pub reset: String,
}

impl Default for ReferenceHeaders {
    fn default() -> Self {
        ReferenceHeaders {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

/// The certificate files of a TLS listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// Client certificates are required and must chain to this CA (PEM): mutual TLS.
    pub client_ca: Option<PathBuf>,
    /// A client certificate must also name this SAN (DNS name).
    pub client_san: Option<String>,
}

/// A variable whose value cannot be used: the start stops, naming it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingsError(pub String);

impl std::fmt::Display for SettingsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SettingsError {}

/// What the reference's debug port serves is elsewhere here.
const NO_DEBUG_LISTENER: &str = "there is no debug listener; /metrics and /healthcheck are on \
     HOST:PORT, blocks and overrides on the admin API (TOLLGATE_ADMIN_ADDR)";

/// What tollgate-server does with each variable the reference defines but does not act on here.
/// (The ones it reads are handled by [`read`].)
const NOT_ACTED_ON: &[(&str, &str)] = &[
    ("DEBUG_HOST", NO_DEBUG_LISTENER),
    ("DEBUG_PORT", NO_DEBUG_LISTENER),
    (
        "GRPC_UDS",
        "not supported: gRPC is served on GRPC_HOST:GRPC_PORT",
    ),
    (
        "GRPC_MAX_CONNECTION_AGE",
        "not supported yet: connections live until the client closes them",
    ),
    ("GRPC_MAX_CONNECTION_AGE_GRACE", "not supported yet"),
    (
        "USE_DOG_STATSD",
        "not supported: statistics are on /metrics (Prometheus)",
    ),
    ("USE_DOG_STATSD_MOGRIFIERS", "not supported"),
    (
        "DISABLE_STATS",
        "not supported: statistics are always counted",
    ),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        "meaningless here: every key expires exactly when its state equals a new key's",
    ),
    (
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "meaningless here: the Redis store caches its denials by itself",
    ),
    (
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        "meaningless here: a request over any limit charges nothing, always",
    ),
    (
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        "not supported yet: healthy once serving",
    ),
    (
        "REDIS_POOL_SIZE",
        "meaningless here: one multiplexed connection carries every call",
    ),
    (
        "REDIS_PIPELINE_WINDOW",
        "meaningless here: calls are multiplexed on one connection",
    ),
    (
        "REDIS_PIPELINE_LIMIT",
        "meaningless here: calls are multiplexed on one connection",
    ),
    ("REDIS_CLUSTER_PIPELINE_PARALLELISM", "meaningless here"),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "meaningless here: a circuit breaker probes the store",
    ),
    (
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "meaningless here: there is no pool",
    ),
    (
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "meaningless here: the store connects when first asked",
    ),
    (
        "REDIS_STARTUP_MAX_INTERVAL",
        "meaningless here: the store connects when first asked",
    ),
    (
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        "meaningless here: the store connects when first asked",
    ),
    (
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        "not supported: hostnames are verified",
    ),
    ("REDIS_SENTINEL_AUTH", "not supported yet"),
    (
        "REDIS_PERSECOND",
        "meaningless here: one store holds every limit",
    ),
    (
        "REDIS_PERSECOND_SOCKET_TYPE",
        "meaningless here: one store holds every limit",
    ),
    (
        "REDIS_PERSECOND_TYPE",
        "meaningless here: one store holds every limit",
    ),
    (
        "REDIS_PERSECOND_URL",
        "meaningless here: one store holds every limit",
    ),
    ("REDIS_PERSECOND_POOL_SIZE", "meaningless here"),
    ("REDIS_PERSECOND_AUTH", "meaningless here"),
    ("REDIS_PERSECOND_TLS", "meaningless here"),
    ("REDIS_PERSECOND_SENTINEL_AUTH", "meaningless here"),
    ("REDIS_PERSECOND_PIPELINE_WINDOW", "meaningless here"),
    ("REDIS_PERSECOND_PIPELINE_LIMIT", "meaningless here"),
    (
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        "meaningless here",
    ),
    ("REDIS_PERSECOND_TIMEOUT", "meaningless here"),
    ("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "meaningless here"),
    (
        "MEMCACHE_HOST_PORT",
        "not supported: BACKEND_TYPE is redis or memory",
    ),
    (
        "MEMCACHE_MAX_IDLE_CONNS",
        "not supported: BACKEND_TYPE is redis or memory",
    ),
    (
        "MEMCACHE_SRV",
        "not supported: BACKEND_TYPE is redis or memory",
    ),
    (
        "MEMCACHE_SRV_REFRESH",
        "not supported: BACKEND_TYPE is redis or memory",
    ),
    (
        "MEMCACHE_TLS",
        "not supported: BACKEND_TYPE is redis or memory",
    ),
    ("MEMCACHE_TLS_CLIENT_CERT", "not supported"),
    ("MEMCACHE_TLS_CLIENT_KEY", "not supported"),
    ("MEMCACHE_TLS_CACERT", "not supported"),
    ("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "not supported"),
    (
        "TRACING_ENABLED",
        "not supported: tollgate-server writes logs, not traces",
    ),
    ("TRACING_SERVICE_NAME", "not supported"),
    ("TRACING_SERVICE_NAMESPACE", "not supported"),
    ("TRACING_SERVICE_INSTANCE_ID", "not supported"),
    ("TRACING_EXPORTER_PROTOCOL", "not supported"),
    ("TRACING_SAMPLING_RATE", "not supported"),
];

/// Every variable read here, with its default (what `--help` lists).
pub const READ: &[(&str, &str)] = &[
    ("HOST", "0.0.0.0: where /healthcheck and /metrics are served"),
    ("PORT", "8080"),
    ("GRPC_HOST", "0.0.0.0: where RateLimitService is served"),
    ("GRPC_PORT", "8081"),
    ("LOG_LEVEL", "info: debug, info, warn or error"),
    ("LOG_FORMAT", "text: text or json"),
    ("CONFIG_TYPE", "FILE: FILE (RUNTIME_ROOT…), or GRPC_XDS_SOTW (pushed by an xDS management server)"),
    ("RUNTIME_ROOT", "/srv/runtime_data/current"),
    ("RUNTIME_SUBDIRECTORY", "(empty)"),
    ("RUNTIME_APPDIRECTORY", "config: the configuration is every *.yaml under ROOT/SUBDIRECTORY/APPDIRECTORY"),
    ("RUNTIME_IGNOREDOTFILES", "false: skip names starting with a dot (set it for ConfigMap volumes)"),
    ("RUNTIME_WATCH_ROOT", "true: either way the directory is read and reloaded alike"),
    ("MERGE_DOMAIN_CONFIG", "false: files naming one domain are merged instead of refused"),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", "false: serve, with no limits, although no configuration can be read yet"),
    ("BACKEND_TYPE", "redis: redis, memory (tollgate's, one process) or postgres (tollgate's, POSTGRES_URL)"),
    ("POSTGRES_URL", "(none): postgres://user@host[:port]/database with BACKEND_TYPE=postgres; the table is created if missing"),
    ("REDIS_SOCKET_TYPE", "unix: tcp or unix"),
    ("REDIS_URL", "/var/run/nutcracker/ratelimit.sock: host:port (tcp) or a socket path (unix)"),
    ("REDIS_TYPE", "SINGLE: SINGLE, or SENTINEL with REDIS_URL master-name,host:port,… (CLUSTER is not supported yet)"),
    ("REDIS_AUTH", "(none): a password, or user:password"),
    ("REDIS_TLS", "false: TLS to Redis"),
    ("REDIS_TLS_CACERT", "(the system's roots): the CA Redis' certificate chains to (PEM)"),
    ("REDIS_TLS_CLIENT_CERT", "(none): a client certificate for Redis (PEM), with REDIS_TLS_CLIENT_KEY"),
    ("REDIS_TLS_CLIENT_KEY", "(none): its key (PEM)"),
    ("REDIS_TIMEOUT", "10s: the longest one store call may take"),
    ("CACHE_KEY_PREFIX", "(none): put before every key the store writes"),
    ("USE_STATSD", "true: push the reference's statsd names (STATSD_HOST:STATSD_PORT)"),
    ("STATSD_HOST", "localhost"),
    ("STATSD_PORT", "8125"),
    ("STATSD_PROTOCOL", "tcp: tcp or udp"),
    ("EXTRA_TAGS", "(none): k1:v1,k2:v2 appended to every statsd name"),
    ("STATS_FLUSH_INTERVAL", "10s: how often statsd counters are sent"),
    ("USE_PROMETHEUS", "false: also serve the reference's statsd names as Prometheus series (PROMETHEUS_ADDR)"),
    ("PROMETHEUS_ADDR", ":9090: [IP]:PORT of that listener (:PORT is every interface)"),
    ("PROMETHEUS_PATH", "/metrics"),
    ("PROMETHEUS_MAPPER_YAML", "(the reference's mapping): a statsd-exporter mapping file"),
    ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "false: the reference's mapping keeps the response time in milliseconds"),
    ("QUOTA_MODE", "false: every limit a quota limit (OVER_LIMIT only when every quota descriptor is)"),
    ("SHADOW_MODE", "false: every answer OK, decided and counted as usual"),
    ("RESPONSE_DYNAMIC_METADATA", "false: answers carry dynamic_metadata"),
    ("NEAR_LIMIT_RATIO", "0.8: a limit is near (near_limit) once more than this share is used"),
    ("LIMIT_RESPONSE_HEADERS_ENABLED", "false: also the reference's three fields, for the descriptor closest to its limit"),
    ("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
    ("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
    ("LIMIT_RESET_HEADER", "RateLimit-Reset"),
    ("GRPC_SERVER_USE_TLS", "false: TLS on the gRPC port"),
    ("GRPC_SERVER_TLS_CERT", "the gRPC port's certificate (PEM)"),
    ("GRPC_SERVER_TLS_KEY", "its private key (PEM)"),
    ("GRPC_CLIENT_TLS_CACERT", "(none): require client certificates chaining to this CA (mutual TLS)"),
    ("GRPC_CLIENT_TLS_SAN", "(none): and naming this SAN"),
    ("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000: the xDS management server (host:port), with CONFIG_TYPE=GRPC_XDS_SOTW"),
    ("CONFIG_GRPC_XDS_NODE_ID", "default: the node id the management server keys its snapshots by"),
    ("CONFIG_GRPC_XDS_NODE_METADATA", "(none): the node's metadata, k1=v1,k2=v2 (k:v too)"),
    ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "(none): gRPC metadata sent with the stream, k1:v1,k2:v2"),
    ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s: the wait (±50%) before connecting again"),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "false: TLS to the management server"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "(none): the client certificate (PEM), with its key"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "(none): its private key (PEM)"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "(the system's roots): the CA the management server's certificate chains to"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "(the URL's host): the name its certificate must hold"),
    ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s: the wait before a lost stream is opened again"),
    ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s: the longest such wait"),
    ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.5: the wait's multiplier per attempt, as the reference uses it"),
    ("XDS_CLIENT_BACKOFF_JITTER", "true: a random wait between the initial and the computed one"),
    ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "(gRPC's 4 MiB): the largest push accepted"),
];

/// The xDS variables, read only with `CONFIG_TYPE=GRPC_XDS_SOTW`.
const XDS_VARIABLES: &[&str] = &[
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_NODE_METADATA",
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
    "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_BACKOFF_JITTER",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
];

/// The settings `env` (the process's environment, or a test's) gives.
pub fn read(
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<FromEnvironment, SettingsError> {
    let env: BTreeMap<String, String> = env.into_iter().collect();
    let get = |name: &str| env.get(name).map(String::as_str);
    let text = |name: &str, default: &str| get(name).unwrap_or(default).to_owned();

    let http_addr = address(&env, "HOST", "PORT", 8080)?;
    let grpc_addr = address(&env, "GRPC_HOST", "GRPC_PORT", 8081)?;

    let from_xds = match get("CONFIG_TYPE").map(str::to_ascii_uppercase).as_deref() {
        None | Some("FILE") => false,
        Some("GRPC_XDS_SOTW") => true,
        Some(other) => {
            return Err(SettingsError(format!(
                "CONFIG_TYPE={other:?}: expected FILE or GRPC_XDS_SOTW"
            )))
        }
    };
    let root = PathBuf::from(text("RUNTIME_ROOT", "/srv/runtime_data/current"));
    let runtime = RuntimeDir {
        dir: root
            .join(text("RUNTIME_SUBDIRECTORY", ""))
            .join(text("RUNTIME_APPDIRECTORY", "config")),
        ignore_dotfiles: boolean(&env, "RUNTIME_IGNOREDOTFILES", false)?,
        merge_domains: boolean(&env, "MERGE_DOMAIN_CONFIG", false)?,
    };
    // Read for its validity only: the directory is compared with the one in force every
    // interval whether its root is a symlink Kubernetes swaps or not.
    boolean(&env, "RUNTIME_WATCH_ROOT", true)?;
    let force_start = boolean(&env, "FORCE_START_WITHOUT_INITIAL_CONFIG", false)?;

    let log_level = match get("LOG_LEVEL").map(str::to_ascii_lowercase).as_deref() {
        None => tracing::Level::INFO,
        Some("trace") => tracing::Level::TRACE,
        Some("debug") => tracing::Level::DEBUG,
        Some("info") => tracing::Level::INFO,
        Some("warn" | "warning") => tracing::Level::WARN,
        Some("error" | "fatal" | "panic") => tracing::Level::ERROR,
        Some(other) => {
            return Err(SettingsError(format!(
                "LOG_LEVEL={other:?}: expected debug, info, warn or error"
            )))
        }
    };
    let log_json = match get("LOG_FORMAT").map(str::to_ascii_lowercase).as_deref() {
        None | Some("text") => false,
        Some("json") => true,
        Some(other) => {
            return Err(SettingsError(format!(
                "LOG_FORMAT={other:?}: expected text or json"
            )))
        }
    };

    let store = store(&env)?;
    let grpc_tls = grpc_tls(&env)?;
    let near_limit_ratio = match get("NEAR_LIMIT_RATIO") {
        None => Answering::default().near_limit_ratio,
        Some(text) => match text.trim().parse::<f32>() {
            Ok(ratio) if (0.0..=1.0).contains(&ratio) => ratio,
            _ => {
                return Err(SettingsError(format!(
                    "NEAR_LIMIT_RATIO={text:?}: expected a number between 0 and 1"
                )))
            }
        },
    };
    let statsd = statsd(&env)?;
    let prometheus = prometheus(&env)?;
    let names = ReferenceHeaders::default();
    for name in [
        "LIMIT_LIMIT_HEADER",
        "LIMIT_REMAINING_HEADER",
        "LIMIT_RESET_HEADER",
    ] {
        if let Some(value) = get(name) {
            if http::HeaderName::from_bytes(value.as_bytes()).is_err() {
                return Err(SettingsError(format!(
                    "{name}={value:?}: not a valid header field name"
                )));
            }
        }
    }
    let answering = Answering {
        quota_mode: boolean(&env, "QUOTA_MODE", false)?,
        shadow_mode: boolean(&env, "SHADOW_MODE", false)?,
        response_dynamic_metadata: boolean(&env, "RESPONSE_DYNAMIC_METADATA", false)?,
        near_limit_ratio,
        reference_headers: boolean(&env, "LIMIT_RESPONSE_HEADERS_ENABLED", false)?.then(|| {
            ReferenceHeaders {
                limit: text("LIMIT_LIMIT_HEADER", &names.limit),
                remaining: text("LIMIT_REMAINING_HEADER", &names.remaining),
                reset: text("LIMIT_RESET_HEADER", &names.reset),
            }
        }),
    };

    let xds = if from_xds {
        Some(xds(&env, store.clone(), runtime.merge_domains)?)
    } else {
        None
    };

    let mut notices: Vec<String> = NOT_ACTED_ON
        .iter()
        .filter(|(name, _)| env.contains_key(*name))
        .map(|(name, why)| format!("{name} is set: {why}"))
        .collect();
    if !from_xds {
        notices.extend(
            XDS_VARIABLES
                .iter()
                .filter(|name| env.contains_key(**name))
                .map(|name| format!("{name} is set: read only with CONFIG_TYPE=GRPC_XDS_SOTW")),
        );
    }
    Ok(FromEnvironment {
        http_addr,
        grpc_addr,
        runtime,
        force_start,
        store,
        log_level,
        log_json,
        grpc_tls,
        statsd,
        prometheus,
        answering,
        xds,
        notices,
    })
}

/// `host` and `port`: an IPv4 or IPv6 address (`::` for every interface) and a port.
fn address(
    env: &BTreeMap<String, String>,
    host: &str,
    port: &str,
    default_port: u16,
) -> Result<SocketAddr, SettingsError> {
    let ip: IpAddr = match env.get(host) {
        None => IpAddr::from([0, 0, 0, 0]),
        Some(text) => text
            .trim_matches(|c| c == '[' || c == ']')
            .parse()
            .map_err(|_| {
                SettingsError(format!(
                    "{host}={text:?}: expected an IP address (0.0.0.0, ::, 127.0.0.1)"
                ))
            })?,
    };
    let port = number(env, port, default_port)?;
    Ok(SocketAddr::new(ip, port))
}

fn number<T: std::str::FromStr>(
    env: &BTreeMap<String, String>,
    name: &str,
    default: T,
) -> Result<T, SettingsError> {
    match env.get(name) {
        None => Ok(default),
        Some(text) => text
            .trim()
            .parse()
            .map_err(|_| SettingsError(format!("{name}={text:?}: expected a number"))),
    }
}

/// A boolean as Go's `strconv.ParseBool` reads it (the reference's parser): 1, t, T, TRUE,
/// true, True, 0, f, F, FALSE, false, False.
fn boolean(
    env: &BTreeMap<String, String>,
    name: &str,
    default: bool,
) -> Result<bool, SettingsError> {
    match env.get(name).map(String::as_str) {
        None => Ok(default),
        Some("1" | "t" | "T" | "TRUE" | "true" | "True") => Ok(true),
        Some("0" | "f" | "F" | "FALSE" | "false" | "False") => Ok(false),
        Some(other) => Err(SettingsError(format!(
            "{name}={other:?}: expected true or false"
        ))),
    }
}

/// A duration as Go writes one (`10s`, `500ms`, `1m30s`, `1h`).
fn duration(
    env: &BTreeMap<String, String>,
    name: &str,
    default: Duration,
) -> Result<Duration, SettingsError> {
    match env.get(name) {
        None => Ok(default),
        Some(text) => humantime::parse_duration(text.trim()).map_err(|_| {
            SettingsError(format!(
                "{name}={text:?}: expected a duration such as 500ms, 10s or 1m30s"
            ))
        }),
    }
}

/// The library's `[store]` table from `BACKEND_TYPE`, `REDIS_*` and `CACHE_KEY_PREFIX`.
fn store(env: &BTreeMap<String, String>) -> Result<Value, SettingsError> {
    let get = |name: &str| env.get(name).map(String::as_str);
    match get("BACKEND_TYPE").map(str::to_ascii_lowercase).as_deref() {
        None | Some("redis") => {}
        Some("memory") => return Ok(json!({ "kind": "memory" })),
        // tollgate's own: the counts in a Postgres table, created if missing.
        Some("postgres") => {
            let url = get("POSTGRES_URL")
                .filter(|url| !url.is_empty())
                .ok_or_else(|| {
                    SettingsError("BACKEND_TYPE=postgres needs POSTGRES_URL (postgres://…)".into())
                })?;
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                return Err(SettingsError(format!(
                    "POSTGRES_URL={url:?}: expected postgres://user@host[:port]/database"
                )));
            }
            return Ok(json!({ "kind": "postgres", "url": url, "create_schema": true }));
        }
        Some("memcache") => {
            return Err(SettingsError(
                "BACKEND_TYPE=memcache: not supported; use redis, or memory for one process".into(),
            ))
        }
        Some(other) => {
            return Err(SettingsError(format!(
                "BACKEND_TYPE={other:?}: expected redis, memory or postgres"
            )))
        }
    }
    let sentinel = match get("REDIS_TYPE").map(str::to_ascii_uppercase).as_deref() {
        None | Some("SINGLE") => false,
        Some("SENTINEL") => true,
        Some("CLUSTER") => {
            return Err(SettingsError(
                "REDIS_TYPE=CLUSTER: not supported yet from the environment; use SINGLE or \
                 SENTINEL, or tollgate's own file's [store]"
                    .into(),
            ))
        }
        Some(other) => {
            return Err(SettingsError(format!(
                "REDIS_TYPE={other:?}: expected SINGLE, SENTINEL or CLUSTER"
            )))
        }
    };
    let tls = boolean(env, "REDIS_TLS", false)?;
    let url = get("REDIS_URL").unwrap_or("/var/run/nutcracker/ratelimit.sock");
    // REDIS_AUTH is a password, or `user:password` (the reference's two forms).
    let auth = get("REDIS_AUTH")
        .filter(|auth| !auth.is_empty())
        .map(|auth| {
            let (user, password) = auth.split_once(':').unwrap_or(("", auth));
            format!("{}:{}@", percent_encode(user), percent_encode(password))
        })
        .unwrap_or_default();
    let url = match get("REDIS_SOCKET_TYPE")
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("unix") => {
            if tls {
                return Err(SettingsError(
                    "REDIS_TLS=true with REDIS_SOCKET_TYPE=unix: TLS needs a tcp socket".into(),
                ));
            }
            if !auth.is_empty() {
                let password = get("REDIS_AUTH").unwrap_or_default();
                let (_, password) = password.split_once(':').unwrap_or(("", password));
                format!("redis+unix://{url}?pass={}", percent_encode(password))
            } else {
                format!("redis+unix://{url}")
            }
        }
        // The reference's Sentinel form: `master-name,host:port[,host:port…]`.
        Some("tcp") if sentinel => {
            let mut parts = url.split(',');
            let master = parts.next().unwrap_or_default();
            let sentinels: Vec<&str> = parts.collect();
            if master.is_empty() || sentinels.is_empty() {
                return Err(SettingsError(format!(
                    "REDIS_URL={url:?}: expected master-name,host:port[,host:port…] \
                     (REDIS_TYPE=SENTINEL)"
                )));
            }
            if tls || !auth.is_empty() {
                return Err(SettingsError(
                    "REDIS_TYPE=SENTINEL with REDIS_TLS or REDIS_AUTH: not supported yet".into(),
                ));
            }
            format!("redis+sentinel://{}/{master}", sentinels.join(","))
        }
        Some("tcp") => {
            if url.contains("://") || url.is_empty() {
                return Err(SettingsError(format!(
                    "REDIS_URL={url:?}: expected host:port (REDIS_SOCKET_TYPE=tcp)"
                )));
            }
            let scheme = if tls { "rediss" } else { "redis" };
            format!("{scheme}://{auth}{url}")
        }
        Some(other) => {
            return Err(SettingsError(format!(
                "REDIS_SOCKET_TYPE={other:?}: expected tcp or unix"
            )))
        }
    };
    let timeout = duration(env, "REDIS_TIMEOUT", Duration::from_secs(10))?;
    let mut store = json!({
        "kind": "redis",
        "url": url,
        "timeout": format!("{}ms", timeout.as_millis().max(1)),
    });
    // Redis over TLS: the files the library's `[store]` reads.
    let tls_file = |name: &str| get(name).filter(|path| !path.is_empty());
    let tls_files = [
        ("REDIS_TLS_CACERT", "ca_file"),
        ("REDIS_TLS_CLIENT_CERT", "client_cert_file"),
        ("REDIS_TLS_CLIENT_KEY", "client_key_file"),
    ];
    for (variable, field) in tls_files {
        if let Some(path) = tls_file(variable) {
            if !tls {
                return Err(SettingsError(format!(
                    "{variable} is set without REDIS_TLS=true: the certificate would not be used"
                )));
            }
            store[field] = Value::from(path);
        }
    }
    if tls_file("REDIS_TLS_CLIENT_CERT").is_some() != tls_file("REDIS_TLS_CLIENT_KEY").is_some() {
        return Err(SettingsError(
            "REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY: give both or neither".into(),
        ));
    }
    if let Some(prefix) = get("CACHE_KEY_PREFIX").filter(|p| !p.is_empty()) {
        store["prefix"] = Value::from(prefix);
    }
    Ok(store)
}

fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The statsd sink, from `USE_STATSD` and its variables.
fn statsd(env: &BTreeMap<String, String>) -> Result<Option<StatsdSettings>, SettingsError> {
    if !boolean(env, "USE_STATSD", true)? {
        return Ok(None);
    }
    let defaults = StatsdSettings::default();
    let transport = match env.get("STATSD_PROTOCOL").map(|p| p.to_ascii_lowercase()) {
        None => defaults.transport,
        Some(p) if p == "tcp" => Transport::Tcp,
        Some(p) if p == "udp" => Transport::Udp,
        Some(other) => {
            return Err(SettingsError(format!(
                "STATSD_PROTOCOL={other:?}: expected tcp or udp"
            )))
        }
    };
    // `k1:v1,k2:v2`, as the reference's map variables are written.
    let mut extra_tags = Vec::new();
    if let Some(tags) = env.get("EXTRA_TAGS").filter(|tags| !tags.is_empty()) {
        for pair in tags.split(',') {
            let Some((key, value)) = pair.split_once(':') else {
                return Err(SettingsError(format!(
                    "EXTRA_TAGS={tags:?}: expected key:value pairs separated by commas"
                )));
            };
            extra_tags.push((key.trim().to_owned(), value.trim().to_owned()));
        }
    }
    Ok(Some(StatsdSettings {
        host: env.get("STATSD_HOST").cloned().unwrap_or(defaults.host),
        port: number(env, "STATSD_PORT", defaults.port)?,
        transport,
        flush_interval: duration(env, "STATS_FLUSH_INTERVAL", defaults.flush_interval)?,
        extra_tags,
    }))
}

/// The xDS client, from the `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*` variables, with the
/// reference's defaults.
fn xds(
    env: &BTreeMap<String, String>,
    store: Value,
    merge_domains: bool,
) -> Result<XdsSettings, SettingsError> {
    let get = |name: &str| env.get(name).map(String::as_str).filter(|v| !v.is_empty());
    let server_url = get("CONFIG_GRPC_XDS_SERVER_URL").unwrap_or("localhost:18000");
    let well_formed = server_url.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok()
    });
    if !well_formed {
        return Err(SettingsError(format!(
            "CONFIG_GRPC_XDS_SERVER_URL={server_url:?}: expected host:port"
        )));
    }
    // `k1=v1,k2=v2` as the reference splits it; `k:v` (the form its documentation shows, which
    // its parser drops) is read too rather than ignored.
    let mut node_metadata = Vec::new();
    for entry in get("CONFIG_GRPC_XDS_NODE_METADATA")
        .unwrap_or_default()
        .split(',')
        .filter(|entry| !entry.trim().is_empty())
    {
        let pair = entry.split_once('=').or_else(|| entry.split_once(':'));
        let Some((key, value)) = pair.filter(|(key, _)| !key.trim().is_empty()) else {
            return Err(SettingsError(format!(
                "CONFIG_GRPC_XDS_NODE_METADATA: {entry:?}: expected key=value pairs separated \
                 by commas"
            )));
        };
        node_metadata.push((key.trim().to_owned(), value.trim().to_owned()));
    }
    // `k1:v1,k2:v2`, as the reference's map variables are written; gRPC metadata names are
    // lower case (gRPC lowers them too).
    let mut headers = Vec::new();
    if let Some(list) = get("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS") {
        for entry in list.split(',').filter(|entry| !entry.trim().is_empty()) {
            let header = entry.split_once(':').and_then(|(name, value)| {
                let name = http::HeaderName::from_bytes(name.trim().as_bytes()).ok()?;
                http::HeaderValue::from_str(value.trim()).ok()?;
                Some((name.as_str().to_owned(), value.trim().to_owned()))
            });
            match header {
                Some(header) => headers.push(header),
                None => {
                    return Err(SettingsError(format!(
                        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: {entry:?}: expected \
                         name:value pairs separated by commas (valid header names and values)"
                    )))
                }
            }
        }
    }
    let tls = if boolean(env, "CONFIG_GRPC_XDS_SERVER_USE_TLS", false)? {
        let path = |name: &str| get(name).map(PathBuf::from);
        let (cert, key) = (
            path("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
            path("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
        );
        if cert.is_some() != key.is_some() {
            let missing = if cert.is_some() {
                "CONFIG_GRPC_XDS_CLIENT_TLS_KEY"
            } else {
                "CONFIG_GRPC_XDS_CLIENT_TLS_CERT"
            };
            return Err(SettingsError(format!(
                "{missing}: required with the other of CONFIG_GRPC_XDS_CLIENT_TLS_CERT and \
                 CONFIG_GRPC_XDS_CLIENT_TLS_KEY (a PEM file)"
            )));
        }
        Some(XdsTls {
            cert,
            key,
            ca: path("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"),
            san: get("CONFIG_GRPC_XDS_SERVER_TLS_SAN").map(str::to_owned),
        })
    } else {
        None
    };
    let defaults = Backoff::default();
    let factor = match get("XDS_CLIENT_BACKOFF_RANDOM_FACTOR") {
        None => defaults.factor,
        Some(text) => match text.trim().parse::<f64>() {
            Ok(factor) if factor.is_finite() && factor >= 0.0 => factor,
            _ => {
                return Err(SettingsError(format!(
                    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR={text:?}: expected a number, 0 or more"
                )))
            }
        },
    };
    let max_message_size: usize = number(env, "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 0)?;
    Ok(XdsSettings {
        server_url: server_url.to_owned(),
        node_id: get("CONFIG_GRPC_XDS_NODE_ID")
            .unwrap_or("default")
            .to_owned(),
        node_metadata,
        headers,
        connect_retry_interval: duration(
            env,
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            Duration::from_secs(3),
        )?,
        tls,
        backoff: Backoff {
            initial: duration(env, "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", defaults.initial)?,
            max: duration(env, "XDS_CLIENT_BACKOFF_MAX_INTERVAL", defaults.max)?,
            factor,
            jitter: boolean(env, "XDS_CLIENT_BACKOFF_JITTER", defaults.jitter)?,
        },
        max_message_size: (max_message_size > 0).then_some(max_message_size),
        merge_domains,
        store,
    })
}

/// The reference's Prometheus listener, from `USE_PROMETHEUS` and its variables; the mapping
/// file is read here, so that one that cannot be used stops the start naming the variable.
fn prometheus(env: &BTreeMap<String, String>) -> Result<Option<PrometheusSettings>, SettingsError> {
    let milliseconds = boolean(env, "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", false)?;
    if !boolean(env, "USE_PROMETHEUS", false)? {
        return Ok(None);
    }
    let addr = match env.get("PROMETHEUS_ADDR") {
        None => SocketAddr::from(([0, 0, 0, 0], 9090)),
        Some(text) => listen_address(text).ok_or_else(|| {
            SettingsError(format!(
                "PROMETHEUS_ADDR={text:?}: expected :PORT (every interface) or IP:PORT \
                 (:19001, 127.0.0.1:9090, [::]:9090)"
            ))
        })?,
    };
    let path = env
        .get("PROMETHEUS_PATH")
        .map_or("/metrics", String::as_str);
    if !path.starts_with('/') {
        return Err(SettingsError(format!(
            "PROMETHEUS_PATH={path:?}: expected a path starting with /"
        )));
    }
    let mapper = match env
        .get("PROMETHEUS_MAPPER_YAML")
        .filter(|file| !file.is_empty())
    {
        None => Mapper::reference(milliseconds),
        Some(file) => {
            let text = std::fs::read_to_string(file).map_err(|error| {
                SettingsError(format!(
                    "PROMETHEUS_MAPPER_YAML={file:?}: cannot read it: {error}"
                ))
            })?;
            Mapper::from_yaml(std::path::Path::new(file), &text)
                .map_err(|error| SettingsError(format!("PROMETHEUS_MAPPER_YAML: {error}")))?
        }
    };
    Ok(Some(PrometheusSettings {
        addr,
        path: path.to_owned(),
        mapper: std::sync::Arc::new(mapper),
    }))
}

/// A listening address as Go writes one: `:PORT` (every interface), `IP:PORT`, `[IPv6]:PORT`,
/// `localhost:PORT`.
pub fn listen_address(text: &str) -> Option<SocketAddr> {
    let (host, port) = text.trim().rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let ip: IpAddr = match host.trim_start_matches('[').trim_end_matches(']') {
        "" => IpAddr::from([0, 0, 0, 0]),
        "localhost" => IpAddr::from([127, 0, 0, 1]),
        ip => ip.parse().ok()?,
    };
    Some(SocketAddr::new(ip, port))
}

/// TLS on the gRPC port, from `GRPC_SERVER_USE_TLS` and its files.
fn grpc_tls(env: &BTreeMap<String, String>) -> Result<Option<TlsFiles>, SettingsError> {
    if !boolean(env, "GRPC_SERVER_USE_TLS", false)? {
        return Ok(None);
    }
    let file = |name: &str| -> Result<PathBuf, SettingsError> {
        match env.get(name).filter(|path| !path.is_empty()) {
            Some(path) => Ok(PathBuf::from(path)),
            None => Err(SettingsError(format!(
                "{name}: required with GRPC_SERVER_USE_TLS=true (a PEM file)"
            ))),
        }
    };
    Ok(Some(TlsFiles {
        cert: file("GRPC_SERVER_TLS_CERT")?,
        key: file("GRPC_SERVER_TLS_KEY")?,
        client_ca: env
            .get("GRPC_CLIENT_TLS_CACERT")
            .filter(|path| !path.is_empty())
            .map(PathBuf::from),
        client_san: env
            .get("GRPC_CLIENT_TLS_SAN")
            .filter(|san| !san.is_empty())
            .cloned(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_reference_defaults() {
        let settings = read(env(&[])).unwrap();
        assert_eq!(settings.http_addr, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(settings.grpc_addr, "0.0.0.0:8081".parse().unwrap());
        assert_eq!(
            settings.runtime.dir,
            PathBuf::from("/srv/runtime_data/current/config")
        );
        assert!(!settings.runtime.ignore_dotfiles);
        assert_eq!(
            settings.store,
            json!({ "kind": "redis", "url": "redis+unix:///var/run/nutcracker/ratelimit.sock", "timeout": "10000ms" })
        );
        assert!(settings.notices.is_empty());
        // The reference pushes statsd to localhost:8125 over TCP unless told not to.
        assert_eq!(settings.statsd, Some(StatsdSettings::default()));
    }

    #[test]
    fn statsd_variables() {
        let settings = read(env(&[
            ("STATSD_HOST", "statsd.monitoring"),
            ("STATSD_PORT", "9125"),
            ("STATSD_PROTOCOL", "udp"),
            ("EXTRA_TAGS", "app:rl,version:1"),
            ("STATS_FLUSH_INTERVAL", "1s"),
            ("DEBUG_PORT", "6070"),
        ]))
        .unwrap();
        let statsd = settings.statsd.unwrap();
        assert_eq!(
            (statsd.host.as_str(), statsd.port),
            ("statsd.monitoring", 9125)
        );
        assert_eq!(statsd.transport, Transport::Udp);
        assert_eq!(statsd.flush_interval, Duration::from_secs(1));
        assert_eq!(
            statsd.extra_tags,
            [
                ("app".to_owned(), "rl".to_owned()),
                ("version".to_owned(), "1".to_owned())
            ]
        );
        assert_eq!(settings.notices.len(), 1, "{:?}", settings.notices);
        assert!(settings.notices[0].starts_with("DEBUG_PORT is set: "));
    }

    /// What Istio's sample (`samples/ratelimit/rate-limit-service.yaml`) sets.
    #[test]
    fn istios_sample() {
        let settings = read(env(&[
            ("LOG_LEVEL", "debug"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6379"),
            ("USE_STATSD", "false"),
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("HOST", "::"),
            ("GRPC_HOST", "::"),
        ]))
        .unwrap();
        assert_eq!(settings.http_addr, "[::]:8080".parse().unwrap());
        assert_eq!(settings.grpc_addr, "[::]:8081".parse().unwrap());
        assert_eq!(
            settings.runtime.dir,
            PathBuf::from("/data/ratelimit/config")
        );
        assert!(settings.runtime.ignore_dotfiles);
        assert_eq!(settings.store["url"], "redis://redis:6379");
        assert_eq!(settings.log_level, tracing::Level::DEBUG);
        // Every variable the sample sets is acted on.
        assert!(settings.notices.is_empty(), "{:?}", settings.notices);
        assert_eq!(settings.statsd, None);
    }

    #[test]
    fn redis_variables() {
        let settings = read(env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.example:6380"),
            ("REDIS_AUTH", "user:p@ss"),
            ("REDIS_TLS", "true"),
            ("REDIS_TIMEOUT", "250ms"),
            ("CACHE_KEY_PREFIX", "edge_"),
        ]))
        .unwrap();
        assert_eq!(
            settings.store,
            json!({ "kind": "redis", "url": "rediss://user:p%40ss@redis.example:6380", "timeout": "250ms", "prefix": "edge_" })
        );
        let sentinel = read(env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
        ]))
        .unwrap();
        assert_eq!(
            sentinel.store["url"],
            "redis+sentinel://s1:26379,s2:26379/mymaster"
        );
        let tls = read(env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6380"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", "/redis-certs/ca.crt"),
            ("REDIS_TLS_CLIENT_CERT", "/redis-certs/tls.crt"),
            ("REDIS_TLS_CLIENT_KEY", "/redis-certs/tls.key"),
        ]))
        .unwrap();
        assert_eq!(tls.store["url"], "rediss://redis:6380");
        assert_eq!(tls.store["ca_file"], "/redis-certs/ca.crt");
        assert_eq!(tls.store["client_cert_file"], "/redis-certs/tls.crt");
        assert_eq!(tls.store["client_key_file"], "/redis-certs/tls.key");
        let without = read(env(&[("REDIS_TLS_CACERT", "/ca.crt")])).unwrap_err().0;
        assert!(
            without.starts_with("REDIS_TLS_CACERT is set without REDIS_TLS=true"),
            "{without}"
        );
        let memory = read(env(&[("BACKEND_TYPE", "memory")])).unwrap();
        assert_eq!(memory.store, json!({ "kind": "memory" }));
        let postgres = read(env(&[
            ("BACKEND_TYPE", "postgres"),
            ("POSTGRES_URL", "postgres://rl@db:5432/rl"),
        ]))
        .unwrap();
        assert_eq!(
            postgres.store,
            json!({ "kind": "postgres", "url": "postgres://rl@db:5432/rl", "create_schema": true })
        );
        let error = read(env(&[("BACKEND_TYPE", "postgres")])).unwrap_err().0;
        assert!(error.contains("POSTGRES_URL"), "{error}");
    }

    #[test]
    fn a_value_that_cannot_be_read_names_its_variable() {
        let error = |pairs: &[(&str, &str)]| read(env(pairs)).unwrap_err().0;
        assert_eq!(
            error(&[("GRPC_PORT", "eighty")]),
            "GRPC_PORT=\"eighty\": expected a number"
        );
        assert!(error(&[("HOST", "localhost")]).starts_with("HOST=\"localhost\": expected an IP"));
        assert!(error(&[("RUNTIME_IGNOREDOTFILES", "yes")]).starts_with("RUNTIME_IGNOREDOTFILES="));
        assert!(error(&[("BACKEND_TYPE", "memcache")]).contains("not supported"));
        assert!(error(&[("REDIS_TIMEOUT", "soon")]).starts_with("REDIS_TIMEOUT="));
        assert!(error(&[("LOG_LEVEL", "loud")]).starts_with("LOG_LEVEL="));
        assert!(
            error(&[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "redis://x:1")])
                .starts_with("REDIS_URL=")
        );
        assert_eq!(
            error(&[("GRPC_SERVER_USE_TLS", "true")]),
            "GRPC_SERVER_TLS_CERT: required with GRPC_SERVER_USE_TLS=true (a PEM file)"
        );
        assert!(error(&[("CONFIG_TYPE", "XDS")]).starts_with("CONFIG_TYPE=\"XDS\""));
        assert!(error(&[("NEAR_LIMIT_RATIO", "2")]).starts_with("NEAR_LIMIT_RATIO="));
        assert!(error(&[("LIMIT_RESET_HEADER", "bad name")]).starts_with("LIMIT_RESET_HEADER="));
    }

    /// Envoy Gateway's default Deployment of the rate-limit service
    /// (`internal/infrastructure/kubernetes/ratelimit/testdata/deployments/default.yaml`), its
    /// variables exactly, but for the mapping file's path: a file the test writes (Envoy Gateway
    /// mounts its ConfigMap there; this machine has none).
    fn envoy_gateway() -> Vec<(String, String)> {
        static MAPPING: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
        let dir = MAPPING.get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("conf.yaml"), "mappings: []\n").unwrap();
            dir
        });
        let mapping = dir.path().join("conf.yaml").display().to_string();
        let mut env = env(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("LOG_LEVEL", "info"),
            ("USE_STATSD", "false"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.redis.svc:6379"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("PROMETHEUS_MAPPER_YAML", "(the test's file)"),
        ]);
        for (name, value) in &mut env {
            if name == "PROMETHEUS_MAPPER_YAML" {
                value.clone_from(&mapping);
            }
        }
        env
    }

    #[test]
    fn envoy_gateways_deployment() {
        let settings = read(envoy_gateway()).unwrap();
        let xds = settings.xds.expect("CONFIG_TYPE=GRPC_XDS_SOTW");
        assert_eq!(xds.server_url, "envoy-gateway:18001");
        assert_eq!(xds.node_id, "envoy-ratelimit");
        assert!(xds.node_metadata.is_empty() && xds.headers.is_empty());
        assert_eq!(
            xds.tls,
            Some(XdsTls {
                cert: Some("/certs/tls.crt".into()),
                key: Some("/certs/tls.key".into()),
                ca: Some("/certs/ca.crt".into()),
                san: None,
            })
        );
        // The reference's defaults for what the Deployment leaves out.
        assert_eq!(xds.connect_retry_interval, Duration::from_secs(3));
        assert_eq!(xds.backoff, Backoff::default());
        assert_eq!(xds.max_message_size, None);
        assert!(!xds.merge_domains);
        assert_eq!(xds.store["url"], "redis://redis.redis.svc:6379");
        assert!(settings.force_start);
        let tls = settings.grpc_tls.unwrap();
        assert_eq!(tls.cert, PathBuf::from("/certs/tls.crt"));
        assert_eq!(settings.statsd, None);
        // Every xDS variable is read: none is named as not acted on.
        assert!(
            settings.notices.iter().all(|n| !n.contains("XDS")),
            "{:?}",
            settings.notices
        );
    }

    #[test]
    fn xds_variables() {
        let mut vars = envoy_gateway();
        vars.extend(env(&[
            (
                "CONFIG_GRPC_XDS_NODE_METADATA",
                "zone=eu-1,team:edge,url=a=b",
            ),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "X-Tenant:acme,authorization:Bearer t",
            ),
            ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "250ms"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.internal"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1s"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "2m"),
            ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2"),
            ("XDS_CLIENT_BACKOFF_JITTER", "false"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "8388608"),
            ("MERGE_DOMAIN_CONFIG", "true"),
        ]));
        let xds = read(vars).unwrap().xds.unwrap();
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(
            xds.node_metadata,
            pairs(&[("zone", "eu-1"), ("team", "edge"), ("url", "a=b")])
        );
        assert_eq!(
            xds.headers,
            pairs(&[("x-tenant", "acme"), ("authorization", "Bearer t")])
        );
        assert_eq!(xds.connect_retry_interval, Duration::from_millis(250));
        assert_eq!(xds.tls.unwrap().san.as_deref(), Some("xds.internal"));
        assert_eq!(
            xds.backoff,
            Backoff {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(120),
                factor: 2.0,
                jitter: false
            }
        );
        assert_eq!(xds.max_message_size, Some(8 << 20));
        assert!(xds.merge_domains);

        // The reference's defaults, without TLS.
        let plain = read(env(&[("CONFIG_TYPE", "grpc_xds_sotw")]))
            .unwrap()
            .xds
            .unwrap();
        assert_eq!(
            (plain.server_url.as_str(), plain.node_id.as_str()),
            ("localhost:18000", "default")
        );
        assert_eq!(plain.tls, None);

        // Set with CONFIG_TYPE=FILE, they are named, not silently ignored.
        let file = read(env(&[("CONFIG_GRPC_XDS_NODE_ID", "n")])).unwrap();
        assert_eq!(file.xds, None);
        assert_eq!(
            file.notices,
            ["CONFIG_GRPC_XDS_NODE_ID is set: read only with CONFIG_TYPE=GRPC_XDS_SOTW"]
        );
    }

    #[test]
    fn a_malformed_xds_variable_names_itself() {
        let error = |pairs: &[(&str, &str)]| {
            let mut vars = env(&[("CONFIG_TYPE", "GRPC_XDS_SOTW")]);
            vars.extend(env(pairs));
            read(vars).unwrap_err().0
        };
        for (name, value) in [
            ("CONFIG_GRPC_XDS_SERVER_URL", "http://xds"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "xds:port"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "novalue"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "bad name:v"),
            ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "soon"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "yes"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "x"),
            ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "-1"),
            ("XDS_CLIENT_BACKOFF_JITTER", "maybe"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "big"),
        ] {
            let message = error(&[(name, value)]);
            assert!(message.starts_with(name), "{name}={value}: {message}");
        }
        assert!(error(&[
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/c.crt"),
        ])
        .starts_with("CONFIG_GRPC_XDS_CLIENT_TLS_KEY: required"));
    }

    /// What Envoy Gateway's Deployment of the reference sets for its statistics.
    #[test]
    fn envoy_gateways_statistics_variables() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("conf.yaml");
        std::fs::write(
            &file,
            "mappings:\n  - match: \"ratelimit.service.rate_limit.*.*.total_hits\"\n    name: hits\n",
        )
        .unwrap();
        let settings = read(env(&[
            ("USE_STATSD", "false"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("PROMETHEUS_MAPPER_YAML", file.to_str().unwrap()),
        ]))
        .unwrap();
        assert!(settings.notices.is_empty(), "{:?}", settings.notices);
        assert_eq!(settings.statsd, None);
        let prometheus = settings.prometheus.unwrap();
        assert_eq!(prometheus.addr, "0.0.0.0:19001".parse().unwrap());
        assert_eq!(prometheus.path, "/metrics");
        assert_ne!(*prometheus.mapper, Mapper::reference(false));
        // The defaults: :9090, the reference's own mapping; off unless asked.
        let default = read(env(&[("USE_PROMETHEUS", "1")]))
            .unwrap()
            .prometheus
            .unwrap();
        assert_eq!(default.addr, "0.0.0.0:9090".parse().unwrap());
        assert_eq!(*default.mapper, Mapper::reference(false));
        let milliseconds = read(env(&[
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true"),
            ("PROMETHEUS_ADDR", "[::1]:0"),
            ("PROMETHEUS_PATH", "/stats"),
        ]))
        .unwrap()
        .prometheus
        .unwrap();
        assert_eq!(*milliseconds.mapper, Mapper::reference(true));
        assert_eq!(milliseconds.addr, "[::1]:0".parse().unwrap());
        assert_eq!(milliseconds.path, "/stats");
        assert_eq!(read(env(&[])).unwrap().prometheus, None);

        let error = |pairs: &[(&str, &str)]| read(env(pairs)).unwrap_err().0;
        assert!(error(&[("USE_PROMETHEUS", "yes")]).starts_with("USE_PROMETHEUS=\"yes\""));
        let on = ("USE_PROMETHEUS", "true");
        assert!(error(&[on, ("PROMETHEUS_ADDR", "19001")]).starts_with("PROMETHEUS_ADDR=\"19001\""));
        assert!(
            error(&[on, ("PROMETHEUS_ADDR", "metrics.local:80")]).starts_with("PROMETHEUS_ADDR=")
        );
        assert!(error(&[on, ("PROMETHEUS_PATH", "metrics")]).starts_with("PROMETHEUS_PATH="));
        assert!(error(&[("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "ms")])
            .starts_with("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS="));
        let missing = dir.path().join("absent.yaml");
        assert!(
            error(&[on, ("PROMETHEUS_MAPPER_YAML", missing.to_str().unwrap())])
                .starts_with("PROMETHEUS_MAPPER_YAML=\"")
        );
        std::fs::write(&file, "mappings:\n  - match: [\n").unwrap();
        let broken = error(&[on, ("PROMETHEUS_MAPPER_YAML", file.to_str().unwrap())]);
        assert!(
            broken.starts_with(&format!("PROMETHEUS_MAPPER_YAML: {}:", file.display())),
            "{broken}"
        );
    }

    #[test]
    fn the_answering_variables() {
        let settings = read(env(&[
            ("QUOTA_MODE", "true"),
            ("SHADOW_MODE", "1"),
            ("RESPONSE_DYNAMIC_METADATA", "True"),
            ("NEAR_LIMIT_RATIO", "0.5"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_RESET_HEADER", "X-Reset"),
        ]))
        .unwrap();
        let answering = settings.answering;
        assert!(
            answering.quota_mode && answering.shadow_mode && answering.response_dynamic_metadata
        );
        assert_eq!(answering.near_limit_ratio, 0.5);
        let names = answering.reference_headers.unwrap();
        assert_eq!(
            (names.limit.as_str(), names.reset.as_str()),
            ("RateLimit-Limit", "X-Reset")
        );
        assert!(settings.notices.is_empty(), "{:?}", settings.notices);
    }
}
