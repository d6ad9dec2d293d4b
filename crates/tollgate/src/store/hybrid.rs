//! The hybrid (two-layer) store: every instance decides in its own memory, from the global
//! count it last read from Redis and what it admitted since, and a background task pushes its
//! deltas and reads the global counts back, every sync interval and sooner when a key needs
//! it. Decisions never wait for Redis.
//!
//! It counts fixed windows and sliding window counters: counts add up across instances (one
//! Redis counter per key, tier and window, incremented by each instance's delta), where a
//! bucket's or a log's state does not.
//!
//! Accuracy. At each sync an instance learns its share of a key's traffic (its delta over the
//! global growth since its last sync, averaged over syncs) and may admit, before its next sync, all that was left
//! when it is alone, and half its share of it when it is not (the others still hold
//! allowances from their own syncs, when more was left), and at most `max_unsynced` permits. When that allowance runs out it asks for an early sync
//! and denies meanwhile (a few milliseconds). So instances together overshoot a limit by at
//! most `instances x max_unsynced` permits per window; while their shares add up to one and
//! what is left does not halve between two syncs, not at all but for one permit each per sync
//! near the limit. A key new to an instance starts as if its share were `1 / instances`.
//!
//! When syncs fail for longer than two intervals, each rule's failure policy decides (what was
//! admitted meanwhile is pushed when Redis answers again: nothing is lost).

use std::fmt;
use std::future::{Future, ready};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLockReadGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::guard::{GuardPlan, Guarded, StoreFailures};
use super::redis::{RedisStore, StoreTime, counter_prefix, packed};
use super::slots::{Slots, Versions};
use super::table::{Access, Bounds, Score, Table, WhenFull};
use super::{LocalStore, Planned, Store};
use crate::algorithm::{Algorithm, Attempt, Decide, FixedWindow, SlidingWindow};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Decisions, Source, Verdict};
use crate::error::Error;
use crate::rule::{Rule, Tier};

/// Settings of a [`HybridStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HybridConfig {
    /// How often the keys used since the last sync are pushed to Redis and read back
    /// (default 1 s).
    pub sync_interval: Duration,
    /// The most permits of a key one instance admits beyond what Redis has seen; `None`
    /// (the default) caps it only by the instance's share of what was left.
    pub max_unsynced: Option<u64>,
    /// Instances expected to share the keys (default 1): a key new to this instance starts
    /// with this share of its limit.
    pub instances: u32,
    /// The most keys held in this process (default a million).
    pub max_keys: usize,
}

impl Default for HybridConfig {
    fn default() -> Self {
        Self {
            sync_interval: Duration::from_secs(1),
            max_unsynced: None,
            instances: 1,
            max_keys: 1_000_000,
        }
    }
}

/// What a hybrid store did, since it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HybridStats {
    /// Items decided in this process.
    pub decisions: u64,
    /// Items denied because this instance's allowance ran out before a sync.
    pub allowance_denials: u64,
    /// Syncs that answered.
    pub syncs: u64,
    /// Calls made to Redis: one per sync on a single server, one per slot on a cluster.
    pub calls: u64,
    /// Syncs that failed.
    pub failed_syncs: u64,
}

/// Limits shared by every instance through Redis, decided in each instance's memory and
/// synced in the background; see the module documentation for the bound on how far instances
/// may overshoot. Cheap to clone: clones share the table and the sync task.
#[derive(Clone)]
pub struct HybridStore {
    inner: Arc<Inner>,
}

struct Inner {
    redis: RedisStore,
    config: HybridConfig,
    table: Table,
    slots: Slots,
    /// Keys used since the last sync, each once (marked `QUEUED` in its words).
    queue: Mutex<Vec<Queued>>,
    wake: Arc<Notify>,
    /// Reads this process's time for the offset to Redis's clock and for staleness.
    clock: SystemClock,
    /// Redis's clock minus this process's (µs), as of the last sync; 0 on the caller's time.
    offset: AtomicI64,
    /// The latest time a check was decided at (µs, on the counters' clock).
    last_now: AtomicU64,
    /// This process's time (µs) of the last sync that answered.
    last_ok: AtomicU64,
    failing: AtomicBool,
    stopped: AtomicBool,
    decisions: AtomicU64,
    allowance_denials: AtomicU64,
    syncs: AtomicU64,
    calls: AtomicU64,
    failed_syncs: AtomicU64,
    /// Of the failed syncs, those Redis did not answer in time.
    timed_out_syncs: AtomicU64,
}

