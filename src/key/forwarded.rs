//! Reading the addresses a reverse proxy records in `Forwarded`, `X-Forwarded-For` or
//! `X-Real-IP`.
//!
//! Everything here is attacker-controlled input: parsing never panics, anything unexpected is
//! reported as unusable (`None`) so the caller falls back to the peer address, and the work is
//! bounded by [`MAX_HEADER_LEN`] and [`MAX_ENTRIES`].

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::header::FORWARDED;
use http::HeaderMap;
use smallvec::SmallVec;

/// Forwarding headers longer than this (all field lines together) are not read at all.
pub(super) const MAX_HEADER_LEN: usize = 8 * 1024;

/// At most this many entries are walked, from the right.
pub(super) const MAX_ENTRIES: usize = 64;

/// The header a trusted reverse proxy uses to pass on the address of its own peer.
///
/// Pick the one your proxy *sets* (overwrites or appends to): see [`ClientIp`](super::ClientIp)
/// for why only one header is ever read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardedHeader {
    /// `Forwarded` (RFC 7239): the `for=` parameter of each element, such as
    /// `for=192.0.2.43, for="[2001:db8:cafe::17]:4711"`.
    Forwarded,
    /// `X-Forwarded-For`: a comma-separated list of addresses, the client first and each proxy
    /// appending the address it received the request from.
    XForwardedFor,
    /// `X-Real-IP`: a single address, set by the proxy (nginx's `real_ip` convention).
    XRealIp,
}

impl ForwardedHeader {
    fn name(self) -> &'static str {
        match self {
            ForwardedHeader::Forwarded => FORWARDED.as_str(),
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            ForwardedHeader::XRealIp => "x-real-ip",
        }
    }
}

/// The rightmost entries of a forwarding header, not parsed yet.
#[derive(Debug)]
pub(super) struct Entries<'h> {
    which: ForwardedHeader,
    tail: VecDeque<&'h [u8]>,
    complete: bool,
}

impl<'h> Entries<'h> {
    /// The entries of `which` in `headers`, all field lines read in order as one list.
    ///
    /// `None` if the header is absent, empty, too long, or (for `X-Real-IP`) repeated.
    pub(super) fn read(headers: &'h HeaderMap, which: ForwardedHeader) -> Option<Self> {
        let lines = headers.get_all(which.name());
        let mut total = 0usize;
        let mut count = 0usize;
        for line in lines.iter() {
            total = total.saturating_add(line.len());
            count += 1;
        }
        if total > MAX_HEADER_LEN {
            return None;
        }
        let mut entries = Entries {
            which,
            tail: VecDeque::new(),
            complete: true,
        };
        for line in lines.iter() {
            let bytes = line.as_bytes();
            match which {
                // A single address by definition: several lines are an injected second header
                // or a misconfiguration, and neither can be trusted.
                ForwardedHeader::XRealIp if count > 1 => return None,
                ForwardedHeader::XRealIp => entries.push(bytes),
                ForwardedHeader::XForwardedFor => {
                    bytes.split(|b| *b == b',').for_each(|e| entries.push(e));
                }
                ForwardedHeader::Forwarded => {
                    SplitQuoted::new(bytes, b',').for_each(|e| entries.push(e));
                }
            }
        }
        (!entries.tail.is_empty()).then_some(entries)
    }

    fn push(&mut self, entry: &'h [u8]) {
        let entry = entry.trim_ascii();
        // HTTP lists may contain empty elements (`a, , b`); they carry no address.
        if entry.is_empty() {
            return;
        }
        self.tail.push_back(entry);
        if self.tail.len() > MAX_ENTRIES {
            self.tail.pop_front();
            self.complete = false;
        }
    }

    /// Whether the leftmost entry of the header is among the kept entries.
    pub(super) fn complete(&self) -> bool {
        self.complete
    }

    /// The entries from right to left, each an address or `None` if malformed.
    pub(super) fn right_to_left(&self) -> impl Iterator<Item = Option<IpAddr>> + '_ {
        self.tail.iter().rev().map(|e| parse_entry(self.which, e))
    }
}

fn parse_entry(which: ForwardedHeader, entry: &[u8]) -> Option<IpAddr> {
    match which {
        ForwardedHeader::XForwardedFor | ForwardedHeader::XRealIp => {
            parse_node(std::str::from_utf8(entry).ok()?)
        }
        ForwardedHeader::Forwarded => parse_forwarded_element(entry),
    }
}

