//! A token budget for an LLM endpoint: each API key may spend 10,000 tokens a minute. A request
//! says in `x-llm-tokens` the most it may use and is charged that up front; what the completion
//! did not use is refunded afterwards.
//!
//! ```text
//! cargo run --example llm_tokens
//! ```
//!
//! It listens on `127.0.0.1:3000` (set `ADDR` to change that) and prints `curl` lines to try.

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::{HeaderName, StatusCode};
use axum::{routing::post, Router};
use tollgate::{Cost, Decision, Key, Limit, Limiter, MissingKey, RateLimitLayer, Rule};

const TOKENS: &str = "llm-tokens";
static API_KEY: HeaderName = HeaderName::from_static("x-api-key");
static LLM_TOKENS: HeaderName = HeaderName::from_static("x-llm-tokens");

pub(crate) fn app() -> Router {
    // A request without `x-llm-tokens`, or asking for more than 10,000, gets 400 from the layer.
    let layer = RateLimitLayer::new(
        Rule::new(TOKENS, Limit::per_minute(10_000))
            .key(Key::header(API_KEY.clone()))
            .cost(Cost::header(LLM_TOKENS.clone()))
            .on_missing_key(MissingKey::RejectWith(StatusCode::UNAUTHORIZED)),
    );
    // The handler refunds through the layer's own limiter.
    let limiter = layer.limiter().clone();
    Router::new()
        .route("/v1/complete", post(complete))
        .route_layer(layer)
        .with_state(limiter)
}

async fn complete(State(limiter): State<Limiter>, decision: Decision, prompt: String) -> String {
    // The decision says which key the layer charged and how many tokens it reserved.
    let Some(charged) = decision.rule(TOKENS) else {
        return "no token budget applies\n".to_owned();
    };
    let reserved = charged.cost;
    // The "completion": pretend every word of the prompt costs 10 tokens, prompt and answer.
    let words = u64::try_from(prompt.split_whitespace().count()).unwrap_or(u64::MAX);
    let used = words.saturating_mul(10).min(reserved);
    let unused = reserved - used;
    if let Err(error) = limiter.refund(TOKENS, &charged.key, unused).await {
        // The answer is ready; an unrefunded budget only makes the client wait a little longer.
        eprintln!("refund failed: {error}");
    }
    format!("used {used} of {reserved} tokens, refunded {unused}\n")
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let complete = format!("curl -i http://{addr}/v1/complete -H 'x-api-key: k1'");
    println!("listening on http://{addr}; try:");
    println!(
        "  {complete} -H 'x-llm-tokens: 6000' -d 'tell me a story'   # r=4000, then 5960 refunded"
    );
    println!(
        "  {complete} -H 'x-llm-tokens: 9000' -d 'and another one'   # fits thanks to the refund"
    );
    println!("  {complete} -d 'no budget'                                 # 400: no x-llm-tokens");
    let app = app().into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await
}
