//! Prometheus metrics. The service records through the `metrics` facade; `/metrics` renders
//! the recorder installed at start. Every metric is in [`CATALOG`], with its labels and what
//! it means: `/metrics` says it in its `# HELP` lines, and docs/metrics.md lists it.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, RwLock};
use std::time::Duration;

use metrics::{Counter, Histogram, counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tollgate::{Decision, Source, StoreFailures};

pub mod statsd;

use statsd::Stat;

/// What kind of metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in buckets (`_bucket`, `_sum`, `_count`).
    Histogram,
}

/// One metric the service exports.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Its name.
    pub name: &'static str,
    /// What kind it is.
    pub kind: Kind,
    /// Its labels.
    pub labels: &'static [&'static str],
    /// What it means.
    pub help: &'static str,
}

const fn metric(
    name: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    help: &'static str,
) -> Metric {
    Metric {
        name,
        kind,
        labels,
        help,
    }
}

/// Every metric the service exports.
pub const CATALOG: &[Metric] = &[
    metric(
        "tollgate_decisions_total",
        Kind::Counter,
        &["rule", "outcome"],
        "Decisions by rule and outcome: `allowed`, `denied`, or `shadow_denied` (a shadow rule that would have denied). Per-value names (Envoy's `detailed_metric`) take at most 1,000 `rule` values of at most 1,024 bytes, then `_other`.",
    ),
    metric(
        "tollgate_near_limit_total",
        Kind::Counter,
        &["rule"],
        "Admitted with under a fifth of the binding tier's limit left.",
    ),
    metric(
        "tollgate_policy_decisions_total",
        Kind::Counter,
        &["rule", "source"],
        "Decided by the rule's failure policy because the store failed: `source` `fallback` (the local share), `fail_open` or `fail_closed`; or by a global rule's partition fallback while a peer region is stale: `partitioned`.",
    ),
    metric(
        "tollgate_store_seconds",
        Kind::Histogram,
        &["store"],
        "How long the store took to decide a check, in seconds (buckets from 10 µs to 1 s).",
    ),
    metric(
        "tollgate_store_errors_total",
        Kind::Counter,
        &["store", "kind"],
        "Calls to Redis that failed: `kind` `error` (an error answer or a lost connection) or `timeout` (no answer in time).",
    ),
    metric(
        "tollgate_fallback_active",
        Kind::Gauge,
        &[],
        "1 while a failure policy decides because Redis keeps failing (strict and lease: the breaker keeps checks away; hybrid: syncs failed too long; on a cluster, the checks of a failing master's slots).",
    ),
    metric(
        "tollgate_redis_node_up",
        Kind::Gauge,
        &["node"],
        "Redis Cluster: 1 while the master answers, 0 while its breaker keeps its checks away.",
    ),
    metric(
        "tollgate_redis_node_slots",
        Kind::Gauge,
        &["node"],
        "Redis Cluster: the slots the master serves.",
    ),
    metric(
        "tollgate_redis_slots_failing",
        Kind::Gauge,
        &[],
        "Redis Cluster: the slots of failing masters, whose checks the failure policies decide.",
    ),
    metric(
        "tollgate_region_peer_up",
        Kind::Gauge,
        &["region", "peer"],
        "Regions: 1 while the peer region's Redis answers this instance's rounds, 0 while it does not (past a global rule's `stale_after`, the rule admits this region's share: decisions of source `partitioned`).",
    ),
    metric(
        "tollgate_region_peer_last_heard_seconds",
        Kind::Gauge,
        &["region", "peer"],
        "Regions: seconds since the peer region last answered (-1: never since start). What a global rule's `stale_after` is compared with.",
    ),
    metric(
        "tollgate_region_peer_lag_seconds",
        Kind::Gauge,
        &["region", "peer"],
        "Regions: how long the peer's last answer took, in seconds: about the round trip between the regions, which paces a region's permits beyond what the peers confirmed.",
    ),
    metric(
        "tollgate_region_peer_pending",
        Kind::Gauge,
        &["region", "peer"],
        "Regions: buckets of this region's counts the peer has not taken yet (they grow while it is cut off, and are sent when it answers).",
    ),
    metric(
        "tollgate_region_peer_failures_total",
        Kind::Counter,
        &["region", "peer"],
        "Regions: rounds in which the peer region did not take this region's counts.",
    ),
    metric(
        "tollgate_region_dropped_total",
        Kind::Counter,
        &["region"],
        "Regions: buckets of global rules this instance never sent to the peers because a million were pending already (a long partition over many keys): the peers undercount them. Alert on any.",
    ),
    metric(
        "tollgate_region_admitted_total",
        Kind::Counter,
        &["region", "rule"],
        "Regions: permits this instance admitted under global rules, by this region's name: summed over every region's instances, a global rule's use per region.",
    ),
    metric(
        "tollgate_reloads_total",
        Kind::Counter,
        &["result"],
        "Loads of the rule files (and of the rules other instances shared): `ok` or `error` (the previous rules keep serving).",
    ),
    metric(
        "tollgate_keys",
        Kind::Gauge,
        &[],
        "Keys the store holds in this process.",
    ),
    metric(
        "tollgate_bytes",
        Kind::Gauge,
        &[],
        "Bytes the memory store holds, as its `max_bytes` counts them (its tables' buckets, used or not, and keys longer than 18 bytes).",
    ),
    metric(
        "tollgate_evictions_total",
        Kind::Counter,
        &[],
        "Keys the memory store forgot while their state mattered, to stay within its bounds.",
    ),
    metric(
        "tollgate_limiting_evictions_total",
        Kind::Counter,
        &[],
        "Of those, keys that were used up: their next check was admitted as a new key's.",
    ),
    metric(
        "tollgate_refused_keys_total",
        Kind::Counter,
        &[],
        "New keys a full memory store (`when_full: refuse`) found no room for, decided by their rule's failure policy.",
    ),
    metric(
        "tollgate_redis_calls_saved",
        Kind::Gauge,
        &[],
        "Decisions taken without a Redis call (hybrid and lease stores).",
    ),
    metric(
        "tollgate_connections_open",
        Kind::Gauge,
        &[],
        "Connections of both listeners open now.",
    ),
    metric(
        "tollgate_connections_evicted_total",
        Kind::Counter,
        &[],
        "Connections closed to make room for new ones at `server.max_connections`.",
    ),
    metric(
        "tollgate_reported_total",
        Kind::Counter,
        &["rule"],
        "Permits taken by reports (`POST /v1/report`): costs known once the work was done.",
    ),
    metric(
        "tollgate_reservations_total",
        Kind::Counter,
        &["event"],
        "Reservations: `created`, `refused` (a full book, or a store that takes none), `committed`, `cancelled`, `expired` (settled by themselves as their rules say).",
    ),
    metric(
        "tollgate_envoy_negative_hits_total",
        Kind::Counter,
        &["descriptor"],
        "Hits given back by Envoy descriptors sent with `is_negative_hits` (a stream done), by the name of the descriptor's statistics.",
    ),
    metric(
        "tollgate_denied_cache_total",
        Kind::Counter,
        &["rule"],
        "Checks of a strict Redis rule answered denied by this instance from a denial Redis gave, until its `retry_after`, without asking Redis.",
    ),
    metric(
        "tollgate_list_decisions_total",
        Kind::Counter,
        &["list", "rule"],
        "Checks decided by an allow or deny list entry (bans included) before the store, by list (`allow`, `deny`) and rule.",
    ),
    metric(
        "tollgate_list_entries",
        Kind::Gauge,
        &["list"],
        "Entries on each list (`allow`, `deny`) held by this instance, bans included.",
    ),
    metric(
        "tollgate_xds_pushes_total",
        Kind::Counter,
        &["result"],
        "Configurations an xDS management server pushed (`CONFIG_TYPE=GRPC_XDS_SOTW`): `applied` (and ACKed), or `rejected` (NACKed with the reason; the limits in use kept serving).",
    ),
    metric(
        "tollgate_xds_connected",
        Kind::Gauge,
        &[],
        "1 while subscribed to the xDS management server, 0 while it is away (the last configuration it gave keeps serving; alert when 0 for longer than a restart of it takes).",
    ),
    metric(
        "tollgate_bans_total",
        Kind::Counter,
        &["rule", "outcome"],
        "Keys banned by a rule's `ban` (`banned`), or not for want of room on the lists (`refused`).",
    ),
    metric(
        "tollgate_permits_total",
        Kind::Counter,
        &["event"],
        "Permits of concurrency rules: `held` (slots taken under a permit), `released`, `extended`.",
    ),
    metric(
        "tollgate_metric_series_folded_total",
        Kind::Counter,
        &[],
        "Decisions counted under `_other` because per-value names reached their bound of 1,000.",
    ),
    metric(
        "ratelimit_service_rate_limit_total_hits",
        Kind::Counter,
        &["domain", "key1", "key2"],
        "Envoy domains, as envoyproxy/ratelimit's Prometheus mapping names them: every hit of a descriptor (a request of `hits_addend` 5 counts 5). `key2` for descriptors of two entries or more; per-value names take at most 1,000 label sets of at most 1,024 bytes, then `key1=\"_other\"`.",
    ),
    metric(
        "ratelimit_service_rate_limit_over_limit",
        Kind::Counter,
        &["domain", "key1", "key2"],
        "Envoy domains: hits over the limit.",
    ),
    metric(
        "ratelimit_service_rate_limit_near_limit",
        Kind::Counter,
        &["domain", "key1", "key2"],
        "Envoy domains: hits within the limit past `NEAR_LIMIT_RATIO` of it.",
    ),
    metric(
        "ratelimit_service_rate_limit_within_limit",
        Kind::Counter,
        &["domain", "key1", "key2"],
        "Envoy domains: hits within the limit.",
    ),
    metric(
        "ratelimit_service_rate_limit_shadow_mode",
        Kind::Counter,
        &["domain", "key1", "key2"],
        "Envoy domains: hits over a limit in shadow mode.",
    ),
    metric(
        "ratelimit_service_rate_limit_over_limit_with_local_cache",
        Kind::Counter,
        &["domain", "key1", "key2"],
        "Envoy domains: hits over the limit answered from the local cache, without the store (`LOCAL_CACHE_SIZE_IN_BYTES`).",
    ),
    metric(
        "ratelimit_service_config_load_success",
        Kind::Counter,
        &[],
        "Envoy's name for rule files loaded.",
    ),
    metric(
        "ratelimit_service_config_load_error",
        Kind::Counter,
        &[],
        "Envoy's name for rule files refused.",
    ),
    metric(
        "ratelimit_service_total_requests",
        Kind::Counter,
        &["grpc_method"],
        "`ShouldRateLimit` calls.",
    ),
    metric(
        "ratelimit_service_response_time_seconds",
        Kind::Histogram,
        &["grpc_method"],
        "How long `ShouldRateLimit` calls took, in seconds.",
    ),
    metric(
        "ratelimit_service_should_rate_limit_error",
        Kind::Counter,
        &["err_type"],
        "`ShouldRateLimit` calls that failed: `err_type` `redis_error` (a failure policy decided) or `service_error` (a request refused as bad).",
    ),
];

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
    let handle = builder.install_recorder()?;
    for m in CATALOG {
        match m.kind {
            Kind::Counter => metrics::describe_counter!(m.name, m.help),
            Kind::Gauge => metrics::describe_gauge!(m.name, m.help),
            Kind::Histogram => metrics::describe_histogram!(m.name, m.help),
        }
    }
    Ok(handle)
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
            Source::Memory
                | Source::Redis
                | Source::RedisModule
                | Source::Hybrid
                | Source::Lease
                | Source::Global
        ) {
            policy(d.rule(), d);
        }
    }
}

