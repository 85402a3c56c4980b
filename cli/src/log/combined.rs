//! nginx / Apache `combined`:
//! `203.0.113.9 - alice [10/Oct/2000:13:55:36 -0700] "GET /a HTTP/1.1" 200 2326 "ref" "agent"`.

use std::io::{self, BufRead};

use http::header::{REFERER, USER_AGENT};
use http::HeaderValue;
use memchr::memchr;

use super::lines::{Line, Lines};
use super::{parse_method, parse_peer, parse_uri, Entry, Skip, Source};
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
        let recent = &mut self.recent;
        Some(self.lines.next_line()?.map(|line| match line {
            Line::Text(text) => recent.parse(text),
            Line::TooLong => Err(Skip::TooLong),
        }))
    }
}

/// What the line before this one had: most lines repeat its timestamp (many requests a second)
/// and its `Referer` and `User-Agent` values, which are then reused instead of read again (a
/// header value is shared, a reference count, instead of checked and copied).
#[derive(Default)]
pub struct Recent {
    stamp: Option<([u8; CLF_LEN], Stamp)>,
    values: [Option<HeaderValue>; 2],
}

/// The width of a `combined` timestamp: `10/Oct/2000:13:55:36 -0700`.
const CLF_LEN: usize = 26;

impl Recent {
    /// One line, as [`parse_combined`], reusing what it shares with earlier lines.
    pub fn parse(&mut self, line: &[u8]) -> Result<Entry, Skip> {
        parse(line, self)
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
}

/// One `combined` (or `common`) line.
pub fn parse_combined(line: &[u8]) -> Result<Entry, Skip> {
    parse(line, &mut Recent::default())
}

fn parse(line: &[u8], recent: &mut Recent) -> Result<Entry, Skip> {
    // Binary data is rarely valid UTF-8 without a NUL; every field below is checked besides.
    if memchr(0, line).is_some() {
        return Err(Skip::NotText);
    }
    let line = std::str::from_utf8(line).map_err(|_| Skip::NotText)?;
    let bytes = line.as_bytes();
    let space = near(bytes, 0, b' ').ok_or(Skip::Truncated)?;
    let peer = parse_peer(&line[..space])?;
    // `- user [`: the identity and user fields are short.
    let open = near(bytes, space, b'[').ok_or(Skip::Truncated)? + 1;
    let stamp = match bytes.get(open..=open + CLF_LEN) {
        Some([text @ .., b']']) => recent.stamp(text.try_into().expect("CLF_LEN bytes"))?,
        // A line cut inside the timestamp, or a timestamp of another width.
        _ => {
            near(bytes, open, b']').ok_or(Skip::Truncated)?;
            return Err(Skip::BadTime);
        }
    };
    let rest = &line[open + CLF_LEN + 1..];
    let rest = rest.strip_prefix(" \"").ok_or(Skip::Truncated)?;
    let end = quoted_end(rest).ok_or(Skip::Truncated)?;
    let request = &rest[..end];
    // Status and size: a line cut before them is truncated.
    let tail = rest[end + 1..].strip_prefix(' ').ok_or(Skip::Truncated)?;
    let status = near(tail.as_bytes(), 0, b' ').ok_or(Skip::Truncated)?;
    let sized = &tail[status + 1..];
    let size = near(sized.as_bytes(), 0, b' ').unwrap_or(sized.len());
    if status == 0 || size == 0 {
        return Err(Skip::Truncated);
    }
    let (method, path) = word(request).ok_or(Skip::BadRequest)?;
    let (path, _protocol) = word(path).unwrap_or((path, ""));
    let method = parse_method(method)?;
    let uri = parse_uri(path)?;
    let mut headers = Vec::new();
    let mut quoted = quoted_fields(&sized[size..]);
    for (name, last) in [REFERER, USER_AGENT].into_iter().zip(&mut recent.values) {
        match quoted.next() {
            Some(Ok(value)) if value != "-" => match last {
                Some(same) if same.as_bytes() == value.as_bytes() => {
                    headers.push((name, same.clone()));
                }
                _ => {
                    if let Ok(value) = HeaderValue::from_str(value) {
                        *last = Some(value.clone());
                        headers.push((name, value));
                    }
                }
            },
            Some(Err(())) => return Err(Skip::Truncated),
            _ => {}
        }
    }
    Ok(Entry {
        stamp,
        method,
        uri,
        peer,
        headers,
    })
}

/// The first `byte` at or after `from`, in a field known to be short: a plain loop, where
/// `memchr`'s setup costs more than it saves.
fn near(bytes: &[u8], from: usize, byte: u8) -> Option<usize> {
    let found = bytes.get(from..)?.iter().position(|&b| b == byte)?;
    Some(from + found)
}

/// The text up to the first space, and the rest after it.
fn word(text: &str) -> Option<(&str, &str)> {
    let space = near(text.as_bytes(), 0, b' ')?;
    Some((&text[..space], &text[space + 1..]))
}

/// The end of a quoted field whose opening quote is already consumed (`\"` inside is escaped).
fn quoted_end(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
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

/// The quoted fields after the size (`"referer" "agent"`); an unclosed one is an error.
fn quoted_fields(mut text: &str) -> impl Iterator<Item = Result<&str, ()>> {
    std::iter::from_fn(move || {
        let open = near(text.as_bytes(), 0, b'"')?;
        let inner = &text[open + 1..];
        match quoted_end(inner) {
            Some(end) => {
                text = &inner[end + 1..];
                Some(Ok(&inner[..end]))
            }
            None => {
                text = "";
                Some(Err(()))
            }
        }
    })
}

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
}
