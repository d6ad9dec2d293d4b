//! A global rule's tiers as buckets of time: the counts that merge across regions. A fixed
//! window is one bucket per period; a sliding window, the previous period's bucket weighted
//! by how much of it the window still overlaps, and the current one; sub-windows, the last
//! `count` buckets of `period / count` each. The weights are the algorithms' own (see
//! `algorithm/sliding_window.rs`, `algorithm/sub_windows.rs`).

use std::time::Duration;

use crate::algorithm::{Algorithm, Tier, Verdict};

/// How long a bucket's hash outlives its window, for merges still on their way.
const SLACK: Duration = Duration::from_secs(10);

/// One tier of a global rule.
#[derive(Debug, Clone)]
pub(super) struct Shape {
    kind: Kind,
    /// µs.
    period: u64,
    pub(super) limit: u64,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Fixed,
    Sliding,
    Sub(u64),
}

/// The buckets of one tier at one time.
#[derive(Debug)]
pub(super) struct Buckets {
    /// Bucket numbers (time over the bucket's length), oldest first; the last is current.
    pub(super) ids: Vec<u64>,
    /// Each bucket's weight in the count.
    pub(super) weights: Vec<f64>,
    /// When the current bucket ends (µs).
    end: u64,
    /// When every bucket counted now has left the window (µs).
    reset: u64,
}

impl Shape {
    /// `tier` of `algorithm`, which merges (see `rule::merges`).
    pub(super) fn of(algorithm: &Algorithm, tier: &Tier) -> Self {
        let kind = match algorithm {
            Algorithm::SlidingWindow => Kind::Sliding,
            Algorithm::SubWindows(sub) => Kind::Sub(u64::from(sub.count)),
            _ => Kind::Fixed,
        };
        Self {
            kind,
            period: tier.period_micros(),
            limit: tier.limit(),
        }
    }

    /// What one region may admit beyond what every live peer confirmed: `overshoot` of the
    /// limit shared by the `peers`, at least 1.
    pub(super) fn allowance(&self, peers: usize, overshoot: f64) -> u64 {
        if peers == 0 {
            return self.limit;
        }
        ((overshoot * self.limit as f64 / peers as f64).floor() as u64).max(1)
    }

    /// The buckets counted at `now` (µs).
    pub(super) fn at(&self, now: u64) -> Buckets {
        let period = self.period;
        match self.kind {
            Kind::Fixed => {
                let b = now / period;
                Buckets {
                    ids: vec![b],
                    weights: vec![1.0],
                    end: (b + 1) * period,
                    reset: (b + 1) * period,
                }
            }
            Kind::Sliding => {
                let b = now / period;
                let elapsed = now - b * period;
                let previous = (period - elapsed) as f64 / period as f64;
                let (ids, weights) = match b {
                    0 => (vec![b], vec![1.0]),
                    _ => (vec![b - 1, b], vec![previous, 1.0]),
                };
                Buckets {
                    ids,
                    weights,
                    end: (b + 1) * period,
                    reset: (b + 2) * period,
                }
            }
            Kind::Sub(count) => {
                let length = period / count;
                let b = now / length;
                let first = b.saturating_sub(count - 1);
                let ids: Vec<u64> = (first..=b).collect();
                Buckets {
                    weights: vec![1.0; ids.len()],
                    ids,
                    end: (b + 1) * length,
                    reset: (b + count) * length,
                }
            }
        }
    }
}

impl Buckets {
    /// How long the current bucket's hash lives from `now` (µs): until it leaves the window,
    /// and a little more.
    pub(super) fn ttl(&self, now: u64) -> Duration {
        Duration::from_micros(self.reset.saturating_sub(now)) + SLACK
    }

    /// The tier's verdict at `now` from what the check answered: `merged`, the count before
    /// it (with what stale peers are assumed to have admitted), `why` it was denied (0 not,
    /// 1 the limit, 2 permits in flight), `charged` what it took. A denial in flight is
    /// retried after `in_flight_retry` (µs): about when the peers' confirmations are back.
    pub(super) fn verdict(
        &self,
        shape: &Shape,
        now: u64,
        merged: f64,
        why: u8,
        charged: u64,
        in_flight_retry: u64,
    ) -> Verdict {
        let limit = shape.limit;
        let left = (limit as f64 - merged - charged as f64).max(0.0).floor() as u64;
        let reset_after = self.reset.saturating_sub(now);
        match why {
            0 => Verdict::allow(limit, left, reset_after),
            1 => Verdict::deny(limit, left, reset_after, self.end.saturating_sub(now)),
            _ => Verdict::deny(limit, left, reset_after, in_flight_retry),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::SubWindows;

    #[test]
    fn each_algorithm_counts_its_own_buckets() {
        let tier = Tier::new(100, Duration::from_secs(10));
        let fixed = Shape::of(&Algorithm::FixedWindow, &tier).at(25_000_000);
        assert_eq!((fixed.ids, fixed.weights), (vec![2], vec![1.0]));
        let sliding = Shape::of(&Algorithm::SlidingWindow, &tier).at(25_000_000);
        assert_eq!((sliding.ids, sliding.weights), (vec![1, 2], vec![0.5, 1.0]));
        assert_eq!(sliding.reset, 40_000_000);
        let sub = Shape::of(&Algorithm::SubWindows(SubWindows { count: 5 }), &tier);
        let buckets = sub.at(25_000_000);
        assert_eq!(buckets.ids, vec![8, 9, 10, 11, 12]);
        assert_eq!(buckets.end, 26_000_000);
    }

    #[test]
    fn the_allowance_shares_the_overshoot_among_the_peers() {
        let shape = Shape::of(&Algorithm::FixedWindow, &Tier::per_hour(10_000));
        assert_eq!(shape.allowance(2, 0.01), 50);
        assert_eq!(shape.allowance(0, 0.01), 10_000);
        let small = Shape::of(&Algorithm::FixedWindow, &Tier::per_minute(60));
        assert_eq!(small.allowance(2, 0.01), 1);
    }
}
