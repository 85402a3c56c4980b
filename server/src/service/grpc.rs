//! The gRPC side: `envoy.service.ratelimit.v3.RateLimitService` and `grpc.health.v1.Health`.
//!
//! The service is written on `tonic::server::Grpc` with the hand-written messages of
//! [`protocol`](super::protocol), as generated code would route it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tonic::server::UnaryService;
use tonic::Status;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};
use tonic_health::ServingStatus;

use super::connections::{Admitted, Gate, Unadmitted};
use super::decide::{decide, statuses, Answer, Refusal};
use super::headers::{reference_headers, response_headers};
use super::metadata::dynamic_metadata;
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
        Box::pin(should_rate_limit(self.0.clone(), request.into_inner()))
    }
}

/// One call: decide, count, answer.
async fn should_rate_limit(
    state: Arc<State>,
    request: RateLimitRequest,
) -> Result<tonic::Response<RateLimitResponse>, Status> {
    // Timed from here by the library's clock (a cycle counter read, not a system call).
    let call = state.stats.call();
    // The answer borrows the configuration in force, trees and limiter of one snapshot: they
    // stay alive until it is written. (A guard, not a counted reference: no shared count
    // written on every call.)
    let current = state.current.load();
    let decided = decide(&current, &state.answering, &request).await;
    match decided {
        Ok(answer) => {
            let response = respond(&state, &request, &answer);
            state.stats.latency(call.elapsed());
            Ok(tonic::Response::new(response))
        }
        Err(Refusal::Invalid(status)) => {
            state.stats.invalid_request();
            tracing::debug!(message = status.message(), "invalid request");
            Err(status)
        }
        Err(Refusal::Internal(error)) => {
            tracing::error!(%error, "the limiter refused a charge of its own configuration");
            Err(Status::internal(error.to_string()))
        }
    }
}

/// Counts `answer` (to `request`) and writes it in the protocol's terms.
fn respond(state: &State, request: &RateLimitRequest, answer: &Answer<'_>) -> RateLimitResponse {
    if answer.store_failed {
        state.stats.store_error();
    }
    state.stats.record(answer);
    let answering = &state.answering;
    let statuses = statuses(answer);
    let over_limit = answer.over_limit();
    // The global shadow mode: decided and counted as usual, the descriptors' codes kept, and
    // the request passes.
    let over = over_limit && !answering.shadow_mode;
    if over_limit && !over {
        state.stats.global_shadow_mode();
    }
    let mut fields = response_headers(answer);
    if !over && answer.judged.iter().any(|j| j.over) {
        // A request that passes is never told to retry (a quota descriptor over its limit, or
        // the global shadow mode).
        let retry_after = http::header::RETRY_AFTER.as_str();
        fields.retain(|field| !field.key.eq_ignore_ascii_case(retry_after));
    }
    if let Some(names) = &answering.reference_headers {
        fields.extend(reference_headers(answer, &statuses, names));
    }
    RateLimitResponse {
        overall_code: if over { code::OVER_LIMIT } else { code::OK },
        dynamic_metadata: answering
            .response_dynamic_metadata
            .then(|| dynamic_metadata(request, answer, &statuses)),
        statuses,
        response_headers_to_add: fields,
        request_headers_to_add: Vec::new(),
    }
}

