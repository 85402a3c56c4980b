//! Reading the addresses a reverse proxy records in `Forwarded`, `X-Forwarded-For` or
//! `X-Real-IP`, and the single address a CDN's edge puts in its own header
//! (`CF-Connecting-IP`, ...).
//!
//! Everything here is attacker-controlled input: parsing never panics, and an entry that is
//! not an address is reported as such (`None`) for the caller to decide. The header is read
//! from the **right**, where the trusted proxies write, and only as far as the caller walks:
//! whatever a client writes further left (kilobytes of padding, an unclosed quote, garbage)
//! is never scanned. The work is bounded by the number of entries examined ([`MAX_ENTRIES`],
//! empty ones included) and the length of each ([`MAX_ENTRY_LEN`]), not by the header's size.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::header::{ValueIter, FORWARDED};
use http::{HeaderMap, HeaderValue};
use smallvec::SmallVec;

/// At most this many entries are examined, from the right.
pub(super) const MAX_ENTRIES: usize = 64;

/// An entry longer than this (bytes, surrounding spaces included) is not an address: a
/// `Forwarded` element with every parameter and a long host name stays well below it.
pub(super) const MAX_ENTRY_LEN: usize = 512;

/// The header a trusted reverse proxy uses to pass on the address of its own peer.
///
/// Pick the one your proxy *sets* (overwrites or appends to): see [`ClientIp`](crate::ClientIp)
/// for why only one header is ever read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardedHeader {
    /// `Forwarded` (RFC 7239): the `for=` parameter of each element, such as
    /// `for=192.0.2.43, for="[2001:db8:cafe::17]:4711"`.
    Forwarded,
    /// `X-Forwarded-For`: a comma-separated list of addresses, the client first and each proxy
    /// appending the address it received the request from.
    XForwardedFor,
    /// `X-Real-IP`: a single address, set by the proxy (nginx's `real_ip` convention). If
    /// the field is repeated, the last line is the one the proxy added.
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

/// A single-value header in which a CDN or hosting platform passes on the address of the client
/// that reached its edge.
///
/// These headers are only as good as the peer that sends them: a client can write them as
/// easily as anyone. [`ClientIp::trust_cdn`](crate::ClientIp::trust_cdn) reads one only from a
/// peer inside the networks you trust *for that header* — the CDN's published edge networks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CdnHeader {
    /// `CF-Connecting-IP`, set by Cloudflare.
    CfConnectingIp,
    /// `True-Client-IP`, set by Akamai (and Cloudflare Enterprise, when enabled).
    TrueClientIp,
    /// `Fastly-Client-IP`, set by Fastly.
    FastlyClientIp,
    /// `Fly-Client-IP`, set by Fly.io's proxy.
    FlyClientIp,
}

impl CdnHeader {
    /// The header's name, lowercase.
    pub fn name(self) -> &'static str {
        match self {
            CdnHeader::CfConnectingIp => "cf-connecting-ip",
            CdnHeader::TrueClientIp => "true-client-ip",
            CdnHeader::FastlyClientIp => "fastly-client-ip",
            CdnHeader::FlyClientIp => "fly-client-ip",
        }
    }
}

/// The address in the single-value header `name`: `None` if absent or empty, `Some(None)` if it
/// holds anything but one address. If the field is repeated, its last line counts (the one an
/// edge that appends rather than replaces added); it is read whole, at most [`MAX_ENTRY_LEN`]
/// bytes of it.
pub(super) fn single_value(headers: &HeaderMap, name: &str) -> Option<Option<IpAddr>> {
    let line = headers.get_all(name).iter().next_back()?.as_bytes();
    let value = line.trim_ascii();
    if value.is_empty() {
        return None;
    }
    if line.len() > MAX_ENTRY_LEN {
        return Some(None);
    }
    Some(parse_entry(ForwardedHeader::XRealIp, value))
}

