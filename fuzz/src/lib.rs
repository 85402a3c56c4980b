//! The bodies of tollgate's fuzz targets, as plain functions.
//!
//! Each `run` takes the fuzzer's bytes and panics if tollgate misbehaves on them. The cargo-fuzz
//! binaries in `fuzz_targets/` call these functions, and tollgate's own `tests/it/fuzz_corpus.rs`
//! includes this file to replay the committed corpora on every `cargo test`, without cargo-fuzz.
//!
//! Inputs are line-based text so that seeds can be written and read by hand; the format of each
//! target is described in its module.

pub mod keys;
pub mod request;

#[cfg(feature = "config")]
pub mod config;

/// The lines of `data`: split on `\n`, a trailing `\r` dropped.
fn lines(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    data.split(|b| *b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
}

/// `value` with the bytes a header value cannot hold (controls other than tab, DEL) left out.
fn header_value(value: &[u8]) -> http::HeaderValue {
    let kept: Vec<u8> = value
        .iter()
        .copied()
        .filter(|&b| (b >= 0x20 && b != 0x7f) || b == b'\t')
        .collect();
    http::HeaderValue::from_bytes(&kept).unwrap_or_else(|_| http::HeaderValue::from_static(""))
}

/// A `@name argument` setting line, as (name, argument).
fn setting(line: &[u8]) -> Option<(&[u8], &str)> {
    let rest = line.strip_prefix(b"@")?;
    let split = rest.iter().position(|b| *b == b' ').unwrap_or(rest.len());
    let (name, argument) = rest.split_at(split);
    Some((name, std::str::from_utf8(argument).ok()?.trim()))
}

/// A current-thread runtime on paused time: sleeps (queue mode) end at once.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}
