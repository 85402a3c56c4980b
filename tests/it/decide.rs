//! `Limiter::decide` (one request through the rules without a Tower service), the rules in force
//! as `RuleSummary`s, and a configuration file built over a store of the caller's choice — what
//! the `tollgate` command runs on. Each is checked against what the middleware does.

use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderName, Method, Request, StatusCode};
use tollgate::algorithm::Algorithm;
use tollgate::algorithm::Verdict;
use tollgate::clock::ManualClock;
use tollgate::config::Config;
use tollgate::engine::Ruling;
use tollgate::{AccessList, Key, Limit, Limiter, MemoryStore, MissingKey, Queue, Rule};

fn request(method: Method, path: &str, peer: &str) -> Request<()> {
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .body(())
        .unwrap();
    request
        .extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    request
}

fn decide(limiter: &Limiter, request: &Request<()>) -> Ruling {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(limiter.decide(request))
        .unwrap()
}

fn clock() -> ManualClock {
    ManualClock::new(Duration::from_secs(1_700_000_000))
}

#[test]
fn decides_as_the_rules_say_with_the_manual_clock() {
    let clock = clock();
    let limiter = Limiter::builder()
        .rule(Rule::new("per-ip", Limit::per_second(2)).key(Key::peer_ip()))
        .rule(
            Rule::new("login", Limit::per_minute(1))
                .key(Key::peer_ip())
                .methods([Method::POST])
                .path("/login"),
        )
        .store(MemoryStore::with_clock(clock.clone()))
        .build()
        .unwrap();
    let get = request(Method::GET, "/", "192.0.2.1:1000");
    let verdicts = |ruling: Ruling| match ruling {
        Ruling::Decided { enforced, shadow } => {
            assert!(shadow.rules().is_empty());
            enforced
                .rules()
                .iter()
                .map(|r| (r.rule().to_string(), r.outcome.verdict.is_admitted()))
                .collect::<Vec<_>>()
        }
        other => panic!("not decided: {other:?}"),
    };
    assert_eq!(verdicts(decide(&limiter, &get)), [("per-ip".into(), true)]);
    assert_eq!(verdicts(decide(&limiter, &get)), [("per-ip".into(), true)]);
    assert_eq!(verdicts(decide(&limiter, &get)), [("per-ip".into(), false)]);
    // Another peer has its own key; the login rule applies to POST /login only.
    let login = request(Method::POST, "/login", "192.0.2.2:1000");
    assert_eq!(
        verdicts(decide(&limiter, &login)),
        [("per-ip".into(), true), ("login".into(), true)]
    );
    // Half a second later the first peer has one unit again: time is the manual clock's.
    clock.advance(Duration::from_millis(500));
    assert_eq!(verdicts(decide(&limiter, &get)), [("per-ip".into(), true)]);
}

