//! What `deploy/` ships: the Grafana dashboard's and the alert rules' queries name only
//! metrics the service exports (`metrics::CATALOG`) and parse as PromQL; the alert rules pass
//! `promtool check rules` and their `promtool test rules` cases; the systemd unit passes
//! `systemd-analyze verify`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use tollgate_server::metrics::CATALOG;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Every PromQL expression of the dashboard, its variables replaced by what Grafana would.
fn dashboard_queries() -> Vec<String> {
    let text = std::fs::read_to_string(deploy().join("grafana/tollgate.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            queries.push(
                expr.replace("$__rate_interval", "5m")
                    .replace("$instance", ".*"),
            );
        }
    }
    queries
}

/// Every alert's expression.
fn alert_queries() -> Vec<String> {
    let text = std::fs::read_to_string(deploy().join("prometheus/alerts.yaml")).unwrap();
    let rules: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .map(|r| r["expr"].as_str().unwrap().to_string())
        .collect()
}

/// The `tollgate_*` names an expression reads, a histogram's `_bucket`, `_sum` and `_count`
/// read as the histogram.
fn metrics_in(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("tollgate_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|base| CATALOG.iter().any(|m| m.name == *base))
            .unwrap_or(name);
        names.insert(base.to_string());
        rest = &tail[end..];
    }
    names
}

#[test]
fn the_dashboard_and_the_alerts_read_only_metrics_the_service_exports() {
    let dashboard = dashboard_queries();
    let alerts = alert_queries();
    assert!(dashboard.len() >= 20 && alerts.len() >= 10);
    let mut read = BTreeSet::new();
    for expr in dashboard.iter().chain(&alerts) {
        for name in metrics_in(expr) {
            assert!(
                CATALOG.iter().any(|m| m.name == name),
                "`{name}` (in `{expr}`) is not a metric the service exports"
            );
            read.insert(name);
        }
    }
    // What the issue asks the dashboard to show, by the metrics that show it.
    for name in [
        "tollgate_decisions_total",
        "tollgate_store_seconds",
        "tollgate_store_errors_total",
        "tollgate_fallback_active",
        "tollgate_policy_decisions_total",
        "tollgate_keys",
        "tollgate_refused_keys_total",
        "tollgate_reloads_total",
        "tollgate_xds_connected",
        "tollgate_region_peer_lag_seconds",
        "tollgate_region_peer_up",
    ] {
        assert!(read.contains(name), "{name} is shown nowhere");
    }
}

fn promtool(args: &[&str], dir: &Path) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool is installed (scripts/deps: Debian's prometheus)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}: {said}");
    said
}

#[test]
fn the_alert_rules_pass_promtool_and_their_tests() {
    let dir = deploy().join("prometheus");
    promtool(&["check", "rules", "alerts.yaml"], &dir);
    let tested = promtool(&["test", "rules", "alerts.test.yaml"], &dir);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_query_of_the_dashboard_parses() {
    let dir = tempfile::tempdir().unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in dashboard_queries().iter().enumerate() {
        rules.push_str(&format!(
            "      - record: dashboard:query{i}\n        expr: {}\n",
            serde_json::to_string(expr).unwrap()
        ));
    }
    std::fs::write(dir.path().join("queries.yaml"), rules).unwrap();
    promtool(&["check", "rules", "queries.yaml"], dir.path());
}

#[test]
fn the_systemd_unit_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string(deploy().join("systemd/tollgate.service")).unwrap();
    assert!(unit.contains("ExecReload=/bin/kill -HUP $MAINPID"));
    // Verified against the binary these tests built, where the unit expects it installed.
    let unit = unit.replace("/usr/local/bin/tollgate", env!("CARGO_BIN_EXE_tollgate"));
    let path = dir.path().join("tollgate.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze is installed (scripts/deps: Debian's systemd)");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(!said.contains("tollgate.service:"), "{said}");
}
