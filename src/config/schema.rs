//! The shape of a configuration file: serde structs, every table closed to unknown fields.
//!
//! Only the shape and the types are checked here; what the values mean together (a token bucket
//! needs a rate, a network needs an IP key, ...) is checked when the rules are built. Tables are
//! plain structs, never flattened or internally tagged: serde buffers those, and the place of an
//! error inside them would be lost.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::net::IpAddr;

use http::{HeaderName, Method};
use ipnet::IpNet;
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::duration::HumanDuration;
use super::error::closest;

/// A whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct File {
    /// Shadow mode for every rule (read when the layer is built).
    #[serde(default)]
    pub(crate) shadow: bool,
    /// Logs show a keyed hash of each key (read when the layer is built).
    #[serde(default)]
    pub(crate) redact_keys: RedactKeysSpec,
    /// Keys per rule in the top-offender lists (read when the layer is built).
    pub(crate) top_offenders: Option<usize>,
    /// Where counts live (read when the layer is built).
    pub(crate) store: Option<StoreSpec>,
    /// The responses (read when the layer is built).
    pub(crate) response: Option<ResponseSpec>,
    /// Never limited.
    #[serde(default)]
    pub(crate) allow: Vec<AccessSpec>,
    /// Always refused.
    #[serde(default)]
    pub(crate) deny: Vec<AccessSpec>,
    /// The rules, in order.
    pub(crate) rules: Vec<RuleSpec>,
}

/// `redact_keys`: `false`, `true` (under a random secret of the process), or
/// `{ secret = "..." }` (under a secret instances share).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum RedactKeysSpec {
    #[default]
    Off,
    PerProcess,
    Shared(SharedSecretSpec),
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct SharedSecretSpec {
    pub(crate) secret: Secret,
}

/// A secret from the file: compared, never shown (its `Debug` is a placeholder).
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub(crate) struct Secret(pub(crate) String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl<'de> Deserialize<'de> for RedactKeysSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RedactVisitor;
        impl<'de> Visitor<'de> for RedactVisitor {
            type Value = RedactKeysSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true, false, or a table { secret = \"...\" }")
            }
            fn visit_bool<E: de::Error>(self, on: bool) -> Result<RedactKeysSpec, E> {
                Ok(if on {
                    RedactKeysSpec::PerProcess
                } else {
                    RedactKeysSpec::Off
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RedactKeysSpec, A::Error> {
                SharedSecretSpec::deserialize(MapAccessDeserializer::new(map))
                    .map(RedactKeysSpec::Shared)
            }
        }
        deserializer.deserialize_any(RedactVisitor)
    }
}

/// `[store]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(try_from = "RawStoreSpec")]
pub(crate) struct StoreSpec {
    pub(crate) kind: StoreKind,
    pub(crate) max_keys: Option<usize>,
    pub(crate) url: Option<String>,
    pub(crate) timeout: Option<HumanDuration>,
    /// Redis: how long a concurrency slot's lease lives unless renewed.
    pub(crate) lease: Option<HumanDuration>,
    /// Redis: put before every key the store writes (several apps or environments on one
    /// Redis).
    pub(crate) prefix: Option<String>,
    pub(crate) on_failure: Option<OnFailure>,
    /// Redis over TLS (`rediss://`): a certificate authority to trust instead of the system's.
    pub(crate) ca_file: Option<std::path::PathBuf>,
    /// Redis over TLS: the client certificate a server asks for, and its key.
    pub(crate) client_cert_file: Option<std::path::PathBuf>,
    pub(crate) client_key_file: Option<std::path::PathBuf>,
    /// Postgres: the table of the rows (default `tollgate_state`).
    pub(crate) table: Option<String>,
    /// Postgres: create the table and its index if missing (default false).
    pub(crate) create_schema: Option<bool>,
}

/// `[store]` as written: `kind` may be left out when the url says it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStoreSpec {
    kind: Option<StoreKind>,
    max_keys: Option<usize>,
    url: Option<String>,
    timeout: Option<HumanDuration>,
    /// Redis: how long a concurrency slot's lease lives unless renewed.
    lease: Option<HumanDuration>,
    /// Redis: put before every key the store writes (several apps or environments on one
    /// Redis).
    prefix: Option<String>,
    on_failure: Option<OnFailure>,
    /// Redis over TLS (`rediss://`): a certificate authority to trust instead of the system's.
    ca_file: Option<std::path::PathBuf>,
    /// Redis over TLS: the client certificate a server asks for, and its key.
    client_cert_file: Option<std::path::PathBuf>,
    client_key_file: Option<std::path::PathBuf>,
    /// Postgres: the table of the rows (default `tollgate_state`).
    table: Option<String>,
    /// Postgres: create the table and its index if missing (default false).
    create_schema: Option<bool>,
}

