//! Prometheus metrics. The service records through the `metrics` facade; `/metrics` renders
//! the recorder installed at start.
//!
//! - `tollgate_decisions_total{rule, outcome}`: outcome `allowed`, `denied`, or
//!   `shadow_denied` (a shadow rule that would have denied); per-value names (Envoy's
//!   `detailed_metric`) take at most 1,000 `rule` values, then `_other`, counted in
//!   `tollgate_metric_series_folded_total`;
//! - `tollgate_near_limit_total{rule}`: admitted with under a fifth of the limit left;
//! - `tollgate_policy_decisions_total{rule, source}`: decided by the failure policy
//!   (`fallback`, `fail_open`, `fail_closed`) because the store failed;
//! - `tollgate_store_seconds{store}`: how long the store took to decide a check (a histogram,
//!   buckets from 10 µs to 1 s);
//! - `tollgate_store_errors_total{store, kind}`: calls to Redis that failed, `kind` `error`
//!   (an error answer or a lost connection) or `timeout` (no answer in time);
//! - `tollgate_fallback_active`: 1 while the failure policy decides because Redis keeps
//!   failing (strict and lease: the breaker keeps checks away; hybrid: syncs failed too long);
//! - `tollgate_reloads_total{result}`: `ok` or `error`;
//! - `tollgate_keys`, `tollgate_bytes`: what the store holds in this process (bytes as the
//!   memory store's `max_bytes` counts them: its tables' buckets and what lives outside);
//! - `tollgate_evictions_total`: keys the memory store forgot while their state mattered, to
//!   stay within its bounds; `tollgate_limiting_evictions_total`, those that were used up
//!   (their next check was admitted as a new key's); `tollgate_refused_keys_total`, new keys
//!   it found no room for, decided by their rule's failure policy;
//! - `tollgate_redis_calls_saved`: decisions taken without a Redis call (hybrid, lease);
//! - `tollgate_connections_open`, `tollgate_connections_evicted_total`: connections of both
//!   listeners open now, and closed so far to make room for new ones at the cap.

use std::collections::HashSet;
use std::sync::{LazyLock, RwLock};
use std::time::Duration;

use metrics::{Counter, Histogram, counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tollgate::{Decision, Source, StoreFailures};

/// Buckets of `tollgate_store_seconds`: a memory store decides in microseconds, Redis in
/// tenths of a millisecond to milliseconds, a guard's timeout in tens of milliseconds.
const STORE_SECONDS: [f64; 14] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 1.0,
];

/// How often histogram samples are folded into their buckets.
pub const UPKEEP: Duration = Duration::from_secs(1);

/// Installs the recorder; its handle renders the metrics. Histogram samples wait in the
/// recorder until they are folded into their buckets, which rendering does, and so must
/// [`upkeep`], every [`UPKEEP`]: otherwise a server nobody scrapes holds every sample
/// (about 20 bytes a check).
///
/// # Errors
/// When a recorder is installed already.
pub fn install() -> anyhow::Result<PrometheusHandle> {
    let builder = PrometheusBuilder::new().set_buckets_for_metric(
        Matcher::Full("tollgate_store_seconds".into()),
        &STORE_SECONDS,
    )?;
    Ok(builder.install_recorder()?)
}

/// Folds histogram samples into their buckets every [`UPKEEP`], for ever.
pub async fn upkeep(handle: PrometheusHandle) {
    let mut every = tokio::time::interval(UPKEEP);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        handle.run_upkeep();
    }
}

/// The counters of one rule, registered once (a check then only adds to atomics).
#[derive(Debug, Clone)]
pub struct RuleMetrics {
    allowed: Counter,
    denied: Counter,
    shadow_denied: Counter,
    near_limit: Counter,
}

impl RuleMetrics {
    /// Registers the counters of `rule`. The recorder must be installed first.
    pub fn new(rule: &str) -> Self {
        let outcome = |o: &'static str| counter!("tollgate_decisions_total", "rule" => rule.to_string(), "outcome" => o);
        Self {
            allowed: outcome("allowed"),
            denied: outcome("denied"),
            shadow_denied: outcome("shadow_denied"),
            near_limit: counter!("tollgate_near_limit_total", "rule" => rule.to_string()),
        }
    }

    /// Records one decision (as [`decision`] does, on the registered counters).
    pub fn record(&self, d: &Decision) {
        match (d.allowed(), d.shadowed()) {
            (true, false) => self.allowed.increment(1),
            (true, true) => self.shadow_denied.increment(1),
            (false, _) => self.denied.increment(1),
        }
        if d.allowed() && !d.shadowed() && d.remaining() * 5 < d.limit() {
            self.near_limit.increment(1);
        }
        if !matches!(
            d.source(),
            Source::Memory | Source::Redis | Source::Hybrid | Source::Lease
        ) {
            policy(d.rule(), d);
        }
    }
}

