//! The replay bench's access log, shared by the bench and by `examples/replay_log.rs` (which
//! writes it to a file for the binary, callgrind and `perf stat`): `combined` lines from 5,000
//! client addresses, 50 lines per second from 14 Nov 2023 22:00:00 UTC, each with a referer and a
//! user agent like a real log. The same seed gives the same log everywhere.

use std::io::{self, Write};

/// The bench's one rule: a token bucket per client address.
pub(crate) const CONFIG: &str = r#"
[[rules]]
name = "per-ip"
rate = 10
period = "1s"
capacity = 20
key = "peer_ip"
"#;

/// Writes the first `lines` lines of the log to `out`.
pub(crate) fn write_log(lines: usize, out: &mut impl Write) -> io::Result<()> {
    let mut rng = fastrand::Rng::with_seed(7);
    // 22:00:00 on the 14th, in seconds since the 1st of November 00:00.
    const START: usize = 13 * 86_400 + 22 * 3600;
    for i in 0..lines {
        let client = rng.u32(0..5_000);
        let at = START + i / 50;
        let (day, hour, minute, second) = (1 + at / 86_400, at / 3600 % 24, at / 60 % 60, at % 60);
        writeln!(
            out,
            "10.{}.{}.{} - - [{day:02}/Nov/2023:{hour:02}:{minute:02}:{second:02} +0000] \"GET /v1/items/{} HTTP/1.1\" 200 512 \"https://example.com/\" \"Mozilla/5.0 (X11; Linux x86_64)\"",
            client >> 16,
            (client >> 8) & 0xff,
            client & 0xff,
            rng.u32(0..1000)
        )?;
    }
    Ok(())
}

/// The first `lines` lines of the log, in memory.
#[allow(dead_code)] // The example writes to a file instead.
pub(crate) fn log_text(lines: usize) -> Vec<u8> {
    let mut text = Vec::with_capacity(lines * 160);
    write_log(lines, &mut text).expect("writing to memory");
    text
}
