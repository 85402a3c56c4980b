//! `Key`, what a rule counts by, read from a request's head into a `KeyValue`.

use std::any::type_name;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::header::{AUTHORIZATION, COOKIE};
use http::{Extensions, HeaderMap, HeaderName, Method, Request, Uri};
use sha2::{Digest, Sha256};
use smallvec::SmallVec;

use super::client_ip::{self, ClientIp};

/// The longest key kept as is, in bytes.
///
/// Longer keys are replaced by `sha256:` followed by the lowercase hex SHA-256 of their bytes
/// (71 bytes in all), so a client sending a 1 MB header cannot make a store keep 1 MB per key.
pub const MAX_KEY_LEN: usize = 128;

const HASH_PREFIX: &[u8] = b"sha256:";

/// Bytes identifying the limited party.
///
/// Keys are textual where that is natural (IP addresses, prefixes) so they read well in logs
/// and in external stores, but header and cookie values are kept as raw bytes and may not be
/// UTF-8. Keys of up to 48 bytes live inline, without allocation.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct KeyValue(pub(super) SmallVec<[u8; 48]>);

impl KeyValue {
    /// A key holding `bytes`, or their `sha256:<hex>` digest if they exceed [`MAX_KEY_LEN`].
    pub fn new(bytes: &[u8]) -> KeyValue {
        if bytes.len() > MAX_KEY_LEN {
            KeyValue::hashed(bytes)
        } else {
            KeyValue(SmallVec::from_slice(bytes))
        }
    }

    /// The bytes of the key.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// `sha256:` and the lowercase hex digest of `bytes`, whatever their length.
    fn hashed(bytes: &[u8]) -> KeyValue {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let digest = Sha256::digest(bytes);
        let mut out = SmallVec::with_capacity(HASH_PREFIX.len() + 2 * digest.len());
        out.extend_from_slice(HASH_PREFIX);
        for byte in digest {
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 0x0f)]);
        }
        KeyValue(out)
    }

    /// The `Display` output of `value`, length-bounded like [`KeyValue::new`].
    pub(super) fn from_display(value: &dyn fmt::Display) -> KeyValue {
        struct Buf(SmallVec<[u8; 48]>);
        impl fmt::Write for Buf {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                self.0.extend_from_slice(s.as_bytes());
                Ok(())
            }
        }
        let mut buf = Buf(SmallVec::new());
        // A `Display` impl may report an error; whatever it wrote so far is still the best key
        // we have, and an empty result is treated as missing by the callers.
        let _ = fmt::write(&mut buf, format_args!("{value}"));
        if buf.0.len() > MAX_KEY_LEN {
            KeyValue::hashed(&buf.0)
        } else {
            KeyValue(buf.0)
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for KeyValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyValue({:?})", String::from_utf8_lossy(&self.0))
    }
}

impl AsRef<[u8]> for KeyValue {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Display for KeyValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

/// A borrowed view of a request's head, given to [`Key::from_fn`] closures.
///
/// The body is left out on purpose: a key must be known before the body is read.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    /// The request method.
    pub method: &'a Method,
    /// The request URI.
    pub uri: &'a Uri,
    /// The request headers.
    pub headers: &'a HeaderMap,
    /// The request extensions, where earlier layers leave the peer address, user ids, ...
    pub extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// The head of `req`.
    pub fn of<B>(req: &'a Request<B>) -> Self {
        RequestHead {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            extensions: req.extensions(),
        }
    }
}

