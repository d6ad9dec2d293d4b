//! The hybrid store's sync: every interval (sooner when a check runs out of claim) it pushes
//! what this instance admitted, renews its claims and reads the counts back, in one call of
//! the counters function (one per Cluster slot on a cluster).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use tokio::sync::Notify;

use super::*;
use crate::layout::counters;

/// The sync task: every interval, or soon after a check asks, until the store is dropped or
/// shut down.
pub(super) async fn run(inner: Weak<Inner>, wake: Arc<Notify>, urgent: Arc<AtomicBool>) {
    let Some((interval, gap)) = inner
        .upgrade()
        .map(|i| (i.config.sync_interval, i.min_gap()))
    else {
        return;
    };
    // At once, so that the instance soon knows how many others run.
    let mut first = true;
    loop {
        if !std::mem::take(&mut first) {
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = wake.notified() => {
                    if !urgent.swap(false, Ordering::Relaxed) {
                        tokio::time::sleep(gap).await;
                    }
                }
            }
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.stopped.load(Ordering::Relaxed) {
            return;
        }
        let was_failing = inner.failing.load(Ordering::Relaxed);
        match inner.sync(false).await {
            Ok(()) if was_failing => tracing::info!("hybrid store syncs with redis again"),
            Err(err) if !was_failing => {
                tracing::warn!(error = %err, "hybrid store cannot sync with redis; counts kept to push later");
            }
            _ => {}
        }
        inner.syncs_done.fetch_add(1, Ordering::Release);
        inner.synced.send_modify(|n| *n += 1);
    }
}

impl Inner {
    /// Says this instance runs, pushes the deltas of the queued keys and renews their claims
    /// (or, with `release`, gives the claims up), reads the counts back, and gives each key
    /// what Redis granted. On failure the deltas go back to pending and the keys back to the
    /// queue.
    pub(super) async fn sync(&self, release: bool) -> Result<(), Error> {
        let queued: Vec<Queued> =
            std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()));
        let now = self.last_now.load(Ordering::Relaxed).max(1);
        let accesses: Vec<Access<'_>> = queued
            .iter()
            .map(|q| Access {
                tag: q.shape.tag,
                key: &q.key,
                words: q.shape.words,
            })
            .collect();
        let interval = self.interval_micros();
        let mut pushes: Vec<Push> = Vec::new();
        self.table.access(&accesses, now, &self.scorer(), |words| {
            for (index, (q, w)) in queued.iter().zip(words.iter_mut()).enumerate() {
                w[FLAGS] &= !QUEUED;
                for (tier, t) in q.rule.tiers().iter().enumerate() {
                    let tw = tier_mut(w, tier);
                    if tw[START] == 0 {
                        continue;
                    }
                    if q.shape.sliding && tw[PENDING_PREVIOUS] > 0 {
                        // First, so that the current window's claim weighs it.
                        let delta = std::mem::take(&mut tw[PENDING_PREVIOUS]);
                        let window = tw[START] - t.period_micros();
                        pushes.push(Push::only(index, tier, window, delta));
                    }
                    let delta = std::mem::take(&mut tw[PENDING]);
                    tw[IN_FLIGHT] += delta;
                    let claim = if now < tw[CLAIM_UNTIL] { tw[CLAIM] } else { 0 };
                    let (want, keep) = if release {
                        (0, 0)
                    } else {
                        (
                            wanted(tw, now, interval),
                            claim.saturating_sub(tw[IN_FLIGHT]),
                        )
                    };
                    pushes.push(Push {
                        index,
                        tier,
                        window: tw[START],
                        delta,
                        claim: Some((want, keep)),
                    });
                }
            }
        });
        // First, this instance as running (a key of its own: on a cluster, a call of its own).
        let presence = CounterItem {
            keys: vec![self.redis.key(INSTANCES_KEY)],
            args: packed::<{ counters::CLAIM }>([
                3.0,
                0.0,
                (3 * interval / 1_000) as f64,
                0.0,
                0.0,
                0.0,
                0.0,
                0.0,
                0.0,
            ]),
        };
        let items: Vec<CounterItem> = std::iter::once(presence)
            .chain(pushes.iter().map(|p| {
                let q = &queued[p.index];
                let tier = &q.rule.tiers()[p.tier];
                let period = tier.period_micros();
                let counter =
                    |window: u64| counter_key(&q.shape.prefix, &q.key, p.tier, window / period);
                // Kept through the next window, which a sliding window weighs it in.
                let ttl = (p.window + 2 * period).saturating_sub(now) / 1_000 + 1_000;
                let (kind, want, keep, mut keys) = match p.claim {
                    None => (0.0, 0, 0, vec![counter(p.window)]),
                    Some((want, keep)) => {
                        let mut claims = counter(p.window);
                        claims.extend_from_slice(b":claims");
                        (1.0, want, keep, vec![counter(p.window), claims])
                    }
                };
                let kind = if p.claim.is_some() && q.shape.sliding {
                    keys.push(counter(p.window - period));
                    2.0
                } else {
                    kind
                };
                let args = packed::<{ counters::CLAIM }>([
                    kind,
                    p.delta as f64,
                    ttl as f64,
                    tier.limit() as f64,
                    want as f64,
                    keep as f64,
                    (3 * interval) as f64,
                    period as f64,
                    p.window as f64,
                ]);
                CounterItem { keys, args }
            }))
            .collect();
        let local = self.clock.now_micros();
        let timeout = self.config.sync_interval.min(Duration::from_secs(1));
        let answer =
            match tokio::time::timeout(timeout, self.redis.claim(&self.id, now, &items)).await {
                Ok(answer) => answer,
                Err(_) => {
                    self.timed_out_syncs.fetch_add(1, Ordering::Relaxed);
                    Err(Error::Store {
                        message: format!("no answer within {timeout:?}"),
                        transient: true,
                    })
                }
            };
        let calls = answer.as_ref().map_or(1, |a| a.calls);
        self.calls.fetch_add(calls, Ordering::Relaxed);
        let scorer = self.scorer();
        match answer {
            Ok(answer) => {
                let at = match self.redis.time() {
                    StoreTime::Server => {
                        let offset = answer.time as i64 - local as i64;
                        self.offset.store(offset, Ordering::Relaxed);
                        answer.time
                    }
                    StoreTime::Local => now,
                };
                let mut answered = answer.values.chunks_exact(5);
                if let Some(presence) = answered.next() {
                    self.instances.store(presence[0] as u64, Ordering::Relaxed);
                }
                self.table.access(&accesses, now, &scorer, |words| {
                    for (p, values) in pushes.iter().zip(answered) {
                        let q = &queued[p.index];
                        let heard = Heard {
                            count: values[0] as u64,
                            others: values[1] as u64,
                            claim: values[2] as u64,
                            claimers: values[3] as u64,
                            previous: values[4] as u64,
                        };
                        settle(q, &mut words[p.index], p, &heard, at, now, interval);
                    }
                });
                self.last_ok
                    .store(self.clock.now_micros(), Ordering::Relaxed);
                self.failing.store(false, Ordering::Relaxed);
                self.syncs.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(err) => {
                self.table.access(&accesses, now, &scorer, |words| {
                    for p in &pushes {
                        let period = queued[p.index].rule.tiers()[p.tier].period_micros();
                        let tw = tier_mut(&mut words[p.index], p.tier);
                        if p.claim.is_some() && tw[START] == p.window {
                            tw[IN_FLIGHT] -= p.delta;
                            tw[PENDING] += p.delta;
                        } else if tw[START] == p.window + period {
                            tw[PENDING_PREVIOUS] += p.delta;
                        }
                    }
                    for w in words.iter_mut() {
                        w[FLAGS] |= QUEUED;
                    }
                });
                drop(scorer);
                self.queue
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(queued);
                self.failing.store(true, Ordering::Relaxed);
                self.failed_syncs.fetch_add(1, Ordering::Relaxed);
                Err(err)
            }
        }
    }
}

