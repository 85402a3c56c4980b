//! Real Redis servers for tests and benches: `redis-server` (or `valkey-server`) processes on free
//! loopback ports, in their own temporary directories, stopped on drop.
//!
//! A missing server binary is a failure with a message naming the Debian package, never a
//! skipped test. (`scripts/test.sh` installs both engines.)

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to answer its first PING.
const STARTUP: Duration = Duration::from_secs(10);

/// The engines the Redis store is tested on: Redis itself and Valkey, the Linux Foundation's fork
/// (same protocol, same scripting). A test suite runs once per engine (`redis::…`, `valkey::…`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// `redis-server`.
    Redis,
    /// `valkey-server`.
    Valkey,
}

impl Engine {
    fn server_binary(self) -> &'static str {
        match self {
            Engine::Redis => "redis-server",
            Engine::Valkey => "valkey-server",
        }
    }

    fn cli_binary(self) -> &'static str {
        match self {
            Engine::Redis => "redis-cli",
            Engine::Valkey => "valkey-cli",
        }
    }

    /// How to install the engine on Debian 12.
    fn install(self) -> &'static str {
        match self {
            Engine::Redis => {
                "the Debian packages `redis-server` and `redis-tools` \
                (`apt-get install -y redis-server redis-tools`)"
            }
            Engine::Valkey => {
                "the Debian packages `valkey-server` and `valkey-tools` from \
                bookworm-backports (`apt-get install -y -t bookworm-backports valkey-server`)"
            }
        }
    }

    /// A standalone server on a free loopback port.
    pub fn server(self) -> RedisServer {
        RedisServer::start_on(self, &[])
    }

    /// A server with extra arguments.
    pub fn server_with(self, extra: &[&str]) -> RedisServer {
        RedisServer::start_on(self, extra)
    }

    /// A cluster of three masters.
    pub fn cluster(self) -> RedisCluster {
        RedisCluster::start_on(self)
    }

    /// A sentinel (the server binary in sentinel mode) watching the master on `master_port` as
    /// `mymaster`, with a quorum of 2, calling it down after 500 ms without an answer.
    pub fn sentinel(self, master_port: u16) -> SentinelProcess {
        SentinelProcess::start(self, master_port)
    }
}

/// One sentinel process, stopped on drop.
pub struct SentinelProcess {
    /// The loopback port it listens on.
    pub port: u16,
    child: Child,
    dir: PathBuf,
}