type KeyFn = dyn Fn(&RequestHead<'_>) -> Option<String> + Send + Sync;

enum Source {
    Global,
    PeerIp,
    ClientIp(ClientIp),
    Header(HeaderName),
    Bearer,
    Extension {
        type_name: &'static str,
        get: fn(&Extensions) -> Option<KeyValue>,
    },
    Cookie(Box<str>),
    #[cfg(feature = "axum")]
    PathParam(Box<str>),
    Fn(Box<KeyFn>),
    FirstOf(Vec<Key>),
}

/// Why a request has no key when the request did not simply leave it out: a refusal of its own,
/// whatever the rule does with missing keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Only path parameters, read through axum, fault so far.
#[cfg_attr(not(feature = "axum"), allow(dead_code))]
pub(crate) enum KeyFault {
    /// The key is a route's path parameter, and no route has matched yet (the layer runs before
    /// the router): the server's misconfiguration.
    NoRoute,
    /// A path parameter's value is not UTF-8 once percent-decoded: the router refuses it too.
    Undecodable,
}

/// Where a rule's key comes from.
///
/// [`Key::extract`] returns `None` when the key is missing (no such header, no peer address,
/// ...); the rule decides what happens then. An empty value also counts as missing, for every
/// key but [`Key::global`]: otherwise every request without, say, an API key would share one
/// bucket keyed by the empty string, silently.
///
/// Values longer than [`MAX_KEY_LEN`] bytes are replaced by their SHA-256 digest.
///
/// Cloning is cheap: the definition is shared.
#[derive(Clone)]
pub struct Key(Arc<Source>);

impl Key {
    fn of(source: Source) -> Key {
        Key(Arc::new(source))
    }

    /// One key shared by every request: the empty byte string. Never missing.
    pub fn global() -> Key {
        Key::of(Source::Global)
    }

    /// The IP address of the TCP peer.
    ///
    /// The peer is read from the request extensions: axum's `ConnectInfo<SocketAddr>` (with the
    /// `axum` feature; `MockConnectInfo` in tests works too), tonic's `TcpConnectInfo` (with the
    /// `tonic` feature), else a plain [`SocketAddr`], which plain-hyper servers can insert
    /// themselves. IPv4 addresses are the key as text (`203.0.113.7`); IPv6 addresses are
    /// grouped by their /64 (`2001:db8:1:2::/64`), because a single host usually owns a whole
    /// /64 and could otherwise rotate addresses to escape its limit. IPv4-mapped IPv6 addresses
    /// count as IPv4.
    ///
    /// Without a peer address in the extensions (axum served without
    /// `into_make_service_with_connect_info::<SocketAddr>()`), the middleware answers `500`
    /// and logs one error naming that fix: the server is misconfigured, not the request.
    ///
    /// Behind a reverse proxy every request comes from the proxy; use [`Key::client_ip`].
    pub fn peer_ip() -> Key {
        Key::of(Source::PeerIp)
    }

    /// The client's IP address behind trusted reverse proxies; see [`ClientIp`].
    ///
    /// Without any trusted network configured this is the same as [`Key::peer_ip`].
    pub fn client_ip() -> ClientIp {
        ClientIp::new()
    }

    /// The raw value of the first `name` header; missing or empty means the key is missing.
    ///
    /// The value need not be UTF-8.
    ///
    /// ```
    /// use http::HeaderName;
    /// use tollgate::Key;
    ///
    /// let key = Key::header(HeaderName::from_static("x-api-key"));
    /// let req = http::Request::builder().header("x-api-key", "k-123").body(()).unwrap();
    /// assert_eq!(key.extract(&req).unwrap().as_bytes(), b"k-123");
    /// ```
    pub fn header(name: HeaderName) -> Key {
        Key::of(Source::Header(name))
    }

    /// The token of an `Authorization: Bearer <token>` header, as `sha256:<hex>` of the token.
    ///
    /// The scheme is matched case-insensitively and the token trimmed; any other scheme, or an
    /// empty token, means the key is missing. The key is always the digest, never the token:
    /// tokens are credentials and must not end up in stores or logs.
    pub fn bearer() -> Key {
        Key::of(Source::Bearer)
    }

    /// A value an earlier layer (authentication, typically) put in the request extensions.
    ///
    /// The key is the value's `Display` output.
    ///
    /// ```
    /// use std::fmt;
    /// use tollgate::Key;
    ///
    /// #[derive(Clone)]
    /// struct UserId(u64);
    /// impl fmt::Display for UserId {
    ///     fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    ///         write!(f, "user-{}", self.0)
    ///     }
    /// }
    ///
    /// let key = Key::extension::<UserId>();
    /// let mut req = http::Request::new(());
    /// req.extensions_mut().insert(UserId(42));
    /// assert_eq!(key.extract(&req).unwrap().as_bytes(), b"user-42");
    /// ```
    pub fn extension<T: fmt::Display + Send + Sync + 'static>() -> Key {
        fn get<T: fmt::Display + Send + Sync + 'static>(ext: &Extensions) -> Option<KeyValue> {
            ext.get::<T>().map(|v| KeyValue::from_display(v))
        }
        Key::of(Source::Extension {
            type_name: type_name::<T>(),
            get: get::<T>,
        })
    }

    /// The value of cookie `name` in the `Cookie` header(s).
    ///
    /// Names are matched exactly (case-sensitively, as RFC 6265 says); surrounding double
    /// quotes are stripped from the value; an empty value means the key is missing.
    pub fn cookie(name: &str) -> Key {
        Key::of(Source::Cookie(name.into()))
    }

    /// A path parameter of the route that matched (`Key::path_param("user")` for
    /// `/login/{user}`), percent-decoded exactly as axum's `Path` extractor decodes it, so the
    /// key is the value the handler sees: `/login/%61lice` and `/login/alice` are one account.
    ///
    /// The parameters are known once axum's router has matched a route: `Router::layer`,
    /// `Router::route_layer` and a method router's layers all run after that. A layer wrapped
    /// around the whole router as a service (`tower::Layer::layer(limits, router)`, a
    /// `ServiceBuilder` in front of it) runs before: every request is answered `500`, and one
    /// error naming the fix is logged. A route without the parameter (or axum's fallback, the
    /// 404 of `Router::layer`) means the key is missing: the rule's
    /// [`MissingKey`](crate::MissingKey) decides. A value that is not UTF-8 once decoded (`%FF`)
    /// is refused with `400`, whatever the rule does with missing keys, as axum refuses it.
    ///
    /// ```
    /// use axum::{routing::post, Router};
    /// use tollgate::{Key, Limit, RateLimitLayer, Rule};
    ///
    /// let per_account = Rule::new("account", Limit::per_minute(5)).key(Key::path_param("user"));
    /// let app: Router = Router::new()
    ///     .route("/login/{user}", post(|| async { "welcome" }))
    ///     .route_layer(RateLimitLayer::new(per_account));
    /// ```
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn path_param(name: &str) -> Key {
        Key::of(Source::PathParam(name.into()))
    }

    /// A key computed by `f` from the request head; `None` (or an empty string) means missing.
    pub fn from_fn<F>(f: F) -> Key
    where
        F: Fn(&RequestHead<'_>) -> Option<String> + Send + Sync + 'static,
    {
        Key::of(Source::Fn(Box::new(f)))
    }

    /// The first of `keys` that is present; missing if all are (or if `keys` is empty).
    ///
    /// Keys from different sources can collide (an API key that happens to read like an IP
    /// address); wrap them in [`Key::from_fn`] with a prefix if that matters.
    pub fn first_of(keys: impl IntoIterator<Item = Key>) -> Key {
        Key::of(Source::FirstOf(keys.into_iter().collect()))
    }

    /// The key of `req`, or `None` if it is missing.
    pub fn extract<B>(&self, req: &Request<B>) -> Option<KeyValue> {
        self.extract_head(&RequestHead::of(req))
    }

    pub(crate) fn extract_head(&self, head: &RequestHead<'_>) -> Option<KeyValue> {
        self.read(head).ok().flatten()
    }

    /// The key of a request: `Ok(None)` when the request leaves it out, a [`KeyFault`] when it has
    /// none for another reason.
    #[inline]
    pub(crate) fn read(&self, head: &RequestHead<'_>) -> Result<Option<KeyValue>, KeyFault> {
        let value = match &*self.0 {
            Source::Global => return Ok(Some(KeyValue::new(b""))),
            Source::PeerIp => peer_addr(head.extensions)
                .map(|ip| client_ip::group(client_ip::normalize(ip), 32, 64)),
            Source::ClientIp(c) => c.extract(head.headers, head.extensions),
            Source::Header(name) => head.headers.get(name).map(|v| KeyValue::new(v.as_bytes())),
            Source::Bearer => bearer_token(head.headers).map(KeyValue::hashed),
            Source::Extension { get, .. } => get(head.extensions),
            Source::Cookie(name) => cookie_value(head.headers, name).map(KeyValue::new),
            #[cfg(feature = "axum")]
            Source::PathParam(name) => path_param(head.extensions, name)?,
            Source::Fn(f) => f(head).map(|s| KeyValue::new(s.as_bytes())),
            Source::FirstOf(keys) => {
                for key in keys {
                    if let Some(value) = key.read(head)? {
                        return Ok(Some(value));
                    }
                }
                None
            }
        };
        Ok(value.filter(|v| !v.is_empty()))
    }

    /// The address an IP key ([`Key::peer_ip`], [`Key::client_ip`]) stands for, without writing
    /// it as text: the network address of its group (`2001:db8:1:2::` for the key
    /// `2001:db8:1:2::/64`). `None` when the address is missing, or for a key of another kind.
    pub(crate) fn address(&self, head: &RequestHead<'_>) -> Option<IpAddr> {
        match &*self.0 {
            Source::PeerIp => Some(client_ip::group_address(
                client_ip::normalize(peer_addr(head.extensions)?),
                32,
                64,
            )),
            Source::ClientIp(c) => c.address(head.headers, head.extensions),
            _ => None,
        }
    }

    /// Whether [`address`](Self::address) reads this key.
    pub(crate) fn is_address(&self) -> bool {
        matches!(&*self.0, Source::PeerIp | Source::ClientIp(_))
    }

    /// Whether a request can be without this key, so that the rule's [`MissingKey`] applies to it.
    ///
    /// Never for [`Key::global`]; never for [`Key::peer_ip`] and [`Key::client_ip`] either, as
    /// every request a correctly set-up server passes on has a peer address (without one, the
    /// middleware answers `500` whatever the rule says, see [`Key::peer_ip`]); never for a
    /// [`Key::first_of`] that lists one of these. Every other key can be missing.
    ///
    /// [`MissingKey`]: crate::MissingKey
    ///
    /// ```
    /// use http::HeaderName;
    /// use tollgate::Key;
    ///
    /// assert!(!Key::global().can_be_missing());
    /// let api_key = Key::header(HeaderName::from_static("x-api-key"));
    /// assert!(api_key.can_be_missing());
    /// assert!(!Key::first_of([api_key, Key::peer_ip()]).can_be_missing());
    /// ```
    pub fn can_be_missing(&self) -> bool {
        match &*self.0 {
            Source::Global | Source::PeerIp | Source::ClientIp(_) => false,
            Source::FirstOf(keys) => keys.iter().all(Key::can_be_missing),
            Source::Header(_)
            | Source::Bearer
            | Source::Extension { .. }
            | Source::Cookie(_)
            | Source::Fn(_) => true,
            // A route without the parameter has none.
            #[cfg(feature = "axum")]
            Source::PathParam(_) => true,
        }
    }

    /// Whether this key is read from the peer address (alone or among others), so that its
    /// absence from every request is the server's misconfiguration.
    pub(crate) fn reads_peer(&self) -> bool {
        match &*self.0 {
            Source::PeerIp | Source::ClientIp(_) => true,
            Source::FirstOf(keys) => keys.iter().any(Key::reads_peer),
            _ => false,
        }
    }

    /// A short human-readable name, for errors, logs and default rule names.
    ///
    /// For example `peer-ip`, `header:x-api-key`, `cookie:session` or
    /// `first-of(header:x-api-key,client-ip)`.
    pub fn describe(&self) -> String {
        match &*self.0 {
            Source::Global => "global".to_owned(),
            Source::PeerIp => "peer-ip".to_owned(),
            Source::ClientIp(_) => "client-ip".to_owned(),
            Source::Header(name) => format!("header:{name}"),
            Source::Bearer => "bearer".to_owned(),
            Source::Extension { type_name, .. } => format!("extension:{type_name}"),
            Source::Cookie(name) => format!("cookie:{name}"),
            #[cfg(feature = "axum")]
            Source::PathParam(name) => format!("path-param:{name}"),
            Source::Fn(_) => "fn".to_owned(),
            Source::FirstOf(keys) => {
                let inner: Vec<String> = keys.iter().map(Key::describe).collect();
                format!("first-of({})", inner.join(","))
            }
        }
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut t = f.debug_tuple("Key");
        t.field(&self.describe());
        // The trusted networks matter when debugging a client-ip key.
        if let Source::ClientIp(c) = &*self.0 {
            t.field(c);
        }
        t.finish()
    }
}

