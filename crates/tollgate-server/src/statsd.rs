//! The Envoy ratelimit service's statistics as it names them for statsd
//! (`ratelimit.service.rate_limit.DOMAIN.KEY.total_hits`, `ratelimit.service.config_load_success`,
//! ...), kept in atomics that the debug listener's `/stats` reads and that a sink pushes to
//! statsd (`USE_STATSD`, over TCP, as the Envoy service's statsd sink writes) or DogStatsD
//! (`USE_DOG_STATSD`, over UDP) every flush interval, as counters' increases since the last
//! push.
//!
//! The names registered are bounded as the Prometheus series are: the configured limits, and
//! at most [`crate::metrics::MAX_DETAILED_LABELS`] per-value names.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, RwLock};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::config::Statsd;

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

/// The increases since the last call, as (name, increase), those of zero left out.
fn increases() -> Vec<(String, u64)> {
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

/// The lines of one push: `name:increase|c`, with the sink's tags as the Envoy service's
/// sinks write them (statsd: in the name, `.__key=value`, keys sorted; DogStatsD:
/// `|#key:value`).
fn lines(sink: &Statsd, increases: &[(String, u64)]) -> Vec<String> {
    let clean = |s: &str| s.replace(['.', ':', '|'], "_");
    let mut tags = sink.tags.clone();
    tags.sort();
    let in_name: String = if sink.dog {
        String::new()
    } else {
        tags.iter()
            .map(|(k, v)| format!(".__{}={}", clean(k), clean(v)))
            .collect()
    };
    let dog_tags = if sink.dog && !tags.is_empty() {
        let list: Vec<String> = tags
            .iter()
            .map(|(k, v)| format!("{}:{}", clean(k), clean(v)))
            .collect();
        format!("|#{}", list.join(","))
    } else {
        String::new()
    };
    increases
        .iter()
        .map(|(name, n)| format!("{name}{in_name}:{n}|c{dog_tags}\n"))
        .collect()
}

/// Pushes the statistics' increases to `sink` every flush interval, for ever. A sink that
/// cannot be reached is logged the first time in a row, and its increases are kept for the
/// next push (TCP) or dropped (UDP, as datagrams are).
pub async fn push(sink: Statsd) {
    let address = format!("{}:{}", sink.host, sink.port);
    tracing::info!(%address, dog = sink.dog, flush = ?sink.flush, "pushing statistics to statsd");
    let mut every = tokio::time::interval(sink.flush);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tcp: Option<tokio::net::TcpStream> = None;
    let mut failing = false;
    let mut held: Vec<String> = Vec::new();
    loop {
        every.tick().await;
        held.extend(lines(&sink, &increases()));
        if held.is_empty() {
            continue;
        }
        let sent = if sink.dog {
            send_udp(&address, &held).await
        } else {
            send_tcp(&address, &mut tcp, &held).await
        };
        match sent {
            Ok(()) => {
                held.clear();
                if failing {
                    tracing::info!(%address, "statsd reached again");
                }
                failing = false;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(%address, error = %e, "cannot push statistics to statsd");
                }
                failing = true;
                tcp = None;
                if sink.dog {
                    held.clear();
                }
                // Bounded: a sink down for long keeps the newest lines only.
                if held.len() > 100_000 {
                    held.drain(..held.len() - 100_000);
                }
            }
        }
    }
}

async fn send_tcp(
    address: &str,
    stream: &mut Option<tokio::net::TcpStream>,
    lines: &[String],
) -> std::io::Result<()> {
    if stream.is_none() {
        let connect = tokio::net::TcpStream::connect(address);
        let connected = tokio::time::timeout(Duration::from_secs(2), connect)
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        connected.set_nodelay(true)?;
        *stream = Some(connected);
    }
    let Some(stream) = stream.as_mut() else {
        return Ok(());
    };
    let text = lines.concat();
    tokio::time::timeout(Duration::from_secs(2), stream.write_all(text.as_bytes()))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
}

/// Sends `lines` in datagrams of at most 1,432 bytes (one Ethernet frame), whole lines each.
async fn send_udp(address: &str, lines: &[String]) -> std::io::Result<()> {
    let socket = tokio::net::UdpSocket::bind(if address.starts_with('[') {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    })
    .await?;
    socket.connect(address).await?;
    let mut datagram = String::new();
    for line in lines {
        if !datagram.is_empty() && datagram.len() + line.len() > 1_432 {
            socket.send(datagram.as_bytes()).await?;
            datagram.clear();
        }
        datagram.push_str(line);
    }
    if !datagram.is_empty() {
        socket.send(datagram.as_bytes()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(dog: bool) -> Statsd {
        Statsd {
            host: "localhost".into(),
            port: 8125,
            dog,
            flush: Duration::from_secs(10),
            tags: vec![
                ("zone".into(), "eu.1".into()),
                ("app".into(), "shop".into()),
            ],
        }
    }

    #[test]
    fn tags_are_written_as_each_sink_writes_them() {
        let increases = [(
            "ratelimit.service.rate_limit.shop.cart.total_hits".into(),
            3,
        )];
        assert_eq!(
            lines(&sink(false), &increases),
            ["ratelimit.service.rate_limit.shop.cart.total_hits.__app=shop.__zone=eu_1:3|c\n"]
        );
        assert_eq!(
            lines(&sink(true), &increases),
            ["ratelimit.service.rate_limit.shop.cart.total_hits:3|c|#app:shop,zone:eu_1\n"]
        );
    }

    #[test]
    fn a_push_sends_what_grew_since_the_last() {
        let counters = counters("unit_test_domain.key");
        counters.add(Stat::TotalHits, 5);
        counters.add(Stat::OverLimit, 2);
        let first = increases();
        assert!(first.contains(&(
            "ratelimit.service.rate_limit.unit_test_domain.key.total_hits".into(),
            5
        )));
        counters.add(Stat::TotalHits, 1);
        let second: Vec<_> = increases()
            .into_iter()
            .filter(|(n, _)| n.contains("unit_test_domain"))
            .collect();
        assert_eq!(
            second,
            [(
                "ratelimit.service.rate_limit.unit_test_domain.key.total_hits".into(),
                1
            )]
        );
    }
}
