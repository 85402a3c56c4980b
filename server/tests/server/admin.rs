//! The admin API (`/_tollgate/blocks/…`, `/_tollgate/overrides/…`) of a real server process: off
//! without an address, refused to start without a token, every request refused without the
//! bearer token, the blocks the rules' penalties made listed, read and lifted through it, and
//! overrides set, read, listed and removed, each seen by the next `ShouldRateLimit` call (on the
//! memory store here; across two servers on one Redis in `redis.rs`).
//!
//! The server's clock is the real one: what is left of a block or an override is checked within
//! the few seconds a test may take.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;

use serde_json::{json, Value};
use tollgate_server::service::admin::{ADDR_VARIABLE, TOKEN_VARIABLE};
use tollgate_server::service::protocol::{code, UInt64Value};

use crate::support::{
    field, http_request, request, run_command_to_exit, Client, ConfigDir, HttpAnswer, Server,
};

pub const TOKEN: &str = "0123456789abcdef-admin";

/// `login` blocks a user for ten minutes once over one call a second; `plain` has no penalty;
/// `api` takes overrides.
const RULES: &str = r#"
domain = "admin"
[[rules]]
name = "login"
rate = 1
period = "1s"
block = "10m"
descriptors = [{ key = "user" }]
[[rules]]
name = "plain"
rate = 100
period = "1m"
descriptors = [{ key = "plain" }]
[[rules]]
name = "api"
rate = 100
period = "1m"
overrides = true
descriptors = [{ key = "customer" }]
"#;

/// A server on `config` with the admin API on a free port, and that port.
pub fn start_with_admin(config: &Path) -> (Server, SocketAddr) {
    let mut command = Server::command(config, &["--admin-addr", "127.0.0.1:0"]);
    command.env(TOKEN_VARIABLE, TOKEN);
    let server = Server::spawn(command);
    let line = server
        .log
        .iter()
        .find(|line| line.contains("admin="))
        .unwrap_or_else(|| panic!("no admin API in the log:\n{}", server.log.join("\n")));
    let admin = field(line, "admin=")
        .parse()
        .expect("the admin API's address");
    (server, admin)
}

/// `method path` on the admin API with `authorization` (if any) and a JSON `body`.
pub fn send(
    admin: SocketAddr,
    method: &str,
    path: &str,
    authorization: Option<&str>,
    body: &str,
) -> HttpAnswer {
    let mut headers = vec![("content-type", "application/json")];
    headers.extend(authorization.map(|value| ("authorization", value)));
    http_request(admin, method, path, &headers, body)
}

/// `method path` as the operator, with the token.
pub fn as_admin(admin: SocketAddr, method: &str, path: &str) -> HttpAnswer {
    send(admin, method, path, Some(&format!("Bearer {TOKEN}")), "")
}

/// The answer's JSON body (its content type checked).
pub fn json(answer: &HttpAnswer) -> Value {
    assert_eq!(
        answer.header("content-type"),
        Some("application/json"),
        "{}",
        answer.body
    );
    serde_json::from_str(&answer.body).unwrap()
}

/// Asks `domain` once for `descriptor` (one entry): the overall code.
async fn ask(client: &Client, domain: &str, descriptor: (&str, &str)) -> i32 {
    client.ask(domain, &[&[descriptor]]).await.overall_code
}

/// A look at `user` under `login`, nothing charged (`hits_addend` 0): refused only by a block.
async fn look(client: &Client, user: &str) -> i32 {
    let mut request = request("admin", &[&[("user", user)]]);
    request.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    let answer = client.call(request).await.expect("ShouldRateLimit answers");
    answer.overall_code
}

/// Blocks `user` under `login` by the rule's penalty: one call within the limit, one over it.
async fn offend(client: &Client, user: &str) {
    assert_eq!(ask(client, "admin", ("user", user)).await, code::OK);
    assert_eq!(ask(client, "admin", ("user", user)).await, code::OVER_LIMIT);
}

