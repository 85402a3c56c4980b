//! The messages of the aggregated discovery service and of the reference's `RateLimitConfig`,
//! written by hand with prost's derive, field numbers as in Envoy's `discovery.proto`,
//! `base.proto`, google's `any.proto` and `status.proto`, and go-control-plane's
//! `ratelimit/config/ratelimit/v3/rls_conf.proto`. Fields this client does not use are left
//! out: prost skips unknown fields.

pub use crate::service::protocol::{Kind, ListValue, Struct, Value};

/// The method's path.
pub const STREAM_AGGREGATED_RESOURCES: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

/// The type URL of the resources asked for.
pub const RATE_LIMIT_CONFIG_TYPE: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// `envoy.service.discovery.v3.DiscoveryRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DiscoveryRequest {
    /// `string version_info = 1`: the last version accepted (empty before the first).
    #[prost(string, tag = "1")]
    pub version_info: String,
    /// `config.core.v3.Node node = 2`.
    #[prost(message, optional, tag = "2")]
    pub node: Option<Node>,
    /// `repeated string resource_names = 3`: none, every resource of the type (a wildcard).
    #[prost(string, repeated, tag = "3")]
    pub resource_names: Vec<String>,
    /// `string type_url = 4`.
    #[prost(string, tag = "4")]
    pub type_url: String,
    /// `string response_nonce = 5`: the nonce of the response this request answers.
    #[prost(string, tag = "5")]
    pub response_nonce: String,
    /// `google.rpc.Status error_detail = 6`: set when the response was refused (a NACK).
    #[prost(message, optional, tag = "6")]
    pub error_detail: Option<Status>,
}

/// `envoy.service.discovery.v3.DiscoveryResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DiscoveryResponse {
    /// `string version_info = 1`.
    #[prost(string, tag = "1")]
    pub version_info: String,
    /// `repeated google.protobuf.Any resources = 2`: the whole state of the world.
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<Any>,
    /// `string type_url = 4`.
    #[prost(string, tag = "4")]
    pub type_url: String,
    /// `string nonce = 5`.
    #[prost(string, tag = "5")]
    pub nonce: String,
}

/// `envoy.config.core.v3.Node`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Node {
    /// `string id = 1`.
    #[prost(string, tag = "1")]
    pub id: String,
    /// `string cluster = 2`.
    #[prost(string, tag = "2")]
    pub cluster: String,
    /// `google.protobuf.Struct metadata = 3`.
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<Struct>,
    /// `string user_agent_name = 6`.
    #[prost(string, tag = "6")]
    pub user_agent_name: String,
}

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    /// `int32 code = 1` (a `google.rpc.Code`).
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// `string message = 2`.
    #[prost(string, tag = "2")]
    pub message: String,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Any {
    /// `string type_url = 1`.
    #[prost(string, tag = "1")]
    pub type_url: String,
    /// `bytes value = 2`: the message, encoded.
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitConfig`: one domain, as a reference file holds it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitConfig {
    /// `string name = 1`.
    #[prost(string, tag = "1")]
    pub name: String,
    /// `string domain = 2`.
    #[prost(string, tag = "2")]
    pub domain: String,
    /// `repeated RateLimitDescriptor descriptors = 3`.
    #[prost(message, repeated, tag = "3")]
    pub descriptors: Vec<RateLimitDescriptor>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// `string key = 1`.
    #[prost(string, tag = "1")]
    pub key: String,
    /// `string value = 2`.
    #[prost(string, tag = "2")]
    pub value: String,
    /// `RateLimitPolicy rate_limit = 3`.
    #[prost(message, optional, tag = "3")]
    pub rate_limit: Option<RateLimitPolicy>,
    /// `repeated RateLimitDescriptor descriptors = 4`.
    #[prost(message, repeated, tag = "4")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// `bool shadow_mode = 5`.
    #[prost(bool, tag = "5")]
    pub shadow_mode: bool,
    /// `bool detailed_metric = 6`.
    #[prost(bool, tag = "6")]
    pub detailed_metric: bool,
    /// `bool quota_mode = 7`.
    #[prost(bool, tag = "7")]
    pub quota_mode: bool,
    /// `google.protobuf.Struct metadata = 8`.
    #[prost(message, optional, tag = "8")]
    pub metadata: Option<Struct>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitPolicy`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitPolicy {
    /// `RateLimitUnit unit = 1`: 0 unknown, 1 second, 2 minute, 3 hour, 4 day, 5 month, 6 year,
    /// 7 week (the numbers of [`crate::unit::Unit`]).
    #[prost(int32, tag = "1")]
    pub unit: i32,
    /// `uint32 requests_per_unit = 2`.
    #[prost(uint32, tag = "2")]
    pub requests_per_unit: u32,
    /// `bool unlimited = 3`.
    #[prost(bool, tag = "3")]
    pub unlimited: bool,
    /// `string name = 4`.
    #[prost(string, tag = "4")]
    pub name: String,
    /// `repeated RateLimitReplace replaces = 5`.
    #[prost(message, repeated, tag = "5")]
    pub replaces: Vec<RateLimitReplace>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitReplace`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitReplace {
    /// `string name = 1`.
    #[prost(string, tag = "1")]
    pub name: String,
}