/// A key to sync: its rule, its plan and its bytes.
struct Queued {
    rule: Rule,
    shape: Arc<Shape>,
    key: Box<[u8]>,
}

/// What a rule is in a hybrid store.
#[derive(Debug, Clone)]
pub struct HybridPlan {
    shape: Arc<Shape>,
    guard: GuardPlan,
}

#[derive(Debug)]
struct Shape {
    slot: u32,
    words: usize,
    sliding: bool,
    /// `tg:c:<rule>:<fingerprint>:`
    prefix: Vec<u8>,
    /// What a denial for want of allowance asks to wait (µs): about one early sync.
    retry: u64,
}

impl Guarded for HybridPlan {
    fn guard(&self) -> &GuardPlan {
        &self.guard
    }
}

// A key's words: flags, this instance's share of the key's traffic (of `ONE`), then per tier:
const FLAGS: usize = 0;
const SHARE: usize = 1;
const KEY_WORDS: usize = 2;
/// The start of the current window (µs; 0: none yet).
const START: usize = 0;
/// The global count of the current window, as last read.
const GLOBAL: usize = 1;
/// The count of the window before, as last read, with this instance's deltas not sent yet.
const PREVIOUS: usize = 2;
/// Admitted here in the current window, not sent yet.
const PENDING: usize = 3;
/// Sent in a sync that has not answered yet.
const IN_FLIGHT: usize = 4;
/// How many permits this instance may hold unsynced in the current window.
const ALLOWANCE: usize = 5;
/// Admitted here in the window before, not sent yet.
const PENDING_PREVIOUS: usize = 6;
/// When this instance last heard the current window's count (µs, on the counters' clock).
const HEARD_AT: usize = 7;
const TIER_WORDS: usize = 8;

const QUEUED: u64 = 1;
const ONE: u64 = 1 << 20;

impl fmt::Debug for HybridStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HybridStore")
            .field("config", &self.inner.config)
            .field("keys", &self.inner.table.len())
            .field("stats", &self.stats())
            .finish()
    }
}

impl HybridStore {
    /// A hybrid store syncing with the Redis of `redis` (its connections, clock and failure
    /// handling), and its background sync task.
    ///
    /// # Errors
    /// [`Error::Store`] outside a Tokio runtime, which the sync task needs.
    pub fn new(redis: &RedisStore, config: HybridConfig) -> Result<Self, Error> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::Store {
            message: "a hybrid store needs a Tokio runtime for its sync task".into(),
            transient: false,
        })?;
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        let clock = SystemClock::new();
        let inner = Arc::new(Inner {
            redis: redis.clone(),
            config,
            table: Table::new(Bounds {
                max_keys: config.max_keys,
                max_bytes: usize::MAX,
                shards: (threads * 8).clamp(16, 1_024),
                when_full: WhenFull::Evict,
            }),
            slots: Slots::default(),
            queue: Mutex::new(Vec::new()),
            wake: Arc::new(Notify::new()),
            last_ok: AtomicU64::new(clock.now_micros()),
            clock,
            offset: AtomicI64::new(0),
            last_now: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            decisions: AtomicU64::new(0),
            allowance_denials: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            failed_syncs: AtomicU64::new(0),
            timed_out_syncs: AtomicU64::new(0),
        });
        runtime.spawn(run(Arc::downgrade(&inner), inner.wake.clone()));
        Ok(Self { inner })
    }

    /// What the store did so far.
    pub fn stats(&self) -> HybridStats {
        let i = &self.inner;
        HybridStats {
            decisions: i.decisions.load(Ordering::Relaxed),
            allowance_denials: i.allowance_denials.load(Ordering::Relaxed),
            syncs: i.syncs.load(Ordering::Relaxed),
            calls: i.calls.load(Ordering::Relaxed),
            failed_syncs: i.failed_syncs.load(Ordering::Relaxed),
        }
    }

    /// Pushes what is pending and reads the counts back now, rather than at the next
    /// interval.
    ///
    /// # Errors
    /// [`Error::Store`] when Redis did not answer; nothing is lost, the next sync retries.
    pub async fn sync(&self) -> Result<(), Error> {
        self.inner.sync().await
    }

    /// Keys held in this process now.
    pub fn keys(&self) -> usize {
        self.inner.table.len()
    }

    /// Whether syncs have failed for so long that each rule's failure policy decides.
    pub fn degraded(&self) -> bool {
        self.inner.stale()
    }

    /// The syncs that failed so far: Redis's errors, and its silences past the sync's timeout
    /// (the sync interval, at most a second).
    pub fn failures(&self) -> StoreFailures {
        let i = &self.inner;
        let timeouts = i.timed_out_syncs.load(Ordering::Relaxed);
        StoreFailures {
            errors: i
                .failed_syncs
                .load(Ordering::Relaxed)
                .saturating_sub(timeouts),
            timeouts,
        }
    }
}

