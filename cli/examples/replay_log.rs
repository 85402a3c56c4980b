//! Writes the replay bench's log, to replay it with the binary (under callgrind, `perf stat`):
//!
//! `cargo run --release -p tollgate-cli --example replay_log -- LINES FILE.log FILE.toml`
//!
//! FILE.toml gets the bench's one-rule configuration.

use std::fs::File;
use std::io::BufWriter;

#[path = "../benches/support/log.rs"]
mod log;

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [lines, log_path, config_path] = &args[..] else {
        eprintln!("usage: replay_log LINES FILE.log FILE.toml");
        std::process::exit(2);
    };
    let lines: usize = lines.parse().expect("LINES is a number");
    let mut out = BufWriter::new(File::create(log_path)?);
    log::write_log(lines, &mut out)?;
    std::fs::write(config_path, log::CONFIG)
}
