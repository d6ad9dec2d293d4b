//! A small load client for Envoy's rate limit service: `connections` gRPC connections, one
//! request in flight on each, for `seconds`, over `keys` client addresses in the domain
//! `bench`; prints `rate p50_us p99_us` of the answers.
//!
//! Run: `cargo run --release -p tollgate-server --example rls_load -- http://127.0.0.1:8081 64 5`

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = args
        .first()
        .cloned()
        .unwrap_or_else(|| "http://127.0.0.1:8081".into());
    let connections: usize = args.get(1).map_or(Ok(64), |a| a.parse())?;
    let seconds: u64 = args.get(2).map_or(Ok(5), |a| a.parse())?;
    let keys: u64 = args.get(3).map_or(Ok(10_000), |a| a.parse())?;
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..connections {
        let mut client = RateLimitServiceClient::connect(url.clone()).await?;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = c as u64;
            while Instant::now() < until {
                n = (n + 7_919) % keys;
                let request = RateLimitRequest {
                    domain: "bench".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "remote_address".into(),
                            value: format!("10.0.{}.{}", n / 256, n % 256),
                        }],
                        ..RateLimitDescriptor::default()
                    }],
                    hits_addend: 1,
                };
                let started = Instant::now();
                client.should_rate_limit(request).await.expect("an answer");
                latencies.push(started.elapsed().as_micros() as u64);
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await?);
    }
    all.sort_unstable();
    let at = |p: f64| all[((all.len() - 1) as f64 * p) as usize];
    println!(
        "{:.0} {} {}",
        all.len() as f64 / seconds as f64,
        at(0.5),
        at(0.99)
    );
    Ok(())
}
