//! The admin API, off by default: on a listener of its own, an operator lists, reads and lifts
//! the blocks of the rules with a penalty (`block`) and lists, reads, sets and removes the
//! per-key overrides of the rules with `overrides = true`, on the rules in force (a reload's
//! new rules at once).
//!
//! It is on with an address (`--admin-addr` or `TOLLGATE_ADMIN_ADDR`) and refuses to start
//! without `TOLLGATE_ADMIN_TOKEN` (at least 16 characters; never a flag, so it stays out of the
//! process list). Every request without `Authorization: Bearer <that token>` is answered `401`
//! with `WWW-Authenticate: Bearer`. Keys in paths are percent-decoded; answers are JSON, errors
//! `{"error": "..."}` (an unknown rule is `404`, a key over 128 bytes `400`).
//!
//! | request | answer |
//! |---|---|
//! | `GET /_tollgate/blocks/{rule}` (`?cursor=` for the next page) | `{"rule", "blocks": [{"key", "remaining_ms", "offences"}], "next"}`; `next` is `null` on the last page |
//! | `GET /_tollgate/blocks/{rule}/{key}` | the key's block, or `404` when it is not blocked |
//! | `DELETE /_tollgate/blocks/{rule}/{key}` | lifts the block and forgets the offences: `204` |
//! | `GET /_tollgate/overrides/{rule}` (`?cursor=`) | `{"rule", "overrides": [{"key", "quota", "window_ms", "expires_in_ms"}], "next"}` |
//! | `GET /_tollgate/overrides/{rule}/{key}` | the key's override, or `404` when it has none |
//! | `PUT /_tollgate/overrides/{rule}/{key}` with `{"limit": {"rate": 600, "period": "1m"}, "ttl_seconds": 86400}` | sets it (the limit in the configuration's fields: `algorithm`, `rate`/`limit`, `period`, `capacity`…): `204`; a bad limit or TTL is `400` naming the field, nothing written |
//! | `DELETE /_tollgate/overrides/{rule}/{key}` | removes it: `204`; the key's count carries over |
//!
//! A rule is the library's: the `name` of a rule of tollgate's own file, or the name the
//! reference's limits are given (`tollgate-server --help` and the statistics show them). A key
//! is what the descriptors' values make: the values joined by `/`, a `/` or `%` inside a value
//! percent-encoded. With a Redis or Postgres store every instance sees the same blocks and
//! overrides: list or lift them through any one.
//!
//! Nothing here runs on a `ShouldRateLimit` call: each admin request reads the limiter in force
//! when it arrives.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use tollgate::config::{Config, ConfigFormat, LIMIT_FIELDS};
use tollgate::key::MAX_KEY_LEN;
use tollgate::store::{BlockedKey, Cursor, OverrideEntry, StoreErrorKind};
use tollgate::{Limit, LimitError, Limiter};

/// The variable that turns the admin API on: the address it listens on.
pub const ADDR_VARIABLE: &str = "TOLLGATE_ADMIN_ADDR";
/// The variable holding the bearer token every admin request must carry.
pub const TOKEN_VARIABLE: &str = "TOLLGATE_ADMIN_TOKEN";
/// The shortest token the admin API accepts.
pub const MIN_TOKEN_LEN: usize = 16;

/// Where the admin API listens and the token it asks for.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminSettings {
    /// The admin API's own address (keep it off the network Envoy reaches).
    pub addr: SocketAddr,
    token: String,
}

impl std::fmt::Debug for AdminSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: settings are logged and printed in errors.
        f.debug_struct("AdminSettings")
            .field("addr", &self.addr)
            .field("token", &"<redacted>")
            .finish()
    }
}

