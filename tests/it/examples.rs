//! The examples' routers, served on a loopback port and driven by a real HTTP client.
//!
//! Each test builds its own app, so each has its own store. Assertions are on counts: the limits
//! refill slowly enough (at most a few units per second) that the time a test takes cannot change
//! them, and every await is bounded by a timeout.

#[allow(dead_code)]
#[path = "../../examples/api_key_tiers.rs"]
mod api_key_tiers;
#[allow(dead_code)]
#[path = "../../examples/customer_limits.rs"]
mod customer_limits;
#[allow(dead_code)]
#[path = "../../examples/llm_tokens.rs"]
mod llm_tokens;
#[allow(dead_code)]
#[path = "../../examples/login_throttle.rs"]
mod login_throttle;
#[allow(dead_code)]
#[path = "../../examples/per_route.rs"]
mod per_route;
#[allow(dead_code)]
#[path = "../../examples/quickstart/src/main.rs"]
mod quickstart;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::time::timeout;

const LIMIT: Duration = Duration::from_secs(10);

async fn bounded<F: Future>(what: &str, future: F) -> F::Output {
    timeout(LIMIT, future)
        .await
        .unwrap_or_else(|_| panic!("{what} took longer than {LIMIT:?}"))
}

/// An app served on `127.0.0.1:0` with connect info, and a client for it.
struct Server {
    addr: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header in {:?}", self.headers))
            .to_str()
            .unwrap()
    }

    fn json(&self) -> serde_json::Value {
        assert_eq!(self.header("content-type"), "application/problem+json");
        serde_json::from_str(&self.body).unwrap()
    }

    /// The `r` parameter of the `RateLimit` item of `rule`.
    fn remaining(&self, rule: &str) -> u64 {
        let item = format!("\"{rule}\";r=");
        let field = self.header("ratelimit");
        let at = field
            .find(&item)
            .unwrap_or_else(|| panic!("no {rule} in {field}"))
            + item.len();
        let digits: String = field[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap()
    }

    /// `Retry-After` in seconds.
    fn retry_after(&self) -> u64 {
        self.header("retry-after").parse().unwrap()
    }
}

impl Server {
    async fn start(app: Router) -> Server {
        let listener = bounded("bind", TcpListener::bind("127.0.0.1:0"))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let client = Client::builder(TokioExecutor::new()).build_http();
        Server { addr, client }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let response = bounded("request", self.client.request(request))
            .await
            .unwrap();
        let (parts, body) = response.into_parts();
        let body = bounded("body", body.collect()).await.unwrap().to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    }

    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.send(Method::GET, path, headers, "").await
    }
}

/// Asserts the default 429: `Retry-After` of at least `min` seconds and a problem+json body
/// naming `violated`.
fn assert_quota_exceeded(reply: &Reply, violated: &[&str], min: u64) {
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.body
    );
    assert!(reply.retry_after() >= min.max(1), "{:?}", reply.headers);
    let body = reply.json();
    assert_eq!(body["type"], tollgate::headers::QUOTA_EXCEEDED);
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], serde_json::json!(violated));
}

#[tokio::test]
async fn quickstart_limits_each_ip_and_the_expensive_route() {
    let server = Server::start(quickstart::app()).await;

    let first = server.get("/", &[]).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body, "hello\n");
    assert_eq!(first.header("ratelimit-policy"), "\"per-ip\";q=10;w=60");
    // One unit back every 6 s.
    assert_eq!(first.header("ratelimit"), "\"per-ip\";r=9;t=6");

    for left in (0..9).rev() {
        let reply = server.get("/", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.remaining("per-ip"), left);
    }
    let denied = server.get("/", &[]).await;
    assert_quota_exceeded(&denied, &["per-ip"], 1);
    assert_eq!(denied.remaining("per-ip"), 0);

    // Unknown paths are outside the route layer: a plain 404, no quota, no headers.
    let missing = server.get("/nope", &[]).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.headers.get("ratelimit").is_none());
}

#[tokio::test]
async fn quickstart_expensive_route_pays_both_rules_all_or_nothing() {
    let server = Server::start(quickstart::app()).await;
    for left in [1, 0] {
        let reply = server.get("/expensive", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            reply.header("ratelimit-policy"),
            "\"per-ip\";q=10;w=60, \"expensive\";q=2;w=60"
        );
        assert_eq!(reply.remaining("expensive"), left);
    }
    let denied = server.get("/expensive", &[]).await;
    assert_quota_exceeded(&denied, &["expensive"], 30);
    // The denied call charged nothing: `per-ip` paid for two calls only.
    let root = server.get("/", &[]).await;
    assert_eq!(root.status, StatusCode::OK);
    assert_eq!(root.header("ratelimit"), "\"per-ip\";r=7;t=6");
}

