//! A `redis-server` a bench starts for itself on a free loopback port, and `redis-cli`.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) struct Server {
    child: Child,
    pub(crate) port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn start_redis() -> Server {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new("redis-server")
        .args([
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--save",
            "",
        ])
        .args(["--appendonly", "no"])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is installed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while cli(port, &["ping"]) != "PONG" {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server {
        child,
        port,
        _dir: dir,
    }
}

pub(crate) fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli is installed");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