#[test]
fn the_server_starts_the_admin_api_only_with_an_address_and_a_token() {
    let dir = ConfigDir::new();
    let config = dir.write("admin.toml", RULES);
    let config = config.to_str().unwrap();
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut command = std::process::Command::new(crate::support::BINARY);
        command
            .args(["--config", config, "--grpc-addr", "127.0.0.1:0"])
            .args(["--http-addr", "127.0.0.1:0"])
            .args(args)
            .env_remove(ADDR_VARIABLE)
            .env_remove(TOKEN_VARIABLE)
            .envs(env.iter().copied());
        run_command_to_exit(command)
    };
    let (status, stderr) = run(&["--admin-addr", "127.0.0.1:0"], &[]);
    assert!(!status.success());
    assert!(stderr.contains("TOLLGATE_ADMIN_TOKEN is not"), "{stderr}");
    let (status, stderr) = run(&[], &[(ADDR_VARIABLE, "127.0.0.1:0")]);
    assert!(!status.success());
    assert!(stderr.contains("TOLLGATE_ADMIN_TOKEN is not"), "{stderr}");
    let (status, stderr) = run(
        &["--admin-addr", "127.0.0.1:0"],
        &[(TOKEN_VARIABLE, "hunter2")],
    );
    assert!(!status.success());
    assert!(stderr.contains("at least 16 characters"), "{stderr}");
    let (status, stderr) = run(&[], &[(ADDR_VARIABLE, "nowhere"), (TOKEN_VARIABLE, TOKEN)]);
    assert!(!status.success());
    assert!(
        stderr.contains("TOLLGATE_ADMIN_ADDR=\"nowhere\""),
        "{stderr}"
    );

    // Off by default: a token alone starts nothing.
    let mut command = Server::command(Path::new(config), &[]);
    command.env(TOKEN_VARIABLE, TOKEN).env_remove(ADDR_VARIABLE);
    let server = Server::spawn(command);
    assert!(
        server.log.iter().all(|line| !line.contains("admin=")),
        "{}",
        server.log.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_without_the_bearer_token_is_refused() {
    let dir = ConfigDir::new();
    let (server, admin) = start_with_admin(&dir.write("admin.toml", RULES));
    let client = server.client().await;
    offend(&client, "mallory").await;
    let paths = [
        "/_tollgate/blocks/login",
        "/_tollgate/blocks/login/mallory",
        "/_tollgate/elsewhere",
        "/_tollgate/overrides/api",
        "/_tollgate/overrides/api/mallory",
    ];
    let put = r#"{"limit": {"rate": 5, "period": "1m"}, "ttl_seconds": 60}"#;
    for path in paths {
        for authorization in [
            None,
            Some("Bearer 0123456789abcdef-wrong".to_owned()),
            Some("Bearer ".to_owned()),
            Some(format!("Basic {TOKEN}")),
            Some(TOKEN.to_owned()),
        ] {
            for method in ["GET", "DELETE", "PUT"] {
                let answer = send(admin, method, path, authorization.as_deref(), put);
                assert_eq!(answer.status, 401, "{method} {path} {authorization:?}");
                assert_eq!(
                    answer.header("www-authenticate"),
                    Some("Bearer realm=\"tollgate-admin\"")
                );
            }
        }
    }
    // Nothing was lifted or set by the refused DELETEs and PUTs.
    let no_override = as_admin(admin, "GET", "/_tollgate/overrides/api/mallory");
    assert_eq!(no_override.status, 404, "{}", no_override.body);
    let still_blocked = as_admin(admin, "GET", paths[1]);
    assert_eq!(still_blocked.status, 200, "{}", still_blocked.body);
    // The right token, in any case of the scheme's name.
    let listed = as_admin(admin, "GET", paths[0]);
    assert_eq!(listed.status, 200, "{}", listed.body);
    let lowercase = send(admin, "GET", paths[1], Some(&format!("bearer {TOKEN}")), "");
    assert_eq!(lowercase.status, 200, "{}", lowercase.body);
    let elsewhere = as_admin(admin, "GET", paths[2]);
    assert_eq!(elsewhere.status, 404);
    assert!(json(&elsewhere)["error"].is_string());
}

/// A key the rule's penalty blocked is listed, read and lifted through the admin API; bad
/// requests are clear errors that change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_are_listed_read_and_lifted_through_the_admin_api() {
    let dir = ConfigDir::new();
    let (server, admin) = start_with_admin(&dir.write("admin.toml", RULES));
    let client = server.client().await;
    offend(&client, "alice").await;
    // A `/` in a value is `%2F` in the key (the key's parts are joined by `/`).
    offend(&client, "a b/c").await;

    let listed = as_admin(admin, "GET", "/_tollgate/blocks/login");
    assert_eq!(listed.status, 200, "{}", listed.body);
    let mut body = json(&listed);
    let blocks = body["blocks"].as_array_mut().unwrap();
    blocks.sort_by_key(|b| b["key"].as_str().unwrap().to_owned());
    for block in blocks.iter_mut() {
        let left = block["remaining_ms"].take().as_u64().unwrap();
        assert!((580_000..=600_000).contains(&left), "{block}: {left}");
    }
    assert_eq!(
        body,
        json!({
            "rule": "login",
            "blocks": [
                { "key": "a b%2Fc", "remaining_ms": null, "offences": 1 },
                { "key": "alice", "remaining_ms": null, "offences": 1 },
            ],
            "next": null,
        })
    );
    // Keys in paths are percent-decoded.
    let one = as_admin(admin, "GET", "/_tollgate/blocks/login/a%20b%252Fc");
    assert_eq!(one.status, 200, "{}", one.body);
    let one = json(&one);
    assert_eq!(
        (&one["key"], &one["offences"]),
        (&json!("a b%2Fc"), &json!(1))
    );
    let lifted = as_admin(admin, "DELETE", "/_tollgate/blocks/login/alice");
    assert_eq!(lifted.status, 204);
    let gone = as_admin(admin, "GET", "/_tollgate/blocks/login/alice");
    assert_eq!(gone.status, 404);
    assert_eq!(json(&gone)["error"], "the key is not blocked");
    // The next look at alice passes: a look charges nothing, so it fits her empty bucket, and
    // only a block refused it (as it still refuses the other blocked key).
    assert_eq!(look(&client, "alice").await, code::OK);
    assert_eq!(look(&client, "a b/c").await, code::OVER_LIMIT);

    // Bad requests: clear errors, nothing written.
    let unknown = as_admin(admin, "GET", "/_tollgate/blocks/nope");
    assert_eq!(unknown.status, 404);
    assert_eq!(
        json(&unknown)["error"],
        "no rate-limit rule is named \"nope\""
    );
    let unknown = as_admin(admin, "DELETE", "/_tollgate/blocks/nope/alice");
    assert_eq!(unknown.status, 404);
    let plain = as_admin(admin, "GET", "/_tollgate/blocks/plain");
    assert_eq!(plain.status, 404);
    assert!(
        json(&plain)["error"]
            .as_str()
            .unwrap()
            .contains("no penalty"),
        "{}",
        plain.body
    );
    let long = format!("/_tollgate/blocks/login/{}", "a".repeat(129));
    let too_long = as_admin(admin, "DELETE", &long);
    assert_eq!(too_long.status, 400);
    assert!(
        json(&too_long)["error"]
            .as_str()
            .unwrap()
            .contains("over the bound of 128"),
        "{}",
        too_long.body
    );
    let bad_cursor = as_admin(admin, "GET", "/_tollgate/blocks/login?cursor=zz");
    assert_eq!(bad_cursor.status, 400);
    assert!(json(&bad_cursor)["error"].is_string());
    let kept = as_admin(admin, "GET", "/_tollgate/blocks/login/a%20b%252Fc");
    assert_eq!(kept.status, 200, "{}", kept.body);
}

