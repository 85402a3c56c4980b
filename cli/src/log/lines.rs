//! Lines of at most [`MAX_LINE`] bytes from any reader, without holding more than one.

use std::io::{self, BufRead};

/// The longest line read whole; longer ones (a binary file without newlines, a corrupted block)
/// are skipped without being held in memory.
pub const MAX_LINE: usize = 64 * 1024;

/// Reads lines: in place in the reader's buffer when a line is whole there (the usual case),
/// else gathered into one reused buffer.
pub struct Lines<R> {
    input: R,
    line: Vec<u8>,
    /// Bytes of the line last returned in place, consumed when the next one is asked for.
    pending: usize,
}

/// One line, or the sign that it was too long.
pub enum Line<'a> {
    /// The line, without its `\n` (or `\r\n`).
    Text(&'a [u8]),
    /// Longer than [`MAX_LINE`]; dropped.
    TooLong,
}

impl<R: BufRead> Lines<R> {
    /// Lines of `input`.
    pub fn new(input: R) -> Self {
        Lines {
            input,
            line: Vec::with_capacity(512),
            pending: 0,
        }
    }

    /// The next line; `None` at the end of the input.
    pub fn next_line(&mut self) -> Option<io::Result<Line<'_>>> {
        self.input.consume(std::mem::take(&mut self.pending));
        if let Ok(available) = self.input.fill_buf() {
            if let Some(at) = memchr::memchr(b'\n', available) {
                if at <= MAX_LINE {
                    self.pending = at + 1;
                    let line = &self.input.fill_buf().ok()?[..at];
                    return Some(Ok(Line::Text(line.strip_suffix(b"\r").unwrap_or(line))));
                }
            }
        }
        self.line.clear();
        let mut too_long = false;
        let mut any = false;
        loop {
            let available = match self.input.fill_buf() {
                Ok(bytes) => bytes,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Some(Err(error)),
            };
            if available.is_empty() {
                break;
            }
            any = true;
            let (take, done) = match memchr::memchr(b'\n', available) {
                Some(at) => (at + 1, true),
                None => (available.len(), false),
            };
            if !too_long {
                if self.line.len() + take > MAX_LINE + 2 {
                    too_long = true;
                    self.line.clear();
                } else {
                    self.line.extend_from_slice(&available[..take]);
                }
            }
            self.input.consume(take);
            if done {
                break;
            }
        }
        if !any {
            return None;
        }
        if too_long {
            return Some(Ok(Line::TooLong));
        }
        let mut line = &self.line[..];
        if let Some(rest) = line.strip_suffix(b"\n") {
            line = rest.strip_suffix(b"\r").unwrap_or(rest);
        }
        Some(Ok(Line::Text(line)))
    }
}
