//! Hot reload: the configuration's files are compared with the ones in force every interval;
//! when they changed, the whole configuration is read and checked again, then the library's
//! rules and the descriptor trees are swapped. A bad configuration keeps the one in force and
//! says why in the log (and in `tollgate_server_config_reload_failures_total`, statsd's
//! `ratelimit.service.config_load_error`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::{Current, State};
use crate::load::{self, Source};

/// Watches `path`, whose configuration in force was read from `in_force`, until `stop` turns
/// true.
pub(crate) async fn watch(
    state: Arc<State>,
    source: Source,
    mut in_force: Vec<(PathBuf, Vec<u8>)>,
    interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        let now = source.fingerprint();
        if now == in_force {
            continue;
        }
        in_force = now;
        match reload(&state, &source) {
            Ok(()) => {
                state.stats.reload(true);
                tracing::info!(config = %source.path().display(), "configuration reloaded");
            }
            Err(error) => {
                state.stats.reload(false);
                tracing::warn!(%error, "configuration not reloaded: the rules in force stay");
            }
        }
    }
}

fn reload(state: &State, source: &Source) -> Result<(), String> {
    let path = source.path();
    let loaded = source.load().map_err(|e| e.to_string())?;
    // Files emptied or removed under a running server (a ConfigMap swapped badly) are a
    // mistake far more often than a wish to lift every limit: the limits in force stay.
    if loaded.is_empty() && state.current.load().domains.names().next().is_some() {
        return Err(load::nothing_configured(path));
    }
    loaded
        .config
        .reload(&state.layer)
        .map_err(|e| load::library_error(path, &e).to_string())?;
    state.current.store(Arc::new(Current {
        domains: loaded.domains,
        on_store_failure: loaded.on_store_failure,
    }));
    Ok(())
}