/// Hundreds of blocks come a page at a time, each page's `next` given back as `?cursor=`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listing_walks_pages_with_the_cursor() {
    let dir = ConfigDir::new();
    let (server, admin) = start_with_admin(&dir.write("admin.toml", RULES));
    let client = server.client().await;
    // 250 users in one call, then again: each one over its limit, each one blocked.
    let users: Vec<String> = (0..250).map(|i| format!("user-{i}")).collect();
    let descriptors: Vec<[(&str, &str); 1]> =
        users.iter().map(|u| [("user", u.as_str())]).collect();
    let descriptors: Vec<&[(&str, &str)]> = descriptors.iter().map(|d| &d[..]).collect();
    assert_eq!(
        client.ask("admin", &descriptors).await.overall_code,
        code::OK
    );
    let over = client.ask("admin", &descriptors).await;
    assert_eq!(over.overall_code, code::OVER_LIMIT);

    let mut keys = HashSet::new();
    let mut path = "/_tollgate/blocks/login".to_owned();
    let mut pages = 0;
    loop {
        let page = as_admin(admin, "GET", &path);
        assert_eq!(page.status, 200, "{}", page.body);
        let body = json(&page);
        let blocks = body["blocks"].as_array().unwrap();
        assert!(blocks.len() <= 100);
        for block in blocks {
            assert!(keys.insert(block["key"].as_str().unwrap().to_owned()));
        }
        pages += 1;
        match body["next"].as_str() {
            Some(next) => path = format!("/_tollgate/blocks/login?cursor={next}"),
            None => break,
        }
    }
    assert!(pages >= 3, "{pages} pages");
    assert_eq!(keys.len(), 250);
}