impl From<ClientIp> for Key {
    fn from(c: ClientIp) -> Key {
        Key::of(Source::ClientIp(c))
    }
}

/// The IP address of the TCP peer, from the request extensions.
pub(crate) fn peer_addr(extensions: &Extensions) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip());
    }
    // What axum's `MockConnectInfo` layer leaves for `ConnectInfo` in tests of an app.
    #[cfg(feature = "axum")]
    if let Some(mock) = extensions.get::<axum::extract::connect_info::MockConnectInfo<SocketAddr>>()
    {
        return Some(mock.0.ip());
    }
    // What tonic's server leaves (its `TlsConnectInfo` wrapper is public only with tonic's TLS
    // features; the guide's gRPC chapter shows how to pass its address on as a `SocketAddr`).
    #[cfg(feature = "tonic")]
    if let Some(addr) = extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|info| info.remote_addr())
    {
        return Some(addr.ip());
    }
    extensions.get::<SocketAddr>().map(SocketAddr::ip)
}

/// The path parameter `name` of the route axum's router matched, as its `Path` extractor sees it.
///
/// The parameters live in the extensions under a type of axum's own, read through its public
/// `RawPathParams` extractor: it takes request parts, so the extensions are copied into empty
/// ones (only keys of this kind pay for that), and its future is ready at its first poll.
#[cfg(feature = "axum")]
fn path_param(extensions: &Extensions, name: &str) -> Result<Option<KeyValue>, KeyFault> {
    use axum::extract::rejection::RawPathParamsRejection;
    use axum::extract::{FromRequestParts, RawPathParams};
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    let mut parts = Request::new(()).into_parts().0;
    parts.extensions = extensions.clone();
    let read = std::pin::pin!(RawPathParams::from_request_parts(&mut parts, &()));
    match read.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Ok(params)) => Ok(params
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| KeyValue::new(value.as_bytes()))),
        Poll::Ready(Err(RawPathParamsRejection::InvalidUtf8InPathParam(_))) => {
            Err(KeyFault::Undecodable)
        }
        // No parameters at all: no route has matched. (A future version of axum that waited
        // here would be treated the same way: loudly, never as a missing key.)
        Poll::Ready(Err(_)) | Poll::Pending => Err(KeyFault::NoRoute),
    }
}