/// The longest a call may take, its request's arrival included.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves gRPC on `listener` until `stop` turns true, then drains the calls in flight.
///
/// The connections `gate` admits are spread in turn over `workers` threads, each running a
/// single-threaded runtime of its own (a thread per core, as Envoy's and nginx's workers): a
/// connection's reads, calls and writes all run on one thread. The calls that arrive together
/// on a connection are all answered before it writes, so one write carries their answers, and
/// no call wakes another thread. (On one shared multi-threaded runtime each answer woke its
/// connection at once and was written alone: 0.8 writes per call instead of 0.06, and six
/// times the context switches.)
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    gate: Gate,
    tls: Option<TlsAcceptor>,
    state: Arc<State>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    workers: usize,
) {
    let reporter = HealthReporter::new();
    reporter
        .set_serving::<RateLimitServer<ShouldRateLimit>>()
        .await;
    let health = HealthServer::new(HealthService::from_health_reporter(reporter.clone()));
    let mut queues = Vec::with_capacity(workers);
    let mut finished = Vec::with_capacity(workers);
    for n in 0..workers.max(1) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                tracing::error!(%error, "cannot start a gRPC worker's runtime");
                return;
            }
        };
        let (queue, accepted) = tokio::sync::mpsc::channel(64);
        let (done, finished_one) = tokio::sync::oneshot::channel::<()>();
        let worker = Worker {
            accepted,
            within: gate.limits().header_read_timeout,
            tls: tls.clone(),
            state: state.clone(),
            health: health.clone(),
            stop: stop.clone(),
        };
        let spawned = std::thread::Builder::new()
            .name(format!("tollgate-grpc-{n}"))
            .spawn(move || {
                runtime.block_on(worker.serve());
                let _ = done.send(());
            });
        if let Err(error) = spawned {
            tracing::error!(%error, "cannot start a gRPC worker thread");
            return;
        }
        queues.push(queue);
        finished.push(finished_one);
    }
    let mut next = 0;
    loop {
        let refused = || state.stats.connection_refused();
        let accepted = tokio::select! {
            accepted = gate.accept(&listener, refused) => accepted,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let Some((stream, open)) = accepted else {
            break;
        };
        // Taken off this runtime's reactor, so the worker's own reactor drives it.
        match stream.into_std() {
            Ok(stream) => {
                let _ = queues[next].send((stream, open)).await;
                next = (next + 1) % queues.len();
            }
            Err(error) => tracing::debug!(%error, "a connection closed as it was accepted"),
        }
    }
    drop(queues);
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    reporter
        .set_not_serving::<RateLimitServer<ShouldRateLimit>>()
        .await;
    for finished in finished {
        let _ = finished.await;
    }
}

/// One gRPC worker: the connections handed to it, each admitted once its preface arrives in
/// time (after its TLS handshake, on a TLS port), served until `stop` turns true.
struct Worker {
    accepted: tokio::sync::mpsc::Receiver<(std::net::TcpStream, OwnedSemaphorePermit)>,
    within: Duration,
    tls: Option<TlsAcceptor>,
    state: Arc<State>,
    health: HealthServer<HealthService>,
    stop: tokio::sync::watch::Receiver<bool>,
}

impl Worker {
    async fn serve(self) {
        let Worker {
            mut accepted,
            within,
            tls,
            state,
            health,
            mut stop,
        } = self;
        // Each connection waits for its preface in a task of its own, so a silent one never
        // holds up the next.
        let (admit, admitted) = tokio::sync::mpsc::channel(64);
        let admitting = state.clone();
        tokio::spawn(async move {
            while let Some((stream, open)) = accepted.recv().await {
                let stream = match tokio::net::TcpStream::from_std(stream) {
                    Ok(stream) => stream,
                    Err(error) => {
                        tracing::debug!(%error, "a connection could not be registered");
                        continue;
                    }
                };
                let (admit, state, tls) = (admit.clone(), admitting.clone(), tls.clone());
                tokio::spawn(async move {
                    match Admitted::preface(stream, open, within, tls.as_ref()).await {
                        Ok(connection) => {
                            let _ = admit.send(Ok::<_, std::io::Error>(connection)).await;
                        }
                        Err(Unadmitted::TimedOut) => state.stats.connection_timed_out(),
                        Err(Unadmitted::Handshake(_)) => state.stats.tls_handshake_failed(),
                        Err(Unadmitted::Gone(_)) => {}
                    }
                });
            }
        });
        let service = RateLimitServer(ShouldRateLimit(state));
        let shutdown = async move {
            let _ = stop.wait_for(|stop| *stop).await;
        };
        let served = tonic::transport::Server::builder()
            // A call whose request trickles in (or whose decision waits on a stalled store
            // past its own timeout) ends: the slow client holds nothing for long.
            .timeout(CALL_TIMEOUT)
            .add_service(health)
            .add_service(service)
            .serve_with_incoming_shutdown(ReceiverStream::new(admitted), shutdown)
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "gRPC server failed");
        }
    }
}
