//! The statistics pushed to a statsd server, as the reference service writes them.
//!
//! The reference (envoyproxy/ratelimit) counts with lyft/gostats and its network sink; this
//! sink writes what that one writes, so a statsd exporter (Envoy Gateway's mapping, the
//! reference's own) turns the lines into the same series:
//!
//! | line | type |
//! |---|---|
//! | `ratelimit.service.rate_limit.<domain>.<key…>.total_hits` (and `over_limit`, `near_limit`, `within_limit`, `shadow_mode`) | counter |
//! | `ratelimit.service.rate_limit.<domain>.domain_not_found` | counter |
//! | `ratelimit.service.config_load_success`, `ratelimit.service.config_load_error` | counter |
//! | `ratelimit.service.call.should_rate_limit.redis_error` (a store failure), `….service_error` (a refused request) | counter |
//! | `ratelimit_server.ShouldRateLimit.total_requests` | counter |
//! | `ratelimit_server.ShouldRateLimit.response_time` | timer, whole milliseconds, one line per call |
//!
//! `<domain>.<key…>` is the reference's statistics key with its clean-up: `:` and `|` become
//! `_`, and so do the dots of anything that reads as an IPv4 address. Counters are written as
//! the change since the last flush, and only when it is not zero; each extra tag is appended to
//! every name as `.__key=value` (keys sorted, `.`, `:` and `|` in values replaced by `_`).
//!
//! Lines go out every flush interval (timers every second at most, as the reference's sink
//! flushes its buffer every second), over TCP by default or UDP (datagrams of at most 1432
//! bytes). A call never waits on the network: it only adds to counters, and the lines are
//! queued in a bounded buffer; what does not fit, or cannot be sent twice, is dropped and
//! counted (`tollgate_server_statsd_lines_dropped_total`). A lost or refused connection and a
//! host that does not resolve are one warning each outage; the sink retries with a backoff
//! (up to 3 s, the reference's interval) and says when it sends again.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use foldhash::HashMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::{Stats, COUNTERS};

/// Where and how the statistics are sent (the reference's `STATSD_HOST`, `STATSD_PORT`,
/// `STATSD_PROTOCOL`, `STATS_FLUSH_INTERVAL` and `EXTRA_TAGS`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatsdSettings {
    /// The statsd server's host name or address, resolved on every (re)connection.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// TCP or UDP.
    pub transport: Transport,
    /// How often counters are written.
    pub flush_interval: Duration,
    /// Tags appended to every name, as `(key, value)`; a pair with an empty key or value is
    /// left out, and a key given twice keeps its last value.
    pub extra_tags: Vec<(String, String)>,
}

impl Default for StatsdSettings {
    /// The reference's defaults: `localhost:8125` over TCP, every 10 seconds, no tags.
    fn default() -> StatsdSettings {
        StatsdSettings {
            host: "localhost".into(),
            port: 8125,
            transport: Transport::Tcp,
            flush_interval: Duration::from_secs(10),
            extra_tags: Vec::new(),
        }
    }
}

/// How lines reach the statsd server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// One connection, opened again when lost (the reference's default).
    #[default]
    Tcp,
    /// Datagrams of whole lines.
    Udp,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
        })
    }
}

/// Bytes of lines waiting to be sent at most (the reference's sink keeps about as much).
const QUEUED_BYTES: usize = 4 << 20;
/// The largest write over TCP.
const TCP_CHUNK: usize = 64 << 10;
/// The largest datagram: no fragmentation on a network with an MTU of 1500.
const UDP_CHUNK: usize = 1432;
/// Timers are written at least this often.
const TIMER_EVERY: Duration = Duration::from_secs(1);
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
const FIRST_RETRY: Duration = Duration::from_millis(100);
const LAST_RETRY: Duration = Duration::from_secs(3);
/// How long the last flush may take to leave when the server stops.
const LAST_FLUSH: Duration = Duration::from_secs(1);

/// Starts the sink; after `stop` turns true it flushes once more and ends.
pub(crate) fn start(
    stats: Arc<Stats>,
    settings: StatsdSettings,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let chunk = match settings.transport {
        Transport::Tcp => TCP_CHUNK,
        Transport::Udp => UDP_CHUNK,
    };
    let (queue, queued) = mpsc::channel(QUEUED_BYTES / chunk);
    let target = Target {
        host: settings.host.clone(),
        port: settings.port,
        transport: settings.transport,
    };
    tracing::info!(
        statsd = %target,
        flush_interval = ?settings.flush_interval,
        "statsd: statistics will be sent there"
    );
    let writer = tokio::spawn(deliver(target, queued, stats.clone()));
    let flusher = Flusher::new(stats, &settings, chunk, queue);
    tokio::spawn(flusher.run(settings.flush_interval, stop, writer))
}

