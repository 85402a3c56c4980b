//! Access logs in, one [`Entry`] (a request's method, path, peer, headers and time) per line out.
//!
//! Owns the formats — `combined` (nginx/Apache), JSON lines with a field map, CSV — and every
//! reason a line is skipped. Knows nothing of rules or counting. Logs are read as a stream: only
//! the current line is held, so memory does not grow with the log's length.

mod combined;
mod fields;
mod json;
pub mod lines;
mod table;

use std::fmt;
use std::io::BufRead;
use std::net::IpAddr;

use http::{HeaderName, HeaderValue, Method, Uri};
use smallvec::SmallVec;

use crate::time::Stamp;

pub use combined::parse_combined;
pub use fields::FieldMap;

/// One request, as the log tells it.
#[derive(Clone, Debug, Default)]
pub struct Entry {
    /// When it came.
    pub stamp: Stamp,
    /// Its method.
    pub method: Method,
    /// Its path and query, as the request line gave them.
    pub uri: Uri,
    /// The client's address, when the log has it.
    pub peer: Option<IpAddr>,
    /// The headers the log recorded (for `combined`: `Referer` and `User-Agent`).
    pub headers: Headers,
}

/// A line's headers: two without an allocation of their own, as many as the log gives.
pub type Headers = SmallVec<[(HeaderName, HeaderValue); 2]>;

/// Why a line was not replayed; counted per reason in the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Skip {
    /// The line ends before its last field (a log cut mid-write).
    Truncated,
    /// Not text: invalid UTF-8 or control bytes (a binary file, a corrupted block).
    NotText,
    /// Longer than [`lines::MAX_LINE`].
    TooLong,
    /// No timestamp, or one that cannot be read.
    BadTime,
    /// The request line's method or path cannot be read.
    BadRequest,
    /// The client address is not an IP address.
    BadPeer,
    /// Not a JSON object, or not a CSV record.
    BadRecord,
    /// Earlier than a line before it.
    Backwards,
}

impl Skip {
    /// The reason's name in the report and the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Skip::Truncated => "truncated",
            Skip::NotText => "not_text",
            Skip::TooLong => "too_long",
            Skip::BadTime => "bad_timestamp",
            Skip::BadRequest => "bad_request_line",
            Skip::BadPeer => "bad_peer",
            Skip::BadRecord => "bad_record",
            Skip::Backwards => "time_went_backwards",
        }
    }
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The formats `replay` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// nginx / Apache `combined` (and `common`, which lacks the last two fields).
    Combined,
    /// One JSON object per line; `--field` names the fields.
    Json,
    /// CSV with a header row; `--field` names the columns.
    Csv,
}

/// A stream of entries from a log.
pub trait Source {
    /// The next line's entry, or why it was skipped; `None` at the end. An error reading the file
    /// itself (not its content) ends the stream with that error.
    fn next_entry(&mut self) -> Option<std::io::Result<Result<Entry, Skip>>>;

    /// The same, read into `entry`, whose parts it replaces (on a skip, some may be replaced):
    /// a reader that can fill an entry where it lies saves moving one (hundreds of bytes) per
    /// line.
    fn next_into(&mut self, entry: &mut Entry) -> Option<std::io::Result<Result<(), Skip>>> {
        let read = self.next_entry()?;
        Some(read.map(|read| read.map(|read| *entry = read)))
    }
}

/// The reader of `format` over `input`.
pub fn open<'a>(
    format: Format,
    input: impl BufRead + 'a,
    fields: FieldMap,
) -> Box<dyn Source + 'a> {
    match format {
        Format::Combined => Box::new(combined::Reader::new(input)),
        Format::Json => Box::new(json::Reader::new(input, fields)),
        Format::Csv => Box::new(table::Reader::new(input, fields)),
    }
}

/// `1.2.3.4`, `1.2.3.4:5678`, `::1`, `[::1]:80`; `-` or empty for none.
pub(crate) fn parse_peer(text: &str) -> Result<Option<IpAddr>, Skip> {
    let text = text.trim();
    if text.is_empty() || text == "-" {
        return Ok(None);
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(Some(ip));
    }
    text.parse::<std::net::SocketAddr>()
        .map(|addr| Some(addr.ip()))
        .map_err(|_| Skip::BadPeer)
}

/// `GET /path HTTP/1.1` (or `GET /path`): the method and the path.
pub(crate) fn parse_request_line(text: &str) -> Result<(Method, Uri), Skip> {
    let mut parts = text.split(' ').filter(|p| !p.is_empty());
    let (Some(method), Some(path)) = (parts.next(), parts.next()) else {
        return Err(Skip::BadRequest);
    };
    Ok((parse_method(method)?, parse_uri(path)?))
}

/// A request target: a path (`/a?b=1`) or an absolute URI.
pub(crate) fn parse_uri(text: &str) -> Result<Uri, Skip> {
    if !text.starts_with('/') && !text.contains("://") {
        return Err(Skip::BadRequest);
    }
    Uri::try_from(text).map_err(|_| Skip::BadRequest)
}

pub(crate) fn parse_method(text: &str) -> Result<Method, Skip> {
    Method::from_bytes(text.as_bytes()).map_err(|_| Skip::BadRequest)
}
