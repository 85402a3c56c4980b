//! The `combined` reader as it was before it read bytes in place (one `http::Uri` and one
//! `Vec` allocated per line, the line checked as UTF-8 first): the reference the tests hold the
//! faster reader to, line by line.

use http::header::{REFERER, USER_AGENT};
use http::HeaderValue;
use memchr::memchr;

use super::super::{parse_method, parse_peer, parse_uri, Entry, Skip};
use crate::time::parse_clf;

const CLF_LEN: usize = 26;

pub(super) fn parse(line: &[u8]) -> Result<Entry, Skip> {
    if memchr(0, line).is_some() {
        return Err(Skip::NotText);
    }
    let line = std::str::from_utf8(line).map_err(|_| Skip::NotText)?;
    let bytes = line.as_bytes();
    let space = near(bytes, 0, b' ').ok_or(Skip::Truncated)?;
    let peer = parse_peer(&line[..space])?;
    let open = near(bytes, space, b'[').ok_or(Skip::Truncated)? + 1;
    let stamp = match bytes.get(open..=open + CLF_LEN) {
        Some([text @ .., b']']) => parse_clf(text).ok_or(Skip::BadTime)?,
        _ => {
            near(bytes, open, b']').ok_or(Skip::Truncated)?;
            return Err(Skip::BadTime);
        }
    };
    let rest = &line[open + CLF_LEN + 1..];
    let rest = rest.strip_prefix(" \"").ok_or(Skip::Truncated)?;
    let end = quoted_end(rest).ok_or(Skip::Truncated)?;
    let request = &rest[..end];
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
    let mut headers = super::super::Headers::new();
    let mut quoted = quoted_fields(&sized[size..]);
    for name in [REFERER, USER_AGENT] {
        match quoted.next() {
            Some(Ok(value)) if value != "-" => {
                if let Ok(value) = HeaderValue::from_str(value) {
                    headers.push((name, value));
                }
            }
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

fn near(bytes: &[u8], from: usize, byte: u8) -> Option<usize> {
    let found = bytes.get(from..)?.iter().position(|&b| b == byte)?;
    Some(from + found)
}

fn word(text: &str) -> Option<(&str, &str)> {
    let space = near(text.as_bytes(), 0, b' ')?;
    Some((&text[..space], &text[space + 1..]))
}

/// The end of a quoted field (its opening quote consumed): the combined format's own reading.
fn quoted_end(text: &str) -> Option<usize> {
    super::quoted_end(text.as_bytes())
}

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
