//! `tollgate bench`: load on a running deployment, over HTTP (`POST /v1/check`) or Envoy's
//! gRPC rate limit service, and what it answered: how many checks were admitted, denied or
//! failed, at what rate, and with what latency.
//!
//! `{key}` in a path, header value, key or descriptor value becomes the request's number modulo
//! the number of keys, so that one run spreads over many tenants. Closed loop by default (each
//! connection sends its next check when the last is answered); with a target rate, checks are
//! due at fixed times and their latency counts from when they were due, so that a server that
//! falls behind is not flattered by the checks it delayed.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use hdrhistogram::Histogram;

/// The placeholder replaced by a request's key number.
const PLACEHOLDER: &str = "{key}";

/// The check endpoint of the server at base URL `server`.
pub fn check_url(server: &str) -> String {
    format!("{}/v1/check", with_scheme(server).trim_end_matches('/'))
}

/// `server` as a URL: a bare address (`127.0.0.1:8081`) is taken as `http://` one.
pub fn with_scheme(server: &str) -> String {
    if server.contains("://") {
        server.to_string()
    } else {
        format!("http://{server}")
    }
}

/// What to send.
#[derive(Debug, Clone)]
pub enum Target {
    /// `POST {server}/v1/check` with this JSON body (placeholders unreplaced).
    Http {
        /// The server's base URL.
        server: String,
        /// The body, serialized.
        body: String,
    },
    /// `ShouldRateLimit` in `domain` with one descriptor of these entries.
    Grpc {
        /// The gRPC endpoint's URL.
        server: String,
        /// The Envoy domain.
        domain: String,
        /// The descriptor's (key, value) entries.
        entries: Vec<(String, String)>,
        /// Permits per call (`hits_addend`).
        cost: u32,
    },
}

/// How much load, and how it is paced.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Checks in flight at once, each on its own connection.
    pub connections: usize,
    /// Stop after this many checks.
    pub requests: Option<u64>,
    /// Stop sending after this long.
    pub duration: Option<Duration>,
    /// Checks per second in all; `None`: as fast as the answers come.
    pub rate: Option<f64>,
    /// How many values `{key}` takes: 0 to `keys - 1`.
    pub keys: u64,
}

/// What a run saw.
#[derive(Debug, Clone)]
pub struct Report {
    /// Checks admitted (HTTP 200; gRPC `OK`).
    pub allowed: u64,
    /// Checks denied (HTTP 429; gRPC `OVER_LIMIT`).
    pub denied: u64,
    /// Checks that got neither: another status, or no answer.
    pub failed: u64,
    /// The first failure, as said.
    pub first_failure: Option<String>,
    /// From the first check sent to the last answer.
    pub elapsed: Duration,
    /// Latency of every answered check, in µs, to 3 significant digits: bounded in memory
    /// however long the run.
    pub latencies: Histogram<u64>,
}

impl Default for Report {
    fn default() -> Self {
        Self {
            allowed: 0,
            denied: 0,
            failed: 0,
            first_failure: None,
            elapsed: Duration::ZERO,
            // From 1 µs to an hour: `Histogram::new` would start at 2 µs and clamp, not grow,
            // on a saturating record.
            latencies: Histogram::new_with_bounds(1, LONGEST_LATENCY, 3)
                .expect("the bounds and 3 significant digits are valid"),
        }
    }
}

/// The longest latency a report tells apart (µs): an hour; longer ones count as an hour.
const LONGEST_LATENCY: u64 = 3_600_000_000;

impl Report {
    /// Records the latency of an answered check.
    fn record(&mut self, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.latencies.saturating_record(micros.max(1));
    }

    /// Checks sent.
    pub fn requests(&self) -> u64 {
        self.allowed + self.denied + self.failed
    }

    /// The `q` quantile (0 to 1) of the latencies.
    pub fn latency(&self, q: f64) -> Duration {
        Duration::from_micros(self.latencies.value_at_quantile(q))
    }

    /// The report as the command prints it.
    pub fn render(&self, target: &Target, load: &Load) -> String {
        let what = match target {
            Target::Http { server, .. } => check_url(server),
            Target::Grpc { server, domain, .. } => format!("{server} (gRPC, domain {domain})"),
        };
        let secs = self.elapsed.as_secs_f64();
        let rate = if secs > 0.0 {
            self.requests() as f64 / secs
        } else {
            0.0
        };
        let pacing = match load.rate {
            Some(r) => format!("{} connections, {r} per second due", load.connections),
            None => format!("{} connections", load.connections),
        };
        let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
        let mut out = format!(
            "target    {what}\nrequests  {} in {secs:.2} s: {rate:.0} per second ({pacing}, {} keys)\n\
             answers   allowed {}, denied {}, failed {}\n\
             latency   p50 {}, p90 {}, p99 {}, max {}\n",
            self.requests(),
            load.keys,
            self.allowed,
            self.denied,
            self.failed,
            ms(self.latency(0.5)),
            ms(self.latency(0.9)),
            ms(self.latency(0.99)),
            ms(self.latency(1.0)),
        );
        if let Some(failure) = &self.first_failure {
            out.push_str(&format!("first failure: {failure}\n"));
        }
        out
    }
}