/// The entries of a forwarding header from right to left, all its field lines read as one
/// list: each an address, or `None` for an entry that is not one (malformed, too long, not
/// UTF-8). Ends after the leftmost entry or after [`MAX_ENTRIES`] examined, whichever is first.
pub(super) fn right_to_left(
    headers: &HeaderMap,
    which: ForwardedHeader,
) -> impl Iterator<Item = Option<IpAddr>> + '_ {
    let mut lines = headers.get_all(which.name()).iter();
    // `X-Real-IP` holds one address: only its last line, the one the proxy added, counts.
    let only_last = which == ForwardedHeader::XRealIp;
    let first = lines.next_back();
    RightToLeft {
        which,
        lines: if only_last { None } else { Some(lines) },
        line: first.map(HeaderValue::as_bytes),
        examined: 0,
    }
}

struct RightToLeft<'h> {
    which: ForwardedHeader,
    /// The field lines left of `line`, read from the back.
    lines: Option<ValueIter<'h, HeaderValue>>,
    /// What is left of the current line, not read yet.
    line: Option<&'h [u8]>,
    examined: usize,
}

impl Iterator for RightToLeft<'_> {
    type Item = Option<IpAddr>;

    fn next(&mut self) -> Option<Option<IpAddr>> {
        while self.examined < MAX_ENTRIES {
            let Some(line) = self.line else {
                self.line = self.lines.as_mut()?.next_back().map(HeaderValue::as_bytes);
                // A line's end starts a new entry, unless there is no line left.
                self.line?;
                continue;
            };
            self.examined += 1;
            let (entry, rest) = match split_last(line, self.which) {
                Some(split) => split,
                // Too long to be an address: report it, and read no further left.
                None => {
                    self.line = None;
                    self.lines = None;
                    return Some(None);
                }
            };
            self.line = rest;
            let entry = entry.trim_ascii();
            // HTTP lists may contain empty elements (`a, , b`); they carry no address.
            if !entry.is_empty() {
                return Some(parse_entry(self.which, entry));
            }
        }
        None
    }
}

/// The last entry of `line` and what is left of it (`None` if the entry was the first), or
/// `None` if the entry is longer than [`MAX_ENTRY_LEN`].
///
/// `X-Real-IP` is one entry whatever it holds. In `Forwarded`, a `,` inside a quoted string
/// does not end an element; read from the right, where the proxies write well-formed
/// elements, an unclosed quote further left (the client's part) cannot swallow them.
fn split_last(line: &[u8], which: ForwardedHeader) -> Option<(&[u8], Option<&[u8]>)> {
    let window = line.len().saturating_sub(MAX_ENTRY_LEN + 1);
    let mut in_quote = false;
    for i in (window..line.len()).rev() {
        match line[i] {
            b'"' if which == ForwardedHeader::Forwarded && !(in_quote && escaped(&line[..i])) => {
                in_quote = !in_quote;
            }
            b',' if which != ForwardedHeader::XRealIp && !in_quote => {
                return Some((&line[i + 1..], Some(&line[..i])));
            }
            _ => {}
        }
    }
    (line.len() <= MAX_ENTRY_LEN).then_some((line, None))
}

