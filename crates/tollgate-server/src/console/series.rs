//! Decisions counted over time in fixed rings: a bucket per second for the last two minutes
//! and a bucket per minute for the last hour, 180 buckets whatever the traffic. A second's
//! bucket is folded into its minute when the ring comes round to it again, so each decision
//! counts in exactly one bucket, and the minutes read with the seconds not yet folded.

use serde::{Deserialize, Serialize};

/// Seconds kept one by one.
pub const SECONDS: u64 = 120;
/// Minutes kept.
pub const MINUTES: u64 = 60;

/// What decisions did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Admitted.
    pub allowed: u64,
    /// Denied.
    pub denied: u64,
    /// Admitted by a rule in shadow mode that would have denied.
    pub shadow: u64,
    /// Admitted with under a fifth of the limit left.
    pub near: u64,
}

impl Counts {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Counts) {
        self.allowed += other.allowed;
        self.denied += other.denied;
        self.shadow += other.shadow;
        self.near += other.near;
    }

    /// Every decision.
    pub fn total(&self) -> u64 {
        self.allowed + self.denied + self.shadow
    }
}

/// One decision's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted.
    Allowed {
        /// With under a fifth of the limit left.
        near: bool,
    },
    /// Denied.
    Denied,
    /// Admitted by a shadow rule that would have denied.
    Shadow,
}

/// A bucket as read: its start (seconds since the epoch) and its counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Point {
    /// The bucket's start, in seconds since the epoch.
    pub at: u64,
    /// Its counts.
    #[serde(flatten)]
    pub counts: Counts,
}

/// The rings of one rule. Not synchronized: its owner locks it (see `Watch`).
#[derive(Debug)]
pub struct Series {
    /// Per slot, the second it counts and its counts.
    seconds: Vec<(u64, Counts)>,
    /// Per slot, the minute it counts and its counts (folded seconds only).
    minutes: Vec<(u64, Counts)>,
}

impl Default for Series {
    fn default() -> Self {
        Self {
            seconds: vec![(u64::MAX, Counts::default()); SECONDS as usize],
            minutes: vec![(u64::MAX, Counts::default()); MINUTES as usize],
        }
    }
}

impl Series {
    /// Counts one decision of `outcome` at `second` (since the epoch).
    pub fn add(&mut self, second: u64, outcome: Outcome) {
        let slot = (second % SECONDS) as usize;
        if self.seconds[slot].0 != second {
            let (old, counts) =
                std::mem::replace(&mut self.seconds[slot], (second, Counts::default()));
            if old != u64::MAX && old < second {
                self.fold(old, &counts);
            }
        }
        let counts = &mut self.seconds[slot].1;
        match outcome {
            Outcome::Allowed { near } => {
                counts.allowed += 1;
                counts.near += u64::from(near);
            }
            Outcome::Denied => counts.denied += 1,
            Outcome::Shadow => counts.shadow += 1,
        }
    }

    /// The last [`SECONDS`] seconds up to `now` (a second since the epoch), oldest first.
    pub fn seconds(&self, now: u64) -> Vec<Point> {
        (now.saturating_sub(SECONDS - 1)..=now)
            .map(|at| {
                let (second, counts) = self.seconds[(at % SECONDS) as usize];
                let counts = if second == at {
                    counts
                } else {
                    Counts::default()
                };
                Point { at, counts }
            })
            .collect()
    }

    /// The last [`MINUTES`] minutes up to the one holding `now`, oldest first (`at` is each
    /// minute's first second); the current minute so far.
    pub fn minutes(&self, now: u64) -> Vec<Point> {
        let current = now / 60;
        (current.saturating_sub(MINUTES - 1)..=current)
            .map(|minute| {
                let (held, folded) = self.minutes[(minute % MINUTES) as usize];
                let mut counts = if held == minute {
                    folded
                } else {
                    Counts::default()
                };
                for (second, live) in &self.seconds {
                    if *second != u64::MAX && second / 60 == minute && *second <= now {
                        counts.add(live);
                    }
                }
                Point {
                    at: minute * 60,
                    counts,
                }
            })
            .collect()
    }

    /// The counts of the `span` seconds up to `now` (at most [`SECONDS`]).
    pub fn last(&self, now: u64, span: u64) -> Counts {
        let mut total = Counts::default();
        for (second, counts) in &self.seconds {
            if *second <= now && *second + span.min(SECONDS) > now {
                total.add(counts);
            }
        }
        total
    }

    /// Adds the counts of `second`, leaving its slot, to its minute.
    fn fold(&mut self, second: u64, counts: &Counts) {
        let minute = second / 60;
        let slot = &mut self.minutes[(minute % MINUTES) as usize];
        if slot.0 != minute {
            if slot.0 != u64::MAX && slot.0 > minute {
                return; // older than the ring holds
            }
            *slot = (minute, Counts::default());
        }
        slot.1.add(counts);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_006_400; // a whole minute

    #[test]
    fn each_decision_counts_once_in_seconds_and_minutes() {
        let mut series = Series::default();
        // Three minutes of one decision a second, a denial every tenth.
        for s in 0..180 {
            let outcome = if s % 10 == 0 {
                Outcome::Denied
            } else {
                Outcome::Allowed { near: false }
            };
            series.add(T0 + s, outcome);
        }
        let now = T0 + 179;
        let seconds = series.seconds(now);
        assert_eq!(seconds.len(), SECONDS as usize);
        assert!(seconds.iter().all(|p| p.counts.total() == 1));
        let minutes = series.minutes(now);
        assert_eq!(minutes.len(), MINUTES as usize);
        let counted: Vec<u64> = minutes.iter().map(|p| p.counts.total()).collect();
        assert_eq!(&counted[MINUTES as usize - 3..], [60, 60, 60]);
        assert_eq!(counted.iter().sum::<u64>(), 180, "nothing counted twice");
        let denied: u64 = minutes.iter().map(|p| p.counts.denied).sum();
        assert_eq!(denied, 18);
        assert_eq!(series.last(now, 10).total(), 10);
    }

    #[test]
    fn an_hour_later_the_ring_holds_the_last_hour_only() {
        let mut series = Series::default();
        for s in (0..7_200).step_by(7) {
            series.add(T0 + s, Outcome::Shadow);
        }
        let now = T0 + 7_199;
        let minutes = series.minutes(now);
        assert_eq!(minutes[0].at, (now / 60 - 59) * 60);
        let kept: u64 = minutes.iter().map(|p| p.counts.shadow).sum();
        // The decisions of the last hour: one every 7 s from T0 + 3600 (rounded to a minute).
        let expected = (0..7_200u64)
            .step_by(7)
            .filter(|s| (T0 + s) / 60 >= now / 60 - 59)
            .count() as u64;
        assert_eq!(kept, expected);
    }
}