/// One printed `curl` line and the comment under it.
struct Step {
    path: String,
    /// How many times the line calls it: `for i in 1 2`, `$(seq 12)`, or once.
    times: usize,
    /// The statuses the comment begins with, one per call.
    statuses: Vec<u16>,
    comment: String,
}

/// The steps of `text`: command lines, each followed by `#` lines saying what it answers.
fn steps(text: &str, addr: SocketAddr) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(comment) = line.strip_prefix('#') {
            let step = steps.last_mut().expect("a comment follows a command");
            step.comment = format!("{} {}", step.comment, comment.trim())
                .trim()
                .to_owned();
            continue;
        }
        let url = format!("http://{addr}");
        let at = line
            .find(&url)
            .unwrap_or_else(|| panic!("no {url} in {line:?}"))
            + url.len();
        let path: String = line[at..]
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != ';')
            .collect();
        let times = if let Some(seq) = line.split("$(seq ").nth(1) {
            seq.split(')').next().unwrap().parse().unwrap()
        } else if let Some(list) = line.strip_prefix("for i in ") {
            list.split(';').next().unwrap().split_whitespace().count()
        } else {
            1
        };
        steps.push(Step {
            path,
            times,
            statuses: Vec::new(),
            comment: String::new(),
        });
    }
    for step in &mut steps {
        for word in step.comment.split_whitespace() {
            let number = word.trim_end_matches([':', ';', ',']);
            let Ok(status) = number.parse() else { break };
            step.statuses.push(status);
            if number.len() != word.len() {
                break;
            }
        }
    }
    steps
}

/// The quickstart's printed lines, run in order as a reader pastes them: each answers what the
/// comment under it says (issue 39: the third `/expensive` call was said to be the first 429
/// after a loop that had already spent the per-IP budget).
#[tokio::test]
async fn quickstart_printed_lines_are_true_when_run_in_order() {
    let server = Server::start(quickstart::app()).await;
    let text = quickstart::try_these(server.addr);
    let steps = steps(&text, server.addr);
    let calls: Vec<(&str, usize)> = steps.iter().map(|s| (s.path.as_str(), s.times)).collect();
    assert_eq!(
        calls,
        [("/", 1), ("/expensive", 2), ("/expensive", 1), ("/", 12)],
        "{text}"
    );
    let mut replies = Vec::new();
    for step in &steps {
        assert_eq!(step.statuses.len(), step.times, "{}", step.comment);
        let mut statuses = Vec::new();
        for _ in 0..step.times {
            let reply = server.get(&step.path, &[]).await;
            statuses.push(reply.status.as_u16());
            replies.push(reply);
        }
        assert_eq!(statuses, step.statuses, "{}", step.comment);
    }

    // What the comments say beyond the statuses.
    let first = &replies[0];
    let policy = first.header("ratelimit-policy");
    let remaining = first.header("ratelimit");
    assert!(
        steps[0].comment.contains(&format!(
            "RateLimit-Policy: {policy} and RateLimit: {remaining}"
        )),
        "{}",
        steps[0].comment
    );
    assert!(steps[2].comment.contains("naming \"expensive\""));
    assert_quota_exceeded(&replies[3], &["expensive"], 1);
    assert!(steps[3].comment.contains("3 spent above"));
}

/// The quickstart is a package of its own, so that the README's first command compiles the
/// library and what the app uses: none of the test suite's dependencies, which Cargo builds for
/// every example of the library's own package (issue 39: 173 crates, tonic and ring among them).
#[test]
fn the_quickstart_builds_none_of_the_test_suites_dependencies() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = std::process::Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--locked", "-p", "quickstart", "-e", "normal,build"])
        .args(["--prefix", "none", "--format", "{p}"])
        .output()
        .expect("cargo runs");
    let tree = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let packages: std::collections::BTreeSet<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(
        packages.contains("tollgate") && packages.contains("axum"),
        "{tree}"
    );
    for heavy in [
        "tonic", "prost", "proptest", "rcgen", "ring", "rustls", "redis",
    ] {
        assert!(
            !packages.contains(heavy),
            "the quickstart builds {heavy}:\n{tree}"
        );
    }
    // 76 crates compiled when the README's figure was measured (`cargo build -p quickstart` in
    // an empty target directory); the library's examples build 173.
    assert!(packages.len() <= 90, "{} packages:\n{tree}", packages.len());
}