impl TryFrom<RawStoreSpec> for StoreSpec {
    type Error = String;

    /// A `[store]` without `kind` is the store its url names: `postgres://` (or
    /// `postgresql://`) Postgres, any other url Redis; without a url, `kind` is required.
    fn try_from(raw: RawStoreSpec) -> Result<StoreSpec, String> {
        let kind = match (raw.kind, raw.url.as_deref()) {
            (Some(kind), _) => kind,
            (None, Some(url))
                if url.starts_with("postgres://") || url.starts_with("postgresql://") =>
            {
                StoreKind::Postgres
            }
            (None, Some(_)) => StoreKind::Redis,
            (None, None) => {
                return Err("missing field `kind` (memory, redis or postgres)".to_owned())
            }
        };
        Ok(StoreSpec {
            kind,
            max_keys: raw.max_keys,
            url: raw.url,
            timeout: raw.timeout,
            lease: raw.lease,
            prefix: raw.prefix,
            on_failure: raw.on_failure,
            ca_file: raw.ca_file,
            client_cert_file: raw.client_cert_file,
            client_key_file: raw.client_key_file,
            table: raw.table,
            create_schema: raw.create_schema,
        })
    }
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StoreKind {
    Memory,
    Redis,
    Postgres,
}

/// `on_failure`: `"open"`, `"closed"`, or `{ local = { share = 0.5 } }`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OnFailure {
    Open,
    Closed,
    Local { share: f64 },
}

// The schema compares whole files in tests; a share is never NaN once validated.
impl Eq for OnFailure {}

/// `[response]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResponseSpec {
    pub(crate) status: Option<u16>,
    pub(crate) headers_on_allowed: Option<bool>,
    pub(crate) legacy_headers: Option<bool>,
    pub(crate) jitter: Option<HumanDuration>,
}

/// One `[[allow]]` or `[[deny]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AccessSpec {
    pub(crate) key: KeySpec,
    #[serde(default)]
    pub(crate) values: Vec<String>,
    #[serde(default)]
    pub(crate) networks: Vec<Network>,
}

/// One `[[rules]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RuleSpec {
    pub(crate) name: String,
    pub(crate) algorithm: Option<AlgorithmName>,
    pub(crate) rate: Option<u64>,
    pub(crate) limit: Option<u64>,
    pub(crate) period: Option<HumanDuration>,
    /// `burst`, its spelling before 0.3, is refused with a did-you-mean (see `config::error`).
    pub(crate) capacity: Option<u64>,
    pub(crate) initial: Option<u64>,
    pub(crate) pool: Option<PoolSpec>,
    pub(crate) aligned: Option<bool>,
    pub(crate) aligned_at: Option<HumanDuration>,
    pub(crate) calendar: Option<CalendarName>,
    pub(crate) utc_offset: Option<String>,
    /// A concurrency limit, in place of `rate`/`limit`: at most this many in flight per key.
    pub(crate) concurrent: Option<u64>,
    pub(crate) key: Option<KeySpec>,
    pub(crate) on_missing_key: Option<MissingKeySpec>,
    #[serde(default)]
    pub(crate) methods: Vec<MethodName>,
    #[serde(default)]
    pub(crate) paths: Vec<String>,
    /// gRPC methods and services: `/package.Service/Method`, `/package.Service/*`.
    #[serde(default)]
    pub(crate) grpc: Vec<String>,
    pub(crate) cost: Option<CostSpec>,
    pub(crate) queue: Option<QueueSpec>,
    pub(crate) block: Option<BlockSpec>,
    pub(crate) count_if: Option<CountIfSpec>,
    pub(crate) settle: Option<SettleSpec>,
    pub(crate) lease: Option<LeaseSpec>,
    #[serde(default)]
    pub(crate) shadow: bool,
    /// Keys may get overrides (`Rule::overridable`).
    #[serde(default)]
    pub(crate) overrides: bool,
    pub(crate) tiers: Option<TiersSpec>,
}

