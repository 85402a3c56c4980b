//! gRPC through the layer: a real tonic server on a loopback port (with axum routes beside its
//! services, as in the `grpc` example) and a real tonic client.
//!
//! Limits run on a `ManualClock` (or on tokio's paused clock for the queue), so no count depends
//! on how long a test takes; every await of the running tests is bounded by a timeout.

#![cfg(feature = "tonic")]

#[allow(dead_code)]
#[path = "../../examples/grpc.rs"]
mod example;
use crate::support::stores;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use example::greeter::{self, Greeter, HelloReply, HelloRequest};
use http::uri::PathAndQuery;
use http::{HeaderName, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::time::timeout;
use tollgate::clock::{ManualClock, TokioClock};
use tollgate::key::Protocol;
use tollgate::{
    AccessList, Cost, Decision, FailurePolicy, Key, Limit, MemoryStore, MissingKey, Queue,
    RateLimitLayer, Rule,
};
use tonic::body::Body;
use tonic::server::{Grpc, NamedService};
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

const LIMIT: Duration = Duration::from_secs(10);

async fn bounded<F: Future>(what: &str, future: F) -> F::Output {
    timeout(LIMIT, future)
        .await
        .unwrap_or_else(|_| panic!("{what} took longer than {LIMIT:?}"))
}

/// A store whose time stands still: a test's counts cannot depend on how long it takes.
fn frozen() -> MemoryStore {
    MemoryStore::with_clock(ManualClock::new(Duration::from_secs(1)))
}

/// `test.Counter/Count`: a server-streaming method answering three messages.
#[derive(Clone, Debug, Default)]
struct Counter;

const COUNT: &str = "/test.Counter/Count";

impl NamedService for Counter {
    const NAME: &'static str = "test.Counter";
}

type Replies = Pin<Box<dyn futures::Stream<Item = Result<HelloReply, Status>> + Send>>;

impl tower::Service<Request<Body>> for Counter {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let count = tower::service_fn(|request: tonic::Request<HelloRequest>| async move {
            let name = request.into_inner().name;
            let replies = (1..=3).map(move |i| {
                Ok(HelloReply {
                    message: format!("{name} {i}"),
                })
            });
            let stream: Replies = Box::pin(futures::stream::iter(replies));
            Ok::<_, Status>(tonic::Response::new(stream))
        });
        Box::pin(async move {
            let mut grpc = Grpc::new(ProstCodec::<HelloReply, HelloRequest>::default());
            Ok(grpc.server_streaming(count, request).await)
        })
    }
}

/// A server on `127.0.0.1:0` behind `layer`: the Greeter, the Counter, and the HTTP routes
/// `GET /health` and `POST /api`; with a tonic channel and an HTTP/1.1 client to it.
struct Running {
    addr: SocketAddr,
    channel: Channel,
    http: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

impl Running {
    async fn start(layer: RateLimitLayer) -> Running {
        let listener = bounded("bind", TcpListener::bind("127.0.0.1:0"))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let http_routes = Router::new()
            .route("/health", get(|| async { "ok" }))
            .route("/api", post(|| async { "posted" }));
        let server = Server::builder()
            .accept_http1(true)
            .layer(layer)
            .add_routes(Routes::from(http_routes))
            .add_service(Greeter)
            .add_service(Counter)
            .serve_with_incoming(TcpIncoming::from(listener));
        tokio::spawn(async move { server.await.unwrap() });
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        let http = Client::builder(TokioExecutor::new()).build_http();
        Running {
            addr,
            channel,
            http,
        }
    }

