//! The Envoy ratelimit service's settings, as a deployment of it sets them in the environment:
//! each is honoured (logs, statistics to statsd, the debug listener, gRPC connection ages,
//! starting without files, Redis's pool, prefix, TLS, timeouts and key expiry, the local cache
//! of descriptors over their limit, health and start-up against Redis), met by design and
//! said so, or refused at start with a message naming it. None is ignored.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use support::{Redis, Server, descriptor, eventually, free_port, metrics, run_with_env};

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// Two hits a minute per cart; free carts are not limited.
const SHOP: &str = "domain: shop
descriptors:
  - key: cart
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: free
    rate_limit: { unlimited: true }
";

/// `env NAME=value...` in front of `tollgate serve`.
fn under(env: &[&str]) -> Vec<String> {
    std::iter::once("env".to_string())
        .chain(env.iter().map(|e| e.to_string()))
        .collect()
}

fn serve(env: &[&str], files: &[(&str, &str)]) -> Server {
    let wrapper = under(env);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    Server::start_under(&wrapper, files, &[])
}

/// A value no other test run has used, so that counters start from nothing.
fn fresh(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{name}-{nanos}")
}

/// The overall code of one hit on the cart `value`.
async fn hit(server: &Server, value: &str) -> i32 {
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let request = RateLimitRequest {
        domain: "shop".into(),
        descriptors: vec![descriptor(&[("cart", value)])],
        hits_addend: 1,
    };
    client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner()
        .overall_code
}

/// `tollgate validate` of [`SHOP`] with `env`: (exit code, what it printed).
fn validate(env: &[(&str, &str)]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shop.yaml");
    std::fs::write(&path, SHOP).unwrap();
    let (code, out, err) = run_with_env(env, &["validate", path.to_str().unwrap()]);
    (code, format!("{out}{err}"))
}

/// Envoy Gateway sets `PROMETHEUS_MAPPER_YAML` to its `statsd-exporter-config`, a mapping
/// to the default names: accepted, as a missing file is; a mapping to other names, or one that
/// drops, is refused, naming it.
#[test]
fn a_statsd_mapping_to_the_default_names_is_accepted_and_others_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let defaults = write(
        "defaults.yaml",
        "mappings:\n  - match: \"ratelimit.service.rate_limit.*.*.over_limit\"\n    name: \"ratelimit_service_rate_limit_over_limit\"\n    timer_type: histogram\n    labels: { domain: \"$1\", key1: \"$2\" }\n  - match: \"ratelimit_server.*.total_requests\"\n    name: \"ratelimit_service_total_requests\"\n    match_metric_type: counter\n    labels: { grpc_method: \"$1\" }\n",
    );
    let renamed = write(
        "renamed.yaml",
        "mappings:\n  - match: \"ratelimit.service.rate_limit.*.*.over_limit\"\n    name: \"rl_over\"\n",
    );
    let dropping = write(
        "dropping.yaml",
        "mappings:\n  - match: \"ratelimit.service.*\"\n    action: drop\n",
    );
    for path in [defaults.as_str(), "/nonexistent/conf.yaml"] {
        let (code, out) = validate(&[("USE_PROMETHEUS", "true"), ("PROMETHEUS_MAPPER_YAML", path)]);
        assert_eq!(code, 0, "{path}: {out}");
    }
    for (path, said) in [
        (
            &renamed,
            "maps `ratelimit.service.rate_limit.*.*.over_limit` to `rl_over`",
        ),
        (&dropping, "with action `drop`"),
    ] {
        let (code, out) = validate(&[("USE_PROMETHEUS", "true"), ("PROMETHEUS_MAPPER_YAML", path)]);
        assert_eq!(code, 1, "{path} was accepted: {out}");
        assert!(
            out.contains("environment: PROMETHEUS_MAPPER_YAML: ") && out.contains(said),
            "{out}"
        );
    }
}

