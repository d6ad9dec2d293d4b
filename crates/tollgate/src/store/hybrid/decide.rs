//! How a hybrid store decides, in memory and never waiting for Redis: each key's windows as
//! last heard, its claim and what it admitted since, and what a check needs of the next sync.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::*;

impl Inner {
    /// The least time between two syncs: a twentieth of the interval, 1 to 50 ms.
    pub(super) fn min_gap(&self) -> Duration {
        (self.config.sync_interval / 20).clamp(Duration::from_millis(1), Duration::from_millis(50))
    }

    pub(super) fn interval_micros(&self) -> u64 {
        self.config.sync_interval.as_micros() as u64
    }

    /// `now` on the limiter's clock, as the counters' clock reads it.
    pub(super) fn store_time(&self, now: u64) -> u64 {
        now.saturating_add_signed(self.offset.load(Ordering::Relaxed))
            .max(1)
    }

    /// Whether syncs have failed for too long to decide by the counts held (the failure policy
    /// does).
    pub(super) fn stale(&self) -> bool {
        let patience = 2 * self.config.sync_interval + Duration::from_secs(1);
        self.failing.load(Ordering::Relaxed)
            && self
                .clock
                .now_micros()
                .saturating_sub(self.last_ok.load(Ordering::Relaxed))
                > patience.as_micros() as u64
    }

    pub(super) fn scorer(&self) -> Scorer<'_> {
        Scorer {
            tags: self.tags.read(),
        }
    }

    /// The permits of `tier` this instance may admit beyond its claim: 2, or a hundredth of
    /// its limit shared by the instances running (as the last sync heard, or as configured
    /// before it) or claiming the key (`claimers`), whichever is more; unless configured.
    pub(super) fn unclaimed(&self, tier: &Tier, claimers: u64) -> u64 {
        self.config.max_unclaimed.unwrap_or_else(|| {
            let running = match self.instances.load(Ordering::Relaxed) {
                0 => u64::from(self.config.instances),
                heard => heard,
            };
            (tier.limit() / (100 * running.max(claimers).max(1))).max(2)
        })
    }

    /// Decides `items` all-or-nothing in memory, queueing the keys it admits for the next
    /// sync, and waking the sync task at once when a key ran out of claim; with whether one
    /// did (the denial then says only that this instance holds no claim yet). Each item's cost
    /// counts once in the demand claims are sized to: not `again`, when a check starved
    /// before is decided again.
    pub(super) fn decide(
        &self,
        items: &[Planned<'_, HybridPlan>],
        now: u64,
        max_delay: Option<u64>,
        again: bool,
    ) -> (Decisions, bool) {
        let now = self.store_time(now);
        self.last_now.fetch_max(now, Ordering::Relaxed);
        let accesses = accesses(items);
        let (mut starved, mut queue) = (0, Vec::new());
        let scorer = self.scorer();
        let decisions = self.table.access(&accesses, now, &scorer, |words| {
            let mut decisions = Vec::with_capacity(items.len());
            // Whether an item's cost counts in its key's demand still.
            let mut undemanded = vec![!again; items.len()];
            for ((item, w), undemanded) in items.iter().zip(words.iter_mut()).zip(&mut undemanded) {
                roll(item, w, now);
                let (decision, wants) = self.judge(item, w, now, max_delay);
                match wants {
                    Wants::Nothing => {}
                    Wants::Claim => {
                        starved += 1;
                        // Demand the claim is sized to, admitted or not.
                        if std::mem::take(undemanded) {
                            demanded(item, w, now);
                        }
                        enqueue(item, w, &mut queue);
                    }
                    // The next sync says whether other instances' claims still hold it back.
                    Wants::Look => enqueue(item, w, &mut queue),
                }
                decisions.push(decision.shadow(item.rule.is_shadow()));
            }
            if decisions.iter().all(Decision::allowed) {
                let admitted = items.iter().zip(words.iter_mut()).zip(&decisions);
                for (((item, w), d), undemanded) in admitted.zip(undemanded) {
                    if item.cost > 0 && !d.shadowed() {
                        for t in 0..item.rule.tiers().len() {
                            tier_mut(w, t)[PENDING] += item.cost;
                        }
                        if undemanded {
                            demanded(item, w, now);
                        }
                        enqueue(item, w, &mut queue);
                    }
                }
            }
            decisions
        });
        drop(scorer);
        self.decisions
            .fetch_add(items.len() as u64, Ordering::Relaxed);
        if !queue.is_empty() {
            self.queue
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(queue);
        }
        if starved > 0 {
            self.allowance_denials.fetch_add(starved, Ordering::Relaxed);
            self.urgent.store(true, Ordering::Relaxed);
            self.wake.notify_one();
        }
        (Decisions::many(decisions), starved > 0)
    }

    /// One item's decision from its key's words at `now`, as the counts and claims it holds
    /// say, and what it needs of the next sync.
    pub(super) fn judge(
        &self,
        item: &Planned<'_, HybridPlan>,
        w: &mut [u64],
        now: u64,
        max_delay: Option<u64>,
    ) -> (Decision, Wants) {
        let look = Attempt {
            now: Micros::new(now),
            cost: item.cost,
            max_delay,
            commit: false,
            settle: None,
        };
        let mut wants = Wants::Nothing;
        let verdicts: Vec<Verdict> = item
            .rule
            .tiers()
            .iter()
            .enumerate()
            .map(|(t, tier)| {
                let tw = tier_mut(w, t);
                let unsynced = tw[PENDING] + tw[IN_FLIGHT];
                let verdict = window_verdict(item, tier, tw, tw[OTHERS] + unsynced, &look);
                if !verdict.allowed {
                    // Held back by claims rather than by what was admitted: they may lapse.
                    let admitted = window_verdict(item, tier, tw, unsynced, &look);
                    if admitted.allowed && wants == Wants::Nothing {
                        wants = Wants::Look;
                        let wait = self.interval_micros();
                        return Verdict::deny(
                            verdict.limit,
                            verdict.remaining,
                            verdict.reset_after,
                            wait,
                        );
                    }
                    return verdict;
                }
                let claim = if now < tw[CLAIM_UNTIL] { tw[CLAIM] } else { 0 };
                let unclaimed = self.unclaimed(tier, tw[CLAIMERS]);
                if item.cost > 0 && unsynced + item.cost > claim.saturating_add(unclaimed) {
                    wants = Wants::Claim;
                    let wait = item.plan.shape.retry;
                    return Verdict::deny(
                        verdict.limit,
                        verdict.remaining,
                        verdict.reset_after,
                        wait,
                    );
                }
                verdict
            })
            .collect();
        let decision = item.rule.merge(|i| verdicts[i]).with_source(Source::Hybrid);
        (decision, wants)
    }
}

