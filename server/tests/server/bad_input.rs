//! Bad input gets a clear answer, and the server keeps serving.

use tollgate_server::service::protocol::{code, Entry, RateLimitDescriptor, RateLimitOverride};
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
        limit: None,
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

    let mut no_unit = request("edge", &[&[("remote_address", "a")]]);
    no_unit.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 10,
        unit: 0,
    });
    invalid("descriptors[0].limit.unit: 0")(client.call(no_unit).await.unwrap_err());

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

/// Reads `stream` until the server closes it (bounded): what a silent or trickling client
/// meets.
async fn closed_by_the_server(stream: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut buf = [0; 1024];
    let closed = tokio::time::timeout(crate::support::DEADLINE, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                // The server's own bytes (HTTP/2 settings) before it closes.
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the server kept a silent connection open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_silent_connections_are_closed_and_their_number_is_bounded() {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    let dir = ConfigDir::new();
    let server = Server::start_with(
        &dir.write("edge.yaml", REFERENCE),
        &["--header-read-timeout-ms", "300", "--max-connections", "8"],
    );
    // Silent, or trickling half a preface or half a request head: each is closed once its
    // time is up.
    let mut slow = Vec::new();
    for _ in 0..4 {
        slow.push(TcpStream::connect(server.grpc).await.unwrap());
    }
    let mut half_preface = TcpStream::connect(server.grpc).await.unwrap();
    half_preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    slow.push(half_preface);
    for _ in 0..2 {
        let mut half_head = TcpStream::connect(server.http).await.unwrap();
        half_head
            .write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        slow.push(half_head);
    }
    // Meanwhile, real clients are served.
    let client = server.client().await;
    let answer = client
        .ask("edge", &[&[("remote_address", "10.0.0.1")]])
        .await;
    assert_eq!(answer.overall_code, code::OK);
    assert_eq!(server.get("/healthcheck").0, 200);
    for stream in &mut slow {
        closed_by_the_server(stream).await;
    }
    assert_eq!(
        server.wait_for_metric("tollgate_server_connections_timed_out_total", 7),
        7
    );

    // At most 8 open on a port: the client's, and 7 that sent their preface and stay.
    let mut held = Vec::new();
    for _ in 0..7 {
        let mut stream = TcpStream::connect(server.grpc).await.unwrap();
        stream
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        held.push(stream);
    }
    // Each of those reaches the server (it answers with its settings) before the next is
    // refused.
    for stream in &mut held {
        use tokio::io::AsyncReadExt;
        let mut settings = [0; 9];
        stream.read_exact(&mut settings).await.unwrap();
        assert_eq!(settings[3], 4, "an HTTP/2 SETTINGS frame");
    }
    let mut one_more = TcpStream::connect(server.grpc).await.unwrap();
    closed_by_the_server(&mut one_more).await;
    assert_eq!(
        server.wait_for_metric("tollgate_server_connections_refused_total", 1),
        1
    );
    // One closes; a new client is served again.
    drop(held.pop());
    let again = tokio::time::timeout(crate::support::DEADLINE, async {
        loop {
            if let Ok(client) =
                tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
                    .unwrap()
                    .connect()
                    .await
            {
                break client;
            }
        }
    })
    .await;
    assert!(again.is_ok(), "a connection is accepted once one closes");
}
