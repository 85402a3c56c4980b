//! Started as the reference is deployed: no flags, only the reference's environment, the
//! configuration in a directory laid out as a Kubernetes ConfigMap volume, a real redis-server.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use tollgate_server::service::protocol::code;

use crate::redis_server::RedisServer;
use crate::support::{run_to_exit_env, Server};

/// A ConfigMap volume as the kubelet writes it: the files in a timestamped directory, `..data`
/// a symlink to it, and each file a symlink through `..data`.
struct ConfigMapVolume {
    dir: PathBuf,
    generation: u32,
}

impl ConfigMapVolume {
    fn new(dir: PathBuf, file: &str, content: &str) -> ConfigMapVolume {
        std::fs::create_dir_all(&dir).unwrap();
        let mut volume = ConfigMapVolume { dir, generation: 0 };
        let data = volume.write_generation(file, content);
        symlink(&data, volume.dir.join("..data")).unwrap();
        symlink(Path::new("..data").join(file), volume.dir.join(file)).unwrap();
        volume
    }

    /// The kubelet's update: a new timestamped directory, a new link, renamed over `..data`
    /// (atomic), then the old directory removed.
    fn update(&mut self, file: &str, content: &str) {
        let old = std::fs::read_link(self.dir.join("..data")).unwrap();
        let data = self.write_generation(file, content);
        symlink(&data, self.dir.join("..data_tmp")).unwrap();
        std::fs::rename(self.dir.join("..data_tmp"), self.dir.join("..data")).unwrap();
        std::fs::remove_dir_all(self.dir.join(old)).unwrap();
    }

    fn write_generation(&mut self, file: &str, content: &str) -> PathBuf {
        self.generation += 1;
        let name = PathBuf::from(format!(
            "..2026_11_27_19_00_0{}.00000000{}",
            self.generation, self.generation
        ));
        std::fs::create_dir(self.dir.join(&name)).unwrap();
        std::fs::write(self.dir.join(&name).join(file), content).unwrap();
        name
    }
}

fn echo_config(per_year: u32) -> String {
    format!(
        "domain: echo-ratelimit\ndescriptors:\n  - key: PATH\n    value: \"/\"\n    rate_limit:\n      unit: year\n      requests_per_unit: {per_year}\n  - key: PATH\n    rate_limit:\n      unit: year\n      requests_per_unit: 100\n"
    )
}

