//! This instance's concurrency leases: which it holds, their renewal, their release.
//!
//! A concurrency slot in Redis is a lease — an id in the key's sorted set with an expiry — added
//! by the script in the request's atomic step (see `lua/slots.lua`). While this instance holds a
//! lease, a background task renews it at a third of the lease's length (`lua/lease.lua`), so a
//! response may stream for as long as it likes; when the slot is given back the lease is removed.
//! If this instance dies, nothing renews its leases: they expire, and the script purges them on
//! the next look. If renewing fails for a whole lease length (Redis unreachable), the lease
//! lapses while its request still runs: that request no longer counts, so one more may be
//! admitted for as long as it runs — the price of slots that come back by themselves.
//!
//! Leases of one key taken by this instance are interchangeable (each stands for one slot), so a
//! release removes any one of them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::lua::{self, Lua};
use super::{conn, Inner};
use crate::algorithm::micros;
use crate::store::StoreError;

/// The leases this instance holds, by key name.
pub(super) struct Leases {
    held: Mutex<HashMap<Vec<u8>, Vec<u64>>>,
    /// Whether the renewal task runs (it stops when no lease is held).
    renewing: AtomicBool,
    /// The renewal's script (`lua/lease.lua`).
    script: Lua,
}

impl Default for Leases {
    fn default() -> Self {
        Leases {
            held: Mutex::default(),
            renewing: AtomicBool::new(false),
            script: Lua::new(lua::LEASE),
        }
    }
}

/// A new lease's id: random below 2^52, so exact in the script's doubles; two leases of one key
/// collide with a chance of about n²/2^53 for n slots.
pub(super) fn new_id() -> u64 {
    fastrand::u64(1..1 << 52)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Leases {
    /// Records a lease the script added, and makes sure the renewal runs.
    pub(super) fn hold(inner: &Arc<Inner>, name: Vec<u8>, id: u64) {
        lock(&inner.leases.held).entry(name).or_default().push(id);
        if !inner.leases.renewing.swap(true, Ordering::AcqRel) {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(renew(Arc::downgrade(inner)));
                }
                Err(_) => {
                    inner.leases.renewing.store(false, Ordering::Release);
                    tracing::warn!("rate limit: no runtime to renew concurrency leases");
                }
            }
        }
    }

    /// Takes `count` of this instance's leases of `name` off the books; the ids to remove.
    pub(super) fn release(&self, name: &[u8], count: u64) -> Vec<u64> {
        let mut held = lock(&self.held);
        let Some(ids) = held.get_mut(name) else {
            return Vec::new();
        };
        let keep = ids
            .len()
            .saturating_sub(usize::try_from(count).unwrap_or(usize::MAX));
        let released = ids.split_off(keep);
        if ids.is_empty() {
            held.remove(name);
        }
        released
    }

    /// The leases held now; an empty list stops the renewal (under the same lock as `hold`
    /// adds, so a lease added meanwhile starts a new one).
    fn snapshot(&self) -> Option<Vec<(Vec<u8>, Vec<u64>)>> {
        let held = lock(&self.held);
        if held.is_empty() {
            self.renewing.store(false, Ordering::Release);
            return None;
        }
        Some(
            held.iter()
                .map(|(name, ids)| (name.clone(), ids.clone()))
                .collect(),
        )
    }
}

/// Renews this instance's leases at a third of their length until none is held or the store is
/// gone.
async fn renew(store: Weak<Inner>) {
    loop {
        let Some(every) = store.upgrade().map(|inner| inner.lease / 3) else {
            return;
        };
        tokio::time::sleep(every).await;
        let Some(inner) = store.upgrade() else {
            return;
        };
        let Some(held) = inner.leases.snapshot() else {
            return;
        };
        for (name, ids) in held {
            if let Err(error) = inner.timed(renew_key(&inner, &name, &ids)).await {
                tracing::warn!(
                    %error,
                    "rate limit: renewing concurrency leases failed; they lapse if it keeps failing"
                );
            }
        }
    }
}

async fn renew_key(inner: &Inner, name: &[u8], ids: &[u64]) -> Result<(), StoreError> {
    let now = match inner.injected_now()? {
        Some(now) => now.to_string(),
        None => "-1".to_owned(),
    };
    let grace = if inner.clock.is_some() {
        super::params::TEST_GRACE_MS
    } else {
        0
    };
    let lease = micros(inner.lease);
    let px = lease.div_ceil(1000) + grace;
    let script = &inner.leases.script;
    let mut cmd = ::redis::cmd("EVALSHA");
    cmd.arg(script.hash()).arg(1).arg(name);
    cmd.arg(now).arg(lease).arg(px);
    for id in ids {
        cmd.arg(id);
    }
    let mut conn = inner.conn.clone();
    conn.eval::<i64>(script, &cmd).await.map_err(conn::error)?;
    Ok(())
}

/// Removes leases (the slots they stand for are given back).
pub(super) async fn remove(inner: &Inner, name: &[u8], ids: &[u64]) -> Result<(), StoreError> {
    let mut cmd = ::redis::cmd("ZREM");
    cmd.arg(name);
    for id in ids {
        cmd.arg(id);
    }
    let mut conn = inner.conn.clone();
    conn.query::<i64>(&cmd).await.map_err(conn::error)?;
    Ok(())
}

/// The lease's length a store is built with, raised to the shortest that works.
pub(super) fn lease_of(requested: Duration) -> Duration {
    requested.max(MIN_LEASE)
}

/// The shortest lease: renewals every third of it must have time to reach Redis.
pub(super) const MIN_LEASE: Duration = Duration::from_millis(30);
/// The default lease.
pub(super) const DEFAULT_LEASE: Duration = Duration::from_secs(60);