impl SentinelProcess {
    fn start(engine: Engine, master_port: u16) -> SentinelProcess {
        for _ in 0..5 {
            let port = free_port();
            let dir = temp_dir(port);
            // Sentinel rewrites its file: it gets one of its own.
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor mymaster 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds mymaster 500\n\
                     sentinel failover-timeout mymaster 5000\n\
                     sentinel parallel-syncs mymaster 1\n",
                    dir.display()
                ),
            )
            .expect("write sentinel.conf");
            let mut child = Command::new(engine.server_binary())
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot start {} --sentinel: {e}", engine.server_binary())
                });
            if wait_until_up(port, &mut child) {
                return SentinelProcess { port, child, dir };
            }
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(&dir);
        }
        panic!("a sentinel did not come up on a free loopback port");
    }

    /// Runs an inline command against the sentinel.
    pub fn run(&self, line: &str) -> String {
        command(self.port, line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One server process.
pub struct RedisServer {
    /// The loopback port it listens on.
    pub port: u16,
    engine: Engine,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().unwrap().port()
}

fn temp_dir(port: u16) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-redis-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the server's directory");
    dir
}

fn spawn(engine: Engine, port: u16, dir: &PathBuf, extra: &[String]) -> Child {
    let binary = engine.server_binary();
    let mut command = Command::new(binary);
    command
        .args(["--port", &port.to_string()])
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match command.spawn() {
        Ok(child) => child,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => panic!(
            "`{binary}` is not on PATH: the Redis store's tests need a real server. Install {}, \
             or run ./scripts/test.sh, which does.",
            engine.install()
        ),
        Err(error) => panic!("cannot start {binary}: {error}"),
    }
}

/// Field `field` of `name`'s line in `INFO commandstats` of the server on `port` (1: its calls,
/// 3: the microseconds spent in it); 0 when it never ran.
pub fn command_stat(port: u16, name: &str, field: usize) -> u64 {
    let line = "INFO commandstats";
    let info = command(port, line).unwrap_or_else(|e| panic!("{line}: {e}"));
    info.lines()
        .find(|l| l.starts_with(&format!("cmdstat_{name}:")))
        .and_then(|l| l.split(['=', ',']).nth(field))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Sends one inline command and returns the raw reply (bounded wait).
pub fn command(port: u16, line: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(format!("{line}\r\n").as_bytes())?;
    let mut reply = Vec::new();
    let mut buffer = [0u8; 16 * 1024];
    loop {
        let n = stream.read(&mut buffer)?;
        reply.extend_from_slice(&buffer[..n]);
        if n == 0 || is_complete(&reply) {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// Whether a RESP reply (simple, error, integer or bulk string) has fully arrived.
fn is_complete(reply: &[u8]) -> bool {
    let Some(end) = reply.windows(2).position(|w| w == b"\r\n") else {
        return false;
    };
    match reply.first() {
        Some(b'$') => {
            let len: i64 = String::from_utf8_lossy(&reply[1..end]).parse().unwrap_or(0);
            len < 0 || reply.len() >= end + 2 + len as usize + 2
        }
        _ => true,
    }
}

fn wait_until_up(port: u16, child: &mut Child) -> bool {
    let deadline = Instant::now() + STARTUP;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        if command(port, "PING").is_ok_and(|r| r.starts_with("+PONG")) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

impl RedisServer {
    /// A standalone `redis-server` on a free loopback port.
    pub fn start() -> RedisServer {
        Self::start_on(Engine::Redis, &[])
    }

    /// A `redis-server` with extra arguments.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        Self::start_on(Engine::Redis, extra)
    }

    /// A server of `engine` with extra arguments.
    pub fn start_on(engine: Engine, extra: &[&str]) -> RedisServer {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        // A port found free can be taken before the server binds it: try a few.
        for _ in 0..5 {
            let port = free_port();
            let dir = temp_dir(port);
            let mut child = spawn(engine, port, &dir, &extra);
            if wait_until_up(port, &mut child) {
                return RedisServer {
                    port,
                    engine,
                    child: Some(child),
                    dir,
                    extra,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(&dir);
        }
        panic!(
            "{} did not come up on a free loopback port",
            engine.server_binary()
        );
    }

    /// The server's `redis://` URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs an inline command against the server.
    pub fn run(&self, line: &str) -> String {
        command(self.port, line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    /// How many times `command` ran, from `INFO commandstats` (0 when it never ran).
    pub fn command_calls(&self, command: &str) -> u64 {
        self.command_stat(command, 1)
    }

    /// Microseconds the server spent in `command`, from `INFO commandstats`.
    pub fn command_usec(&self, command: &str) -> u64 {
        self.command_stat(command, 3)
    }

    fn command_stat(&self, command: &str, field: usize) -> u64 {
        command_stat(self.port, command, field)
    }

    /// Kills the server (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty: nothing was saved).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + STARTUP;
        loop {
            let mut child = spawn(self.engine, self.port, &self.dir, &self.extra);
            if wait_until_up(self.port, &mut child) {
                self.child = Some(child);
                return;
            }
            let _ = child.kill();
            let _ = child.wait();
            assert!(Instant::now() < deadline, "the server did not restart");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("server running").id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A paused server must be able to die.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of three masters (no replicas) on free loopback ports.
pub struct RedisCluster {
    /// The masters, one server each.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// A `redis-server` cluster.
    pub fn start() -> RedisCluster {
        Self::start_on(Engine::Redis)
    }

    /// A cluster of `engine`'s servers, made by its own command-line client.
    pub fn start_on(engine: Engine) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                engine.server_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let cli = engine.cli_binary();
        let output = Command::new(cli)
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run `{cli}` ({e}): install {}", engine.install()));
        assert!(
            output.status.success(),
            "{cli} --cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + STARTUP;
        while !cluster
            .nodes
            .iter()
            .all(|n| n.run("CLUSTER INFO").contains("cluster_state:ok"))
        {
            assert!(Instant::now() < deadline, "the cluster did not become ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    /// Every master's `redis://` URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// `calls` of a command, summed over the masters.
    pub fn command_calls(&self, command: &str) -> u64 {
        self.nodes.iter().map(|n| n.command_calls(command)).sum()
    }

    /// The node (index) serving a slot.
    pub fn node_of_slot(&self, slot: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| owns(n, slot))
            .expect("some node serves every slot")
    }
}

fn owns(node: &RedisServer, slot: u16) -> bool {
    // `CLUSTER NODES`: the line flagged `myself` lists this node's slot ranges.
    let nodes = node.run("CLUSTER NODES");
    nodes
        .lines()
        .find(|l| l.contains("myself"))
        .map(|line| {
            line.split_whitespace().skip(8).any(|range| {
                let mut bounds = range.split('-').map(|b| b.parse::<u16>());
                match (bounds.next(), bounds.next()) {
                    (Some(Ok(a)), Some(Ok(b))) => (a..=b).contains(&slot),
                    (Some(Ok(a)), None) => a == slot,
                    _ => false,
                }
            })
        })
        .unwrap_or(false)
}
