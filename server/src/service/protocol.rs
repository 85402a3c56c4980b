//! The messages of `envoy.service.ratelimit.v3.RateLimitService`, written by hand with prost's
//! derive, field numbers as in Envoy's `rls.proto`, `ratelimit.proto` and `base.proto`.
//!
//! Keys, values and the domain are read as bytes, not strings: invalid UTF-8 is then answered
//! with `INVALID_ARGUMENT` naming the descriptor, not with the codec's decode error. Fields this
//! service does not use (a response's `raw_body` and `quota`) are left out: prost skips unknown
//! fields. `google.protobuf.Struct` (the response's `dynamic_metadata`) is written here too, as
//! `struct.proto` defines it.
//!
//! And the service's route, [`RateLimitServer`]: the one method, by its path, to the unary
//! handler given — tollgate-server's decision, or the benchmark's constant floor.

/// The method's path.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `envoy.service.ratelimit.v3.RateLimitRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitRequest {
    /// `string domain = 1`.
    #[prost(bytes = "vec", tag = "1")]
    pub domain: Vec<u8>,
    /// `repeated RateLimitDescriptor descriptors = 2`.
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// `uint32 hits_addend = 3`: the cost of every descriptor; 0 counts as 1.
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// `repeated Entry entries = 1`.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    /// `RateLimitOverride limit = 2`: the limit this descriptor is counted under, in place of
    /// the configuration's (in any configured domain).
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// `google.protobuf.UInt64Value hits_addend = 3`: this descriptor's cost, 0 included (a
    /// look that charges nothing), overriding the request's.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
    /// `bool is_negative_hits = 4`: give `hits_addend` back instead of charging it.
    #[prost(bool, tag = "4")]
    pub is_negative_hits: bool,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct RateLimitOverride {
    /// `uint32 requests_per_unit = 1`.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// `envoy.type.v3.RateLimitUnit unit = 2` (the numbers of [`crate::unit::Unit`]).
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `RateLimitDescriptor.Entry`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Entry {
    /// `string key = 1`.
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// `string value = 2`.
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `google.protobuf.UInt64Value`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct UInt64Value {
    /// `uint64 value = 1`.
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `RateLimitResponse.Code`.
pub mod code {
    /// `UNKNOWN`.
    pub const UNKNOWN: i32 = 0;
    /// `OK`.
    pub const OK: i32 = 1;
    /// `OVER_LIMIT`.
    pub const OVER_LIMIT: i32 = 2;
}

/// `envoy.service.ratelimit.v3.RateLimitResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResponse {
    /// `Code overall_code = 1`.
    #[prost(int32, tag = "1")]
    pub overall_code: i32,
    /// `repeated DescriptorStatus statuses = 2`, one per request descriptor, in order.
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    /// `repeated config.core.v3.HeaderValue response_headers_to_add = 3`.
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
    /// `repeated config.core.v3.HeaderValue request_headers_to_add = 4`.
    #[prost(message, repeated, tag = "4")]
    pub request_headers_to_add: Vec<HeaderValue>,
    /// `google.protobuf.Struct dynamic_metadata = 6`.
    #[prost(message, optional, tag = "6")]
    pub dynamic_metadata: Option<Struct>,
}

/// `google.protobuf.Struct`: fields by name.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Struct {
    /// `map<string, Value> fields = 1`.
    #[prost(btree_map = "string, message", tag = "1")]
    pub fields: std::collections::BTreeMap<String, Value>,
}

/// `google.protobuf.Value`: one of null, a number, a string, a bool, a struct, a list.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    /// `oneof kind`.
    #[prost(oneof = "Kind", tags = "1, 2, 3, 4, 5, 6")]
    pub kind: Option<Kind>,
}