/// A quota lease: `lease = { units = 10, ttl = "1s" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LeaseSpec {
    pub(crate) units: u64,
    pub(crate) ttl: HumanDuration,
}

impl RuleSpec {
    /// The limit's fields as written on the rule.
    pub(crate) fn limit_fields(&self) -> LimitFields {
        LimitFields {
            algorithm: self.algorithm,
            rate: self.rate,
            limit: self.limit,
            period: self.period.map(|d| d.0),
            capacity: self.capacity,
            initial: self.initial,
            pool: self.pool.clone(),
            aligned: self.aligned,
            aligned_at: self.aligned_at.map(|d| d.0),
            calendar: self.calendar,
            utc_offset: self.utc_offset.clone(),
            concurrent: self.concurrent,
        }
    }
}

/// The fields that make a rule's limit, shared by rules and plans.
#[derive(Clone, Debug, Default)]
pub(crate) struct LimitFields {
    pub(crate) algorithm: Option<AlgorithmName>,
    pub(crate) rate: Option<u64>,
    pub(crate) limit: Option<u64>,
    pub(crate) period: Option<std::time::Duration>,
    pub(crate) capacity: Option<u64>,
    pub(crate) initial: Option<u64>,
    pub(crate) pool: Option<PoolSpec>,
    pub(crate) aligned: Option<bool>,
    pub(crate) aligned_at: Option<std::time::Duration>,
    pub(crate) calendar: Option<CalendarName>,
    pub(crate) utc_offset: Option<String>,
    pub(crate) concurrent: Option<u64>,
}

impl LimitFields {
    /// These fields, with `base`'s where these have none.
    pub(crate) fn over(&self, base: &LimitFields) -> LimitFields {
        LimitFields {
            algorithm: self.algorithm.or(base.algorithm),
            rate: self.rate.or(base.rate),
            limit: self.limit.or(base.limit),
            period: self.period.or(base.period),
            capacity: self.capacity.or(base.capacity),
            initial: self.initial.or(base.initial),
            pool: self.pool.clone().or_else(|| base.pool.clone()),
            aligned: self.aligned.or(base.aligned),
            aligned_at: self.aligned_at.or(base.aligned_at),
            calendar: self.calendar.or(base.calendar),
            utc_offset: self.utc_offset.clone().or_else(|| base.utc_offset.clone()),
            concurrent: self.concurrent.or(base.concurrent),
        }
    }

    /// Whether `field` is written here.
    pub(crate) fn has(&self, field: &str) -> bool {
        match field {
            "algorithm" => self.algorithm.is_some(),
            "rate" => self.rate.is_some(),
            "limit" => self.limit.is_some(),
            "period" => self.period.is_some(),
            "capacity" => self.capacity.is_some(),
            "initial" => self.initial.is_some(),
            "aligned" => self.aligned.is_some(),
            "aligned_at" => self.aligned_at.is_some(),
            "calendar" => self.calendar.is_some(),
            "utc_offset" => self.utc_offset.is_some(),
            "concurrent" => self.concurrent.is_some(),
            _ if field == "pool" || field.starts_with("pool.") => self.pool.is_some(),
            _ => false,
        }
    }
}

/// `calendar = "month"` or `"week"` on a fixed window.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CalendarName {
    Month,
    Week,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum AlgorithmName {
    TokenBucket,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
}

impl fmt::Display for AlgorithmName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AlgorithmName::TokenBucket => "token_bucket",
            AlgorithmName::FixedWindow => "fixed_window",
            AlgorithmName::SlidingWindow => "sliding_window",
            AlgorithmName::SlidingLog => "sliding_log",
        })
    }
}

/// `pool = { capacity = 100, rate = 1, period = "1s" }`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PoolSpec {
    pub(crate) capacity: u64,
    pub(crate) rate: u64,
    pub(crate) period: HumanDuration,
}

/// `queue = { burst = 5, delay = 2, nodelay = false, max_delay = "10s" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct QueueSpec {
    pub(crate) burst: Option<u64>,
    pub(crate) delay: Option<u64>,
    #[serde(default)]
    pub(crate) nodelay: bool,
    pub(crate) max_delay: Option<HumanDuration>,
}