#[tokio::test]
async fn per_route_scopes_rules_by_path_and_method() {
    let server = Server::start(per_route::app()).await;

    let api = server.get("/api/v1/things", &[]).await;
    assert_eq!(api.status, StatusCode::OK);
    assert_eq!(
        api.header("ratelimit-policy"),
        "\"api\";q=100;w=60, \"global\";q=1000;w=1"
    );
    assert!(
        api.body.starts_with("api: 99 left\nglobal: "),
        "{}",
        api.body
    );

    // GET /login is in no rule's scope but the global one.
    let form = server.get("/login", &[]).await;
    assert_eq!(form.status, StatusCode::OK);
    assert!(form.body.starts_with("global: "), "{}", form.body);
    assert_eq!(form.body.lines().count(), 1);

    let alice = [("x-forwarded-for", "203.0.113.1")];
    for left in (0..5).rev() {
        let reply = server.send(Method::POST, "/login", &alice, "").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.remaining("login"), left);
    }
    let denied = server.send(Method::POST, "/login", &alice, "").await;
    assert_quota_exceeded(&denied, &["login"], 1);
    // Another client behind the same (trusted, loopback) proxy has its own budget.
    let bob = [("x-forwarded-for", "203.0.113.2")];
    let reply = server.send(Method::POST, "/login", &bob, "").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.remaining("login"), 4);
}

#[tokio::test]
async fn api_key_tiers_count_each_plan_by_its_own_rule() {
    let server = Server::start(api_key_tiers::app()).await;

    let anonymous = server.get("/", &[]).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert_eq!(anonymous.json()["status"], 401);

    let free = [("x-api-key", "free_alice")];
    for left in (0..5).rev() {
        let reply = server.get("/", &free).await;
        assert_eq!(reply.status, StatusCode::OK);
        let noun = if left == 1 { "request" } else { "requests" };
        assert_eq!(
            reply.body,
            format!("hello, free customer: {left} {noun} left\n")
        );
        assert_eq!(
            reply.header("ratelimit-policy"),
            "\"per-key\";q=10;w=1, \"free\";q=5;w=60"
        );
    }
    assert_quota_exceeded(&server.get("/", &free).await, &["free"], 1);

    let pro = server.get("/", &[("x-api-key", "pro_bob")]).await;
    assert_eq!(pro.status, StatusCode::OK);
    assert_eq!(pro.body, "hello, pro customer: 99 requests left\n");
    assert_eq!(
        pro.header("ratelimit-policy"),
        "\"per-key\";q=10;w=1, \"pro\";q=100;w=60"
    );
}

#[tokio::test]
async fn customer_limits_follow_each_customers_plan() {
    let server = Server::start(customer_limits::app()).await;

    let anonymous = server.get("/", &[]).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);

    let acme = server.get("/", &[("x-api-key", "acme")]).await;
    assert_eq!(acme.status, StatusCode::OK);
    assert_eq!(
        acme.body,
        "hello; your plan: 100 a minute; 99 requests left\n"
    );
    assert_eq!(
        acme.header("ratelimit-policy"),
        "\"per-customer\";q=100;w=60"
    );

    let globex = server.get("/", &[("x-api-key", "globex")]).await;
    assert_eq!(
        globex.body,
        "hello; your plan: 20 a minute; 19 requests left\n"
    );
    assert_eq!(
        globex.header("ratelimit-policy"),
        "\"per-customer\";q=20;w=60"
    );

    // A key the database does not know: the rule's own 5 a minute.
    let unknown = [("x-api-key", "someone")];
    for left in (0..5).rev() {
        let reply = server.get("/", &unknown).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            reply.body,
            format!("hello; the default plan; {left} requests left\n")
        );
        assert_eq!(
            reply.header("ratelimit-policy"),
            "\"per-customer\";q=5;w=60"
        );
    }
    assert_quota_exceeded(&server.get("/", &unknown).await, &["per-customer"], 1);

    // acme's quota is its own: the unknown key's refusals did not touch it.
    let again = server.get("/", &[("x-api-key", "acme")]).await;
    assert_eq!(again.remaining("per-customer"), 98);
}

async fn login(server: &Server, user: &str, password: &str) -> Reply {
    server
        .send(Method::POST, &format!("/login/{user}"), &[], password)
        .await
}

#[tokio::test]
async fn login_throttle_blocks_an_account_after_five_failures() {
    let server = Server::start(login_throttle::app()).await;
    for left in (0..5).rev() {
        let reply = login(&server, "alice", "guess").await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert_eq!(reply.remaining("account"), left);
    }
    // The sixth attempt is an offence: blocked for 15 minutes, even with the right password.
    let locked = login(&server, "alice", "hunter2").await;
    assert_quota_exceeded(&locked, &["account"], 900);
    assert_eq!(locked.retry_after(), 900);
    // Other accounts are not affected.
    assert_eq!(
        login(&server, "bob", "hunter2").await.status,
        StatusCode::OK
    );
}

