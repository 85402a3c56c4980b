//! The `keys` target: arbitrary forwarding headers, cookies and `Authorization` values, a peer
//! address and trusted networks, through every [`Key`].
//!
//! Input: one line per header or setting.
//!
//! - `@peer ADDR` — the TCP peer (`10.0.0.1`, `[2001:db8::1]:443`); an unparsable address means
//!   no peer. Default `10.0.0.1`.
//! - `@trust NET` — a trusted network (repeatable). Without any: `10.0.0.0/8`, `2001:db8::/32`
//!   and the loopback networks.
//! - `@v4 N`, `@v6 N` — the prefix lengths client addresses are grouped by.
//! - `@cookie NAME` — one more cookie name to read.
//! - any other line is a header: its first byte picks the name (`f` Forwarded, `x`
//!   X-Forwarded-For, `r` X-Real-IP, `c` Cookie, `a` Authorization, anything else X-Api-Key),
//!   the rest of the line, after an optional `:`, is the value.
//!
//! Checked: nothing panics; every key is at most [`MAX_KEY_LEN`] bytes and never empty; an IP
//! key is an address or a network in canonical form and is missing exactly when the peer is;
//! an untrusted peer is its own client whatever the headers say; bearer keys are digests;
//! cookie values never span two cookies; `first_of` takes the first present key.

use std::net::{IpAddr, SocketAddr};

use http::header::{AUTHORIZATION, COOKIE, FORWARDED};
use http::{HeaderName, Request};
use ipnet::IpNet;
use tollgate::key::{ForwardedHeader, KeyValue, MAX_KEY_LEN};
use tollgate::{ClientIp, Key};

const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The scene an input sets.
struct Input {
    peer: Option<IpAddr>,
    trust: Vec<IpNet>,
    v4: Option<u8>,
    v6: Option<u8>,
    cookie: Option<String>,
    request: Request<()>,
}

impl Input {
    fn parse(data: &[u8]) -> Input {
        let mut input = Input {
            peer: Some(IpAddr::from([10, 0, 0, 1])),
            trust: Vec::new(),
            v4: None,
            v6: None,
            cookie: None,
            request: Request::new(()),
        };
        for line in super::lines(data) {
            if let Some((name, argument)) = super::setting(line) {
                match name {
                    b"peer" => {
                        input.peer = argument
                            .parse::<SocketAddr>()
                            .map(|addr| addr.ip())
                            .or_else(|_| argument.parse::<IpAddr>())
                            .ok();
                    }
                    b"trust" => input.trust.extend(parse_network(argument)),
                    b"v4" => input.v4 = argument.parse().ok(),
                    b"v6" => input.v6 = argument.parse().ok(),
                    b"cookie" => input.cookie = Some(argument.to_owned()),
                    _ => {}
                }
                continue;
            }
            let Some((&first, rest)) = line.split_first() else {
                continue;
            };
            let name = match first {
                b'f' => FORWARDED,
                b'x' => HeaderName::from_static("x-forwarded-for"),
                b'r' => HeaderName::from_static("x-real-ip"),
                b'c' => COOKIE,
                b'a' => AUTHORIZATION,
                _ => X_API_KEY,
            };
            let value = rest.strip_prefix(b":").unwrap_or(rest);
            input
                .request
                .headers_mut()
                .append(name, super::header_value(value));
        }
        if let Some(peer) = input.peer {
            input
                .request
                .extensions_mut()
                .insert(SocketAddr::new(peer, 40_000));
        }
        input
    }

    /// A client-IP key with this input's prefixes, trusting `trust`.
    fn client_ip(&self, trust: &[IpNet]) -> ClientIp {
        let mut key = Key::client_ip().trust(trust.iter().copied());
        if let Some(len) = self.v4 {
            key = key.ipv4_prefix(len);
        }
        if let Some(len) = self.v6 {
            key = key.ipv6_prefix(len);
        }
        key
    }

    fn trusted(&self) -> ClientIp {
        if self.trust.is_empty() {
            let defaults = ["10.0.0.0/8", "2001:db8::/32"].map(|net| net.parse().unwrap());
            self.client_ip(&defaults).trust_loopback()
        } else {
            self.client_ip(&self.trust)
        }
    }

