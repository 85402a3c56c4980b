//! Runs entries through a configuration's rules, with a manual clock set to each entry's time.
//!
//! **Requests that share a one-second timestamp** (the resolution of `combined` logs, or of any
//! field without a fraction) are spread evenly over that second, in the log's order: the i-th of n
//! lines stamped `S` runs at `S + i/n s`. A limit of 10 per second then sees 10 requests logged in
//! one second as 10 requests in that second, neither as one instant burst nor as crossing into the
//! next second. To stay streaming, at most [`GROUP`] lines of one second are held; when a second
//! holds more, each full group takes the first half of what remains of the second. Timestamps
//! with a fraction are used as they are.
//!
//! A line earlier than the line before it (logs of several workers interleaved out of order, a
//! clock stepped back) is skipped and counted: the engine's state cannot be rewound.

use std::net::SocketAddr;
use std::time::Duration;

use http::Request;
use tollgate::clock::ManualClock;
use tollgate::engine::Ruling;
use tollgate::Limiter;

use crate::descriptors::ServerRun;
use crate::log::{Entry, Skip};
use crate::ready::now;
use crate::stats::Tally;
use crate::time::Micros;

/// The most lines of one second held before they are run.
pub const GROUP: usize = 1 << 16;

const SECOND: Micros = 1_000_000;

/// One configuration's engine and its tally.
pub struct Runner {
    limiter: Limiter,
    clock: ManualClock,
    /// One request, reused: its header map and extensions keep their allocations.
    request: Request<()>,
    /// What happened.
    pub tally: Tally,
    /// For a configuration of tollgate-server: its domains, and how a line becomes descriptors.
    server: Option<ServerRun>,
}

impl Runner {
    /// Runs requests through `limiter`, whose store reads `clock`.
    pub fn new(limiter: Limiter, clock: ManualClock) -> Runner {
        let names: Vec<String> = limiter
            .rules_in_force()
            .into_iter()
            .map(|r| r.name)
            .collect();
        let tally = Tally::new(&names);
        Runner {
            limiter,
            clock,
            request: Request::new(()),
            tally,
            server: None,
        }
    }

    /// Decides each request as tollgate-server decides the descriptors `server` maps it to.
    pub fn with_descriptors(mut self, server: ServerRun) -> Runner {
        self.server = Some(server);
        self
    }

    /// Runs one request at `at`. Its method, target and headers are taken out of `entry`, not
    /// copied (a clone of a target or header value read from a log would first make its bytes
    /// shared), nor is the whole entry moved (hundreds of bytes).
    pub fn run(&mut self, at: Micros, entry: &mut Entry) {
        self.clock.set(Duration::from_micros(at));
        let request = &mut self.request;
        *request.method_mut() = std::mem::take(&mut entry.method);
        *request.uri_mut() = std::mem::take(&mut entry.uri);
        let headers = request.headers_mut();
        // The usual case, the same names as the line before in the same order: the values are
        // replaced in place, with no name hashed again. (Equal names in equal order make the same
        // map as appending them would.)
        let same_names = headers.len() == entry.headers.len()
            && headers
                .iter()
                .zip(&entry.headers)
                .all(|((had, _), (name, _))| had == name);
        if same_names {
            for ((_, slot), (_, value)) in headers.iter_mut().zip(entry.headers.drain(..)) {
                *slot = value;
            }
        } else {
            headers.clear();
            for (name, value) in entry.headers.drain(..) {
                headers.append(name, value);
            }
        }
        let extensions = request.extensions_mut();
        match (entry.peer, extensions.get_mut::<SocketAddr>()) {
            // Overwritten in place: no allocation per request.
            (Some(ip), Some(peer)) => *peer = SocketAddr::new(ip, 0),
            (Some(ip), None) => {
                extensions.insert(SocketAddr::new(ip, 0));
            }
            (None, _) => {
                extensions.remove::<SocketAddr>();
            }
        }
        if let Some(server) = &self.server {
            let ruling = server.decide(&self.limiter, request);
            self.tally.record(at, &ruling);
            return;
        }
        // Read where it was returned: a `Ruling` is two decisions, hundreds of bytes to move.
        let decided = now(self.limiter.decide(request));
        match &decided {
            Some(Ok(ruling)) => self.tally.record(at, ruling),
            // The memory store decides at once and does not fail; were it ever to, the request
            // is counted as refused rather than guessed at.
            Some(Err(_)) | None => self.tally.record(
                at,
                &Ruling::Refused {
                    status: http::StatusCode::SERVICE_UNAVAILABLE,
                    rule: None,
                    reason: "store error".into(),
                },
            ),
        }
    }
}

/// Orders entries in time (spreading shared seconds) and hands them to every runner.
#[derive(Default)]
pub struct Spreader {
    /// The group's lines, then entries already run, kept to be read into again (see
    /// [`Spreader::slot`]).
    entries: Vec<Entry>,
    /// How many of `entries` are the group.
    held: usize,
    /// The second of the group, and where in it the group's first line goes.
    second: Micros,
    start: Micros,
    /// The latest timestamp seen (as logged).
    latest: Option<Micros>,
}

impl Spreader {
    /// Where the next line is read into, before [`Spreader::push_slot`] takes it: a place after
    /// the group's lines, so a line read there is neither moved nor allocated anew.
    pub fn slot(&mut self) -> &mut Entry {
        if self.entries.len() == self.held {
            self.entries.push(Entry::default());
        }
        &mut self.entries[self.held]
    }

    /// Takes the entry read into [`Spreader::slot`]; runs the ones whose time is now known.
    pub fn push_slot(&mut self, runners: &mut [Runner]) -> Result<(), Skip> {
        let index = self.held;
        let stamp = self.entries[index].stamp;
        let at = stamp.at;
        if self.latest.is_some_and(|latest| at < latest) {
            return Err(Skip::Backwards);
        }
        self.latest = Some(at);
        if !stamp.whole_second {
            self.flush(runners);
            run_all(runners, at, &mut self.entries[index]);
            return Ok(());
        }
        let second = at - at % SECOND;
        if self.held == 0 || second != self.second {
            self.flush(runners);
            self.second = second;
            self.start = second;
        } else if self.held >= GROUP {
            let end = self.start + (self.second + SECOND - self.start) / 2;
            self.run_group(end, runners);
        }
        // The line opens the group if the group was just run.
        if self.held != index {
            self.entries.swap(self.held, index);
        }
        self.held += 1;
        Ok(())
    }

    /// Takes one entry; runs the ones whose time is now known.
    pub fn push(&mut self, entry: Entry, runners: &mut [Runner]) -> Result<(), Skip> {
        *self.slot() = entry;
        self.push_slot(runners)
    }

    /// Runs what is held (at the end of the log).
    pub fn flush(&mut self, runners: &mut [Runner]) {
        if self.held > 0 {
            self.run_group(self.second + SECOND, runners);
        }
    }

    /// Runs the group evenly over `[start, end)`.
    fn run_group(&mut self, end: Micros, runners: &mut [Runner]) {
        let n = self.held as u64;
        let span = end.saturating_sub(self.start);
        for (i, entry) in self.entries[..self.held].iter_mut().enumerate() {
            let at = self.start + span * i as u64 / n;
            run_all(runners, at, entry);
        }
        self.held = 0;
        self.start = end;
    }
}

/// Runs `entry` through every runner: copies for all but the last, which takes its parts.
pub fn run_all(runners: &mut [Runner], at: Micros, entry: &mut Entry) {
    if let Some((last, others)) = runners.split_last_mut() {
        for runner in others {
            runner.run(at, &mut entry.clone());
        }
        last.run(at, entry);
    }
}