/// The counters of one Envoy limit's statistics (see the module documentation).
#[derive(Debug, Clone)]
pub struct EnvoyStats {
    total_hits: Counter,
    over_limit: Counter,
    near_limit: Counter,
    within_limit: Counter,
    shadow_mode: Counter,
    over_limit_with_local_cache: Counter,
    /// The same counts under the Envoy service's statsd names (`/stats`, statsd sinks).
    counts: Arc<statsd::Counters>,
}

/// What one descriptor's check did, for its statistics.
#[derive(Debug, Clone, Copy)]
pub struct Hits {
    /// Hits the descriptor asked for.
    pub hits: u64,
    /// Its limit (permits per unit).
    pub limit: u64,
    /// Its window's count after these hits, when known (within the limit); `None` when over.
    pub after: Option<u64>,
    /// Over the limit, and in shadow mode.
    pub shadow: bool,
    /// Over the limit as the local cache of descriptors over their limit knew, without asking
    /// the store (`LOCAL_CACHE_SIZE_IN_BYTES`).
    pub cached: bool,
    /// The near-limit ratio (`NEAR_LIMIT_RATIO`, 0.8 by default).
    pub near_ratio: f32,
}

impl EnvoyStats {
    /// Registers the statistics named `name` (`domain.key1.key2...`, as the Envoy service
    /// names them); the recorder must be installed first.
    pub fn new(name: &str) -> Self {
        let sanitized = sanitize(name);
        let mut parts = sanitized.split('.');
        let domain = parts.next().unwrap_or_default().to_string();
        let key1 = parts.next().unwrap_or_default().to_string();
        let key2 = parts.next().map(str::to_string);
        let counter = |what: &str| {
            let name = format!("ratelimit_service_rate_limit_{what}");
            match &key2 {
                Some(key2) => {
                    counter!(name, "domain" => domain.clone(), "key1" => key1.clone(), "key2" => key2.clone())
                }
                None => counter!(name, "domain" => domain.clone(), "key1" => key1.clone()),
            }
        };
        Self {
            total_hits: counter("total_hits"),
            over_limit: counter("over_limit"),
            near_limit: counter("near_limit"),
            within_limit: counter("within_limit"),
            shadow_mode: counter("shadow_mode"),
            over_limit_with_local_cache: counter("over_limit_with_local_cache"),
            counts: statsd::counters(&sanitized),
        }
    }

