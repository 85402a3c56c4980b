//! The fields the reference service added later, read and answered as it answers them:
//! `quota_mode`, `metadata` (the answer's `dynamic_metadata`), `value_to_metric`, a descriptor's
//! own `limit`, `is_negative_hits`, and its global switches (quota mode, shadow mode, the
//! near-limit ratio, its response headers). And the reference's own example file.

use std::time::Duration;

use tollgate_server::service::protocol::{
    code, Kind, RateLimitOverride, RateLimitResponse, Struct, Value,
};
use tollgate_server::unit::Unit;

use crate::support::{addend, request, ConfigDir, Server};

fn codes(response: &RateLimitResponse) -> Vec<i32> {
    response.statuses.iter().map(|s| s.code).collect()
}

fn remaining(response: &RateLimitResponse) -> Vec<u32> {
    response
        .statuses
        .iter()
        .map(|s| s.limit_remaining)
        .collect()
}

fn field<'a>(answer: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    answer
        .response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

const OK: i32 = code::OK;
const OVER: i32 = code::OVER_LIMIT;

const QUOTA: &str = r#"
domain: quota
descriptors:
  - key: regular
    rate_limit: { unit: year, requests_per_unit: 10 }
  - key: q1
    quota_mode: true
    rate_limit: { unit: year, requests_per_unit: 1 }
  - key: q2
    quota_mode: true
    rate_limit: { unit: year, requests_per_unit: 2 }
"#;

#[tokio::test]
async fn a_request_is_over_only_when_every_quota_descriptor_is() {
    let dir = ConfigDir::new();
    let server = Server::start(&dir.write("quota.yaml", QUOTA));
    let client = server.client().await;
    let all = [&[("regular", "a")][..], &[("q1", "a")], &[("q2", "a")]];

    let first = client.ask("quota", &all).await;
    assert_eq!((first.overall_code, codes(&first)), (OK, vec![OK, OK, OK]));
    assert_eq!(remaining(&first), [9, 0, 1]);
    // q1 is over, q2 has room: the request passes and pays the limits with room; q1 is told
    // OVER_LIMIT, as the reference tells it.
    let second = client.ask("quota", &all).await;
    assert_eq!(
        (second.overall_code, codes(&second)),
        (OK, vec![OK, OVER, OK])
    );
    assert_eq!(remaining(&second), [8, 0, 0]);
    assert_eq!(field(&second, "retry-after"), None, "the request passes");
    // Every quota descriptor is over: the request is, and pays nothing.
    let third = client.ask("quota", &all).await;
    assert_eq!(
        (third.overall_code, codes(&third)),
        (OVER, vec![OK, OVER, OVER])
    );
    assert_eq!(remaining(&third), [8, 0, 0]);
    assert!(field(&third, "retry-after").is_some());
    let regular = client.ask("quota", &[&[("regular", "a")]]).await;
    assert_eq!(
        remaining(&regular),
        [7],
        "the refused request was not charged"
    );

    // An enforced limit over refuses the request whatever the quota descriptors say.
    let many = request("quota", &[&[("regular", "b")], &[("q2", "b")]]);
    let mut costly = many.clone();
    costly.descriptors[0].hits_addend = addend(11);
    let refused = client.call(costly).await.unwrap();
    assert_eq!(
        (refused.overall_code, codes(&refused)),
        (OVER, vec![OVER, OK])
    );
    let after = client.call(many).await.unwrap();
    assert_eq!(remaining(&after), [9, 1], "nothing was charged");
}

#[tokio::test]
async fn the_global_quota_mode_makes_every_limit_a_quota_limit() {
    let dir = ConfigDir::new();
    let server = Server::start_with(&dir.write("quota.yaml", QUOTA), &["--quota-mode"]);
    let client = server.client().await;
    let pair = [&[("q1", "a")][..], &[("regular", "a")]];
    assert_eq!(client.ask("quota", &pair).await.overall_code, OK);
    // q1 is over, `regular` (a quota limit now) has room.
    let second = client.ask("quota", &pair).await;
    assert_eq!((second.overall_code, codes(&second)), (OK, vec![OVER, OK]));
    // A descriptor without a limit is a quota descriptor that always passes, as in the
    // reference.
    let with_unknown = client
        .ask("quota", &[&[("q1", "a")], &[("unknown", "x")]])
        .await;
    assert_eq!(with_unknown.overall_code, OK);
    let alone = client.ask("quota", &[&[("q1", "a")]]).await;
    assert_eq!(alone.overall_code, OVER);
}

