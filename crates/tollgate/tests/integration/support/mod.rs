//! Redis servers and clusters that a test starts for itself, on free loopback ports, and
//! stops when dropped. Never the server on 6379 that a machine may already run.

#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use tempfile::TempDir;

pub mod proxy;

/// A redis-server child process.
pub struct RedisServer {
    pub port: u16,
    args: Vec<String>,
    tls: bool,
    dir: TempDir,
    child: Option<Child>,
}

/// A loopback port that nothing listens on: connecting to it is refused. Held (bound, not
/// listening) while this lives, so that no server another test starts can take it, as it
/// could a port only found free.
pub struct UnusedPort {
    pub port: u16,
    _held: tokio::net::TcpSocket,
}

impl UnusedPort {
    pub fn new() -> Self {
        let held = tokio::net::TcpSocket::new_v4().unwrap();
        held.bind(([127, 0, 0, 1], 0).into()).unwrap();
        let port = held.local_addr().unwrap().port();
        Self { port, _held: held }
    }
}

/// A free port whose cluster bus port (port + 10000) is free too.
fn free_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    // Spread test processes apart, then probe upwards.
    let start = 20_000 + (std::process::id() % 400) as u16 * 50;
    let _ = NEXT.compare_exchange(0, start, Ordering::SeqCst, Ordering::SeqCst);
    loop {
        let port = NEXT.fetch_add(1, Ordering::SeqCst);
        assert!(port < 55_000, "no free port");
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments.
    pub fn start_with(args: &[&str]) -> Self {
        Self::spawned(args, false)
    }

    /// Starts a server that only speaks TLS, on `port`, with these certificate files.
    pub fn start_tls(cert: &str, key: &str, ca: &str) -> Self {
        Self::start_tls_with(cert, key, ca, false)
    }

    /// As [`Self::start_tls`]; with `clients_too`, clients must present a certificate that
    /// `ca` signed (mutual TLS).
    pub fn start_tls_with(cert: &str, key: &str, ca: &str, clients_too: bool) -> Self {
        let args = [
            "--tls-cert-file",
            cert,
            "--tls-key-file",
            key,
            "--tls-ca-cert-file",
            ca,
            "--tls-auth-clients",
            if clients_too { "yes" } else { "no" },
        ];
        Self::spawned(&args, true)
    }

    /// A server on a free port; on another when the port was taken between the probe and the
    /// bind (by another test's server, or as a connection's ephemeral port: Linux hands those
    /// out from 32768 up), which makes redis-server exit at once.
    fn spawned(args: &[&str], tls: bool) -> Self {
        let mut server = Self {
            port: free_port(),
            args: args.iter().map(|a| a.to_string()).collect(),
            tls,
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
        };
        for _ in 0..4 {
            server.start_process();
            std::thread::sleep(Duration::from_millis(50));
            let exited = server
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_some());
            if !exited {
                break;
            }
            server.port = free_port();
        }
        server.wait_for_start();
        server
    }

    fn spawn(&mut self) {
        self.start_process();
        self.wait_for_start();
    }

    fn start_process(&mut self) {
        let port = self.port.to_string();
        let mut command = Command::new("redis-server");
        command.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]);
        if self.tls {
            command.args(["--port", "0", "--tls-port", &port]);
        } else {
            command.args(["--port", &port]);
        }
        command
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.child = Some(command.spawn().expect("redis-server is installed"));
    }

    fn wait_for_start(&self) {
        if !self.tls {
            self.wait_until_ready();
        } else {
            let deadline = Instant::now() + Duration::from_secs(10);
            while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
                assert!(Instant::now() < deadline, "redis-server did not start");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    fn wait_until_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // Up: it answers, even if only to say that it wants a password.
            if self
                .command(&["PING"])
                .is_some_and(|r| r.contains("PONG") || r.contains("NOAUTH"))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// One inline command over a fresh connection; the raw reply.
    pub fn command(&self, args: &[&str]) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut request = format!("*{}\r\n", args.len());
        for a in args {
            request.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        stream.write_all(request.as_bytes()).ok()?;
        let mut buf = [0u8; 65_536];
        let n = stream.read(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    /// redis-cli against this server (for replies larger than one read).
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli is installed");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn pid(&self) -> String {
        self.child.as_ref().expect("running").id().to_string()
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([signal, &self.pid()]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill {signal}");
    }

    /// Kills the server (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port with `args` instead of its own, keeping its
    /// directory (and so what it persisted there).
    pub fn restart_with(&mut self, args: &[&str]) {
        self.kill();
        self.args = args.iter().map(|a| a.to_string()).collect();
        self.spawn();
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Freezes the process (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws it (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = Command::new("kill").args(["-CONT", &self.pid()]).status();
        }
        self.kill();
    }
}

/// A Redis Cluster of three masters, with or without a replica each.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Three masters, no replicas.
    pub fn start() -> Self {
        Self::start_with(0, 2000)
    }

    /// Three masters with `replicas` replicas each; a master unreachable for `timeout_ms` is
    /// failed over. Slots of a dead master do not stop the others'
    /// (`cluster-require-full-coverage no`).
    pub fn start_with(replicas: usize, timeout_ms: u32) -> Self {
        Self::start_with_args(replicas, timeout_ms, &[])
    }

    /// As [`Self::start_with`], every node with the extra `redis-server` arguments `extra`.
    pub fn start_with_args(replicas: usize, timeout_ms: u32, extra: &[&str]) -> Self {
        let timeout = timeout_ms.to_string();
        let base = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &timeout,
            "--cluster-require-full-coverage",
            "no",
            // A replica syncs at once (not 5 s later): until it has, it cannot fail over.
            "--repl-diskless-sync-delay",
            "0",
        ];
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| RedisServer::start_with(&args))
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli is installed");
        assert!(status.success(), "redis-cli --cluster create failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in &nodes {
            while !node.cli(&["cluster", "info"]).contains("cluster_state:ok") {
                assert!(Instant::now() < deadline, "cluster did not become ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Replicas hold their master's data before anything is asked of them.
        for node in &nodes {
            loop {
                let replication = node.cli(&["info", "replication"]);
                if replication.contains("role:master")
                    || replication.contains("master_link_status:up")
                {
                    break;
                }
                assert!(Instant::now() < deadline, "a replica did not sync");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Self { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// A store on this cluster on the limiter's clock (for manual clocks), waiting up to 5 s.
    pub async fn local_store(&self) -> tollgate::RedisStore {
        let urls = self.urls();
        let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
        tollgate::RedisStore::cluster_builder(&nodes)
            .store_time(tollgate::StoreTime::Local)
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap()
    }

    /// The node serving `key`'s slot now, by its place in `nodes`.
    pub fn owner(&self, key: &[u8]) -> usize {
        let key = String::from_utf8_lossy(key).into_owned();
        let slot: u16 = self.nodes[0]
            .cli(&["cluster", "keyslot", &key])
            .parse()
            .expect("a slot");
        self.owner_of_slot(slot)
    }

    /// The node serving `slot` now, by its place in `nodes`, as a node still up sees it.
    pub fn owner_of_slot(&self, slot: u16) -> usize {
        let up = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a node is up");
        let slots = up.cli(&["cluster", "slots"]);
        // redis-cli prints each range as start, end, then the master's ip, port and id, one a line.
        let lines: Vec<&str> = slots.lines().map(str::trim).collect();
        for (i, window) in lines.windows(4).enumerate() {
            let (Ok(start), Ok(end)) = (window[0].parse::<u16>(), window[1].parse::<u16>()) else {
                continue;
            };
            if window[2] == "127.0.0.1" && (start..=end).contains(&slot) {
                let port: u16 = lines[i + 3].parse().expect("a port");
                return self
                    .nodes
                    .iter()
                    .position(|n| n.port == port)
                    .expect("a node of this cluster");
            }
        }
        panic!("no node serves slot {slot}: {slots}");
    }

    /// Waits until every node up says the cluster is `ok`.
    pub fn wait_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            while !node.cli(&["cluster", "info"]).contains("cluster_state:ok") {
                assert!(Instant::now() < deadline, "cluster did not become ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// The Redis keys that hold `key`'s state under `limiter`'s first rule.
pub fn redis_keys<C: tollgate::Clock>(
    limiter: &tollgate::Limiter<tollgate::RedisStore, C>,
    key: &str,
) -> Vec<Vec<u8>> {
    let plan = limiter
        .plan(limiter.rule().name())
        .expect("the limiter's rule");
    plan.keys(key.as_bytes())
}

/// The path of tollgate's Redis module (`crates/tollgate-redis-module`), built for the
/// profile these tests were built with, in their target directory, on first use.
pub fn redis_module() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        // The test binary is <target>/<profile>/deps/<name>.
        let exe = std::env::current_exe().expect("the test's path");
        let profile_dir = exe.parent().and_then(|d| d.parent()).expect("a target dir");
        let target = profile_dir.parent().expect("a target dir");
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let mut build = Command::new(env!("CARGO"));
        build
            .args(["build", "--quiet", "-p", "tollgate-redis-module"])
            .env("CARGO_TARGET_DIR", target);
        if release {
            build.arg("--release");
        }
        let status = build.status().expect("cargo runs");
        assert!(
            status.success(),
            "cargo build -p tollgate-redis-module failed"
        );
        let path = profile_dir.join("libtollgate_redis_module.so");
        assert!(path.exists(), "no module at {}", path.display());
        path.to_string_lossy().into_owned()
    })
}

/// Every key named `<prefix>...` under `f:` has its twin under `m:` and the other way round:
/// the same value, and expiries within 500 ms of each other (they were written a moment
/// apart).
pub async fn same_keys(redis: &mut redis::aio::MultiplexedConnection, prefix: &str, at: &str) {
    async fn keys(
        redis: &mut redis::aio::MultiplexedConnection,
        store: &str,
        prefix: &str,
    ) -> Vec<Vec<u8>> {
        let mut keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg(format!("{store}{prefix}*"))
            .query_async(redis)
            .await
            .unwrap();
        keys.iter_mut().for_each(|k| drop(k.drain(..store.len())));
        keys.sort();
        keys
    }
    let functions = keys(redis, "f:", prefix).await;
    let module = keys(redis, "m:", prefix).await;
    assert_eq!(functions, module, "{at}: the same keys");
    for key in functions {
        let mut pipe = redis::pipe();
        for prefix in [&b"f:"[..], b"m:"] {
            let name = [prefix, &key].concat();
            // DUMP: the type and value, whatever the type, but not the expiry.
            pipe.cmd("DUMP").arg(&name).cmd("PEXPIRETIME").arg(&name);
        }
        let (f, ef, m, em): (Vec<u8>, i64, Vec<u8>, i64) = pipe.query_async(redis).await.unwrap();
        let key = String::from_utf8_lossy(&key);
        assert_eq!(f, m, "{at}: the value of {key}");
        assert!(
            (ef - em).abs() <= 500 && (ef > 0) == (em > 0),
            "{at}: {key} expires at {ef} by the functions, {em} by the module"
        );
    }
}

/// A store on `server` on the limiter's clock (for manual clocks), its keys under `prefix`,
/// calling tollgate's module where the server has it if `module`.
pub async fn local_store(
    server: &RedisServer,
    prefix: &[u8],
    module: bool,
) -> tollgate::RedisStore {
    tollgate::RedisStore::builder(&server.url())
        .store_time(tollgate::StoreTime::Local)
        .timeout(Duration::from_secs(5))
        .key_prefix(prefix)
        .module(module)
        .build()
        .await
        .unwrap()
}
