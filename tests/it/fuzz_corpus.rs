//! The fuzzers' smoke run: every committed corpus file (`fuzz/corpus/<target>/`) through the
//! fuzz targets' own functions (`fuzz/src/`), without cargo-fuzz or a nightly toolchain. Inputs
//! that once crashed a target are part of the corpora, so this is also their regression test.

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

#[allow(unreachable_pub)]
#[path = "../../fuzz/src/lib.rs"]
mod fuzz;

fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

/// Runs every file of `target`'s corpus, and names the files that panicked.
fn replay(target: &str, run: fn(&[u8])) {
    let files = corpus(target);
    assert!(files.len() >= 10, "{target}: only {} seeds", files.len());
    let failed: Vec<String> = files
        .iter()
        .filter(|path| {
            let data = fs::read(path).unwrap();
            panic::catch_unwind(AssertUnwindSafe(|| run(&data))).is_err()
        })
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(
        failed.is_empty(),
        "{target}: {} of {} inputs panicked: {failed:?}",
        failed.len(),
        files.len()
    );
}

#[test]
fn keys_corpus() {
    replay("keys", fuzz::keys::run);
}

#[test]
fn request_corpus() {
    replay("request", fuzz::request::run);
}

#[cfg(feature = "config")]
#[test]
fn config_corpus() {
    replay("config", fuzz::config::run);
}
