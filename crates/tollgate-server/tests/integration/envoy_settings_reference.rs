//! docs/envoy.md says, for every environment setting envoyproxy/ratelimit has, what tollgate
//! does with it: its table is rendered from `envoy::catalog::SETTINGS`, which names every
//! setting of that service and every setting tollgate's code reads; a refused one stops
//! `tollgate validate`.

use crate::reference;

use std::collections::BTreeSet;
use std::path::Path;

use tollgate_server::envoy::catalog::{SETTINGS, Status};

/// Every `envconfig` name of envoyproxy/ratelimit's `src/settings/settings.go` (at f2fb157,
/// November 2026).
const UPSTREAM: &[&str] = &[
    "BACKEND_TYPE",
    "CACHE_KEY_PREFIX",
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_NODE_METADATA",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_TYPE",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "DISABLE_STATS",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "EXTRA_TAGS",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_CLIENT_TLS_SAN",
    "GRPC_HOST",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "GRPC_PORT",
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_SERVER_USE_TLS",
    "GRPC_UDS",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "HOST",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "LOG_FORMAT",
    "LOG_LEVEL",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
    "MERGE_DOMAIN_CONFIG",
    "NEAR_LIMIT_RATIO",
    "PORT",
    "PROMETHEUS_ADDR",
    "PROMETHEUS_MAPPER_YAML",
    "PROMETHEUS_PATH",
    "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
    "QUOTA_MODE",
    "REDIS_AUTH",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_SENTINEL_AUTH",
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_TIMEOUT",
    "REDIS_PERSECOND_TLS",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_URL",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_POOL_SIZE",
    "REDIS_SENTINEL_AUTH",
    "REDIS_SOCKET_TYPE",
    "REDIS_STARTUP_INITIAL_INTERVAL",
    "REDIS_STARTUP_MAX_ELAPSED_TIME",
    "REDIS_STARTUP_MAX_INTERVAL",
    "REDIS_TIMEOUT",
    "REDIS_TLS",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_TYPE",
    "REDIS_URL",
    "RESPONSE_DYNAMIC_METADATA",
    "RUNTIME_APPDIRECTORY",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_WATCH_ROOT",
    "SHADOW_MODE",
    "STATSD_HOST",
    "STATSD_PORT",
    "STATS_FLUSH_INTERVAL",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "TRACING_ENABLED",
    "TRACING_EXPORTER_PROTOCOL",
    "TRACING_SAMPLING_RATE",
    "TRACING_SERVICE_INSTANCE_ID",
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "USE_PROMETHEUS",
    "USE_STATSD",
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
    "XDS_CLIENT_BACKOFF_JITTER",
    "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
];

fn status(s: Status) -> String {
    match s {
        Status::Honoured => "honoured".into(),
        Status::MetByDesign => "met by design".into(),
        Status::Refused(None) => "refused".into(),
        Status::Refused(Some(value)) => format!("refused unless `{value}`"),
        Status::With(other) => format!("unread: only with `{other}`"),
    }
}

fn render() -> String {
    let mut out = String::from("| setting | tollgate | what it does here |\n| --- | --- | --- |\n");
    for s in SETTINGS {
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            s.name,
            status(s.status),
            reference::cell(s.what)
        ));
    }
    out
}

#[test]
fn the_page_is_the_catalog() {
    reference::check_block("envoy.md", "settings", &render());
}

#[test]
fn every_setting_of_the_envoy_service_is_in_the_catalog_and_nothing_else() {
    let upstream: BTreeSet<&str> = UPSTREAM.iter().copied().collect();
    let listed: BTreeSet<&str> = SETTINGS.iter().map(|s| s.name).collect();
    assert_eq!(listed.len(), SETTINGS.len(), "a setting is listed twice");
    let missing: Vec<_> = upstream.difference(&listed).collect();
    let invented: Vec<_> = listed.difference(&upstream).collect();
    assert!(
        missing.is_empty(),
        "settings of envoyproxy/ratelimit not in the catalog: {missing:?}"
    );
    assert!(
        invented.is_empty(),
        "settings in the catalog that envoyproxy/ratelimit does not have: {invented:?}"
    );
}

/// The setting names the code that reads the environment writes as literals.
fn read_by_the_code() -> BTreeSet<String> {
    // Words of values, not names of settings.
    const VALUES: &[&str] = &[
        "SINGLE",
        "CLUSTER",
        "WAIT",
        "FILE",
        "GRPC_XDS_SOTW",
        "TRUE",
        "FALSE",
    ];
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeSet::new();
    for file in ["envoy/settings.rs", "provider/mod.rs", "main.rs"] {
        let text = std::fs::read_to_string(src.join(file)).unwrap();
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for literal in line.split('"').skip(1).step_by(2) {
                let name = literal.len() > 2
                    && literal
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                    && literal
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_uppercase());
                if name && !VALUES.contains(&literal) {
                    out.insert(literal.to_string());
                }
            }
        }
    }
    out
}

#[test]
fn every_setting_the_code_reads_is_in_the_catalog_as_read() {
    let read = read_by_the_code();
    for name in &read {
        let Some(found) = SETTINGS.iter().find(|s| s.name == name) else {
            panic!("the code reads {name}, which the catalog does not list");
        };
        assert!(
            !matches!(found.status, Status::With(_)),
            "{name} is read, yet listed as unread"
        );
    }
    for s in SETTINGS.iter().filter(|s| s.status == Status::Honoured) {
        assert!(
            read.contains(s.name),
            "{} is listed as honoured, and the code never reads it",
            s.name
        );
    }
    assert!(read.len() >= 50, "{read:?}");
}

#[test]
fn every_refused_setting_stops_validate() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yaml");
    std::fs::write(
        &file,
        "rules:\n  - id: api\n    tiers: [{ limit: 1, period: 1s }]\n",
    )
    .unwrap();
    let run = |env: Option<(&str, &str)>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
        command.arg("validate").arg(&file);
        if let Some((name, value)) = env {
            command.env(name, value);
        }
        command.output().unwrap()
    };
    assert!(run(None).status.success());
    for s in SETTINGS {
        let Status::Refused(harmless) = s.status else {
            continue;
        };
        let asking = match harmless {
            Some("false") => "true",
            _ => "something-else",
        };
        let out = run(Some((s.name, asking)));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(s.name),
            "{}={asking} was not refused: {stderr}",
            s.name
        );
        if let Some(value) = harmless {
            let out = run(Some((s.name, value)));
            assert!(
                out.status.success(),
                "{}={value} asks for nothing, and was refused: {}",
                s.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
