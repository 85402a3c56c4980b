//! The protocol's floor for `scripts/bench_server.sh`: a tonic server that answers every
//! `ShouldRateLimit` with one constant `OK`, with no matching and no store. The answer has the
//! shape of tollgate-server's for the benchmark's request (a status with its limit, the two
//! `RateLimit` fields), so the two servers send as many bytes and differ only by the decision.
//! tollgate-server's calls per second are measured against this one's on the same machine, in
//! the same run.
//!
//! `cargo run --release -p tollgate-server --example constant_answer -- 127.0.0.1:8091 [--server-stack]`

use tollgate_server::service::protocol::{
    code, DescriptorStatus, Duration, HeaderValue, RateLimit, RateLimitRequest, RateLimitResponse,
    RateLimitServer,
};
use tonic::server::UnaryService;
use tonic::Status;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};

/// The constant answer, behind the same route as tollgate-server's decision
/// ([`RateLimitServer`]): the two servers differ by the method alone.
#[derive(Clone)]
struct Constant;

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
            dynamic_metadata: None,
        })))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:8091".to_owned())
        .parse()?;
    // `--server-stack`: behind what tollgate-server puts around its method too (the health
    // service beside it, a timeout per call), so that the two differ by the method alone.
    let server_stack = args.any(|arg| arg == "--server-stack");
    let mut server = tonic::transport::Server::builder();
    let health = if server_stack {
        server = server.timeout(std::time::Duration::from_secs(30));
        let reporter = HealthReporter::new();
        reporter.set_serving::<RateLimitServer<Constant>>().await;
        Some(HealthServer::new(HealthService::from_health_reporter(
            reporter,
        )))
    } else {
        None
    };
    server
        .add_optional_service(health)
        .add_service(RateLimitServer(Constant))
        .serve(addr)
        .await?;
    Ok(())
}