#[test]
fn settings_asking_for_what_it_does_not_do_are_refused_naming_them() {
    let refused = [
        ("CONFIG_TYPE", "KUBERNETES"),
        ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true"),
        ("USE_DOG_STATSD_MOGRIFIERS", "TAGS"),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
        ("REDIS_POOL_ON_EMPTY_BEHAVIOR", "ERROR"),
        ("REDIS_SENTINEL_AUTH", "secret"),
        ("MEMCACHE_HOST_PORT", "cache:11211"),
        ("LOG_FORMAT", "yaml"),
        ("GRPC_MAX_CONNECTION_AGE", "forever"),
        ("LOCAL_CACHE_SIZE_IN_BYTES", "lots"),
        ("STATS_FLUSH_INTERVAL", "10"),
    ];
    for (name, value) in refused {
        let (code, out) = validate(&[(name, value), ("USE_STATSD", "true")]);
        assert_eq!(code, 1, "{name}={value} was accepted: {out}");
        assert!(
            out.contains(&format!("environment: {name}: ")),
            "{name}: {out}"
        );
    }
    // What asks for nothing is accepted: these are its defaults, or what tollgate does.
    let harmless = [
        ("CONFIG_TYPE", "FILE"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("TRACING_ENABLED", "false"),
        ("TRACING_ENABLED", "true"),
        ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "false"),
        ("REDIS_PERSECOND", "false"),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false"),
        ("REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT"),
        ("LOG_FORMAT", "json"),
        ("USE_STATSD", "false"),
        ("GRPC_MAX_CONNECTION_AGE", "1h30m"),
        ("STATS_FLUSH_INTERVAL", "1.5s"),
    ];
    for (name, value) in harmless {
        let (code, out) = validate(&[(name, value)]);
        assert_eq!(code, 0, "{name}={value}: {out}");
    }
    // `serve` refuses them as `validate` does, before it listens.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shop.yaml");
    std::fs::write(&path, SHOP).unwrap();
    let args = [
        "serve",
        "--config",
        path.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
        "--grpc",
        "127.0.0.1:0",
    ];
    let (code, _, err) = run_with_env(&[("REDIS_PERSECOND", "true")], &args);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("REDIS_PERSECOND: `true`: tollgate keeps every limit in one store"));
}

#[test]
fn settings_met_by_design_are_said_at_start() {
    let server = serve(
        &["REDIS_PIPELINE_WINDOW=150us", "RUNTIME_WATCH_ROOT=false"],
        &[("shop.yaml", SHOP)],
    );
    for name in ["REDIS_PIPELINE_WINDOW", "RUNTIME_WATCH_ROOT"] {
        let line = server
            .logged(&format!("{name} is set"))
            .expect("said at start");
        assert!(
            line.contains("INFO") && line.contains("not needed"),
            "{line}"
        );
    }
}

/// `LOG_FORMAT=json`: every line of the log is a JSON object.
#[test]
fn logs_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shop.yaml");
    std::fs::write(&path, SHOP).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--config", path.to_str().unwrap()])
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .env("LOG_FORMAT", "json")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.map_while(Result::ok) {
        let json: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            json["level"].is_string() && json["fields"].is_object(),
            "{line}"
        );
        let message = json["fields"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        seen.push(message.clone());
        if message == "HTTP listening" {
            assert!(json["fields"]["addr"].is_string(), "{line}");
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen.iter().any(|m| m.contains("gRPC")), "{seen:?}");
}