/// The sync task: every interval, or soon after a check asks, until the store is dropped or
/// shut down.
async fn run(inner: Weak<Inner>, wake: Arc<Notify>) {
    let Some((interval, gap)) = inner
        .upgrade()
        .map(|i| (i.config.sync_interval, i.min_gap()))
    else {
        return;
    };
    loop {
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = wake.notified() => tokio::time::sleep(gap).await,
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.stopped.load(Ordering::Relaxed) {
            return;
        }
        let was_failing = inner.failing.load(Ordering::Relaxed);
        match inner.sync().await {
            Ok(()) if was_failing => tracing::info!("hybrid store syncs with redis again"),
            Err(err) if !was_failing => {
                tracing::warn!(error = %err, "hybrid store cannot sync with redis; counts kept to push later");
            }
            _ => {}
        }
    }
}

impl Inner {
    /// The least time between two syncs: a twentieth of the interval, 1 to 50 ms.
    fn min_gap(&self) -> Duration {
        (self.config.sync_interval / 20).clamp(Duration::from_millis(1), Duration::from_millis(50))
    }

    /// `now` on the limiter's clock, as the counters' clock reads it.
    fn store_time(&self, now: u64) -> u64 {
        now.saturating_add_signed(self.offset.load(Ordering::Relaxed))
            .max(1)
    }

    /// Whether syncs have failed for too long to decide by the counts held (the failure policy
    /// does).
    fn stale(&self) -> bool {
        let patience = 2 * self.config.sync_interval + Duration::from_secs(1);
        self.failing.load(Ordering::Relaxed)
            && self
                .clock
                .now_micros()
                .saturating_sub(self.last_ok.load(Ordering::Relaxed))
                > patience.as_micros() as u64
    }

