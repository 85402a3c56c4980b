//! The layer inside axum routers.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::routing::{get, post};
use axum::Router;
use http::{Request, StatusCode};
use tollgate::{Decision, Key, Limit, Rule};
use tower::ServiceExt;

use crate::support::paused;

async fn status(app: &Router, method: &str, path: &str) -> StatusCode {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(req).await.unwrap().status()
}

#[tokio::test(start_paused = true)]
async fn router_layer_with_connect_info() {
    let app = Router::new()
        .route("/", get(|| async { "hi" }))
        .layer(paused::layer(Limit::per_minute(2).key(Key::peer_ip())))
        .layer(MockConnectInfo(SocketAddr::from(([203, 0, 113, 1], 1234))));
    assert_eq!(status(&app, "GET", "/").await, StatusCode::OK);
    assert_eq!(status(&app, "GET", "/").await, StatusCode::OK);
    assert_eq!(
        status(&app, "GET", "/").await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(start_paused = true)]
async fn route_layer_limits_one_route_and_leaves_404s_alone() {
    let app = Router::new()
        .route("/login", post(|| async { "welcome" }))
        .route_layer(paused::layer(Rule::new("login", Limit::per_minute(1))))
        .route("/public", get(|| async { "free" }));
    assert_eq!(status(&app, "POST", "/login").await, StatusCode::OK);
    assert_eq!(
        status(&app, "POST", "/login").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    for _ in 0..3 {
        assert_eq!(status(&app, "GET", "/public").await, StatusCode::OK);
        assert_eq!(status(&app, "GET", "/missing").await, StatusCode::NOT_FOUND);
    }
}

/// What the guide's rules chapter says about `layer` and `route_layer`: `Router::layer` charges 404s and 405s,
/// `Router::route_layer` charges 405s (the path matched; axum's 405 answer runs inside the route),
/// and the method router's own `route_layer` charges only requests that match a route and one
/// of its methods.
#[tokio::test(start_paused = true)]
async fn which_refusals_of_the_router_are_charged() {
    let limits = || paused::layer(Rule::new("login", Limit::per_minute(2)));
    let welcome = || async { "welcome" };

    let everything = Router::new().route("/login", post(welcome)).layer(limits());
    assert_eq!(
        status(&everything, "GET", "/login").await,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        status(&everything, "GET", "/missing").await,
        StatusCode::NOT_FOUND
    );
    // The 405 and the 404 spent the budget of 2.
    assert_eq!(
        status(&everything, "POST", "/login").await,
        StatusCode::TOO_MANY_REQUESTS
    );

    let matched_paths = Router::new()
        .route("/login", post(welcome))
        .route_layer(limits());
    for _ in 0..3 {
        assert_eq!(
            status(&matched_paths, "GET", "/missing").await,
            StatusCode::NOT_FOUND
        );
    }
    assert_eq!(
        status(&matched_paths, "GET", "/login").await,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        status(&matched_paths, "POST", "/login").await,
        StatusCode::OK
    );
    // The 405 was charged: the budget of 2 is spent.
    assert_eq!(
        status(&matched_paths, "POST", "/login").await,
        StatusCode::TOO_MANY_REQUESTS
    );

    let matched_methods = Router::new().route("/login", post(welcome).route_layer(limits()));
    for _ in 0..3 {
        assert_eq!(
            status(&matched_methods, "GET", "/login").await,
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            status(&matched_methods, "GET", "/missing").await,
            StatusCode::NOT_FOUND
        );
    }
    assert_eq!(
        status(&matched_methods, "POST", "/login").await,
        StatusCode::OK
    );
    assert_eq!(
        status(&matched_methods, "POST", "/login").await,
        StatusCode::OK
    );
    assert_eq!(
        status(&matched_methods, "POST", "/login").await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(start_paused = true)]
async fn separate_layers_on_separate_routes_keep_separate_budgets() {
    let app = Router::new()
        .route(
            "/a",
            get(|| async { "a" }).layer(paused::layer(Limit::per_minute(1))),
        )
        .route(
            "/b",
            get(|| async { "b" }).layer(paused::layer(Limit::per_minute(1))),
        );
    assert_eq!(status(&app, "GET", "/a").await, StatusCode::OK);
    assert_eq!(status(&app, "GET", "/b").await, StatusCode::OK);
    assert_eq!(
        status(&app, "GET", "/a").await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(start_paused = true)]
async fn the_decision_is_an_extractor() {
    let app = Router::new()
        .route(
            "/",
            get(|decision: Decision| async move {
                format!("{} left", decision.remaining().unwrap_or(0))
            }),
        )
        .layer(paused::layer(Limit::per_minute(10)));
    let response = app
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let body = axum::body::to_bytes(response.into_body(), 1024)
        .await
        .unwrap();
    assert_eq!(&body[..], b"9 left");

    // Without the layer, or with a layer told to leave the decision out, the extractor says
    // what is wrong (the server's fault: 500) instead of panicking.
    let bare = Router::new().route("/", get(|_: Decision| async { "unreachable" }));
    let without = Router::new()
        .route("/", get(|_: Decision| async { "unreachable" }))
        .layer(
            paused::builder()
                .rule(Limit::per_minute(10))
                .decision_in_extensions(false)
                .build()
                .unwrap(),
        );
    for app in [bare, without] {
        let response = app
            .oneshot(Request::get("/").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        let text = std::str::from_utf8(&body).unwrap();
        assert!(text.contains("decision_in_extensions(false)"), "{text}");
    }
}

/// With stacked layers the handler reads the decision of the layer nearest to it: each layer puts
/// its own into the extensions, replacing the one an outer layer left there.
#[tokio::test(start_paused = true)]
async fn stacked_layers_leave_the_inner_decision_to_the_handler() {
    let rules_seen = |decision: Decision| async move {
        let names: Vec<&str> = decision.rules().iter().map(|r| r.rule()).collect();
        names.join(",")
    };
    let app = Router::new()
        .route("/login", post(rules_seen))
        .route_layer(paused::layer(Rule::new("login", Limit::per_minute(1))))
        .layer(paused::layer(Rule::new("site", Limit::per_minute(10))));
    let response = app
        .oneshot(Request::post("/login").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = axum::body::to_bytes(response.into_body(), 1024)
        .await
        .unwrap();
    assert_eq!(&body[..], b"login");
}

#[tokio::test(start_paused = true)]
async fn stacked_layers_each_add_their_items() {
    let app = Router::new()
        .route("/login", post(|| async { "welcome" }))
        .route_layer(paused::layer(Rule::new("login", Limit::per_minute(1))))
        .layer(paused::layer(Rule::new("site", Limit::per_minute(10))));
    let req = || Request::post("/login").body(Body::empty()).unwrap();
    let response = app.clone().oneshot(req()).await.unwrap();
    let lines: Vec<&str> = response
        .headers()
        .get_all("ratelimit")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(lines, ["\"login\";r=0;t=60", "\"site\";r=9;t=6"]);
    // Several field lines are one Structured Field list.
    let joined = lines.join(", ");
    let list: sfv::List = sfv::Parser::new(&joined).parse().unwrap();
    assert_eq!(list.len(), 2);

    let denied = app.clone().oneshot(req()).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let policies: Vec<&str> = denied
        .headers()
        .get_all("ratelimit-policy")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    // The outer layer passed the request before the inner one denied it: separate layers charge
    // separately (one layer with both rules would charge all or nothing).
    assert_eq!(policies, ["\"login\";q=1;w=60", "\"site\";q=10;w=60"]);
}

/// The key of `Key::path_param` is the value the handler's `Path` sees: every percent-encoded
/// spelling of one account is that account, on a nested router and under `Router::layer` too.
#[tokio::test(start_paused = true)]
async fn a_path_parameter_key_is_the_decoded_value_the_handler_sees() {
    use axum::extract::Path;
    let account = || Rule::new("account", Limit::per_minute(3)).key(Key::path_param("user"));
    let login = || {
        post(
            |Path(params): Path<std::collections::HashMap<String, String>>| async move {
                format!("welcome, {}", params["user"])
            },
        )
    };
    let flat = Router::new()
        .route("/login/{user}", login())
        .route_layer(paused::layer(account()));
    let nested = Router::new().nest(
        "/{tenant}/api",
        Router::new()
            .route("/login/{user}", login())
            .route_layer(paused::layer(account())),
    );
    // `Router::layer` runs inside the router too, once a route (or the fallback) matched.
    let layered = Router::new()
        .route("/login/{user}", login())
        .layer(paused::layer(account()));
    for (app, prefix) in [(flat, ""), (nested, "/acme/api"), (layered, "")] {
        for spelling in ["alice", "%61lice", "a%6Cice"] {
            let path = format!("{prefix}/login/{spelling}");
            assert_eq!(status(&app, "POST", &path).await, StatusCode::OK, "{path}");
        }
        // Three attempts under three spellings spent alice's three: a fourth is refused, and
        // bob is untouched.
        for spelling in ["%61%6c%69%63%65", "alic%65"] {
            let path = format!("{prefix}/login/{spelling}");
            assert_eq!(
                status(&app, "POST", &path).await,
                StatusCode::TOO_MANY_REQUESTS,
                "{path}"
            );
        }
        let bob = format!("{prefix}/login/bob");
        assert_eq!(status(&app, "POST", &bob).await, StatusCode::OK);
        // Not UTF-8 once decoded: refused, whatever the rule does with missing keys (axum's
        // `Path` refuses it too).
        let garbage = format!("{prefix}/login/%FF");
        let response = app
            .clone()
            .oneshot(Request::post(&garbage).body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .unwrap();
        let text = std::str::from_utf8(&body).unwrap();
        assert!(text.contains("path-param:user"), "{text}");
        assert!(text.contains("not valid UTF-8"), "{text}");
    }
}

/// A route without the parameter has no key: the rule's `MissingKey` decides.
#[tokio::test(start_paused = true)]
async fn a_route_without_the_path_parameter_has_no_key() {
    let rule = Rule::new("account", Limit::per_minute(1))
        .key(Key::path_param("user"))
        .on_missing_key(tollgate::MissingKey::Skip);
    let app = Router::new()
        .route("/login/{user}", post(|| async { "welcome" }))
        .route("/health", get(|| async { "ok" }))
        .route_layer(paused::layer(rule));
    for _ in 0..3 {
        assert_eq!(status(&app, "GET", "/health").await, StatusCode::OK);
    }
    assert_eq!(status(&app, "POST", "/login/carol").await, StatusCode::OK);
    assert_eq!(
        status(&app, "POST", "/login/carol").await,
        StatusCode::TOO_MANY_REQUESTS
    );
}