#[test]
fn lists_missing_keys_and_shadow_rules() {
    let api_key = HeaderName::from_static("x-api-key");
    let limiter = Limiter::builder()
        .rule(Rule::new("per-key", Limit::per_second(1)).key(Key::header(api_key.clone())))
        .rule(
            Rule::new("watch", Limit::per_second(1))
                .key(Key::peer_ip())
                .shadow(true),
        )
        .allow(AccessList::networks(
            Key::peer_ip(),
            ["10.0.0.0/8".parse().unwrap()],
        ))
        .deny(AccessList::keys(Key::header(api_key.clone()), ["leaked"]))
        .store(MemoryStore::with_clock(clock()))
        .build()
        .unwrap();
    let with_key = |key: &str, peer: &str| {
        let mut r = request(Method::GET, "/", peer);
        r.headers_mut().insert(&api_key, key.parse().unwrap());
        r
    };
    assert!(matches!(
        decide(&limiter, &with_key("k", "10.1.2.3:1")),
        Ruling::Allowed
    ));
    match decide(&limiter, &with_key("leaked", "192.0.2.1:1")) {
        Ruling::Refused { status, rule, .. } => {
            assert_eq!((status, rule), (StatusCode::FORBIDDEN, None))
        }
        other => panic!("{other:?}"),
    }
    match decide(&limiter, &request(Method::GET, "/", "192.0.2.1:1")) {
        Ruling::Refused { status, rule, .. } => {
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert_eq!(rule.as_deref(), Some("per-key"));
        }
        other => panic!("{other:?}"),
    }
    // The shadow rule is charged apart and never blocks.
    for expected in [true, false] {
        match decide(&limiter, &with_key("k2", "192.0.2.9:1")) {
            Ruling::Decided { enforced, shadow } => {
                assert_eq!(enforced.rules()[0].rule(), "per-key");
                assert_eq!(enforced.is_allowed(), expected);
                assert_eq!(shadow.rules()[0].rule(), "watch");
                assert_eq!(shadow.is_allowed(), expected);
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_queued_rule_reports_the_wait() {
    let limiter = Limiter::builder()
        .rule(
            Rule::new("paced", Limit::per_second(1))
                .key(Key::peer_ip())
                .queue(Queue::burst(5)),
        )
        .store(MemoryStore::with_clock(clock()))
        .build()
        .unwrap();
    let get = request(Method::GET, "/", "192.0.2.1:1");
    let waits: Vec<Verdict> = (0..3)
        .map(|_| match decide(&limiter, &get) {
            Ruling::Decided { enforced, .. } => enforced.rules()[0].outcome.verdict,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(waits[0], Verdict::Allowed);
    assert_eq!(
        waits[1],
        Verdict::Reserved {
            wait: Duration::from_secs(1)
        }
    );
    assert_eq!(
        waits[2],
        Verdict::Reserved {
            wait: Duration::from_secs(2)
        }
    );
}

#[test]
fn rules_in_force_describe_each_rule() {
    let limiter = Limiter::builder()
        .rule(
            Rule::new("login", Limit::sliding_window(5, Duration::from_secs(60)))
                .key(Key::client_ip())
                .methods([Method::POST])
                .path("/login")
                .on_missing_key(MissingKey::Skip),
        )
        .rule(Rule::new("global", Limit::per_second(100)).shadow(true))
        .build()
        .unwrap();
    let rules = limiter.rules_in_force();
    assert_eq!(rules.len(), 2);
    let login = &rules[0];
    assert_eq!(login.name, "login");
    assert!(matches!(&login.algorithm, Algorithm::SlidingWindow(w) if w.limit() == 5));
    assert_eq!(login.key.describe(), "client-ip");
    assert_eq!(login.methods, [Method::POST]);
    assert_eq!(login.paths, ["/login"]);
    assert!(matches!(login.missing_key, MissingKey::Skip));
    assert!(!login.shadow && login.queue.is_none() && !login.conditional);
    assert!(rules[1].shadow);
    assert_eq!(rules[1].key.describe(), "global");
}

#[cfg(feature = "config")]
mod config {
    use super::*;
    use tollgate::config::ConfigFormat;

    #[test]
    fn a_file_runs_on_the_store_given() {
        let clock = clock();
        let text = "[[rules]]\nname = \"per-ip\"\nrate = 1\nperiod = \"1s\"\nkey = \"peer_ip\"\n\
                    [store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1/\"\n";
        // The file names a Redis store (never connected to here); the memory store decides.
        let layer = Config::parse(ConfigFormat::Toml, text)
            .and_then(|config| config.layer_with_store(MemoryStore::with_clock(clock.clone())))
            .unwrap();
        let get = request(Method::GET, "/", "192.0.2.1:1");
        let allowed = |ruling: Ruling| match ruling {
            Ruling::Decided { enforced, .. } => enforced.is_allowed(),
            other => panic!("{other:?}"),
        };
        assert!(allowed(decide(layer.limiter(), &get)));
        assert!(!allowed(decide(layer.limiter(), &get)));
        clock.advance(Duration::from_secs(1));
        assert!(allowed(decide(layer.limiter(), &get)));
    }

    #[test]
    fn errors_are_those_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limits.toml");
        std::fs::write(&path, "[[rules]]\nname = \"a\"\nrate = \"ten\"\n").unwrap();
        let error = Config::read(&path)
            .and_then(|config| config.layer_with_store(MemoryStore::new()))
            .unwrap_err();
        assert_eq!(error.file(), Some(path.as_path()));
        assert_eq!((error.line(), error.column()), (Some(3), Some(8)));
        assert_eq!(error.path(), "rules[0].rate");
        // The store's settings are checked even though the store given replaces them.
        let bad_store = "[[rules]]\nname = \"a\"\nrate = 1\nperiod = \"1s\"\n\
                         [store]\nkind = \"redis\"\nurl = \"http://x\"\n";
        let error = Config::parse(ConfigFormat::Toml, bad_store)
            .and_then(|config| config.layer_with_store(MemoryStore::new()))
            .unwrap_err();
        assert_eq!(error.path(), "store.url");
    }
}