    fn scorer(&self) -> Scorer<'_> {
        Scorer {
            slots: self.slots.read(),
        }
    }

    /// This instance's allowance in a window that starts (see [`claim`]).
    fn fresh_allowance(&self, tier: &Tier, share: u64) -> u64 {
        let allowance = claim(tier.limit(), tier.limit() / 2, share);
        self.config
            .max_unsynced
            .map_or(allowance, |cap| allowance.min(cap))
    }

    /// Decides `items` all-or-nothing in memory, queueing the keys it admits for the next
    /// sync, and waking the sync task when an allowance ran out.
    fn decide(
        &self,
        items: &[Planned<'_, HybridPlan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> Decisions {
        let now = self.store_time(now);
        self.last_now.fetch_max(now, Ordering::Relaxed);
        let accesses: Vec<Access<'_>> = items
            .iter()
            .map(|i| Access {
                slot: i.plan.shape.slot,
                key: i.key,
                words: i.plan.shape.words,
            })
            .collect();
        let (mut starved, mut queue) = (0, Vec::new());
        let scorer = self.scorer();
        let decisions = self.table.access(&accesses, now, &scorer, |words| {
            let mut decisions = Vec::with_capacity(items.len());
            for (item, w) in items.iter().zip(words.iter_mut()) {
                self.roll(item, w, now);
                let (decision, wants_sync) = judge(item, w, now, max_delay);
                if wants_sync {
                    starved += 1;
                    // The next sync brings this key a new allowance.
                    enqueue(item, w, &mut queue);
                }
                decisions.push(decision.shadow(item.rule.is_shadow()));
            }
            if decisions.iter().all(Decision::allowed) {
                for ((item, w), d) in items.iter().zip(words.iter_mut()).zip(&decisions) {
                    if item.cost > 0 && !d.shadowed() {
                        for t in 0..item.rule.tiers().len() {
                            tier_mut(w, t)[PENDING] += item.cost;
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
            self.wake.notify_one();
        }
        Decisions::many(decisions)
    }

    /// Moves each tier of `item`'s key to the window of `now`: the current window's count
    /// becomes the one before, and a new allowance starts.
    fn roll(&self, item: &Planned<'_, HybridPlan>, w: &mut [u64], now: u64) {
        if w[SHARE] == 0 {
            w[SHARE] = ONE / u64::from(self.config.instances.max(1));
        }
        let share = w[SHARE];
        for (t, tier) in item.rule.tiers().iter().enumerate() {
            let period = tier.period_micros();
            let window = now - now % period;
            let allowance = self.fresh_allowance(tier, share);
            let tw = tier_mut(w, t);
            if tw[START] >= window {
                continue;
            }
            let (previous, pending) = if tw[START] + period == window {
                (tw[GLOBAL] + tw[PENDING] + tw[IN_FLIGHT], tw[PENDING])
            } else {
                (0, 0)
            };
            tw.copy_from_slice(&[window, 0, previous, 0, 0, allowance, pending, 0]);
        }
    }

    /// Pushes the deltas of the queued keys, reads the counts back, and gives each key its new
    /// allowance. On failure the deltas go back to pending and the keys back to the queue.
    async fn sync(&self) -> Result<(), Error> {
        let queued: Vec<Queued> =
            std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()));
        if queued.is_empty() {
            self.last_ok
                .store(self.clock.now_micros(), Ordering::Relaxed);
            self.failing.store(false, Ordering::Relaxed);
            return Ok(());
        }
        let now = self.last_now.load(Ordering::Relaxed).max(1);
        let accesses: Vec<Access<'_>> = queued
            .iter()
            .map(|q| Access {
                slot: q.shape.slot,
                key: &q.key,
                words: q.shape.words,
            })
            .collect();
        let mut sends: Vec<Push> = Vec::new();
        self.table.access(&accesses, now, &self.scorer(), |words| {
            for (index, (q, w)) in queued.iter().zip(words.iter_mut()).enumerate() {
                w[FLAGS] &= !QUEUED;
                for (tier, t) in q.rule.tiers().iter().enumerate() {
                    let tw = tier_mut(w, tier);
                    if tw[START] == 0 {
                        continue;
                    }
                    let delta = std::mem::take(&mut tw[PENDING]);
                    tw[IN_FLIGHT] += delta;
                    sends.push(Push::new(index, tier, tw[START], delta, true));
                    if q.shape.sliding {
                        let previous = std::mem::take(&mut tw[PENDING_PREVIOUS]);
                        let window = tw[START] - t.period_micros();
                        sends.push(Push::new(index, tier, window, previous, false));
                    }
                }
            }
        });
        let keys: Vec<Vec<u8>> = sends
            .iter()
            .map(|s| {
                let q = &queued[s.index];
                let period = q.rule.tiers()[s.tier].period_micros();
                counter_key(&q.shape.prefix, &q.key, s.tier, s.window / period)
            })
            .collect();
        let args: Vec<Vec<u8>> = sends
            .iter()
            .map(|s| {
                let period = queued[s.index].rule.tiers()[s.tier].period_micros();
                // Kept through the next window, which a sliding window weighs it in.
                let ttl = (s.window + 2 * period).saturating_sub(now) / 1_000 + 1_000;
                packed([s.delta as f64, ttl as f64])
            })
            .collect();
        let local = self.clock.now_micros();
        let timeout = self.config.sync_interval.min(Duration::from_secs(1));
        let answer = match tokio::time::timeout(timeout, self.redis.add(&keys, &args)).await {
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
                if self.redis.time() == StoreTime::Server {
                    let offset = answer.time as i64 - local as i64;
                    self.offset.store(offset, Ordering::Relaxed);
                }
                self.table.access(&accesses, now, &scorer, |words| {
                    for (s, &count) in sends.iter().zip(&answer.values) {
                        let q = &queued[s.index];
                        settle(&self.config, q, &mut words[s.index], s, count as u64, now);
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
                    for s in &sends {
                        let period = queued[s.index].rule.tiers()[s.tier].period_micros();
                        let tw = tier_mut(&mut words[s.index], s.tier);
                        if s.current && tw[START] == s.window {
                            tw[IN_FLIGHT] -= s.delta;
                            tw[PENDING] += s.delta;
                        } else if tw[START] == s.window + period {
                            tw[PENDING_PREVIOUS] += s.delta;
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

/// One counter a sync pushes (or, with no delta, reads).
struct Push {
    index: usize,
    tier: usize,
    window: u64,
    delta: u64,
    /// The key's current window; else the one before, for a sliding window.
    current: bool,
}

impl Push {
    fn new(index: usize, tier: usize, window: u64, delta: u64, current: bool) -> Self {
        Self {
            index,
            tier,
            window,
            delta,
            current,
        }
    }
}

/// A counter's name: `tg:c:<rule>:<fingerprint>:<key length>:{k<key>}:<tier>:<window>`.
fn counter_key(prefix: &[u8], key: &[u8], tier: usize, window: u64) -> Vec<u8> {
    super::redis::counter_key(prefix, key, tier, window)
}

/// Applies the count Redis answered for `s` to the key's words `w`, and gives the tier a
/// new allowance: this instance's share of what is left.
fn settle(config: &HybridConfig, q: &Queued, w: &mut [u64], s: &Push, count: u64, now: u64) {
    let tier = &q.rule.tiers()[s.tier];
    let period = tier.period_micros();
    let share = w[SHARE];
    let tw = tier_mut(w, s.tier);
    if tw[START] == s.window + period {
        // The count of the window before (or of the current one, which ended meanwhile).
        tw[PREVIOUS] = count + tw[PENDING_PREVIOUS];
        return;
    }
    if !s.current || tw[START] != s.window {
        return;
    }
    let growth = count.saturating_sub(tw[GLOBAL]);
    // What the others admitted since this instance last heard the count, per µs: they hold
    // about half a sync interval of it unsent at any time.
    let others = growth.saturating_sub(s.delta);
    let heard = std::mem::replace(&mut tw[HEARD_AT], now);
    let unseen = match now.checked_sub(heard) {
        Some(elapsed) if heard > 0 && elapsed > 0 => {
            let half = config.sync_interval.as_micros() as u64 / 2;
            (u128::from(others) * u128::from(half) / u128::from(elapsed)) as u64
        }
        _ => 0,
    };
    tw[IN_FLIGHT] -= s.delta;
    tw[GLOBAL] = count;
    let look = Attempt {
        now,
        cost: 0,
        max_delay: None,
        commit: false,
    };
    let used = count + tw[PENDING] + tw[IN_FLIGHT];
    let left = if q.shape.sliding {
        SlidingWindow.decide(tier, &mut [tw[START], tw[PREVIOUS], used], &look)
    } else {
        FixedWindow.decide(tier, &mut [tw[START], used], &look)
    }
    .remaining;
    // A moving average: one sync may see no one else's count by chance.
    let share = if s.tier == 0 && growth > 0 {
        let sample = (s.delta * ONE / growth).min(ONE);
        (share - share / 2 + sample.div_ceil(2)).clamp(ONE / 64, ONE)
    } else {
        share
    };
    let allowance = claim(left, left.saturating_sub(unseen), share);
    let allowance = config
        .max_unsynced
        .map_or(allowance, |cap| allowance.min(cap));
    tw[ALLOWANCE] = tw[PENDING] + tw[IN_FLIGHT] + allowance;
    w[SHARE] = share;
}

/// What an instance with `share` of a key's traffic (of `ONE`) may admit before its next
/// sync, of `left` (as Redis counts) or `seen` (less what the others have admitted and not
/// sent yet, by their recent rate). Alone (above 15/16) it may take all; sharing, its share
/// of what is seen, rounded down, and one permit while its share is one at least.
fn claim(left: u64, seen: u64, share: u64) -> u64 {
    if share >= ONE / 16 * 15 {
        return left;
    }
    let mine = u128::from(seen) * u128::from(share);
    let whole = (mine / u128::from(ONE)) as u64;
    if whole == 0 && mine >= u128::from(ONE) {
        1
    } else {
        whole
    }
}

fn enqueue(item: &Planned<'_, HybridPlan>, w: &mut [u64], queue: &mut Vec<Queued>) {
    if w[FLAGS] & QUEUED == 0 {
        w[FLAGS] |= QUEUED;
        queue.push(Queued {
            rule: item.rule.clone(),
            shape: item.plan.shape.clone(),
            key: item.key.into(),
        });
    }
}

fn tier_mut(w: &mut [u64], tier: usize) -> &mut [u64] {
    &mut w[KEY_WORDS + TIER_WORDS * tier..KEY_WORDS + TIER_WORDS * (tier + 1)]
}

/// One item's decision from its key's words at `now`, as the counts it holds say, and whether
/// it was denied for want of allowance (a sync brings more).
fn judge(
    item: &Planned<'_, HybridPlan>,
    w: &mut [u64],
    now: u64,
    max_delay: Option<u64>,
) -> (Decision, bool) {
    let look = Attempt {
        now,
        cost: item.cost,
        max_delay,
        commit: false,
    };
    let mut starved = false;
    let verdicts: Vec<Verdict> = item
        .rule
        .tiers()
        .iter()
        .enumerate()
        .map(|(t, tier)| {
            let tw = tier_mut(w, t);
            let used = tw[GLOBAL] + tw[PENDING] + tw[IN_FLIGHT];
            let verdict = if item.plan.shape.sliding {
                SlidingWindow.decide(tier, &mut [tw[START], tw[PREVIOUS], used], &look)
            } else {
                FixedWindow.decide(tier, &mut [tw[START], used], &look)
            };
            let unsynced = tw[PENDING] + tw[IN_FLIGHT];
            if verdict.allowed && item.cost > 0 && unsynced + item.cost > tw[ALLOWANCE] {
                starved = true;
                let wait = item.plan.shape.retry;
                return Verdict::deny(verdict.limit, verdict.remaining, verdict.reset_after, wait);
            }
            verdict
        })
        .collect();
    let decision = Decision::merge(item.rule, |i| verdicts[i]).with_source(Source::Hybrid);
    (decision, starved)
}

impl Store for HybridStore {
    type Plan = HybridPlan;

    fn plan(&self, rule: &Rule) -> Result<HybridPlan, Error> {
        let sliding = match rule.algorithm() {
            Algorithm::FixedWindow => false,
            Algorithm::SlidingWindow => true,
            _ => {
                return Err(super::unsupported(
                    rule,
                    "hybrid",
                    "counts that add up across instances",
                ));
            }
        };
        let shape = Shape {
            slot: self.inner.slots.slot(rule)?,
            words: KEY_WORDS + TIER_WORDS * rule.tiers().len(),
            sliding,
            prefix: counter_prefix(rule),
            retry: self.inner.min_gap().as_micros() as u64,
        };
        Ok(HybridPlan {
            shape: Arc::new(shape),
            guard: self.inner.redis.guard().plan(rule)?,
        })
    }

    fn check(
        &self,
        items: &[Planned<'_, HybridPlan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> impl Future<Output = Result<Decisions, Error>> + Send {
        ready(Ok(self.check_now(items, now, max_delay)))
    }

    async fn shutdown(&self) {
        self.inner.stopped.store(true, Ordering::Relaxed);
        self.inner.wake.notify_one();
        if let Err(err) = self.inner.sync().await {
            tracing::warn!(error = %err, "hybrid store could not push its last counts");
        }
    }
}

impl LocalStore for HybridStore {
    fn check_one_now(
        &self,
        item: &Planned<'_, HybridPlan>,
        now: u64,
        max_delay: Option<u64>,
    ) -> Decision {
        self.check_now(std::slice::from_ref(item), now, max_delay)[0]
    }

    fn check_now(
        &self,
        items: &[Planned<'_, HybridPlan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> Decisions {
        if self.inner.stale() {
            let retry = self.inner.min_gap().as_micros() as u64;
            return self
                .inner
                .redis
                .guard()
                .by_policy(items, now, max_delay, retry);
        }
        self.inner.decide(items, now, max_delay)
    }
}

/// Judges entries for the table: keys with counts to push stay; keys whose windows (and the
/// next, which a sliding window weighs them in) are over may go; otherwise the more a key has
/// left of its limit, the less its counts matter.
struct Scorer<'a> {
    slots: RwLockReadGuard<'a, Versions>,
}

impl Score for Scorer<'_> {
    fn score(&self, slot: u32, words: &mut [u64], now: u64) -> Option<f64> {
        let rule = self.slots.newest(slot)?;
        if words[FLAGS] & QUEUED != 0 {
            return Some(-1.0);
        }
        let (mut least, mut live) = (1.0_f64, false);
        for (t, tier) in rule.tiers().iter().enumerate() {
            let tw = tier_mut(words, t);
            if tw[PENDING] + tw[IN_FLIGHT] + tw[PENDING_PREVIOUS] > 0 {
                return Some(-1.0);
            }
            live |= tw[START] + 2 * tier.period_micros() > now;
            let left = tier.limit().saturating_sub(tw[GLOBAL]);
            least = least.min(left as f64 / tier.limit() as f64);
        }
        live.then_some(least)
    }
}
