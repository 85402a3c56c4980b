//! The reference's numbers, for each form of configuration: the same descriptors, the same
//! answers.
//!
//! Counting limits are a year (reference form: fixed windows aligned as the reference aligns
//! them, whose one boundary a year no test run straddles in practice) or a day (tollgate's form:
//! sliding logs, which have no boundary at all), so the counts never depend on the time of day.

use tollgate_server::service::protocol::{code, RateLimitResponse};
use tollgate_server::unit::Unit;

use crate::support::{addend, descriptor, request, ConfigDir, Server};

pub const REFERENCE: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: year, requests_per_unit: 3 }
  - key: internal
    rate_limit: { unlimited: true }
  - key: canary
    shadow_mode: true
    rate_limit: { unit: year, requests_per_unit: 1 }
  - key: generic_key
    value: slowpath
    descriptors:
      - key: remote_address
        rate_limit: { unit: year, requests_per_unit: 1 }
  - key: bulk
    rate_limit: { unit: year, requests_per_unit: 5 }
"#;

pub const OWN: &str = r#"
domain = "edge"

[[rules]]
name = "per-address"
algorithm = "sliding_log"
limit = 3
period = "24h"
descriptors = [{ key = "remote_address" }]

[[rules]]
name = "internal"
unlimited = true
descriptors = [{ key = "internal" }]

[[rules]]
name = "canary"
algorithm = "sliding_log"
limit = 1
period = "24h"
shadow = true
descriptors = [{ key = "canary" }]

[[rules]]
name = "slowpath"
algorithm = "sliding_log"
limit = 1
period = "24h"
descriptors = [{ key = "generic_key", value = "slowpath" }, { key = "remote_address" }]

[[rules]]
name = "bulk"
algorithm = "sliding_log"
limit = 5
period = "24h"
descriptors = [{ key = "bulk" }]
"#;

fn remaining(response: &RateLimitResponse) -> Vec<u32> {
    response
        .statuses
        .iter()
        .map(|s| s.limit_remaining)
        .collect()
}

fn codes(response: &RateLimitResponse) -> Vec<i32> {
    response.statuses.iter().map(|s| s.code).collect()
}