/// The address in the `for=` parameter of one `Forwarded` element.
fn parse_forwarded_element(element: &[u8]) -> Option<IpAddr> {
    let mut node = None;
    for pair in SplitQuoted::new(element, b';') {
        let Some(eq) = pair.iter().position(|b| *b == b'=') else {
            continue;
        };
        let (name, value) = pair.split_at(eq);
        if !name.trim_ascii().eq_ignore_ascii_case(b"for") {
            continue;
        }
        // RFC 7239 forbids repeating a parameter; two `for=` leave us unable to tell which
        // one the proxy wrote.
        if node.is_some() {
            return None;
        }
        node = Some(value.get(1..)?.trim_ascii());
    }
    let value = unquote(node?)?;
    parse_node(std::str::from_utf8(&value).ok()?)
}

/// A token or quoted-string value, unescaped.
fn unquote(value: &[u8]) -> Option<SmallVec<[u8; 64]>> {
    let Some(inner) = value
        .strip_prefix(b"\"")
        .and_then(|v| v.strip_suffix(b"\""))
    else {
        return (!value.contains(&b'"')).then(|| SmallVec::from_slice(value));
    };
    let mut out = SmallVec::new();
    let mut escaped = false;
    for &b in inner {
        match b {
            _ if escaped => {
                out.push(b);
                escaped = false;
            }
            b'\\' => escaped = true,
            // An unescaped quote inside means the value was not one quoted-string.
            b'"' => return None,
            _ => out.push(b),
        }
    }
    (!escaped).then_some(out)
}

/// An IP address, optionally with a port: `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`,
/// `[2001:db8::1]` or `[2001:db8::1]:80`. Anything else (`unknown`, obfuscated `_names`, host
/// names) is `None`.
fn parse_node(node: &str) -> Option<IpAddr> {
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = node.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let ip = host.parse::<Ipv6Addr>().ok()?;
        let port_ok = after.is_empty() || after.strip_prefix(':').is_some_and(is_port);
        port_ok.then_some(IpAddr::V6(ip))
    } else {
        let (host, port) = node.split_once(':')?;
        let ip = host.parse::<Ipv4Addr>().ok()?;
        is_port(port).then_some(IpAddr::V4(ip))
    }
}

/// A decimal port, or an RFC 7239 obfuscated port (`_` followed by letters, digits, `.`, `_`,
/// `-`): the address is still usable when only the port is hidden.
fn is_port(port: &str) -> bool {
    if let Some(obfuscated) = port.strip_prefix('_') {
        return !obfuscated.is_empty()
            && obfuscated
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    }
    (1..=5).contains(&port.len()) && port.parse::<u16>().is_ok()
}

/// Splits on `delim` outside quoted strings, so a quoted `,` or `;` does not cut a value.
struct SplitQuoted<'a> {
    rest: Option<&'a [u8]>,
    delim: u8,
}

impl<'a> SplitQuoted<'a> {
    fn new(bytes: &'a [u8], delim: u8) -> Self {
        SplitQuoted {
            rest: Some(bytes),
            delim,
        }
    }
}