/// The trimmed token of the first `Authorization` header, if its scheme is `Bearer`.
fn bearer_token(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(AUTHORIZATION)?.as_bytes().trim_ascii();
    let split = value.iter().position(|b| *b == b' ' || *b == b'\t')?;
    let (scheme, token) = value.split_at(split);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = token.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// The value of the first cookie called `name` across all `Cookie` header lines.
fn cookie_value<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h [u8]> {
    headers
        .get_all(COOKIE)
        .iter()
        .flat_map(|line| line.as_bytes().split(|b| *b == b';'))
        .find_map(|pair| {
            let eq = pair.iter().position(|b| *b == b'=')?;
            let (n, v) = pair.split_at(eq);
            if n.trim_ascii() != name.as_bytes() {
                return None;
            }
            let v = v.get(1..)?.trim_ascii();
            Some(match v {
                [b'"', inner @ .., b'"'] => inner,
                _ => v,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::super::forwarded::ForwardedHeader;
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn request(headers: &[(&str, &[u8])]) -> Request<()> {
        let mut req = Request::new(());
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            let value = HeaderValue::from_bytes(value).unwrap();
            req.headers_mut().append(name, value);
        }
        req
    }

    fn with_peer(mut req: Request<()>, peer: &str) -> Request<()> {
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        req
    }

    fn bytes(key: &Key, req: &Request<()>) -> Option<Vec<u8>> {
        key.extract(req).map(|v| v.as_bytes().to_vec())
    }

    fn sha256_hex(data: &[u8]) -> Vec<u8> {
        let hex: String = Sha256::digest(data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("sha256:{hex}").into_bytes()
    }

    #[test]
    fn key_value_keeps_short_keys_and_hashes_long_ones() {
        let short = KeyValue::new(&[b'a'; MAX_KEY_LEN]);
        assert_eq!(short.as_bytes(), &[b'a'; MAX_KEY_LEN][..]);

        let long = vec![b'a'; MAX_KEY_LEN + 1];
        assert_eq!(KeyValue::new(&long).as_bytes(), sha256_hex(&long));
        assert_eq!(KeyValue::new(&long).as_bytes().len(), 71);
    }

    #[test]
    fn key_value_formats_lossily() {
        let v = KeyValue::new(b"ab\xffc");
        assert_eq!(v.to_string(), "ab\u{fffd}c");
        assert_eq!(format!("{v:?}"), "KeyValue(\"ab\u{fffd}c\")");
    }

    #[test]
    fn global_is_empty_and_never_missing() {
        assert_eq!(bytes(&Key::global(), &request(&[])), Some(Vec::new()));
    }

    #[test]
    fn peer_ip_reads_socket_addr_extension() {
        let key = Key::peer_ip();
        let req = with_peer(request(&[]), "203.0.113.7:5000");
        assert_eq!(bytes(&key, &req), Some(b"203.0.113.7".to_vec()));
        assert_eq!(bytes(&key, &request(&[])), None);
    }

    #[test]
    fn peer_ip_groups_ipv6_by_64_and_unmaps_ipv4() {
        let key = Key::peer_ip();
        let req = with_peer(request(&[]), "[2001:db8:1:2:aaaa::1]:443");
        assert_eq!(bytes(&key, &req), Some(b"2001:db8:1:2::/64".to_vec()));
        let req = with_peer(request(&[]), "[::ffff:192.0.2.9]:443");
        assert_eq!(bytes(&key, &req), Some(b"192.0.2.9".to_vec()));
    }

    #[cfg(feature = "axum")]
    #[test]
    fn peer_ip_prefers_axum_connect_info() {
        let mut req = with_peer(request(&[]), "192.0.2.1:1");
        let info: SocketAddr = "198.51.100.1:2".parse().unwrap();
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(info));
        assert_eq!(bytes(&Key::peer_ip(), &req), Some(b"198.51.100.1".to_vec()));
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn peer_ip_reads_tonic_connect_info() {
        let mut req = request(&[]);
        req.extensions_mut()
            .insert(tonic::transport::server::TcpConnectInfo {
                local_addr: None,
                remote_addr: Some("198.51.100.2:3".parse().unwrap()),
            });
        assert_eq!(bytes(&Key::peer_ip(), &req), Some(b"198.51.100.2".to_vec()));
        let client = Key::client_ip().try_trust(["10.0.0.0/8"]).unwrap();
        assert_eq!(bytes(&client.into(), &req), Some(b"198.51.100.2".to_vec()));
        // A connection without a peer address (e.g. an in-memory stream) has no key.
        let mut req = request(&[]);
        req.extensions_mut()
            .insert(tonic::transport::server::TcpConnectInfo {
                local_addr: None,
                remote_addr: None,
            });
        assert_eq!(bytes(&Key::peer_ip(), &req), None);
    }

    #[test]
    fn header_reads_first_value_raw() {
        let key = Key::header(HeaderName::from_static("x-api-key"));
        let req = request(&[("x-api-key", b"first"), ("x-api-key", b"second")]);
        assert_eq!(bytes(&key, &req), Some(b"first".to_vec()));
        assert_eq!(bytes(&key, &request(&[])), None);
        assert_eq!(bytes(&key, &request(&[("x-api-key", b"")])), None);
        let req = request(&[("x-api-key", b"k\xfe\x80y")]);
        assert_eq!(bytes(&key, &req), Some(b"k\xfe\x80y".to_vec()));
    }

    #[test]
    fn huge_header_values_are_hashed() {
        let key = Key::header(HeaderName::from_static("x-api-key"));
        let big = vec![b'x'; 1 << 20];
        let mut other = big.clone();
        if let Some(last) = other.last_mut() {
            *last = b'y';
        }
        let a = key.extract(&request(&[("x-api-key", &big)])).unwrap();
        let b = key.extract(&request(&[("x-api-key", &big)])).unwrap();
        let c = key.extract(&request(&[("x-api-key", &other)])).unwrap();
        assert_eq!(a.as_bytes().len(), 71);
        assert!(a.as_bytes().starts_with(b"sha256:"));
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn bearer_is_hashed_token() {
        let key = Key::bearer();
        let token = b"s3cr3t-token";
        for header in [
            &b"Bearer s3cr3t-token"[..],
            b"bearer   s3cr3t-token  ",
            b"BEARER\ts3cr3t-token",
        ] {
            let got = bytes(&key, &request(&[("authorization", header)])).unwrap();
            assert_eq!(got, sha256_hex(token));
            assert!(!got.windows(token.len()).any(|w| w == token));
        }
    }

    #[test]
    fn bearer_missing_cases() {
        let key = Key::bearer();
        assert_eq!(bytes(&key, &request(&[])), None);
        for header in [
            &b"Basic dXNlcjpwYXNz"[..],
            b"Bearer",
            b"Bearer    ",
            b"Bearertoken",
        ] {
            assert_eq!(bytes(&key, &request(&[("authorization", header)])), None);
        }
    }

    #[test]
    fn bearer_short_tokens_are_hashed_too() {
        let got = bytes(&Key::bearer(), &request(&[("authorization", b"Bearer a")])).unwrap();
        assert_eq!(got, sha256_hex(b"a"));
    }

    #[derive(Clone)]
    struct UserId(u64);
    impl fmt::Display for UserId {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "user:{}", self.0)
        }
    }

    #[test]
    fn extension_uses_display() {
        let key = Key::extension::<UserId>();
        let mut req = request(&[]);
        assert_eq!(bytes(&key, &req), None);
        req.extensions_mut().insert(UserId(7));
        assert_eq!(bytes(&key, &req), Some(b"user:7".to_vec()));
        assert!(key.describe().starts_with("extension:"));
        assert!(key.describe().ends_with("UserId"));
    }

    #[test]
    fn extension_long_display_is_hashed() {
        #[derive(Clone)]
        struct Long;
        impl fmt::Display for Long {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&"z".repeat(500))
            }
        }
        let mut req = request(&[]);
        req.extensions_mut().insert(Long);
        let got = bytes(&Key::extension::<Long>(), &req).unwrap();
        assert_eq!(got, sha256_hex("z".repeat(500).as_bytes()));
    }

    #[test]
    fn cookie_finds_named_value() {
        let key = Key::cookie("sid");
        let req = request(&[("cookie", b"sid2=nope; theme=dark;sid=abc; other=1")]);
        assert_eq!(bytes(&key, &req), Some(b"abc".to_vec()));
        let req = request(&[("cookie", b"a=1; b=2"), ("cookie", b"c=3; sid=xyz")]);
        assert_eq!(bytes(&key, &req), Some(b"xyz".to_vec()));
        let req = request(&[("cookie", b"sid=\"quoted\"")]);
        assert_eq!(bytes(&key, &req), Some(b"quoted".to_vec()));
        assert_eq!(
            bytes(
                &Key::cookie("sid2"),
                &request(&[("cookie", b"sid=a; sid2=b")])
            ),
            Some(b"b".to_vec())
        );
    }

    #[test]
    fn cookie_missing_cases() {
        let key = Key::cookie("sid");
        assert_eq!(bytes(&key, &request(&[])), None);
        assert_eq!(
            bytes(&key, &request(&[("cookie", b"sid2=x; xsid=y")])),
            None
        );
        assert_eq!(bytes(&key, &request(&[("cookie", b"sid=")])), None);
        assert_eq!(bytes(&key, &request(&[("cookie", b"sid=\"\"")])), None);
        assert_eq!(bytes(&key, &request(&[("cookie", b"sid; SID=x")])), None);
    }

    #[test]
    fn from_fn_sees_the_request_head() {
        let key = Key::from_fn(|head| {
            let tenant = head.uri.path().strip_prefix("/tenants/")?;
            Some(format!("{}:{tenant}", head.method))
        });
        let mut req = request(&[]);
        *req.uri_mut() = Uri::from_static("/tenants/acme");
        assert_eq!(bytes(&key, &req), Some(b"GET:acme".to_vec()));
        *req.uri_mut() = Uri::from_static("/other");
        assert_eq!(bytes(&key, &req), None);
        assert_eq!(bytes(&Key::from_fn(|_| Some(String::new())), &req), None);
    }

    #[test]
    fn first_of_takes_the_first_present_key() {
        let key = Key::first_of([
            Key::header(HeaderName::from_static("x-api-key")),
            Key::cookie("sid"),
            Key::peer_ip(),
        ]);
        let both = with_peer(
            request(&[("x-api-key", b"k"), ("cookie", b"sid=s")]),
            "192.0.2.1:1",
        );
        assert_eq!(bytes(&key, &both), Some(b"k".to_vec()));
        let cookie_only = with_peer(request(&[("cookie", b"sid=s")]), "192.0.2.1:1");
        assert_eq!(bytes(&key, &cookie_only), Some(b"s".to_vec()));
        let peer_only = with_peer(request(&[]), "192.0.2.1:1");
        assert_eq!(bytes(&key, &peer_only), Some(b"192.0.2.1".to_vec()));
        assert_eq!(bytes(&key, &request(&[])), None);
        assert_eq!(bytes(&Key::first_of([]), &peer_only), None);
    }

    #[test]
    fn describe_names_every_key() {
        let cases = [
            (Key::global(), "global"),
            (Key::peer_ip(), "peer-ip"),
            (Key::client_ip().into(), "client-ip"),
            (
                Key::header(HeaderName::from_static("x-api-key")),
                "header:x-api-key",
            ),
            (Key::bearer(), "bearer"),
            (Key::cookie("session"), "cookie:session"),
            (Key::from_fn(|_| None), "fn"),
            (
                Key::first_of([
                    Key::header(HeaderName::from_static("x-api-key")),
                    Key::client_ip().into(),
                ]),
                "first-of(header:x-api-key,client-ip)",
            ),
        ];
        for (key, name) in cases {
            assert_eq!(key.describe(), name);
            assert!(format!("{key:?}").contains(name));
        }
    }

    #[test]
    fn key_is_send_sync_static_and_cheap_to_clone() {
        fn assert_bounds<T: Send + Sync + 'static + Clone>() {}
        assert_bounds::<Key>();
        let key = Key::cookie("sid");
        let copy = key.clone();
        assert!(Arc::ptr_eq(&key.0, &copy.0));
    }

    fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
        let interesting = prop_oneof![
            Just(b','),
            Just(b';'),
            Just(b'='),
            Just(b'"'),
            Just(b'\\'),
            Just(b'['),
            Just(b']'),
            Just(b':'),
            Just(b' '),
            Just(b'.'),
            b'0'..=b'9',
            b'a'..=b'f',
            any::<u8>(),
        ];
        prop::collection::vec(interesting, 0..300)
            .prop_filter("valid header value", |v| HeaderValue::from_bytes(v).is_ok())
    }

    proptest! {
        #[test]
        fn extraction_never_panics_and_stays_bounded(
            value in header_bytes(),
            prefix in prop_oneof![Just(&b""[..]), Just(&b"Bearer "[..]), Just(&b"for="[..]), Just(&b"sid="[..])],
            peer_v6 in any::<bool>(),
        ) {
            let mut full = prefix.to_vec();
            full.extend_from_slice(&value);
            prop_assume!(HeaderValue::from_bytes(&full).is_ok());
            let mut req = request(&[
                ("x-forwarded-for", &full),
                ("x-forwarded-for", &value),
                ("forwarded", &full),
                ("x-real-ip", &full),
                ("cookie", &full),
                ("authorization", &full),
            ]);
            let peer = if peer_v6 { "[2001:db8::1]:1" } else { "10.0.0.1:1" };
            req = with_peer(req, peer);
            let ip_keys = [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded, ForwardedHeader::XRealIp]
                .into_iter()
                .map(|h| Key::client_ip().try_trust(["10.0.0.0/8", "2001:db8::/32"]).unwrap().header(h).ipv6_prefix(128).into())
                .chain([Key::peer_ip()]);
            for key in ip_keys {
                // The peer is known, so an IP key is never missing, whatever the headers say.
                let v = key.extract(&req);
                prop_assert!(v.is_some_and(|v| v.as_bytes().len() <= 71));
            }
            if let Some(v) = Key::bearer().extract(&req) {
                prop_assert_eq!(v.as_bytes().len(), 71);
            }
            for key in [Key::cookie("sid"), Key::header(HeaderName::from_static("cookie"))] {
                if let Some(v) = key.extract(&req) {
                    prop_assert!(v.as_bytes().len() <= MAX_KEY_LEN);
                }
            }
        }
    }
}
