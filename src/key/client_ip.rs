//! The client's IP address behind trusted reverse proxies, and the grouping of addresses into
//! keys.

use std::net::{IpAddr, Ipv4Addr};

use http::{Extensions, HeaderMap};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use smallvec::SmallVec;

use super::forwarded::{self, CdnHeader, ForwardedHeader};
use super::{peer_addr, KeyValue};

/// A [`Key`](super::Key) for the client's IP address, read through trusted reverse proxies.
///
/// Built by [`Key::client_ip`](super::Key::client_ip) and turned into a `Key` with `.into()`.
///
/// # How the client is found
///
/// 1. The peer address is read as for [`Key::peer_ip`](super::Key::peer_ip); without one the
///    key is missing.
/// 2. If the peer is in the networks trusted for a CDN header ([`ClientIp::trust_cdn`]), that
///    header's address is the client (the peer, if it holds none).
/// 3. Otherwise, if the peer is **not** in a trusted network, the peer is the client. Forwarding headers
///    sent by anyone but a trusted proxy are ignored: clients can write whatever they like in
///    them.
/// 4. Otherwise the configured header ([`ClientIp::header`], `X-Forwarded-For` by default) is
///    read, all its field lines in order as one list, and walked from the **right**, skipping
///    addresses in trusted networks. The first untrusted address is the client: everything to
///    its left was written by the client itself and proves nothing, so it is never read —
///    however long the header (padding it past any size changes nothing) and whatever it
///    holds there (garbage, an unclosed quote).
/// 5. Where the walk cannot go on before finding an untrusted address — the header is absent
///    or ends, an entry is not an address (`unknown`, an obfuscated `_name`, a host name,
///    non-UTF-8 bytes, an entry longer than 512 bytes), or 64 entries were examined — the
///    client is the **last address the walk reached**: the peer, or the trusted hop that
///    passed on what could not be read. A client outside the trusted networks cannot get
///    there: the walk stops at its own address, which the proxy wrote. Only a trusted party
///    can make the chain unreadable — a proxy hiding its client (which then counts as that
///    proxy), or a host inside the trusted networks (which then counts as itself). So an
///    unreadable chain never lands on a key shared by everyone, nor on a key of the client's
///    choosing.
///
/// # Only one header is read
///
/// **Configure the header your proxy sets, and only that one.** A proxy that manages, say,
/// `X-Forwarded-For` passes any `Forwarded` or `X-Real-IP` header from the client through
/// untouched, so reading one of those would let every client choose its own key and escape
/// its limit. That is why there is no fallback from one header to another.
///
/// # Keys
///
/// IPv4-mapped IPv6 addresses (`::ffff:192.0.2.1`) count as IPv4, both for the trust check and
/// in the key. IPv4 addresses are the key as text (`203.0.113.7`), or their network with
/// [`ClientIp::ipv4_prefix`] below 32 (`203.0.113.0/24`). IPv6 addresses are grouped by
/// [`ClientIp::ipv6_prefix`], /64 by default (`2001:db8:1:2::/64`): a single host usually
/// owns a whole /64 and could otherwise rotate addresses to escape its limit.
///
/// ```
/// use tollgate::Key;
///
/// let key: Key = Key::client_ip()
///     .try_trust(["10.0.0.0/8", "192.0.2.10"])
///     .unwrap()
///     .into();
///
/// let mut req = http::Request::builder()
///     .header("x-forwarded-for", "198.51.100.7, 10.1.2.3")
///     .body(())
///     .unwrap();
/// req.extensions_mut().insert("192.0.2.10:41234".parse::<std::net::SocketAddr>().unwrap());
/// assert_eq!(key.extract(&req).unwrap().as_bytes(), b"198.51.100.7");
/// ```
#[derive(Clone, Debug)]
pub struct ClientIp {
    trusted: Vec<IpNet>,
    /// CDN headers, each with the networks it is honoured from.
    cdns: Vec<(CdnHeader, Vec<IpNet>)>,
    header: ForwardedHeader,
    ipv6_prefix: u8,
    ipv4_prefix: u8,
}

impl ClientIp {
    pub(super) fn new() -> Self {
        ClientIp {
            trusted: Vec::new(),
            cdns: Vec::new(),
            header: ForwardedHeader::XForwardedFor,
            ipv6_prefix: 64,
            ipv4_prefix: 32,
        }
    }

