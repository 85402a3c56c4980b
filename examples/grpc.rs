//! One layer, two protocols: a tonic gRPC server and an axum route on one port, limited by one
//! `RateLimitLayer`. `helloworld.Greeter/SayHello` allows 5 calls a minute per peer IP (a token
//! bucket with a burst of 5); `GET /health` 60 a minute per peer IP.
//!
//! ```text
//! cargo run --example grpc --features tonic
//! ```
//!
//! It listens on `127.0.0.1:50051` (set `ADDR` to change that). Call it with
//! [grpcurl](https://github.com/fullstorydev/grpcurl) and the `.proto` beside this file (the
//! server has no reflection service); the 6th call within a minute is refused with
//! `ResourceExhausted`, and the headers (`-v`) show `grpc-retry-pushback-ms`:
//!
//! ```text
//! grpcurl -plaintext -v -import-path examples/proto -proto helloworld.proto \
//!     -d '{"name": "you"}' 127.0.0.1:50051 helloworld.Greeter/SayHello
//! curl -i http://127.0.0.1:50051/health
//! ```
//!
//! or with the tonic client below, which calls `SayHello` six times and prints each answer:
//!
//! ```text
//! cargo run --example grpc --features tonic -- call
//! ```
//!
//! The Greeter is written by hand on `tonic::server::Grpc` with `prost` messages rather than
//! generated from `helloworld.proto` by `tonic-prost-build`: code generation needs `protoc` (or
//! a build script, which an example cannot have), and two messages and one method are shorter
//! to write than to generate. A real service would generate them in its own build script.

use std::net::SocketAddr;

use axum::{routing::get, Router};
use tokio::net::TcpListener;
use tollgate::{Key, Limit, MemoryStore, RateLimitLayer, Rule};
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

/// The limits: one rule per protocol's route, both per peer IP. (A rule without a scope would
/// count gRPC calls and HTTP requests against one budget.)
pub(crate) fn limits() -> RateLimitLayer {
    limits_in(MemoryStore::new())
}

/// The same limits in `store` (the tests give one with a manual clock).
pub(crate) fn limits_in(store: MemoryStore) -> RateLimitLayer {
    RateLimitLayer::builder()
        .store(store)
        .rule(
            Rule::new("greeter", Limit::per_minute(5).capacity(5))
                .key(Key::peer_ip())
                .grpc("/helloworld.Greeter/SayHello"),
        )
        .rule(
            Rule::new("health", Limit::per_minute(60))
                .key(Key::peer_ip())
                .path("/health"),
        )
        .build()
        .expect("the rules are valid")
}

/// Serves the Greeter and `/health` on `listener`, behind `limits`. tonic's server leaves each
/// connection's `TcpConnectInfo` in the requests, which `Key::peer_ip` reads (feature `tonic`);
/// `accept_http1` lets plain HTTP/1.1 clients such as curl reach `/health`.
pub(crate) async fn serve(
    listener: TcpListener,
    limits: RateLimitLayer,
) -> Result<(), tonic::transport::Error> {
    let health = Router::new().route("/health", get(|| async { "ok\n" }));
    Server::builder()
        .accept_http1(true)
        .layer(limits)
        .add_routes(Routes::from(health))
        .add_service(greeter::Greeter)
        .serve_with_incoming(TcpIncoming::from(listener))
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:50051".to_owned());
    if std::env::args().nth(1).as_deref() == Some("call") {
        return call(&addr).await;
    }
    let listener = TcpListener::bind(addr).await?;
    let addr: SocketAddr = listener.local_addr()?;
    println!("listening on {addr} (gRPC: helloworld.Greeter/SayHello; HTTP: GET /health)");
    serve(listener, limits()).await?;
    Ok(())
}

/// The client side: six calls, the last one past the limit.
async fn call(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    for i in 1..=6 {
        let request = tonic::Request::new(greeter::HelloRequest {
            name: format!("call {i}"),
        });
        match greeter::say_hello(channel.clone(), request).await {
            Ok(reply) => {
                let ratelimit = reply.metadata().get("ratelimit").cloned();
                println!("{}  (ratelimit: {ratelimit:?})", reply.into_inner().message);
            }
            Err(status) => {
                let pushback = status.metadata().get("grpc-retry-pushback-ms").cloned();
                println!(
                    "{:?}: {}  (retry in {pushback:?} ms)",
                    status.code(),
                    status.message()
                );
            }
        }
    }
    Ok(())
}

/// `helloworld.Greeter`, by hand: its messages, its server and a client call.
pub(crate) mod greeter {
    use std::convert::Infallible;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use http::uri::PathAndQuery;
    use tonic::body::Body;
    use tonic::server::{Grpc, NamedService};
    use tonic::transport::Channel;
    use tonic::Status;
    use tonic_prost::ProstCodec;

    /// The method's path: what a rule's `grpc` scope names.
    pub(crate) const SAY_HELLO: &str = "/helloworld.Greeter/SayHello";

    /// `message HelloRequest { string name = 1; }`
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct HelloRequest {
        #[prost(string, tag = "1")]
        pub(crate) name: String,
    }

    /// `message HelloReply { string message = 1; }`
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct HelloReply {
        #[prost(string, tag = "1")]
        pub(crate) message: String,
    }

    /// The server: routes a call by its path to the method, as generated code would.
    #[derive(Clone, Debug, Default)]
    pub(crate) struct Greeter;

    impl NamedService for Greeter {
        const NAME: &'static str = "helloworld.Greeter";
    }

    impl tower::Service<http::Request<Body>> for Greeter {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<Body>) -> Self::Future {
            if request.uri().path() != SAY_HELLO {
                return Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) });
            }
            let say_hello = tower::service_fn(|request: tonic::Request<HelloRequest>| async move {
                let name = request.into_inner().name;
                Ok::<_, Status>(tonic::Response::new(HelloReply {
                    message: format!("Hello {name}!"),
                }))
            });
            Box::pin(async move {
                let mut grpc = Grpc::new(ProstCodec::<HelloReply, HelloRequest>::default());
                Ok(grpc.unary(say_hello, request).await)
            })
        }
    }

    /// Calls `SayHello` on `channel`.
    pub(crate) async fn say_hello(
        channel: Channel,
        request: tonic::Request<HelloRequest>,
    ) -> Result<tonic::Response<HelloReply>, Status> {
        let mut client = tonic::client::Grpc::new(channel);
        client
            .ready()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let codec = ProstCodec::<HelloRequest, HelloReply>::default();
        client
            .unary(request, PathAndQuery::from_static(SAY_HELLO), codec)
            .await
    }
}