/// A penalty: `block = "10m"` or `block = { escalate = ["1m", "10m", "1h"], forget_after = "24h" }`.
#[derive(Debug)]
pub(crate) enum BlockSpec {
    Fixed(HumanDuration),
    Escalate(EscalateSpec),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EscalateSpec {
    pub(crate) escalate: Vec<HumanDuration>,
    pub(crate) forget_after: HumanDuration,
}

impl<'de> Deserialize<'de> for BlockSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BlockVisitor;
        impl<'de> Visitor<'de> for BlockVisitor {
            type Value = BlockSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a duration such as \"10m\", or a table { escalate = [DURATIONS], forget_after = DURATION }",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<BlockSpec, E> {
                super::duration::parse(v)
                    .map(|d| BlockSpec::Fixed(HumanDuration(d)))
                    .map_err(E::custom)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<BlockSpec, A::Error> {
                EscalateSpec::deserialize(MapAccessDeserializer::new(map)).map(BlockSpec::Escalate)
            }
        }
        deserializer.deserialize_any(BlockVisitor)
    }
}

/// Which responses count: `"failures"`, `"server_errors"`, `"successes"` or
/// `{ status = [401, 403] }`.
#[derive(Debug)]
pub(crate) enum CountIfSpec {
    Failures,
    ServerErrors,
    Successes,
    Status(Vec<u16>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusListSpec {
    status: Vec<u16>,
}

impl<'de> Deserialize<'de> for CountIfSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CountIfVisitor;
        impl<'de> Visitor<'de> for CountIfVisitor {
            type Value = CountIfSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "\"failures\", \"server_errors\", \"successes\" or a table { status = [CODES] }",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<CountIfSpec, E> {
                match v {
                    "failures" => Ok(CountIfSpec::Failures),
                    "server_errors" => Ok(CountIfSpec::ServerErrors),
                    "successes" => Ok(CountIfSpec::Successes),
                    other => Err(E::custom(unknown(
                        "response class",
                        other,
                        &["failures", "server_errors", "successes"],
                        "failures, server_errors, successes or { status = [CODES] }",
                    ))),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<CountIfSpec, A::Error> {
                StatusListSpec::deserialize(MapAccessDeserializer::new(map))
                    .map(|list| CountIfSpec::Status(list.status))
            }
        }
        deserializer.deserialize_any(CountIfVisitor)
    }
}

/// Where the real cost is read: `{ header = "x-tokens-used" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SettleSpec {
    pub(crate) header: HeaderNameSpec,
}

/// `[rules.tiers]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TiersSpec {
    pub(crate) from: Option<PlanSource>,
    pub(crate) keys: Option<BTreeMap<String, String>>,
    pub(crate) default: String,
    pub(crate) plans: Named<PlanSpec>,
}

/// One plan of a tiered rule: the limit fields it overrides.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PlanSpec {
    pub(crate) algorithm: Option<AlgorithmName>,
    pub(crate) rate: Option<u64>,
    pub(crate) limit: Option<u64>,
    pub(crate) period: Option<HumanDuration>,
    /// `burst`, its spelling before 0.3, is refused with a did-you-mean (see `config::error`).
    pub(crate) capacity: Option<u64>,
    pub(crate) initial: Option<u64>,
    pub(crate) pool: Option<PoolSpec>,
    pub(crate) aligned: Option<bool>,
    pub(crate) aligned_at: Option<HumanDuration>,
    pub(crate) calendar: Option<CalendarName>,
    pub(crate) utc_offset: Option<String>,
    pub(crate) concurrent: Option<u64>,
    #[serde(default)]
    pub(crate) unlimited: bool,
}

impl PlanSpec {
    /// The limit's fields as written on the plan.
    pub(crate) fn limit_fields(&self) -> LimitFields {
        LimitFields {
            algorithm: self.algorithm,
            rate: self.rate,
            limit: self.limit,
            period: self.period.map(|d| d.0),
            capacity: self.capacity,
            initial: self.initial,
            pool: self.pool.clone(),
            aligned: self.aligned,
            aligned_at: self.aligned_at.map(|d| d.0),
            calendar: self.calendar,
            utc_offset: self.utc_offset.clone(),
            concurrent: self.concurrent,
        }
    }
}

/// Where a request's plan comes from: `"key"`, `"extension"` or `{ header = "x-plan" }`.
#[derive(Debug)]
pub(crate) enum PlanSource {
    Key,
    Extension,
    Header(HeaderName),
}