    async fn say_hello(&self, metadata: &[(&'static str, &str)]) -> Result<String, Status> {
        let mut request = tonic::Request::new(HelloRequest { name: "you".into() });
        for (name, value) in metadata {
            request.metadata_mut().insert(*name, value.parse().unwrap());
        }
        let reply = bounded("a call", greeter::say_hello(self.channel.clone(), request)).await?;
        let ratelimit = reply
            .metadata()
            .get("ratelimit")
            .map(|v| v.to_str().unwrap());
        Ok(format!(
            "{} [{}]",
            reply.get_ref().message,
            ratelimit.unwrap_or("no ratelimit")
        ))
    }

    /// A server-streaming call: its messages, or the status that refused it.
    async fn count(&self) -> Result<(Option<String>, Vec<String>), Status> {
        let mut client = tonic::client::Grpc::new(self.channel.clone());
        bounded("ready", client.ready()).await.unwrap();
        let request = tonic::Request::new(HelloRequest {
            name: "tick".into(),
        });
        let codec = ProstCodec::<HelloRequest, HelloReply>::default();
        let response = bounded(
            "a streaming call",
            client.server_streaming(request, PathAndQuery::from_static(COUNT), codec),
        )
        .await?;
        let ratelimit = response
            .metadata()
            .get("ratelimit")
            .map(|v| v.to_str().unwrap().to_owned());
        let mut stream = response.into_inner();
        let mut messages = Vec::new();
        while let Some(reply) = bounded("a message", stream.message()).await? {
            messages.push(reply.message);
        }
        Ok((ratelimit, messages))
    }

    /// An HTTP/1.1 request: status, headers and body.
    async fn http(
        &self,
        method: http::Method,
        path: &str,
        content_type: &str,
    ) -> (StatusCode, http::HeaderMap, String) {
        let request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .header("content-type", content_type)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = bounded("an HTTP request", self.http.request(request))
            .await
            .unwrap();
        let (parts, body) = response.into_parts();
        let body = bounded("a body", body.collect()).await.unwrap().to_bytes();
        (
            parts.status,
            parts.headers,
            String::from_utf8_lossy(&body).into_owned(),
        )
    }
}

fn metadata<'a>(status: &'a Status, name: &str) -> &'a str {
    status
        .metadata()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {:?}", status.metadata()))
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn the_example_refuses_the_sixth_call_with_resource_exhausted() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(example::serve(listener, example::limits_in(frozen())));
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let call = || {
        let request = tonic::Request::new(HelloRequest { name: "you".into() });
        bounded("a call", greeter::say_hello(channel.clone(), request))
    };
    for left in (0..5).rev() {
        let reply = call().await.expect("within the limit");
        assert_eq!(reply.get_ref().message, "Hello you!");
        let headers = reply.metadata();
        assert_eq!(
            headers.get("ratelimit-policy").unwrap(),
            "\"greeter\";q=5;w=60"
        );
        // A unit comes back every 12 s (5 a minute); the clock stands still.
        let expected = format!("\"greeter\";r={left};t=12");
        assert_eq!(headers.get("ratelimit").unwrap(), expected.as_str());
    }
    let refused = call().await.expect_err("the 6th call is refused");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(
        refused.message(),
        "Rate limit exceeded (greeter); retry in 12 s."
    );
    assert_eq!(metadata(&refused, "grpc-retry-pushback-ms"), "12000");
    assert_eq!(metadata(&refused, "ratelimit"), "\"greeter\";r=0;t=12");
    assert_eq!(
        metadata(&refused, "ratelimit-policy"),
        "\"greeter\";q=5;w=60"
    );
    assert!(refused.metadata().get("retry-after").is_none());