/// The reference's example file (`examples/ratelimit/config/example.yaml`), as it is.
const EXAMPLE: &str = r#"---
domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      replaces:
        - name: bkthomps
        - name: fake_name
      unit: minute
      requests_per_unit: 4
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bkthomps
        rate_limit:
          replaces:
            - name: bkthomps
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        value: mock
        rate_limit:
          unit: minute
          requests_per_unit: 1
      - key: destination_cluster
        value: override
        rate_limit:
          replaces:
            - name: banned_limit
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        value: fake
        rate_limit:
          name: fake_name
          unit: minute
          requests_per_unit: 2
  - key: foo
    rate_limit:
      unit: minute
      requests_per_unit: 2
    descriptors:
      - key: bar
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: bar
        value: bkthomps
        rate_limit:
          name: bkthomps
          unit: minute
          requests_per_unit: 1
      - key: bar
        value: banned
        rate_limit:
          name: banned_limit
          unit: minute
          requests_per_unit: 0
      - key: baz
        rate_limit:
          unit: second
          requests_per_unit: 1
      - key: baz
        value: not-so-shady
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: baz
        value: shady
        rate_limit:
          unit: minute
          requests_per_unit: 3
        shadow_mode: true
      - key: bay
        rate_limit:
          unlimited: true
  - key: unspec
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: qux
    rate_limit:
      unlimited: true
  - key: service
    value: service_1
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
    metadata:
      service_with_quota:
        name: "service_1"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
    metadata:
      service_with_quota:
        name: "service_2"
"#;

/// Waits, when a minute is about to end, for the next one to begin: the example's limits are
/// per minute, aligned to the clock, and a test's few calls must fall in one window.
fn within_one_minute() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let into = now.as_secs() % 60;
    if into >= 50 {
        std::thread::sleep(Duration::from_secs(60 - into));
    }
}

#[tokio::test]
async fn the_reference_s_example_file_loads_and_answers_its_numbers() {
    let dir = ConfigDir::new();
    let server = Server::start_with(
        &dir.write("example.yaml", EXAMPLE),
        &["--response-dynamic-metadata"],
    );
    let client = server.client().await;
    within_one_minute();

    // `foo` alone: 2 a minute.
    let foo = [&[("foo", "x")][..]];
    assert_eq!(remaining(&client.ask("rl", &foo).await), [1]);
    assert_eq!(remaining(&client.ask("rl", &foo).await), [0]);
    assert_eq!(client.ask("rl", &foo).await.overall_code, OVER);
    // `bar: banned` is 0 a minute, unless a limit that replaces `banned_limit` applies too.
    let banned = [&[("foo", "y"), ("bar", "banned")][..]];
    let answer = client.ask("rl", &banned).await;
    assert_eq!(answer.overall_code, OVER);
    let limit = answer.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.name.as_str()),
        (0, "banned_limit")
    );
    let replaced = [
        &[("foo", "y"), ("bar", "banned")][..],
        &[
            ("source_cluster", "proxy"),
            ("destination_cluster", "override"),
        ],
    ];
    let answer = client.ask("rl", &replaced).await;
    assert_eq!((answer.overall_code, remaining(&answer)), (OK, vec![0, 1]));
    assert_eq!(answer.statuses[0].current_limit, None);
    // `qux` is unlimited; `baz: shady` is a shadow limit of 3.
    let answer = client.ask("rl", &[&[("qux", "q")]]).await;
    assert_eq!(remaining(&answer), [u32::MAX]);
    let shady = [&[("foo", "z"), ("baz", "shady")][..]];
    for left in [2, 1, 0] {
        assert_eq!(remaining(&client.ask("rl", &shady).await), [left]);
    }
    assert_eq!(client.ask("rl", &shady).await.overall_code, OK);

    // The two quota services: 1 and 2 a minute, each with its metadata.
    let services = [&[("service", "service_1")][..], &[("service", "service_2")]];
    let first = client.ask("rl", &services).await;
    assert_eq!((first.overall_code, remaining(&first)), (OK, vec![0, 1]));
    assert_eq!(
        passed_name(&first),
        Some("service_1"),
        "the first one's stays"
    );
    let second = client.ask("rl", &services).await;
    assert_eq!((second.overall_code, codes(&second)), (OK, vec![OVER, OK]));
    assert_eq!(passed_name(&second), Some("service_2"));
    let third = client.ask("rl", &services).await;
    assert_eq!(
        (third.overall_code, codes(&third)),
        (OVER, vec![OVER, OVER])
    );
    assert_eq!(passed_name(&third), None);
}

