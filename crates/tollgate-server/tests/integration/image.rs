//! The image, built from the Dockerfile users build (`TOLLGATE_IMAGE`, see
//! `support::docker`): it answers README's check through its published port as a user without
//! privileges and without a shell, serves a mounted rule directory instead of its examples,
//! reaches Redis on a private network, and drains and exits 0 on SIGTERM; the compose example
//! comes up and answers.

use crate::support;

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};
use support::docker::{Container, Network, docker, image};

/// README's check.
fn readme_check() -> Value {
    json!({"request": {"method": "GET", "path": "/v1/organizations/acme/product/7"}})
}

async fn check(server: &str, body: Value) -> (u16, Value) {
    let (status, _, json) = support::check(&reqwest::Client::new(), server, body).await;
    (status, json)
}

// Two workers: while `docker stop` blocks one, the other lets the test's connections end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_answers_readmes_check_without_privileges_and_drains_on_sigterm() {
    let image = image();
    let tollgate = Container::run(&["-p", "127.0.0.1::8080", "-p", "127.0.0.1::8081", &image]);
    let http = tollgate.http();
    tollgate.until_ok(&format!("{http}/readyz")).await;
    let (status, answer) = check(&http, readme_check()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["allowed"], true, "{answer}");
    assert_eq!(answer["decisions"][0]["rule"], "get-product", "{answer}");

    // Envoy's gRPC service listens on every address too.
    let grpc = format!("http://127.0.0.1:{}", tollgate.port(8081));
    let mut client = RateLimitServiceClient::connect(grpc).await.unwrap();
    let answer = client
        .should_rate_limit(RateLimitRequest {
            domain: "none".into(),
            descriptors: vec![support::descriptor(&[("k", "v")])],
            hits_addend: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, 1, "{answer:?}");
    drop(client);

    // The process runs as nonroot (65532), and the image has no shell.
    assert_eq!(tollgate.inspect("{{.Config.User}}"), "65532:65532");
    let processes = docker(&["top", &tollgate.name, "-o", "pid,uid,args"]);
    let serving = processes
        .lines()
        .find(|line| line.contains("tollgate serve"))
        .unwrap_or_else(|| panic!("{processes}"));
    assert_eq!(
        serving.split_whitespace().nth(1),
        Some("65532"),
        "{processes}"
    );
    let shell = std::process::Command::new("docker")
        .args([
            "run",
            "--rm",
            "--entrypoint",
            "/bin/sh",
            &image,
            "-c",
            "true",
        ])
        .output()
        .unwrap();
    assert!(!shell.status.success(), "the image has a shell");

    // SIGTERM: it drains and exits 0, well before `docker stop` would kill it.
    let (code, took) = tollgate.stop(Duration::from_secs(30));
    let logs = tollgate.logs();
    assert_eq!(code, 0, "{logs}");
    assert!(took < Duration::from_secs(20), "{took:?}: {logs}");
    assert!(logs.contains("draining requests in flight"), "{logs}");
    assert!(!logs.contains("still open after draining"), "{logs}");
}

/// Rules of a plan of 2 per hour on Redis (strict) at `redis:6379`.
const ON_REDIS: &str = "store: { kind: redis, url: 'redis://redis:6379', mode: strict }
rules:
  - id: plan
    key: [header:x-tenant]
    algorithm: token_bucket
    on_failure: closed
    tiers: [{ limit: 2, period: 1h }]
";

/// A directory of [`ON_REDIS`], readable by the image's user, and its `-v` to mount it over
/// the examples.
fn rules_on_redis() -> (tempfile::TempDir, String) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plan.yaml");
    std::fs::write(&file, ON_REDIS).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mount = format!("{}:/etc/tollgate/rules:ro", dir.path().display());
    (dir, mount)
}

/// `image` on `network`, serving the rules `mount` mounts, its HTTP port published.
fn serving(network: &Network, mount: &str, image: &str) -> Container {
    Container::run(&[
        "--network",
        &network.name,
        "-p",
        "127.0.0.1::8080",
        "-v",
        mount,
        image,
    ])
}

