//! Instructions per request of the HTTP bench's servers without the network: axum's hello-world
//! `Router`, bare or behind each limiter (added with `Router::layer`, as in `benches/http.rs`),
//! called in process, counted by callgrind.
//!
//! ```text
//! cargo build --release -p tollgate-bench --example layer_instructions
//! valgrind --tool=callgrind --toggle-collect='*measured*' \
//!     target/release/examples/layer_instructions tollgate-allowed-headers 20000
//! ```
//!
//! Arguments: the server (`bare`, `tollgate-allowed-headers`, `tollgate-allowed-noheaders`,
//! `tollgate-allowed-nothing` — fields off and no `Decision` in the extensions
//! (`decision_in_extensions(false)`), what tower_governor adds to a request —,
//! `tollgate-allowed-headers-nodecision` (fields on, no `Decision`),
//! `tower_governor-allowed`, `tower_governor-allowed-headers`, and the denied servers
//! `tollgate-denied-headers` and `tower_governor-denied`, whose quota of one request an hour the
//! warm-up spends, so that every counted request is refused with 429) and the number of requests.
//! Each request is built with the peer address a served request carries (`ConnectInfo`), sent
//! through a clone of the router as axum's server does, and its body read to the end. With
//! `--toggle-collect` callgrind counts only those requests; divide its total by them (the total
//! also holds the ten warm-up requests, and on a denied server the quota's one allowed request:
//! about 0.05 %). No sockets, no hyper, no scheduler: the count repeats to
//! the instruction from run to run, so a change of a few instructions in the layer shows, where
//! `./scripts/http_instructions.sh` (the served figure) moves by about a hundred between
//! sessions. What hyper spends writing the fields is left out here.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::{routing::get, Router};
use http_body_util::BodyExt;
use tower::ServiceExt;

/// The quota of the bench's "allowed" runs: nothing is ever denied.
const GENEROUS_PER_SECOND: u64 = 1_000_000;

/// tollgate with its fields on or off, and its `Decision` in the request's extensions or not.
fn tollgate_layer(headers: bool, decision: bool) -> tollgate::RateLimitLayer {
    tollgate_limit(
        tollgate::Limit::per_second(GENEROUS_PER_SECOND),
        headers,
        decision,
    )
}

fn tollgate_limit(
    limit: tollgate::Limit,
    headers: bool,
    decision: bool,
) -> tollgate::RateLimitLayer {
    tollgate::RateLimitLayer::builder()
        .rule(limit.key(tollgate::Key::peer_ip()))
        .headers_on_allowed(headers)
        .decision_in_extensions(decision)
        .build()
        .expect("valid rule")
}

fn governor_config() -> tower_governor::governor::GovernorConfigBuilder<
    tower_governor::key_extractor::PeerIpKeyExtractor,
    governor::middleware::NoOpMiddleware,
> {
    let mut config = tower_governor::governor::GovernorConfigBuilder::default();
    config
        .period(Duration::from_nanos(1_000_000_000 / GENEROUS_PER_SECOND))
        .burst_size(GENEROUS_PER_SECOND as u32);
    config
}

/// tower_governor's quota of the denied server: one request an hour.
fn governor_tight() -> tower_governor::governor::GovernorConfigBuilder<
    tower_governor::key_extractor::PeerIpKeyExtractor,
    governor::middleware::NoOpMiddleware,
> {
    let mut config = tower_governor::governor::GovernorConfigBuilder::default();
    config.period(Duration::from_secs(3600)).burst_size(1);
    config
}

fn router(server: &str) -> Option<Router> {
    let router = Router::new().route("/", get(|| async { "Hello, World!" }));
    Some(match server {
        "bare" => router,
        "tollgate-allowed-headers" => router.layer(tollgate_layer(true, true)),
        "tollgate-allowed-noheaders" => router.layer(tollgate_layer(false, true)),
        "tollgate-allowed-nothing" => router.layer(tollgate_layer(false, false)),
        "tollgate-allowed-headers-nodecision" => router.layer(tollgate_layer(true, false)),
        "tower_governor-allowed" => router.layer(tower_governor::GovernorLayer::new(
            governor_config().finish().expect("valid quota"),
        )),
        "tower_governor-allowed-headers" => router.layer(tower_governor::GovernorLayer::new(
            governor_config()
                .use_headers()
                .finish()
                .expect("valid quota"),
        )),
        "tollgate-denied-headers" => {
            router.layer(tollgate_limit(tollgate::Limit::per_hour(1), true, true))
        }
        "tower_governor-denied" => router.layer(tower_governor::GovernorLayer::new(
            governor_tight().finish().expect("valid quota"),
        )),
        _ => return None,
    })
}

/// The requests counted: not inlined, so that callgrind can switch its counting on around it.
/// Returns the fields and body bytes seen, so that nothing is optimized away.
#[inline(never)]
async fn measured(router: &Router, requests: u64, status: http::StatusCode) -> usize {
    let peer = SocketAddr::from(([203, 0, 113, 7], 40000));
    let mut seen = 0;
    for _ in 0..requests {
        let mut request = http::Request::get("/")
            .body(axum::body::Body::empty())
            .expect("a request");
        request.extensions_mut().insert(ConnectInfo(peer));
        let response = router.clone().oneshot(request).await.expect("infallible");
        assert_eq!(
            response.status(),
            status,
            "every request on the server's path"
        );
        seen += response.headers().len();
        let body = response.into_body().collect().await.expect("a body");
        seen += body.to_bytes().len();
    }
    seen
}

fn server_denies(server: &str) -> bool {
    server.contains("-denied")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: layer_instructions bare|tollgate-allowed-headers|\
                 tollgate-allowed-noheaders|tollgate-allowed-nothing|\
                 tollgate-allowed-headers-nodecision|tower_governor-allowed|\
                 tower_governor-allowed-headers|tollgate-denied-headers|tower_governor-denied \
                 REQUESTS";
    let (Some(router), Some(requests)) = (
        args.first().and_then(|server| router(server)),
        args.get(1).and_then(|n| n.parse::<u64>().ok()),
    ) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let status = if server_denies(&args[0]) {
        http::StatusCode::TOO_MANY_REQUESTS
    } else {
        http::StatusCode::OK
    };
    let seen = runtime.block_on(async {
        if status != http::StatusCode::OK {
            // The quota's one request.
            measured(&router, 1, http::StatusCode::OK).await;
        }
        measured(&router, 10, status).await;
        measured(&router, requests, status).await
    });
    println!("{requests} requests, {seen} field and body bytes seen");
}
