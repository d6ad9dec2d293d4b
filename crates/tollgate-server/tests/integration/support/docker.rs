//! Containers of the image under test (`TOLLGATE_IMAGE`, which `./scripts/test` builds with
//! `scripts/image` when a Docker engine answers), on private networks; each is removed when
//! dropped. Ports are published on loopback only.

use std::process::Command;
use std::time::{Duration, Instant};

/// The image the tests run: `TOLLGATE_IMAGE`.
pub fn image() -> String {
    std::env::var("TOLLGATE_IMAGE").unwrap_or_else(|_| {
        panic!(
            "TOLLGATE_IMAGE names the image to test: `scripts/image tollgate:test`, then \
             TOLLGATE_IMAGE=tollgate:test (./scripts/test does both when Docker answers)"
        )
    })
}

/// Runs `docker args`; its standard output, trimmed, or a panic with what it said.
pub fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "docker {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Compose: `docker compose` (v2) where the engine's client has it, else `docker-compose`.
pub fn compose() -> [&'static str; 2] {
    let v2 = Command::new("docker")
        .args(["compose", "version"])
        .output()
        .is_ok_and(|out| out.status.success());
    match v2 {
        true => ["docker", "compose"],
        false => ["docker-compose", "--ansi=never"],
    }
}

/// A name no other test run uses.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "tollgate-test-{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A private network, removed when dropped.
pub struct Network {
    pub name: String,
}

impl Network {
    pub fn create() -> Self {
        let name = unique("net");
        docker(&["network", "create", &name]);
        Self { name }
    }

    /// The host's address on it (its gateway): where the tests' own servers listen for its
    /// containers.
    pub fn gateway(&self) -> std::net::IpAddr {
        docker(&[
            "network",
            "inspect",
            "-f",
            "{{(index .IPAM.Config 0).Gateway}}",
            &self.name,
        ])
        .parse()
        .unwrap()
    }
}

impl Network {
    /// Runs `image` on this network, where its containers find it as `alias`.
    pub fn run_as(&self, alias: &str, image: &str) -> Container {
        Container::run(&["--network", &self.name, "--network-alias", alias, image])
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["network", "rm", &self.name])
            .output();
    }
}

/// A container started detached, removed (forcibly) when dropped.
pub struct Container {
    pub name: String,
}

impl Container {
    /// `docker run -d --name <unique> args...`.
    pub fn run(args: &[&str]) -> Self {
        let name = unique("c");
        let mut all = vec!["run", "-d", "--name", &name];
        all.extend_from_slice(args);
        docker(&all);
        Self { name }
    }

    /// The loopback port that `port` (published with `-p 127.0.0.1::port`) is on.
    pub fn port(&self, port: u16) -> u16 {
        let said = docker(&["port", &self.name, &format!("{port}/tcp")]);
        let first = said.lines().next().unwrap_or_default();
        first
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("`{port}` is not published: {said}"))
    }

    /// `http://127.0.0.1:<published port of 8080>`.
    pub fn http(&self) -> String {
        format!("http://127.0.0.1:{}", self.port(8080))
    }

    /// What it printed so far, both streams.
    pub fn logs(&self) -> String {
        let out = Command::new("docker")
            .args(["logs", &self.name])
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `docker inspect -f format`.
    pub fn inspect(&self, format: &str) -> String {
        docker(&["inspect", "-f", format, &self.name])
    }

    /// Waits until `url` answers 200, within 60 s (a cold container, a loaded machine).
    pub async fn until_ok(&self, url: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(answer) = reqwest::get(url).await
                && answer.status() == 200
            {
                return;
            }
            assert!(
                self.inspect("{{.State.Running}}") == "true",
                "the container stopped: {}",
                self.logs()
            );
            assert!(
                Instant::now() < deadline,
                "{url} did not answer: {}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends SIGTERM (`docker stop`, which kills after `grace`); (exit code, how long it took).
    pub fn stop(&self, grace: Duration) -> (i32, Duration) {
        let start = Instant::now();
        docker(&["stop", "-t", &grace.as_secs().to_string(), &self.name]);
        let code = self.inspect("{{.State.ExitCode}}").parse().unwrap();
        (code, start.elapsed())
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", &self.name])
            .output();
    }
}
