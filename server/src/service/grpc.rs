//! The gRPC side: `envoy.service.ratelimit.v3.RateLimitService` and `grpc.health.v1.Health`.
//!
//! The service is written on `tonic::server::Grpc` with the hand-written messages of
//! [`protocol`](super::protocol), as generated code would route it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use std::time::Duration;

use tokio_stream::wrappers::ReceiverStream;
use tonic::server::UnaryService;
use tonic::Status;
use tonic_health::ServingStatus;

use super::connections::{Admitted, Gate, Unadmitted};
use super::decide::{decide, statuses, Answer, Refusal};
use super::headers::response_headers;
use super::protocol::{code, RateLimitRequest, RateLimitResponse, RateLimitServer};
use super::State;

/// The method `ShouldRateLimit`.
#[derive(Clone)]
struct ShouldRateLimit(Arc<State>);

impl UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future =
        Pin<Box<dyn Future<Output = Result<tonic::Response<RateLimitResponse>, Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move { should_rate_limit(&state, request.into_inner()).await })
    }
}

/// One call: decide, count, answer.
async fn should_rate_limit(
    state: &State,
    request: RateLimitRequest,
) -> Result<tonic::Response<RateLimitResponse>, Status> {
    // Timed from here by the library's clock (a cycle counter read, not a system call).
    let call = state.stats.call();
    let limiter = state.layer.limiter();
    let mut attempts = 0;
    loop {
        // The answer borrows the trees in force: they stay alive until it is written. (A guard,
        // not a counted reference: no shared count written on every call.)
        let current = state.current.load();
        let policy = current.on_store_failure;
        let decided = decide(&current.domains, limiter, policy, &request).await;
        match decided {
            Ok(answer) => {
                let response = respond(state, &answer);
                state.stats.latency(call.elapsed());
                return Ok(tonic::Response::new(response));
            }
            Err(Refusal::Invalid(status)) => {
                state.stats.invalid_request();
                tracing::debug!(message = status.message(), "invalid request");
                return Err(status);
            }
            // A reload is between its two swaps: the trees in force a moment later agree with
            // the rules.
            Err(Refusal::RulesChanged(error)) if attempts < 3 => {
                attempts += 1;
                tracing::debug!(%error, "rules and trees out of step; asking again");
                tokio::task::yield_now().await;
            }
            Err(Refusal::RulesChanged(error)) => {
                return Err(Status::unavailable(format!("rules reloading: {error}")))
            }
        }
    }
}

/// Counts `answer` and writes it in the protocol's terms.
fn respond(state: &State, answer: &Answer<'_>) -> RateLimitResponse {
    if answer.store_failed {
        state.stats.store_error();
    }
    state.stats.record(answer);
    RateLimitResponse {
        overall_code: if answer.over_limit() {
            code::OVER_LIMIT
        } else {
            code::OK
        },
        statuses: statuses(answer),
        response_headers_to_add: response_headers(answer),
        request_headers_to_add: Vec::new(),
    }
}

/// The longest a call may take, its request's arrival included.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The connections of `listener` that `gate` admits and whose HTTP/2 preface arrives in time,
/// until `stop` turns true. Each waits for its preface in a task of its own, so a silent one
/// never holds up the next.
fn admitted(
    listener: tokio::net::TcpListener,
    gate: Gate,
    state: Arc<State>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> ReceiverStream<std::io::Result<Admitted>> {
    let (admit, admitted) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let within = gate.limits().header_read_timeout;
        loop {
            let refused = || state.stats.connection_refused();
            let accepted = tokio::select! {
                accepted = gate.accept(&listener, refused) => accepted,
                _ = stop.wait_for(|stop| *stop) => return,
            };
            let Some((stream, open)) = accepted else {
                return;
            };
            let (admit, state) = (admit.clone(), state.clone());
            tokio::spawn(async move {
                match Admitted::preface(stream, open, within).await {
                    Ok(connection) => {
                        let _ = admit.send(Ok(connection)).await;
                    }
                    Err(Unadmitted::TimedOut) => state.stats.connection_timed_out(),
                    Err(Unadmitted::Gone) => {}
                }
            });
        }
    });
    ReceiverStream::new(admitted)
}

/// Serves gRPC on `listener` until `stop` turns true, then drains the calls in flight.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    gate: Gate,
    state: Arc<State>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<RateLimitServer<ShouldRateLimit>>()
        .await;
    let service = RateLimitServer(ShouldRateLimit(state.clone()));
    let incoming = admitted(listener, gate, state, stop.clone());
    let shutdown = async move {
        let _ = stop.wait_for(|stop| *stop).await;
        reporter
            .set_service_status("", ServingStatus::NotServing)
            .await;
        reporter
            .set_not_serving::<RateLimitServer<ShouldRateLimit>>()
            .await;
    };
    let served = tonic::transport::Server::builder()
        // A call whose request trickles in (or whose decision waits on a stalled store past
        // its own timeout) ends: the slow client holds nothing for long.
        .timeout(CALL_TIMEOUT)
        .add_service(health)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    if let Err(error) = served {
        tracing::error!(%error, "gRPC server failed");
    }
}
