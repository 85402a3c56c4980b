//! A real `tollgate-server` process on free loopback ports, and a real gRPC client.
//!
//! The server is started on port 0 and its `serving` log line says where it listens; every later
//! log line is kept, so a test observes events (a reload, a drain) instead of waiting for them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use http::uri::PathAndQuery;
use tollgate_server::service::protocol::{
    code, Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse, UInt64Value,
    SHOULD_RATE_LIMIT,
};
use tonic::transport::Channel;
use tonic_prost::ProstCodec;

/// How long a server may take to start, reload or stop.
pub const DEADLINE: Duration = Duration::from_secs(20);

pub const BINARY: &str = env!("CARGO_BIN_EXE_tollgate-server");

/// One server process, killed on drop.
pub struct Server {
    child: Child,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    lines: mpsc::Receiver<String>,
    /// Every log line read so far.
    pub log: Vec<String>,
}

impl Server {
    /// Starts a server on `config`, reloading every 50 ms.
    pub fn start(config: &Path) -> Server {
        Server::start_with(config, &[])
    }

    pub fn start_with(config: &Path, extra: &[&str]) -> Server {
        Server::spawn(Server::command(config, extra))
    }

    /// The command [`Server::start_with`] runs, for a test to add to (an environment variable).
    pub fn command(config: &Path, extra: &[&str]) -> Command {
        let mut command = Command::new(BINARY);
        command
            .arg("--config")
            .arg(config)
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(["--reload-interval-ms", "50"])
            .args(extra);
        command
    }

    /// Starts a server with no flags but the reload interval, configured by `env` alone (the
    /// reference's variables) in an otherwise empty environment.
    pub fn start_env(env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(BINARY);
        command
            .env_clear()
            .envs(env.iter().copied())
            .args(["--reload-interval-ms", "50"]);
        Server::spawn(command)
    }

    /// Starts `command` and waits (bounded) until it says where it serves.
    pub fn spawn(command: Command) -> Server {
        let mut server = Server::launch(command);
        server.wait_serving();
        server
    }

    /// Starts a server configured by `env` alone, as [`Server::start_env`] does, without waiting
    /// for it to serve (a server waiting for its first configuration does not yet).
    pub fn launch_env(env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(BINARY);
        command
            .env_clear()
            .envs(env.iter().copied())
            .args(["--reload-interval-ms", "50"]);
        Server::launch(command)
    }

    /// Waits (bounded) until the server says where it serves.
    pub fn wait_serving(&mut self) {
        let serving = self.wait_for_log("serving");
        self.grpc = field(&serving, "grpc=").parse().expect("gRPC address");
        self.http = field(&serving, "http=").parse().expect("HTTP address");
    }

    /// Starts `command`, keeping its log lines.
    pub fn launch(mut command: Command) -> Server {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tollgate-server");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Server {
            child,
            grpc: "0.0.0.0:0".parse().unwrap(),
            http: "0.0.0.0:0".parse().unwrap(),
            lines,
            log: Vec::new(),
        }
    }

    /// Waits (bounded) for a log line containing `text` after those already seen; returns it.
    pub fn wait_for_log(&mut self, text: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.log.push(line.clone());
                    if line.contains(text) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no log line with {text:?} within {DEADLINE:?}; the log:\n{}",
                    self.log.join("\n")
                ),
            }
        }
    }

    /// A client connected to this server's gRPC port.
    pub async fn client(&self) -> Client {
        Client::connect(self.grpc).await
    }

    /// `GET path` on the HTTP port: the status code and the body.
    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(self.http, path)
    }

    /// The value of the Prometheus sample `name{labels}` (0 when absent).
    pub fn metric(&self, sample: &str) -> u64 {
        let (_, body) = self.get("/metrics");
        body.lines()
            .find_map(|line| line.strip_prefix(sample)?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Waits (bounded) for the sample `name{labels}` to reach `expected`, for a count the
    /// server makes just after the event a test saw (a connection it closed); returns the last
    /// value read (which may pass `expected`: the caller asserts what it needs).
    pub fn wait_for_metric(&self, sample: &str, expected: u64) -> u64 {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let value = self.metric(sample);
            if value >= expected || Instant::now() >= deadline {
                return value;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Waits (bounded) for the process to exit.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                while let Ok(line) = self.lines.try_recv() {
                    self.log.push(line);
                }
                return status;
            }
            assert!(Instant::now() < deadline, "the server did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value after `name` in a `key=value` log line.
pub fn field<'a>(line: &'a str, name: &str) -> &'a str {
    let start = line
        .find(name)
        .unwrap_or_else(|| panic!("{name} in {line}"))
        + name.len();
    line[start..].split_whitespace().next().unwrap_or("")
}

/// Runs the binary to completion (for the start-up failures): its status and stderr.
pub fn run_to_exit(args: &[&str]) -> (ExitStatus, String) {
    let mut command = Command::new(BINARY);
    command.args(args);
    run_command_to_exit(command)
}

/// Runs the binary with no flags and only `env` to completion: its status and stderr.
pub fn run_to_exit_env(env: &[(&str, &str)]) -> (ExitStatus, String) {
    let mut command = Command::new(BINARY);
    command.env_clear().envs(env.iter().copied());
    run_command_to_exit(command)
}

/// Runs `command` until it exits (bounded: one still running after [`DEADLINE`] is killed and the
/// test fails): its status and stderr.
pub fn run_command_to_exit(mut command: Command) -> (ExitStatus, String) {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tollgate-server");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "still running after {DEADLINE:?}; its stderr:\n{}",
                reader.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (status, reader.join().unwrap())
}

/// `GET path` on `addr`: the status code and the body.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let answer = http_request(addr, "GET", path, &[], "");
    (answer.status, answer.body)
}

/// An HTTP answer: the status code, the header fields (names in lower case) and the body.
pub struct HttpAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpAnswer {
    /// The value of the header field `name` (lower case), if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.as_str())
    }
}