/// The JSON body of a check: a request to match (`path` and `headers` of `name: value`), or a
/// rule and key.
///
/// # Errors
/// When neither is given, or a header has no `:`.
pub fn check_body(
    method: &str,
    path: Option<&str>,
    headers: &[String],
    rule: Option<&str>,
    key: Option<&str>,
    cost: u64,
) -> anyhow::Result<serde_json::Value> {
    Ok(match (rule, path) {
        (Some(rule), _) => serde_json::json!({ "rule": rule, "key": key, "cost": cost }),
        (None, Some(path)) => {
            let mut map = serde_json::Map::new();
            for h in headers {
                let (name, value) = h
                    .split_once(':')
                    .with_context(|| format!("header `{h}`: expected `name: value`"))?;
                map.insert(name.trim().to_string(), value.trim().into());
            }
            serde_json::json!({
                "request": { "method": method, "path": path, "headers": map },
                "cost": cost,
            })
        }
        (None, None) => bail!("give --path (a request) or --rule and --key"),
    })
}

/// Parses `key=value` descriptor entries.
///
/// # Errors
/// When there are none, or an entry has no `=` or an empty key.
pub fn entries(descriptor: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    if descriptor.is_empty() {
        bail!("give the descriptor's entries: --descriptor key=value");
    }
    descriptor
        .iter()
        .map(|e| match e.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => bail!("descriptor entry `{e}`: expected `key=value`"),
        })
        .collect()
}