    /// Whether the peer could be in a trusted network: a v4 peer also counts as its IPv4-mapped
    /// IPv6 form, so this says yes whenever tollgate might.
    fn peer_may_be_trusted(&self) -> bool {
        let Some(peer) = self.peer else {
            return false;
        };
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
            v4 => v4,
        };
        let mapped = match peer {
            IpAddr::V4(v4) => IpAddr::V6(v4.to_ipv6_mapped()),
            v6 => v6,
        };
        let defaults: Vec<IpNet> = ["10.0.0.0/8", "2001:db8::/32", "127.0.0.0/8", "::1/128"]
            .iter()
            .map(|net| net.parse().unwrap())
            .collect();
        let nets = if self.trust.is_empty() {
            &defaults
        } else {
            &self.trust
        };
        nets.iter()
            .any(|net| net.contains(&peer) || net.contains(&mapped))
    }
}

fn parse_network(text: &str) -> Option<IpNet> {
    text.parse::<IpNet>()
        .ok()
        .or_else(|| text.parse::<IpAddr>().ok().map(IpNet::from))
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let input = Input::parse(data);
    let req = &input.request;

    // IP keys: present exactly when the peer is, and always an address or a network.
    let peer_key = Key::from(input.client_ip(&[])).extract(req);
    assert_eq!(peer_key.is_some(), input.peer.is_some());
    if let Some(key) = &peer_key {
        check_ip_key(key);
    }
    if let Some(key) = Key::peer_ip().extract(req) {
        check_ip_key(&key);
    }
    for header in [
        ForwardedHeader::XForwardedFor,
        ForwardedHeader::Forwarded,
        ForwardedHeader::XRealIp,
    ] {
        let key = Key::from(input.trusted().header(header));
        let got = key.extract(req);
        assert_eq!(got.is_some(), input.peer.is_some(), "{header:?}");
        if let Some(got) = &got {
            check_ip_key(got);
        }
        if !input.peer_may_be_trusted() {
            assert_eq!(
                got, peer_key,
                "an untrusted peer is the client ({header:?})"
            );
        }
        let _ = format!("{key:?}");
    }

    // Bearer tokens only ever appear as their digest.
    if let Some(key) = Key::bearer().extract(req) {
        let bytes = key.as_bytes();
        assert_eq!(bytes.len(), 71);
        assert!(bytes.starts_with(b"sha256:"));
        assert!(bytes[7..]
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)));
    }

    // Cookies: one cookie's value, never running into the next one.
    let mut names = vec!["sid".to_owned(), "session".to_owned()];
    names.extend(input.cookie.clone());
    for name in &names {
        if let Some(key) = Key::cookie(name).extract(req) {
            check_bounded(&key);
            if !is_digest(&key) {
                assert!(!key.as_bytes().contains(&b';'), "cookie {name:?}: {key:?}");
            }
        }
    }

    // A plain header: its first value, hashed when long.
    let header = Key::header(X_API_KEY).extract(req);
    match req.headers().get(X_API_KEY).map(|v| v.as_bytes()) {
        Some(value) if !value.is_empty() => {
            assert_eq!(header.as_ref(), Some(&KeyValue::new(value)));
        }
        _ => assert_eq!(header, None),
    }
    if let Some(key) = &header {
        check_bounded(key);
    }

    // `first_of` is the first present key of its list.
    let keys = [
        Key::header(X_API_KEY),
        Key::cookie("sid"),
        Key::bearer(),
        input.trusted().header(ForwardedHeader::Forwarded).into(),
    ];
    let first = keys.iter().find_map(|key| key.extract(req));
    assert_eq!(Key::first_of(keys).extract(req), first);

    assert_eq!(
        Key::global().extract(req).map(|k| k.as_bytes().to_vec()),
        Some(Vec::new())
    );
}

fn is_digest(key: &KeyValue) -> bool {
    key.as_bytes().len() == 71 && key.as_bytes().starts_with(b"sha256:")
}

fn check_bounded(key: &KeyValue) {
    assert!(!key.as_bytes().is_empty(), "an empty key counts as missing");
    assert!(key.as_bytes().len() <= MAX_KEY_LEN, "{key:?}");
}

/// An address, or a network whose host bits are zero; IPv4-mapped addresses are IPv4.
fn check_ip_key(key: &KeyValue) {
    check_bounded(key);
    let text = std::str::from_utf8(key.as_bytes()).expect("IP keys are text");
    match (text.parse::<IpAddr>(), text.parse::<IpNet>()) {
        (Ok(IpAddr::V6(v6)), _) => assert!(v6.to_ipv4_mapped().is_none(), "{text}"),
        (Ok(IpAddr::V4(_)), _) => {}
        (_, Ok(net)) => {
            assert_eq!(net, net.trunc(), "{text}");
            if let IpNet::V6(v6) = net {
                assert!(v6.network().to_ipv4_mapped().is_none(), "{text}");
            }
        }
        _ => panic!("not an IP key: {text:?}"),
    }
}