impl AdminSettings {
    /// The admin API's settings: `flag` (`--admin-addr`) or else [`ADDR_VARIABLE`] from `var`,
    /// and the token from [`TOKEN_VARIABLE`]. `None` (off) without an address; an error for an
    /// address that cannot be read, or without a usable token.
    pub fn read(
        flag: Option<SocketAddr>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<AdminSettings>, String> {
        let addr = match (flag, var(ADDR_VARIABLE).filter(|a| !a.is_empty())) {
            (Some(addr), _) => addr,
            (None, Some(text)) => text.parse().map_err(|_| {
                format!("{ADDR_VARIABLE}={text:?}: expected IP:PORT (127.0.0.1:6070)")
            })?,
            (None, None) => return Ok(None),
        };
        match var(TOKEN_VARIABLE) {
            Some(token) if token.len() >= MIN_TOKEN_LEN => Ok(Some(AdminSettings { addr, token })),
            Some(_) => Err(format!(
                "{TOKEN_VARIABLE} must be at least {MIN_TOKEN_LEN} characters long"
            )),
            None => Err(format!(
                "the admin API's address is set but {TOKEN_VARIABLE} is not: the admin API does \
                 not start without a token (at least {MIN_TOKEN_LEN} characters)"
            )),
        }
    }

    /// The token every request must carry.
    pub fn token(&self) -> &str {
        &self.token
    }
}

/// What the handlers read the limiter in force from (the server's current configuration).
type InForce = Arc<dyn Fn() -> Limiter + Send + Sync>;

/// The admin API on the limiter `in_force` returns at each request, every request refused
/// without `token`.
pub(crate) fn router(
    in_force: impl Fn() -> Limiter + Send + Sync + 'static,
    token: &str,
) -> Router {
    let blocks = Router::new()
        .route("/_tollgate/blocks/{rule}", get(list_blocks))
        .route(
            "/_tollgate/blocks/{rule}/{key}",
            get(get_block).delete(delete_block),
        );
    let overrides = Router::new()
        .route("/_tollgate/overrides/{rule}", get(list_overrides))
        .route(
            "/_tollgate/overrides/{rule}/{key}",
            get(get_override).put(put_override).delete(delete_override),
        );
    let in_force: InForce = Arc::new(in_force);
    blocks
        .merge(overrides)
        .fallback(|| async { failure(StatusCode::NOT_FOUND, "no such admin resource") })
        .with_state(in_force)
        .layer(middleware::from_fn_with_state(
            Sha256::digest(token.as_bytes()).into(),
            bearer,
        ))
}

/// Lets a request through only with the bearer token whose SHA-256 is `expected`. The digests
/// are compared in constant time, so the time taken says nothing about the token.
async fn bearer(State(expected): State<[u8; 32]>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| Sha256::digest(token.trim().as_bytes()));
    let matches = given.is_some_and(|given| {
        given
            .iter()
            .zip(expected.iter())
            .fold(0u8, |differ, (a, b)| differ | (a ^ b))
            == 0
    });
    if matches {
        return next.run(request).await;
    }
    let mut refused = failure(StatusCode::UNAUTHORIZED, "a bearer token is required");
    refused.headers_mut().insert(
        WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"tollgate-admin\""),
    );
    refused
}

#[derive(serde::Deserialize)]
struct PageQuery {
    cursor: Option<String>,
}

impl PageQuery {
    fn cursor(self) -> Option<Cursor> {
        self.cursor.filter(|c| !c.is_empty()).map(Cursor::new)
    }
}

/// A page of a listing as JSON: the rule, the entries under `name`, and the next page's cursor.
fn page_json<T>(
    rule: &str,
    name: &str,
    page: &tollgate::store::Page<T>,
    entry: fn(&T) -> Value,
) -> Response {
    let mut body = json!({ "rule": rule });
    body[name] = page.items.iter().map(entry).collect();
    body["next"] = json!(page.next.as_ref().map(Cursor::as_str));
    Json(body).into_response()
}

async fn list_blocks(
    State(in_force): State<InForce>,
    Path(rule): Path<String>,
    Query(page): Query<PageQuery>,
) -> Response {
    match in_force().blocks(&rule, page.cursor()).await {
        Ok(page) => page_json(&rule, "blocks", &page, blocked_json),
        Err(error) => limit_failure(error),
    }
}

async fn get_block(
    State(in_force): State<InForce>,
    Path((rule, key)): Path<(String, String)>,
) -> Response {
    if let Some(refused) = too_long(&key) {
        return refused;
    }
    let read = in_force().blocked(&rule, &key).await;
    one(read, blocked_json, "the key is not blocked")
}

async fn delete_block(
    State(in_force): State<InForce>,
    Path((rule, key)): Path<(String, String)>,
) -> Response {
    if let Some(refused) = too_long(&key) {
        return refused;
    }
    let lifted = in_force().unblock(&rule, &key).await;
    written(lifted, "block lifted", &rule, &key)
}

async fn list_overrides(
    State(in_force): State<InForce>,
    Path(rule): Path<String>,
    Query(page): Query<PageQuery>,
) -> Response {
    match in_force().overrides(&rule, page.cursor()).await {
        Ok(page) => page_json(&rule, "overrides", &page, override_json),
        Err(error) => limit_failure(error),
    }
}

async fn get_override(
    State(in_force): State<InForce>,
    Path((rule, key)): Path<(String, String)>,
) -> Response {
    if let Some(refused) = too_long(&key) {
        return refused;
    }
    let read = in_force().override_of(&rule, &key).await;
    one(read, override_json, "the key has no override")
}