/// `metadata.service_with_quota.name` of an answer's `dynamic_metadata`.
fn passed_name(answer: &RateLimitResponse) -> Option<&str> {
    let metadata = answer.dynamic_metadata.as_ref()?;
    let passed = metadata.fields.get("metadata")?.as_struct()?;
    let service = passed.fields.get("service_with_quota")?.as_struct()?;
    match &service.fields.get("name")?.kind {
        Some(Kind::StringValue(name)) => Some(name),
        _ => None,
    }
}

fn text(s: &str) -> Value {
    Value::of(Kind::StringValue(s.to_owned()))
}

fn list(values: Vec<Value>) -> Value {
    Value::of(Kind::ListValue(
        tollgate_server::service::protocol::ListValue { values },
    ))
}

fn object(fields: Vec<(&str, Value)>) -> Value {
    Value::of(Kind::StructValue(Struct {
        fields: fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
    }))
}

#[tokio::test]
async fn dynamic_metadata_in_the_reference_s_shape() {
    let dir = ConfigDir::new();
    let config = dir.write(
        "meta.yaml",
        "domain: meta\ndescriptors:\n  - key: a\n    rate_limit: { unit: year, requests_per_unit: 5 }\n    metadata:\n      team: payments\n      tier: { level: 2, tags: [x, y], enabled: true }\n  - key: b\n    rate_limit: { unit: year, requests_per_unit: 0 }\n    metadata: { blocked: yes }\n",
    );
    let server = Server::start_with(&config, &["--response-dynamic-metadata"]);
    let client = server.client().await;
    let mut call = request("meta", &[&[("a", "1")][..], &[("b", "2")]]);
    call.hits_addend = 3;
    call.descriptors[1].hits_addend = addend(0);
    call.descriptors[1].limit = Some(RateLimitOverride {
        requests_per_unit: 10,
        unit: Unit::Day as i32,
    });
    let answer = client.call(call).await.unwrap();
    // `b` brought its own limit (10 a day), so `a` alone has metadata, and it passed.
    let expected = Struct {
        fields: [
            ("domain", text("meta")),
            (
                "descriptors",
                list(vec![
                    object(vec![("entries", list(vec![text("a=1")]))]),
                    object(vec![
                        ("entries", list(vec![text("b=2")])),
                        ("limit", text("requests_per_unit:10 unit:DAY")),
                        ("hitsAddend", Value::of(Kind::NumberValue(0.0))),
                    ]),
                ]),
            ),
            ("hitsAddend", Value::of(Kind::NumberValue(3.0))),
            (
                "metadata",
                object(vec![
                    ("team", text("payments")),
                    (
                        "tier",
                        object(vec![
                            ("level", Value::of(Kind::NumberValue(2.0))),
                            ("tags", list(vec![text("x"), text("y")])),
                            ("enabled", Value::of(Kind::BoolValue(true))),
                        ]),
                    ),
                ]),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
    };
    assert_eq!(answer.dynamic_metadata, Some(expected));
    // Over the limit, `a`'s metadata is not returned; `metadata` is then left out.
    let over = client.ask("meta", &[&[("b", "2")]]).await;
    let fields = &over.dynamic_metadata.as_ref().unwrap().fields;
    assert!(!fields.contains_key("metadata") && !fields.contains_key("hitsAddend"));

    // Not asked for: none.
    let plain = Server::start(&config);
    let answer = plain.client().await.ask("meta", &[&[("a", "1")]]).await;
    assert_eq!(answer.dynamic_metadata, None);
}

#[tokio::test]
async fn value_to_metric_names_the_request_s_values_in_statistics() {
    let dir = ConfigDir::new();
    let config = dir.write(
        "v.yaml",
        "domain: v\ndescriptors:\n  - key: route\n    value_to_metric: true\n    descriptors:\n      - key: http_method\n        value_to_metric: true\n        rate_limit: { unit: year, requests_per_unit: 10 }\n  - key: path\n    value: \"/api/*\"\n    value_to_metric: true\n    rate_limit: { unit: year, requests_per_unit: 10 }\n  - key: user\n    rate_limit: { unit: year, requests_per_unit: 10 }\n",
    );
    let server = Server::start(&config);
    let client = server.client().await;
    client
        .ask("v", &[&[("route", "api"), ("http_method", "GET")]])
        .await;
    client
        .ask("v", &[&[("route", "api"), ("http_method", "GET")]])
        .await;
    client.ask("v", &[&[("path", "/api/users")]]).await;
    client.ask("v", &[&[("user", "alice")]]).await;
    let hits = |key: &str| {
        server.metric(&format!(
            "ratelimit_service_rate_limit_total_hits{{domain=\"v\",key=\"{key}\"}}"
        ))
    };
    assert_eq!(hits("route_api.http_method_GET"), 2);
    assert_eq!(hits("route.http_method"), 0);
    assert_eq!(hits("path_/api/users"), 1);
    // Without `value_to_metric`, the configured level's key.
    assert_eq!(hits("user"), 1);
}

#[tokio::test]
async fn a_descriptor_s_own_limit_applies_in_any_known_domain() {
    let dir = ConfigDir::new();
    let config = dir.write(
        "o.yaml",
        "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit: { unit: second, requests_per_unit: 5 }\n",
    );
    let server = Server::start(&config);
    let client = server.client().await;
    let with_limit = |value: &str, n: u32, unit: Unit| {
        let mut call = request("test-domain", &[&[("key1", "value1"), ("subkey1", value)]]);
        call.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: n,
            unit: unit as i32,
        });
        call
    };
    // The reference's TestConfigLimitOverride: 10 a day, whatever the file says.
    let first = client
        .call(with_limit("something", 10, Unit::Day))
        .await
        .unwrap();
    let limit = first.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (10, Unit::Day as i32)
    );
    assert_eq!(remaining(&first), [9]);
    let second = client
        .call(with_limit("something", 10, Unit::Day))
        .await
        .unwrap();
    assert_eq!(remaining(&second), [8]);
    // Counted per entries: another value has its own count.
    let other = client
        .call(with_limit("something_else", 10, Unit::Day))
        .await
        .unwrap();
    assert_eq!(remaining(&other), [9]);
    // A number per request: the count is the entries', compared with the number brought.
    let raised = client
        .call(with_limit("something", 20, Unit::Day))
        .await
        .unwrap();
    assert_eq!(remaining(&raised), [17]);
    let per_hour = client
        .call(with_limit("something", 42, Unit::Hour))
        .await
        .unwrap();
    assert_eq!(remaining(&per_hour), [41]);
    // Entries the file has no limit for, and no limit at all (0 a day).
    let mut nowhere = with_limit("x", 10, Unit::Day);
    nowhere.descriptors[0].entries.truncate(1);
    assert_eq!(remaining(&client.call(nowhere).await.unwrap()), [9]);
    let zero = client.call(with_limit("zero", 0, Unit::Day)).await.unwrap();
    assert_eq!(zero.overall_code, OVER);
    // An unknown domain: no limit, as the reference answers.
    let mut unknown = with_limit("something", 10, Unit::Day);
    unknown.domain = b"foo_domain".to_vec();
    let answer = client.call(unknown).await.unwrap();
    assert_eq!(
        (
            answer.overall_code,
            answer.statuses[0].current_limit.clone()
        ),
        (OK, None)
    );
    // Statistics under the entries, as the reference keys them.
    assert_eq!(
        server.metric(
            "ratelimit_service_rate_limit_total_hits{domain=\"test-domain\",key=\"key1_value1.subkey1_something\"}"
        ),
        4
    );
}

