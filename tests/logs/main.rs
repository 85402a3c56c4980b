//! The tests that count log events, apart from the others on purpose: `tracing` caches per call
//! site whether anyone listens, and a test on another thread that hits the same call site with no
//! subscriber installed can cache "nobody" and swallow the events these tests check. Every test
//! here installs its own subscriber first.

// The same test files are loaded once per engine, on purpose.
#![allow(clippy::duplicate_mod)]

use tollgate_test_support as support;

mod logging;
mod per_request_logging;

/// What the outage tests of both engines share: one global subscriber and recorder, and one test
/// at a time.
#[cfg(feature = "redis")]
mod outage {
    use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

    use metrics_util::debugging::{DebuggingRecorder, Snapshotter};

    use crate::support::log_lines::Lines;

    /// The captured lines and the metrics, installed once for the whole binary. Lines down to
    /// `DEBUG` are captured: a failed probe of the circuit breaker is a debug line, which the
    /// tests wait for (they count warnings by their level).
    pub(crate) fn globals() -> &'static (Lines, Snapshotter) {
        static GLOBALS: OnceLock<(Lines, Snapshotter)> = OnceLock::new();
        GLOBALS.get_or_init(|| {
            let lines = Lines::default();
            tracing::subscriber::set_global_default(lines.subscriber(tracing::Level::DEBUG))
                .unwrap();
            let recorder = DebuggingRecorder::new();
            let snapshotter = recorder.snapshotter();
            metrics::set_global_recorder(recorder).unwrap();
            (lines, snapshotter)
        })
    }

    /// Held by each test for its whole run: one test at a time sees the lines and the gauge.
    pub(crate) fn one_at_a_time() -> MutexGuard<'static, ()> {
        static SERIAL: Mutex<()> = Mutex::new(());
        SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The Redis outages on `redis-server`.
#[path = "."]
mod redis {
    /// The engine this copy of the outage tests runs on.
    const ENGINE: crate::support::redis_server::Engine =
        crate::support::redis_server::Engine::Redis;

    mod redis_outage;
}

/// The same outages on `valkey-server`.
#[path = "."]
mod valkey {
    /// The engine this copy of the outage tests runs on.
    const ENGINE: crate::support::redis_server::Engine =
        crate::support::redis_server::Engine::Valkey;

    mod redis_outage;
}