    /// Adds trusted proxy networks: peers and forwarded addresses in them are proxies.
    pub fn trust(mut self, networks: impl IntoIterator<Item = IpNet>) -> Self {
        self.trusted.extend(networks.into_iter().map(normalize_net));
        self
    }

    /// Trusts the loopback networks, `127.0.0.0/8` and `::1/128`: a proxy on the same host.
    pub fn trust_loopback(self) -> Self {
        self.trust([
            IpNet::V4(Ipv4Net::new_assert([127, 0, 0, 0].into(), 8)),
            IpNet::V6(Ipv6Net::new_assert(std::net::Ipv6Addr::LOCALHOST, 128)),
        ])
    }

    /// Adds trusted proxy networks written as text: `"10.0.0.0/8"`, `"2001:db8::/32"`, or a
    /// bare address such as `"10.1.2.3"` for that one address.
    ///
    /// Fails on the first entry that is neither; nothing is added then.
    pub fn try_trust<I, S>(self, networks: I) -> Result<Self, ipnet::AddrParseError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let parsed = parse_networks(networks)?;
        Ok(self.trust(parsed))
    }

    /// Reads the client from a CDN's single-value header, such as `CF-Connecting-IP`, when the
    /// peer is in `networks` — the CDN's edge networks, as it publishes them (they change: load
    /// them from the CDN's list rather than copying them into code once).
    ///
    /// From any other peer the header is ignored, whoever wrote it; several CDNs may be
    /// configured, each with its own networks. A CDN header that is absent or not one address
    /// makes the edge the client (only the CDN writes it there). Requests that do not come from
    /// a CDN's networks are read as before: the forwarding header through [`trust`](Self::trust)ed
    /// proxies, or the peer.
    ///
    /// ```
    /// use tollgate::key::CdnHeader;
    /// use tollgate::Key;
    ///
    /// let key: Key = Key::client_ip()
    ///     .try_trust_cdn(CdnHeader::CfConnectingIp, ["173.245.48.0/20", "2400:cb00::/32"])
    ///     .unwrap()
    ///     .into();
    ///
    /// let from = |peer: &str| {
    ///     let mut req = http::Request::builder()
    ///         .header("cf-connecting-ip", "198.51.100.7")
    ///         .body(())
    ///         .unwrap();
    ///     req.extensions_mut().insert(peer.parse::<std::net::SocketAddr>().unwrap());
    ///     key.extract(&req).unwrap()
    /// };
    /// assert_eq!(from("173.245.48.9:443").as_bytes(), b"198.51.100.7");
    /// // Anyone else sending the header is counted as themselves.
    /// assert_eq!(from("203.0.113.66:5000").as_bytes(), b"203.0.113.66");
    /// ```
    pub fn trust_cdn(
        mut self,
        header: CdnHeader,
        networks: impl IntoIterator<Item = IpNet>,
    ) -> Self {
        let networks = networks.into_iter().map(normalize_net);
        match self.cdns.iter_mut().find(|(h, _)| *h == header) {
            Some((_, trusted)) => trusted.extend(networks),
            None => self.cdns.push((header, networks.collect())),
        }
        self
    }

    /// [`trust_cdn`](Self::trust_cdn) with networks written as text, as in
    /// [`try_trust`](Self::try_trust).
    pub fn try_trust_cdn<I, S>(
        self,
        header: CdnHeader,
        networks: I,
    ) -> Result<Self, ipnet::AddrParseError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let parsed = parse_networks(networks)?;
        Ok(self.trust_cdn(header, parsed))
    }

    /// The header the trusted proxies set; `X-Forwarded-For` by default.
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// The prefix length IPv6 clients are grouped by; 64 by default, at most 128.
    pub fn ipv6_prefix(mut self, len: u8) -> Self {
        self.ipv6_prefix = len.min(128);
        self
    }

    /// The prefix length IPv4 clients are grouped by; 32 (one address) by default, at most 32.
    pub fn ipv4_prefix(mut self, len: u8) -> Self {
        self.ipv4_prefix = len.min(32);
        self
    }

    pub(super) fn extract(&self, headers: &HeaderMap, extensions: &Extensions) -> Option<KeyValue> {
        let peer = normalize(peer_addr(extensions)?);
        let client = self.client(peer, headers);
        Some(group(client, self.ipv4_prefix, self.ipv6_prefix))
    }

    /// The address [`extract`](Self::extract) writes as the key: its group's network address.
    pub(super) fn address(&self, headers: &HeaderMap, extensions: &Extensions) -> Option<IpAddr> {
        let peer = normalize(peer_addr(extensions)?);
        let client = self.client(peer, headers);
        Some(group_address(client, self.ipv4_prefix, self.ipv6_prefix))
    }

    /// The first untrusted address from the right; where the walk cannot go on (the chain
    /// ends, an entry is not an address, or 64 entries were examined), the last address
    /// it reached. Every address reached so far was vouched for by a trusted hop, so that is
    /// the best-known client: never a key shared by everyone, never one a client outside the
    /// trusted networks can pick.
    fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if let Some((cdn, _)) = self.cdns.iter().find(|(_, nets)| contains(nets, peer)) {
            return match forwarded::single_value(headers, cdn.name()) {
                Some(Some(ip)) => normalize(ip),
                // Absent or unreadable: only the edge writes it, so the edge is the client.
                _ => peer,
            };
        }
        if !self.is_trusted(peer) {
            return peer;
        }
        let mut reached = peer;
        for entry in forwarded::right_to_left(headers, self.header) {
            let Some(ip) = entry.map(normalize) else {
                break;
            };
            if !self.is_trusted(ip) {
                return ip;
            }
            reached = ip;
        }
        reached
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        contains(&self.trusted, ip)
    }
}

