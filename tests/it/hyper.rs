//! The layer in front of a plain hyper server (no axum), over real TCP on 127.0.0.1.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tollgate::{Key, Limit, RateLimitLayer};
use tower::{service_fn, ServiceBuilder};

/// Serves `limit` per peer IP on a free loopback port; plain hyper users insert the peer address
/// themselves.
async fn serve(layer: RateLimitLayer) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                return;
            };
            let service = ServiceBuilder::new()
                .map_request(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert(peer);
                    req
                })
                .layer(layer.clone())
                .service(service_fn(|_req: Request<Incoming>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
                }));
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_hyper_server_limits_across_connections() {
    let addr = serve(RateLimitLayer::new(Limit::per_day(3).key(Key::peer_ip()))).await;
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Empty<Bytes>>();
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let req = Request::get(format!("http://{addr}/"))
            .body(Empty::new())
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(10), client.request(req))
            .await
            .expect("the server answers")
            .unwrap();
        statuses.push(response.status());
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            assert!(response.headers().contains_key("retry-after"));
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert!(body.starts_with(b"{"), "problem+json body");
        } else {
            assert!(response.headers().contains_key("ratelimit"));
        }
    }
    assert_eq!(statuses[..3], [StatusCode::OK; 3]);
    assert_eq!(statuses[3..], [StatusCode::TOO_MANY_REQUESTS; 2]);
}
