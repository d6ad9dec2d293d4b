//! One shard of what the console keeps. Each thread that answers checks writes to one shard
//! (a thread picks its shard once, in turn), so on the hot path two cores do not wait for
//! each other's lock or pass a cache line back and forth: a check takes its shard's lock
//! once to keep its request and once for its decisions, and readers add the shards up.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tollgate::Decision;

use super::recorder::Recorder;
use super::series::{self, Outcome, Series};
use super::top::HotKeys;

/// A shard, on a cache line of its own.
#[derive(Debug)]
#[repr(align(128))]
pub struct Shard(Mutex<State>);

/// What a shard holds.
#[derive(Debug)]
pub struct State {
    /// Per rule (by the address of its interned name), what its decisions here left.
    pub rules: HashMap<usize, Kept, foldhash::fast::RandomState>,
    /// The latency of the checks here.
    pub latency: Latency,
    /// The requests checked here, for the preview.
    pub recorder: Recorder,
}

impl Shard {
    /// A shard whose recorder keeps at most `record_bytes`.
    pub fn new(record_bytes: usize) -> Self {
        Self(Mutex::new(State {
            rules: HashMap::default(),
            latency: Latency::default(),
            recorder: Recorder::new(record_bytes),
        }))
    }

    /// The shard, locked.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    /// Counts one decision of a check of `key` at `second` (since the epoch).
    pub fn decided(&mut self, second: u64, key: &[u8], decision: &Decision) {
        let outcome = match (decision.allowed(), decision.shadowed()) {
            (true, true) => Outcome::Shadow,
            (true, false) => Outcome::Allowed {
                near: decision.remaining() * 5 < decision.limit(),
            },
            (false, _) => Outcome::Denied,
        };
        let limit = decision.limit().max(1);
        let used = limit.saturating_sub(decision.remaining());
        let name = decision.rule();
        let kept = self
            .rules
            .entry(name.as_ptr() as usize)
            .or_insert_with(|| Kept::new(name));
        kept.series.add(second, outcome);
        let hits = kept.hit_samples.weight(second);
        let denials = if decision.allowed() {
            0
        } else {
            kept.denial_samples.weight(second)
        };
        if hits + denials > 0 {
            kept.hot.add(second, key, hits, denials);
        }
        kept.busy(second, (used * 1_000 / limit) as u32);
    }
}

/// What a rule's decisions left in a shard.
#[derive(Debug)]
pub struct Kept {
    /// The rule's name.
    pub name: &'static str,
    /// Its decisions over time.
    pub series: Series,
    /// Its hottest keys now.
    pub hot: HotKeys,
    /// Which of its checks and denials count in `hot`.
    hit_samples: Sampling,
    denial_samples: Sampling,
    /// The largest share of a limit in use seen in each of the last 10 seconds: (second,
    /// thousandths), at the second's slot.
    busiest: [(u64, u32); 10],
}

impl Kept {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            series: Series::default(),
            hot: HotKeys::default(),
            hit_samples: Sampling::new(name.as_ptr() as u64),
            denial_samples: Sampling::new(!(name.as_ptr() as u64)),
            busiest: [(u64::MAX, 0); 10],
        }
    }

    fn busy(&mut self, second: u64, share: u32) {
        let (at, most) = &mut self.busiest[(second % 10) as usize];
        if *at == second {
            *most = (*most).max(share);
        } else {
            *at = second;
            *most = share;
        }
    }

    /// The largest share of a limit in use by any key in the 10 s up to `second` (0 to 1).
    pub fn in_use(&self, second: u64) -> f64 {
        self.busiest
            .iter()
            .filter(|(s, _)| *s != u64::MAX && *s <= second && s + 10 > second)
            .map(|(_, share)| *share)
            .max()
            .map_or(0.0, |share| f64::from(share) / 1_000.0)
    }
}

/// Which events of a rule in a shard count in its hottest keys: every one while the rule
/// had up to [`EXACT_PER_SECOND`] of them in the second before; past that, one in `w`
/// drawn at random (`w` the power of two that brings the sampled rate back under it), each
/// counting `w`. Under heavy traffic the summaries then cost a fraction of a lookup per
/// check, and a key's count is an estimate: a key with a share `p` of `n` events is sampled
/// about `p n / w` times, within a few times `sqrt(p n w)` of `p n`.
#[derive(Debug)]
struct Sampling {
    /// The second counted, and its events so far.
    second: u64,
    events: u64,
    /// What a sample counts now (1: every event counts).
    weight: u64,
    /// A xorshift generator's state (never 0).
    random: u64,
}

/// Events per second of a rule in a shard counted one by one.
pub const EXACT_PER_SECOND: u64 = 4_096;

impl Sampling {
    fn new(seed: u64) -> Self {
        Self {
            second: 0,
            events: 0,
            weight: 1,
            random: seed | 1,
        }
    }

    /// What this event, at `second`, counts: its weight if sampled, else 0.
    fn weight(&mut self, second: u64) -> u64 {
        if second != self.second {
            let rate = if second == self.second + 1 {
                self.events
            } else {
                0
            };
            self.weight = (rate / EXACT_PER_SECOND + 1).next_power_of_two();
            self.second = second;
            self.events = 0;
        }
        self.events += 1;
        if self.weight == 1 {
            return 1;
        }
        self.random ^= self.random << 13;
        self.random ^= self.random >> 7;
        self.random ^= self.random << 17;
        if self.random & (self.weight - 1) == 0 {
            self.weight
        } else {
            0
        }
    }
}

