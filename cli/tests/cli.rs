//! The `tollgate` binary, run as an operator runs it: arguments in, exit status, text and JSON
//! out. Logs and configurations are written to a temporary directory by each test.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

fn tollgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn data(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
        .display()
        .to_string()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

/// Runs the binary, which must exit with status 1 and say `message` on standard error.
fn fails_saying(args: &[&str], message: &str) {
    let output = tollgate(args);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains(message), "{}", stderr(&output));
}

/// A file in a fresh temporary directory (kept alive by the returned handle).
fn file(name: &str, content: impl AsRef<[u8]>) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, content).unwrap();
    (dir, path)
}

/// A `combined` line from `ip` at second `s` of 22:00 on 14 Nov 2023.
fn line(ip: &str, s: u32, request: &str) -> String {
    format!(
        "{ip} - - [14/Nov/2023:22:{:02}:{:02} +0000] \"{request} HTTP/1.1\" 200 12 \"-\" \"curl/8.0\"\n",
        s / 60,
        s % 60
    )
}

/// `tollgate replay --config A --log LOG --compare B`, its text output.
fn compare_text(a: &str, log: &Path, b: &str) -> String {
    stdout(&tollgate(&[
        "replay",
        "--config",
        a,
        "--log",
        log.to_str().unwrap(),
        "--compare",
        b,
    ]))
}

fn replay_json(config: &str, log: &Path, extra: &[&str]) -> Value {
    let mut args = vec![
        "replay",
        "--config",
        config,
        "--log",
        log.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let output = tollgate(&args);
    assert!(output.status.success(), "{}", stderr(&output));
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

fn rule<'a>(json: &'a Value, name: &str) -> &'a Value {
    json["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no rule {name} in {json}"))
}

const PACED: &str =
    "[[rules]]\nname = \"per-ip\"\nrate = 2\nperiod = \"1s\"\ncapacity = 1\nkey = \"peer_ip\"\n";

#[test]
fn check_prints_the_rules_and_exits_zero() {
    let output = tollgate(&["check", "--config", &data("api.toml")]);
    assert!(output.status.success());
    let text = stdout(&output);
    assert!(text.contains("OK, 2 rule(s)"), "{text}");
    assert!(
        text.contains("\"per-ip\": token bucket, 10 per 1s, bursts up to 20, per peer IP address"),
        "{text}"
    );
    assert!(text.contains("for POST requests, on /login"), "{text}");
}