/// The most distinct `rule` labels that decisions recorded under names not registered ahead
/// (Envoy's detailed metrics, one per descriptor value) may create; beyond, decisions are
/// recorded under `rule="_other"` and counted in `tollgate_metric_series_folded_total`, so that
/// no traffic can grow the series (and `/metrics`) without bound.
pub const MAX_DETAILED_LABELS: usize = 1_000;

/// The label values given out so far for names not registered ahead.
static DETAILED: LazyLock<RwLock<HashSet<String>>> = LazyLock::new(RwLock::default);

/// The `rule` label for `name`: itself while fewer than [`MAX_DETAILED_LABELS`] are given out.
fn detailed_label(name: &str) -> String {
    let known = |set: &HashSet<String>| set.contains(name);
    if known(&DETAILED.read().unwrap_or_else(|e| e.into_inner())) {
        return name.to_string();
    }
    let mut labels = DETAILED.write().unwrap_or_else(|e| e.into_inner());
    if known(&labels) || labels.len() < MAX_DETAILED_LABELS {
        labels.insert(name.to_string());
        return name.to_string();
    }
    counter!("tollgate_metric_series_folded_total").increment(1);
    "_other".to_string()
}

/// Records one decision under `rule`, a name not registered ahead (Envoy's detailed metrics),
/// within [`MAX_DETAILED_LABELS`].
pub fn decision(rule: &str, d: &Decision) {
    let rule = detailed_label(rule);
    counter!("tollgate_decisions_total", "rule" => rule.clone(), "outcome" => outcome(d))
        .increment(1);
    if near_limit(d) {
        counter!("tollgate_near_limit_total", "rule" => rule.clone()).increment(1);
    }
    policy(&rule, d);
}

/// The outcome label of a decision.
fn outcome(d: &Decision) -> &'static str {
    match (d.allowed(), d.shadowed()) {
        (true, false) => "allowed",
        (true, true) => "shadow_denied",
        (false, _) => "denied",
    }
}

/// Admitted with under a fifth of the limit left.
fn near_limit(d: &Decision) -> bool {
    d.allowed() && !d.shadowed() && d.remaining() * 5 < d.limit()
}

/// Records a decision when the failure policy took it, not the store.
fn policy(rule: &str, d: &Decision) {
    let source = match d.source() {
        Source::Fallback => "fallback",
        Source::FailOpen => "fail_open",
        Source::FailClosed => "fail_closed",
        _ => return,
    };
    counter!("tollgate_policy_decisions_total", "rule" => rule.to_string(), "source" => source)
        .increment(1);
}

/// The histogram of how long `store` took to decide, registered once.
pub fn store_latency(store: &'static str) -> Histogram {
    histogram!("tollgate_store_seconds", "store" => store)
}

/// Records how long the store took.
pub fn record_latency(histogram: &Histogram, took: Duration) {
    histogram.record(took.as_secs_f64());
}

/// Records a reload.
pub fn reload(ok: bool) {
    let result = if ok { "ok" } else { "error" };
    counter!("tollgate_reloads_total", "result" => result).increment(1);
}

/// Records what the store holds in this process.
pub fn store_held(keys: usize, bytes: Option<usize>) {
    gauge!("tollgate_keys").set(keys as f64);
    if let Some(bytes) = bytes {
        gauge!("tollgate_bytes").set(bytes as f64);
    }
}

/// Records what the memory store did to stay within its bounds, so far.
pub fn store_bound(evictions: u64, limiting: u64, refused: u64) {
    counter!("tollgate_evictions_total").absolute(evictions);
    counter!("tollgate_limiting_evictions_total").absolute(limiting);
    counter!("tollgate_refused_keys_total").absolute(refused);
}

/// Records the connections open now and those closed to make room so far.
pub fn connections(open: usize, evicted: u64) {
    gauge!("tollgate_connections_open").set(open as f64);
    counter!("tollgate_connections_evicted_total").absolute(evicted);
}

/// Records the decisions taken without a Redis call so far.
pub fn calls_saved(saved: u64) {
    gauge!("tollgate_redis_calls_saved").set(saved as f64);
}

/// Records the failed calls of the shared store of kind `store` so far.
pub fn store_failures(store: &'static str, failures: StoreFailures) {
    let errors = |kind: &'static str| counter!("tollgate_store_errors_total", "store" => store, "kind" => kind);
    errors("error").absolute(failures.errors);
    errors("timeout").absolute(failures.timeouts);
}

/// Records whether the failure policy is deciding for the Redis store.
pub fn fallback_active(active: bool) {
    gauge!("tollgate_fallback_active").set(if active { 1.0 } else { 0.0 });
}
