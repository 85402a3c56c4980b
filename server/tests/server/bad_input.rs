//! Bad input gets a clear answer, and the server keeps serving.

use tollgate_server::service::protocol::{code, Entry, RateLimitDescriptor};
use tollgate_server::service::{MAX_DESCRIPTORS, MAX_SERIES};
use tonic::Code;

use crate::numbers::REFERENCE;
use crate::support::{descriptor, request, ConfigDir, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_invalid_arguments_and_the_server_keeps_serving() {
    let dir = ConfigDir::new();
    let server = Server::start(&dir.write("edge.yaml", REFERENCE));
    let client = server.client().await;
    let invalid = |message: &'static str| {
        move |status: tonic::Status| {
            assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
            assert!(status.message().contains(message), "{status:?}");
        }
    };

    let empty_domain = request("", &[&[("remote_address", "a")]]);
    invalid("domain: empty")(client.call(empty_domain).await.unwrap_err());

    let no_descriptors = request("edge", &[]);
    invalid("descriptors: none")(client.call(no_descriptors).await.unwrap_err());

    let no_entries = request("edge", &[&[]]);
    invalid("descriptors[0]: no entries")(client.call(no_entries).await.unwrap_err());

    let empty_key = request("edge", &[&[("remote_address", "a")], &[("", "v")]]);
    invalid("descriptors[1].entries[0].key: empty")(client.call(empty_key).await.unwrap_err());

    let mut not_utf8 = request("edge", &[]);
    not_utf8.descriptors.push(RateLimitDescriptor {
        entries: vec![Entry {
            key: vec![0xff, 0xfe],
            value: b"v".to_vec(),
        }],
        hits_addend: None,
        is_negative_hits: false,
    });
    invalid("key: not UTF-8")(client.call(not_utf8).await.unwrap_err());

    // Bytes that are no RateLimitRequest (field 1, the domain, sent as a number): the
    // caller's fault, not the server's.
    #[derive(Clone, PartialEq, prost::Message)]
    struct NotARequest {
        #[prost(uint64, tag = "1")]
        domain: u64,
    }
    invalid("not a RateLimitRequest")(
        client
            .call_with(NotARequest { domain: 7 })
            .await
            .unwrap_err(),
    );

    let mut refund = request("edge", &[&[("remote_address", "a")]]);
    refund.descriptors[0].is_negative_hits = true;
    invalid("is_negative_hits is not supported")(client.call(refund).await.unwrap_err());

    let mut many = request("edge", &[]);
    many.descriptors = (0..10_000)
        .map(|i| descriptor(&[("remote_address", &format!("10.1.{}.{}", i / 256, i % 256))]))
        .collect();
    invalid("at most 1024")(client.call(many).await.unwrap_err());
    // None of them was charged.
    let first = client
        .ask("edge", &[&[("remote_address", "10.1.0.0")]])
        .await;
    assert_eq!(first.statuses[0].limit_remaining, 2);

    // As many as allowed are answered, one status each.
    let mut most = request("edge", &[]);
    most.descriptors = (0..MAX_DESCRIPTORS)
        .map(|i| descriptor(&[("remote_address", &format!("10.2.{}.{}", i / 256, i % 256))]))
        .collect();
    let answer = client.call(most).await.unwrap();
    assert_eq!(answer.statuses.len(), MAX_DESCRIPTORS);
    assert!(answer.statuses.iter().all(|s| s.limit_remaining == 2));

    // A 1 MB value is a value like any other (its key is hashed by the library's store).
    let big = "x".repeat(1 << 20);
    for expected in [2, 1] {
        let answer = client.ask("edge", &[&[("remote_address", &big)]]).await;
        assert_eq!(answer.statuses[0].limit_remaining, expected);
    }

    // Still serving.
    let after = client
        .ask("edge", &[&[("remote_address", "10.9.9.9")]])
        .await;
    assert_eq!(
        (after.overall_code, after.statuses[0].limit_remaining),
        (code::OK, 2)
    );
    assert_eq!(server.metric("tollgate_server_invalid_requests_total"), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detailed_metrics_keep_a_bounded_number_of_series() {
    let dir = ConfigDir::new();
    let config = "domain: d\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: { unit: year, requests_per_unit: 5 }\n";
    let server = Server::start(&dir.write("d.yaml", config));
    let client = server.client().await;
    let user = "u".repeat(1000);
    client.ask("d", &[&[("user", &user)]]).await;
    // Per value, the value cut to 64 characters.
    let sample = format!(
        "ratelimit_service_rate_limit_total_hits{{domain=\"d\",key=\"user_{}\"}}",
        "u".repeat(64)
    );
    assert_eq!(server.metric(&sample), 1);

    // Values chosen by clients cannot grow the series without bound: past MAX_SERIES, new ones
    // are counted together.
    let mut sent = 0;
    for batch in 0..10 {
        let mut many = request("d", &[]);
        many.descriptors = (0..MAX_DESCRIPTORS)
            .map(|i| descriptor(&[("user", &format!("{batch}-{i}"))]))
            .collect();
        client.call(many).await.unwrap();
        sent += MAX_DESCRIPTORS;
    }
    let overflow =
        server.metric("ratelimit_service_rate_limit_total_hits{domain=\"d\",key=\"_overflow\"}");
    assert_eq!(overflow as usize, sent + 1 - MAX_SERIES);
}