    /// Records `hits` under the statistics named `name`, not registered ahead (detailed
    /// metrics, limits sent with a descriptor): registered the first time, then kept, within
    /// [`MAX_DETAILED_LABELS`] names (then `domain._other`; the decision's own series counts
    /// the fold). A name seen before costs a read lock and a lookup.
    pub fn record_named(name: &str, hits: Hits) {
        if let Some(stats) = NAMED.read().unwrap_or_else(|e| e.into_inner()).get(name) {
            stats.record(hits);
            return;
        }
        let label = label_within_bound(name);
        let key = if label == "_other" {
            format!("{}._other", name.split('.').next().unwrap_or_default())
        } else {
            label
        };
        let mut named = NAMED.write().unwrap_or_else(|e| e.into_inner());
        let stats = named
            .entry(key.clone())
            .or_insert_with(|| Self::new(&key))
            .clone();
        drop(named);
        stats.record(hits);
    }

    /// Records one descriptor's check as the Envoy service counts it: every hit in
    /// `total_hits`; hits within the limit in `within_limit`, those past the near-limit
    /// threshold also in `near_limit`; hits over the limit in `over_limit` (a request over the
    /// limit counts all its hits there), and in `shadow_mode` too when the limit is in
    /// shadow mode.
    pub fn record(&self, h: Hits) {
        let add = |counter: &Counter, stat: Stat, n: u64| {
            counter.increment(n);
            self.counts.add(stat, n);
        };
        add(&self.total_hits, Stat::TotalHits, h.hits);
        match h.after {
            Some(after) => {
                add(&self.within_limit, Stat::WithinLimit, h.hits);
                let near = (h.limit as f32 * h.near_ratio).floor() as u64;
                let before = after.saturating_sub(h.hits);
                if after > near {
                    add(&self.near_limit, Stat::NearLimit, after - near.max(before));
                }
            }
            None => {
                add(&self.over_limit, Stat::OverLimit, h.hits);
                if h.cached {
                    let cache = &self.over_limit_with_local_cache;
                    add(cache, Stat::OverLimitWithLocalCache, h.hits);
                }
                if h.shadow {
                    add(&self.shadow_mode, Stat::ShadowMode, h.hits);
                }
            }
        }
    }
}