/// The account is the value the handler greets: percent-encoded spellings of `alice` share her
/// five guesses, and her block holds under every spelling.
#[tokio::test]
async fn login_throttle_counts_every_spelling_of_an_account_as_one() {
    let server = Server::start(login_throttle::app()).await;
    let spellings = ["alice", "%61lice", "a%6cice", "%61%6cice", "alic%65"];
    for (left, spelling) in (0..5).rev().zip(spellings) {
        let reply = login(&server, spelling, "guess").await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{spelling}");
        assert_eq!(reply.remaining("account"), left, "{spelling}");
    }
    for spelling in spellings {
        let locked = login(&server, spelling, "hunter2").await;
        assert_quota_exceeded(&locked, &["account"], 900);
    }
    // A name that is not UTF-8 once decoded is refused, as the handler's `Path` refuses it.
    assert_eq!(
        login(&server, "%FF", "hunter2").await.status,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn login_throttle_never_counts_successful_logins() {
    let server = Server::start(login_throttle::app()).await;
    for _ in 0..30 {
        let reply = login(&server, "alice", "hunter2").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, "welcome, alice\n");
        // Charged on arrival (the fields say so), given back with the answer.
        assert_eq!(reply.remaining("account"), 4);
        assert_eq!(reply.remaining("ip"), 19);
    }
}

#[tokio::test]
async fn login_throttle_limits_each_ip_whatever_the_account() {
    let server = Server::start(login_throttle::app()).await;
    for i in 0..20 {
        let reply = login(&server, &format!("user{i}"), "guess").await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert_eq!(reply.remaining("ip"), 19 - i);
    }
    let denied = login(&server, "someone", "hunter2").await;
    assert_quota_exceeded(&denied, &["ip"], 900);
}

async fn complete(server: &Server, headers: &[(&str, &str)], prompt: &str) -> Reply {
    server
        .send(Method::POST, "/v1/complete", headers, prompt)
        .await
}

#[tokio::test]
async fn llm_tokens_charges_the_estimate_and_settles_to_the_real_use() {
    let server = Server::start(llm_tokens::app()).await;
    let k1 = |tokens| [("x-api-key", "k1"), ("x-llm-tokens", tokens)];

    // 10 words: 100 tokens used of the 6,000 estimated.
    let first = complete(
        &server,
        &k1("6000"),
        "one two three four five six seven eight nine ten",
    )
    .await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body, "used 100 tokens\n");
    assert_eq!(first.header("x-tokens-used"), "100");
    assert_eq!(
        first.header("ratelimit-policy"),
        "\"llm-tokens\";q=10000;w=60"
    );
    // The fields are written when the request arrives: the settlement is not in them yet.
    assert_eq!(first.remaining("llm-tokens"), 4000);

    // 9,000 fits only thanks to the settlement (4,000 plus what refilled since would not do).
    // The prompt uses 12,000 tokens, capped at the capacity: 1,000 more than estimated, a debt.
    let long_prompt = "word ".repeat(1200);
    let second = complete(&server, &k1("9000"), &long_prompt).await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.body, "used 12000 tokens\n");
    // 9,900 - 9,000, plus at most ~170 tokens refilled per second the test has taken.
    let left = second.remaining("llm-tokens");
    assert!((900..1900).contains(&left), "r={left}");

    // The debt of about 100 tokens plus this request's 500: some 3.6 s until it fits.
    let denied = complete(&server, &k1("500"), "hello").await;
    assert_quota_exceeded(&denied, &["llm-tokens"], 2);

    // Another key has its own budget, up to the whole of it.
    let k2 = [("x-api-key", "k2"), ("x-llm-tokens", "10000")];
    let reply = complete(&server, &k2, "hi").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.remaining("llm-tokens"), 0);
}

#[tokio::test]
async fn llm_tokens_refuses_requests_without_a_usable_budget() {
    let server = Server::start(llm_tokens::app()).await;
    let cases: [(&[(&str, &str)], StatusCode); 4] = [
        (&[("x-api-key", "k1")], StatusCode::BAD_REQUEST),
        (
            &[("x-api-key", "k1"), ("x-llm-tokens", "lots")],
            StatusCode::BAD_REQUEST,
        ),
        (
            &[("x-api-key", "k1"), ("x-llm-tokens", "10001")],
            StatusCode::BAD_REQUEST,
        ),
        (&[("x-llm-tokens", "10")], StatusCode::UNAUTHORIZED),
    ];
    for (headers, status) in cases {
        let reply = complete(&server, headers, "hello").await;
        assert_eq!(reply.status, status, "{headers:?}: {}", reply.body);
        assert_eq!(reply.json()["status"], status.as_u16());
    }
    // None of them spent anything.
    let reply = complete(
        &server,
        &[("x-api-key", "k1"), ("x-llm-tokens", "10000")],
        "hi",
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.remaining("llm-tokens"), 0);
}