/// What a check needs of the next sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wants {
    Nothing,
    /// A claim, soon: the instance ran out (an early sync).
    Claim,
    /// A fresh look at the others' claims, at the next sync.
    Look,
}

/// One tier's verdict at `look` with `used` permits in the current window on top of the
/// count heard (and, for a sliding window, the window before).
pub(super) fn window_verdict(
    item: &Planned<'_, HybridPlan>,
    tier: &Tier,
    tw: &[u64],
    used: u64,
    look: &Attempt,
) -> Verdict {
    let used = tw[COUNT] + used;
    if item.plan.shape.sliding {
        SlidingWindow.decide(tier, &mut [tw[START], tw[PREVIOUS], used], look)
    } else {
        FixedWindow.decide(tier, &mut [tw[START], used], look)
    }
}
/// Counts `item`'s cost in the demand its key's claims are sized to.
pub(super) fn demanded(item: &Planned<'_, HybridPlan>, w: &mut [u64], now: u64) {
    for t in 0..item.rule.tiers().len() {
        let tw = tier_mut(w, t);
        if tw[SINCE_AT] == 0 {
            tw[SINCE_AT] = now;
        }
        tw[SINCE] += item.cost;
    }
}

pub(super) fn enqueue(item: &Planned<'_, HybridPlan>, w: &mut [u64], queue: &mut Vec<Queued>) {
    if w[FLAGS] & QUEUED == 0 {
        w[FLAGS] |= QUEUED;
        queue.push(Queued {
            rule: item.rule.clone(),
            shape: item.plan.shape.clone(),
            key: item.key.into(),
        });
    }
}
