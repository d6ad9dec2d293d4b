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
    /// How many rules decided something here in the current second and the one before,
    /// which share [`EXACT_PER_SECOND`].
    active: Active,
}

/// The rules that decided something in a shard, per second.
#[derive(Debug, Default)]
struct Active {
    second: u64,
    now: u64,
    before: u64,
}

impl Shard {
    /// A shard whose recorder keeps at most `record_bytes`.
    pub fn new(record_bytes: usize) -> Self {
        Self(Mutex::new(State {
            rules: HashMap::default(),
            latency: Latency::default(),
            recorder: Recorder::new(record_bytes),
            active: Active::default(),
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
        let active = &mut self.active;
        if active.second != second {
            active.before = if active.second + 1 == second {
                active.now
            } else {
                0
            };
            active.second = second;
            active.now = 0;
        }
        // Each rule's share of the events counted one by one: the rules of this second or of
        // the second before, whichever are more, share them evenly.
        let share = EXACT_PER_SECOND / active.before.max(active.now).max(1);
        let kept = self
            .rules
            .entry(name.as_ptr() as usize)
            .or_insert_with(|| Kept::new(name));
        kept.series.add(second, outcome);
        active.now += u64::from(kept.hit_samples.second != second);
        let hits = kept.hit_samples.weight(second, share);
        let denials = if decision.allowed() {
            0
        } else {
            kept.denial_samples.weight(second, share)
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

/// Which events of a rule in a shard count in its hottest keys. A shard counts up to
/// [`EXACT_PER_SECOND`] events a second one by one, shared evenly by the rules that had events
/// in it this second or the second before: a rule counts every event while its events of the
/// second before and of this one are within its share; past it, one in `w` drawn at random
/// (`w` the power of two that brings its sampled rate back within its share, doubled
/// whenever its events this second outgrow it), each counting `w`. So the summaries of a shard
/// take about [`EXACT_PER_SECOND`] updates a second under steady traffic, whatever its rate
/// and the number of rules, and in a second when the traffic jumps, a rule takes its share
/// and half of it more for each doubling of its rate; a check under heavy traffic pays a
/// fraction of an update. A sampled key's count is an estimate, unbiased: a key with a share
/// `p` of `n` events is sampled about `p n / w` times, within a few times `sqrt(p n w)` of
/// `p n`.
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

/// Events per second in a shard counted one by one (each rule's updates of its summaries).
pub const EXACT_PER_SECOND: u64 = 1_024;

impl Sampling {
    fn new(seed: u64) -> Self {
        Self {
            second: u64::MAX,
            events: 0,
            weight: 1,
            random: seed | 1,
        }
    }

    /// What this event, at `second`, counts (its weight if sampled, else 0), the rule's
    /// share being `share` events a second.
    fn weight(&mut self, second: u64, share: u64) -> u64 {
        let share = share.max(1);
        if second != self.second {
            let rate = if self.second.wrapping_add(1) == second {
                self.events
            } else {
                0
            };
            self.weight = rate.div_ceil(share).max(1).next_power_of_two();
            self.second = second;
            self.events = 0;
        }
        self.events += 1;
        if self.events > share.saturating_mul(self.weight) {
            self.weight *= 2;
        }
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
        let micros = took
            .as_secs()
            .saturating_mul(1_000_000)
            .saturating_add(u64::from(took.subsec_micros()));
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
        kept.hit_samples = Sampling::new(0x9e37_79b9_7f4a_7c15);
        let t = 1_700_006_400;
        // A quiet second: every check counts, exactly.
        for i in 0..1_000u64 {
            let key = if i % 10 == 0 {
                "hot".to_string()
            } else {
                format!("k{i}")
            };
            let weight = kept.hit_samples.weight(t, EXACT_PER_SECOND);
            assert_eq!(weight, 1);
            kept.hot.add(t, key.as_bytes(), weight, 0);
        }
        // Then 200,000 checks a second for 20 s: sampled more sparsely as the first of those
        // seconds goes on, then one in 256 counted 256 times.
        let keys: Vec<Vec<u8>> = (0..50_000).map(|i| format!("k{i}").into_bytes()).collect();
        for second in t + 1..=t + 20 {
            for i in 0..200_000usize {
                let key = if i % 10 == 0 {
                    &b"hot"[..]
                } else {
                    &keys[i % 50_000]
                };
                let weight = kept.hit_samples.weight(second, EXACT_PER_SECOND);
                if weight > 0 {
                    kept.hot.add(second, key, weight, 0);
                }
            }
        }
        assert_eq!(kept.hit_samples.weight, 256);
        let now = kept.hot.now(t + 20);
        let top = merged(now.iter().map(|(h, _)| *h), 3);
        assert_eq!(top[0].key, b"hot");
        assert!(top[0].estimated);
        // 400,100 true hits, about 1,500 samples of them: the estimate within 10%.
        let hits = top[0].count as f64;
        assert!((hits - 400_100.0).abs() < 40_010.0, "{hits}");
        // A quiet second again: exact counting comes back.
        assert_eq!(kept.hit_samples.weight(t + 30, EXACT_PER_SECOND), 1);
    }

    /// However many rules decide in a shard, its summaries take about
    /// [`EXACT_PER_SECOND`] updates a second under steady traffic and a few times that when
    /// traffic jumps, and a quiet rule among busy ones still counts every check.
    #[test]
    fn rules_share_what_a_shard_counts_one_by_one() {
        use tollgate::{Algorithm, Item, Limiter, ManualClock, Rule, Tier};
        let names: Vec<String> = (0..200).map(|r| format!("r{r}")).collect();
        let rule = |name: &str| {
            Rule::new(name, Algorithm::FixedWindow, [Tier::per_minute(1 << 40)]).unwrap()
        };
        let mut builder = Limiter::builder(rule("quiet")).rule(rule("bursty"));
        for name in &names {
            builder = builder.rule(rule(name));
        }
        let t = 1_700_006_400;
        let limiter = builder
            .clock(ManualClock::at_micros(t * 1_000_000))
            .build()
            .unwrap();
        let mut state = Shard::new(0).0.into_inner().unwrap();
        let decide = |state: &mut State, second: u64, name: &str, key: &[u8]| {
            let decided = limiter.check_batch_now(&[Item::new(name, key, 1)]).unwrap();
            state.decided(second, key, &decided[0]);
        };
        let updates = |state: &State| -> u64 {
            state
                .rules
                .values()
                .flat_map(|kept| kept.hot.now(t + 3))
                .map(|(hits, _)| hits.updates())
                .sum()
        };
        // 200 rules, each with 500 checks a second (100,000 in all), and a quiet one with 5.
        let mut seen = 0;
        for second in t..t + 3 {
            for i in 0..500u64 {
                let key = format!("k{}", i % 37);
                for name in &names {
                    decide(&mut state, second, name, key.as_bytes());
                }
                if i % 100 == 0 {
                    decide(&mut state, second, "quiet", b"q");
                }
            }
            let took = updates(&state) - seen;
            seen += took;
            // The first second, the rules come all at once: each one's share is 5 a second,
            // and it takes that and half of it more for each doubling of its rate; then one
            // in 128 of each rule's checks.
            let bound = if second == t { 8 } else { 2 } * EXACT_PER_SECOND;
            assert!(took <= bound, "{took} updates in second {}", second - t);
        }
        let quiet = state.rules.values().find(|k| k.name == "quiet").unwrap();
        let total: u64 = quiet.hot.now(t + 3).iter().map(|(h, _)| h.total()).sum();
        let updated: u64 = quiet.hot.now(t + 3).iter().map(|(h, _)| h.updates()).sum();
        assert_eq!(
            (total, updated),
            (15, 15),
            "the quiet rule's checks, each counted"
        );
        // A rule idle until now takes 100,000 checks in one second: a few times the shard's
        // updates, not 100,000.
        for i in 0..100_000u64 {
            decide(
                &mut state,
                t + 3,
                "bursty",
                format!("b{}", i % 1_000).as_bytes(),
            );
        }
        let took = updates(&state) - seen;
        assert!(took <= 8 * EXACT_PER_SECOND, "{took} updates in a burst");
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
