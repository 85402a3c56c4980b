//! The layer's log lines, captured in memory: for the tests that count what it logs.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Formatted log lines, shared by the subscriber that writes them and the test that reads them.
#[derive(Clone, Default)]
pub struct Lines(Arc<Written>);

#[derive(Default)]
struct Written {
    /// What the tests read, and take with [`Lines::take_warnings`].
    text: Mutex<Vec<u8>>,
    /// Everything ever written, never taken: what [`Lines::wait_for`] looks through.
    all: Mutex<Vec<u8>>,
    /// Told of every write, for the tests that wait for a line.
    written: tokio::sync::Notify,
}

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.text.lock().unwrap().extend_from_slice(buf);
        self.0.all.lock().unwrap().extend_from_slice(buf);
        self.0.written.notify_waiters();
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
        String::from_utf8(self.0.text.lock().unwrap().clone()).unwrap()
    }

    /// The warning lines written so far.
    pub fn warnings(&self) -> Vec<String> {
        warnings(&self.text())
    }

    /// The warning lines since the last call.
    pub fn take_warnings(&self) -> Vec<String> {
        let bytes = std::mem::take(&mut *self.0.text.lock().unwrap());
        warnings(&String::from_utf8(bytes).unwrap())
    }

    /// Where the lines written from now on start, for [`wait_for`](Self::wait_for).
    pub fn mark(&self) -> usize {
        self.0.all.lock().unwrap().len()
    }

    /// The first line written after `mark` for which `wanted` holds, as soon as it is written;
    /// `None` if there is none within `limit` (of real time).
    pub async fn wait_for(
        &self,
        mark: usize,
        limit: Duration,
        wanted: impl Fn(&str) -> bool,
    ) -> Option<String> {
        let deadline = Instant::now() + limit;
        loop {
            // Listening before looking: a line written in between still wakes this task.
            let written = self.0.written.notified();
            tokio::pin!(written);
            written.as_mut().enable();
            let found = {
                let all = self.0.all.lock().unwrap();
                String::from_utf8_lossy(&all[mark..])
                    .lines()
                    .find(|line| wanted(line))
                    .map(str::to_owned)
            };
            if found.is_some() {
                return found;
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            let _ = tokio::time::timeout(left, written).await;
        }
    }
}

fn warnings(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| line.contains("WARN"))
        .map(str::to_owned)
        .collect()
}
