//! A token budget for an LLM endpoint: each API key may spend 10,000 tokens a minute. A request
//! says in `x-llm-tokens` the most it expects to use; that estimate is charged when it arrives,
//! and the layer settles it to what the completion really used — the `x-tokens-used` header of
//! the upstream's answer — once the answer is out: the unused part comes back, and a completion
//! that used more than estimated leaves a debt that the key's next requests wait for.
//!
//! ```text
//! cargo run --example llm_tokens
//! ```
//!
//! It listens on `127.0.0.1:3000` (set `ADDR` to change that) and prints `curl` lines to try.

use std::net::SocketAddr;

use axum::http::{HeaderName, StatusCode};
use axum::{routing::post, Router};
use tollgate::{Cost, Key, Limit, MissingKey, RateLimitLayer, Rule, Settle};

const TOKENS: &str = "llm-tokens";
static API_KEY: HeaderName = HeaderName::from_static("x-api-key");
static LLM_TOKENS: HeaderName = HeaderName::from_static("x-llm-tokens");
static TOKENS_USED: HeaderName = HeaderName::from_static("x-tokens-used");

pub(crate) fn app() -> Router {
    // A request without `x-llm-tokens`, or expecting more than 10,000, gets 400 from the layer.
    let layer = RateLimitLayer::new(
        Rule::new(TOKENS, Limit::per_minute(10_000))
            .key(Key::header(API_KEY.clone()))
            .cost(Cost::header(LLM_TOKENS.clone()))
            .settle(Settle::header(TOKENS_USED.clone()))
            .on_missing_key(MissingKey::RejectWith(StatusCode::UNAUTHORIZED)),
    );
    Router::new()
        .route("/v1/complete", post(complete))
        .route_layer(layer)
}

/// The "upstream": pretends every word of the prompt costs 10 tokens, prompt and answer, and
/// reports it as an LLM API does.
async fn complete(prompt: String) -> ([(HeaderName, String); 1], String) {
    let words = u64::try_from(prompt.split_whitespace().count()).unwrap_or(u64::MAX);
    let used = words.saturating_mul(10);
    (
        [(TOKENS_USED.clone(), used.to_string())],
        format!("used {used} tokens\n"),
    )
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let complete = format!("curl -i http://{addr}/v1/complete -H 'x-api-key: k1'");
    println!("listening on http://{addr}; try:");
    println!(
        "  {complete} -H 'x-llm-tokens: 6000' -d 'tell me a story'   # r=4000, then 5970 given back"
    );
    println!(
        "  {complete} -H 'x-llm-tokens: 9000' -d 'and another one'   # fits thanks to the settlement"
    );
    println!("  {complete} -d 'no budget'                                 # 400: no x-llm-tokens");
    let app = app().into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await
}
