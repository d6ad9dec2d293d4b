//! A small load client for Envoy's rate limit service: `connections` HTTP/2 connections,
//! `streams` `ShouldRateLimit` calls in flight on each (1 unless given; Envoy sends many over
//! one connection), for `seconds`, over `keys` client addresses in the domain `bench`, each
//! stream waiting after an answer before its next call a time drawn evenly from 0 to twice
//! `pause_ms` (0: at once; drawn, so that the streams do not fall into step and arrive in
//! bursts); prints `rate p50_us p99_us` of the answers, and fails on any answer that is not
//! gRPC OK.
//!
//! It speaks gRPC on the `h2` crate with every request encoded when it starts, as wrk renders
//! its requests once: a call then costs this client little more than its frames, and the
//! core it shares with Redis in the benchmark is left to Redis (tonic's client spent 24-31 µs
//! of CPU per call).
//!
//! Run: `cargo run --release -p tollgate-server --example rls_load -- http://127.0.0.1:8081 64 5 10000 0 1`

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use h2::client::SendRequest;
use prost::Message as _;
use tokio::net::TcpStream;

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The gRPC message of a call for key `n`: a one-byte flag (not compressed), the length, the
/// request.
fn body(n: u64) -> Bytes {
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
    let encoded = request.encode_to_vec();
    let mut framed = Vec::with_capacity(5 + encoded.len());
    framed.push(0);
    framed.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
    framed.extend_from_slice(&encoded);
    Bytes::from(framed)
}

/// An HTTP/2 connection to `authority`, driven by a task of its own.
async fn connect(authority: &str) -> anyhow::Result<SendRequest<Bytes>> {
    let tcp = TcpStream::connect(authority).await?;
    tcp.set_nodelay(true)?;
    let (client, connection) = h2::client::handshake(tcp).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// One stream's calls until `until`, one after another: the latency of each, in µs.
async fn calls(
    client: SendRequest<Bytes>,
    authority: String,
    bodies: Arc<[Bytes]>,
    first: usize,
    until: Instant,
    pause: Duration,
) -> anyhow::Result<Vec<u64>> {
    let head = http::Request::post(format!("http://{authority}{PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())?;
    let mut latencies = Vec::new();
    let mut n = first;
    let mut client = client.ready().await?;
    // xorshift64, seeded per stream: the pauses.
    let mut seed = (first as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let pause_us = pause.as_micros() as u64;
    while Instant::now() < until {
        n = (n + 7_919) % bodies.len();
        let started = Instant::now();
        let (answer, mut request) = client.send_request(head.clone(), false)?;
        request.send_data(bodies[n].clone(), true)?;
        let mut answer = answer.await?.into_body();
        while let Some(data) = answer.data().await {
            let data = data?;
            answer.flow_control().release_capacity(data.len())?;
        }
        let trailers = answer
            .trailers()
            .await?
            .context("an answer without trailers")?;
        let status = trailers.get("grpc-status").map(|s| s.as_bytes());
        if status != Some(b"0") {
            bail!("an answer that is not OK: {trailers:?}");
        }
        latencies.push(started.elapsed().as_micros() as u64);
        if pause_us > 0 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let wait = seed % (2 * pause_us + 1);
            tokio::time::sleep(Duration::from_micros(wait)).await;
        }
        client = client.ready().await?;
    }
    Ok(latencies)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = args.first().map_or("http://127.0.0.1:8081", String::as_str);
    let connections: usize = args.get(1).map_or(Ok(64), |a| a.parse())?;
    let seconds: u64 = args.get(2).map_or(Ok(5), |a| a.parse())?;
    let keys: u64 = args.get(3).map_or(Ok(10_000), |a| a.parse())?;
    let pause = Duration::from_millis(args.get(4).map_or(Ok(0), |a| a.parse())?);
    let streams: usize = args.get(5).map_or(Ok(1), |a| a.parse())?;
    let authority = url
        .strip_prefix("http://")
        .context("an http:// URL")?
        .trim_end_matches('/')
        .to_string();
    let bodies: Arc<[Bytes]> = (0..keys).map(body).collect();
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..connections {
        let client = connect(&authority).await?;
        for s in 0..streams {
            let first = c * streams + s;
            let task = calls(
                client.clone(),
                authority.clone(),
                Arc::clone(&bodies),
                first,
                until,
                pause,
            );
            tasks.push(tokio::spawn(task));
        }
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await??);
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
