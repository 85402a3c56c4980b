//! `tollgate simulate`: synthetic traffic against rules, and the ready scenarios.
//!
//! Clients are `10.0.x.y` peers; each traffic source sends from every client. Every run is
//! deterministic: Poisson arrivals come from a seeded generator.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use http::Method;
use tollgate::clock::ManualClock;
use tollgate::config::Config;
use tollgate::config::{ConfigFileError, ConfigFormat};
use tollgate::MemoryStore;

use crate::log::Entry;
use crate::run::Runner;
use crate::stats::Input;
use crate::time::{Micros, Stamp};

/// Where the simulated clock starts: 2023-11-14 22:13:20 UTC, a whole minute and hour apart from
/// nothing in particular, so aligned windows start at a known place (a multiple of 10 s).
pub const START: Micros = 1_700_000_000_000_000;

/// One source of traffic, from every client.
#[derive(Clone, Debug, PartialEq)]
pub enum Traffic {
    /// `steady:RATE`: RATE requests per second per client, evenly spaced.
    Steady {
        /// Requests per second per client.
        rate: f64,
    },
    /// `poisson:RATE`: RATE per second per client on average, at random.
    Poisson {
        /// Requests per second per client, on average.
        rate: f64,
    },
    /// `burst:N/EVERY[+AT]`: N requests at once every EVERY, the first at AT.
    Burst {
        /// Requests in each burst.
        n: u64,
        /// The time between bursts.
        every: Duration,
        /// The time of the first burst.
        at: Duration,
    },
}

impl Traffic {
    /// Reads `steady:5`, `poisson:2.5`, `burst:20/10s`, `burst:10/20s+9.5s`.
    pub fn parse(spec: &str) -> Result<Traffic, String> {
        let bad = || {
            format!("traffic {spec:?}: expected steady:RATE, poisson:RATE or burst:N/EVERY[+AT]")
        };
        let (kind, args) = spec.split_once(':').ok_or_else(bad)?;
        let rate = || -> Result<f64, String> {
            let rate: f64 = args.parse().map_err(|_| bad())?;
            if rate > 0.0 && rate <= 1e6 {
                Ok(rate)
            } else {
                Err(format!(
                    "traffic {spec:?}: the rate must be above 0 and at most 1000000"
                ))
            }
        };
        match kind {
            "steady" => Ok(Traffic::Steady { rate: rate()? }),
            "poisson" => Ok(Traffic::Poisson { rate: rate()? }),
            "burst" => {
                let (n, rest) = args.split_once('/').ok_or_else(bad)?;
                let (every, at) = rest.split_once('+').unwrap_or((rest, "0s"));
                let n: u64 = n.parse().map_err(|_| bad())?;
                let every = seconds(every).ok_or_else(bad)?;
                let at = seconds(at).ok_or_else(bad)?;
                if every.is_zero() || n == 0 || n > 1_000_000 {
                    return Err(bad());
                }
                Ok(Traffic::Burst { n, every, at })
            }
            _ => Err(bad()),
        }
    }

    /// About how many requests one client sends in `duration`.
    pub fn expected(&self, duration: Duration) -> f64 {
        let seconds = duration.as_secs_f64();
        match *self {
            Traffic::Steady { rate } | Traffic::Poisson { rate } => rate * seconds,
            Traffic::Burst { n, every, .. } => n as f64 * (seconds / every.as_secs_f64()).ceil(),
        }
    }

    /// The arrival times (µs from the start) of one client, within `duration`.
    fn arrivals(
        &self,
        client: u64,
        clients: u64,
        duration: Micros,
        rng: &mut fastrand::Rng,
    ) -> Vec<Micros> {
        let mut times = Vec::new();
        match *self {
            Traffic::Steady { rate } => {
                let gap = 1e6 / rate;
                // Clients are out of phase, as real ones are.
                let mut t = gap * client as f64 / clients as f64;
                while (t as Micros) < duration {
                    times.push(t as Micros);
                    t += gap;
                }
            }
            Traffic::Poisson { rate } => {
                let mut t = 0.0;
                loop {
                    t += -(1.0 - rng.f64()).ln() / rate * 1e6;
                    if t as Micros >= duration {
                        break;
                    }
                    times.push(t as Micros);
                }
            }
            Traffic::Burst { n, every, at } => {
                let mut t = at.as_micros() as Micros;
                while t < duration {
                    times.extend(std::iter::repeat_n(t, n as usize));
                    t += every.as_micros() as Micros;
                }
            }
        }
        times
    }
}

/// `10s`, `1.5s`, `500ms`, `2m`.
pub fn seconds(text: &str) -> Option<Duration> {
    let (number, unit) = text
        .find(|c: char| c.is_ascii_alphabetic())
        .map_or((text, "s"), |at| text.split_at(at));
    let value: f64 = number.parse().ok()?;
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return None,
    };
    let secs = value * scale;
    (0.0..1e9)
        .contains(&secs)
        .then(|| Duration::from_secs_f64(secs))
}