impl<'de> Deserialize<'de> for PlanSource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PlanSourceVisitor;
        impl<'de> Visitor<'de> for PlanSourceVisitor {
            type Value = PlanSource;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"key\", \"extension\" or a table { header = NAME }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PlanSource, E> {
                match v {
                    "key" => Ok(PlanSource::Key),
                    "extension" => Ok(PlanSource::Extension),
                    "header" => Err(E::custom(
                        "a header source names the header: a table with `header = NAME`",
                    )),
                    other => Err(E::custom(unknown(
                        "plan source",
                        other,
                        &["key", "extension", "header"],
                        "key, extension or header",
                    ))),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PlanSource, A::Error> {
                let source = match one_entry_key(&mut map, "a plan source")?.as_str() {
                    "header" => PlanSource::Header(map.next_value::<HeaderNameSpec>()?.0),
                    "key" | "extension" => {
                        return Err(de::Error::custom(
                            "this plan source takes no settings: write it as a plain string",
                        ))
                    }
                    other => {
                        return Err(de::Error::custom(unknown(
                            "plan source",
                            other,
                            &["key", "extension", "header"],
                            "key, extension or header",
                        )))
                    }
                };
                no_more_entries(&mut map, "a plan source")?;
                Ok(source)
            }
        }
        deserializer.deserialize_any(PlanSourceVisitor)
    }
}

/// Where a rule's key comes from.
///
/// A plain string for the sources without settings (`"global"`, `"peer_ip"`, `"client_ip"`,
/// `"bearer"`), a table with one entry for the others (`{ header = "x-api-key" }`,
/// `{ cookie = "session" }`, `{ client_ip = { trust = [...] } }`, `{ first_of = [...] }`).
#[derive(Debug)]
pub(crate) enum KeySpec {
    Global,
    PeerIp,
    ClientIp(ClientIpSpec),
    Header(HeaderName),
    Bearer,
    Cookie(String),
    PathParam(String),
    FirstOf(Vec<KeySpec>),
}

const KEY_SOURCES: &str =
    "global, peer_ip, client_ip, bearer, header, cookie, path_param or first_of";
const KEY_SOURCE_NAMES: [&str; 8] = [
    "global",
    "peer_ip",
    "client_ip",
    "bearer",
    "header",
    "cookie",
    "path_param",
    "first_of",
];

impl<'de> Deserialize<'de> for KeySpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = KeySpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key source: a name such as \"peer_ip\", or a table such as { header = NAME }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeySpec, E> {
                match v {
                    "global" => Ok(KeySpec::Global),
                    "peer_ip" => Ok(KeySpec::PeerIp),
                    "client_ip" => Ok(KeySpec::ClientIp(ClientIpSpec::default())),
                    "bearer" => Ok(KeySpec::Bearer),
                    "header" | "cookie" | "path_param" | "first_of" => Err(E::custom(format!(
                        "the {v} key source needs a setting: a table with `{v} = ...`"
                    ))),
                    other => Err(E::custom(unknown(
                        "key source",
                        other,
                        &KEY_SOURCE_NAMES,
                        KEY_SOURCES,
                    ))),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KeySpec, A::Error> {
                let key = match one_entry_key(&mut map, "a key source")?.as_str() {
                    "header" => KeySpec::Header(map.next_value::<HeaderNameSpec>()?.0),
                    "cookie" => KeySpec::Cookie(map.next_value()?),
                    "path_param" => KeySpec::PathParam(map.next_value()?),
                    "client_ip" => KeySpec::ClientIp(map.next_value()?),
                    "first_of" => KeySpec::FirstOf(map.next_value()?),
                    plain @ ("global" | "peer_ip" | "bearer") => {
                        return Err(de::Error::custom(format!(
                            "the {plain} key source takes no settings: write it as a plain string"
                        )))
                    }
                    other => {
                        return Err(de::Error::custom(unknown(
                            "key source",
                            other,
                            &KEY_SOURCE_NAMES,
                            KEY_SOURCES,
                        )))
                    }
                };
                no_more_entries(&mut map, "a key source")?;
                Ok(key)
            }
        }
        deserializer.deserialize_any(KeyVisitor)
    }
}

/// `{ client_ip = { trust = ["10.0.0.0/8"], header = "x-forwarded-for", ... } }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClientIpSpec {
    #[serde(default)]
    pub(crate) trust: Vec<Network>,
    #[serde(default)]
    pub(crate) trust_loopback: bool,
    pub(crate) header: Option<ForwardedHeaderName>,
    pub(crate) ipv6_prefix: Option<u32>,
    pub(crate) ipv4_prefix: Option<u32>,
    #[serde(default)]
    pub(crate) cdn: Vec<CdnSpec>,
}

