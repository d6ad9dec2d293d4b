//! The Envoy ratelimit service's statistics as it names them for statsd
//! (`ratelimit.service.rate_limit.DOMAIN.KEY.total_hits`, `ratelimit.service.config_load_success`,
//! ...), kept in atomics that the debug listener's `/stats` reads and that a statsd sink
//! (`crate::envoy::statsd`) pushes.
//!
//! The names registered are bounded as the Prometheus series are: the configured limits, and
//! at most [`MAX_DETAILED_LABELS`](super::MAX_DETAILED_LABELS) per-value names.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, RwLock};

/// The counters of one Envoy limit, in the order of [`STATS`].
#[derive(Debug, Default)]
pub struct Counters {
    counts: [AtomicU64; STATS.len()],
    /// What the sink pushed last, per counter.
    pushed: [AtomicU64; STATS.len()],
}

/// The statistics of a limit, by their last name part.
pub const STATS: [&str; 6] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
    "over_limit_with_local_cache",
];

/// One of [`STATS`].
#[derive(Debug, Clone, Copy)]
pub enum Stat {
    /// Every hit.
    TotalHits = 0,
    /// Hits over the limit.
    OverLimit = 1,
    /// Hits within the limit past the near-limit ratio.
    NearLimit = 2,
    /// Hits within the limit.
    WithinLimit = 3,
    /// Hits over a limit in shadow mode.
    ShadowMode = 4,
    /// Hits over the limit answered from the local cache, without the store.
    OverLimitWithLocalCache = 5,
}

impl Counters {
    /// Adds `n` to `stat`.
    pub fn add(&self, stat: Stat, n: u64) {
        self.counts[stat as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// The count of `stat` so far.
    pub fn get(&self, stat: Stat) -> u64 {
        self.counts[stat as usize].load(Ordering::Relaxed)
    }
}

/// The service's own statistics, in the Envoy service's names.
#[derive(Debug, Clone, Copy)]
pub enum Service {
    /// `ratelimit.service.config_load_success`.
    ConfigLoadSuccess,
    /// `ratelimit.service.config_load_error`.
    ConfigLoadError,
    /// `ratelimit.service.call.should_rate_limit.redis_error`: a check Redis did not answer.
    RedisError,
    /// `ratelimit.service.call.should_rate_limit.service_error`: a request refused as bad.
    ServiceError,
    /// `ratelimit_server.ShouldRateLimit.total_requests`.
    TotalRequests,
}

const SERVICE: [&str; 5] = [
    "ratelimit.service.config_load_success",
    "ratelimit.service.config_load_error",
    "ratelimit.service.call.should_rate_limit.redis_error",
    "ratelimit.service.call.should_rate_limit.service_error",
    "ratelimit_server.ShouldRateLimit.total_requests",
];

static SERVICE_COUNTS: [AtomicU64; SERVICE.len()] = [const { AtomicU64::new(0) }; SERVICE.len()];
static SERVICE_PUSHED: [AtomicU64; SERVICE.len()] = [const { AtomicU64::new(0) }; SERVICE.len()];

/// Adds one to the service's statistic `stat`.
pub fn count(stat: Service) {
    SERVICE_COUNTS[stat as usize].fetch_add(1, Ordering::Relaxed);
}

/// Each limit's counters by its statsd name (`ratelimit.service.rate_limit.DOMAIN.KEY`); a
/// limit keeps its counters across reloads.
static LIMITS: LazyLock<RwLock<BTreeMap<String, Arc<Counters>>>> = LazyLock::new(RwLock::default);

/// The counters of the limit whose statistics are named `sanitized` (`domain.key1.key2`, as
/// the Envoy service sanitizes names), registered the first time.
pub fn counters(sanitized: &str) -> Arc<Counters> {
    let name = format!("ratelimit.service.rate_limit.{sanitized}");
    if let Some(found) = LIMITS.read().unwrap_or_else(|e| e.into_inner()).get(&name) {
        return found.clone();
    }
    LIMITS
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .entry(name)
        .or_default()
        .clone()
}

/// Every statistic and its count so far, by its statsd name, in name order: what the debug
/// listener's `/stats` shows.
pub fn snapshot() -> Vec<(String, u64)> {
    let mut all: Vec<(String, u64)> = SERVICE
        .iter()
        .zip(&SERVICE_COUNTS)
        .map(|(name, count)| (name.to_string(), count.load(Ordering::Relaxed)))
        .collect();
    for (name, counters) in LIMITS.read().unwrap_or_else(|e| e.into_inner()).iter() {
        for (stat, count) in STATS.iter().zip(&counters.counts) {
            all.push((format!("{name}.{stat}"), count.load(Ordering::Relaxed)));
        }
    }
    all.sort();
    all
}

/// The increases since the last call, as (name, increase), those of zero left out: what a
/// statsd sink pushes.
pub fn increases() -> Vec<(String, u64)> {
    let take = |count: &AtomicU64, pushed: &AtomicU64| {
        let now = count.load(Ordering::Relaxed);
        now - pushed.swap(now, Ordering::Relaxed)
    };
    let mut out = Vec::new();
    for ((name, count), pushed) in SERVICE.iter().zip(&SERVICE_COUNTS).zip(&SERVICE_PUSHED) {
        let n = take(count, pushed);
        if n > 0 {
            out.push((name.to_string(), n));
        }
    }
    for (name, counters) in LIMITS.read().unwrap_or_else(|e| e.into_inner()).iter() {
        for (i, stat) in STATS.iter().enumerate() {
            let n = take(&counters.counts[i], &counters.pushed[i]);
            if n > 0 {
                out.push((format!("{name}.{stat}"), n));
            }
        }
    }
    out
}