impl<'a> Iterator for SplitQuoted<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.rest?;
        let mut in_quote = false;
        let mut escaped = false;
        for (i, &b) in rest.iter().enumerate() {
            if escaped {
                escaped = false;
            } else if in_quote && b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_quote = !in_quote;
            } else if b == self.delim && !in_quote {
                let (item, tail) = rest.split_at(i);
                self.rest = tail.get(1..);
                return Some(item);
            }
        }
        self.rest = None;
        Some(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(name: &'static str, lines: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for line in lines {
            map.append(name, HeaderValue::from_str(line).unwrap());
        }
        map
    }

    fn walk(which: ForwardedHeader, lines: &[&str]) -> Option<Vec<Option<IpAddr>>> {
        let map = headers(which.name(), lines);
        Entries::read(&map, which).map(|e| e.right_to_left().collect())
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn xff_entries_are_read_right_to_left_across_lines() {
        let got = walk(
            ForwardedHeader::XForwardedFor,
            &[" 192.0.2.1 ,198.51.100.2", "203.0.113.3"],
        );
        assert_eq!(
            got,
            Some(vec![ip("203.0.113.3"), ip("198.51.100.2"), ip("192.0.2.1")])
        );
    }

    #[test]
    fn xff_accepts_ports_and_brackets() {
        let got = walk(
            ForwardedHeader::XForwardedFor,
            &["192.0.2.1:8080, [2001:db8::1]:443, [2001:db8::2], 2001:db8::3"],
        );
        assert_eq!(
            got,
            Some(vec![
                ip("2001:db8::3"),
                ip("2001:db8::2"),
                ip("2001:db8::1"),
                ip("192.0.2.1"),
            ])
        );
    }

    #[test]
    fn xff_garbage_entries_are_malformed() {
        let got = walk(
            ForwardedHeader::XForwardedFor,
            &["unknown, example.com, 1.2.3.4:99999, 1.2.3.4:, [::1]x, 300.1.1.1"],
        );
        assert_eq!(got, Some(vec![None; 6]));
    }

    #[test]
    fn empty_list_elements_are_skipped_and_an_empty_header_is_absent() {
        let got = walk(ForwardedHeader::XForwardedFor, &["192.0.2.1, ,", ""]);
        assert_eq!(got, Some(vec![ip("192.0.2.1")]));
        assert_eq!(walk(ForwardedHeader::XForwardedFor, &[" , "]), None);
        assert_eq!(walk(ForwardedHeader::XForwardedFor, &[]), None);
    }

    #[test]
    fn forwarded_reads_for_in_each_element() {
        let got = walk(
            ForwardedHeader::Forwarded,
            &[
                r#"for=192.0.2.43, For="[2001:db8:cafe::17]:4711";proto=https"#,
                r#"by=10.0.0.1;FOR="192.0.2.60:47011";host=example.com"#,
            ],
        );
        assert_eq!(
            got,
            Some(vec![
                ip("192.0.2.60"),
                ip("2001:db8:cafe::17"),
                ip("192.0.2.43"),
            ])
        );
    }

    #[test]
    fn forwarded_unusable_elements_are_malformed() {
        let got = walk(
            ForwardedHeader::Forwarded,
            &["for=unknown, for=_hidden, proto=https, for=1.2.3.4;for=5.6.7.8, for=\"1.2.3.4"],
        );
        assert_eq!(got, Some(vec![None; 5]));
    }

    #[test]
    fn forwarded_quotes_protect_delimiters_and_escapes_are_undone() {
        let got = walk(
            ForwardedHeader::Forwarded,
            &[r#"for="\192.0.2.1";by="a,b;c", for="[2001:db8::1]:_port""#],
        );
        assert_eq!(got, Some(vec![ip("2001:db8::1"), ip("192.0.2.1")]));
    }

    #[test]
    fn x_real_ip_is_a_single_address() {
        assert_eq!(
            walk(ForwardedHeader::XRealIp, &[" 192.0.2.1 "]),
            Some(vec![ip("192.0.2.1")])
        );
        assert_eq!(
            walk(ForwardedHeader::XRealIp, &["192.0.2.1, 192.0.2.2"]),
            Some(vec![None])
        );
        assert_eq!(
            walk(ForwardedHeader::XRealIp, &["192.0.2.1", "192.0.2.2"]),
            None
        );
    }

    #[test]
    fn only_the_rightmost_entries_are_kept() {
        let line = vec!["10.0.0.1"; MAX_ENTRIES + 5].join(",");
        let map = headers("x-forwarded-for", &[&line]);
        let entries = Entries::read(&map, ForwardedHeader::XForwardedFor).unwrap();
        assert_eq!(entries.right_to_left().count(), MAX_ENTRIES);
        assert!(!entries.complete());

        let line = vec!["10.0.0.1"; MAX_ENTRIES].join(",");
        let map = headers("x-forwarded-for", &[&line]);
        let entries = Entries::read(&map, ForwardedHeader::XForwardedFor).unwrap();
        assert!(entries.complete());
    }

    #[test]
    fn oversized_headers_are_not_read() {
        let half = format!("192.0.2.1,{}", " ".repeat(MAX_HEADER_LEN / 2));
        assert!(walk(ForwardedHeader::XForwardedFor, &[&half]).is_some());
        assert_eq!(walk(ForwardedHeader::XForwardedFor, &[&half, &half]), None);
    }

    #[test]
    fn non_utf8_entries_are_malformed() {
        let mut map = HeaderMap::new();
        map.append(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"192.0.2.1, 1\xff2").unwrap(),
        );
        let entries = Entries::read(&map, ForwardedHeader::XForwardedFor).unwrap();
        let got: Vec<_> = entries.right_to_left().collect();
        assert_eq!(got, vec![None, ip("192.0.2.1")]);
    }
}
