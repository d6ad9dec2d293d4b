//! A million live keys: every algorithm on tollgate's memory store and governor's keyed limiter,
//! side by side, interleaved round by round. Criterion runs one row after another, and on a
//! shared machine a neighbour's burst of memory traffic lands on some rows and not others (the
//! same row moved 0.8-1.5x governor's between three runs); here every round runs each system
//! over every key twice, in a rotating order, timing the second pass (its table as warm in the
//! caches as a table of its size can be, as when it runs alone), and a row's ratio is taken to
//! governor's in the same round. With `--cold`, once: every table comes back to caches that the
//! other systems' passes filled, as a service's does between its requests' other work.
//!
//! Two ways of visiting the keys, in a scattered order: back to back, where a loop overlaps a
//! check's memory misses with the next check's; and dependent, where each key's index waits for
//! the decision before it, as a service's next check waits for the work around the last, so
//! every check pays its own misses in full. Every row holds a million live keys throughout
//! (asserted): a state as good as new at a key's next visit would make its row measure an
//! empty table.
//!
//! Run: `cargo bench -p tollgate --bench million_keys` (about 6 minutes; `-- --rounds N`,
//! default 10; `-- --cold`). Prints one Markdown table per way: each row's median nanoseconds
//! per check, and the median and range over the rounds of its ratio to `governor/keyed`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use governor::RateLimiter;
use tollgate::{Algorithm, Tier};

mod support;
use support::{KEYS, Key, algorithms, key, limiter, quota};

/// Coprime with `KEYS`: stepping by it visits every key in a cache-hostile order.
const STRIDE: usize = 611_953;

/// Runs one round over every key, each check waiting for the one before (`true`) or back to
/// back, and says how long it took.
type Round<'a> = Box<dyn Fn(&[Key], bool) -> Duration + 'a>;

/// The rounds of a system whose check of a key returns a number its decision depends on.
fn system<'a>(check: impl Fn(&Key) -> usize + 'a) -> Round<'a> {
    Box::new(move |keys, dependent| match dependent {
        true => round::<true>(keys, &check),
        false => round::<false>(keys, &check),
    })
}

/// Every key once, from a scattered start; `check` returns a number its decision depends on.
fn round<const DEPENDENT: bool>(keys: &[Key], mut check: impl FnMut(&Key) -> usize) -> Duration {
    // Zero, unknown to the compiler: `x & zero` makes the next index wait for `x`.
    let zero = black_box(0);
    let mut i = black_box(0);
    let start = Instant::now();
    for _ in 0..keys.len() {
        let x = check(&keys[i]);
        let wait = if DEPENDENT { x & zero } else { 0 };
        i = (i + STRIDE + wait) % keys.len();
        black_box(x);
    }
    start.elapsed()
}

fn main() {
    let rounds = std::env::args()
        .skip_while(|a| a != "--rounds")
        .nth(1)
        .map_or(10, |n| n.parse().expect("--rounds N"));
    let cold = std::env::args().any(|a| a == "--cold");
    let keys: Vec<Key> = (0..KEYS).map(key).collect();
    let mut names = Vec::new();
    let mut limiters = Vec::new();
    for (name, algorithm, tier) in algorithms() {
        // A log of a microsecond would be as good as new at each key's next check.
        let tier = match algorithm {
            Algorithm::SlidingLog => Tier::per_second(10),
            _ => tier,
        };
        let limiter = limiter(algorithm, tier);
        for k in &keys {
            assert!(limiter.check_now(k, 1).unwrap().allowed());
        }
        names.push(format!("tollgate/{name}"));
        limiters.push(limiter);
    }
    let governor = RateLimiter::keyed(quota());
    let foldhash =
        RateLimiter::dashmap_with_hasher(quota(), foldhash::fast::RandomState::default());
    for k in &keys {
        assert!(governor.check_key(k).is_ok() && foldhash.check_key(k).is_ok());
    }
    let mut systems: Vec<Round<'_>> = limiters
        .iter()
        .map(|l| system(move |k| l.check_now(k, 1).unwrap().remaining() as usize))
        .collect();
    names.push("governor/keyed".into());
    systems.push(system(|k| usize::from(governor.check_key(k).is_ok())));
    names.push("governor/keyed_foldhash".into());
    systems.push(system(|k| usize::from(foldhash.check_key(k).is_ok())));
    let baseline = names.iter().position(|n| n == "governor/keyed").unwrap();
    for (title, dependent) in [("million_keys", false), ("million_keys_dependent", true)] {
        // Nanoseconds per check, by system and round.
        let mut times = vec![Vec::new(); systems.len()];
        for r in 0..rounds {
            for s in (0..systems.len()).map(|s| (s + r) % systems.len()) {
                if !cold {
                    systems[s](&keys, dependent);
                }
                let took = systems[s](&keys, dependent);
                times[s].push(took.as_nanos() as f64 / keys.len() as f64);
            }
        }
        println!("| {title} | median | vs governor/keyed | ratio's range |");
        println!("| --- | ---: | ---: | ---: |");
        for (name, row) in names.iter().zip(&times) {
            let mut ratios: Vec<f64> = row
                .iter()
                .zip(&times[baseline])
                .map(|(t, g)| t / g)
                .collect();
            println!(
                "| {name} | {:.1} ns | {:.2} | {:.2}-{:.2} |",
                median(&mut row.clone()),
                median(&mut ratios),
                ratios[0],
                ratios[ratios.len() - 1],
            );
        }
        println!();
    }
    for (name, limiter) in names.iter().zip(&limiters) {
        assert_eq!(limiter.store().keys(), KEYS, "{name}: every key held");
    }
}

/// The median of `values`, which it sorts.
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
