//! nginx / Apache `combined`:
//! `203.0.113.9 - alice [10/Oct/2000:13:55:36 -0700] "GET /a HTTP/1.1" 200 2326 "ref" "agent"`.

use std::io::{self, BufRead};

use std::net::{IpAddr, Ipv4Addr};

use bytes::{Bytes, BytesMut};
use http::header::{REFERER, USER_AGENT};
use http::{HeaderValue, Method, Uri};
use memchr::memchr;

use super::lines::{Line, Lines};
use super::{parse_peer, Entry, Skip, Source};
use crate::time::{parse_clf, Stamp};

pub(super) struct Reader<R> {
    lines: Lines<R>,
    recent: Recent,
}

impl<R: BufRead> Reader<R> {
    pub(super) fn new(input: R) -> Self {
        Reader {
            lines: Lines::new(input),
            recent: Recent::default(),
        }
    }
}

impl<R: BufRead> Source for Reader<R> {
    fn next_entry(&mut self) -> Option<io::Result<Result<Entry, Skip>>> {
        let mut entry = Entry::default();
        let read = self.next_into(&mut entry)?;
        Some(read.map(|read| read.map(|()| entry)))
    }

    fn next_into(&mut self, entry: &mut Entry) -> Option<io::Result<Result<(), Skip>>> {
        let recent = &mut self.recent;
        Some(self.lines.next_line()?.map(|line| match line {
            Line::Text(text) => parse(text, recent, entry),
            Line::TooLong => Err(Skip::TooLong),
        }))
    }
}

/// What the line before this one had, and where the bytes of this one's request target and
/// header values go.
///
/// Most lines repeat the line before's timestamp (many requests a second) and its `Referer` and
/// `User-Agent` values, which are then reused instead of read again (a header value is shared,
/// a reference count, instead of checked and copied). The request target and new header values
/// are copied into a shared chunk of memory, [`ARENA`] bytes at a time, rather than into an
/// allocation of their own per line: each is a counted reference to its chunk, freed with the
/// last line that points into it.
#[derive(Default)]
pub(crate) struct Recent {
    stamp: Option<([u8; CLF_LEN], Stamp)>,
    values: [Option<HeaderValue>; 2],
    arena: BytesMut,
}

/// The width of a `combined` timestamp: `10/Oct/2000:13:55:36 -0700`.
const CLF_LEN: usize = 26;

/// The size of one chunk of [`Recent`]'s shared memory.
const ARENA: usize = 64 * 1024;

impl Recent {
    /// One line, as [`parse_combined`], reusing what it shares with earlier lines.
    pub(crate) fn parse(&mut self, line: &[u8]) -> Result<Entry, Skip> {
        let mut entry = Entry::default();
        parse(line, self, &mut entry).map(|()| entry)
    }

    fn stamp(&mut self, text: &[u8; CLF_LEN]) -> Result<Stamp, Skip> {
        match self.stamp {
            Some((last, stamp)) if last == *text => Ok(stamp),
            _ => {
                let stamp = parse_clf(text).ok_or(Skip::BadTime)?;
                self.stamp = Some((*text, stamp));
                Ok(stamp)
            }
        }
    }

    /// `bytes`, copied into the current chunk (a new one when they do not fit).
    fn share(&mut self, bytes: &[u8]) -> Bytes {
        if self.arena.capacity() - self.arena.len() < bytes.len() {
            self.arena = BytesMut::with_capacity(ARENA.max(bytes.len()));
        }
        self.arena.extend_from_slice(bytes);
        self.arena.split().freeze()
    }
}

/// One `combined` (or `common`) line.
pub fn parse_combined(line: &[u8]) -> Result<Entry, Skip> {
    Recent::default().parse(line)
}