/// Lines ready to leave: one write over TCP, one datagram over UDP.
struct Chunk {
    bytes: Vec<u8>,
    lines: u64,
    /// Already sent once on a connection that failed.
    retried: bool,
}

/// Writes the counters' changes and the calls' times as lines.
struct Flusher {
    stats: Arc<Stats>,
    /// `.__key=value` for every extra tag.
    tags: String,
    chunk: usize,
    queue: mpsc::Sender<Chunk>,
    /// Per domain and statistics key: the names' common part and the values last written.
    sent: HashMap<String, HashMap<String, (String, [u64; COUNTERS.len()])>>,
    /// Per unknown domain: its line's name and the value last written.
    not_found_sent: HashMap<String, (String, u64)>,
    /// The service-wide counters' values last written.
    totals_sent: [u64; 6],
    timer_name: String,
}

impl Flusher {
    fn new(
        stats: Arc<Stats>,
        settings: &StatsdSettings,
        chunk: usize,
        queue: mpsc::Sender<Chunk>,
    ) -> Flusher {
        Flusher {
            stats,
            tags: tag_suffix(&settings.extra_tags),
            chunk,
            queue,
            sent: HashMap::default(),
            not_found_sent: HashMap::default(),
            totals_sent: [0; 6],
            timer_name: "ratelimit_server.ShouldRateLimit.response_time".into(),
        }
    }

    async fn run(
        mut self,
        every: Duration,
        mut stop: watch::Receiver<bool>,
        mut writer: JoinHandle<()>,
    ) {
        let every = every.max(Duration::from_millis(1));
        let start = tokio::time::Instant::now();
        let mut counters = tokio::time::interval_at(start + every, every);
        let timer_every = every.min(TIMER_EVERY);
        let mut timers = tokio::time::interval_at(start + timer_every, timer_every);
        for ticker in [&mut counters, &mut timers] {
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        loop {
            tokio::select! {
                _ = counters.tick() => self.flush(true),
                _ = timers.tick() => self.flush(false),
                _ = stop.wait_for(|stop| *stop) => break,
            }
        }
        self.flush(true);
        // The queue closes: the writer sends what is left, then ends.
        drop(self);
        if tokio::time::timeout(LAST_FLUSH, &mut writer).await.is_err() {
            writer.abort();
        }
    }

    /// Writes the calls' times, and with `counters` every counter that changed.
    fn flush(&mut self, counters: bool) {
        let mut lines = Lines::new(self.chunk);
        if let Some(times) = &self.stats.response_times {
            let (name, tags) = (&self.timer_name, &self.tags);
            times.take(|ms, calls| {
                for _ in 0..calls {
                    lines.push(name, tags, ms, "ms");
                }
            });
        }
        if counters {
            self.counters(&mut lines);
        }
        for chunk in lines.finish() {
            let lines = chunk.lines;
            if let Err(error) = self.queue.try_send(chunk) {
                self.stats
                    .statsd_dropped
                    .fetch_add(lines, Ordering::Relaxed);
                tracing::debug!(%error, lines, "statsd: queue full; lines dropped");
            }
        }
    }

    fn counters(&mut self, lines: &mut Lines) {
        let stats = &self.stats;
        let tags = &self.tags;
        {
            let series = stats.lock();
            for (domain, key, counts) in series.all() {
                if !self.sent.contains_key(domain) {
                    self.sent.insert(domain.to_owned(), HashMap::default());
                }
                let keys = self.sent.get_mut(domain).expect("inserted above");
                if !keys.contains_key(key) {
                    let name = sanitize(&format!("{domain}.{key}"));
                    let prefix = format!("ratelimit.service.rate_limit.{name}.");
                    keys.insert(key.to_owned(), (prefix, [0; COUNTERS.len()]));
                }
                let (prefix, sent) = keys.get_mut(key).expect("inserted above");
                for (i, counter) in COUNTERS.iter().enumerate() {
                    let now = counts[i].load(Ordering::Relaxed);
                    if now != sent[i] {
                        let name = format!("{prefix}{counter}");
                        lines.push(&name, tags, now.wrapping_sub(sent[i]), "c");
                        sent[i] = now;
                    }
                }
            }
            let mut not_found: Vec<_> = series.not_found.iter().collect();
            not_found.sort_by(|a, b| a.0.cmp(b.0));
            for (domain, counter) in not_found {
                let (name, sent) = self
                    .not_found_sent
                    .entry(domain.clone())
                    .or_insert_with(|| {
                        let name = sanitize(domain);
                        (
                            format!("ratelimit.service.rate_limit.{name}.domain_not_found"),
                            0,
                        )
                    });
                let now = counter.load(Ordering::Relaxed);
                if now != *sent {
                    lines.push(name, tags, now.wrapping_sub(*sent), "c");
                    *sent = now;
                }
            }
        }
        let totals = stats.totals();
        for ((name, counter), sent) in totals.iter().zip(&mut self.totals_sent) {
            let now = counter.load(Ordering::Relaxed);
            if now != *sent {
                lines.push(name, tags, now.wrapping_sub(*sent), "c");
                *sent = now;
            }
        }
    }
}

/// Lines cut in chunks of at most a given size (a line longer than that is a chunk alone).
struct Lines {
    size: usize,
    current: Vec<u8>,
    lines: u64,
    done: Vec<Chunk>,
}

impl Lines {
    fn new(size: usize) -> Lines {
        Lines {
            size,
            current: Vec::new(),
            lines: 0,
            done: Vec::new(),
        }
    }