/// A customer raised for an hour through the admin API: the server charges the key under the
/// override at once, the API reads and lists it, and removing it brings the rule's limit back;
/// every bad request is a clear error that writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_are_set_read_listed_and_removed_through_the_admin_api() {
    let dir = ConfigDir::new();
    let (server, admin) = start_with_admin(&dir.write("admin.toml", RULES));
    let client = server.client().await;
    let put =
        |path: &str, body: &str| send(admin, "PUT", path, Some(&format!("Bearer {TOKEN}")), body);
    let path = "/_tollgate/overrides/api/acme";

    let set = put(
        path,
        r#"{"limit": {"rate": 2, "period": "1m"}, "ttl_seconds": 3600}"#,
    );
    assert_eq!(set.status, 204, "{}", set.body);
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(ask(&client, "admin", ("customer", "acme")).await);
    }
    assert_eq!(
        codes,
        [code::OK, code::OK, code::OVER_LIMIT],
        "2 a minute for acme"
    );

    let read = as_admin(admin, "GET", path);
    assert_eq!(read.status, 200, "{}", read.body);
    let mut read = json(&read);
    let left = read["expires_in_ms"].take().as_u64().unwrap();
    assert!((3_580_000..=3_600_000).contains(&left), "{left}");
    assert_eq!(
        read,
        json!({"key": "acme", "quota": 2, "window_ms": 60_000, "expires_in_ms": null})
    );
    let listed = json(&as_admin(admin, "GET", "/_tollgate/overrides/api"));
    assert_eq!(listed["overrides"][0]["key"], "acme");
    assert_eq!(listed["next"], Value::Null);

    // Bad requests: refused, clearly, and nothing written.
    let bad = [
        (
            r#"{"limit": {"rate": 0, "period": "1m"}, "ttl_seconds": 60}"#,
            400,
            "limit.rate",
        ),
        (
            r#"{"limit": {"rate": 5, "period": "1m", "paths": ["/x"]}, "ttl_seconds": 60}"#,
            400,
            "limit.paths: not a field of a limit",
        ),
        (
            r#"{"limit": {"rate": 5, "period": "1m"}, "ttl_seconds": 0}"#,
            400,
            "TTL",
        ),
        (
            r#"{"limit": {"rate": 5, "period": "1m"}}"#,
            400,
            "ttl_seconds",
        ),
        ("not json", 400, ""),
    ];
    for (body, status, says) in bad {
        let answer = put("/_tollgate/overrides/api/beta", body);
        assert_eq!(answer.status, status, "{body}: {}", answer.body);
        assert!(answer.body.contains(says), "{body}: {}", answer.body);
    }
    for other in [
        "/_tollgate/overrides/nope/beta",
        "/_tollgate/overrides/login/beta",
    ] {
        let answer = put(
            other,
            r#"{"limit": {"rate": 5, "period": "1m"}, "ttl_seconds": 60}"#,
        );
        assert_eq!(answer.status, 404, "{other}: {}", answer.body);
        assert!(json(&answer)["error"].is_string());
    }
    let beta = as_admin(admin, "GET", "/_tollgate/overrides/api/beta");
    assert_eq!(beta.status, 404);

    let removed = as_admin(admin, "DELETE", path);
    assert_eq!(removed.status, 204, "{}", removed.body);
    assert_eq!(as_admin(admin, "GET", path).status, 404);
    // Back to the rule's 100 a minute at once, the key's count carried over: the bucket the
    // override emptied gains a unit every 0.6 s (under the override's 2 a minute, every 30 s).
    // So the next call passes, or, sooner than 0.6 s after the override's last charge, is told
    // to come back in a second, not in thirty.
    let next = client.ask("admin", &[&[("customer", "acme")]]).await;
    let retry = next
        .response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case("retry-after"))
        .map(|h| h.value.clone());
    match next.overall_code {
        code::OK => assert_eq!(retry, None),
        _ => assert_eq!(retry.as_deref(), Some("1"), "{next:?}"),
    }
}
