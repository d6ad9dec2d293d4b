//! A tour of the algorithms: uniform traffic, bursts and a spike at a window's edge, run through every
//! algorithm at 100 permits per minute on a manual clock, with what each one admits.
//!
//! Run: `cargo run --release -p tollgate --example tour`

use std::time::Duration;

use tollgate::{
    Algorithm, Clock, LeakyBucket, Limiter, ManualClock, Rule, SubWindows, Tier, TokenBucket,
    WarmUp,
};

const LIMIT: u64 = 100;
const MINUTE: u64 = 60_000_000;

/// Arrival times (µs from the start) of one traffic pattern.
struct Pattern {
    name: &'static str,
    arrivals: Vec<u64>,
}

fn patterns() -> Vec<Pattern> {
    let every = |from: u64, to: u64, gap: u64| (from..to).step_by(gap as usize);
    vec![
        Pattern {
            name: "edge spike: 150 at 0:59.9 and 150 at 1:00.0",
            arrivals: [59_900_000; 150].into_iter().chain([MINUTE; 150]).collect(),
        },
        Pattern {
            name: "uniform, 3x the rate for 3 minutes",
            arrivals: every(0, 3 * MINUTE, 200_000).collect(),
        },
        Pattern {
            name: "burst of 300 at 0:00, then idle",
            arrivals: vec![0; 300],
        },
        Pattern {
            name: "ramp: the rate rises steadily from 0 to 8x over 3 minutes",
            arrivals: (1..=1_200u64)
                .map(|i| (3.0 * MINUTE as f64 * (i as f64 / 1_200.0).sqrt()) as u64)
                .collect(),
        },
    ]
}

fn algorithms() -> Vec<(&'static str, Algorithm, Tier)> {
    let tier = Tier::per_minute(LIMIT);
    vec![
        ("fixed window", Algorithm::FixedWindow, tier.clone()),
        (
            "sliding window counter",
            Algorithm::SlidingWindow,
            tier.clone(),
        ),
        (
            "6 sub-windows",
            Algorithm::SubWindows(SubWindows { count: 6 }),
            tier.clone(),
        ),
        ("sliding log", Algorithm::SlidingLog, tier.clone()),
        (
            "token bucket",
            Algorithm::TokenBucket(TokenBucket::default()),
            tier.clone(),
        ),
        ("interval bucket", Algorithm::IntervalBucket, tier.clone()),
        (
            "leaky bucket meter",
            Algorithm::LeakyBucket(LeakyBucket::Meter),
            tier.clone(),
        ),
        (
            "leaky bucket shaper",
            Algorithm::LeakyBucket(LeakyBucket::Shaper),
            tier.clone().with_burst(20),
        ),
        ("GCRA", Algorithm::Gcra, tier.clone()),
        (
            "warm-up (30 s)",
            Algorithm::WarmUp(WarmUp::new(Duration::from_secs(30))),
            tier,
        ),
    ]
}

/// Admitted arrivals, shifted by the delay a shaper asks for.
fn run(algorithm: Algorithm, tier: Tier, arrivals: &[u64]) -> Vec<u64> {
    let rule = Rule::new("tour", algorithm, [tier]).expect("valid rule");
    let clock = ManualClock::new();
    let start = clock.now_micros();
    let limiter = Limiter::builder(rule)
        .clock(clock.clone())
        .build()
        .expect("a memory store holds every rule");
    let mut admitted = Vec::new();
    for &at in arrivals {
        clock.set_micros(start + at);
        let decision = limiter.check_now("client", 1).expect("valid check");
        if decision.allowed() {
            admitted.push(at + decision.delay().as_micros() as u64);
        }
    }
    admitted.sort_unstable();
    admitted
}

/// The most permits that proceeded within any window of one minute.
fn busiest_minute(times: &[u64]) -> usize {
    let mut first = 0;
    let mut most = 0;
    for (last, &t) in times.iter().enumerate() {
        while times[first] + MINUTE <= t {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}

fn main() {
    println!("Every algorithm at {LIMIT} per minute; the last column is the most that proceeded");
    println!("within any window of one minute (a limit that holds exactly never exceeds {LIMIT}).");
    for pattern in patterns() {
        println!("\n{} ({} requests)", pattern.name, pattern.arrivals.len());
        println!(
            "  {:<24} {:>9} {:>15}",
            "algorithm", "admitted", "busiest minute"
        );
        for (name, algorithm, tier) in algorithms() {
            let admitted = run(algorithm, tier, &pattern.arrivals);
            println!(
                "  {name:<24} {:>9} {:>15}",
                admitted.len(),
                busiest_minute(&admitted)
            );
        }
    }
}