/// The statistics registered by [`EnvoyStats::record_named`], by name: at most
/// [`MAX_DETAILED_LABELS`] names and one `_other` per domain.
static NAMED: LazyLock<RwLock<std::collections::HashMap<String, EnvoyStats>>> =
    LazyLock::new(RwLock::default);

/// A statistics name as the Envoy service sanitizes it for statsd: `:` and `|` become `_`,
/// and the dots of an IPv4 address too.
fn sanitize(name: &str) -> String {
    let name = name.replace([':', '|'], "_");
    // The dots of dotted quads: a run of four numeric parts joined by `_`.
    let parts: Vec<&str> = name.split('.').collect();
    let mut out: Vec<String> = Vec::with_capacity(parts.len());
    let mut i = 0;
    while i < parts.len() {
        let quad = i + 4 <= parts.len() && (0..4).all(|j| is_octet(parts[i + j], j == 0));
        if quad {
            out.push(parts[i..i + 4].join("_"));
            i += 4;
        } else {
            out.push(parts[i].to_string());
            i += 1;
        }
    }
    out.join(".")
}

/// Whether `part` ends (the first of a quad) or is (the others) an octet of an address: the
/// first may carry a key in front (`remote_address_10`).
fn is_octet(part: &str, first: bool) -> bool {
    let digits = if first {
        part.rsplit('_').next().unwrap_or(part)
    } else {
        part
    };
    !digits.is_empty() && digits.len() <= 3 && digits.bytes().all(|b| b.is_ascii_digit())
}