/// Istio's sample (`samples/ratelimit/rate-limit-service.yaml`), its variables exactly, with
/// the addresses moved to loopback and free ports, and Redis at a real server's port.
fn istio_env<'a>(root: &'a str, redis: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("LOG_LEVEL", "debug"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", redis),
        ("USE_STATSD", "false"),
        ("RUNTIME_ROOT", root),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("HOST", "127.0.0.1"),
        ("GRPC_HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_PORT", "0"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istios_sample_runs_unchanged_and_follows_its_configmap() {
    let redis = RedisServer::start();
    let redis_addr = redis
        .url()
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().join("data");
    let mut volume = ConfigMapVolume::new(
        root.join("ratelimit/config"),
        "config.yaml",
        &echo_config(1),
    );
    let root_text = root.display().to_string();
    let mut env = istio_env(&root_text, &redis_addr);
    // A variable the sample does not set, and tollgate-server does not act on: named once.
    env.push(("DEBUG_PORT", "6070"));
    let server = Server::start_env(&env);
    // Every variable the sample sets is acted on: only the one added is named, once.
    let named: Vec<&String> = server
        .log
        .iter()
        .filter(|l| l.contains(" is set: "))
        .collect();
    assert_eq!(named.len(), 1, "{:#?}", server.log);
    assert!(named[0].contains("DEBUG_PORT is set: "), "{named:?}");

    let client = server.client().await;
    let root_path = [("PATH", "/")];
    let first = client.ask("echo-ratelimit", &[&root_path]).await;
    assert_eq!(first.overall_code, code::OK);
    assert_eq!(first.statuses[0].limit_remaining, 0);
    let second = client.ask("echo-ratelimit", &[&root_path]).await;
    assert_eq!(second.overall_code, code::OVER_LIMIT);
    let other = client.ask("echo-ratelimit", &[&[("PATH", "/other")]]).await;
    assert_eq!(other.statuses[0].limit_remaining, 99);

    // The counts live in Redis: a new process on the same variables sees them.
    drop(client);
    drop(server);
    let mut server = Server::start_env(&env);
    let client = server.client().await;
    let again = client.ask("echo-ratelimit", &[&[("PATH", "/other")]]).await;
    assert_eq!(again.statuses[0].limit_remaining, 98);

    // The kubelet swaps `..data`: the new limit takes over, the hidden copies are not read
    // twice.
    volume.update("config.yaml", &echo_config(5));
    server.wait_for_log("configuration reloaded");
    let after = client.ask("echo-ratelimit", &[&root_path]).await;
    let limit = after.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(limit.requests_per_unit, 5);
    assert_eq!(after.overall_code, code::OK);

    // The ConfigMap emptied (its file gone): the limits in force stay.
    std::fs::remove_file(volume.dir.join("config.yaml")).unwrap();
    server.wait_for_log("configuration not reloaded");
    let kept = client.ask("echo-ratelimit", &[&root_path]).await;
    assert_eq!(
        kept.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        5
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_ignoring_dotfiles_a_configmap_is_read_twice_as_the_reference_reads_it() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().join("data");
    ConfigMapVolume::new(
        root.join("ratelimit/config"),
        "config.yaml",
        &echo_config(1),
    );
    let root_text = root.display().to_string();
    let (status, stderr) = run_to_exit_env(&[
        ("RUNTIME_ROOT", &root_text),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("BACKEND_TYPE", "memory"),
        ("HOST", "127.0.0.1"),
        ("GRPC_HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_PORT", "0"),
    ]);
    assert!(!status.success());
    assert!(
        stderr.contains("\"echo-ratelimit\" is configured twice"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_variable_that_cannot_be_read_stops_the_start_naming_it() {
    for (env, says) in [
        (
            ("GRPC_PORT", "eighty"),
            "GRPC_PORT=\"eighty\": expected a number",
        ),
        (
            ("RUNTIME_IGNOREDOTFILES", "yes"),
            "RUNTIME_IGNOREDOTFILES=\"yes\"",
        ),
        (
            ("BACKEND_TYPE", "memcache"),
            "BACKEND_TYPE=memcache: not supported",
        ),
        (
            ("GRPC_SERVER_USE_TLS", "true"),
            "GRPC_SERVER_TLS_CERT: required",
        ),
        (("LOG_LEVEL", "loud"), "LOG_LEVEL=\"loud\""),
    ] {
        let (status, stderr) = run_to_exit_env(&[env]);
        assert!(!status.success(), "{env:?}");
        assert!(stderr.contains(says), "{env:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_to_start_without_its_configuration_it_serves_and_takes_it_when_it_comes() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().join("data");
    let root_text = root.display().to_string();
    let env = [
        ("RUNTIME_ROOT", root_text.as_str()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ("BACKEND_TYPE", "memory"),
        ("HOST", "127.0.0.1"),
        ("GRPC_HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_PORT", "0"),
    ];
    // Without the switch, a directory that is not there stops the start.
    let (status, stderr) = run_to_exit_env(&env[..2]);
    assert!(!status.success());
    assert!(stderr.contains("No such file or directory"), "{stderr}");

    let mut server = Server::start_env(&env);
    assert_eq!(server.get("/healthcheck").0, 200);
    let client = server.client().await;
    let before = client.ask("echo-ratelimit", &[&[("PATH", "/")]]).await;
    assert_eq!(before.statuses[0].current_limit, None);
    ConfigMapVolume::new(
        root.join("ratelimit/config"),
        "config.yaml",
        &echo_config(1),
    );
    server.wait_for_log("configuration reloaded");
    let after = client.ask("echo-ratelimit", &[&[("PATH", "/")]]).await;
    assert_eq!(
        after.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_given_win_over_the_variables() {
    let temp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(temp.path().join("config")).unwrap();
    std::fs::write(temp.path().join("config/echo.yaml"), echo_config(1)).unwrap();
    let root = temp.path().display().to_string();
    // The variables name a port another process holds: the start would fail on them.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let env = [
        ("RUNTIME_ROOT", root.as_str()),
        ("BACKEND_TYPE", "memory"),
        ("USE_STATSD", "false"),
        ("HOST", "127.0.0.1"),
        ("PORT", port.as_str()),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", port.as_str()),
    ];
    let (status, stderr) = run_to_exit_env(&env);
    assert!(!status.success());
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
    let mut command = std::process::Command::new(crate::support::BINARY);
    command.env_clear().envs(env.iter().copied()).args([
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
    ]);
    let server = Server::spawn(command);
    assert_ne!(server.grpc.port().to_string(), port);
    let answer = server
        .client()
        .await
        .ask("echo-ratelimit", &[&[("PATH", "/")]])
        .await;
    assert_eq!(
        answer.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1
    );
}