fn contains(networks: &[IpNet], ip: IpAddr) -> bool {
    networks.iter().any(|net| net.contains(&ip))
}

/// Networks written as text: a CIDR network or a bare address.
fn parse_networks<I, S>(networks: I) -> Result<Vec<IpNet>, ipnet::AddrParseError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    networks
        .into_iter()
        .map(|s| {
            let s = s.as_ref().trim();
            s.parse::<IpNet>()
                .or_else(|e| s.parse::<IpAddr>().map(IpNet::from).map_err(|_| e))
        })
        .collect()
}

/// IPv4-mapped IPv6 addresses become IPv4: dual-stack sockets report IPv4 peers that way, and
/// one client must get one key (and match IPv4 trusted networks) however it connected.
pub(super) fn normalize(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Trusted networks are compared with normalized addresses, so an IPv4-mapped network
/// (`::ffff:10.0.0.0/104`) is turned into its IPv4 form.
fn normalize_net(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net {
        if let (Some(v4), Some(len)) = (
            v6.network().to_ipv4_mapped(),
            v6.prefix_len().checked_sub(96),
        ) {
            if let Ok(v4net) = Ipv4Net::new(v4, len) {
                return IpNet::V4(v4net);
            }
        }
    }
    net.trunc()
}

/// The key of `ip`: the address itself at full length, else its network (`203.0.113.0/24`,
/// `2001:db8:1:2::/64`).
pub(super) fn group(ip: IpAddr, ipv4_prefix: u8, ipv6_prefix: u8) -> KeyValue {
    match ip {
        IpAddr::V4(a) if ipv4_prefix < 32 => match Ipv4Net::new(a, ipv4_prefix) {
            Ok(net) => ipv4_text(net.network(), Some(ipv4_prefix)),
            Err(_) => ipv4_text(a, None),
        },
        IpAddr::V4(a) => ipv4_text(a, None),
        IpAddr::V6(a) if ipv6_prefix < 128 => match Ipv6Net::new(a, ipv6_prefix) {
            Ok(net) => KeyValue::from_display(&net.trunc()),
            Err(_) => KeyValue::from_display(&a),
        },
        ip => KeyValue::from_display(&ip),
    }
}

/// The address [`group`] writes: the address itself at full length, else its network's address.
pub(super) fn group_address(ip: IpAddr, ipv4_prefix: u8, ipv6_prefix: u8) -> IpAddr {
    let prefix = match ip {
        IpAddr::V4(_) => ipv4_prefix,
        IpAddr::V6(_) => ipv6_prefix,
    };
    IpNet::new(ip, prefix).map_or(ip, |net| net.network())
}

/// `203.0.113.7` or `203.0.113.0/24`, written by hand: the peer-IP key is derived on every
/// request, and the `Display` machinery costs several times more than these few digits.
fn ipv4_text(address: Ipv4Addr, prefix: Option<u8>) -> KeyValue {
    // At most `.255.255.255.255/32` (19 bytes), and each push writes three digits whatever the
    // count: 20 bytes.
    let mut text = [0u8; 20];
    let mut len = 0;
    let mut push = |separator: u8, n: u8| {
        let (digits, count) = DECIMAL[usize::from(n)];
        text[len] = separator;
        text[len + 1..len + 4].copy_from_slice(&digits);
        len += 1 + usize::from(count);
    };
    let [a, b, c, d] = address.octets();
    push(b'.', a);
    push(b'.', b);
    push(b'.', c);
    push(b'.', d);
    if let Some(prefix) = prefix {
        push(b'/', prefix);
    }
    // The first separator was only a placeholder.
    KeyValue(SmallVec::from_slice(&text[1..len]))
}

/// The decimal digits of every byte value, left-aligned, with their count.
const DECIMAL: [([u8; 3], u8); 256] = {
    let mut table = [([0u8; 3], 0u8); 256];
    let mut n = 0;
    while n < 256 {
        let (hundreds, tens, ones) = ((n / 100) as u8, (n / 10 % 10) as u8, (n % 10) as u8);
        table[n] = if n >= 100 {
            ([b'0' + hundreds, b'0' + tens, b'0' + ones], 3)
        } else if n >= 10 {
            ([b'0' + tens, b'0' + ones, 0], 2)
        } else {
            ([b'0' + ones, 0, 0], 1)
        };
        n += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;
    use http::{HeaderValue, Request};
    use std::net::SocketAddr;

    fn request(peer: Option<&str>, headers: &[(&str, &str)]) -> Request<()> {
        let mut req = Request::new(());
        for (name, value) in headers {
            let name = http::HeaderName::from_bytes(name.as_bytes()).unwrap();
            req.headers_mut()
                .append(name, HeaderValue::from_str(value).unwrap());
        }
        if let Some(peer) = peer {
            req.extensions_mut()
                .insert(peer.parse::<SocketAddr>().unwrap());
        }
        req
    }

    fn key_of(c: ClientIp, req: &Request<()>) -> Option<String> {
        Key::from(c).extract(req).map(|v| v.to_string())
    }

    proptest::proptest! {
        /// An access list compares the address the key stands for; it must be the address its
        /// text names (for a grouped key, the group's network address), as when the text was
        /// parsed back.
        #[test]
        fn group_address_is_the_address_the_key_text_names(
            v4: [u8; 4],
            v6: [u8; 16],
            ipv4_prefix in 0u8..=32,
            ipv6_prefix in 0u8..=128,
        ) {
            for ip in [IpAddr::from(v4), IpAddr::from(v6)] {
                let text = group(ip, ipv4_prefix, ipv6_prefix).to_string();
                let parsed = text
                    .parse::<IpAddr>()
                    .or_else(|_| text.parse::<IpNet>().map(|net| net.network()))
                    .unwrap();
                proptest::prop_assert_eq!(group_address(ip, ipv4_prefix, ipv6_prefix), parsed);
            }
        }

        #[test]
        fn ipv4_keys_read_like_display(octets: [u8; 4], prefix in 0u8..=32) {
            let address = Ipv4Addr::from(octets);
            proptest::prop_assert_eq!(
                group(IpAddr::V4(address), 32, 64).to_string(),
                address.to_string()
            );
            let net = Ipv4Net::new(address, prefix).unwrap().trunc();
            let expected = if prefix < 32 { net.to_string() } else { address.to_string() };
            proptest::prop_assert_eq!(group(IpAddr::V4(address), prefix, 64).to_string(), expected);
        }
    }

    fn behind_proxies() -> ClientIp {
        Key::client_ip()
            .try_trust(["10.0.0.0/8", "2001:db8:ffff::/48"])
            .unwrap()
    }

    const PROXY: &str = "10.0.0.2:443";

    #[test]
    fn untrusted_peer_is_the_client_whatever_the_headers_say() {
        let req = request(
            Some("198.51.100.9:5000"),
            &[
                ("x-forwarded-for", "1.1.1.1"),
                ("forwarded", "for=1.1.1.1"),
                ("x-real-ip", "1.1.1.1"),
            ],
        );
        for h in [
            ForwardedHeader::XForwardedFor,
            ForwardedHeader::Forwarded,
            ForwardedHeader::XRealIp,
        ] {
            assert_eq!(
                key_of(behind_proxies().header(h), &req).as_deref(),
                Some("198.51.100.9")
            );
        }
    }

    #[test]
    fn without_trusted_networks_it_is_the_peer() {
        let req = request(Some(PROXY), &[("x-forwarded-for", "1.1.1.1")]);
        assert_eq!(key_of(Key::client_ip(), &req).as_deref(), Some("10.0.0.2"));
    }

    #[test]
    fn trusted_peer_gives_rightmost_untrusted_address() {
        let req = request(Some(PROXY), &[("x-forwarded-for", "6.6.6.6, 203.0.113.7")]);
        assert_eq!(
            key_of(behind_proxies(), &req).as_deref(),
            Some("203.0.113.7")
        );
    }

    #[test]
    fn chains_of_trusted_hops_are_skipped() {
        let req = request(
            Some(PROXY),
            &[(
                "x-forwarded-for",
                "6.6.6.6, 203.0.113.7, 10.9.9.9, 2001:db8:ffff:1::1, 10.0.0.3",
            )],
        );
        assert_eq!(
            key_of(behind_proxies(), &req).as_deref(),
            Some("203.0.113.7")
        );
    }

    #[test]
    fn all_trusted_gives_the_leftmost() {
        let req = request(Some(PROXY), &[("x-forwarded-for", "10.1.1.1, 10.2.2.2")]);
        assert_eq!(key_of(behind_proxies(), &req).as_deref(), Some("10.1.1.1"));
    }

    #[test]
    fn more_trusted_hops_than_the_walk_limit_give_the_last_one_reached() {
        let mut many = vec!["10.1.1.1"; 100];
        many[100 - 64] = "10.6.4.0";
        let req = request(Some(PROXY), &[("x-forwarded-for", &many.join(","))]);
        assert_eq!(key_of(behind_proxies(), &req).as_deref(), Some("10.6.4.0"));
    }

    #[test]
    fn malformed_entry_met_in_the_walk_gives_the_hop_that_passed_it_on() {
        for (xff, hop) in [
            ("203.0.113.7, garbage", "10.0.0.2"),
            ("203.0.113.7, unknown, 10.0.0.3", "10.0.0.3"),
            ("203.0.113.7, _hidden", "10.0.0.2"),
        ] {
            let req = request(Some(PROXY), &[("x-forwarded-for", xff)]);
            assert_eq!(
                key_of(behind_proxies(), &req).as_deref(),
                Some(hop),
                "{xff}"
            );
        }
        // Garbage left of the client is never looked at.
        let req = request(Some(PROXY), &[("x-forwarded-for", "garbage, 203.0.113.7")]);
        assert_eq!(
            key_of(behind_proxies(), &req).as_deref(),
            Some("203.0.113.7")
        );
    }

    #[test]
    fn non_utf8_entry_falls_back_to_peer() {
        let mut req = request(Some(PROXY), &[]);
        req.headers_mut().insert(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"203.0.113.\xff").unwrap(),
        );
        assert_eq!(key_of(behind_proxies(), &req).as_deref(), Some("10.0.0.2"));
    }

    #[test]
    fn absent_header_falls_back_to_peer() {
        let req = request(Some(PROXY), &[("forwarded", "for=1.1.1.1")]);
        assert_eq!(key_of(behind_proxies(), &req).as_deref(), Some("10.0.0.2"));
    }

    #[test]
    fn several_xff_lines_are_one_list_in_order() {
        let req = request(
            Some(PROXY),
            &[
                ("x-forwarded-for", "6.6.6.6, 203.0.113.7"),
                ("x-forwarded-for", "10.0.0.9"),
            ],
        );
        assert_eq!(
            key_of(behind_proxies(), &req).as_deref(),
            Some("203.0.113.7")
        );
        let req = request(
            Some(PROXY),
            &[
                ("x-forwarded-for", "10.0.0.9"),
                ("x-forwarded-for", "6.6.6.6, 203.0.113.7"),
            ],
        );
        assert_eq!(
            key_of(behind_proxies(), &req).as_deref(),
            Some("203.0.113.7")
        );
    }

    #[test]
    fn forwarded_header() {
        let c = || behind_proxies().header(ForwardedHeader::Forwarded);
        let cases = [
            (
                r#"for=6.6.6.6, For="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.7"#,
                "2001:db8:cafe::/64",
            ),
            (r#"FOR="192.0.2.43:47011";by=10.0.0.1"#, "192.0.2.43"),
            ("for=unknown", "10.0.0.2"),
            ("for=_hidden, for=10.0.0.5", "10.0.0.5"),
            ("proto=https", "10.0.0.2"),
            ("for=_hidden, for=192.0.2.1", "192.0.2.1"),
        ];
        for (value, want) in cases {
            let req = request(Some(PROXY), &[("forwarded", value)]);
            assert_eq!(key_of(c(), &req).as_deref(), Some(want), "{value}");
        }
    }

    #[test]
    fn x_real_ip_header() {
        let c = || behind_proxies().header(ForwardedHeader::XRealIp);
        let req = request(Some(PROXY), &[("x-real-ip", "203.0.113.7")]);
        assert_eq!(key_of(c(), &req).as_deref(), Some("203.0.113.7"));
        let req = request(Some(PROXY), &[("x-real-ip", "203.0.113.7, 6.6.6.6")]);
        assert_eq!(key_of(c(), &req).as_deref(), Some("10.0.0.2"));
        // The line a proxy adds comes last; the client's earlier one is ignored.
        let req = request(
            Some(PROXY),
            &[("x-real-ip", "6.6.6.6"), ("x-real-ip", "203.0.113.7")],
        );
        assert_eq!(key_of(c(), &req).as_deref(), Some("203.0.113.7"));
        // The configured header only: X-Forwarded-For is not a fallback.
        let req = request(Some(PROXY), &[("x-forwarded-for", "203.0.113.7")]);
        assert_eq!(key_of(c(), &req).as_deref(), Some("10.0.0.2"));
    }

    #[test]
    fn ipv6_clients_are_grouped_by_prefix() {
        let req = request(Some(PROXY), &[("x-forwarded-for", "2001:db8:1:2:aaaa::1")]);
        assert_eq!(
            key_of(behind_proxies(), &req).as_deref(),
            Some("2001:db8:1:2::/64")
        );
        assert_eq!(
            key_of(behind_proxies().ipv6_prefix(48), &req).as_deref(),
            Some("2001:db8:1::/48")
        );
        assert_eq!(
            key_of(behind_proxies().ipv6_prefix(200), &req).as_deref(),
            Some("2001:db8:1:2:aaaa::1")
        );
    }

    #[test]
    fn ipv4_prefix_groups_networks() {
        let req = request(Some(PROXY), &[("x-forwarded-for", "203.0.113.77")]);
        assert_eq!(
            key_of(behind_proxies().ipv4_prefix(24), &req).as_deref(),
            Some("203.0.113.0/24")
        );
        assert_eq!(
            key_of(behind_proxies().ipv4_prefix(99), &req).as_deref(),
            Some("203.0.113.77")
        );
    }

    #[test]
    fn ipv4_mapped_addresses_are_ipv4() {
        // A dual-stack listener reports IPv4 peers as mapped addresses; trust must still match.
        let req = request(
            Some("[::ffff:10.0.0.2]:443"),
            &[("x-forwarded-for", "::ffff:203.0.113.7")],
        );
        assert_eq!(
            key_of(behind_proxies(), &req).as_deref(),
            Some("203.0.113.7")
        );
        let mapped_trust = Key::client_ip().try_trust(["::ffff:10.0.0.0/104"]).unwrap();
        let req = request(Some(PROXY), &[("x-forwarded-for", "203.0.113.7")]);
        assert_eq!(key_of(mapped_trust, &req).as_deref(), Some("203.0.113.7"));
    }

    #[test]
    fn an_entry_longer_than_any_address_is_unreadable() {
        // The proxy wrote no such entry: it is keyed by the hop that passed it on.
        let big = format!("{}203.0.113.7", " ".repeat(9000));
        let req = request(Some(PROXY), &[("x-forwarded-for", &big)]);
        assert_eq!(key_of(behind_proxies(), &req).as_deref(), Some("10.0.0.2"));
    }

    #[test]
    fn a_chain_padded_past_8_kib_still_gives_the_client() {
        // The client pads its own part; the proxy appends the real address at the right.
        for pad in [9 * 1024, 64 * 1024] {
            let padded = format!("{}, 203.0.113.7", "6.6.6.6,".repeat(pad / 8));
            let req = request(Some(PROXY), &[("x-forwarded-for", &padded)]);
            assert_eq!(
                key_of(behind_proxies(), &req).as_deref(),
                Some("203.0.113.7")
            );
            let spaces = format!("{}1.1.1.1, 203.0.113.7", " ".repeat(pad));
            let req = request(Some(PROXY), &[("x-forwarded-for", &spaces)]);
            assert_eq!(
                key_of(behind_proxies(), &req).as_deref(),
                Some("203.0.113.7")
            );
        }
    }

    #[test]
    fn hostile_client_parts_never_reach_the_key() {
        // Whatever the client writes left of its address, the proxy's entry at the right decides.
        let long = "x".repeat(100_000);
        let commas = ",".repeat(20_000);
        let trusted = vec!["10.1.1.1"; 5_000].join(",");
        let hostile = [
            long.as_str(),
            commas.as_str(),
            trusted.as_str(),
            "garbage",
            "unknown",
            "\"",
            "[2001:db8::1",
        ];
        for part in hostile {
            let xff = format!("{part}, 203.0.113.7");
            let req = request(Some(PROXY), &[("x-forwarded-for", &xff)]);
            assert_eq!(
                key_of(behind_proxies(), &req).as_deref(),
                Some("203.0.113.7"),
                "{}",
                &xff[..xff.len().min(40)]
            );
            // Also as a field line of its own before the proxy's.
            let req = request(
                Some(PROXY),
                &[
                    ("x-forwarded-for", part),
                    ("x-forwarded-for", "203.0.113.7"),
                ],
            );
            assert_eq!(
                key_of(behind_proxies(), &req).as_deref(),
                Some("203.0.113.7")
            );
        }
        // An unbalanced quote in the client's `Forwarded` part must not swallow the proxy's
        // element appended on the same line.
        let c = behind_proxies().header(ForwardedHeader::Forwarded);
        for part in [r#"for="1.1.1.1"#, r#"for="a\"#, "for=\"\\\"", &long] {
            let value = format!("{part}, for=203.0.113.7");
            let req = request(Some(PROXY), &[("forwarded", &value)]);
            assert_eq!(
                key_of(c.clone(), &req).as_deref(),
                Some("203.0.113.7"),
                "{}",
                &value[..value.len().min(40)]
            );
        }
    }

    #[test]
    fn an_unreadable_chain_is_keyed_by_the_hop_that_passed_it_on() {
        // A trusted proxy that hides its client (`unknown`): the client is behind that hop.
        let req = request(
            Some(PROXY),
            &[("x-forwarded-for", "203.0.113.7, unknown, 10.0.0.3")],
        );
        assert_eq!(key_of(behind_proxies(), &req).as_deref(), Some("10.0.0.3"));
        // A client inside the trusted networks that writes garbage gets its own address,
        // not the proxy's key shared with everyone, nor a key it picks.
        for garbage in ["garbage", "1.2.3.4:99999", "", "\"x", &"y".repeat(10_000)] {
            let xff = format!("{garbage}, 10.5.5.5");
            let req = request(Some(PROXY), &[("x-forwarded-for", &xff)]);
            assert_eq!(
                key_of(behind_proxies(), &req).as_deref(),
                Some("10.5.5.5"),
                "{garbage}"
            );
        }
    }

    const CLOUDFLARE: &str = "173.245.48.1:443";
    const FASTLY: &str = "151.101.0.1:443";

    fn behind_cdns() -> ClientIp {
        behind_proxies()
            .try_trust_cdn(CdnHeader::CfConnectingIp, ["173.245.48.0/20"])
            .unwrap()
            .try_trust_cdn(CdnHeader::FastlyClientIp, ["151.101.0.0/16"])
            .unwrap()
    }

    #[test]
    fn a_cdn_header_is_read_from_that_cdns_networks_only() {
        let spoofed = [
            ("cf-connecting-ip", "1.1.1.1"),
            ("fastly-client-ip", "2.2.2.2"),
            ("true-client-ip", "3.3.3.3"),
            ("fly-client-ip", "4.4.4.4"),
            ("x-forwarded-for", "5.5.5.5"),
        ];
        // From the CDN's edge, its own header and no other.
        let req = request(Some(CLOUDFLARE), &spoofed);
        assert_eq!(key_of(behind_cdns(), &req).as_deref(), Some("1.1.1.1"));
        let req = request(Some(FASTLY), &spoofed);
        assert_eq!(key_of(behind_cdns(), &req).as_deref(), Some("2.2.2.2"));
        // A client sending every header directly is counted as itself.
        let req = request(Some("203.0.113.66:5000"), &spoofed);
        assert_eq!(key_of(behind_cdns(), &req).as_deref(), Some("203.0.113.66"));
        // A trusted proxy of one's own is not a CDN: its forwarding header counts, not theirs.
        let req = request(Some(PROXY), &spoofed);
        assert_eq!(key_of(behind_cdns(), &req).as_deref(), Some("5.5.5.5"));
        // Without a CDN configured the headers mean nothing at all.
        let req = request(Some(CLOUDFLARE), &spoofed);
        assert_eq!(
            key_of(behind_proxies(), &req).as_deref(),
            Some("173.245.48.1")
        );
    }

    #[test]
    fn a_cdn_header_that_is_absent_or_unreadable_makes_the_edge_the_client() {
        for value in [None, Some("unknown"), Some("1.1.1.1, 2.2.2.2"), Some("")] {
            let headers: Vec<_> = value.map(|v| ("cf-connecting-ip", v)).into_iter().collect();
            let req = request(Some(CLOUDFLARE), &headers);
            assert_eq!(
                key_of(behind_cdns(), &req).as_deref(),
                Some("173.245.48.1"),
                "{value:?}"
            );
        }
        // IPv6 clients are grouped, mapped addresses are IPv4, as for any client.
        let req = request(Some(CLOUDFLARE), &[("cf-connecting-ip", "2001:db8:1:2::9")]);
        assert_eq!(
            key_of(behind_cdns(), &req).as_deref(),
            Some("2001:db8:1:2::/64")
        );
        let req = request(
            Some(CLOUDFLARE),
            &[("cf-connecting-ip", "::ffff:198.51.100.7")],
        );
        assert_eq!(key_of(behind_cdns(), &req).as_deref(), Some("198.51.100.7"));
    }

    #[test]
    fn try_trust_cdn_rejects_bad_networks() {
        assert!(Key::client_ip()
            .try_trust_cdn(CdnHeader::FlyClientIp, ["10.0.0.0/33"])
            .is_err());
        let fly = Key::client_ip()
            .try_trust_cdn(CdnHeader::FlyClientIp, ["10.0.0.0/8"])
            .unwrap()
            .try_trust_cdn(CdnHeader::FlyClientIp, ["192.0.2.1"])
            .unwrap();
        let req = request(Some("192.0.2.1:1"), &[("fly-client-ip", "198.51.100.7")]);
        assert_eq!(key_of(fly, &req).as_deref(), Some("198.51.100.7"));
    }

    #[test]
    fn missing_peer_is_a_missing_key() {
        let req = request(None, &[("x-forwarded-for", "203.0.113.7")]);
        assert_eq!(key_of(behind_proxies(), &req), None);
    }

    #[test]
    fn trust_loopback_and_bare_addresses() {
        let req = request(Some("127.0.0.1:1"), &[("x-forwarded-for", "203.0.113.7")]);
        let c = Key::client_ip().trust_loopback();
        assert_eq!(key_of(c.clone(), &req).as_deref(), Some("203.0.113.7"));
        let req6 = request(Some("[::1]:1"), &[("x-forwarded-for", "203.0.113.7")]);
        assert_eq!(key_of(c, &req6).as_deref(), Some("203.0.113.7"));

        let bare = Key::client_ip().try_trust(["127.0.0.1"]).unwrap();
        assert_eq!(key_of(bare.clone(), &req).as_deref(), Some("203.0.113.7"));
        let other = request(Some("127.0.0.2:1"), &[("x-forwarded-for", "203.0.113.7")]);
        assert_eq!(key_of(bare, &other).as_deref(), Some("127.0.0.2"));
    }

    #[test]
    fn try_trust_rejects_bad_networks() {
        for bad in ["10.0.0.0/33", "not-an-ip", "10.0.0/8", ""] {
            assert!(Key::client_ip().try_trust([bad]).is_err(), "{bad}");
        }
        assert!(Key::client_ip()
            .try_trust(["10.0.0.0/8", " 2001:db8::/32 ", "::1"])
            .is_ok());
    }
}