/// The body of `PUT /_tollgate/overrides/{rule}/{key}`: the limit, in the configuration's words
/// (`{"rate": 600, "period": "1m"}`, `{"algorithm": "fixed_window", "limit": 1000, "period":
/// "1d"}`), and how long it holds.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct OverrideBody {
    limit: Map<String, Value>,
    ttl_seconds: u64,
}

async fn put_override(
    State(in_force): State<InForce>,
    Path((rule, key)): Path<(String, String)>,
    body: Result<Json<OverrideBody>, JsonRejection>,
) -> Response {
    if let Some(refused) = too_long(&key) {
        return refused;
    }
    let Json(body) = match body {
        Ok(body) => body,
        Err(rejection) => return failure(StatusCode::BAD_REQUEST, &rejection.body_text()),
    };
    let limit = match limit_of(body.limit) {
        Ok(limit) => limit,
        Err(message) => return failure(StatusCode::BAD_REQUEST, &message),
    };
    let ttl = Duration::from_secs(body.ttl_seconds);
    let set = in_force().set_override(&rule, &key, limit, ttl).await;
    written(set, "override set", &rule, &key)
}

async fn delete_override(
    State(in_force): State<InForce>,
    Path((rule, key)): Path<(String, String)>,
) -> Response {
    if let Some(refused) = too_long(&key) {
        return refused;
    }
    let removed = in_force().clear_override(&rule, &key).await;
    written(removed, "override removed", &rule, &key)
}

/// A limit written with the configuration's fields, read by the configuration's own parser (so
/// its errors are the file's: `limit.rate: ...`).
fn limit_of(fields: Map<String, Value>) -> Result<Limit, String> {
    if let Some(field) = fields.keys().find(|f| !LIMIT_FIELDS.contains(&f.as_str())) {
        return Err(format!(
            "limit.{field}: not a field of a limit (one of {})",
            LIMIT_FIELDS.join(", ")
        ));
    }
    let mut rule = fields;
    rule.insert("name".into(), json!("override"));
    // JSON is YAML: the document is read as a file of one rule would be.
    let document = json!({ "rules": [rule] }).to_string();
    let mut rules = Config::parse(ConfigFormat::Yaml, &document)
        .and_then(|config| config.rules())
        .map_err(|error| {
            let message = error.to_string();
            match message.split_once("rules[0].") {
                Some((_, rest)) => {
                    format!("limit.{}", rest.replacen(" (rule \"override\")", "", 1))
                }
                None => message,
            }
        })?;
    Ok(rules.remove(0).limit().clone())
}

/// An override as JSON: the key, the limit as `RateLimit-Policy` states it (`quota` units per
/// `window_ms`), and the time it has left.
fn override_json(entry: &OverrideEntry) -> Value {
    let algorithm = entry.limit.algorithm();
    let mut json = key_json(entry.key.as_bytes());
    json["quota"] = json!(algorithm.capacity());
    json["window_ms"] = json!(algorithm.window().as_millis());
    json["expires_in_ms"] = json!(entry.expires_in.as_micros().div_ceil(1000));
    json
}

fn blocked_json(blocked: &BlockedKey) -> Value {
    let mut entry = key_json(&blocked.key);
    entry["remaining_ms"] = json!(blocked.remaining.as_micros().div_ceil(1000));
    entry["offences"] = json!(blocked.offences);
    entry
}

/// `{"key": ...}`, or `{"key_hex": ...}` for a key that is not UTF-8.
fn key_json(key: &[u8]) -> Value {
    match std::str::from_utf8(key) {
        Ok(key) => json!({ "key": key }),
        Err(_) => json!({ "key_hex": key.iter().map(|b| format!("{b:02x}")).collect::<String>() }),
    }
}

/// The refusal of a key longer than the store keeps (it would stand for its digest, not for
/// itself), if it is.
fn too_long(key: &str) -> Option<Response> {
    (key.len() > MAX_KEY_LEN).then(|| {
        failure(
            StatusCode::BAD_REQUEST,
            &format!(
                "the key is {} bytes long, over the bound of {MAX_KEY_LEN}: the store counts such \
                 a key by its digest, listed as sha256:<hex>",
                key.len()
            ),
        )
    })
}

/// The answer to a read of one key: its entry as JSON, or `404` saying `missing`.
fn one<T>(read: Result<Option<T>, LimitError>, entry: fn(&T) -> Value, missing: &str) -> Response {
    match read {
        Ok(Some(found)) => Json(entry(&found)).into_response(),
        Ok(None) => failure(StatusCode::NOT_FOUND, missing),
        Err(error) => limit_failure(error),
    }
}

