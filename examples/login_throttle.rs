//! Failed logins: after 5 bad passwords for a user, that user's logins are refused for a while,
//! whatever IP they come from; on top, each IP may try 20 logins a minute, whatever the user.
//!
//! ```text
//! cargo run --example login_throttle
//! ```
//!
//! It listens on `127.0.0.1:3000` (set `ADDR` to change that) and prints `curl` lines to try.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Json, State};
use axum::http::{header::RETRY_AFTER, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{routing::post, Router};
use serde::Deserialize;
use tollgate::algorithm::Verdict;
use tollgate::{Key, Limit, LimitError, Limiter, RateLimitLayer, Rule};

const FAILED: &str = "failed-logins";

#[derive(Deserialize)]
struct Login {
    user: String,
    password: String,
}

pub(crate) fn app() -> Router {
    // 5 attempts, then one more every 3 minutes (5 per 15 minutes), per user name.
    let failures = Limiter::builder()
        .rule(Rule::new(
            FAILED,
            Limit::token_bucket(5, Duration::from_secs(15 * 60)),
        ))
        .build()
        .expect("the rule is valid");
    let per_ip =
        RateLimitLayer::new(Rule::new("login-ip", Limit::per_minute(20)).key(Key::peer_ip()));
    Router::new()
        .route("/login", post(login))
        .route_layer(per_ip)
        .with_state(failures)
}

async fn login(
    State(failures): State<Limiter>,
    Json(login): Json<Login>,
) -> Result<Response, StatusCode> {
    // Every attempt is charged before the password is compared, and a good one clears the count:
    // so only failures add up, and concurrent guesses cannot all slip through one free slot.
    let attempt = failures
        .charge(FAILED, &login.user, 1)
        .await
        .map_err(unavailable)?;
    if let Verdict::Denied { retry_after } = attempt.verdict {
        let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
        let headers = [(RETRY_AFTER, seconds.max(1).to_string())];
        let body = "too many failed logins; try again later\n";
        return Ok((StatusCode::TOO_MANY_REQUESTS, headers, body).into_response());
    }
    // A real service verifies a password hash here.
    if login.password != "hunter2" {
        return Ok((StatusCode::UNAUTHORIZED, "wrong user or password\n").into_response());
    }
    failures
        .reset(FAILED, &login.user)
        .await
        .map_err(unavailable)?;
    Ok(format!("welcome, {}\n", login.user).into_response())
}

fn unavailable(error: LimitError) -> StatusCode {
    eprintln!("login throttle unavailable: {error}");
    StatusCode::SERVICE_UNAVAILABLE
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let login = format!("curl http://{addr}/login -H 'content-type: application/json'");
    println!("listening on http://{addr}; try:");
    println!("  {login} -i -d '{{\"user\":\"alice\",\"password\":\"hunter2\"}}'");
    println!("  for i in $(seq 5); do {login} -s -o /dev/null -w '%{{http_code}} ' -d '{{\"user\":\"alice\",\"password\":\"guess\"}}'; done; echo");
    println!("  {login} -i -d '{{\"user\":\"alice\",\"password\":\"hunter2\"}}'   # 429 now, even with the right password");
    let app = app().into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await
}