/// One line, read into `entry` (whose parts it replaces; on a skip, some may be replaced).
fn parse(line: &[u8], recent: &mut Recent, entry: &mut Entry) -> Result<(), Skip> {
    // Binary data is rarely valid UTF-8 without a NUL; every field below is checked besides.
    // Most lines are plain ASCII, which is both: then neither is looked for.
    if !plain_ascii(line) && (memchr(0, line).is_some() || std::str::from_utf8(line).is_err()) {
        return Err(Skip::NotText);
    }
    let (space, peer) = match ipv4(line) {
        // Digits and dots hold no space: the address is the whole first field.
        Some((ip, len)) if line.get(len) == Some(&b' ') => (len, Some(IpAddr::V4(ip))),
        _ => {
            let space = near(line, 0, b' ').ok_or(Skip::Truncated)?;
            (space, peer(&line[..space])?)
        }
    };
    // `- user [`: the identity and user fields are short.
    let open = near(line, space, b'[').ok_or(Skip::Truncated)? + 1;
    let stamp = match line.get(open..=open + CLF_LEN) {
        Some([text @ .., b']']) => recent.stamp(text.try_into().expect("CLF_LEN bytes"))?,
        // A line cut inside the timestamp, or a timestamp of another width.
        _ => {
            near(line, open, b']').ok_or(Skip::Truncated)?;
            return Err(Skip::BadTime);
        }
    };
    let rest = &line[open + CLF_LEN + 1..];
    let rest = rest.strip_prefix(b" \"").ok_or(Skip::Truncated)?;
    let end = quoted_end(rest).ok_or(Skip::Truncated)?;
    let request = &rest[..end];
    // Status and size: a line cut before them is truncated.
    let tail = rest[end + 1..].strip_prefix(b" ").ok_or(Skip::Truncated)?;
    let status = near(tail, 0, b' ').ok_or(Skip::Truncated)?;
    let sized = &tail[status + 1..];
    let size = near(sized, 0, b' ').unwrap_or(sized.len());
    if status == 0 || size == 0 {
        return Err(Skip::Truncated);
    }
    let (method, path) = word(request).ok_or(Skip::BadRequest)?;
    let path = word(path).map_or(path, |(path, _protocol)| path);
    let method = Method::from_bytes(method).map_err(|_| Skip::BadRequest)?;
    if !is_target(path) {
        return Err(Skip::BadRequest);
    }
    let uri = Uri::from_maybe_shared(recent.share(path)).map_err(|_| Skip::BadRequest)?;
    let headers = &mut entry.headers;
    headers.clear();
    // The quoted fields after the size, `"referer" "agent"`; an unclosed one is a cut line.
    let mut text = &sized[size..];
    for (index, name) in [REFERER, USER_AGENT].into_iter().enumerate() {
        let Some(open) = near(text, 0, b'"') else {
            break;
        };
        let inner = &text[open + 1..];
        if let Some(same) = &recent.values[index] {
            // The value of a line before, then a quote: the field is that value, whose quotes
            // are all escaped and whose last byte is no backslash (it was read as a field).
            let same_len = same.as_bytes().len();
            if inner.get(same_len) == Some(&b'"') && inner.starts_with(same.as_bytes()) {
                headers.push((name, same.clone()));
                text = &inner[same_len + 1..];
                continue;
            }
        }
        let end = quoted_end(inner).ok_or(Skip::Truncated)?;
        let value = &inner[..end];
        text = &inner[end + 1..];
        if value != b"-" {
            if let Ok(value) = HeaderValue::from_maybe_shared(recent.share(value)) {
                recent.values[index] = Some(value.clone());
                headers.push((name, value));
            }
        }
    }
    entry.stamp = stamp;
    entry.method = method;
    entry.uri = uri;
    entry.peer = peer;
    Ok(())
}

/// Whether every byte is ASCII and none is NUL (then the line is text).
fn plain_ascii(line: &[u8]) -> bool {
    // 1..=0x7f become 0..=0x7e, NUL and the rest 0x7f and above. Without an early exit, the
    // loop is a few vector instructions per 16 bytes.
    line.iter()
        .fold(0u8, |worst, &b| worst.max(b.wrapping_sub(1)))
        < 0x7f
}

/// The client address: a plain IPv4 address read here, anything else as [`parse_peer`] reads
/// it.
fn peer(text: &[u8]) -> Result<Option<IpAddr>, Skip> {
    match ipv4(text) {
        Some((ip, len)) if len == text.len() => Ok(Some(IpAddr::V4(ip))),
        // The line is known to be text.
        _ => parse_peer(std::str::from_utf8(text).map_err(|_| Skip::NotText)?),
    }
}

/// `a.b.c.d` written as the standard library reads it (one to three digits each, at most 255, no
/// leading zero) at the start of `text`, and its length; `None` for anything else, which may
/// still be an address in another form.
fn ipv4(text: &[u8]) -> Option<(Ipv4Addr, usize)> {
    let mut octets = [0u8; 4];
    let mut at = 0;
    for (i, octet) in octets.iter_mut().enumerate() {
        if i > 0 {
            if text.get(at) != Some(&b'.') {
                return None;
            }
            at += 1;
        }
        let start = at;
        let mut value = 0u32;
        while at - start < 3 {
            match text.get(at) {
                Some(&digit @ b'0'..=b'9') => value = value * 10 + u32::from(digit - b'0'),
                _ => break,
            }
            at += 1;
        }
        if at == start || value > 255 || (at - start > 1 && text[start] == b'0') {
            return None;
        }
        *octet = value as u8;
    }
    Some((Ipv4Addr::from(octets), at))
}