#[tokio::test]
async fn negative_hits_give_units_back() {
    let dir = ConfigDir::new();
    let config = dir.write(
        "n.yaml",
        "domain: n\ndescriptors:\n  - key: k\n    rate_limit: { unit: year, requests_per_unit: 5 }\n",
    );
    let server = Server::start(&config);
    let client = server.client().await;
    let mut three = request("n", &[&[("k", "a")]]);
    three.descriptors[0].hits_addend = addend(3);
    assert_eq!(remaining(&client.call(three).await.unwrap()), [2]);
    let mut back = request("n", &[&[("k", "a")]]);
    back.descriptors[0].hits_addend = addend(2);
    back.descriptors[0].is_negative_hits = true;
    let answer = client.call(back.clone()).await.unwrap();
    assert_eq!((answer.overall_code, codes(&answer)), (OK, vec![OK]));
    assert_eq!(remaining(&answer), [4]);
    assert_eq!(remaining(&client.ask("n", &[&[("k", "a")]]).await), [3]);
    // Never below an empty count.
    back.descriptors[0].hits_addend = addend(100);
    assert_eq!(remaining(&client.call(back).await.unwrap()), [5]);
    assert_eq!(
        server.metric("ratelimit_service_rate_limit_total_negative_hits{domain=\"n\",key=\"k\"}"),
        102
    );
    assert_eq!(
        server.metric("ratelimit_service_rate_limit_total_hits{domain=\"n\",key=\"k\"}"),
        4
    );
}

