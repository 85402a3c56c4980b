//! Failed logins, counted by the layer itself: each account may fail 5 times per 15 minutes and
//! each IP 20 times a minute; successful logins never count. An account that fails past its
//! limit is blocked — 15 minutes, then an hour, then a day for each further offence, forgiven a
//! day after its last block — and so is an IP that fails past its own.
//!
//! ```text
//! cargo run --example login_throttle
//! ```
//!
//! It listens on `127.0.0.1:3000` (set `ADDR` to change that) and prints `curl` lines to try.
//!
//! Every attempt is charged when it arrives and given back when its answer is not a `401`: so
//! concurrent guesses can never get past the limit, and the handler knows nothing of limits.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::{routing::post, Router};
use tollgate::{CountIf, Key, Limit, Penalty, RateLimitLayer, Rule};

const MINUTE: Duration = Duration::from_secs(60);

pub(crate) fn app() -> Router {
    // The account is the route's `{user}`, decoded as the handler's `Path` decodes it:
    // `/login/%61lice` is alice's account too, never five fresh guesses.
    let account = Key::path_param("user");
    let failed = || CountIf::status([401]);
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new("account", Limit::token_bucket(5, 15 * MINUTE))
                .key(account)
                .count_if(failed())
                .block(Penalty::escalating(
                    [15 * MINUTE, 60 * MINUTE, 24 * 60 * MINUTE],
                    24 * 60 * MINUTE,
                )),
        )
        .rule(
            Rule::new("ip", Limit::per_minute(20))
                .key(Key::peer_ip())
                .count_if(failed())
                .block(Penalty::fixed(15 * MINUTE)),
        )
        .build()
        .expect("the rules are valid");
    Router::new()
        .route("/login/{user}", post(login))
        .route_layer(layer)
}

async fn login(Path(user): Path<String>, password: String) -> (StatusCode, String) {
    // A real service verifies a password hash here.
    if password.trim() == "hunter2" {
        (StatusCode::OK, format!("welcome, {user}\n"))
    } else {
        (StatusCode::UNAUTHORIZED, "wrong user or password\n".into())
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let login = format!("curl http://{addr}/login/alice");
    println!("listening on http://{addr}; try:");
    println!("  {login} -i -d hunter2                  # 200, and it never counts");
    println!(
        "  for i in $(seq 5); do {login} -s -o /dev/null -w '%{{http_code}} ' -d guess; done; echo"
    );
    println!("  {login} -i -d hunter2                  # 429: blocked 15 minutes, even with the right password");
    let app = app().into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await
}