/// `google.protobuf.Value.kind`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Kind {
    /// `NullValue null_value = 1` (its one value, 0).
    #[prost(int32, tag = "1")]
    NullValue(i32),
    /// `double number_value = 2`.
    #[prost(double, tag = "2")]
    NumberValue(f64),
    /// `string string_value = 3`.
    #[prost(string, tag = "3")]
    StringValue(String),
    /// `bool bool_value = 4`.
    #[prost(bool, tag = "4")]
    BoolValue(bool),
    /// `Struct struct_value = 5`.
    #[prost(message, tag = "5")]
    StructValue(Struct),
    /// `ListValue list_value = 6`.
    #[prost(message, tag = "6")]
    ListValue(ListValue),
}

/// `google.protobuf.ListValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListValue {
    /// `repeated Value values = 1`.
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<Value>,
}

impl Value {
    /// A value of `kind`.
    pub fn of(kind: Kind) -> Value {
        Value { kind: Some(kind) }
    }

    /// The struct this value holds, if it is one.
    pub fn as_struct(&self) -> Option<&Struct> {
        match &self.kind {
            Some(Kind::StructValue(s)) => Some(s),
            _ => None,
        }
    }
}

/// `RateLimitResponse.DescriptorStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DescriptorStatus {
    /// `Code code = 1`.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// `RateLimit current_limit = 2`.
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    /// `uint32 limit_remaining = 3`.
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    /// `google.protobuf.Duration duration_until_reset = 4`.
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<Duration>,
}

/// `RateLimitResponse.RateLimit`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimit {
    /// `uint32 requests_per_unit = 1`.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// `Unit unit = 2` (see [`crate::unit::Unit`] for the numbers).
    #[prost(int32, tag = "2")]
    pub unit: i32,
    /// `string name = 3`.
    #[prost(string, tag = "3")]
    pub name: String,
}

/// `google.protobuf.Duration`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct Duration {
    /// `int64 seconds = 1`.
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    /// `int32 nanos = 2`.
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

impl From<std::time::Duration> for Duration {
    fn from(d: std::time::Duration) -> Self {
        Duration {
            seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
        }
    }
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    /// `string key = 1`.
    #[prost(string, tag = "1")]
    pub key: String,
    /// `string value = 2`.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `envoy.service.ratelimit.v3.RateLimitService` as tonic serves it: `ShouldRateLimit` answered by
/// `M`, any other method `UNIMPLEMENTED` (what generated code would route).
#[derive(Clone)]
pub struct RateLimitServer<M>(pub M);

impl<M> tonic::server::NamedService for RateLimitServer<M> {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

impl<M> tower_service::Service<http::Request<tonic::body::Body>> for RateLimitServer<M>
where
    M: tonic::server::UnaryService<RateLimitRequest, Response = RateLimitResponse>
        + Clone
        + Send
        + 'static,
    M::Future: Send,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            return Box::pin(async {
                Ok(tonic::Status::unimplemented("no such method").into_http())
            });
        }
        let method = self.0.clone();
        Box::pin(async move { Ok(tonic::server::Grpc::new(Codec).unary(method, request).await) })
    }
}

/// The messages' codec: prost's, except that a request that is not a valid `RateLimitRequest`
/// is the caller's fault, `INVALID_ARGUMENT` (prost's codec answers `INTERNAL`, which says the
/// server failed and invites a retry of the same bytes).
#[derive(Clone, Copy, Debug, Default)]
struct Codec;

/// [`Codec`]'s decoder.
#[derive(Clone, Copy, Debug, Default)]
struct RequestDecoder;

impl tonic::codec::Codec for Codec {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = tonic_prost::ProstEncoder<RateLimitResponse>;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder
    }
}

impl tonic::codec::Decoder for RequestDecoder {
    type Item = RateLimitRequest;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<RateLimitRequest>, tonic::Status> {
        <RateLimitRequest as prost::Message>::decode(buf)
            .map(Some)
            .map_err(|error| {
                tonic::Status::invalid_argument(format!("not a RateLimitRequest: {error}"))
            })
    }
}
