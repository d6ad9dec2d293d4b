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

/// Runs `program args` in `dir`; its standard output, or a panic with what it said.
fn output(program: &str, args: &[&str], dir: &Path, installed_by: &str) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} ({installed_by})"));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{program} {args:?}: {said}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The objects of a YAML stream, as JSON.
fn objects(yaml: &str) -> Vec<serde_json::Value> {
    yaml.split("\n---\n")
        .filter(|doc| !doc.trim().is_empty())
        .map(|doc| serde_saphyr::from_str(doc).unwrap())
        .collect()
}

/// `deploy/kubernetes` renders with kustomize (`kubectl kustomize`) and, with the optional
/// HPA, validates against Kubernetes' schemas, strictly (no field the API does not have); the
/// parts name each other as they must: selectors the pod's labels, the Service's and monitors'
/// ports the container's, the Secret and ConfigMap what the pod mounts, the probes routes the
/// service has; and the rules it mounts are valid.
#[test]
fn the_kubernetes_manifests_render_and_validate() {
    let dir = deploy().join("kubernetes");
    let rendered = output(
        "kubectl",
        &["kustomize", "."],
        &dir,
        "scripts/deps: Debian's kubernetes-client",
    );
    let temp = tempfile::tempdir().unwrap();
    let file = temp.path().join("rendered.yaml");
    std::fs::write(&file, &rendered).unwrap();
    let validated = output(
        "kubernetes-validate",
        &["--strict", file.to_str().unwrap(), "hpa.yaml"],
        &dir,
        "scripts/deps: pip's kubernetes-validate",
    );
    let mut all = objects(&rendered);
    for optional in ["hpa.yaml", "servicemonitor.yaml", "podmonitor.yaml"] {
        all.extend(objects(
            &std::fs::read_to_string(dir.join(optional)).unwrap(),
        ));
    }
    let of = |kind: &str, name: &str| {
        all.iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
            .clone()
    };
    for kind in [
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
    ] {
        let passed = format!("passed for resource {}/", kind.to_lowercase());
        assert!(validated.contains(&passed), "{kind}: {validated}");
    }
    let deployment = of("Deployment", "tollgate");
    let pod = &deployment["spec"]["template"];
    let labels = &pod["metadata"]["labels"];
    let container = &pod["spec"]["containers"][0];
    let ports: Vec<&str> = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    let selects_the_pod = |selector: &serde_json::Value| {
        let wanted = selector.as_object().unwrap();
        assert!(!wanted.is_empty());
        for (k, v) in wanted {
            assert_eq!(&labels[k], v, "{k} does not select the pod");
        }
    };
    selects_the_pod(&deployment["spec"]["selector"]["matchLabels"]);
    selects_the_pod(&of("PodDisruptionBudget", "tollgate")["spec"]["selector"]["matchLabels"]);
    let service = of("Service", "tollgate");
    selects_the_pod(&service["spec"]["selector"]);
    for port in service["spec"]["ports"].as_array().unwrap() {
        assert!(
            ports.contains(&port["targetPort"].as_str().unwrap()),
            "{port}"
        );
    }
    assert_eq!(
        service["spec"]["ports"].as_array().unwrap().len(),
        3,
        "HTTP, gRPC and metrics"
    );
    let monitor = of("ServiceMonitor", "tollgate");
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&service["metadata"]["labels"][k], v);
    }
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    let pod_monitor = of("PodMonitor", "tollgate");
    selects_the_pod(&pod_monitor["spec"]["selector"]["matchLabels"]);
    assert_eq!(
        pod_monitor["spec"]["podMetricsEndpoints"][0]["port"],
        "metrics"
    );
    assert_eq!(
        of("HorizontalPodAutoscaler", "tollgate")["spec"]["scaleTargetRef"]["name"],
        "tollgate"
    );

    // Probes on the service's health routes; non-root; the admin token from the Secret.
    for (probe, path) in [
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/healthcheck"),
    ] {
        assert_eq!(container[probe]["httpGet"]["path"], path, "{probe}");
    }
    assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    let token = &container["env"][0]["valueFrom"]["secretKeyRef"];
    let secret = of("Secret", "tollgate-admin");
    assert_eq!(token["name"], "tollgate-admin");
    assert!(secret["stringData"][token["key"].as_str().unwrap()].is_string());

    // The rules the pod mounts where its arguments say, valid.
    let args = container["args"].as_array().unwrap();
    let at = args.iter().position(|a| a == "--config").unwrap();
    let mount = &container["volumeMounts"][0];
    assert_eq!(args[at + 1], mount["mountPath"]);
    let volume = &pod["spec"]["volumes"][0];
    assert_eq!(volume["name"], mount["name"]);
    let rules = of("ConfigMap", volume["configMap"]["name"].as_str().unwrap());
    for (name, text) in rules["data"].as_object().unwrap() {
        let path = temp.path().join(name);
        std::fs::write(&path, text.as_str().unwrap()).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["validate", path.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