/// `DEBUG_HOST` and `DEBUG_PORT`: `/rlconfig` prints the limits as its service prints them,
/// `/stats` the statistics under their statsd names.
#[tokio::test]
async fn the_debug_listener() {
    let server = serve(
        &["DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0"],
        &[("shop.yaml", SHOP)],
    );
    let line = server.logged("debug listening").expect("a debug listener");
    let addr = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("addr="))
        .unwrap()
        .to_string();
    let get = |path: &str| {
        let url = format!("http://{addr}{path}");
        async move { reqwest::get(url).await.unwrap().text().await.unwrap() }
    };
    assert_eq!(
        get("/rlconfig").await,
        "shop.cart: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false\n\
         shop.free: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n"
    );
    let cart = fresh("c");
    let codes = [
        hit(&server, &cart).await,
        hit(&server, &cart).await,
        hit(&server, &cart).await,
    ];
    assert_eq!(codes, [OK, OK, OVER]);
    let stats = get("/stats").await;
    for line in [
        "ratelimit.service.rate_limit.shop.cart.total_hits: 3\n",
        "ratelimit.service.rate_limit.shop.cart.over_limit: 1\n",
        "ratelimit.service.rate_limit.shop.cart.within_limit: 2\n",
        "ratelimit.service.config_load_success: 1\n",
        "ratelimit_server.ShouldRateLimit.total_requests: 3\n",
    ] {
        assert!(stats.contains(line), "{line:?} not in:\n{stats}");
    }
    assert!(get("/").await.contains("/rlconfig: print out"));
    // The same on `/metrics`, as its Prometheus mapping names them.
    let text = metrics(&server.http).await;
    for line in [
        "ratelimit_service_config_load_success 1",
        "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 3",
        "ratelimit_service_response_time_seconds_count{grpc_method=\"ShouldRateLimit\"} 3",
    ] {
        assert!(text.contains(line), "{line} not in /metrics");
    }
}

/// Reads lines from `read` until `enough` says the lines so far are enough (10 s at most).
fn lines_until(
    mut read: impl FnMut() -> Option<String>,
    enough: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut lines = Vec::new();
    while !enough(&lines) {
        assert!(
            Instant::now() < deadline,
            "not enough within 10 s: {lines:?}"
        );
        if let Some(more) = read() {
            lines.extend(more.lines().map(str::to_string));
        }
    }
    lines
}

/// The sum of the counts of `name` in statsd `lines` (`name:3|c...`).
fn sum(lines: &[String], name: &str) -> u64 {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix(&format!("{name}:")))
        .filter_map(|rest| rest.split('|').next()?.parse::<u64>().ok())
        .sum()
}

/// `USE_STATSD`: the increases, over TCP, with `EXTRA_TAGS` in the names, as its statsd sink
/// writes them; `USE_DOG_STATSD`: over UDP, tags as DogStatsD's.
#[tokio::test]
async fn statistics_pushed_to_statsd_and_dogstatsd() {
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port().to_string();
    let server = serve(
        &[
            "USE_STATSD=true",
            "STATSD_HOST=127.0.0.1",
            &format!("STATSD_PORT={port}"),
            "STATS_FLUSH_INTERVAL=100ms",
            "EXTRA_TAGS=env:ci",
        ],
        &[("shop.yaml", SHOP)],
    );
    let cart = fresh("c");
    for _ in 0..3 {
        hit(&server, &cart).await;
    }
    tcp.set_nonblocking(false).unwrap();
    let (stream, _) = tcp.accept().unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut reader = BufReader::new(stream);
    let total = "ratelimit.service.rate_limit.shop.cart.total_hits.__env=ci";
    let over = "ratelimit.service.rate_limit.shop.cart.over_limit.__env=ci";
    let loaded = "ratelimit.service.config_load_success.__env=ci";
    let lines = lines_until(
        || {
            let mut line = String::new();
            reader.read_line(&mut line).ok().map(|_| line)
        },
        |lines| sum(lines, total) >= 3 && sum(lines, over) >= 1 && sum(lines, loaded) >= 1,
    );
    assert_eq!(
        (sum(&lines, total), sum(&lines, over), sum(&lines, loaded)),
        (3, 1, 1),
        "{lines:?}"
    );
    assert!(lines.iter().all(|l| l.ends_with("|c")), "{lines:?}");

    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let port = udp.local_addr().unwrap().port().to_string();
    let dog = serve(
        &[
            "USE_DOG_STATSD=true",
            "STATSD_HOST=127.0.0.1",
            &format!("STATSD_PORT={port}"),
            "STATS_FLUSH_INTERVAL=100ms",
            "EXTRA_TAGS=env:ci",
        ],
        &[("shop.yaml", SHOP)],
    );
    for _ in 0..3 {
        hit(&dog, &cart).await;
    }
    let total = "ratelimit.service.rate_limit.shop.cart.total_hits";
    let lines = lines_until(
        || {
            let mut buf = [0u8; 2048];
            let n = udp.recv(&mut buf).ok()?;
            Some(String::from_utf8_lossy(&buf[..n]).into_owned())
        },
        |lines| sum(lines, total) >= 3,
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(total) && l.ends_with("|c|#env:ci")),
        "{lines:?}"
    );
}