/// A request target as [`super::parse_uri`] accepts it before building it: a path or an
/// absolute URI.
fn is_target(path: &[u8]) -> bool {
    path.first() == Some(&b'/') || path.windows(3).any(|w| w == b"://")
}

/// The first `byte` at or after `from`, in a field known to be short: a plain loop, where
/// `memchr`'s setup costs more than it saves.
fn near(bytes: &[u8], from: usize, byte: u8) -> Option<usize> {
    let found = bytes.get(from..)?.iter().position(|&b| b == byte)?;
    Some(from + found)
}

/// The text up to the first space, and the rest after it.
fn word(text: &[u8]) -> Option<(&[u8], &[u8])> {
    let space = near(text, 0, b' ')?;
    Some((&text[..space], &text[space + 1..]))
}

/// The end of a quoted field whose opening quote is already consumed (`\"` inside is escaped).
fn quoted_end(bytes: &[u8]) -> Option<usize> {
    let mut at = 0;
    while let Some(found) = memchr(b'"', &bytes[at..]) {
        let quote = at + found;
        if quote > 0 && bytes[quote - 1] == b'\\' {
            at = quote + 1;
            continue;
        }
        return Some(quote);
    }
    None
}

#[cfg(test)]
mod reference;

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &[u8] = br#"203.0.113.9 - alice [10/Oct/2000:13:55:36 -0700] "GET /a?b=1 HTTP/1.1" 200 2326 "http://x/" "curl/8.0""#;

    #[test]
    fn reads_every_part() {
        let entry = parse_combined(LINE).unwrap();
        assert_eq!(entry.method, http::Method::GET);
        assert_eq!(entry.uri, "/a?b=1");
        assert_eq!(entry.peer, Some("203.0.113.9".parse().unwrap()));
        assert_eq!(entry.stamp.at, 971_211_336_000_000);
        assert_eq!(entry.headers.len(), 2);
        assert_eq!(entry.headers[1].1, "curl/8.0");
    }

    #[test]
    fn common_format_has_no_headers() {
        let entry = parse_combined(
            br#"::1 - - [10/Oct/2000:13:55:36 -0700] "POST /login HTTP/1.0" 401 12"#,
        )
        .unwrap();
        assert!(entry.headers.is_empty());
        assert_eq!(entry.peer, Some("::1".parse().unwrap()));
    }

    #[test]
    fn every_cut_of_a_line_is_a_counted_skip() {
        // Each prefix of a good line is skipped for a reason (or read when only the optional
        // header fields are missing), never a panic.
        for end in 0..LINE.len() {
            let cut = &LINE[..end];
            if let Ok(entry) = parse_combined(cut) {
                assert!(end > LINE.len() - 30, "read {entry:?} from {cut:?}");
            }
        }
        assert_eq!(
            parse_combined(&LINE[..60]).unwrap_err(),
            Skip::Truncated,
            "cut inside the request line"
        );
    }

    #[test]
    fn what_is_reused_from_the_line_before_reads_as_a_fresh_line_would() {
        let lines: [&[u8]; 5] = [
            LINE,
            br#"203.0.113.9 - - [10/Oct/2000:13:55:36 -0700] "GET /b HTTP/1.1" 200 1 "-" "curl/8.0""#,
            br#"203.0.113.9 - - [10/Oct/2000:13:55:37 -0700] "GET /c HTTP/1.1" 200 1 "http://y/" "wget""#,
            br#"203.0.113.9 - - [10/Oct/2000:13:55:3x -0700] "GET /d HTTP/1.1" 200 1 "http://y/" "wget""#,
            br#"203.0.113.9 - - [10/Oct/2000:13:55:37 -0700"#,
        ];
        let mut recent = Recent::default();
        for line in lines {
            let (reused, fresh) = (recent.parse(line), parse_combined(line));
            assert_eq!(format!("{reused:?}"), format!("{fresh:?}"));
        }
        assert_eq!(recent.parse(lines[3]).unwrap_err(), Skip::BadTime);
        assert_eq!(recent.parse(lines[4]).unwrap_err(), Skip::Truncated);
        assert_eq!(
            recent.parse(lines[2]).unwrap().stamp.at - recent.parse(LINE).unwrap().stamp.at,
            1_000_000
        );
    }

    #[test]
    fn garbage_is_not_text() {
        assert_eq!(
            parse_combined(b"\x00\x01\xff\xfe").unwrap_err(),
            Skip::NotText
        );
        assert_eq!(
            parse_combined(b"192.0.2.1 - - [x] \"GET / HTTP/1.1\" 200 1").unwrap_err(),
            Skip::BadTime
        );
    }

    #[test]
    fn reads_every_line_as_the_reference_reader_does() {
        // Good lines of several shapes, then each with a few random bytes replaced, inserted or
        // cut: the reader (with what it reuses from line to line) and the reference agree on
        // every entry and every reason to skip.
        let shapes: [&[u8]; 9] = [
            LINE,
            br#"10.0.19.136 - - [14/Nov/2023:22:00:00 +0000] "GET /v1/items/7 HTTP/1.1" 200 512 "https://example.com/" "Mozilla/5.0 (X11; Linux x86_64)""#,
            br#"2001:db8::1 - - [14/Nov/2023:22:00:00 +0000] "POST /login HTTP/2.0" 401 12 "-" "curl/8.0""#,
            br#"[::1]:8080 - bob [14/Nov/2023:22:00:01 +0100] "PUT http://a.example/x?y=1 HTTP/1.1" 201 0 "" "a \"quoted\" agent\"""#,
            br#"192.0.2.1:443 - - [14/Nov/2023:22:00:01 -0700] "GET / HTTP/1.0" 200 1"#,
            br#"- - - [14/Nov/2023:22:00:02 +0000] "DELETE /a%20b?q=e HTTP/1.1" 204 - "http://x/e" "ua""#,
            br#"255.255.255.255 - - [14/Nov/2023:22:00:02 +0000] "OPTIONS * HTTP/1.1" 200 1 "-" "-""#,
            br#"010.1.2.3 - - [14/Nov/2023:22:00:02 +0000] "GET /a HTTP/1.1" 200 1 "r" "u" "extra""#,
            b"10.0.0.1 - - [14/Nov/2023:22:00:03 +0000] \"GET /caf\xc3\xa9 HTTP/1.1\" 200 1 \"http://x/\xc3\xa9\" \"\xc3\xa9\"",
        ];
        let alphabet: &[u8] = b" \"[]\\-./:0123456789aZ%?*\t\x00\x01\x7f\x80\xc3\xa9\xff";
        let mut rng = fastrand::Rng::with_seed(28);
        let mut recent = Recent::default();
        // Read into one entry, again and again, as a replay reads.
        let mut entry = Entry::default();
        let mut reasons = std::collections::BTreeSet::new();
        let mut shape = 0;
        for _ in 0..60_000 {
            // Mostly the shape of the line before, so header values repeat (or nearly).
            if rng.u8(0..3) == 0 {
                shape = rng.usize(0..shapes.len());
            }
            let mut line = shapes[shape].to_vec();
            for _ in 0..rng.usize(0..4) {
                let at = rng.usize(0..=line.len());
                let byte = alphabet[rng.usize(0..alphabet.len())];
                match rng.u8(0..4) {
                    0 if at < line.len() => line[at] = byte,
                    1 => line.insert(at, byte),
                    2 if at < line.len() => {
                        line.remove(at);
                    }
                    _ => line.truncate(at),
                }
            }
            let read = parse(&line, &mut recent, &mut entry).map(|()| format!("{entry:?}"));
            let expected = reference::parse(&line).map(|entry| format!("{entry:?}"));
            assert_eq!(read, expected, "{}", String::from_utf8_lossy(&line));
            reasons.insert(read.map(|_| "read").unwrap_or_else(Skip::name));
        }
        // Every reason the format can give came up.
        assert_eq!(
            reasons.into_iter().collect::<Vec<_>>(),
            [
                "bad_peer",
                "bad_request_line",
                "bad_timestamp",
                "not_text",
                "read",
                "truncated"
            ]
        );
    }

    #[test]
    fn plain_ipv4_addresses_read_as_the_standard_library_reads_them() {
        for text in [
            "0.0.0.0",
            "1.2.3.4",
            "255.255.255.255",
            "256.1.1.1",
            "01.2.3.4",
            "1.2.3",
            "1.2.3.4.5",
            "1..3.4",
            "1.2.3.4 ",
            "1.2.3.4:80",
            "1.2.3.0004",
            "a.b.c.d",
            "",
            "1.2.3.40",
        ] {
            let std = text.parse::<Ipv4Addr>().ok();
            match ipv4(text.as_bytes()).filter(|(_, len)| *len == text.len()) {
                Some((ip, _)) => assert_eq!(Some(ip), std, "{text}"),
                // Not read here: left to the standard library, whose answer stands.
                None => assert_eq!(std, None, "{text} is an address the fast path should read"),
            }
        }
    }
}