/// `{ header = "cf-connecting-ip", trust = ["173.245.48.0/20", ...] }`: a CDN's client-IP
/// header, honoured from its edge networks only.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CdnSpec {
    pub(crate) header: CdnHeaderName,
    pub(crate) trust: Vec<Network>,
}

/// A CDN's client-IP header, by its HTTP name.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub(crate) enum CdnHeaderName {
    #[serde(rename = "cf-connecting-ip")]
    CfConnecting,
    #[serde(rename = "true-client-ip")]
    TrueClient,
    #[serde(rename = "fastly-client-ip")]
    FastlyClient,
    #[serde(rename = "fly-client-ip")]
    FlyClient,
}

/// The forwarding header trusted proxies set, by its HTTP name.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub(crate) enum ForwardedHeaderName {
    #[serde(rename = "x-forwarded-for")]
    XForwardedFor,
    #[serde(rename = "forwarded")]
    Forwarded,
    #[serde(rename = "x-real-ip")]
    XRealIp,
}

/// What a rule does without a key: `"reject"`, `"skip"`, `{ reject = 401 }` or
/// `{ fallback = <key source> }`.
#[derive(Debug)]
pub(crate) enum MissingKeySpec {
    Reject,
    RejectWith(u16),
    Skip,
    Fallback(KeySpec),
}

impl<'de> Deserialize<'de> for MissingKeySpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MissingVisitor;
        impl<'de> Visitor<'de> for MissingVisitor {
            type Value = MissingKeySpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"reject\", \"skip\", { reject = STATUS } or { fallback = KEY }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<MissingKeySpec, E> {
                match v {
                    "reject" => Ok(MissingKeySpec::Reject),
                    "skip" => Ok(MissingKeySpec::Skip),
                    other => Err(E::custom(unknown(
                        "action",
                        other,
                        &["reject", "skip"],
                        "reject, skip, { reject = STATUS } or { fallback = KEY }",
                    ))),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MissingKeySpec, A::Error> {
                let action = match one_entry_key(&mut map, "an action")?.as_str() {
                    "reject" => MissingKeySpec::RejectWith(map.next_value()?),
                    "fallback" => MissingKeySpec::Fallback(map.next_value()?),
                    other => {
                        return Err(de::Error::custom(unknown(
                            "action",
                            other,
                            &["reject", "fallback"],
                            "reject or fallback",
                        )))
                    }
                };
                no_more_entries(&mut map, "an action")?;
                Ok(action)
            }
        }
        deserializer.deserialize_any(MissingVisitor)
    }
}

/// A request's cost: a whole number, or `{ header = "x-cost", default = 1 }`.
#[derive(Debug)]
pub(crate) enum CostSpec {
    Fixed(u64),
    Header(CostHeaderSpec),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CostHeaderSpec {
    pub(crate) header: HeaderNameSpec,
    pub(crate) default: Option<u64>,
}

impl<'de> Deserialize<'de> for CostSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CostVisitor;
        impl<'de> Visitor<'de> for CostVisitor {
            type Value = CostSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number of units or a table { header = NAME, default = UNITS }")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<CostSpec, E> {
                Ok(CostSpec::Fixed(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<CostSpec, E> {
                u64::try_from(v)
                    .map(CostSpec::Fixed)
                    .map_err(|_| E::custom(format!("must not be negative (got {v})")))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<CostSpec, A::Error> {
                CostHeaderSpec::deserialize(MapAccessDeserializer::new(map)).map(CostSpec::Header)
            }
        }
        deserializer.deserialize_any(CostVisitor)
    }
}

/// An HTTP header name.
#[derive(Debug)]
pub(crate) struct HeaderNameSpec(pub(crate) HeaderName);

impl<'de> Deserialize<'de> for HeaderNameSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        HeaderName::from_bytes(name.as_bytes())
            .map(HeaderNameSpec)
            .map_err(|_| de::Error::custom(format!("invalid header name {name:?}")))
    }
}

/// An HTTP method: a standard one by name, case-sensitive as in HTTP (`"GET"`, not `"get"`),
/// or any other token asked for explicitly as `{ extension = "PURGE" }` — so a typo such as
/// `"POTS"` is an error rather than a rule that never applies.
#[derive(Debug)]
pub(crate) struct MethodName(pub(crate) Method);