#[tokio::test]
async fn the_global_shadow_mode_answers_ok_and_counts() {
    let dir = ConfigDir::new();
    let config = dir.write(
        "s.yaml",
        "domain: s\ndescriptors:\n  - key: k\n    rate_limit: { unit: year, requests_per_unit: 1 }\n",
    );
    let server = Server::start_with(&config, &["--shadow-mode"]);
    let client = server.client().await;
    let two = [&[("k", "a")][..], &[("hello", "world")]];
    assert_eq!(client.ask("s", &two).await.overall_code, OK);
    // The reference's TestServiceGlobalShadowMode: OK overall, the descriptor's own code kept.
    let answer = client.ask("s", &two).await;
    assert_eq!((answer.overall_code, codes(&answer)), (OK, vec![OVER, OK]));
    assert_eq!(field(&answer, "retry-after"), None);
    assert_eq!(server.metric("ratelimit_service_global_shadow_mode"), 1);
}

#[tokio::test]
async fn near_limit_follows_the_ratio() {
    let dir = ConfigDir::new();
    let config = dir.write(
        "r.yaml",
        "domain: r\ndescriptors:\n  - key: k\n    rate_limit: { unit: year, requests_per_unit: 10 }\n",
    );
    let near = |extra: &[&str]| {
        let server = Server::start_with(&config, extra);
        async move {
            let client = server.client().await;
            for _ in 0..11 {
                client.ask("r", &[&[("k", "a")]]).await;
            }
            server.metric("ratelimit_service_rate_limit_near_limit{domain=\"r\",key=\"k\"}")
        }
    };
    // More than 8 of 10 used: the 9th and the 10th (the 11th is over).
    assert_eq!(near(&[]).await, 2);
    assert_eq!(near(&["--near-limit-ratio", "0.5"]).await, 5);
}

#[tokio::test]
async fn the_reference_s_headers_for_the_closest_descriptor() {
    let dir = ConfigDir::new();
    let config = dir.write(
        "h.yaml",
        "domain: h\ndescriptors:\n  - key: wide\n    rate_limit: { unit: year, requests_per_unit: 10 }\n  - key: narrow\n    rate_limit: { unit: hour, requests_per_unit: 8 }\n",
    );
    let server = Server::start_with(&config, &["--limit-response-headers"]);
    let client = server.client().await;
    let mut call = request("h", &[&[("wide", "a")][..], &[("narrow", "a")]]);
    call.descriptors[1].hits_addend = addend(5);
    let answer = client.call(call.clone()).await.unwrap();
    assert_eq!(field(&answer, "RateLimit-Limit"), Some("8"));
    assert_eq!(field(&answer, "RateLimit-Remaining"), Some("3"));
    let reset: u64 = field(&answer, "RateLimit-Reset").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&reset), "an hour's window: {reset}");
    // tollgate's own fields stay.
    assert!(field(&answer, "RateLimit-Policy").is_some());
    // Over: the descriptor over the limit, 0 left.
    let answer = client.call(call).await.unwrap();
    assert_eq!(answer.overall_code, OVER);
    assert_eq!(field(&answer, "RateLimit-Remaining"), Some("0"));

    let plain = Server::start(&config);
    let answer = plain.client().await.ask("h", &[&[("wide", "a")]]).await;
    assert_eq!(field(&answer, "RateLimit-Limit"), None);
}
