//! Real nginx in front of a small upstream, asking tollgate through `auth_request`: requests
//! beyond the limit get 429 from nginx, with tollgate's headers, and other tenants pass.

use crate::support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{Server, free_port};

const RULES: &str = r#"
rules:
  - id: products
    match: { methods: [GET], path: "/v1/organizations/{org}/**" }
    key: [segment:org]
    algorithm: sliding_log
    tiers: [{ limit: 3, period: 1h }]
"#;

struct Nginx {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts nginx in front of `tollgate`. A port found free can be taken before nginx binds
/// it; nginx then exits, and another pair of ports is tried.
fn start_nginx(tollgate: &str) -> Nginx {
    (0..5)
        .find_map(|_| try_nginx(tollgate))
        .expect("nginx starts on one of five pairs of free ports")
}

fn try_nginx(tollgate: &str) -> Option<Nginx> {
    let dir = tempfile::tempdir().unwrap();
    let (port, upstream) = (free_port(), free_port());
    let d = dir.path().display();
    let conf = format!(
        r#"
daemon off;
master_process off;
worker_processes 1;
error_log {d}/error.log warn;
pid {d}/nginx.pid;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen 127.0.0.1:{upstream};
        location / {{ return 200 "product\n"; }}
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            auth_request /_tollgate;
            auth_request_set $limit $upstream_http_x_ratelimit_remaining;
            auth_request_set $retry $upstream_http_retry_after;
            add_header X-RateLimit-Remaining $limit always;
            add_header Retry-After $retry always;
            error_page 403 =429 /_limited;
            proxy_pass http://127.0.0.1:{upstream};
        }}
        location = /_tollgate {{
            internal;
            proxy_pass {tollgate}/v1/auth?deny_status=403;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header X-Original-URI $request_uri;
            proxy_set_header X-Original-Method $request_method;
            proxy_set_header X-Real-IP $remote_addr;
        }}
        location = /_limited {{
            internal;
            add_header Retry-After $retry always;
            return 429 "too many requests\n";
        }}
    }}
}}
"#
    );
    std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
    let mut child = Command::new("nginx")
        .arg("-p")
        .arg(dir.path())
        .arg("-c")
        .arg(dir.path().join("nginx.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nginx is installed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if child.try_wait().unwrap().is_some() {
            return None;
        }
        assert!(Instant::now() < deadline, "nginx did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(Nginx {
        child,
        port,
        _dir: dir,
    })
}

#[tokio::test]
async fn nginx_answers_429_beyond_the_limit() {
    let server = Server::start(&[("rules.yaml", RULES)], &[]);
    let nginx = start_nginx(&server.http);
    let client = reqwest::Client::new();
    let get = |org: &str| {
        client
            .get(format!(
                "http://127.0.0.1:{}/v1/organizations/{org}/product/1",
                nginx.port
            ))
            .send()
    };
    for remaining in ["2", "1", "0"] {
        let response = get("acme").await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(
            support::header(response.headers(), "x-ratelimit-remaining"),
            Some(remaining)
        );
        assert_eq!(response.text().await.unwrap(), "product\n");
    }
    let limited = get("acme").await.unwrap();
    assert_eq!(limited.status().as_u16(), 429);
    let retry: u64 = support::header(limited.headers(), "retry-after")
        .unwrap()
        .parse()
        .unwrap();
    assert!((3_590..=3_600).contains(&retry), "{retry}");
    // Another organization passes; a path no rule matches passes.
    assert_eq!(get("globex").await.unwrap().status().as_u16(), 200);
    let other = client
        .get(format!("http://127.0.0.1:{}/health", nginx.port))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status().as_u16(), 200);
}
