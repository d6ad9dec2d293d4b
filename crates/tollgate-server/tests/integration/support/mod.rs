//! Starts the real `tollgate serve` on free loopback ports, with rule files in a temporary
//! directory, and stops it when dropped. Also starts a throwaway `redis-server`.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The library tests' proxy: links between regions that a test delays, cuts and heals.
pub mod docker;
#[path = "../../../../tollgate/tests/integration/support/proxy.rs"]
pub mod proxy;

pub struct Server {
    child: Child,
    pub http: String,
    pub grpc: String,
    pub dir: tempfile::TempDir,
    log: mpsc::Receiver<String>,
    /// Every log line read so far.
    seen: std::sync::Mutex<Vec<String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `http://` and the address a log line gives as `addr=`.
fn address(line: &str) -> String {
    let addr = line
        .split_whitespace()
        .find_map(|field| field.strip_prefix("addr="))
        .unwrap_or_else(|| panic!("no address in `{line}`"));
    format!("http://{addr}")
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Server {
    /// Serves `files` (name, YAML), with `args` added to `serve`.
    pub fn start(files: &[(&str, &str)], args: &[&str]) -> Self {
        Self::start_under(&[], files, args)
    }

    /// As [`start`](Self::start), run by `wrapper` (a command and its arguments, such as
    /// `prlimit --nofile=256:256`), if any.
    pub fn start_under(wrapper: &[&str], files: &[(&str, &str)], args: &[&str]) -> Self {
        // Port 0: the server binds free ports itself and logs them, so no other process can
        // take a port between its choice and its bind.
        let mut all = vec!["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"];
        all.extend_from_slice(args);
        Self::start_as_given(wrapper, files, &all)
    }

    /// As [`start_under`](Self::start_under), listening where the files and the environment
    /// say (no `--http` or `--grpc` of its own).
    pub fn start_as_given(wrapper: &[&str], files: &[(&str, &str)], args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let binary = env!("CARGO_BIN_EXE_tollgate");
        let mut command = match wrapper {
            [] => Command::new(binary),
            [program, rest @ ..] => {
                let mut command = Command::new(program);
                command.args(rest).arg(binary);
                command
            }
        };
        command.arg("serve");
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            command.arg("--config").arg(path);
        }
        command
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("the tollgate binary runs");
        let stderr = child.stderr.take().unwrap();
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut server = Self {
            child,
            http: String::new(),
            grpc: String::new(),
            dir,
            log,
            seen: std::sync::Mutex::default(),
        };
        // The gRPC listener binds and logs first.
        let within = Duration::from_secs(20);
        server.grpc =
            address(&server.wait_for_log("gRPC (Envoy rate limit service) listening", within));
        server.http = address(&server.wait_for_log("HTTP listening", within));
        server
    }

    /// The path of a rule file of this server.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Waits until the log has a line containing `text`; returns the line.
    pub fn wait_for_log(&self, text: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log.recv_timeout(left) {
                Ok(line) => {
                    self.seen.lock().unwrap().push(line.clone());
                    if line.contains(text) {
                        return line;
                    }
                }
                Err(_) => panic!("no log line with `{text}` within {within:?}"),
            }
        }
    }

    /// The lines logged within `within` from now, and before unread.
    pub fn lines_within(&self, within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        let mut lines = Vec::new();
        while let Ok(line) = self
            .log
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.seen.lock().unwrap().push(line.clone());
            lines.push(line);
        }
        lines
    }

    /// The first line read so far (while starting, or waiting for another) containing `text`.
    pub fn logged(&self, text: &str) -> Option<String> {
        let seen = self.seen.lock().unwrap();
        seen.iter().find(|line| line.contains(text)).cloned()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it exited cleanly.
    pub fn terminate(mut self) -> bool {
        signal(self.child.id(), "TERM");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.success();
            }
            assert!(Instant::now() < deadline, "tollgate did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub fn signal(pid: u32, name: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{name} {pid}");
}

/// Runs `tollgate` with `args`; returns (exit code, stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    run_with_env(&[], args)
}