/// The most distinct `rule` labels that decisions recorded under names not registered ahead
/// (Envoy's detailed metrics, one per descriptor value) may create; beyond, decisions are
/// recorded under `rule="_other"` and counted in `tollgate_metric_series_folded_total`, so that
/// no traffic can grow the series (and `/metrics`) without bound.
pub const MAX_DETAILED_LABELS: usize = 1_000;

/// The longest name, in bytes, that names not registered ahead may give a label: a longer one
/// (a descriptor value of up to 4 MiB) is recorded under `_other`, so that the labels take at
/// most about 1 MiB whatever the values sent.
pub const MAX_DETAILED_LABEL_LEN: usize = 1_024;

/// The label values given out so far for names not registered ahead.
static DETAILED: LazyLock<RwLock<HashSet<String>>> = LazyLock::new(RwLock::default);

/// The `rule` label for `name`: itself while fewer than [`MAX_DETAILED_LABELS`] are given out;
/// a name folded into `_other` is counted.
fn detailed_label(name: &str) -> String {
    let label = label_within_bound(name);
    if label == "_other" {
        counter!("tollgate_metric_series_folded_total").increment(1);
    }
    label
}

/// The label for `name`, as [`detailed_label`], without counting a fold.
fn label_within_bound(name: &str) -> String {
    if name.len() > MAX_DETAILED_LABEL_LEN {
        return "_other".to_string();
    }
    let known = |set: &HashSet<String>| set.contains(name);
    if known(&DETAILED.read().unwrap_or_else(|e| e.into_inner())) {
        return name.to_string();
    }
    let mut labels = DETAILED.write().unwrap_or_else(|e| e.into_inner());
    if known(&labels) || labels.len() < MAX_DETAILED_LABELS {
        labels.insert(name.to_string());
        return name.to_string();
    }
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
        Source::Partitioned => "partitioned",
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

/// Records a load of the rule files (at start or a reload), also under the Envoy service's
/// names (`ratelimit_service_config_load_success`, `_error`).
pub fn reload(ok: bool) {
    let result = if ok { "ok" } else { "error" };
    counter!("tollgate_reloads_total", "result" => result).increment(1);
    if ok {
        counter!("ratelimit_service_config_load_success").increment(1);
        statsd::count(statsd::Service::ConfigLoadSuccess);
    } else {
        counter!("ratelimit_service_config_load_error").increment(1);
        statsd::count(statsd::Service::ConfigLoadError);
    }
}

/// The Envoy service's counters of `ShouldRateLimit` calls, registered once.
#[derive(Debug, Clone)]
pub struct CallStats {
    total: Counter,
    seconds: Histogram,
    redis_error: Counter,
    service_error: Counter,
}

impl Default for CallStats {
    fn default() -> Self {
        let error = |kind: &'static str| counter!("ratelimit_service_should_rate_limit_error", "err_type" => kind);
        Self {
            total: counter!("ratelimit_service_total_requests", "grpc_method" => "ShouldRateLimit"),
            seconds: histogram!("ratelimit_service_response_time_seconds", "grpc_method" => "ShouldRateLimit"),
            redis_error: error("redis_error"),
            service_error: error("service_error"),
        }
    }
}

/// How a `ShouldRateLimit` call ended, for its statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallEnd {
    /// Answered by the store.
    Answered,
    /// Redis did not answer: the failure policy decided.
    RedisError,
    /// Refused as a bad request.
    ServiceError,
}