/// `GRPC_MAX_CONNECTION_AGE` and `_GRACE`: a gRPC connection is asked to go away, then closed.
#[tokio::test]
async fn grpc_connections_age_out() {
    let server = serve(
        &[
            "GRPC_MAX_CONNECTION_AGE=300ms",
            "GRPC_MAX_CONNECTION_AGE_GRACE=200ms",
        ],
        &[("shop.yaml", SHOP)],
    );
    let addr = server.grpc.trim_start_matches("http://").to_string();
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (_send, connection) = h2::client::handshake(tcp).await.unwrap();
    // An idle connection lives a minute otherwise (the idle timeout).
    let ended = tokio::time::timeout(Duration::from_secs(10), connection).await;
    assert!(ended.is_ok(), "the connection was not closed");
}

/// `FORCE_START_WITHOUT_INITIAL_CONFIG`: with no files yet, `serve` starts with no rules, and
/// serves the files once they appear; without it, it refuses to start.
#[tokio::test]
async fn starts_without_files_when_forced() {
    let root = tempfile::tempdir().unwrap();
    let runtime = root.path().join("current");
    let env = [
        format!("RUNTIME_ROOT={}", runtime.display()),
        "RUNTIME_SUBDIRECTORY=ratelimit".to_string(),
    ];
    let (code, _, err) = run_with_env(
        &[
            ("RUNTIME_ROOT", &runtime.display().to_string()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ],
        &["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no rule files"), "{err}");

    let forced: Vec<&str> = env
        .iter()
        .map(String::as_str)
        .chain(["FORCE_START_WITHOUT_INITIAL_CONFIG=true"])
        .collect();
    let server = serve(&forced, &[]);
    let cart = fresh("c");
    for _ in 0..3 {
        assert_eq!(hit(&server, &cart).await, OK, "no rules yet");
    }
    let dir = runtime.join("ratelimit").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("shop.yaml"), SHOP).unwrap();
    let cart = fresh("c");
    eventually("the files appear and load", || async {
        hit(&server, &cart).await == OVER
    })
    .await;
}