/// Every rule in words an operator reads: costs, keys, the plan a tier's rule is for and how it
/// is chosen, and what happens without the key only when a request can be without it.
#[test]
fn check_describes_every_rule_in_plain_words() {
    let config = r#"
[[rules]]
name = "everyone"
rate = 100
period = "1s"
cost = 0

[[rules]]
name = "tokens"
rate = 1000
period = "1m"
key = "bearer"
cost = { header = "x-cost", default = 5 }
on_missing_key = "skip"

[[rules]]
name = "exports"
rate = 10
period = "1m"
key = { first_of = [{ header = "x-user" }, { cookie = "sid" }] }
on_missing_key = { reject = 401 }
cost = { header = "x-cost" }

[[rules]]
name = "api"
period = "1m"
key = { header = "x-api-key" }
on_missing_key = { fallback = "peer_ip" }
cost = 3
[rules.tiers]
keys = { "k1" = "pro", "k2" = "pro" }
default = "free"
plans.free = { rate = 60 }
plans.pro = { rate = 1000 }

[[rules]]
name = "plans"
period = "1m"
key = "peer_ip"
[rules.tiers]
from = { header = "x-plan" }
default = "free"
plans.free = { rate = 10 }
plans.pro = { rate = 100 }
plans.enterprise = { unlimited = true }

[[rules]]
name = "login"
rate = 5
period = "1m"
key = "peer_ip"
count_if = { status = [401, 403] }
block = { escalate = ["1m", "10m", "1h"], forget_after = "24h" }

[[rules]]
name = "smooth"
rate = 10
period = "1s"
queue = { burst = 20, max_delay = "10s" }

[[rules]]
name = "tokens-used"
rate = 1000
period = "1m"
key = "peer_ip"
settle = { header = "x-tokens-used" }
block = "10m"

[[allow]]
key = "peer_ip"
networks = ["10.20.0.0/16"]

[[deny]]
key = { header = "x-api-key" }
values = ["leaked-1", "leaked-2"]
"#;
    let (_dir, path) = file("rules.toml", config);
    let output = tollgate(&["check", "--config", path.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(
        lines,
        [
            "- \"everyone\": token bucket, 100 per 1s, bursts up to 100, one count shared by every request (a global key), requests cost nothing (they are checked, never charged)",
            "- \"tokens\": token bucket, 1000 per 1m, bursts up to 1000, per bearer token (its SHA-256, never the token), each request costs the units its x-cost header says (5 when it has none); requests without a bearer token pass",
            "- \"exports\": token bucket, 10 per 1m, bursts up to 10, per x-user header value, else sid cookie value, each request costs the units its x-cost header says (a request without it is refused with 400 Bad Request); requests with none of these are refused (401 Unauthorized)",
            "- \"api:free\": token bucket, 60 per 1m, bursts up to 60, per x-api-key header value, each request costs 3 units, only for plan \"free\", the default (requests whose key is not listed for another plan in `tiers.keys`); requests without the x-api-key header count per peer IP address",
            "- \"api:pro\": token bucket, 1000 per 1m, bursts up to 1000, per x-api-key header value, each request costs 3 units, only for plan \"pro\" (requests whose key is one of the 2 listed for it in `tiers.keys`); requests without the x-api-key header count per peer IP address",
            "- \"plans:free\": token bucket, 10 per 1m, bursts up to 10, per peer IP address, only for plan \"free\", the default (requests whose x-plan header is \"free\", names no other plan, or is absent)",
            "- \"plans:pro\": token bucket, 100 per 1m, bursts up to 100, per peer IP address, only for plan \"pro\" (requests whose x-plan header is \"pro\")",
            "- \"login\": token bucket, 5 per 1m, bursts up to 5, per peer IP address; only responses with status 401 or 403 keep their charge (the others get it back); a key it denies is blocked for 1m, then 10m, then 1h (the last repeats; offences forgotten after 1d without one)",
            "- \"smooth\": token bucket, 10 per 1s, bursts up to 10, one count shared by every request (a global key); over the limit, requests wait their turn (queue) instead of a 429 (at most 20 units waiting, none longer than 10s)",
            "- \"tokens-used\": token bucket, 1000 per 1m, bursts up to 1000, per peer IP address; the real cost is read from the response's x-tokens-used header and the difference charged or given back; a key it denies is blocked for 10m",
            "- allow list: requests whose peer IP address is inside 10.20.0.0/16 are never limited",
            "- deny list: requests whose x-api-key header value is one of 2 listed value(s) are refused (403 Forbidden)",
            "- \"plans\": unlimited for plan \"enterprise\" (requests whose x-plan header is \"enterprise\"): never limited by this rule",
        ]
    );
    // Listed values (often secrets) are counted, never printed.
    assert!(!text.contains("leaked"), "{text}");
    for debug in ["Cost::", "Some(", "None", "such as a tier"] {
        assert!(!text.contains(debug), "{debug}: {text}");
    }
}

/// tollgate-server's configurations, read as the server reads them: the reference service's YAML
/// (its limits become aligned fixed windows) and the domains' descriptors with their rules.
#[test]
fn check_reads_the_reference_services_yaml() {
    let config = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n  - key: internal\n    rate_limit: { unlimited: true }\n";
    let (_dir, path) = file("edge.yaml", config);
    let output = tollgate(&["check", "--config", path.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(
        lines,
        [
            "- \"edge.remote_address\": fixed window, 3 per 1m, windows aligned to the clock, per descriptor value",
            "domain \"edge\":",
            "  - internal: unlimited",
            "  - remote_address: rule \"edge.remote_address\"",
        ]
    );
    let (_dir, bad) = file(
        "bad.yaml",
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limt: {}\n",
    );
    fails_saying(
        &["check", "--config", bad.to_str().unwrap()],
        "bad.yaml:4:5: descriptors[0]: unknown field `rate_limt`, expected one of",
    );
}

/// An empty or missing configuration is said to be one, never listed as healthy; the rule a
/// server configuration with nothing to count holds inside is never shown.
#[test]
fn check_says_what_is_there_and_never_shows_internal_rules() {
    let empty = tempfile::tempdir().unwrap();
    fails_saying(
        &["check", "--config", empty.path().to_str().unwrap()],
        "holds no configuration file (*.yaml, *.yml): no limit is configured",
    );
    let missing = empty.path().join("ratelimit/config/");
    for path in [missing.clone(), missing.join("limits.toml")] {
        let output = tollgate(&["check", "--config", path.to_str().unwrap()]);
        assert_eq!(output.status.code(), Some(1));
        assert!(
            stderr(&output).contains("No such file or directory"),
            "{}",
            stderr(&output)
        );
        assert!(!stderr(&output).contains("format"), "{}", stderr(&output));
    }
    let (_dir, unlimited) = file(
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: internal\n    rate_limit: { unlimited: true }\n",
    );
    let output = tollgate(&["check", "--config", unlimited.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains(": OK, 0 rule(s), 1 domain(s)"), "{text}");
    assert!(!text.contains("tollgate-server:"), "{text}");
}

#[test]
fn check_names_the_file_place_rule_and_field_and_exits_one() {
    fails_saying(
        &["check", "--config", &data("bad.toml")],
        "bad.toml:3:8: rules[0].rate (rule \"per-ip\"): must be greater than 0",
    );
    let (_dir, path) = file("limits.toml", "[[rules]]\nname = \"x\"\nrate = \"ten\"\n");
    fails_saying(
        &["check", "--config", path.to_str().unwrap()],
        "limits.toml:3:8: rules[0].rate (rule \"x\"): expected a whole number",
    );
}

#[test]
fn replay_spreads_a_shared_second_and_counts_per_rule() {
    // Two per second, one at a time: lines logged in the same second run at 0, 1/3 and 2/3 s,
    // so the second is denied (a third of a unit back) and the third allowed (a unit back).
    let log: String = ["/a", "/b", "/c"]
        .iter()
        .map(|p| line("192.0.2.1", 0, &format!("GET {p}")))
        .chain([line("192.0.2.2", 0, "GET /")])
        .collect();
    let (_dir, log) = file("access.log", log);
    let (_c, config) = file("paced.toml", PACED);
    let json = replay_json(config.to_str().unwrap(), &log, &[]);
    let rule = rule(&json, "per-ip");
    assert_eq!(json["lines"], 4);
    assert_eq!(
        (
            &rule["requests"],
            &rule["allowed"],
            &rule["denied"],
            &rule["delayed"]
        ),
        (&4.into(), &3.into(), &1.into(), &0.into())
    );
    assert_eq!(
        (&rule["keys"], &rule["keys_limited"]),
        (&2.into(), &1.into())
    );
    assert_eq!(rule["top_keys"][0]["key"], "192.0.2.1");
    assert_eq!(rule["top_keys"][0]["denied"], 1);
}

#[test]
fn json_has_exactly_the_documented_fields() {
    let log: String = (0..30)
        .map(|i| line("198.51.100.7", i / 10, "GET /"))
        .collect();
    let (_dir, log) = file("access.log", log);
    let json = replay_json(&data("api.toml"), &log, &[]);
    let mut top: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    top.sort_unstable();
    assert_eq!(
        top,
        ["allow_listed", "deny_listed", "lines", "rules", "skipped"]
    );
    let mut fields: Vec<&str> = json["rules"][0]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "allowed",
            "delayed",
            "denied",
            "keys",
            "keys_limited",
            "name",
            "refused",
            "requests",
            "top_keys"
        ]
    );
    // 30 lines in 3 seconds from one address: 10 per second, within the rule's 10 per second.
    let per_ip = rule(&json, "per-ip");
    assert_eq!(per_ip["requests"], 30);
    assert_eq!(per_ip["denied"], 0, "{per_ip}");
    let top_key = per_ip["top_keys"].as_array().unwrap();
    assert!(top_key.is_empty());
}

#[test]
fn bad_lines_are_counted_by_reason_never_a_crash() {
    let mut log = Vec::new();
    log.extend_from_slice(line("192.0.2.1", 5, "GET /").as_bytes());
    // Truncated (cut inside the request line), binary garbage, a timestamp going backwards,
    // a bad timestamp, a line far too long, and a last line without its newline.
    log.extend_from_slice(b"192.0.2.1 - - [14/Nov/2023:22:00:06 +0000] \"GET /trunc\n");
    log.extend_from_slice(b"\x00\x9f\x92\x96\xff binary \x01\x02\n");
    log.extend_from_slice(line("192.0.2.1", 1, "GET /earlier").as_bytes());
    log.extend_from_slice(b"192.0.2.1 - - [99/Xyz/2023:22:00:06 +0000] \"GET / HTTP/1.1\" 200 1\n");
    log.extend(std::iter::repeat_n(b'x', 200_000));
    log.push(b'\n');
    log.extend_from_slice(line("192.0.2.1", 7, "GET /last").trim_end().as_bytes());
    let (_dir, log) = file("access.log", log);
    let json = replay_json(&data("api.toml"), &log, &[]);
    assert_eq!(json["lines"], 7);
    let skipped = &json["skipped"];
    assert_eq!(skipped["truncated"], 1, "{skipped}");
    assert_eq!(skipped["not_text"], 1, "{skipped}");
    assert_eq!(skipped["time_went_backwards"], 1, "{skipped}");
    assert_eq!(skipped["bad_timestamp"], 1, "{skipped}");
    assert_eq!(skipped["too_long"], 1, "{skipped}");
    assert_eq!(rule(&json, "per-ip")["requests"], 2);
}

#[test]
fn an_empty_log_says_so() {
    let (_dir, log) = file("empty.log", "");
    let output = tollgate(&[
        "replay",
        "--config",
        &data("api.toml"),
        "--log",
        log.to_str().unwrap(),
    ]);
    assert!(output.status.success());
    assert!(
        stderr(&output).contains("has no lines"),
        "{}",
        stderr(&output)
    );
    assert!(
        stdout(&output).starts_with("0 lines, 0 skipped"),
        "{}",
        stdout(&output)
    );
}

#[test]
fn a_config_the_layer_rejects_stops_the_replay_with_its_error() {
    let (_dir, log) = file("access.log", line("192.0.2.1", 0, "GET /"));
    let output = tollgate(&[
        "replay",
        "--config",
        &data("bad.toml"),
        "--log",
        log.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("rules[0].rate (rule \"per-ip\"): must be greater than 0"));
    fails_saying(
        &[
            "replay",
            "--config",
            &data("api.toml"),
            "--log",
            "/nonexistent/access.log",
        ],
        "access.log",
    );
}

#[test]
fn json_lines_with_a_field_map() {
    let config = "[[rules]]\nname = \"per-key\"\nrate = 1\nperiod = \"1m\"\nkey = { header = \"x-api-key\" }\non_missing_key = \"skip\"\n";
    let (_c, config) = file("keys.toml", config);
    let log = [
        r#"{"ts": "2023-11-14T22:13:20.100Z", "request": "GET /v1 HTTP/1.1", "client": "192.0.2.1", "api_key": "alice"}"#,
        r#"{"ts": "2023-11-14T22:13:20.200Z", "request": "GET /v1 HTTP/1.1", "client": "192.0.2.1", "api_key": "alice"}"#,
        r#"{"ts": "2023-11-14T22:13:20.300Z", "request": "GET /v1 HTTP/1.1", "client": "192.0.2.2", "api_key": "bob"}"#,
        r#"{"ts": "2023-11-14T22:13:20.400Z", "request": "GET /v1 HTTP/1.1", "client": "192.0.2.2"}"#,
        r#"{"ts": "2023-11-14T22:13:20.500Z", "request": "GET /v1 HT"#,
    ]
    .join("\n");
    let (_dir, log) = file("access.jsonl", log);
    let json = replay_json(
        config.to_str().unwrap(),
        &log,
        &[
            "--format",
            "json",
            "--field",
            "time=ts",
            "--field",
            "peer=client",
            "--field",
            "header:x-api-key=api_key",
        ],
    );
    let rule = rule(&json, "per-key");
    assert_eq!(
        (&rule["requests"], &rule["allowed"], &rule["denied"]),
        (&3.into(), &2.into(), &1.into())
    );
    assert_eq!(rule["top_keys"][0]["key"], "alice");
    assert_eq!(json["skipped"]["truncated"], 1);
}

#[test]
fn csv_with_named_columns() {
    let log = "when,verb,url,ip\n1700000000,GET,/a,192.0.2.1\n1700000000,GET,\"/b\",192.0.2.1\n1700000000,GET,/c,192.0.2.1\nbroken\n";
    let (_dir, log) = file("access.csv", log);
    let (_c, config) = file("paced.toml", PACED);
    let json = replay_json(
        config.to_str().unwrap(),
        &log,
        &[
            "--format",
            "csv",
            "--field",
            "time=when",
            "--field",
            "method=verb",
            "--field",
            "path=url",
            "--field",
            "peer=ip",
        ],
    );
    // The same second spread as in the combined test: allowed, denied, allowed.
    let per_ip = rule(&json, "per-ip");
    assert_eq!(
        (&per_ip["allowed"], &per_ip["denied"]),
        (&2.into(), &1.into())
    );
    assert_eq!(json["skipped"]["truncated"], 1);
}

/// The comparison of one rule under both configurations, from `--compare --json`.
fn compared<'a>(json: &'a Value, name: &str) -> &'a Value {
    json["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no rule {name} in {json}"))
}

#[test]
fn compare_shows_keys_limited_by_one_configuration_only() {
    // 12 requests in one second from one address (the stricter configuration's burst of 5 and
    // refill of 5 per second run out; the other's burst of 20 does not), 2 from another
    // (limited by neither).
    let log: String = (0..12)
        .map(|_| line("203.0.113.9", 0, "GET /"))
        .chain((0..2).map(|_| line("192.0.2.2", 0, "GET /")))
        .collect();
    let (_dir, log) = file("access.log", log);
    let json = replay_json(
        &data("api.toml"),
        &log,
        &["--compare", &data("strict.toml")],
    );
    let per_ip = compared(&json, "per-ip");
    let denied = rule(&json["b"], "per-ip")["denied"].as_u64().unwrap();
    assert!(denied > 0);
    assert_eq!(
        per_ip["limited_only_by_b"],
        serde_json::json!({"count": 1, "denied": denied, "keys": [{"key": "203.0.113.9", "denied": denied}]})
    );
    assert_eq!(per_ip["limited_only_by_a"]["count"], 0);
    assert_eq!(rule(&json["a"], "per-ip")["denied"], 0);
    let text = compare_text(&data("api.toml"), &log, &data("strict.toml"));
    assert!(
        text.contains(&format!(
            "  keys limited only by api.toml: 0\n  keys limited only by strict.toml: 1 ({denied} requests denied)\n    {denied:>10}  203.0.113.9\n"
        )),
        "{text}"
    );
}

/// Keys are compared rule by rule: an address another rule (`login`) limits under both
/// configurations is still shown as limited by the stricter `per-ip` only. Taken over all
/// rules at once, it was limited by both, and both sides said 0.
#[test]
fn compare_is_rule_by_rule_when_another_rule_limits_the_same_keys() {
    // Second 0: 7 logins from one address (`login`, 5 a minute on both sides, denies 2; the
    // per-IP buckets let all 7 through); second 1: 15 other requests from it, which the
    // stricter per-IP bucket (5, refilled 5 a second) cuts and the other (20) does not. Another
    // address sends 2, limited by nothing.
    let log: String = (0..7)
        .map(|_| line("203.0.113.9", 0, "POST /login"))
        .chain((0..2).map(|_| line("192.0.2.2", 0, "GET /")))
        .chain((0..15).map(|_| line("203.0.113.9", 1, "GET /")))
        .collect();
    let (_dir, log) = file("access.log", log);
    let report_dir = tempfile::tempdir().unwrap();
    let report = report_dir.path().join("report");
    let json = replay_json(
        &data("api.toml"),
        &log,
        &[
            "--compare",
            &data("strict.toml"),
            "--report",
            report.to_str().unwrap(),
        ],
    );
    // Both sides limit the address under `login`...
    for side in ["a", "b"] {
        assert_eq!(rule(&json[side], "login")["denied"], 2, "{side}");
    }
    let login = compared(&json, "login");
    assert_eq!(login["limited_only_by_a"]["count"], 0);
    assert_eq!(login["limited_only_by_b"]["count"], 0);
    // ...and only the stricter one under `per-ip`.
    assert_eq!(rule(&json["a"], "per-ip")["denied"], 0);
    assert_eq!(rule(&json["b"], "per-ip")["denied"], 6);
    let per_ip = compared(&json, "per-ip");
    assert_eq!(
        per_ip["limited_only_by_b"],
        serde_json::json!({"count": 1, "denied": 6, "keys": [{"key": "203.0.113.9", "denied": 6}]})
    );
    assert_eq!(
        per_ip["limited_only_by_a"],
        serde_json::json!({"count": 0, "denied": 0, "keys": []})
    );
    let mut top: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    top.sort_unstable();
    assert_eq!(top, ["a", "b", "rules"]);
    // The report says the same.
    let page = std::fs::read_to_string(report.join("index.html")).unwrap();
    let section = page
        .split("<section class=\"only\" data-rule=\"per-ip\">")
        .nth(1)
        .unwrap()
        .split("</section>")
        .next()
        .unwrap();
    assert!(
        section.contains("Keys limited only by strict.toml: <span data-field=\"limited_only_by_b\">1</span>, <span data-field=\"limited_only_by_b_denied\">6</span> requests denied.")
            && section.contains("<tr class=\"only-key\"><td>203.0.113.9</td><td data-field=\"denied\">6</td></tr>"),
        "{section}"
    );

    let text = compare_text(&data("api.toml"), &log, &data("strict.toml"));
    let per_ip_text = text
        .split("rule \"per-ip\"\n")
        .nth(1)
        .unwrap()
        .split("rule \"login\"")
        .next()
        .unwrap();
    assert!(
        per_ip_text.ends_with(
            "  keys limited only by api.toml: 0\n  keys limited only by strict.toml: 1 (6 requests denied)\n             6  203.0.113.9\n"
        ),
        "{text}"
    );
    assert!(
        text.ends_with(
            "  keys limited only by api.toml: 0\n  keys limited only by strict.toml: 0\n"
        ),
        "{text}"
    );
}

/// A rule in one configuration only: every key it limits is limited by that side only.
#[test]
fn compare_shows_a_rule_only_one_configuration_has() {
    let (_a, a) = file("a.toml", PACED);
    let (_b, b) = file(
        "b.toml",
        format!(
            "{PACED}\n[[rules]]\nname = \"tight\"\nrate = 1\nperiod = \"1m\"\nkey = \"peer_ip\"\n"
        ),
    );
    let log: String = (0..3).map(|s| line("192.0.2.1", s, "GET /")).collect();
    let (_dir, log) = file("access.log", log);
    let json = replay_json(
        a.to_str().unwrap(),
        &log,
        &["--compare", b.to_str().unwrap()],
    );
    let tight = compared(&json, "tight");
    assert_eq!(tight["limited_only_by_a"], Value::Null);
    assert_eq!(
        tight["limited_only_by_b"],
        serde_json::json!({"count": 1, "denied": 2, "keys": [{"key": "192.0.2.1", "denied": 2}]})
    );
    let text = compare_text(a.to_str().unwrap(), &log, b.to_str().unwrap());
    assert!(text.contains("rule \"tight\" (only in b.toml)\n"), "{text}");
    assert!(
        text.ends_with(
            "  keys limited only by b.toml: 1 (2 requests denied)\n             2  192.0.2.1\n"
        ),
        "{text}"
    );
}

#[test]
fn the_window_edge_scenario_shows_the_double_burst() {
    let output = tollgate(&["simulate", "--scenario", "window-edge", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    // Bursts of 10 at 9.5 s and 10.5 s, a limit of 10 per 10 s: the fixed window lets both
    // through (they fall in two windows); the sliding log admits 10 in any 10 s.
    assert_eq!(rule(&json, "fixed-window")["allowed"], 20);
    assert_eq!(rule(&json, "sliding-log")["allowed"], 10);
    let sliding = rule(&json, "sliding-window")["allowed"].as_u64().unwrap();
    assert!(
        sliding < 20,
        "the sliding window weighs the previous window: {sliding}"
    );
}

#[test]
fn the_queue_scenario_delays_instead_of_denying() {
    let output = tollgate(&["simulate", "--scenario", "queue-pacing", "--json"]);
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    let (plain, queued) = (rule(&json, "no-queue"), rule(&json, "queued"));
    assert_eq!(plain["delayed"], 0);
    assert!(plain["denied"].as_u64().unwrap() > 0);
    assert!(queued["delayed"].as_u64().unwrap() > 0);
    assert_eq!(queued["denied"], 0);
}

#[test]
fn simulate_rules_from_the_command_line() {
    let output = tollgate(&[
        "simulate",
        "--rule",
        "name=tb,rate=5,period=1s,capacity=5",
        "--traffic",
        "steady:10",
        "--clients",
        "3",
        "--duration",
        "10s",
        "--json",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    let tb = rule(&json, "tb");
    assert_eq!(tb["requests"], 300);
    assert_eq!(tb["keys"], 3);
    // Half of a steady 10/s passes a 5/s bucket, plus (at most) its burst.
    let allowed = tb["allowed"].as_u64().unwrap();
    assert!((150..=165).contains(&allowed), "{allowed}");
    assert_eq!(json["requests"], 300);
    assert!(
        json.get("lines").is_none() && json.get("skipped").is_none(),
        "{json}"
    );
    // The text counts requests too: a simulation has no lines.
    let text = stdout(&tollgate(&[
        "simulate",
        "--rule",
        "name=tb,rate=5,period=1s,capacity=5",
        "--clients",
        "3",
        "--duration",
        "10s",
    ]));
    assert!(text.starts_with("300 requests sent\n"), "{text}");
    assert!(!text.contains("lines"), "{text}");
    let bad = tollgate(&["simulate", "--rule", "name=tb,rate=0,period=1s"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        stderr(&bad).contains("rules[0].rate (rule \"tb\"): must be greater than 0"),
        "{}",
        stderr(&bad)
    );
}

/// The numbers the page and the charts show are those of the JSON.
#[test]
fn the_report_matches_the_json() {
    let log: String = (0..600)
        .map(|i| {
            let ip = if i % 3 == 0 {
                "203.0.113.9"
            } else {
                "192.0.2.2"
            };
            line(
                ip,
                i / 12,
                if i % 40 == 0 { "POST /login" } else { "GET /" },
            )
        })
        .collect();
    let (dir, log) = file("access.log", log);
    let report = dir.path().join("report");
    let json = replay_json(
        &data("strict.toml"),
        &log,
        &["--report", report.to_str().unwrap()],
    );
    let page = std::fs::read_to_string(report.join("index.html")).unwrap();
    assert!(
        !page.contains("<script") && !page.contains("https://"),
        "self-contained"
    );
    assert_eq!(
        json,
        serde_json::from_str::<Value>(
            &std::fs::read_to_string(report.join("report.json")).unwrap()
        )
        .unwrap()
    );
    for rule in json["rules"].as_array().unwrap() {
        let name = rule["name"].as_str().unwrap();
        // The table row.
        let row = page
            .split(&format!("<tr data-rule=\"{name}\">"))
            .nth(1)
            .unwrap()
            .split("</tr>")
            .next()
            .unwrap();
        for field in [
            "requests",
            "allowed",
            "denied",
            "delayed",
            "refused",
            "keys",
            "keys_limited",
        ] {
            let cell = row
                .split(&format!("data-field=\"{field}\">"))
                .nth(1)
                .unwrap()
                .split('<')
                .next()
                .unwrap();
            assert_eq!(cell, rule[field].to_string(), "{name} {field}");
        }
        // The chart: its series sum to the totals.
        let svg = std::fs::read_to_string(report.join(format!("strict_toml-{name}.svg"))).unwrap();
        assert!(page.contains(&svg), "the page shows the same chart");
        let total = |series: &str| -> u64 {
            svg.split(&format!("data-series=\"{series}\" data-values=\""))
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .split(' ')
                .map(|v| v.parse::<u64>().unwrap())
                .sum()
        };
        assert_eq!(
            total("offered"),
            rule["requests"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(
            total("admitted"),
            rule["allowed"].as_u64().unwrap() + rule["delayed"].as_u64().unwrap()
        );
        assert_eq!(total("denied"), rule["denied"].as_u64().unwrap());
        // The top keys, in order.
        let section = page
            .split(&format!("<section><h3>{name}</h3>"))
            .nth(1)
            .unwrap()
            .split("</section>")
            .next()
            .unwrap();
        let shown: Vec<(String, u64)> = section
            .split("<tr class=\"top-key\"><td>")
            .skip(1)
            .map(|row| {
                let (key, rest) = row.split_once("</td><td data-field=\"denied\">").unwrap();
                (
                    key.to_owned(),
                    rest.split('<').next().unwrap().parse().unwrap(),
                )
            })
            .collect();
        let expected: Vec<(String, u64)> = rule["top_keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| {
                (
                    k["key"].as_str().unwrap().to_owned(),
                    k["denied"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(shown, expected, "{name}");
    }
    assert!(
        rule(&json, "per-ip")["denied"].as_u64().unwrap() > 0,
        "the log is limited"
    );
}

#[test]
fn the_bucket_scenario_takes_the_burst_the_window_does_not() {
    let output = tollgate(&["simulate", "--scenario", "bucket-burst", "--json"]);
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    // 40 steady requests and a burst of 30 at 10 s: the bucket's 20 tokens take 20 of the burst;
    // a window of 2 per second takes at most 2 of it.
    let (bucket, window) = (rule(&json, "token-bucket"), rule(&json, "fixed-window"));
    assert_eq!(bucket["requests"], 70);
    assert!(bucket["denied"].as_u64().unwrap() <= 11, "{bucket}");
    assert!(window["denied"].as_u64().unwrap() >= 28, "{window}");
}

/// The admitted requests per second of the scenario's chart of `rule`.
fn admitted_per_second(dir: &Path, rule: &str) -> Vec<u64> {
    let svg = std::fs::read_to_string(dir.join(format!("simulation-{rule}.svg"))).unwrap();
    svg.split("data-series=\"admitted\" data-values=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .split(' ')
        .map(|v| v.parse().unwrap())
        .collect()
}

#[test]
fn the_smoothing_scenario_shows_the_sliding_window_spreading_admissions() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report");
    let output = tollgate(&[
        "simulate",
        "--scenario",
        "smoothing",
        "--report",
        report.to_str().unwrap(),
    ]);
    assert!(output.status.success());
    // One point per second over 60 s. After the first window, the fixed window admits its 30 in
    // a surge at each window's start and nothing after; the sliding window admits every second.
    let fixed = admitted_per_second(&report, "fixed-window");
    let sliding = admitted_per_second(&report, "sliding-window");
    assert_eq!((fixed.len(), sliding.len()), (60, 60));
    let idle = |series: &[u64]| series[10..].iter().filter(|&&n| n == 0).count();
    assert!(idle(&fixed) >= 10, "{fixed:?}");
    assert_eq!(idle(&sliding), 0, "{sliding:?}");
    assert!(sliding[10..].iter().max() < fixed[10..].iter().max());
}

#[test]
fn simulate_refuses_traffic_too_large_to_hold() {
    fails_saying(
        &[
            "simulate",
            "--rule",
            "name=a,rate=1,period=1s",
            "--traffic",
            "steady:1000000",
            "--clients",
            "1000",
            "--duration",
            "1h",
        ],
        "at most 20000000 are simulated",
    );
    fails_saying(
        &[
            "simulate",
            "--rule",
            "name=a,rate=1,period=1s",
            "--traffic",
            "steady:fast",
        ],
        "expected steady:RATE",
    );
}

/// A configuration of tollgate-server replayed on the descriptors each line would send.
#[test]
fn replay_sends_each_line_as_descriptors_to_a_tollgate_server_configuration() {
    let config = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n  - key: generic_key\n    value: export\n    descriptors:\n      - key: remote_address\n        rate_limit: { unit: minute, requests_per_unit: 1 }\n";
    let (_c, config) = file("edge.yaml", config);
    let config = config.to_str().unwrap();
    // Within one minute: five lines from one address, two from another.
    let log: String = (0..5)
        .map(|s| line("192.0.2.1", s, "GET /"))
        .chain((10..12).map(|s| line("192.0.2.2", s, "GET /")))
        .collect();
    let (_l, log) = file("access.log", log);
    let json = replay_json(config, &log, &["--descriptor", "remote_address=peer"]);
    let per_address = rule(&json, "edge.remote_address");
    assert_eq!(
        (
            &per_address["requests"],
            &per_address["allowed"],
            &per_address["denied"]
        ),
        (&json!(7), &json!(5), &json!(2))
    );
    assert_eq!(per_address["top_keys"][0]["key"], "192.0.2.1");
    // Two descriptors per line, charged all or nothing: the nested limit (1 per address)
    // refuses the second line of each address.
    let both = replay_json(
        config,
        &log,
        &[
            "--descriptor",
            "remote_address=peer",
            "--descriptor",
            "generic_key=literal:export,remote_address=peer",
        ],
    );
    let nested = rule(&both, "edge.generic_key_export.remote_address");
    assert_eq!(
        (&nested["allowed"], &nested["denied"]),
        (&json!(2), &json!(5))
    );
    fails_saying(
        &["replay", "--config", config, "--log", log.to_str().unwrap()],
        "give --descriptor",
    );
    fails_saying(
        &[
            "replay",
            "--config",
            config,
            "--log",
            log.to_str().unwrap(),
            "--descriptor",
            "remote_address",
        ],
        "expected KEY=SOURCE",
    );
}

/// The arguments of every `tollgate` command in a guide chapter's `sh` blocks, written as
/// `cargo run --release -p tollgate-cli -- ARGS` or `tollgate ARGS` (lines joined at a final `\`).
fn readme_commands(readme: &str) -> Vec<Vec<String>> {
    let mut commands = Vec::new();
    let mut in_sh = false;
    let mut command = String::new();
    for line in readme.lines() {
        if !in_sh {
            in_sh = line == "```sh";
            continue;
        }
        if line.starts_with("```") {
            in_sh = false;
            continue;
        }
        command.push_str(line.trim());
        if command.ends_with('\\') {
            command.pop();
            command.push(' ');
            continue;
        }
        let args = command
            .strip_prefix("cargo run --release -p tollgate-cli -- ")
            .or_else(|| command.strip_prefix("tollgate "));
        if let Some(args) = args {
            // Split on spaces: the guide's commands quote nothing.
            assert!(!args.contains(['\'', '"', '$', '`']), "{command}");
            commands.push(args.split_whitespace().map(str::to_owned).collect());
        }
        command.clear();
    }
    commands
}

/// The guide's `tollgate` commands (its chapters on the command and on `tollgate-server`, which
/// moved there from the README), run from the repository's root as a reader pastes them:
/// every file they read ships with the repository (issue 39: `access.log`, `limits.toml`,
/// `access.jsonl` and `ratelimit/config/` did not), and each exits 0 with output showing it did
/// its work. `--report` writes into a temporary directory instead of the repository.
#[test]
fn the_readmes_commands_run_on_the_files_the_repository_ships() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let commands: Vec<Vec<String>> = ["src/guide/cli.md", "src/guide/server.md"]
        .iter()
        .flat_map(|chapter| readme_commands(&std::fs::read_to_string(root.join(chapter)).unwrap()))
        .collect();
    assert!(commands.len() >= 7, "{commands:?}");
    let report = tempfile::tempdir().unwrap();
    let mut subcommands = std::collections::BTreeSet::new();
    for mut args in commands {
        if let Some(at) = args.iter().position(|a| a == "--report") {
            args[at + 1] = report.path().display().to_string();
        }
        let shown = format!("tollgate {}", args.join(" "));
        let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .current_dir(root)
            .args(&args)
            .output()
            .expect("the binary runs");
        assert!(output.status.success(), "{shown}:\n{}", stderr(&output));
        let text = stdout(&output);
        match args[0].as_str() {
            "check" => assert!(text.contains("OK"), "{shown}:\n{text}"),
            "replay" if args.iter().any(|a| a == "--json") => {
                let json: Value = serde_json::from_str(&text).expect("JSON on stdout");
                let rules = json["rules"].as_array().unwrap();
                assert!(!rules.is_empty(), "{shown}:\n{text}");
                assert!(
                    rules.iter().any(|r| r["denied"].as_u64() > Some(0)),
                    "{shown}: nothing denied\n{text}"
                );
                // Every line of the shipped log is read.
                assert!(json["lines"].as_u64() > Some(0), "{shown}:\n{text}");
                let skipped = json["skipped"].as_object().unwrap();
                assert!(skipped.values().all(|n| n == 0), "{shown}: {skipped:?}");
            }
            "replay" | "simulate" => assert!(text.contains("denied"), "{shown}:\n{text}"),
            other => panic!("{shown}: an unexpected subcommand {other}"),
        }
        if args.iter().any(|a| a == "--report") {
            assert!(report.path().join("index.html").is_file(), "{shown}");
        }
        subcommands.insert(args[0].clone());
    }
    assert_eq!(
        subcommands.into_iter().collect::<Vec<_>>(),
        ["check", "replay", "simulate"]
    );
}