impl CallStats {
    /// Records one call, as the Envoy service's statistics count them:
    /// `ratelimit_service_total_requests`, `_response_time_seconds` (labelled
    /// `grpc_method="ShouldRateLimit"`) and `_should_rate_limit_error{err_type}`.
    pub fn record(&self, took: Duration, end: CallEnd) {
        self.total.increment(1);
        statsd::count(statsd::Service::TotalRequests);
        self.seconds.record(took.as_secs_f64());
        match end {
            CallEnd::Answered => {}
            CallEnd::RedisError => {
                self.redis_error.increment(1);
                statsd::count(statsd::Service::RedisError);
            }
            CallEnd::ServiceError => {
                self.service_error.increment(1);
                statsd::count(statsd::Service::ServiceError);
            }
        }
    }
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

/// Records whether the failure policy is deciding for the Redis store (some checks: on a
/// cluster, those of a failing master's slots).
pub fn fallback_active(active: bool) {
    gauge!("tollgate_fallback_active").set(if active { 1.0 } else { 0.0 });
}

/// Records each master of a Redis Cluster: `tollgate_redis_node_up{node}` (0 while its
/// breaker keeps its checks away), `tollgate_redis_node_slots{node}`, and
/// `tollgate_redis_slots_failing`, the slots whose checks the failure policies decide now.
/// A node no longer serving slots (a failed master replaced) reads 0 slots.
pub fn redis_nodes(nodes: &[tollgate::NodeHealth]) {
    static SEEN: LazyLock<RwLock<HashSet<String>>> = LazyLock::new(RwLock::default);
    let mut seen = SEEN.write().unwrap_or_else(|e| e.into_inner());
    for gone in seen
        .iter()
        .filter(|a| !nodes.iter().any(|n| &n.address == *a))
    {
        gauge!("tollgate_redis_node_slots", "node" => gone.clone()).set(0.0);
    }
    let mut failing = 0;
    for node in nodes {
        // Bounded: the masters a cluster ever had, each named once.
        if seen.len() < MAX_DETAILED_LABELS {
            seen.insert(node.address.clone());
        }
        let up = if node.failing { 0.0 } else { 1.0 };
        gauge!("tollgate_redis_node_up", "node" => node.address.clone()).set(up);
        gauge!("tollgate_redis_node_slots", "node" => node.address.clone()).set(node.slots as f64);
        if node.failing {
            failing += node.slots;
        }
    }
    gauge!("tollgate_redis_slots_failing").set(failing as f64);
}

/// Records each peer region's health as this instance last heard it, and the buckets it
/// `dropped`.
pub fn regions(region: &str, peers: &[tollgate::PeerHealth], dropped: u64) {
    counter!("tollgate_region_dropped_total", "region" => region.to_string()).absolute(dropped);
    for peer in peers {
        let labels = [("region", region.to_string()), ("peer", peer.name.clone())];
        let up = if peer.failing { 0.0 } else { 1.0 };
        gauge!("tollgate_region_peer_up", &labels).set(up);
        let heard = peer.last_heard.map_or(-1.0, |d| d.as_secs_f64());
        gauge!("tollgate_region_peer_last_heard_seconds", &labels).set(heard);
        gauge!("tollgate_region_peer_lag_seconds", &labels).set(peer.lag.as_secs_f64());
        gauge!("tollgate_region_peer_pending", &labels).set(peer.pending as f64);
        counter!("tollgate_region_peer_failures_total", &labels).absolute(peer.failures);
    }
}

/// Counts `cost` permits admitted under global `rule` in `region`.
pub fn region_admitted(region: &str, rule: &str, cost: u64) {
    counter!("tollgate_region_admitted_total", "region" => region.to_string(), "rule" => rule.to_string())
        .increment(cost);
}

/// Counts `cost` permits reported under `rule`.
pub fn reported(rule: &str, cost: u64) {
    counter!("tollgate_reported_total", "rule" => rule.to_string()).increment(cost);
}

/// Counts `hits` given back by the negative descriptor whose statistics are `name`.
pub fn negative_hits(name: &str, hits: u64) {
    counter!("tollgate_envoy_negative_hits_total", "descriptor" => name.to_string())
        .increment(hits);
}

/// Counts a check answered denied from the cache of denials of `rule`.
pub fn denied_cache(rule: &str) {
    counter!("tollgate_denied_cache_total", "rule" => rule.to_string()).increment(1);
}

/// Counts a check decided by the `list` entry of `rule`'s key.
pub fn listed(list: &'static str, rule: &str) {
    counter!("tollgate_list_decisions_total", "list" => list, "rule" => rule.to_string())
        .increment(1);
}

/// Sets how many entries `list` holds.
pub fn list_entries(list: &'static str, count: usize) {
    gauge!("tollgate_list_entries", "list" => list).set(count as f64);
}

/// Counts a push of the xDS management server: `applied` or `rejected`.
pub fn xds_push(result: &'static str) {
    counter!("tollgate_xds_pushes_total", "result" => result).increment(1);
}

/// Whether the xDS subscription is up.
pub fn xds_connected(up: bool) {
    gauge!("tollgate_xds_connected").set(if up { 1.0 } else { 0.0 });
}

/// Counts a ban's `outcome` under `rule`.
pub fn ban(rule: &str, outcome: &'static str) {
    counter!("tollgate_bans_total", "rule" => rule.to_string(), "outcome" => outcome).increment(1);
}

/// Counts a permit's `event`.
pub fn permit(event: &'static str) {
    counter!("tollgate_permits_total", "event" => event).increment(1);
}

/// Counts a reservation's `event`.
pub fn reservation(event: &'static str) {
    counter!("tollgate_reservations_total", "event" => event).increment(1);
}
