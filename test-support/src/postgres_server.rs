//! Real Postgres servers for tests and benches: a cluster made by `initdb` in a temporary
//! directory, a `postgres` process on a free loopback port, stopped and removed on drop.
//!
//! The binaries are found on `PATH`, else in Debian's `/usr/lib/postgresql/<version>/bin` (the
//! `postgresql` package puts them there, off `PATH`). Postgres refuses to run as root: as root,
//! the cluster is owned by, and the server run as, the `postgres` user (made by Debian's
//! package), else `nobody`. A missing binary is a failure naming the package, never a skipped
//! test. (`scripts/test.sh` installs it.)

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to accept its first connection.
const STARTUP: Duration = Duration::from_secs(30);

/// One Postgres server, with its data directory.
pub struct PgServer {
    /// The loopback port it listens on.
    pub port: u16,
    dir: PathBuf,
    bin: PathBuf,
    owner: Option<(u32, u32)>,
    child: Option<Child>,
    durable: bool,
}

impl PgServer {
    /// A server for tests: `fsync` off (a killed server still loses nothing it acknowledged:
    /// its WAL is written before each commit returns; only a crash of the machine could).
    pub async fn start() -> PgServer {
        Self::start_with(false).await
    }

    /// A server as one runs in production: every commit flushed to disk.
    pub async fn start_durable() -> PgServer {
        Self::start_with(true).await
    }

    async fn start_with(durable: bool) -> PgServer {
        let bin = binaries();
        let owner = if is_root() {
            Some(unprivileged())
        } else {
            None
        };
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("tollgate-pg-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("give the directory away");
        }
        let data = dir.join("data");
        let status = as_owner(Command::new(bin.join("initdb")), owner)
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "tollgate",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.join("initdb").display()));
        assert!(
            status.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&status.stderr)
        );
        let mut server = PgServer {
            port,
            dir,
            bin,
            owner,
            child: None,
            durable,
        };
        server.run().await;
        server
    }

    /// The URL of the server's database.
    pub fn url(&self) -> String {
        format!(
            "postgres://tollgate@127.0.0.1:{}/postgres?connect_timeout=2",
            self.port
        )
    }

    /// Kills the server at once (SIGKILL), as a crash would: what it acknowledged must come back
    /// with it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server the way an operator does (a fast shutdown: SIGINT).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + STARTUP;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on its data and port (after [`kill`](Self::kill) or
    /// [`stop`](Self::stop)).
    pub async fn restart(&mut self) {
        self.run().await;
    }

    async fn run(&mut self) {
        let deadline = Instant::now() + STARTUP;
        loop {
            let mut child = self.spawn();
            if self.accepts(&mut child, deadline).await {
                self.child = Some(child);
                return;
            }
            let _ = child.kill();
            let _ = child.wait();
            // A killed server's backends may hold its shared memory a moment longer.
            assert!(
                Instant::now() < deadline,
                "postgres did not start on port {} (see {})",
                self.port,
                self.dir.join("log").display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn spawn(&self) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("log"))
            .expect("open the server's log");
        if let Some((uid, gid)) = self.owner {
            let _ = std::os::unix::fs::chown(self.dir.join("log"), Some(uid), Some(gid));
        }
        let fsync = if self.durable { "on" } else { "off" };
        as_owner(Command::new(self.bin.join("postgres")), self.owner)
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.dir.display()))
            .args(["-c", &format!("fsync={fsync}")])
            .args(["-c", "max_connections=300"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.join("postgres").display()))
    }

    /// Whether the server accepts a connection and a query before `deadline` (false when it
    /// exited).
    async fn accepts(&self, child: &mut Child, deadline: Instant) -> bool {
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            let url = self.url();
            let connect = tokio_postgres::connect(&url, tokio_postgres::NoTls);
            if let Ok(Ok((client, connection))) =
                tokio::time::timeout(Duration::from_secs(2), connect).await
            {
                let task = tokio::spawn(connection);
                let answered = client.simple_query("SELECT 1").await.is_ok();
                drop(client);
                let _ = task.await;
                if answered {
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Runs `sql` on the server's database (a test's own look at the rows).
    pub async fn query(&self, sql: &str) -> Vec<tokio_postgres::SimpleQueryMessage> {
        let (client, connection) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
            .await
            .expect("connect to the test server");
        let task = tokio::spawn(connection);
        let answer = client.simple_query(sql).await.expect("the query runs");
        drop(client);
        let _ = task.await;
        answer
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // A fast shutdown rather than a kill: a killed postmaster leaves its shared memory
        // segment behind until a server starts again on the same data.
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn as_owner(mut command: Command, owner: Option<(u32, u32)>) -> Command {
    if let Some((uid, gid)) = owner {
        // Set in the child before it runs the binary (supplementary groups are dropped too).
        command.uid(uid).gid(gid);
    }
    command
}

fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0")
}

/// The `postgres` user's ids, else `nobody`'s.
fn unprivileged() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    for name in ["postgres", "nobody"] {
        for line in passwd.lines() {
            let fields: Vec<&str> = line.split(':').collect();
            if fields.len() > 3 && fields[0] == name {
                if let (Ok(uid), Ok(gid)) = (fields[2].parse(), fields[3].parse()) {
                    return (uid, gid);
                }
            }
        }
    }
    panic!("running as root, and neither a `postgres` nor a `nobody` user to run postgres as");
}

/// The directory of `initdb` and `postgres`: on `PATH`, else Debian's newest.
fn binaries() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        if dir.join("initdb").is_file() && dir.join("postgres").is_file() {
            return dir;
        }
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "no initdb and postgres on PATH or in /usr/lib/postgresql/*/bin: install the \
             Debian package `postgresql` (`apt-get install -y postgresql`)"
        )
    })
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("a local address").port()
}