    // `/health`, on the same port and through the same layer, has its own rule.
    let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let health = bounded(
        "GET /health",
        http.get(format!("http://{addr}/health").parse().unwrap()),
    )
    .await
    .unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    assert_eq!(health.headers()["ratelimit"], "\"health\";r=59;t=1");
}

#[tokio::test]
async fn refusals_have_their_codes() {
    let api_key = || Key::header(HeaderName::from_static("x-api-key"));
    let layer = RateLimitLayer::builder()
        .store(frozen())
        .deny(AccessList::keys(api_key(), ["leaked"]))
        .rule(Rule::new("by-key", Limit::per_minute(100)).key(api_key()))
        .rule(
            Rule::new("by-user", Limit::per_minute(100))
                .key(Key::header(HeaderName::from_static("x-user")))
                .on_missing_key(MissingKey::RejectWith(StatusCode::UNAUTHORIZED)),
        )
        .rule(
            Rule::new("by-cost", Limit::per_minute(100))
                .cost(Cost::header(HeaderName::from_static("x-cost")).or(1)),
        )
        .build()
        .unwrap();
    let server = Running::start(layer).await;
    let ok = server
        .say_hello(&[("x-api-key", "k"), ("x-user", "u")])
        .await;
    assert!(ok.unwrap().starts_with("Hello you! ["));

    let denied = server
        .say_hello(&[("x-api-key", "leaked"), ("x-user", "u")])
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert!(denied.message().contains("deny list"), "{denied:?}");

    let no_key = server.say_hello(&[("x-user", "u")]).await.unwrap_err();
    assert_eq!(no_key.code(), Code::InvalidArgument);
    assert_eq!(
        no_key.message(),
        "Rate-limit rule \"by-key\" counts requests by header:x-api-key, and this request has none."
    );

    let no_user = server.say_hello(&[("x-api-key", "k")]).await.unwrap_err();
    assert_eq!(no_user.code(), Code::Unauthenticated);
    assert!(no_user.message().contains("by-user"), "{no_user:?}");

    let bad_cost = server
        .say_hello(&[("x-api-key", "k"), ("x-user", "u"), ("x-cost", "many")])
        .await
        .unwrap_err();
    assert_eq!(bad_cost.code(), Code::InvalidArgument);
    assert!(bad_cost.message().contains("by-cost"), "{bad_cost:?}");

    let too_costly = server
        .say_hello(&[("x-api-key", "k"), ("x-user", "u"), ("x-cost", "101")])
        .await
        .unwrap_err();
    assert_eq!(too_costly.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn a_failing_store_is_unavailable_when_closed_and_ignored_when_open() {
    let closed = RateLimitLayer::builder()
        .store(stores::Broken)
        .on_store_failure(FailurePolicy::Closed)
        .rule(Limit::per_minute(5))
        .build()
        .unwrap();
    let server = Running::start(closed).await;
    let refused = server.say_hello(&[]).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable);
    assert_eq!(
        refused.message(),
        "The rate limiter cannot decide right now; try again in 1 s."
    );
    // The breaker is still closed: the next call asks the store again, so wait the least.
    assert_eq!(metadata(&refused, "grpc-retry-pushback-ms"), "1000");
    // HTTP requests on the same server keep their 503.
    let (status, _, _) = server
        .http(http::Method::GET, "/health", "text/plain")
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    let open = RateLimitLayer::builder()
        .store(stores::Broken)
        .on_store_failure(FailurePolicy::Open)
        .rule(Limit::per_minute(5))
        .build()
        .unwrap();
    let server = Running::start(open).await;
    assert_eq!(
        server.say_hello(&[]).await.unwrap(),
        "Hello you! [no ratelimit]"
    );
}

#[tokio::test]
async fn a_streaming_call_is_limited_at_its_start_and_untouched_when_allowed() {
    let layer = RateLimitLayer::builder()
        .store(frozen())
        .rule(Rule::new("streams", Limit::per_minute(1)).grpc("/test.Counter/*"))
        .build()
        .unwrap();
    let server = Running::start(layer).await;
    let (ratelimit, messages) = server.count().await.expect("the first stream");
    assert_eq!(ratelimit.as_deref(), Some("\"streams\";r=0;t=60"));
    assert_eq!(messages, ["tick 1", "tick 2", "tick 3"]);
    let refused = server.count().await.expect_err("the second stream");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(metadata(&refused, "grpc-retry-pushback-ms"), "60000");
    // Other services are outside the rule's scope.
    assert_eq!(
        server.say_hello(&[]).await.unwrap(),
        "Hello you! [no ratelimit]"
    );
}

#[tokio::test]
async fn http_and_grpc_share_a_budget_and_each_gets_its_own_answer() {
    let layer = RateLimitLayer::builder()
        .store(frozen())
        .rule(Rule::new("everything", Limit::per_minute(2)).key(Key::peer_ip()))
        .build()
        .unwrap();
    let server = Running::start(layer).await;
    assert_eq!(
        server.say_hello(&[]).await.unwrap(),
        "Hello you! [\"everything\";r=1;t=30]"
    );
    let (status, headers, _) = server
        .http(http::Method::POST, "/api", "application/json")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["ratelimit"], "\"everything\";r=0;t=30");

    // The budget is spent: gRPC gets RESOURCE_EXHAUSTED, HTTP a 429 with problem+json.
    let refused = server.say_hello(&[]).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(metadata(&refused, "grpc-retry-pushback-ms"), "30000");
    let (status, headers, body) = server
        .http(http::Method::POST, "/api", "application/json")
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "30");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(
        body.contains("\"violated-policies\":[\"everything\"]"),
        "{body}"
    );
}

/// gRPC's retry design (A6) reads `grpc-retry-pushback-ms` as a signed 32-bit integer, and a
/// client that cannot parse it never retries: a 30-day wait is capped, `Retry-After` is not.
#[tokio::test]
async fn a_pushback_longer_than_a_signed_32_bit_integer_is_capped_and_retry_after_is_not() {
    let thirty_days = Duration::from_secs(30 * 24 * 3600);
    let layer = RateLimitLayer::builder()
        .store(frozen())
        .rule(Rule::new("monthly", Limit::token_bucket(1, thirty_days)))
        .build()
        .unwrap();
    let server = Running::start(layer).await;
    server.say_hello(&[]).await.unwrap();

    let refused = server.say_hello(&[]).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(metadata(&refused, "grpc-retry-pushback-ms"), "2147483647");
    let (status, headers, _) = server
        .http(http::Method::POST, "/api", "application/json")
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "2592000");
}

