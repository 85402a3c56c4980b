//! The protocol's floor for `scripts/bench_server.sh`: a tonic server that answers every
//! `ShouldRateLimit` with one constant `OK`, with no matching and no store. The answer has the
//! shape of tollgate-server's for the benchmark's request (a status with its limit, the two
//! `RateLimit` fields), so the two servers send as many bytes and differ only by the decision.
//! tollgate-server's calls per second are measured against this one's on the same machine, in
//! the same run.
//!
//! `cargo run --release -p tollgate-server --example constant_answer -- 127.0.0.1:8091`

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tollgate_server::service::protocol::{
    code, DescriptorStatus, Duration, HeaderValue, RateLimit, RateLimitRequest, RateLimitResponse,
    SHOULD_RATE_LIMIT,
};
use tonic::body::Body;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::Status;
use tonic_prost::ProstCodec;

#[derive(Clone)]
struct Constant;

impl NamedService for Constant {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

impl UnaryService<RateLimitRequest> for Constant {
    type Response = RateLimitResponse;
    type Future = std::future::Ready<Result<tonic::Response<RateLimitResponse>, Status>>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let statuses = request
            .get_ref()
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: code::OK,
                current_limit: Some(RateLimit {
                    requests_per_unit: 1_000_000_000,
                    unit: 1,
                    name: "bench.remote_address".to_owned(),
                }),
                limit_remaining: 999_999_999,
                duration_until_reset: Some(Duration {
                    seconds: 0,
                    nanos: 500_000_000,
                }),
            })
            .collect();
        let field = |key: &str, value: &str| HeaderValue {
            key: key.to_owned(),
            value: value.to_owned(),
        };
        std::future::ready(Ok(tonic::Response::new(RateLimitResponse {
            overall_code: code::OK,
            statuses,
            response_headers_to_add: vec![
                field(
                    "ratelimit-policy",
                    "\"bench.remote_address\";q=1000000000;w=1",
                ),
                field("ratelimit", "\"bench.remote_address\";r=999999999;t=1"),
            ],
            request_headers_to_add: Vec::new(),
        })))
    }
}

impl tower_service::Service<http::Request<Body>> for Constant {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            return Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) });
        }
        Box::pin(async move {
            let mut grpc = Grpc::new(ProstCodec::<RateLimitResponse, RateLimitRequest>::default());
            Ok(grpc.unary(Constant, request).await)
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8091".to_owned())
        .parse()?;
    tonic::transport::Server::builder()
        .add_service(Constant)
        .serve(addr)
        .await?;
    Ok(())
}
