//! Watching a configuration file: a tokio task reads it every interval and reloads the layer
//! when its content changes.
//!
//! The task holds only a `Weak` reference to the layer, so it ends once the layer is gone.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::{format_of, reload, BuildOnly, Config, ConfigFileError, ConfigFormat};
use crate::middleware::layer::RateLimitLayer;
use crate::middleware::shared::Shared;

/// A running watch of a configuration file, from
/// [`Config::watch`].
///
/// Dropping the handle leaves the watch running; it ends when the layer is dropped, or with
/// [`stop`](Self::stop).
#[derive(Debug)]
pub struct ConfigWatch {
    task: JoinHandle<()>,
    problem: Arc<Mutex<Option<String>>>,
}

impl ConfigWatch {
    /// Why the file as the watch last read it is not in force (it does not parse, a rule is
    /// invalid, it cannot be read), or `None` when the rules in force are the file's. The same
    /// text is logged once as a warning; this is for health checks and tests that must see the
    /// watch react to a bad file.
    pub fn problem(&self) -> Option<String> {
        self.problem
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops watching; the rules in force stay.
    pub fn stop(self) {
        self.task.abort();
    }

    /// Whether the watch is still running.
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }
}

pub(super) fn spawn(
    layer: &RateLimitLayer,
    path: &Path,
    interval: Duration,
) -> Result<ConfigWatch, ConfigFileError> {
    let format = format_of(path)?;
    if interval.is_zero() {
        return Err(
            ConfigFileError::new("", "the watch interval must be greater than 0").in_file(path),
        );
    }
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
        ConfigFileError::new("", "watching the file needs a tokio runtime").in_file(path)
    })?;
    let seen = std::fs::read(path).map_err(|error| ConfigFileError::io(path, error))?;
    let problem = Arc::default();
    let watcher = Watcher {
        layer: Arc::downgrade(&layer.shared),
        path: path.to_owned(),
        format,
        build_only: std::str::from_utf8(&seen)
            .ok()
            .and_then(|text| Config::parse(format, text).ok())
            .map(|config| config.build_only()),
        seen,
        seen_problem: None,
        last_problem: None,
        published: Arc::clone(&problem),
    };
    Ok(ConfigWatch {
        task: runtime.spawn(watcher.run(interval)),
        problem,
    })
}

struct Watcher {
    layer: Weak<Shared>,
    path: PathBuf,
    format: ConfigFormat,
    /// The content in force (or last rejected: a bad file is reported once, not every tick).
    seen: Vec<u8>,
    /// The build-time settings of the file the watch started with: changing them needs a new
    /// layer, which a warning says.
    build_only: Option<BuildOnly>,
    /// Why `seen` is not in force, if it is not.
    seen_problem: Option<String>,
    /// The last problem reported, so that a missing file is not reported every tick.
    last_problem: Option<String>,
    /// What [`ConfigWatch::problem`] answers.
    published: Arc<Mutex<Option<String>>>,
}

impl Watcher {
    async fn run(mut self, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        ticker.tick().await; // the first tick is immediate
        loop {
            ticker.tick().await;
            if self.layer.strong_count() == 0 {
                break;
            }
            let path = self.path.clone();
            let read = tokio::task::spawn_blocking(move || std::fs::read(path)).await;
            let bytes = match read {
                Ok(Ok(bytes)) => bytes,
                Ok(Err(error)) => {
                    self.problem(ConfigFileError::io(&self.path, error));
                    continue;
                }
                Err(error) => {
                    tracing::warn!(%error, "rate limit: the config file watch could not read");
                    continue;
                }
            };
            self.last_problem = None;
            if bytes == self.seen {
                self.publish(self.seen_problem.clone());
                continue;
            }
            self.seen = bytes;
            let Some(shared) = self.layer.upgrade() else {
                break;
            };
            let layer = RateLimitLayer { shared };
            self.reload(&layer);
        }
    }

    fn reload(&mut self, layer: &RateLimitLayer) {
        let file = self.path.display();
        let text = match std::str::from_utf8(&self.seen) {
            Ok(text) => text,
            Err(_) => {
                let error =
                    ConfigFileError::new("", "the file is not UTF-8 text").in_file(&self.path);
                self.seen_problem = Some(self.problem(error));
                return;
            }
        };
        match Config::parse(self.format, text).and_then(|config| reload(layer.limiter(), &config)) {
            Ok(settings) => {
                self.seen_problem = None;
                self.publish(None);
                tracing::info!(%file, "rate limit: configuration reloaded");
                if self.build_only.as_ref().is_some_and(|old| *old != settings) {
                    tracing::warn!(
                        %file,
                        "rate limit: the store, response, shadow, redact_keys or top_offenders \
                         settings changed; they take effect when the layer is built again"
                    );
                }
            }
            Err(error) => self.seen_problem = Some(self.problem(error.in_file(&self.path))),
        }
    }

    /// Reports why the file is not in force: logged once, and published to the handle.
    fn problem(&mut self, error: ConfigFileError) -> String {
        let text = error.to_string();
        self.publish(Some(text.clone()));
        if self.last_problem.as_deref() != Some(&text) {
            tracing::warn!(error = %text, "rate limit: configuration not reloaded; the rules in force stay");
            self.last_problem = Some(text.clone());
        }
        text
    }

    fn publish(&self, problem: Option<String>) {
        *self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = problem;
    }
}