/// A rule from the command line, `name=api,rate=10,period=1s,capacity=20` (dotted names for tables:
/// `queue.burst=20`), as the configuration file's TOML (so it is checked exactly as a file would be). The key defaults to the peer.
pub fn rule_toml(spec: &str) -> Result<String, String> {
    let mut toml = String::from("[[rules]]\n");
    let mut has_key = false;
    for pair in spec.split(',').filter(|p| !p.trim().is_empty()) {
        let (name, value) = pair.split_once('=').ok_or_else(|| {
            format!("--rule {spec:?}: expected NAME=VALUE pairs separated by commas")
        })?;
        let (name, value) = (name.trim(), value.trim());
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
            || name.is_empty()
        {
            return Err(format!("--rule {spec:?}: {name:?} is not a setting name"));
        }
        has_key |= name == "key";
        let literal = if value.parse::<u64>().is_ok() || value == "true" || value == "false" {
            value.to_owned()
        } else {
            serde_json::to_string(value).expect("a string serializes")
        };
        toml.push_str(&format!("{name} = {literal}\n"));
    }
    if !has_key {
        toml.push_str("key = \"peer_ip\"\n");
    }
    Ok(toml)
}

/// A runner for configuration `text`.
pub fn runner(text: &str) -> Result<Runner, ConfigFileError> {
    let clock = ManualClock::new(Duration::ZERO);
    let store = MemoryStore::with_clock(clock.clone());
    let layer = Config::parse(ConfigFormat::Toml, text)
        .and_then(|config| config.layer_with_store(store))?;
    Ok(Runner::new(layer.limiter().clone(), clock))
}

/// The most requests one simulation sends (their arrival times are held in memory).
pub const MAX_REQUESTS: f64 = 20_000_000.0;

/// Sends `traffic` from `clients` clients for `duration` through every runner.
pub fn simulate(
    traffic: &[Traffic],
    clients: u64,
    duration: Duration,
    seed: u64,
    runners: &mut [Runner],
) {
    for runner in runners.iter_mut() {
        runner.tally.input = Input::Synthetic;
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let duration = duration.as_micros() as Micros;
    // One sorted stream per (source, client), merged in time order.
    let mut heap = BinaryHeap::new();
    let mut streams = Vec::new();
    for source in traffic {
        for client in 0..clients {
            let times = source.arrivals(client, clients, duration, &mut rng);
            if let Some(&first) = times.first() {
                heap.push(Reverse((first, streams.len(), 0usize)));
            }
            streams.push((client, times));
        }
    }
    while let Some(Reverse((at, stream, i))) = heap.pop() {
        let (client, times) = &streams[stream];
        let mut entry = Entry {
            stamp: Stamp {
                at: START + at,
                whole_second: false,
            },
            method: Method::GET,
            uri: http::Uri::from_static("/"),
            peer: Some(client_ip(*client)),
            headers: Default::default(),
        };
        for runner in runners.iter_mut() {
            runner.tally.lines += 1;
        }
        crate::run::run_all(runners, START + at, &mut entry);
        if let Some(&next) = times.get(i + 1) {
            heap.push(Reverse((next, stream, i + 1)));
        }
    }
}

fn client_ip(client: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, (client >> 8) as u8, client as u8))
}

/// A ready scenario: rules side by side (each on its own limiter), and the traffic that shows
/// the difference.
pub struct Scenario {
    /// Its name on the command line.
    pub name: &'static str,
    /// What it shows.
    pub about: &'static str,
    /// Rules, each run on its own.
    pub rules: &'static [&'static str],
    /// Traffic sources.
    pub traffic: &'static [&'static str],
    /// Clients.
    pub clients: u64,
    /// Seconds.
    pub seconds: u64,
}

/// The ready scenarios.
pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "window-edge",
        about: "Two bursts of 10, one just before a window boundary and one just after: the fixed window admits both (20 in one second under a limit of 10 per 10 s); the sliding window and the sliding log hold the line.",
        rules: &[
            "name=fixed-window,algorithm=fixed_window,limit=10,period=10s,aligned=true",
            "name=sliding-window,algorithm=sliding_window,limit=10,period=10s,aligned=true",
            "name=sliding-log,algorithm=sliding_log,limit=10,period=10s",
        ],
        traffic: &["burst:10/20s+9.5s", "burst:10/20s+10.5s"],
        clients: 1,
        seconds: 20,
    },
    Scenario {
        name: "bucket-burst",
        about: "A burst of 30 at 10 s over a steady 1 per second: the token bucket admits up to its burst of 20 at once and then the steady rate; a fixed window of 2 per second cuts the burst to 2.",
        rules: &[
            "name=token-bucket,rate=2,period=1s,capacity=20",
            "name=fixed-window,algorithm=fixed_window,limit=2,period=1s,aligned=true",
        ],
        traffic: &["steady:1", "burst:30/60s+10s"],
        clients: 1,
        seconds: 40,
    },
    Scenario {
        name: "smoothing",
        about: "Random (Poisson) traffic at twice the limit: the fixed window admits in surges at each window start; the sliding window spreads what it admits over time.",
        rules: &[
            "name=fixed-window,algorithm=fixed_window,limit=30,period=10s,aligned=true",
            "name=sliding-window,algorithm=sliding_window,limit=30,period=10s,aligned=true",
        ],
        traffic: &["poisson:6"],
        clients: 1,
        seconds: 60,
    },
    Scenario {
        name: "queue-pacing",
        about: "Bursts of 10 every 10 s against 1 per second: without a queue all but the first few are denied; queue mode delays them and lets them through at the rate.",
        rules: &[
            "name=no-queue,rate=1,period=1s,capacity=2",
            "name=queued,rate=1,period=1s,capacity=2,queue.burst=20",
        ],
        traffic: &["burst:10/10s"],
        clients: 1,
        seconds: 40,
    },
];