/// Redis from the environment: `CACHE_KEY_PREFIX` in front of every key, `REDIS_POOL_SIZE`
/// connections, `EXPIRATION_JITTER_MAX_SECONDS` on the keys' TTLs, `REDIS_TIMEOUT`.
#[tokio::test]
async fn redis_settings_from_the_environment() {
    let redis = Redis::start();
    let server = serve(
        &[
            "REDIS_SOCKET_TYPE=tcp",
            &format!("REDIS_URL=127.0.0.1:{}", redis.port),
            "CACHE_KEY_PREFIX=blue_",
            "REDIS_POOL_SIZE=3",
            "EXPIRATION_JITTER_MAX_SECONDS=300",
            "REDIS_TIMEOUT=2s",
        ],
        &[("shop.yaml", SHOP)],
    );
    let carts: Vec<String> = (0..12).map(|i| fresh(&format!("c{i}"))).collect();
    for cart in &carts {
        assert_eq!(hit(&server, cart).await, OK);
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let window_left = 60_000 - now_ms % 60_000;
    let keys = redis.cli(&["--scan"]);
    let counters: Vec<&str> = keys.lines().filter(|k| k.contains("{k")).collect();
    assert_eq!(counters.len(), 12, "{keys}");
    for key in keys.lines() {
        assert!(key.starts_with("blue_tg:"), "{key} has no prefix");
    }
    for key in counters {
        let ttl: u64 = redis.cli(&["pttl", key]).trim().parse().unwrap();
        // Jitter in sixteenths of 300 s: at least 18.75 s past the window's end.
        assert!(
            ttl > window_left + 10_000,
            "{key}: {ttl} ms, window ends in {window_left}"
        );
    }
    let clients = redis.cli(&["client", "list"]);
    let checking = clients.lines().filter(|c| c.contains("cmd=fcall")).count();
    assert_eq!(checking, 3, "{clients}");
}

/// `LOCAL_CACHE_SIZE_IN_BYTES`: once a descriptor is over, the rest of its window is answered
/// over its limit without Redis, and counted in `over_limit_with_local_cache`.
#[tokio::test]
async fn the_local_cache_answers_over_the_limit_without_redis() {
    let redis = Redis::start();
    let server = serve(
        &[
            "REDIS_SOCKET_TYPE=tcp",
            &format!("REDIS_URL=127.0.0.1:{}", redis.port),
            "LOCAL_CACHE_SIZE_IN_BYTES=1048576",
        ],
        &[("shop.yaml", SHOP)],
    );
    let cart = fresh("c");
    let codes = [
        hit(&server, &cart).await,
        hit(&server, &cart).await,
        hit(&server, &cart).await,
    ];
    assert_eq!(codes, [OK, OK, OVER]);
    let calls = || {
        let stats = redis.cli(&["info", "commandstats"]);
        stats
            .lines()
            .find(|l| l.starts_with("cmdstat_fcall:"))
            .and_then(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0)
    };
    let before = calls();
    for _ in 0..10 {
        assert_eq!(hit(&server, &cart).await, OVER);
    }
    assert_eq!(calls(), before, "the cache answered without Redis");
    // Another cart still goes to Redis.
    assert_eq!(hit(&server, &fresh("d")).await, OK);
    assert_eq!(calls(), before + 1);
    let text = metrics(&server.http).await;
    let cached = "ratelimit_service_rate_limit_over_limit_with_local_cache{domain=\"shop\",key1=\"cart\"} 10";
    assert!(text.contains(cached), "{cached} not in /metrics");
    assert!(
        text.contains("ratelimit_service_rate_limit_total_hits{domain=\"shop\",key1=\"cart\"} 14")
    );
}

/// Starts `redis-server` on `port` (free when chosen), with `args`.
fn redis_on(port: u16, args: &[&str]) -> std::process::Child {
    let dir = std::env::temp_dir();
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(args)
        .args(if args.contains(&"--tls-port") {
            vec![]
        } else {
            vec!["--port".to_string(), port.to_string()]
        })
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is installed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// The Envoy service's health against Redis: unhealthy until Redis answers once, then healthy
/// whatever Redis does, unless `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION` asks it to follow
/// Redis; `REDIS_STARTUP_MAX_ELAPSED_TIME` stops `serve` when Redis never answers.
#[tokio::test]
async fn health_and_start_up_against_redis() {
    let port = free_port();
    let env = |extra: &[&str]| -> Vec<String> {
        [
            "REDIS_SOCKET_TYPE=tcp".to_string(),
            format!("REDIS_URL=127.0.0.1:{port}"),
            "REDIS_STARTUP_INITIAL_INTERVAL=100ms".to_string(),
            "REDIS_STARTUP_MAX_INTERVAL=200ms".to_string(),
        ]
        .into_iter()
        .chain(extra.iter().map(|s| s.to_string()))
        .collect()
    };
    let health = |server: &Server| {
        let url = format!("{}/healthcheck", server.http);
        async move { reqwest::get(url).await.unwrap().status().as_u16() }
    };
    let plain = env(&[]);
    let plain: Vec<&str> = plain.iter().map(String::as_str).collect();
    let waiting = serve(&plain, &[("shop.yaml", SHOP)]);
    assert_eq!(health(&waiting).await, 500, "Redis has not answered yet");
    let mut redis = redis_on(port, &[]);
    eventually("healthy once Redis answers", || async {
        health(&waiting).await == 200
    })
    .await;
    let _ = redis.kill();
    let _ = redis.wait();
    // Its default: healthy from then on, whatever Redis does.
    let mut client = RateLimitServiceClient::connect(waiting.grpc.clone())
        .await
        .unwrap();
    for _ in 0..6 {
        let request = RateLimitRequest {
            domain: "shop".into(),
            descriptors: vec![descriptor(&[("cart", "x")])],
            hits_addend: 1,
        };
        let _ = client.should_rate_limit(request).await;
    }
    assert_eq!(health(&waiting).await, 200);
    let text = metrics(&waiting.http).await;
    assert!(
        text.contains("ratelimit_service_should_rate_limit_error{err_type=\"redis_error\"} 6"),
        "Redis's failures counted"
    );

    // Following Redis: unhealthy once it stops answering.
    let mut redis = redis_on(port, &[]);
    let following = env(&["REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true"]);
    let following: Vec<&str> = following.iter().map(String::as_str).collect();
    let server = serve(&following, &[("shop.yaml", SHOP)]);
    eventually("healthy", || async { health(&server).await == 200 }).await;
    // A check answered: Redis is past its start-up allowance.
    hit(&server, "y").await;
    let _ = redis.kill();
    let _ = redis.wait();
    for _ in 0..6 {
        hit(&server, "y").await;
    }
    assert_eq!(health(&server).await, 500);

    // Never answering within REDIS_STARTUP_MAX_ELAPSED_TIME: `serve` stops.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shop.yaml");
    std::fs::write(&path, SHOP).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--config", path.to_str().unwrap()])
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .envs(
            env(&["REDIS_STARTUP_MAX_ELAPSED_TIME=1s"])
                .iter()
                .map(|kv| kv.split_once('=').unwrap()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "serve did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(err.contains("REDIS_STARTUP_MAX_ELAPSED_TIME"), "{err}");
}

/// TLS to Redis from the environment: `REDIS_TLS` with `REDIS_TLS_CACERT`, and a client
/// certificate (`REDIS_TLS_CLIENT_CERT`, `REDIS_TLS_CLIENT_KEY`) for a server that asks for
/// one; half a client certificate is refused naming what is missing.
#[tokio::test]
async fn tls_to_redis_from_the_environment() {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "test ca");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let signed = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        (
            params.signed_by(&key, &ca).unwrap().pem(),
            key.serialize_pem(),
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path.display().to_string()
    };
    let (server_cert, server_key) = signed("127.0.0.1");
    let (client_cert, client_key) = signed("tollgate");
    let ca_file = write("ca.crt", &ca.pem());
    let port = free_port();
    let port_arg = port.to_string();
    let (cert_file, key_file) = (write("s.crt", &server_cert), write("s.key", &server_key));
    let mut redis = redis_on(
        port,
        &[
            "--port",
            "0",
            "--tls-port",
            &port_arg,
            "--tls-cert-file",
            &cert_file,
            "--tls-key-file",
            &key_file,
            "--tls-ca-cert-file",
            &ca_file,
            "--tls-auth-clients",
            "yes",
        ],
    );
    let env = [
        "REDIS_SOCKET_TYPE=tcp".to_string(),
        format!("REDIS_URL=127.0.0.1:{port}"),
        "REDIS_TLS=true".to_string(),
        format!("REDIS_TLS_CACERT={ca_file}"),
        format!("REDIS_TLS_CLIENT_CERT={}", write("c.crt", &client_cert)),
        format!("REDIS_TLS_CLIENT_KEY={}", write("c.key", &client_key)),
    ];
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    let server = serve(&env, &[("shop.yaml", SHOP)]);
    let cart = fresh("c");
    // Redis decides: the third hit is over (a store that failed would fail open).
    let codes = [
        hit(&server, &cart).await,
        hit(&server, &cart).await,
        hit(&server, &cart).await,
    ];
    assert_eq!(codes, [OK, OK, OVER]);
    let _ = redis.kill();
    let _ = redis.wait();

    let (code, out) = validate(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "127.0.0.1:6380"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CLIENT_CERT", &cert_file),
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("REDIS_TLS_CLIENT_KEY"), "{out}");
}
