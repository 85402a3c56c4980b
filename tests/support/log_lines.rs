//! The layer's log lines, captured in memory: for the tests that count what it logs.

#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex};

/// Formatted log lines, shared by the subscriber that writes them and the test that reads them.
#[derive(Clone, Default)]
pub struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    /// A subscriber that writes every event at `level` or above here, without colours.
    pub fn subscriber(&self, level: tracing::Level) -> impl tracing::Subscriber + Send + Sync {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish()
    }

    /// Installs [`subscriber`](Self::subscriber) on this thread until the guard is dropped.
    pub fn listen(&self, level: tracing::Level) -> tracing::subscriber::DefaultGuard {
        tracing::subscriber::set_default(self.subscriber(level))
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    /// The warning lines written so far.
    pub fn warnings(&self) -> Vec<String> {
        warnings(&self.text())
    }

    /// The warning lines since the last call.
    pub fn take_warnings(&self) -> Vec<String> {
        let bytes = std::mem::take(&mut *self.0.lock().unwrap());
        warnings(&String::from_utf8(bytes).unwrap())
    }
}

fn warnings(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| line.contains("WARN"))
        .map(str::to_owned)
        .collect()
}