impl<'de> Deserialize<'de> for MethodName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MethodName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a method such as \"GET\", or { extension = NAME }")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<MethodName, E> {
                let upper = name.to_ascii_uppercase();
                match Method::from_bytes(upper.as_bytes()) {
                    Ok(method) if is_standard(&method) && upper == name => Ok(MethodName(method)),
                    Ok(method) if is_standard(&method) => Err(E::custom(format!(
                        "methods are case-sensitive: write {upper:?}, not {name:?}"
                    ))),
                    Ok(_) => Err(E::custom(match closest(name, &STANDARD_NAMES) {
                        Some(near) => format!(
                            "unknown method {name:?} (did you mean {near:?}? an extension \
                             method is written {{ extension = {name:?} }})"
                        ),
                        None => format!(
                            "unknown method {name:?} (expected one of {}; an extension \
                             method is written {{ extension = {name:?} }})",
                            STANDARD_NAMES.join(", ")
                        ),
                    })),
                    Err(_) => Err(E::custom(format!("invalid method {name:?}"))),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MethodName, A::Error> {
                let entry = one_entry_key(&mut map, "an extension method")?;
                if entry != "extension" {
                    return Err(de::Error::custom(format!(
                        "unknown method form `{entry}` (expected a method name or {{ extension = NAME }})"
                    )));
                }
                let name: String = map.next_value()?;
                no_more_entries(&mut map, "an extension method")?;
                match Method::from_bytes(name.as_bytes()) {
                    Ok(method) if !is_standard(&method) => Ok(MethodName(method)),
                    Ok(_) => Err(de::Error::custom(format!(
                        "{name:?} is a standard method: write it as a plain string"
                    ))),
                    Err(_) => Err(de::Error::custom(format!("invalid method {name:?}"))),
                }
            }
        }
        deserializer.deserialize_any(V)
    }
}

const STANDARD_NAMES: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

fn is_standard(method: &Method) -> bool {
    [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::CONNECT,
        Method::OPTIONS,
        Method::TRACE,
        Method::PATCH,
    ]
    .contains(method)
}

/// A network (`"10.0.0.0/8"`, `"2001:db8::/32"`) or one address (`"192.0.2.10"`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Network(pub(crate) IpNet);

impl<'de> Deserialize<'de> for Network {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let trimmed = text.trim();
        trimmed
            .parse::<IpNet>()
            .or_else(|_| trimmed.parse::<IpAddr>().map(IpNet::from))
            .map(Network)
            .map_err(|_| {
                de::Error::custom(format!(
                    "invalid network {text:?} (expected an address or a CIDR network such as \"10.0.0.0/8\")"
                ))
            })
    }
}

/// A table whose entries are named and kept in the file's order (plans).
#[derive(Debug)]
pub(crate) struct Named<T>(pub(crate) Vec<(String, T)>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Named<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NamedVisitor<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for NamedVisitor<T> {
            type Value = Named<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a table of named entries")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Named<T>, A::Error> {
                let mut entries: Vec<(String, T)> = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    if entries.iter().any(|(seen, _)| *seen == name) {
                        return Err(de::Error::custom(format!("{name:?} appears twice")));
                    }
                    let value = map.next_value()?;
                    entries.push((name, value));
                }
                Ok(Named(entries))
            }
        }
        deserializer.deserialize_map(NamedVisitor(PhantomData))
    }
}

/// "unknown {what} {value:?}", and the name among `names` it is likely a misspelling of, or else
/// what is `expected`.
fn unknown(what: &str, value: &str, names: &[&str], expected: &str) -> String {
    match closest(value, names) {
        Some(near) => format!("unknown {what} {value:?} (did you mean {near:?}?)"),
        None => format!("unknown {what} {value:?} (expected {expected})"),
    }
}

/// The name of the only entry of a one-entry table.
fn one_entry_key<'de, A: MapAccess<'de>>(map: &mut A, what: &str) -> Result<String, A::Error> {
    map.next_key::<String>()?
        .ok_or_else(|| de::Error::custom(format!("{what} cannot be an empty table")))
}

fn no_more_entries<'de, A: MapAccess<'de>>(map: &mut A, what: &str) -> Result<(), A::Error> {
    match map.next_key::<String>()? {
        None => Ok(()),
        Some(extra) => Err(de::Error::custom(format!(
            "{what} is a table with exactly one entry (found another: `{extra}`)"
        ))),
    }
}
