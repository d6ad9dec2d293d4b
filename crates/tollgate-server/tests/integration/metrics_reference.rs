//! docs/metrics.md lists every metric: its table is rendered from `metrics::CATALOG`, every
//! metric the source registers is in the catalog, every family `/metrics` renders after real
//! checks is in it with the same kind, and nothing in it is registered nowhere.

use crate::reference;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tollgate::engine::{LimitOverride, descriptor};
use tollgate_server::envoy::Envoy;
use tollgate_server::metrics::{self, CATALOG, Kind};
use tollgate_server::provider;
use tollgate_server::service::Service;

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Counter => "counter",
        Kind::Gauge => "gauge",
        Kind::Histogram => "histogram",
    }
}

fn render() -> String {
    let mut out = String::from("| metric | type | labels | meaning |\n| --- | --- | --- | --- |\n");
    for m in CATALOG {
        let labels: Vec<String> = m.labels.iter().map(|l| format!("`{l}`")).collect();
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            m.name,
            kind_name(m.kind),
            labels.join(", "),
            reference::cell(m.help)
        ));
    }
    out
}

#[test]
fn the_page_is_the_catalog() {
    reference::check_block("metrics.md", "metrics", &render());
}

/// Every metric name the source registers: the literal first argument of `counter!`,
/// `gauge!` and `histogram!`, and the Envoy statistics' names made from their last parts.
fn registered_in_source() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let mut names = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for mac in ["counter!(\"", "gauge!(\"", "histogram!(\""] {
            for part in text.split(mac).skip(1) {
                names.insert(part.split('"').next().unwrap().to_string());
            }
        }
        for part in text
            .split("format!(\"ratelimit_service_rate_limit_{what}\")")
            .skip(1)
        {
            let _ = part;
            for stat in tollgate_server::metrics::statsd::STATS {
                names.insert(format!("ratelimit_service_rate_limit_{stat}"));
            }
        }
    }
    names
}

#[test]
fn every_metric_the_source_registers_is_in_the_catalog_and_nothing_else() {
    let registered = registered_in_source();
    let cataloged: BTreeSet<String> = CATALOG.iter().map(|m| m.name.to_string()).collect();
    let missing: Vec<_> = registered.difference(&cataloged).collect();
    let stale: Vec<_> = cataloged.difference(&registered).collect();
    assert!(
        missing.is_empty(),
        "registered but not in metrics::CATALOG: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "in metrics::CATALOG but registered nowhere: {stale:?}"
    );
    assert!(registered.len() >= 25, "{registered:?}");
}

#[tokio::test]
async fn what_metrics_renders_is_in_the_catalog() {
    let handle = metrics::install().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = [
        ("rules.yaml", "rules:\n  - id: api\n    key: [client_ip]\n    tiers: [{ limit: 1, period: 1m }]\n"),
        ("envoy.yaml", "domain: edge\ndescriptors:\n  - key: path\n    detailed_metric: true\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n"),
    ]
    .into_iter()
    .map(|(name, text)| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    })
    .collect();
    let service = Arc::new(
        Service::start(files.clone(), provider::load(&files).unwrap())
            .await
            .unwrap(),
    );
    let envoy = Envoy::new(service.clone());
    for _ in 0..3 {
        service
            .check_key("api", b"10.0.0.1", 1, None)
            .await
            .unwrap();
        let path = descriptor([("path", "/a")]);
        let limit = Some(LimitOverride {
            requests_per_unit: 1,
            unit: "second",
        });
        envoy
            .check_descriptors("edge", &[(path.clone(), 1, None), (path, 1, limit)])
            .await
            .unwrap();
    }
    provider::reload(&service).unwrap();
    service.observe();
    metrics::connections(3, 1);
    let text = handle.render();
    let mut seen = 0;
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut parts = line.split_whitespace().skip(2);
        let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
        let found = CATALOG.iter().find(|m| m.name == name).unwrap_or_else(|| {
            panic!("/metrics renders {name}, which metrics::CATALOG does not list")
        });
        assert_eq!(kind, kind_name(found.kind), "{name}");
        seen += 1;
    }
    assert!(seen >= 10, "{text}");
    let help = CATALOG
        .iter()
        .find(|m| m.name == "tollgate_decisions_total")
        .unwrap()
        .help;
    assert!(
        text.contains(&format!("# HELP tollgate_decisions_total {help}")),
        "{text}"
    );
}