/// Every check below, against a server configured in either form; `unit` is the unit its
/// counting limits report.
async fn the_reference_numbers(server: &Server, unit: Unit) {
    let client = server.client().await;
    let one = |address: &'static str| [("remote_address", address)];

    // 3 per unit per address: remaining 2, 1, 0, then over the limit.
    for expected in [2, 1, 0] {
        let answer = client.ask("edge", &[&one("10.0.0.1")]).await;
        assert_eq!(answer.overall_code, code::OK);
        assert_eq!(remaining(&answer), [expected]);
        let limit = answer.statuses[0].current_limit.as_ref().expect("a limit");
        assert_eq!((limit.requests_per_unit, limit.unit), (3, unit as i32));
        let reset = answer.statuses[0].duration_until_reset.expect("a reset");
        assert!(reset.seconds <= unit.duration().as_secs() as i64);
    }
    let over = client.ask("edge", &[&one("10.0.0.1")]).await;
    assert_eq!(over.overall_code, code::OVER_LIMIT);
    assert_eq!(
        (codes(&over), remaining(&over)),
        (vec![code::OVER_LIMIT], vec![0])
    );
    let headers: Vec<(&str, &str)> = over
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    assert!(headers
        .iter()
        .any(|(k, v)| *k == "ratelimit-policy" && v.contains(";q=3;w=")));
    assert!(headers
        .iter()
        .any(|(k, v)| *k == "ratelimit" && v.contains(";r=0;t=")));
    assert!(headers.iter().any(|(k, _)| *k == "retry-after"));
    // Another address has its own count.
    let other = client.ask("edge", &[&one("10.0.0.2")]).await;
    assert_eq!((other.overall_code, remaining(&other)), (code::OK, vec![2]));

    // Unlimited: OK, the protocol's largest remaining, no limit.
    let internal = client.ask("edge", &[&[("internal", "job")]]).await;
    assert_eq!(internal.overall_code, code::OK);
    assert_eq!(internal.statuses[0].limit_remaining, u32::MAX);
    assert_eq!(internal.statuses[0].current_limit, None);

    // Shadow mode: OK even when over, with its limit and remaining 0; counted as shadowed.
    for _ in 0..3 {
        let canary = client.ask("edge", &[&[("canary", "c")]]).await;
        assert_eq!(canary.overall_code, code::OK);
        assert_eq!(
            (codes(&canary), remaining(&canary)),
            (vec![code::OK], vec![0])
        );
        assert!(canary.statuses[0].current_limit.is_some());
    }
    let shadowed =
        server.metric("ratelimit_service_rate_limit_shadow_mode{domain=\"edge\",key=\"canary\"}");
    assert_eq!(shadowed, 2);

    // Nested: the limit at the level of the last entry, no fallback to the parent's (none).
    let parent = client.ask("edge", &[&[("generic_key", "slowpath")]]).await;
    assert_eq!(parent.statuses[0].current_limit, None);
    let nested = [("generic_key", "slowpath"), ("remote_address", "10.0.0.3")];
    let first = client.ask("edge", &[&nested]).await;
    assert_eq!((first.overall_code, remaining(&first)), (code::OK, vec![0]));
    let second = client.ask("edge", &[&nested]).await;
    assert_eq!(second.overall_code, code::OVER_LIMIT);
    // The top-level limit of that address is another counter.
    let top = client.ask("edge", &[&one("10.0.0.3")]).await;
    assert_eq!(remaining(&top), [2]);

    // Two descriptors, one over its limit: neither is charged.
    let both = client
        .ask("edge", &[&[("bulk", "b")], &one("10.0.0.1")])
        .await;
    assert_eq!(both.overall_code, code::OVER_LIMIT);
    assert_eq!(codes(&both), [code::OK, code::OVER_LIMIT]);
    let bulk = client.ask("edge", &[&[("bulk", "b")]]).await;
    assert_eq!(remaining(&bulk), [4], "the refused request charged nothing");

    // hits_addend: the request's (0 counts as 1), a descriptor's own (0 only looks).
    let mut two = request("edge", &[&[("bulk", "h")]]);
    two.hits_addend = 2;
    assert_eq!(remaining(&client.call(two).await.unwrap()), [3]);
    let mut look = request("edge", &[]);
    look.descriptors.push(descriptor(&[("bulk", "h")]));
    look.descriptors[0].hits_addend = addend(0);
    assert_eq!(remaining(&client.call(look).await.unwrap()), [3]);
    // Above anything the limit can hold: over the limit, nothing charged.
    let mut huge = request("edge", &[&[("bulk", "h")]]);
    huge.hits_addend = 1_000_000;
    let refused = client.call(huge).await.unwrap();
    assert_eq!(refused.overall_code, code::OVER_LIMIT);
    assert_eq!(
        remaining(&client.ask("edge", &[&[("bulk", "h")]]).await),
        [2]
    );

    // An unknown domain or descriptor: OK, one status each, no limit.
    let unknown = client
        .ask("nowhere", &[&one("10.0.0.1"), &[("x", "y")]])
        .await;
    assert_eq!(unknown.overall_code, code::OK);
    assert_eq!(codes(&unknown), [code::OK, code::OK]);
    assert!(unknown.statuses.iter().all(|s| s.current_limit.is_none()));
    let unmatched = client.ask("edge", &[&[("x", "y")]]).await;
    assert_eq!(unmatched.statuses[0].current_limit, None);
    assert!(unmatched.response_headers_to_add.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_yaml() {
    let dir = ConfigDir::new();
    let server = Server::start(&dir.write("edge.yaml", REFERENCE));
    the_reference_numbers(&server, Unit::Year).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_of_reference_files() {
    let dir = ConfigDir::new();
    dir.write("edge.yaml", REFERENCE);
    dir.write("other.yml", "domain: other\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 7 }\n");
    let server = Server::start(dir.dir.path());
    the_reference_numbers(&server, Unit::Year).await;
    let answer = server.client().await.ask("other", &[&[("k", "v")]]).await;
    let limit = answer.statuses[0].current_limit.clone().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (7, Unit::Minute as i32)
    );
    let reset = answer.statuses[0].duration_until_reset.unwrap();
    // Aligned to the minute, as the reference aligns it.
    assert!((0..=60).contains(&reset.seconds));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgate_file() {
    let dir = ConfigDir::new();
    let server = Server::start(&dir.write("edge.toml", OWN));
    the_reference_numbers(&server, Unit::Day).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_that_is_not_a_whole_unit_reports_the_nearest_with_its_name() {
    let dir = ConfigDir::new();
    let config = r#"
domain = "api"
[[rules]]
name = "bursty"
rate = 3
period = "90s"
descriptors = [{ key = "user" }]
"#;
    let server = Server::start(&dir.write("api.toml", config));
    let answer = server.client().await.ask("api", &[&[("user", "u")]]).await;
    let limit = answer.statuses[0].current_limit.clone().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit, limit.name.as_str()),
        (2, Unit::Minute as i32, "bursty")
    );
    // The rounding is the protocol's alone: clients are told the limit as written.
    assert_eq!(
        field(&answer, "ratelimit-policy"),
        Some("\"bursty\";q=3;w=90")
    );
    assert!(field(&answer, "ratelimit")
        .unwrap()
        .starts_with("\"bursty\";r=2;t="));
}

/// The value of the field `name` an answer asks Envoy to add, if any.
fn field<'a>(answer: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    answer
        .response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_that_can_never_fit_is_over_the_limit_and_never_told_to_retry() {
    let dir = ConfigDir::new();
    dir.write(
        "hourly.yaml",
        "domain: hourly\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 3 }\n",
    );
    let config = r#"
domain = "bucket"
headers = "both"
reference = ["hourly.yaml"]
domain_headers = { hourly = "both" }

[[rules]]
name = "five"
rate = 1
period = "1s"
capacity = 5
descriptors = [{ key = "user" }]
"#;
    let server = Server::start(&dir.write("server.toml", config));
    let client = server.client().await;
    for (domain, cost, left, quota) in [("hourly", 4, 3, 3), ("bucket", 6, 5, 5)] {
        let mut call = request(domain, &[&[("user", "u")]]);
        call.hits_addend = cost;
        let answer = client.call(call).await.unwrap();
        // Over the limit, as the reference answers, with the key's real count: nothing was
        // charged, and the key still has all of it.
        assert_eq!(answer.overall_code, code::OVER_LIMIT, "{domain}");
        assert_eq!(codes(&answer), [code::OVER_LIMIT]);
        assert_eq!(remaining(&answer), [left], "{domain}");
        let reset = answer.statuses[0].duration_until_reset.unwrap();
        assert!(reset.seconds > 0 || reset.nanos > 0, "{domain}: {reset:?}");
        // No wait lets it pass: no Retry-After, and no field says "now".
        assert_eq!(field(&answer, "retry-after"), None, "{domain}");
        let ratelimit = field(&answer, "ratelimit").unwrap();
        assert!(ratelimit.contains(&format!(";r={left};")), "{ratelimit}");
        assert!(!ratelimit.ends_with(";t=0"), "{ratelimit}");
        assert!(field(&answer, "ratelimit-policy")
            .unwrap()
            .contains(&format!(";q={quota};")));
        assert_eq!(
            field(&answer, "x-ratelimit-remaining"),
            Some(&*left.to_string())
        );
        assert_ne!(field(&answer, "x-ratelimit-reset"), Some("0"), "{domain}");
        // The key was not charged.
        let after = client.ask(domain, &[&[("user", "u")]]).await;
        assert_eq!(remaining(&after), [left - 1], "{domain}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_limits_are_never_shown_to_clients() {
    let dir = ConfigDir::new();
    let server = Server::start(&dir.write("edge.yaml", REFERENCE));
    let client = server.client().await;
    for _ in 0..3 {
        let canary = client
            .ask("edge", &[&[("canary", "c")], &[("bulk", "b")]])
            .await;
        assert_eq!(canary.overall_code, code::OK);
        for name in ["ratelimit", "ratelimit-policy"] {
            let value = field(&canary, name).unwrap();
            assert!(!value.contains("canary"), "{name}: {value}");
            assert!(value.contains("bulk"), "{name}: {value}");
        }
        assert_eq!(field(&canary, "retry-after"), None);
    }
    // A shadow limit alone: no field at all.
    let alone = client.ask("edge", &[&[("canary", "c")]]).await;
    assert!(alone.response_headers_to_add.is_empty(), "{alone:?}");
    let shadowed =
        server.metric("ratelimit_service_rate_limit_shadow_mode{domain=\"edge\",key=\"canary\"}");
    assert_eq!(shadowed, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaces_and_shared_wildcards() {
    let dir = ConfigDir::new();
    let config = r#"
domain: api
descriptors:
  - key: user
    rate_limit: { unit: year, requests_per_unit: 10, name: per-user }
  - key: vip
    rate_limit:
      unit: year
      requests_per_unit: 100
      replaces: [{ name: per-user }]
  - key: path
    value: "/export/*"
    share_threshold: true
    rate_limit: { unit: year, requests_per_unit: 2 }
  - key: path
    value: "/item/*"
    rate_limit: { unit: year, requests_per_unit: 2 }
"#;
    let server = Server::start(&dir.write("api.yaml", config));
    let client = server.client().await;
    // With `vip` in the same request, `per-user` does not apply (and is not charged).
    let both = client
        .ask("api", &[&[("user", "u")], &[("vip", "u")]])
        .await;
    assert_eq!(both.statuses[0].current_limit, None);
    assert_eq!(remaining(&both), [0, 99]);
    assert_eq!(
        remaining(&client.ask("api", &[&[("user", "u")]]).await),
        [9]
    );
    // A shared wildcard counts every matching value together; a plain one, each apart.
    let export = |p: &'static str| [("path", p)];
    assert_eq!(
        remaining(&client.ask("api", &[&export("/export/a")]).await),
        [1]
    );
    assert_eq!(
        remaining(&client.ask("api", &[&export("/export/b")]).await),
        [0]
    );
    assert_eq!(
        remaining(&client.ask("api", &[&export("/item/a")]).await),
        [1]
    );
    assert_eq!(
        remaining(&client.ask("api", &[&export("/item/b")]).await),
        [1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_are_chosen_per_domain() {
    let dir = ConfigDir::new();
    dir.write(
        "quiet.yaml",
        "domain: quiet\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n",
    );
    let config = r#"
domain = "legacy"
headers = "legacy"
reference = ["quiet.yaml"]
domain_headers = { quiet = "off" }

[[rules]]
name = "per-key"
algorithm = "sliding_log"
limit = 1
period = "24h"
descriptors = [{ key = "k" }]
"#;
    let server = Server::start(&dir.write("server.toml", config));
    let client = server.client().await;
    let fields = |answer: &RateLimitResponse| -> Vec<(String, String)> {
        answer
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect()
    };
    let first = fields(&client.ask("legacy", &[&[("k", "a")]]).await);
    let names: Vec<&str> = first.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset"
        ]
    );
    assert_eq!((first[0].1.as_str(), first[1].1.as_str()), ("1", "0"));
    // Seconds from now, not a Unix time.
    let reset: u64 = first[2].1.parse().unwrap();
    assert!((1..=86_400).contains(&reset), "{reset}");
    let over = fields(&client.ask("legacy", &[&[("k", "a")]]).await);
    assert!(over.iter().any(|(k, _)| k == "retry-after"));
    let quiet = client.ask("quiet", &[&[("k", "a")]]).await;
    assert!(quiet.response_headers_to_add.is_empty());
    assert_eq!(remaining(&quiet), [0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_descriptor_twice_is_charged_twice_in_one_step() {
    let dir = ConfigDir::new();
    let server = Server::start(&dir.write("edge.yaml", REFERENCE));
    let client = server.client().await;
    let address = [("remote_address", "10.0.0.7")];
    let twice = client.ask("edge", &[&address, &address]).await;
    assert_eq!(twice.overall_code, code::OK);
    assert_eq!(remaining(&twice), [1, 1]);
    // 2 of 3 used: twice more does not fit, and charges nothing.
    let again = client.ask("edge", &[&address, &address]).await;
    assert_eq!(again.overall_code, code::OVER_LIMIT);
    assert_eq!(remaining(&client.ask("edge", &[&address]).await), [0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_penalty_blocks_a_descriptor_that_keeps_pushing() {
    let dir = ConfigDir::new();
    let config = r#"
domain = "login"
[[rules]]
name = "attempts"
rate = 1
period = "1s"
block = "1h"
descriptors = [{ key = "user" }]
"#;
    let server = Server::start(&dir.write("login.toml", config));
    let client = server.client().await;
    let user = [("user", "mallory")];
    assert_eq!(client.ask("login", &[&user]).await.overall_code, code::OK);
    // Over the limit: an offence, and the key is blocked for the hour, not for the second the
    // bucket takes to refill.
    let denied = client.ask("login", &[&user]).await;
    assert_eq!(denied.overall_code, code::OVER_LIMIT);
    let retry_after: u64 = denied
        .response_headers_to_add
        .iter()
        .find(|h| h.key == "retry-after")
        .map(|h| h.value.parse().unwrap())
        .expect("Retry-After");
    assert!((3_500..=3_600).contains(&retry_after), "{retry_after}");
}