    /// Adds `name` + `tags` + `:value|kind`.
    fn push(&mut self, name: &str, tags: &str, value: u64, kind: &str) {
        let mut number = itoa::Buffer::new();
        let value = number.format(value);
        let len = name.len() + tags.len() + value.len() + kind.len() + 3;
        if !self.current.is_empty() && self.current.len() + len > self.size {
            self.cut();
        }
        for part in [name, tags, ":", value, "|", kind, "\n"] {
            self.current.extend_from_slice(part.as_bytes());
        }
        self.lines += 1;
    }

    fn cut(&mut self) {
        let bytes = std::mem::take(&mut self.current);
        self.done.push(Chunk {
            bytes,
            lines: std::mem::take(&mut self.lines),
            retried: false,
        });
    }

    fn finish(mut self) -> Vec<Chunk> {
        if !self.current.is_empty() {
            self.cut();
        }
        self.done
    }
}

/// The suffix gostats appends for a scope's tags: `.__key=value` per tag, sorted by key.
fn tag_suffix(tags: &[(String, String)]) -> String {
    let mut kept = BTreeMap::new();
    for (key, value) in tags {
        if !key.is_empty() && !value.is_empty() {
            kept.insert(key.as_str(), value.replace(['.', ':', '|'], "_"));
        }
    }
    kept.iter().map(|(k, v)| format!(".__{k}={v}")).collect()
}

/// A statistics key made a statsd name as the reference does: `:` and `|` become `_`, and so
/// do the dots of every run that reads as an IPv4 address (four dot-separated groups of one to
/// three digits, the leftmost first).
pub(crate) fn sanitize(key: &str) -> String {
    let mut out = key.replace([':', '|'], "_").into_bytes();
    let mut at = 0;
    while at < out.len() {
        match dotted_quad(&out[at..]) {
            Some(len) => {
                for byte in &mut out[at..at + len] {
                    if *byte == b'.' {
                        *byte = b'_';
                    }
                }
                at += len;
            }
            None => at += 1,
        }
    }
    String::from_utf8(out).expect("only ASCII bytes were replaced by ASCII bytes")
}

/// The length of the address that `text` starts with, if any: three groups of one to three
/// digits each followed by a dot, then one to three digits (as many as there are, up to three).
fn dotted_quad(text: &[u8]) -> Option<usize> {
    let digits = |from: usize| {
        text[from.min(text.len())..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let mut at = 0;
    for _ in 0..3 {
        let run = digits(at);
        if !(1..=3).contains(&run) || text.get(at + run) != Some(&b'.') {
            return None;
        }
        at += run + 1;
    }
    match digits(at) {
        0 => None,
        run => Some(at + run.min(3)),
    }
}

/// The statsd server.
#[derive(Clone, Debug)]
struct Target {
    host: String,
    port: u16,
    transport: Transport,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "{}://[{}]:{}", self.transport, self.host, self.port)
        } else {
            write!(f, "{}://{}:{}", self.transport, self.host, self.port)
        }
    }
}

/// An open way to the statsd server.
enum Link {
    Tcp(TcpStream),
    Udp(UdpSocket),
}

