//! A multi-tenant load test, for the three Redis modes side by side in one run: three
//! instances (each its own store and connection), 25 tenants, 1000 requests per second in all,
//! spread at random over tenants and instances, one rule of a fixed window of 10 s per tenant;
//! the hybrid store syncs once a second. It starts its own `redis-server`.
//!
//! Two limits: the source's (1000 per 10 s: 400 offered, nothing denied) and a binding one
//! (300 per 10 s). For each mode: Redis calls per 1000 decisions (FCALLs counted by the
//! server), the latency a check adds (p50, p95, p99), and admissions against the ideal (per
//! tenant and window, the smaller of what was offered and the limit), with the worst window's
//! overshoot.
//!
//! Run: `cargo bench -p tollgate --features redis --bench modes` (about 2 minutes; `-- --seconds
//! N` per run, default 20, from the start of a window; `--modes strict,hybrid,lease`).

mod redis_server;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tollgate::{
    Algorithm, HybridConfig, HybridStore, LeaseConfig, LeaseStore, Limiter, RedisStore, Rule,
    Store, Tier,
};

use redis_server::{cli, start_redis};

const INSTANCES: usize = 3;
const TENANTS: usize = 25;
const RATE: u64 = 1_000;
const WINDOW: Duration = Duration::from_secs(10);

/// Function calls the server ran so far (every FCALL is one round trip of tollgate's).
fn fcalls(port: u16) -> u64 {
    let stats = cli(port, &["info", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// One request: which tenant, and what was decided.
struct Outcome {
    /// The window decided in (its start over its length), as the store's clock had it.
    window: u64,
    tenant: usize,
    allowed: bool,
    micros: f64,
}

/// Drives `RATE` checks per second for `seconds` over `limiters` (one per instance), from the
/// start of a window.
async fn drive<S: Store>(limiters: Vec<Limiter<S>>, seconds: u64) -> Vec<Outcome> {
    let window = WINDOW.as_micros() as u64;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    tokio::time::sleep(Duration::from_micros(window - now % window)).await;
    let limiters = Arc::new(limiters);
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut random = 0x9e37_79b9_7f4a_7c15_u64;
    let mut tasks = Vec::new();
    for _ in 0..RATE * seconds {
        tick.tick().await;
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        let (tenant, instance) = (
            (random % TENANTS as u64) as usize,
            (random >> 32) as usize % INSTANCES,
        );
        let (limiters, outcomes) = (limiters.clone(), outcomes.clone());
        tasks.push(tokio::spawn(async move {
            let at = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_micros() as u64;
            let started = Instant::now();
            let decision = limiters[instance]
                .check(format!("org-{tenant}"), 1)
                .await
                .unwrap();
            let micros = started.elapsed().as_secs_f64() * 1e6;
            // The window ends `reset_after` after the decision, on the store's clock.
            let end = at + decision.reset_after().as_micros() as u64;
            let length = WINDOW.as_micros() as u64;
            outcomes.lock().unwrap().push(Outcome {
                window: (end + length / 2) / length - 1,
                tenant,
                allowed: decision.allowed(),
                micros,
            });
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    for limiter in limiters.iter() {
        limiter.shutdown().await;
    }
    Arc::try_unwrap(outcomes)
        .ok()
        .unwrap()
        .into_inner()
        .unwrap()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// One row: mode, calls per 1000 decisions, latency, admitted against the ideal.
fn report(mode: &str, limit: u64, outcomes: &[Outcome], calls: u64) {
    let mut micros: Vec<f64> = outcomes.iter().map(|o| o.micros).collect();
    micros.sort_by(f64::total_cmp);
    let mut per_window: HashMap<(usize, u64), (u64, u64)> = HashMap::new();
    for o in outcomes {
        let entry = per_window.entry((o.tenant, o.window)).or_default();
        entry.0 += 1;
        entry.1 += u64::from(o.allowed);
    }
    let ideal: u64 = per_window
        .values()
        .map(|&(offered, _)| offered.min(limit))
        .sum();
    let admitted: u64 = per_window.values().map(|&(_, admitted)| admitted).sum();
    let worst = per_window
        .values()
        .map(|&(_, admitted)| admitted as i64 - limit as i64)
        .max()
        .unwrap_or(0);
    println!(
        "| {limit} per 10 s | {mode} | {} | {:.1} | {:.1} µs | {:.1} µs | {:.1} µs | {admitted} / {ideal} ({:+.2}%) | {:+} |",
        outcomes.len(),
        1_000.0 * calls as f64 / outcomes.len() as f64,
        percentile(&micros, 0.50),
        percentile(&micros, 0.95),
        percentile(&micros, 0.99),
        100.0 * (admitted as f64 - ideal as f64) / ideal as f64,
        worst.max(0),
    );
}

fn argument(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds: u64 = argument("--seconds", "20").parse().unwrap();
    let modes = argument("--modes", "strict,hybrid,lease");
    let runs = |mode: &str| modes.split(',').any(|m| m == mode);
    let server = start_redis();
    let url = format!("redis://127.0.0.1:{}", server.port);
    println!(
        "| limit | mode | decisions | Redis calls per 1000 decisions | p50 added | p95 added | p99 added | admitted / ideal | worst window over the limit |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for limit in [1_000, 300] {
        let rule = |mode: &str| {
            let name = format!("get-product-{mode}-{limit}");
            Rule::new(name, Algorithm::FixedWindow, [Tier::new(limit, WINDOW)]).unwrap()
        };
        let redis = async || {
            RedisStore::builder(&url)
                .timeout(Duration::from_millis(100))
                .build()
                .await
                .unwrap()
        };
        let build = |store, mode| Limiter::builder(rule(mode)).store(store).build().unwrap();

        if runs("strict") {
            let before = fcalls(server.port);
            let mut strict = Vec::new();
            for _ in 0..INSTANCES {
                strict.push(build(redis().await, "strict"));
            }
            let outcomes = drive::<RedisStore>(strict, seconds).await;
            report("strict", limit, &outcomes, fcalls(server.port) - before);
        }
        if runs("hybrid") {
            let before = fcalls(server.port);
            // The default settings: each instance learns how many run from Redis.
            let config = HybridConfig::default();
            let mut hybrid = Vec::new();
            for _ in 0..INSTANCES {
                let store = HybridStore::new(&redis().await, config).unwrap();
                hybrid.push(
                    Limiter::builder(rule("hybrid"))
                        .store(store)
                        .build()
                        .unwrap(),
                );
            }
            let outcomes = drive::<HybridStore>(hybrid, seconds).await;
            report("hybrid", limit, &outcomes, fcalls(server.port) - before);
        }
        if runs("lease") {
            let before = fcalls(server.port);
            let config = LeaseConfig {
                instances: INSTANCES as u32,
                ..LeaseConfig::default()
            };
            let mut lease = Vec::new();
            for _ in 0..INSTANCES {
                let store = LeaseStore::new(&redis().await, config).unwrap();
                lease.push(
                    Limiter::builder(rule("lease"))
                        .store(store)
                        .build()
                        .unwrap(),
                );
            }
            let outcomes = drive::<LeaseStore>(lease, seconds).await;
            report("lease", limit, &outcomes, fcalls(server.port) - before);
        }
    }
}