/// Runs `tollgate` with `args` and the settings `env` added to the environment; returns
/// (exit code, stdout, stderr).
pub fn run_with_env(env: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub struct Redis {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `redis-server` on `port`, keeping nothing, with `dir` its directory and `extra` arguments.
fn redis_server(port: u16, dir: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new("redis-server");
    command
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .args(extra)
        .arg("--dir")
        .arg(dir);
    command
}

impl Redis {
    /// Starts on a free port. A port found free can be taken before redis-server binds it,
    /// so it counts as started only when it says it accepts connections, and it tries
    /// another port when it exits instead.
    pub fn start() -> Self {
        for _ in 0..5 {
            let port = free_port();
            let dir = tempfile::tempdir().unwrap();
            let mut child = redis_server(port, dir.path(), &[])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server is installed");
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            // Until it is ready or gone (the end of its output).
            let ready = lines
                .by_ref()
                .map_while(Result::ok)
                .any(|line| line.contains("Ready to accept connections"));
            if ready {
                // The rest of its log, read so that its writes never block.
                std::thread::spawn(move || lines.for_each(drop));
                return Self {
                    child,
                    port,
                    _dir: dir,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis-server did not start on any of five free ports");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// What `redis-cli` prints for `args` against this server.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli is installed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// POSTs `body` to `/v1/check`; returns the status, headers and JSON.
pub async fn check(
    client: &reqwest::Client,
    server: &str,
    body: serde_json::Value,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    let response = client
        .post(format!("{server}/v1/check"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let json = response.json().await.unwrap_or(serde_json::Value::Null);
    (status, headers, json)
}

pub fn header<'a>(headers: &'a reqwest::header::HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// Calls the admin API at `server`: `method` on `/v1/rules{path}`, with the bearer `token`
/// and `body` as JSON.
pub async fn admin(
    server: &str,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<&serde_json::Value>,
) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .request(method, format!("{server}/v1/rules{path}"))
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.json(body);
    }
    request.send().await.unwrap()
}

/// The ids of the rules the admin API at `server` lists.
pub async fn admin_ids(server: &str, token: &str) -> Vec<String> {
    let listed: serde_json::Value = admin(server, token, reqwest::Method::GET, "", None)
        .await
        .json()
        .await
        .unwrap();
    listed["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["id"].as_str().map(String::from))
        .collect()
}

/// Waits, up to 10 s, until `ready` says the state it looks for has come.
pub async fn eventually<F, Fut>(what: &str, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready().await {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Returns once at least `needed` is left of the wall clock's current window of `period`
/// (windows aligned to multiples of `period` since the epoch, as fixed windows are, and
/// Envoy's ratelimit's), waiting into the next window when less is: a burst of checks that
/// takes less than `needed` then counts against one window, never two. `needed` equal to
/// `period` always waits for a window to begin.
pub async fn clear_of_a_windows_turn(period: Duration, needed: Duration) {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let period_ms = period.as_millis();
    let left = Duration::from_millis((period_ms - since_epoch.as_millis() % period_ms) as u64);
    if left < needed {
        tokio::time::sleep(left + Duration::from_millis(10)).await;
    }
}

/// At least 5 s left of the current minute, for a burst counted against a fixed minute.
pub async fn clear_of_a_minutes_turn() {
    clear_of_a_windows_turn(Duration::from_secs(60), Duration::from_secs(5)).await;
}

/// What `/metrics` of `server` says now.
pub async fn metrics(server: &str) -> String {
    reqwest::get(format!("{server}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// An Envoy rate limit descriptor of `(key, value)` entries.
pub fn descriptor(
    entries: &[(&str, &str)],
) -> envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
        RateLimitDescriptor, rate_limit_descriptor::Entry,
    };
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// A Redis Cluster of three masters and a replica each, a master failed over when unreachable
/// for a second; the slots of a dead master do not stop the others'.
pub struct Cluster {
    pub nodes: Vec<Child>,
    pub ports: Vec<u16>,
    _dirs: Vec<tempfile::TempDir>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.kill();
            let _ = node.wait();
        }
    }
}

/// A free port for a cluster node, whose bus port (port + 10000) is free too: from 2000 to
/// 9999 (bus ports to 19999), below both the range Linux hands out as connections' own ports
/// (from 32768), where a port found free can be given to a connection before redis-server
/// binds it, and the ports the library's tests take (from 20000).
fn cluster_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    use std::sync::atomic::Ordering;
    // Spread test processes apart, then probe upwards.
    let start = 2_000 + (std::process::id() % 160) as u16 * 50;
    let _ = NEXT.compare_exchange(0, start, Ordering::SeqCst, Ordering::SeqCst);
    loop {
        let port = NEXT.fetch_add(1, Ordering::SeqCst);
        let port = 2_000 + (port - 2_000) % 8_000;
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}

impl Cluster {
    /// Starts a node on a free port; on another when it exits at once (its port was taken
    /// between the probe and the bind).
    fn start_node(&mut self) {
        for _ in 0..5 {
            let port = cluster_port();
            let dir = tempfile::tempdir().unwrap();
            let cluster = [
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                "1000",
                "--cluster-require-full-coverage",
                "no",
                "--repl-diskless-sync-delay",
                "0",
            ];
            let mut child = redis_server(port, dir.path(), &cluster)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server is installed");
            let deadline = Instant::now() + Duration::from_secs(20);
            // One that could not bind exits at once; after that, PONG is its own.
            std::thread::sleep(Duration::from_millis(50));
            loop {
                let alive = child.try_wait().ok().flatten().is_none();
                if alive && self.cli(port, &["ping"]).contains("PONG") {
                    self.nodes.push(child);
                    self.ports.push(port);
                    self._dirs.push(dir);
                    return;
                }
                if !alive {
                    break;
                }
                assert!(Instant::now() < deadline, "a node did not start");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("a cluster node did not start on any of five free ports");
    }

    pub fn start() -> Self {
        let mut cluster = Self {
            nodes: Vec::new(),
            ports: Vec::new(),
            _dirs: Vec::new(),
        };
        for _ in 0..6 {
            cluster.start_node();
        }
        let addresses: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(created.success(), "redis-cli --cluster create failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        for port in &cluster.ports {
            loop {
                let info = cluster.cli(*port, &["cluster", "info"]);
                let replication = cluster.cli(*port, &["info", "replication"]);
                if info.contains("cluster_state:ok")
                    && (replication.contains("role:master")
                        || replication.contains("master_link_status:up"))
                {
                    break;
                }
                assert!(Instant::now() < deadline, "the cluster did not settle");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        cluster
    }

    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli is installed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The node URLs, for a `cluster:` store.
    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// The ports of the masters now.
    pub fn masters(&self) -> Vec<u16> {
        self.ports
            .iter()
            .copied()
            .filter(|p| {
                self.cli(*p, &["info", "replication"])
                    .contains("role:master")
            })
            .collect()
    }

    /// Kills the node on `port` (SIGKILL).
    pub fn kill(&mut self, port: u16) {
        let i = self.ports.iter().position(|p| *p == port).expect("a node");
        let _ = self.nodes[i].kill();
        let _ = self.nodes[i].wait();
    }
}

/// PEM files of a throwaway CA, a server certificate it signed (for `localhost` and
/// 127.0.0.1) and a client certificate it signed, written to `dir`: (ca, cert, key,
/// client cert, client key).
pub fn certificates(dir: &std::path::Path) -> [std::path::PathBuf; 5] {
    certificates_for(dir, &["localhost", "127.0.0.1"], &["envoy"])
}

/// As [`certificates`], with the server's and the client's certificates for these names.
pub fn certificates_for(
    dir: &std::path::Path,
    server: &[&str],
    client: &[&str],
) -> [std::path::PathBuf; 5] {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |names: Vec<String>| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let names = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
    let (server_cert, server_key) = leaf(names(server));
    let (client_cert, client_key) = leaf(names(client));
    let files = [
        ("ca.pem", ca.pem()),
        ("server.pem", server_cert),
        ("server.key", server_key),
        ("client.pem", client_cert),
        ("client.key", client_key),
    ];
    files.map(|(name, text)| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    })
}