#[tokio::test]
async fn a_mounted_rule_directory_is_served_on_a_redis_of_a_private_network() {
    let image = image();
    let network = Network::create();
    let redis = network.run_as("redis", "redis:7-bookworm");
    let (_dir, mount) = rules_on_redis();
    let (first, second) = (
        serving(&network, &mount, &image),
        serving(&network, &mount, &image),
    );
    let ask = json!({"request": {"method": "GET", "path": "/", "headers": {"x-tenant": "acme"}}});
    let mut statuses = Vec::new();
    for tollgate in [&first, &second] {
        let http = tollgate.http();
        tollgate.until_ok(&format!("{http}/readyz")).await;
        for _ in 0..2 {
            let (status, answer) = check(&http, ask.clone()).await;
            assert_eq!(answer["decisions"][0]["rule"], "plan", "{answer}");
            let source = answer["decisions"][0]["source"].as_str();
            // A denial may come from the denied cache, until its `retry_after`.
            assert!(matches!(source, Some("redis" | "cache")), "{answer}");
            statuses.push(status);
        }
    }
    // One limit for both: the examples are not served, the count is Redis's.
    assert_eq!(statuses, [200, 200, 429, 429]);
    let keys: u64 = docker(&["exec", &redis.name, "redis-cli", "dbsize"])
        .parse()
        .unwrap();
    assert!(keys > 0);
}

/// `deploy/redis-module/Dockerfile`'s image (`TOLLGATE_REDIS_IMAGE`): Redis with tollgate's
/// module loaded, where the image's checks are decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_module_image_decides_checks_inside_redis() {
    let redis_image = std::env::var("TOLLGATE_REDIS_IMAGE").unwrap_or_else(|_| {
        panic!("TOLLGATE_REDIS_IMAGE names the module's image (scripts/image builds it)")
    });
    let network = Network::create();
    let redis = network.run_as("redis", &redis_image);
    let (_dir, mount) = rules_on_redis();
    let tollgate = serving(&network, &mount, &image());
    let http = tollgate.http();
    tollgate.until_ok(&format!("{http}/readyz")).await;
    let ask = json!({"request": {"method": "GET", "path": "/", "headers": {"x-tenant": "acme"}}});
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(check(&http, ask.clone()).await.0);
    }
    assert_eq!(statuses, [200, 200, 429]);
    let modules = docker(&["exec", &redis.name, "redis-cli", "MODULE", "LIST"]);
    assert!(modules.contains("tollgate"), "{modules}");
    let stats = docker(&["exec", &redis.name, "redis-cli", "INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_tollgate.check:calls="), "{stats}");
    let logs = tollgate.logs();
    assert!(!logs.contains("without tollgate's module"), "{logs}");
}

#[tokio::test]
async fn the_compose_example_comes_up_and_answers() {
    let project = support::docker::unique("compose");
    let (port, second) = (support::free_port(), support::free_port());
    let compose = |args: &[&str]| {
        let [program, first] = support::docker::compose();
        std::process::Command::new(program)
            .arg(first)
            .current_dir(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../examples/compose"
            ))
            .env("TOLLGATE_IMAGE", image())
            .env("TOLLGATE_PORT", port.to_string())
            .env("TOLLGATE_B_PORT", second.to_string())
            .args(["-p", &project])
            .args(args)
            .output()
            .unwrap()
    };
    struct Down<F: Fn(&[&str]) -> std::process::Output>(F);
    impl<F: Fn(&[&str]) -> std::process::Output> Drop for Down<F> {
        fn drop(&mut self) {
            (self.0)(&["down", "-v", "--remove-orphans", "-t", "5"]);
        }
    }
    let compose = Down(compose);
    let up = (compose.0)(&["up", "-d", "--no-build"]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let http = format!("http://127.0.0.1:{port}");
    // The load's checks reach both instances through Redis: the console's overview counts
    // them, and /metrics says both instances decided.
    support::eventually("the load's checks are counted", || async {
        let metrics = reqwest::get(format!("{http}/metrics")).await;
        let Ok(metrics) = metrics else { return false };
        let text = metrics.text().await.unwrap_or_default();
        text.lines().any(|l| {
            l.starts_with("tollgate_decisions_total{rule=\"get-product\",outcome=\"allowed\"}")
                && !l.ends_with(" 0")
        })
    })
    .await;
    let (status, answer) = check(&http, readme_check()).await;
    assert!(status == 200 || status == 429, "{answer}");
    assert_eq!(answer["decisions"][0]["source"], "redis", "{answer}");
    let ps = (compose.0)(&["ps"]);
    let ps = String::from_utf8_lossy(&ps.stdout);
    for service in ["redis", "tollgate-a", "tollgate-b", "load"] {
        assert!(ps.contains(service), "{service} is not up: {ps}");
    }
}
