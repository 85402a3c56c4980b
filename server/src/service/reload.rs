//! Configurations put in force while serving, by one path ([`apply`]) whatever their source:
//!
//! - Files: compared with the ones in force every interval; when they changed, the whole
//!   configuration is read and checked again ([`watch`]).
//! - xDS: every push the client loads is offered ([`follow`]); the answer is its ACK or NACK.
//!
//! Either way the library's rules and the descriptor trees are swapped together, as one value:
//! a call sees both of one configuration. A bad
//! configuration keeps the one in force and says why in the log (and in
//! `tollgate_server_config_reload_failures_total`, statsd's `ratelimit.service.config_load_error`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{Current, State};
use crate::load::{self, Loaded};
use crate::source::xds::Offer;
use crate::source::Source;

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
        let applied = source
            .load()
            .map_err(|e| e.to_string())
            .and_then(|loaded| apply(&state, loaded, source.path(), false));
        state.stats.reload(applied.is_ok());
        match applied {
            Ok(()) => {
                tracing::info!(config = %source.path().display(), "configuration reloaded");
            }
            Err(error) => {
                tracing::warn!(%error, "configuration not reloaded: the rules in force stay");
            }
        }
    }
}

/// Puts every configuration the xDS client offers in force, or refuses it, until the client
/// stops. The client logs each answer (its ACK or NACK).
pub(crate) async fn follow(
    state: Arc<State>,
    origin: PathBuf,
    mut offers: tokio::sync::mpsc::Receiver<Offer>,
) {
    while let Some(offer) = offers.recv().await {
        let applied = offer
            .loaded
            .map_err(|e| e.to_string())
            .and_then(|loaded| apply(&state, loaded, &origin, true));
        state.stats.reload(applied.is_ok());
        let _ = offer.reply.send(applied);
    }
}

/// Swaps `loaded` (read from `origin`) in force: the descriptor trees and a limiter holding its
/// rules on the store in force, in one store of the snapshot. With `may_empty` false, a configuration with no domain is refused while one is in
/// force: files emptied or removed under a running server (a ConfigMap swapped badly) are a
/// mistake far more often than a wish to lift every limit. An xDS push is the whole state of
/// the world: an empty one means no limit.
pub(crate) fn apply(
    state: &State,
    loaded: Loaded,
    origin: &Path,
    may_empty: bool,
) -> Result<(), String> {
    let current = state.current.load();
    if !may_empty && loaded.is_empty() && current.domains.names().next().is_some() {
        return Err(load::nothing_configured(origin));
    }
    // The store in force stays (its counts with it); the store table of the configuration
    // read was checked, and is only read when the server starts.
    let limiter = current
        .limiter
        .with_rules(loaded.rules)
        .map_err(|e| load::rules_error(origin, &e).to_string())?;
    let (domains, on_store_failure) = (loaded.domains, loaded.on_store_failure);
    drop(current);
    state.current.store(Arc::new(Current {
        domains,
        limiter,
        on_store_failure,
    }));
    Ok(())
}