/// The answer to a write: `204`, and a log line saying what was `done` (operators' changes are
/// kept in the log).
fn written(result: Result<(), LimitError>, done: &str, rule: &str, key: &str) -> Response {
    match result {
        Ok(()) => {
            tracing::info!(%rule, %key, "admin API: {done}");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(error) => limit_failure(error),
    }
}

fn limit_failure(error: LimitError) -> Response {
    let status = match &error {
        LimitError::UnknownRule(_) | LimitError::NoPenalty(_) | LimitError::NotOverridable(_) => {
            StatusCode::NOT_FOUND
        }
        LimitError::BadOverride { .. } => StatusCode::BAD_REQUEST,
        LimitError::Store(e) if e.kind() == StoreErrorKind::BadCursor => StatusCode::BAD_REQUEST,
        LimitError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    failure(status, &error.to_string())
}

fn failure(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate::clock::ManualClock;
    use tollgate::{MemoryStore, Penalty, Rule};
    use tower_service::Service;

    const TOKEN: &str = "0123456789abcdef-admin";
    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn the_admin_api_is_off_without_an_address_and_refuses_to_start_without_a_token() {
        let read = |addr: Option<&str>, token: Option<&str>| {
            AdminSettings::read(None, |name| match name {
                ADDR_VARIABLE => addr.map(str::to_owned),
                TOKEN_VARIABLE => token.map(str::to_owned),
                _ => None,
            })
        };
        assert_eq!(read(None, Some(TOKEN)), Ok(None));
        assert_eq!(read(Some(""), None), Ok(None));
        let missing = read(Some("127.0.0.1:3001"), None).unwrap_err();
        assert!(missing.contains("TOLLGATE_ADMIN_TOKEN is not"), "{missing}");
        let short = read(Some("127.0.0.1:3001"), Some("hunter2")).unwrap_err();
        assert!(short.contains("at least 16 characters"), "{short}");
        let on = read(Some("127.0.0.1:3001"), Some(TOKEN)).unwrap().unwrap();
        assert_eq!(
            (on.addr, on.token()),
            (SocketAddr::from(([127, 0, 0, 1], 3001)), TOKEN)
        );
        assert!(!format!("{on:?}").contains(TOKEN));
        // The flag wins over the variable.
        let flag = SocketAddr::from(([127, 0, 0, 1], 6070));
        let on = AdminSettings::read(Some(flag), |name| {
            (name == TOKEN_VARIABLE).then(|| TOKEN.to_owned())
        });
        assert_eq!(on.unwrap().unwrap().addr, flag);
    }

    /// What is left of a block and of an override, to the millisecond, on a clock the test
    /// moves (the process tests run on the real one).
    #[tokio::test]
    async fn the_time_left_is_told_in_milliseconds() {
        let clock = ManualClock::new(Duration::from_secs(1_000));
        let limiter = Limiter::builder()
            .rule(Rule::new("login", Limit::per_minute(1)).block(Penalty::fixed(10 * MINUTE)))
            .rule(Rule::new("api", Limit::per_minute(100)).overridable())
            .store(MemoryStore::with_clock(clock.clone()))
            .build()
            .unwrap();
        let in_force = limiter.clone();
        let mut admin = router(move || in_force.clone(), TOKEN);
        limiter.block("login", "a b/c", 2 * MINUTE).await.unwrap();
        let hour = Duration::from_secs(3600);
        let raised = Limit::per_minute(2);
        limiter
            .set_override("api", "acme", raised, hour)
            .await
            .unwrap();
        clock.advance(MINUTE);
        let mut get = |path: &str| {
            let request = axum::http::Request::get(path)
                .header("authorization", format!("Bearer {TOKEN}"))
                .body(axum::body::Body::empty())
                .unwrap();
            let answer = admin.call(request);
            async move {
                let body = answer.await.unwrap().into_body();
                let body = axum::body::to_bytes(body, 1 << 16).await.unwrap();
                serde_json::from_slice::<Value>(&body).unwrap()
            }
        };
        assert_eq!(
            get("/_tollgate/blocks/login/a%20b%2Fc").await,
            json!({ "key": "a b/c", "remaining_ms": 60_000, "offences": 0 })
        );
        assert_eq!(
            get("/_tollgate/overrides/api/acme").await,
            json!({"key": "acme", "quota": 2, "window_ms": 60_000, "expires_in_ms": 3_540_000})
        );
    }
}