/// How many permits to claim: what this instance admitted over the time it measured (at least
/// a quarter of an interval, so that a burst does not claim the window), for two intervals.
pub(super) fn wanted(tw: &[u64], now: u64, interval: u64) -> u64 {
    if tw[SINCE] == 0 {
        return 0;
    }
    let elapsed = now.saturating_sub(tw[SINCE_AT]).max(interval / 4).max(1);
    let want = u128::from(tw[SINCE]) * u128::from(2 * interval) / u128::from(elapsed);
    u64::try_from(want).unwrap_or(u64::MAX).max(1)
}

/// One counter a sync pushes to, and, for the current window, the claim it asks for.
pub(super) struct Push {
    index: usize,
    tier: usize,
    window: u64,
    delta: u64,
    /// The claim wanted and the least to keep; `None`: a push to the window before.
    claim: Option<(u64, u64)>,
}

impl Push {
    pub(super) fn only(index: usize, tier: usize, window: u64, delta: u64) -> Self {
        Self {
            index,
            tier,
            window,
            delta,
            claim: None,
        }
    }
}

/// What Redis answered for one push.
pub(super) struct Heard {
    count: u64,
    others: u64,
    claim: u64,
    claimers: u64,
    previous: u64,
}

/// Applies what Redis answered for `p` to the key's words `w`: the counts, and the claim,
/// usable until two intervals after Redis granted it at `at`.
pub(super) fn settle(
    q: &Queued,
    w: &mut [u64],
    p: &Push,
    heard: &Heard,
    at: u64,
    now: u64,
    interval: u64,
) {
    let period = q.rule.tiers()[p.tier].period_micros();
    let tw = tier_mut(w, p.tier);
    if tw[START] == p.window + period {
        // The count of the window before (or of the current one, which ended meanwhile).
        tw[PREVIOUS] = heard.count + tw[PENDING_PREVIOUS];
        return;
    }
    if p.claim.is_none() || tw[START] != p.window {
        return;
    }
    tw[IN_FLIGHT] -= p.delta;
    tw[COUNT] = heard.count;
    tw[OTHERS] = heard.others;
    tw[CLAIM] = heard.claim;
    tw[CLAIM_UNTIL] = at + 2 * interval;
    tw[CLAIMERS] = heard.claimers;
    if q.shape.sliding {
        tw[PREVIOUS] = heard.previous + tw[PENDING_PREVIOUS];
    }
    // The rate is measured afresh from the sync: what was admitted since it was sent.
    tw[SINCE] = tw[PENDING];
    tw[SINCE_AT] = if tw[PENDING] > 0 { now } else { 0 };
}