/// Whether the byte after `before` is escaped: an odd run of backslashes precedes it. Each
/// backslash belongs to the run of one quote at most, so the scan stays linear.
fn escaped(before: &[u8]) -> bool {
    let run = before
        .iter()
        .rev()
        .take(MAX_ENTRY_LEN)
        .take_while(|b| **b == b'\\')
        .count();
    run % 2 == 1
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
        let entries: Vec<_> = right_to_left(&map, which).collect();
        (!entries.is_empty()).then_some(entries)
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
            &["for=\"1.2.3.4, for=unknown, for=_hidden, proto=https, for=1.2.3.4;for=5.6.7.8"],
        );
        assert_eq!(got, Some(vec![None; 5]));
        // Read from the right, an unclosed quote swallows what is left of it: one entry.
        let got = walk(ForwardedHeader::Forwarded, &["for=1.2.3.4, for=\"1.2.3.4"]);
        assert_eq!(got, Some(vec![None]));
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
    fn x_real_ip_is_a_single_address_the_last_line_wins() {
        assert_eq!(
            walk(ForwardedHeader::XRealIp, &[" 192.0.2.1 "]),
            Some(vec![ip("192.0.2.1")])
        );
        assert_eq!(
            walk(ForwardedHeader::XRealIp, &["192.0.2.1, 192.0.2.2"]),
            Some(vec![None])
        );
        // A proxy that adds its own line after the client's: the last one is the proxy's.
        assert_eq!(
            walk(ForwardedHeader::XRealIp, &["192.0.2.1", "192.0.2.2"]),
            Some(vec![ip("192.0.2.2")])
        );
    }

    #[test]
    fn at_most_max_entries_are_examined_empty_ones_included() {
        let line = vec!["10.0.0.1"; MAX_ENTRIES + 5].join(",");
        let got = walk(ForwardedHeader::XForwardedFor, &[&line]).unwrap();
        assert_eq!(got.len(), MAX_ENTRIES);
        let line = format!("10.0.0.1{}", ",".repeat(100_000));
        assert_eq!(walk(ForwardedHeader::XForwardedFor, &[&line]), None);
        let lines = vec![" "; 1000];
        assert_eq!(walk(ForwardedHeader::XForwardedFor, &lines), None);
    }

    #[test]
    fn only_the_right_end_is_read_whatever_the_length() {
        let long = format!("{}, 192.0.2.1", "9".repeat(1 << 20));
        assert_eq!(
            walk(ForwardedHeader::XForwardedFor, &[&long]),
            Some(vec![ip("192.0.2.1"), None])
        );
        // An entry longer than an address could be is not one, and ends the walk.
        let padded = format!("192.0.2.9, {}192.0.2.1", " ".repeat(MAX_ENTRY_LEN));
        assert_eq!(
            walk(ForwardedHeader::XForwardedFor, &[&padded]),
            Some(vec![None])
        );
        let fits = format!("192.0.2.9, {}192.0.2.1", " ".repeat(MAX_ENTRY_LEN - 20));
        assert_eq!(
            walk(ForwardedHeader::XForwardedFor, &[&fits]),
            Some(vec![ip("192.0.2.1"), ip("192.0.2.9")])
        );
    }

    #[test]
    fn forwarded_is_split_from_the_right_around_quotes() {
        // An unclosed quote in the client's part cannot swallow the proxy's element.
        let got = walk(
            ForwardedHeader::Forwarded,
            &[r#"for="192.0.2.1, for=192.0.2.2, for="[2001:db8::1]:80";by="a,\",b""#],
        );
        assert_eq!(got, Some(vec![ip("2001:db8::1"), ip("192.0.2.2"), None]));
    }

    #[test]
    fn a_cdn_header_is_one_address_from_its_last_line() {
        let read = |lines: &[&str]| {
            single_value(
                &headers("cf-connecting-ip", lines),
                CdnHeader::CfConnectingIp.name(),
            )
        };
        assert_eq!(read(&[" 192.0.2.1 "]), Some(ip("192.0.2.1")));
        assert_eq!(read(&["2001:db8::1"]), Some(ip("2001:db8::1")));
        assert_eq!(read(&["6.6.6.6", "192.0.2.1"]), Some(ip("192.0.2.1")));
        assert_eq!(read(&["192.0.2.1, 6.6.6.6"]), Some(None));
        assert_eq!(read(&["unknown"]), Some(None));
        assert_eq!(read(&[&"9".repeat(10_000)]), Some(None));
        assert_eq!(read(&[" "]), None);
        assert_eq!(read(&[]), None);
    }

    #[test]
    fn non_utf8_entries_are_malformed() {
        let mut map = HeaderMap::new();
        map.append(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"192.0.2.1, 1\xff2").unwrap(),
        );
        let got: Vec<_> = right_to_left(&map, ForwardedHeader::XForwardedFor).collect();
        assert_eq!(got, vec![None, ip("192.0.2.1")]);
    }
}