#[tokio::test]
async fn grpc_flavours_of_content_type_get_grpc_answers() {
    let layer = RateLimitLayer::builder()
        .store(frozen())
        .rule(Rule::new("one", Limit::per_minute(1)))
        .build()
        .unwrap();
    let server = Running::start(layer).await;
    server.http(http::Method::GET, "/health", "").await;
    let cases = [
        ("application/grpc+proto", "application/grpc"),
        ("application/grpc;charset=utf-8", "application/grpc"),
        ("application/grpc-web", "application/grpc-web"),
        ("application/grpc-web+proto", "application/grpc-web"),
        ("application/grpc-web-text", "application/grpc-web-text"),
    ];
    for (sent, answered) in cases {
        let (status, headers, body) = server
            .http(http::Method::POST, greeter::SAY_HELLO, sent)
            .await;
        assert_eq!(status, StatusCode::OK, "{sent}");
        assert_eq!(headers["content-type"], answered, "{sent}");
        assert_eq!(headers["grpc-status"], "8", "{sent}");
        assert_eq!(headers["grpc-retry-pushback-ms"], "60000", "{sent}");
        assert_eq!(headers["ratelimit"], "\"one\";r=0;t=60", "{sent}");
        assert!(headers.get("retry-after").is_none(), "{sent}");
        assert_eq!(body, "", "{sent}");
    }
    // Not gRPC: an HTTP answer.
    let (status, headers, _) = server
        .http(http::Method::POST, greeter::SAY_HELLO, "application/grpcx")
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["content-type"], "application/problem+json");
}

#[tokio::test]
async fn long_rule_names_are_cut_and_escaped_in_grpc_message() {
    let long = format!("100% {}", "x".repeat(5000));
    let layer = RateLimitLayer::builder()
        .store(frozen())
        .rule(Rule::new(long.clone(), Limit::per_minute(1)))
        .build()
        .unwrap();
    let server = Running::start(layer).await;
    server.say_hello(&[]).await.unwrap();
    let refused = server.say_hello(&[]).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    // tonic decodes the percent-encoding; the layer cut the message to 1 KiB encoded.
    let message = refused.message();
    assert!(
        message.starts_with("Rate limit exceeded (100% xxx"),
        "{message}"
    );
    assert!(message.ends_with("..."), "{message}");
    assert!(message.len() <= 1024, "{}", message.len());
}

#[tokio::test(start_paused = true)]
async fn queue_mode_delays_a_grpc_call_like_an_http_request() {
    let layer = RateLimitLayer::builder()
        .store(MemoryStore::with_clock(TokioClock::new()))
        .rule(Rule::new("queued", Limit::per_second(1).capacity(1)).queue(Queue::burst(4)))
        .build()
        .unwrap();
    // No timeouts here: with paused time they would fire as soon as the runtime idles.
    let server = Running::start(layer).await;
    let call = || {
        let request = tonic::Request::new(HelloRequest { name: "you".into() });
        let codec = ProstCodec::<HelloRequest, HelloReply>::default();
        let channel = server.channel.clone();
        async move {
            let mut client = tonic::client::Grpc::new(channel);
            client.ready().await.unwrap();
            client
                .unary(
                    request,
                    PathAndQuery::from_static(greeter::SAY_HELLO),
                    codec,
                )
                .await
        }
    };
    let first = call().await.unwrap();
    assert!(first.metadata().get("tollgate-delay").is_none());
    let started = tokio::time::Instant::now();
    let second = call().await.unwrap();
    assert_eq!(second.get_ref().message, "Hello you!");
    assert_eq!(second.metadata().get("tollgate-delay").unwrap(), "1");
    assert!(started.elapsed() >= Duration::from_secs(1));

    // An HTTP request in the same queue waits the same way.
    let request = Request::post(format!("http://{}/api", server.addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let started = tokio::time::Instant::now();
    let response = server.http.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["tollgate-delay"], "1");
    assert!(started.elapsed() >= Duration::from_secs(1));
}

#[tokio::test]
async fn hooks_answer_in_either_protocol() {
    // `on_rejection` sees the protocol and answers each in its own shape.
    let layer = RateLimitLayer::builder()
        .store(frozen())
        .rule(Rule::new("one", Limit::per_minute(1)))
        .on_rejection(|rejected| match rejected.protocol() {
            Protocol::Http => http::Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .body(Bytes::from_static(b"slow down"))
                .unwrap(),
            _ => rejected.grpc(Code::ResourceExhausted as i32, "slow down, gRPC"),
        })
        .build()
        .unwrap();
    let server = Running::start(layer).await;
    server.say_hello(&[]).await.unwrap();
    let refused = server.say_hello(&[]).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(refused.message(), "slow down, gRPC");
    assert_eq!(metadata(&refused, "grpc-retry-pushback-ms"), "60000");
    let (status, headers, body) = server.http(http::Method::GET, "/health", "").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "slow down")
    );
    assert_eq!(headers["retry-after"], "60");

    // A hook that answers HTTP requests only hands gRPC calls the layer's answer.
    let layer = RateLimitLayer::builder()
        .store(frozen())
        .rule(Rule::new("one", Limit::per_minute(1)))
        .on_rejection(|rejected| {
            if rejected.protocol().is_grpc() {
                return rejected.default_response();
            }
            http::Response::builder()
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .body(Bytes::from_static(b"busy"))
                .unwrap()
        })
        .build()
        .unwrap();
    let server = Running::start(layer).await;
    server.say_hello(&[]).await.unwrap();
    let refused = server.say_hello(&[]).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(
        refused.message(),
        "Rate limit exceeded (one); retry in 60 s."
    );
    let (status, _, body) = server.http(http::Method::GET, "/health", "").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "busy")
    );
}