/// Runs the load on `target` and reports what it answered.
///
/// # Errors
/// When the load is empty (no connections, no keys, neither a count nor a duration) or the
/// gRPC URL is malformed; failures of single checks are counted, not errors.
pub async fn run(target: Target, load: Load) -> anyhow::Result<Report> {
    if load.connections == 0 || load.keys == 0 {
        bail!("--connections and --keys must be at least 1");
    }
    if load.requests.is_none() && load.duration.is_none() {
        bail!("give --requests or --duration");
    }
    if load.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        bail!("--rate must be a positive number of checks per second");
    }
    if let Target::Grpc { server, .. } = &target {
        tonic::transport::Endpoint::from_shared(server.clone())
            .with_context(|| format!("`{server}` is not a gRPC URL"))?;
    }
    let target = Arc::new(target);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..load.connections)
        .map(|_| tokio::spawn(connection(target.clone(), load, next.clone(), start)))
        .collect();
    let mut report = Report::default();
    for task in tasks {
        let part = task.await.context("a connection's task failed")?;
        report.allowed += part.allowed;
        report.denied += part.denied;
        report.failed += part.failed;
        if report.first_failure.is_none() {
            report.first_failure = part.first_failure;
        }
        report.latencies.add(&part.latencies)?;
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

/// The answer to one check.
enum Answer {
    Allowed,
    Denied,
    Failed(String),
}

/// One connection's checks, one after another, while checks remain to be sent.
async fn connection(
    target: Arc<Target>,
    load: Load,
    next: Arc<AtomicU64>,
    start: Instant,
) -> Report {
    let mut report = Report::default();
    let mut client = Client::new(&target).await;
    let deadline = load.duration.map(|d| start + d);
    loop {
        let n = next.fetch_add(1, Ordering::Relaxed);
        if load.requests.is_some_and(|max| n >= max) {
            break;
        }
        // When the check is due: now in a closed loop, else its place in the schedule.
        let due = match load.rate {
            Some(rate) => start + Duration::from_secs_f64(n as f64 / rate),
            None => Instant::now(),
        };
        if deadline.is_some_and(|d| due >= d) {
            break;
        }
        // Latency counts from when the check is sent, or from when it was due if this
        // connection was still busy then: the timer's own lateness (up to a millisecond) is
        // not the server's, a queue behind a slow answer is.
        let sent = if Instant::now() < due {
            tokio::time::sleep_until(due.into()).await;
            Instant::now()
        } else {
            due
        };
        let answer = client.check(n % load.keys).await;
        let took = sent.elapsed();
        match answer {
            Answer::Allowed => report.allowed += 1,
            Answer::Denied => report.denied += 1,
            Answer::Failed(why) => {
                report.failed += 1;
                report.first_failure.get_or_insert(why);
                continue;
            }
        }
        report.record(took);
    }
    report
}

/// A connection to the target, with what it sends.
enum Client {
    Http {
        client: reqwest::Client,
        url: String,
        body: String,
    },
    Grpc {
        /// The connection, or why there is none.
        client: Result<RateLimitServiceClient<tonic::transport::Channel>, String>,
        domain: String,
        entries: Vec<(String, String)>,
        cost: u32,
    },
}

impl Client {
    async fn new(target: &Target) -> Self {
        match target {
            Target::Http { server, body } => Self::Http {
                // One connection per client: the load's connections are its clients.
                client: reqwest::Client::builder()
                    .pool_max_idle_per_host(1)
                    .tcp_nodelay(true)
                    .build()
                    .unwrap_or_default(),
                url: check_url(server),
                body: body.clone(),
            },
            Target::Grpc {
                server,
                domain,
                entries,
                cost,
            } => Self::Grpc {
                client: RateLimitServiceClient::connect(server.clone())
                    .await
                    .map_err(|e| format!("cannot reach {server}: {e}")),
                domain: domain.clone(),
                entries: entries.clone(),
                cost: *cost,
            },
        }
    }

    /// Sends the check of key number `n`.
    async fn check(&mut self, n: u64) -> Answer {
        let key = n.to_string();
        match self {
            Self::Http { client, url, body } => {
                let sent = client
                    .post(url.as_str())
                    .header("content-type", "application/json")
                    .body(body.replace(PLACEHOLDER, &key))
                    .send()
                    .await;
                let answer = match sent {
                    Ok(answer) => answer,
                    Err(e) => return Answer::Failed(format!("cannot reach {url}: {e}")),
                };
                let status = answer.status().as_u16();
                // Read to the end, so that the connection carries the next check.
                let text = answer.text().await.unwrap_or_default();
                match status {
                    200 => Answer::Allowed,
                    429 => Answer::Denied,
                    _ => Answer::Failed(format!("{status} {text}")),
                }
            }
            Self::Grpc {
                client,
                domain,
                entries,
                cost,
            } => {
                let client = match client {
                    Ok(client) => client,
                    Err(why) => return Answer::Failed(why.clone()),
                };
                let request = RateLimitRequest {
                    domain: domain.clone(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: entries
                            .iter()
                            .map(|(k, v)| Entry {
                                key: k.clone(),
                                value: v.replace(PLACEHOLDER, &key),
                            })
                            .collect(),
                        ..RateLimitDescriptor::default()
                    }],
                    hits_addend: *cost,
                };
                match client.should_rate_limit(request).await {
                    Ok(answer) => match Code::try_from(answer.get_ref().overall_code) {
                        Ok(Code::Ok) => Answer::Allowed,
                        Ok(Code::OverLimit) => Answer::Denied,
                        _ => Answer::Failed(format!(
                            "overall code {}",
                            answer.get_ref().overall_code
                        )),
                    },
                    Err(status) => {
                        Answer::Failed(format!("{:?}: {}", status.code(), status.message()))
                    }
                }
            }
        }
    }
}

/// Runs `tollgate bench`; exit code 0 when every check was answered (admitted or denied).
pub(super) async fn command(args: super::BenchArgs) -> anyhow::Result<ExitCode> {
    let target = match (args.grpc, args.domain) {
        (Some(server), Some(domain)) => Target::Grpc {
            server: with_scheme(&server),
            domain,
            entries: entries(&args.descriptor)?,
            cost: args.cost,
        },
        _ => Target::Http {
            server: args.server,
            body: args.ask.body(u64::from(args.cost))?.to_string(),
        },
    };
    let duration = args
        .duration
        .map(|d| crate::config::parse_duration(&d))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let load = Load {
        connections: args.connections,
        requests: args.requests.or(duration.is_none().then_some(10_000)),
        duration,
        rate: args.rate,
        keys: args.keys,
    };
    let report = run(target.clone(), load).await?;
    print!("{}", report.render(&target, &load));
    Ok(if report.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_of_any_size_are_recorded() {
        let mut report = Report::default();
        for micros in [40, 2_500, 19_000_000, 7_200_000_000] {
            report.record(Duration::from_micros(micros));
        }
        let near = |q: f64, micros: u64| {
            let got = report.latency(q).as_micros() as f64;
            assert!(
                (got / micros as f64 - 1.0).abs() < 0.001,
                "quantile {q}: {got} µs, not {micros}"
            );
        };
        near(0.25, 40);
        near(0.5, 2_500);
        near(0.75, 19_000_000);
        // Beyond an hour, an hour.
        near(1.0, LONGEST_LATENCY);
    }
}