impl Link {
    /// Resolves the target's host and connects to the first address that answers.
    async fn open(target: &Target) -> Result<Link, String> {
        let addresses = tokio::time::timeout(
            RESOLVE_TIMEOUT,
            tokio::net::lookup_host((target.host.as_str(), target.port)),
        )
        .await
        .map_err(|_| {
            format!(
                "cannot resolve {}: no answer in {RESOLVE_TIMEOUT:?}",
                target.host
            )
        })?
        .map_err(|e| format!("cannot resolve {}: {e}", target.host))?;
        let mut failure = format!("cannot resolve {}: no address", target.host);
        for address in addresses {
            let opened = match target.transport {
                Transport::Tcp => {
                    match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
                        Ok(Ok(stream)) => {
                            let _ = stream.set_nodelay(true);
                            Ok(Link::Tcp(stream))
                        }
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(io::ErrorKind::TimedOut.into()),
                    }
                }
                Transport::Udp => {
                    let local: std::net::SocketAddr = if address.is_ipv4() {
                        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
                    } else {
                        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
                    };
                    async {
                        let socket = UdpSocket::bind(local).await?;
                        socket.connect(address).await?;
                        Ok(Link::Udp(socket))
                    }
                    .await
                }
            };
            match opened {
                Ok(link) => return Ok(link),
                Err(e) => failure = format!("cannot connect to {address}: {e}"),
            }
        }
        Err(failure)
    }

    /// Sends `chunk`; on failure, the lines not (wholly) sent.
    async fn send(&mut self, chunk: &[u8]) -> Result<(), (io::Error, usize)> {
        match self {
            Link::Udp(socket) => match socket.send(chunk).await {
                Ok(_) => Ok(()),
                Err(e) => Err((e, 0)),
            },
            Link::Tcp(stream) => {
                let mut written = 0;
                while written < chunk.len() {
                    let wrote =
                        tokio::time::timeout(WRITE_TIMEOUT, stream.write(&chunk[written..])).await;
                    match wrote {
                        Ok(Ok(0)) => return Err((io::ErrorKind::WriteZero.into(), written)),
                        Ok(Ok(n)) => written += n,
                        Ok(Err(e)) => return Err((e, written)),
                        Err(_) => return Err((io::ErrorKind::TimedOut.into(), written)),
                    }
                }
                Ok(())
            }
        }
    }

    /// Waits for the next chunk; `Err` when the server closed the connection meanwhile (a
    /// statsd server never writes: its end or reset is seen before the next write is lost in
    /// it), `Ok(None)` when the queue is closed.
    async fn next(&mut self, queued: &mut mpsc::Receiver<Chunk>) -> Result<Option<Chunk>, String> {
        let Link::Tcp(stream) = self else {
            return Ok(queued.recv().await);
        };
        let mut ignored = [0; 256];
        loop {
            tokio::select! {
                chunk = queued.recv() => return Ok(chunk),
                read = stream.read(&mut ignored) => match read {
                    Ok(0) => return Err("the server closed the connection".into()),
                    Err(e) => return Err(e.to_string()),
                    Ok(_) => {}
                },
            }
        }
    }
}

/// Sends the queued chunks to `target`, connecting again when the connection is lost.
async fn deliver(target: Target, mut queued: mpsc::Receiver<Chunk>, stats: Arc<Stats>) {
    let mut outage = Outage::new(target);
    let mut link: Option<Link> = None;
    let mut retry: Option<Chunk> = None;
    loop {
        let Some(open) = link.as_mut() else {
            match Link::open(&outage.target).await {
                Ok(opened) => {
                    outage.ended();
                    link = Some(opened);
                }
                Err(error) => {
                    outage.failed(&error);
                    if queued.is_closed() && queued.is_empty() && retry.is_none() {
                        return;
                    }
                    tokio::time::sleep(outage.backoff()).await;
                }
            }
            continue;
        };
        let chunk = match retry.take() {
            Some(chunk) => chunk,
            None => match open.next(&mut queued).await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => return,
                Err(error) => {
                    outage.failed(&error);
                    link = None;
                    continue;
                }
            },
        };
        if let Err((error, written)) = open.send(&chunk.bytes).await {
            if matches!(open, Link::Udp(_)) && error.kind() == io::ErrorKind::ConnectionRefused {
                // Nothing listens on the port (an earlier datagram came back refused): not a
                // way to open again, only lines lost.
                stats
                    .statsd_dropped
                    .fetch_add(chunk.lines, Ordering::Relaxed);
                outage.refused();
                continue;
            }
            outage.failed(&error.to_string());
            link = None;
            // The lines not wholly written are sent again once on the next connection.
            let start = chunk.bytes[..written]
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |at| at + 1);
            let rest = chunk.bytes[start..].to_vec();
            let lines = rest.iter().filter(|b| **b == b'\n').count() as u64;
            if chunk.retried {
                stats.statsd_dropped.fetch_add(lines, Ordering::Relaxed);
            } else {
                retry = Some(Chunk {
                    bytes: rest,
                    lines,
                    retried: true,
                });
            }
        }
    }
}