/// `method path` on `addr` with `headers` and `body`, over one HTTP/1.1 connection.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> HttpAnswer {
    let mut stream = TcpStream::connect(addr).expect("connect to the HTTP port");
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (name, value) in headers {
        request += &format!("{name}: {value}\r\n");
    }
    request += &format!("Content-Length: {}\r\n\r\n{body}", body.len());
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    HttpAnswer {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// A gRPC client of `RateLimitService`.
#[derive(Clone)]
pub struct Client {
    grpc: tonic::client::Grpc<Channel>,
}

impl Client {
    /// A client on a channel made by the caller (over TLS, say).
    pub fn from_channel(channel: Channel) -> Client {
        Client {
            grpc: tonic::client::Grpc::new(channel),
        }
    }

    pub async fn connect(addr: SocketAddr) -> Client {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .expect("connect to the gRPC port");
        Client {
            grpc: tonic::client::Grpc::new(channel),
        }
    }

    /// Calls `ShouldRateLimit`.
    pub async fn call(
        &self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.call_with(request).await
    }

    /// Calls `ShouldRateLimit` with any message in the request's place (a malformed one).
    pub async fn call_with<M: prost::Message + Send + Sync + 'static>(
        &self,
        request: M,
    ) -> Result<RateLimitResponse, tonic::Status> {
        let mut grpc = self.grpc.clone();
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let codec = ProstCodec::<M, RateLimitResponse>::default();
        grpc.unary(
            tonic::Request::new(request),
            PathAndQuery::from_static(SHOULD_RATE_LIMIT),
            codec,
        )
        .await
        .map(tonic::Response::into_inner)
    }

    /// Calls with one descriptor per list of `(key, value)` entries.
    pub async fn ask(&self, domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitResponse {
        self.call(request(domain, descriptors))
            .await
            .expect("ShouldRateLimit answers")
    }
}

/// A request of `descriptors` in `domain`.
pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.as_bytes().to_vec(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: 0,
    }
}

pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.as_bytes().to_vec(),
                value: v.as_bytes().to_vec(),
            })
            .collect(),
        limit: None,
        hits_addend: None,
        is_negative_hits: false,
    }
}

pub fn addend(value: u64) -> Option<UInt64Value> {
    Some(UInt64Value { value })
}

/// A temporary directory holding one configuration file.
pub struct ConfigDir {
    pub dir: tempfile::TempDir,
}

impl ConfigDir {
    pub fn new() -> ConfigDir {
        ConfigDir {
            dir: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    /// Writes `text` to `name` (atomically: a reload never reads half a file) and returns its
    /// path.
    pub fn write(&self, name: &str, text: &str) -> std::path::PathBuf {
        let path = self.dir.path().join(name);
        let partial = self.dir.path().join(format!(".{name}.partial"));
        std::fs::write(&partial, text).unwrap();
        std::fs::rename(&partial, &path).unwrap();
        path
    }
}

/// A tollgate file for domain `shared` that reads `edge.yaml` (the reference form) and keeps its
/// counts in the store `kind` at `url` (with `store_lines` added to its `[store]`, failures
/// answered by `on_failure`, a generous timeout: on a busy machine a call may take longer than a
/// store's default, and a timeout would be answered by the failure policy, not counted); one
/// rule, `shared`: 10 a day per `tenant`, as a sliding log.
pub fn shared_store_file(kind: &str, url: &str, store_lines: &str, on_failure: &str) -> String {
    format!(
        "domain = \"shared\"\nreference = [\"edge.yaml\"]\n\n[store]\nkind = \"{kind}\"\n\
         url = \"{url}\"\n{store_lines}on_failure = \"{on_failure}\"\ntimeout = \"10s\"\n\n\
         [[rules]]\nname = \"shared\"\nalgorithm = \"sliding_log\"\nlimit = 10\n\
         period = \"24h\"\ndescriptors = [{{ key = \"tenant\" }}]\n"
    )
}

/// `calls` calls at once of `tenant = acme` in domain `shared`, alternating between `a` and `b`:
/// how many were admitted.
pub async fn admitted_alternating(a: &Client, b: &Client, calls: usize) -> usize {
    let calls: Vec<_> = (0..calls)
        .map(|i| {
            let client = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                let tenant = [("tenant", "acme")];
                client.ask("shared", &[&tenant]).await.overall_code
            })
        })
        .collect();
    let mut admitted = 0;
    for call in calls {
        if call.await.expect("the call's task ends") == code::OK {
            admitted += 1;
        }
    }
    admitted
}