#[tokio::test]
async fn the_decision_names_the_grpc_method() {
    let layer = RateLimitLayer::builder()
        .store(frozen())
        .rule(Rule::new("all", Limit::per_minute(10)))
        .build()
        .unwrap();
    let seen = tower::service_fn(|request: Request<Body>| async move {
        let method = request
            .extensions()
            .get::<Decision>()
            .and_then(|d| d.grpc_method().map(str::to_owned));
        Ok::<_, Infallible>(http::Response::new(Body::new(Full::new(Bytes::from(
            method.unwrap_or_default(),
        )))))
    });
    let service = tower::Layer::layer(&layer, seen);
    let call = |content_type: &str| {
        Request::post(greeter::SAY_HELLO)
            .header("content-type", content_type)
            .body(Body::empty())
            .unwrap()
    };
    let body = |response: http::Response<tollgate::middleware::ResponseBody<Body>>| async move {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    };
    use tower::ServiceExt;
    let grpc = service
        .clone()
        .oneshot(call("application/grpc"))
        .await
        .unwrap();
    assert_eq!(body(grpc).await, "/helloworld.Greeter/SayHello");
    let http = service.oneshot(call("application/json")).await.unwrap();
    assert_eq!(body(http).await, "");
}

/// Counting by outcome reads the gRPC status: from the trailers of a unary or streaming call
/// that succeeded (given back when the body ends), from the head of a trailers-only refusal.
#[tokio::test]
async fn count_if_failures_reads_grpc_statuses_from_trailers_and_heads() {
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("failures", Limit::per_hour(3)).count_if(tollgate::CountIf::failures()))
        .store(frozen())
        .build()
        .unwrap();
    let limiter = layer.limiter().clone();
    let running = Running::start(layer).await;
    let left = || async { limiter.check("failures", "", 0).await.unwrap().remaining };
    for _ in 0..5 {
        let reply = running.say_hello(&[]).await.expect("OK calls never count");
        // Charged on arrival, so the call's own fields say 2 left.
        assert!(reply.ends_with("[\"failures\";r=2;t=1200]"), "{reply}");
        assert_eq!(left().await, 3);
    }
    let (_, messages) = running.count().await.expect("a streaming call");
    assert_eq!(messages.len(), 3);
    assert_eq!(left().await, 3);
    // An unknown method: UNIMPLEMENTED, in the head of a trailers-only answer. It counts.
    let unknown = || async {
        let mut client = tonic::client::Grpc::new(running.channel.clone());
        bounded("ready", client.ready()).await.unwrap();
        let codec = ProstCodec::<HelloRequest, HelloReply>::default();
        let request = tonic::Request::new(HelloRequest { name: "x".into() });
        let path = PathAndQuery::from_static("/helloworld.Greeter/Nope");
        bounded("a call", client.unary(request, path, codec)).await
    };
    for expected in [2, 1, 0] {
        let status = unknown().await.expect_err("no such method");
        assert_eq!(status.code(), Code::Unimplemented);
        assert_eq!(left().await, expected);
    }
    let refused = unknown().await.expect_err("over the limit");
    assert_eq!(refused.code(), Code::ResourceExhausted);
}