/// One warning per outage, a line when it ends, and the backoff between attempts.
struct Outage {
    target: Target,
    warned: bool,
    /// Whether datagrams refused were told (once: a later datagram sent says nothing of its
    /// arrival).
    told_refused: bool,
    next_retry: Duration,
}

impl Outage {
    fn new(target: Target) -> Outage {
        Outage {
            target,
            warned: false,
            told_refused: false,
            next_retry: FIRST_RETRY,
        }
    }

    fn refused(&mut self) {
        if self.told_refused {
            tracing::debug!(statsd = %self.target, "statsd: datagrams refused");
        } else {
            self.told_refused = true;
            tracing::warn!(
                statsd = %self.target,
                "statsd: datagrams refused (nothing listens there); their lines are dropped \
                 until something does (calls are answered meanwhile)"
            );
        }
    }

    fn failed(&mut self, error: &str) {
        if self.warned {
            tracing::debug!(statsd = %self.target, error, "statsd: still unreachable");
        } else {
            self.warned = true;
            tracing::warn!(
                statsd = %self.target,
                error,
                "statsd: statistics cannot be sent; retrying (calls are answered meanwhile)"
            );
        }
    }

    fn ended(&mut self) {
        if self.warned {
            tracing::info!(statsd = %self.target, "statsd: statistics are sent again");
        }
        self.warned = false;
        self.next_retry = FIRST_RETRY;
    }

    fn backoff(&mut self) -> Duration {
        let wait = self.next_retry;
        self.next_retry = (wait * 2).min(LAST_RETRY);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_cleaned_as_the_reference_cleans_them() {
        for (key, name) in [
            ("shop.remote_address", "shop.remote_address"),
            (
                "shop.remote_address_10.0.0.1",
                "shop.remote_address_10_0_0_1",
            ),
            ("d.k_a:b|c", "d.k_a_b_c"),
            // The leftmost match, its last group at most three digits.
            ("d.v_1234.5.6.7", "d.v_1234_5_6_7"),
            ("d.v_1.2.3.4567", "d.v_1_2_3_4567"),
            ("d.v_1.2.3", "d.v_1.2.3"),
            ("d.v_1.2.3.4.5.6.7.8", "d.v_1_2_3_4.5_6_7_8"),
            ("d.v_é.1.2.3.4", "d.v_é.1_2_3_4"),
        ] {
            assert_eq!(sanitize(key), name, "{key}");
        }
    }

    #[test]
    fn tags_are_sorted_and_cleaned_as_gostats_writes_them() {
        let tags = [
            ("version", "1.2:3|4"),
            ("app", "rl"),
            ("", "x"),
            ("empty", ""),
            ("app", "ratelimit"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        assert_eq!(tag_suffix(&tags), ".__app=ratelimit.__version=1_2_3_4");
        assert_eq!(tag_suffix(&[]), "");
    }

    #[test]
    fn lines_are_cut_whole_at_the_chunk_size() {
        let mut lines = Lines::new(40);
        for value in [1, 22, 333] {
            lines.push("ratelimit.service.x", ".__a=b", value, "c");
        }
        let chunks = lines.finish();
        let text: Vec<_> = chunks
            .iter()
            .map(|c| (String::from_utf8(c.bytes.clone()).unwrap(), c.lines))
            .collect();
        assert_eq!(
            text,
            [
                ("ratelimit.service.x.__a=b:1|c\n".to_owned(), 1),
                ("ratelimit.service.x.__a=b:22|c\n".to_owned(), 1),
                ("ratelimit.service.x.__a=b:333|c\n".to_owned(), 1),
            ]
        );
        let mut lines = Lines::new(1432);
        lines.push("a", "", 1, "c");
        lines.push("b", "", 2, "ms");
        let chunks = lines.finish();
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].bytes, b"a:1|c\nb:2|ms\n");
        assert_eq!(chunks[0].lines, 2);
    }
}