/// Check latencies per second for the last two minutes: a histogram per second of 4 buckets
/// per power of two of microseconds (each bucket a quarter of its octave wide).
#[derive(Debug)]
pub struct Latency {
    seconds: Vec<(u64, [u32; BUCKETS])>,
}

const BUCKETS: usize = 4 * 34;

impl Default for Latency {
    fn default() -> Self {
        Self {
            seconds: vec![(u64::MAX, [0; BUCKETS]); series::SECONDS as usize],
        }
    }
}

impl Latency {
    fn bucket(micros: u64) -> usize {
        if micros < 4 {
            return micros as usize;
        }
        let octave = 63 - micros.leading_zeros() as usize;
        let quarter = ((micros >> (octave - 2)) & 3) as usize;
        (4 * (octave - 1) + quarter).min(BUCKETS - 1)
    }

    /// The largest latency bucket `b` holds (µs).
    fn upper(b: usize) -> u64 {
        if b < 4 {
            return b as u64;
        }
        let octave = b / 4 + 1;
        let quarter = (b % 4) as u64;
        (1u64 << octave) + ((quarter + 1) << (octave - 2)) - 1
    }

    /// Counts a check that took `took`, at `second`.
    pub fn add(&mut self, second: u64, took: Duration) {
        let (at, counts) = &mut self.seconds[(second % series::SECONDS) as usize];
        if *at != second {
            *at = second;
            *counts = [0; BUCKETS];
        }
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        counts[Self::bucket(micros)] += 1;
    }

    /// Adds the counts of the `span` seconds up to `second` to `total`.
    pub fn count(&self, second: u64, span: u64, total: &mut Histogram) {
        for (at, counts) in &self.seconds {
            if *at != u64::MAX && *at <= second && *at + span > second {
                for (t, c) in total.0.iter_mut().zip(counts.iter()) {
                    *t += u64::from(*c);
                }
            }
        }
    }
}

/// Latency counts added up from [`Latency::count`].
#[derive(Debug)]
pub struct Histogram([u64; BUCKETS]);

impl Default for Histogram {
    fn default() -> Self {
        Self([0; BUCKETS])
    }
}

impl Histogram {
    /// (p50, p99) of the counts, in µs (the upper bound of each one's bucket); zeros when
    /// empty.
    pub fn percentiles(&self) -> (u64, u64) {
        let total = &self.0;
        let n: u64 = total.iter().sum();
        if n == 0 {
            return (0, 0);
        }
        let at = |q: f64| {
            let rank = ((n as f64) * q).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (b, c) in total.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return Latency::upper(b);
                }
            }
            Latency::upper(BUCKETS - 1)
        };
        (at(0.5), at(0.99))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::top::merged;

    #[test]
    fn under_heavy_traffic_hot_keys_are_sampled_and_still_found() {
        let mut kept = Kept::new("api");
        let t = 1_700_006_400;
        // A quiet second: every check counts, exactly.
        for i in 0..1_000u64 {
            let key = if i % 10 == 0 {
                "hot".to_string()
            } else {
                format!("k{i}")
            };
            let weight = kept.hit_samples.weight(t);
            assert_eq!(weight, 1);
            kept.hot.add(t, key.as_bytes(), weight, 0);
        }
        // Then 200,000 checks a second: from the next second, one in 64 is counted 64 times.
        for second in [t + 1, t + 2] {
            for i in 0..200_000u64 {
                let key = if i % 10 == 0 {
                    "hot".to_string()
                } else {
                    format!("k{}", i % 50_000)
                };
                let weight = kept.hit_samples.weight(second);
                if weight > 0 {
                    kept.hot.add(second, key.as_bytes(), weight, 0);
                }
            }
        }
        assert_eq!(kept.hit_samples.weight, 64);
        let now = kept.hot.now(t + 2);
        let top = merged(now.iter().map(|(h, _)| *h), 3);
        assert_eq!(top[0].key, b"hot");
        assert!(top[0].estimated);
        // 40,100 true hits: the estimate within 10%.
        let hits = top[0].count as f64;
        assert!((hits - 40_100.0).abs() < 4_010.0, "{hits}");
        // A quiet second again: exact counting comes back.
        assert_eq!(kept.hit_samples.weight(t + 10), 1);
    }

    #[test]
    fn latency_buckets_hold_their_values() {
        for micros in [0, 1, 3, 4, 5, 7, 8, 100, 999, 1_000, 65_537, 10_000_000] {
            let b = Latency::bucket(micros);
            assert!(
                Latency::upper(b) >= micros,
                "{micros} in {b} up to {}",
                Latency::upper(b)
            );
            if b > 4 {
                assert!(
                    Latency::upper(b - 1) < micros,
                    "{micros}: the bucket below holds it"
                );
            }
        }
        let mut latency = Latency::default();
        for i in 0..100u64 {
            latency.add(
                1_000,
                Duration::from_micros(if i < 99 { 100 } else { 5_000 }),
            );
        }
        let percentiles = |latency: &Latency| {
            let mut total = Histogram::default();
            latency.count(1_000, 10, &mut total);
            total.percentiles()
        };
        let (p50, p99) = percentiles(&latency);
        assert!((100..=111).contains(&p50), "{p50}");
        assert!((100..=111).contains(&p99), "{p99}");
        latency.add(1_000, Duration::from_micros(5_000));
        let (_, p99) = percentiles(&latency);
        assert!(p99 >= 5_000, "{p99}");
        // Two minutes on, the ring has let that second go.
        latency.add(1_000 + series::SECONDS, Duration::from_micros(7));
        let mut later = Histogram::default();
        latency.count(1_000 + series::SECONDS, 10, &mut later);
        assert_eq!(later.percentiles(), (7, 7));
    }
}
