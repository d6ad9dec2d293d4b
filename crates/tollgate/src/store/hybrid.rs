//! The hybrid (two-layer) store: every instance decides in its own memory, and a background
//! task pushes what it admitted to Redis and reads the global counts back, every sync interval
//! and sooner when a key needs it. Decisions never wait for Redis.
//!
//! It counts fixed windows and sliding window counters: counts add up across instances (one
//! Redis counter per key, tier and window, incremented by each instance's pushes), where a
//! bucket's or a log's state does not.
//!
//! Accuracy. With each push, an instance claims permits of the window for itself (see
//! `claim` in `lua/counters.lua`): Redis grants a claim only from what the limit leaves once
//! the count and the other instances' live claims are taken out, at most an even share of it,
//! and sized to what the instance admitted over the last two sync intervals. Between syncs an
//! instance admits within its claim, and beyond it at most `unclaimed` permits (see
//! [`HybridConfig::max_unclaimed`]) that nobody reserved: so that a key new to it, or a burst,
//! is admitted at once. Claims keep the count plus every claim within the limit, so only the
//! unclaimed permits can exceed it: in any window the instances together admit at most
//! `limit + Σ unclaimed` (by default `limit + max(2 x instances, about 1% of the limit)`). When
//! an instance runs out of claim and unclaimed permits it syncs at once, and the check waits
//! for that sync, within the Redis store's timeout, before it is decided again: a denial means
//! the budget is spent, or the claim did not come in time (`check_now`, which never waits,
//! denies meanwhile, with a retry of a few milliseconds). Claims an instance no longer uses
//! lapse after three sync intervals: until then the others may admit less than the limit.
//!
//! When syncs fail for longer than two intervals, each rule's failure policy decides (what was
//! admitted meanwhile is pushed when Redis answers again: nothing is lost).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLockReadGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::guard::{GuardPlan, Guarded, StoreFailures};
use super::redis::{CounterItem, RedisStore, StoreTime, counter_key, packed};
use super::slots::{Slots, Versions};
use super::table::{Access, Bounds, Score, Table, WhenFull};
use super::{LocalStore, Planned, Store};
use crate::algorithm::Tier;
use crate::algorithm::Verdict;
use crate::algorithm::{Algorithm, Attempt, Decide, FixedWindow, SlidingWindow};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Decisions, Source};
use crate::error::Error;
use crate::rule::Rule;

/// Settings of a [`HybridStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HybridConfig {
    /// How often the keys used since the last sync are pushed to Redis and read back, and
    /// their claims renewed (default 1 s; at least 1 ms). Claims lapse after three intervals.
    pub sync_interval: Duration,
    /// The most permits of a key one instance admits per window beyond its claim, before a
    /// sync counts them: what the instances together may admit over a limit. `None` (the
    /// default): 2, or a hundredth of the limit shared by the instances claiming the key,
    /// whichever is more. `Some(0)`: never over the limit, but a key's first check in a
    /// window on an instance waits for a claim (a sync: a Redis round trip).
    pub max_unclaimed: Option<u64>,
    /// Instances expected to share the keys (default 1): until a sync says how many claim a
    /// key, the default `max_unclaimed` divides its hundredth of the limit by this.
    pub instances: u32,
    /// The most keys held in this process (default a million).
    pub max_keys: usize,
}

impl Default for HybridConfig {
    fn default() -> Self {
        Self {
            sync_interval: Duration::from_secs(1),
            max_unclaimed: None,
            instances: 1,
            max_keys: 1_000_000,
        }
    }
}

impl HybridConfig {
    /// Checks the settings.
    ///
    /// # Errors
    /// [`Error::Store`] naming a setting out of range.
    pub fn validate(&self) -> Result<(), Error> {
        let invalid = |message: &str| {
            Err(Error::Store {
                message: message.into(),
                transient: false,
            })
        };
        if self.sync_interval < Duration::from_millis(1) {
            return invalid("sync_interval: must be at least 1 ms");
        }
        if self.sync_interval > Duration::from_secs(3_600) {
            return invalid("sync_interval: must be at most an hour");
        }
        if self.instances == 0 {
            return invalid("instances: must be at least 1");
        }
        if self.max_keys == 0 {
            return invalid("max_keys: must be at least 1");
        }
        Ok(())
    }
}

/// What a hybrid store did, since it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HybridStats {
    /// Items decided in this process.
    pub decisions: u64,
    /// Items found beyond this instance's claim and unclaimed permits, before a sync brought
    /// more (checks then wait for that sync; `check_now` denies them).
    pub allowance_denials: u64,
    /// Syncs that answered.
    pub syncs: u64,
    /// Calls made to Redis: one per sync on a single server, one per slot on a cluster.
    pub calls: u64,
    /// Syncs that failed.
    pub failed_syncs: u64,
}

/// Limits shared by every instance through Redis, decided in each instance's memory and
/// synced in the background; see the module documentation for how far instances may exceed
/// a limit. Cheap to clone: clones share the table and the sync task.
#[derive(Clone)]
pub struct HybridStore {
    inner: Arc<Inner>,
}

struct Inner {
    redis: RedisStore,
    config: HybridConfig,
    /// This instance's name in the claims: random, new for each store.
    id: Vec<u8>,
    table: Table,
    slots: Slots,
    /// Keys used since the last sync, each once (marked `QUEUED` in its words).
    queue: Mutex<Vec<Queued>>,
    wake: Arc<Notify>,
    /// Set when a check ran out of claim: the sync it wakes runs at once, not after the
    /// least gap, since checks wait for it (see [`Store::check`]).
    urgent: Arc<AtomicBool>,
    /// Counts the syncs done, answered or not: checks waiting for a claim watch it (the
    /// count is read first, a load, so that a check that needs no claim pays nothing more).
    synced: tokio::sync::watch::Sender<u64>,
    /// The same count, to read without a lock.
    syncs_done: AtomicU64,
    /// Reads this process's time for the offset to Redis's clock and for staleness.
    clock: SystemClock,
    /// Redis's clock minus this process's (µs), as of the last sync; 0 on the caller's time.
    offset: AtomicI64,
    /// The latest time a check was decided at (µs, on the counters' clock).
    last_now: AtomicU64,
    /// This process's time (µs) of the last sync that answered.
    last_ok: AtomicU64,
    /// Instances that synced within three intervals, as the last sync heard (0: none yet).
    instances: AtomicU64,
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

/// The table accesses of `items`: each key in its rule's slot, with its words.
fn accesses<'a>(items: &[Planned<'a, HybridPlan>]) -> Vec<Access<'a>> {
    items
        .iter()
        .map(|i| Access {
            slot: i.plan.shape.slot,
            key: i.key,
            words: i.plan.shape.words,
        })
        .collect()
}

#[derive(Debug)]
struct Shape {
    slot: u32,
    words: usize,
    sliding: bool,
    /// `tg:c:<rule>:<fingerprint>:`
    prefix: Vec<u8>,
    /// What a denial for want of a claim asks to wait (µs): about one early sync.
    retry: u64,
}

impl Guarded for HybridPlan {
    fn guard(&self) -> &GuardPlan {
        &self.guard
    }
}

// A key's words: flags, then per tier:
const FLAGS: usize = 0;
const KEY_WORDS: usize = 1;
/// The start of the current window (µs; 0: none yet).
const START: usize = 0;
/// The window's count, as last answered.
const COUNT: usize = 1;
/// The other instances' live claims on the window, as last answered.
const OTHERS: usize = 2;
/// The count of the window before, as last known, with this instance's pushes not sent yet.
const PREVIOUS: usize = 3;
/// Admitted here in the window, not sent yet.
const PENDING: usize = 4;
/// Sent in a sync that has not answered yet.
const IN_FLIGHT: usize = 5;
/// This instance's claim: what it may admit beyond `COUNT`, as last answered.
const CLAIM: usize = 6;
/// Until when the claim may be used (µs, on the counters' clock): Redis keeps it a sync
/// interval longer.
const CLAIM_UNTIL: usize = 7;
/// Asked for here since `SINCE_AT` (admitted, or denied for want of a claim), for the rate a
/// claim is sized to.
const SINCE: usize = 8;
const SINCE_AT: usize = 9;
/// Admitted here in the window before, not sent yet.
const PENDING_PREVIOUS: usize = 10;
/// Instances claiming the key, this one included, as last answered (0: not heard yet).
const CLAIMERS: usize = 11;
const TIER_WORDS: usize = 12;

const QUEUED: u64 = 1;

/// The sorted set of running instances, by when each last synced.
const INSTANCES_KEY: &[u8] = b"tg:c:instances"; // after the store's key prefix

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
    /// [`Error::Store`] for settings out of range, or outside a Tokio runtime, which the sync
    /// task needs.
    pub fn new(redis: &RedisStore, config: HybridConfig) -> Result<Self, Error> {
        config.validate()?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::Store {
            message: "a hybrid store needs a Tokio runtime for its sync task".into(),
            transient: false,
        })?;
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        let clock = SystemClock::new();
        let inner = Arc::new(Inner {
            redis: redis.clone(),
            config,
            id: instance_id(&clock),
            table: Table::new(Bounds {
                max_keys: config.max_keys,
                max_bytes: usize::MAX,
                shards: (threads * 8).clamp(16, 1_024),
                when_full: WhenFull::Evict,
            }),
            slots: Slots::default(),
            queue: Mutex::new(Vec::new()),
            wake: Arc::new(Notify::new()),
            urgent: Arc::new(AtomicBool::new(false)),
            synced: tokio::sync::watch::Sender::new(0),
            syncs_done: AtomicU64::new(0),
            last_ok: AtomicU64::new(clock.now_micros()),
            instances: AtomicU64::new(0),
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
        runtime.spawn(run(
            Arc::downgrade(&inner),
            inner.wake.clone(),
            inner.urgent.clone(),
        ));
        Ok(Self { inner })
    }

    /// Decides in memory, or by the rules' failure policies while syncs fail; with whether a
    /// key ran out of claim (see [`Inner::decide`]). `again`: the check is decided again after
    /// the sync its starved key woke, its demand counted already.
    fn decide_now(
        &self,
        items: &[Planned<'_, HybridPlan>],
        now: u64,
        max_delay: Option<u64>,
        again: bool,
    ) -> (Decisions, bool) {
        let inner = &*self.inner;
        if inner.stale() {
            let retry = inner.min_gap().as_micros() as u64;
            let decisions = inner.redis.guard().by_policy(items, now, max_delay, retry);
            return (decisions, false);
        }
        inner.decide(items, now, max_delay, again)
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
        let synced = self.inner.sync(false).await;
        self.inner.syncs_done.fetch_add(1, Ordering::Release);
        self.inner.synced.send_modify(|n| *n += 1);
        synced
    }

    /// Keys held in this process now.
    pub fn keys(&self) -> usize {
        self.inner.table.len()
    }

    /// The Redis store it syncs with: its connections, breaker and key prefix.
    pub fn redis(&self) -> &RedisStore {
        &self.inner.redis
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

/// A name for this instance in the claims: its start time and address in memory, hashed, so
/// that two stores of one process, or two processes, differ.
fn instance_id(clock: &SystemClock) -> Vec<u8> {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = foldhash::fast::RandomState::default().build_hasher();
    hasher.write_u64(clock.now_micros());
    hasher.write_u32(std::process::id());
    format!("{:016x}", hasher.finish()).into_bytes()
}

/// The sync task: every interval, or soon after a check asks, until the store is dropped or
/// shut down.
async fn run(inner: Weak<Inner>, wake: Arc<Notify>, urgent: Arc<AtomicBool>) {
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
    /// The least time between two syncs: a twentieth of the interval, 1 to 50 ms.
    fn min_gap(&self) -> Duration {
        (self.config.sync_interval / 20).clamp(Duration::from_millis(1), Duration::from_millis(50))
    }

    fn interval_micros(&self) -> u64 {
        self.config.sync_interval.as_micros() as u64
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

    /// The permits of `tier` this instance may admit beyond its claim: 2, or a hundredth of
    /// its limit shared by the instances running (as the last sync heard, or as configured
    /// before it) or claiming the key (`claimers`), whichever is more; unless configured.
    fn unclaimed(&self, tier: &Tier, claimers: u64) -> u64 {
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
    fn decide(
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
    fn judge(
        &self,
        item: &Planned<'_, HybridPlan>,
        w: &mut [u64],
        now: u64,
        max_delay: Option<u64>,
    ) -> (Decision, Wants) {
        let look = Attempt {
            now,
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

    /// Says this instance runs, pushes the deltas of the queued keys and renews their claims
    /// (or, with `release`, gives the claims up), reads the counts back, and gives each key
    /// what Redis granted. On failure the deltas go back to pending and the keys back to the
    /// queue.
    async fn sync(&self, release: bool) -> Result<(), Error> {
        let queued: Vec<Queued> =
            std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()));
        let now = self.last_now.load(Ordering::Relaxed).max(1);
        let accesses: Vec<Access<'_>> = queued
            .iter()
            .map(|q| Access {
                slot: q.shape.slot,
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
            args: packed([
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
                let args = packed([
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

/// What a check needs of the next sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wants {
    Nothing,
    /// A claim, soon: the instance ran out (an early sync).
    Claim,
    /// A fresh look at the others' claims, at the next sync.
    Look,
}

/// One tier's verdict at `look` with `used` permits in the current window on top of the
/// count heard (and, for a sliding window, the window before).
fn window_verdict(
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

/// How many permits to claim: what this instance admitted over the time it measured (at least
/// a quarter of an interval, so that a burst does not claim the window), for two intervals.
fn wanted(tw: &[u64], now: u64, interval: u64) -> u64 {
    if tw[SINCE] == 0 {
        return 0;
    }
    let elapsed = now.saturating_sub(tw[SINCE_AT]).max(interval / 4).max(1);
    let want = u128::from(tw[SINCE]) * u128::from(2 * interval) / u128::from(elapsed);
    u64::try_from(want).unwrap_or(u64::MAX).max(1)
}

/// One counter a sync pushes to, and, for the current window, the claim it asks for.
struct Push {
    index: usize,
    tier: usize,
    window: u64,
    delta: u64,
    /// The claim wanted and the least to keep; `None`: a push to the window before.
    claim: Option<(u64, u64)>,
}

impl Push {
    fn only(index: usize, tier: usize, window: u64, delta: u64) -> Self {
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
struct Heard {
    count: u64,
    others: u64,
    claim: u64,
    claimers: u64,
    previous: u64,
}

/// Applies what Redis answered for `p` to the key's words `w`: the counts, and the claim,
/// usable until two intervals after Redis granted it at `at`.
fn settle(q: &Queued, w: &mut [u64], p: &Push, heard: &Heard, at: u64, now: u64, interval: u64) {
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

/// Counts `item`'s cost in the demand its key's claims are sized to.
fn demanded(item: &Planned<'_, HybridPlan>, w: &mut [u64], now: u64) {
    for t in 0..item.rule.tiers().len() {
        let tw = tier_mut(w, t);
        if tw[SINCE_AT] == 0 {
            tw[SINCE_AT] = now;
        }
        tw[SINCE] += item.cost;
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

/// Moves each tier of `item`'s key to the window of `now`: the current window's count (and
/// what this instance admitted in it) becomes the one before; the new window has no claim yet.
fn roll(item: &Planned<'_, HybridPlan>, w: &mut [u64], now: u64) {
    for (t, tier) in item.rule.tiers().iter().enumerate() {
        let period = tier.period_micros();
        let window = now - now % period;
        let tw = tier_mut(w, t);
        if tw[START] >= window {
            continue;
        }
        let (previous, pending) = if tw[START] + period == window {
            (tw[COUNT] + tw[PENDING] + tw[IN_FLIGHT], tw[PENDING])
        } else {
            (0, 0)
        };
        let mut fresh = [0; TIER_WORDS];
        fresh[START] = window;
        fresh[PREVIOUS] = previous;
        fresh[PENDING_PREVIOUS] = pending;
        // How fast this instance admits, and how many instances claim, carry over.
        fresh[SINCE] = tw[SINCE];
        fresh[SINCE_AT] = tw[SINCE_AT];
        fresh[CLAIMERS] = tw[CLAIMERS];
        tw.copy_from_slice(&fresh);
    }
}

/// Whether `rule` counts a sliding window (else a fixed one); an error for an algorithm the
/// hybrid store cannot hold. A hit counter counts as a fixed window: admitted hits only.
fn sliding(rule: &Rule) -> Result<bool, Error> {
    super::no_calendar(rule, "hybrid")?;
    match rule.algorithm() {
        Algorithm::FixedWindow | Algorithm::HitCounter => Ok(false),
        Algorithm::SlidingWindow => Ok(true),
        _ => Err(super::unsupported(
            rule,
            "hybrid",
            "counts that add up across instances",
        )),
    }
}

impl HybridStore {
    /// Whether a hybrid store can hold `rule` (as planning it would say), without one: a
    /// fixed window or a sliding window counter, with a local share on failure that fits in
    /// memory.
    ///
    /// # Errors
    /// [`Error::Rule`] saying which algorithms the hybrid store holds.
    pub fn holds(rule: &Rule) -> Result<(), Error> {
        sliding(rule)?;
        super::guard::Guard::holds(rule)
    }
}

impl Store for HybridStore {
    type Plan = HybridPlan;

    fn plan(&self, rule: &Rule) -> Result<HybridPlan, Error> {
        let sliding = sliding(rule)?;
        let shape = Shape {
            slot: self.inner.slots.slot(rule)?,
            words: KEY_WORDS + TIER_WORDS * rule.tiers().len(),
            sliding,
            prefix: self.inner.redis.counter_prefix(rule),
            retry: self.inner.min_gap().as_micros() as u64,
        };
        Ok(HybridPlan {
            shape: Arc::new(shape),
            guard: self.inner.redis.guard().plan(rule)?,
        })
    }

    /// Decides in memory; a check denied only because this instance holds no claim for a key
    /// yet (its first check in a window with `max_unclaimed: Some(0)`, or a burst past its
    /// claim) waits for the sync it woke, within the Redis store's timeout, and is decided
    /// again: a denial then means the budget is spent, or the claim did not come in time.
    fn check(
        &self,
        items: &[Planned<'_, HybridPlan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> impl Future<Output = Result<Decisions, Error>> + Send {
        let inner = &*self.inner;
        // Read before the decision wakes the sync, so that its end is seen.
        let seen = inner.syncs_done.load(Ordering::Acquire);
        let (decisions, starved) = self.decide_now(items, now, max_delay, false);
        async move {
            if !starved {
                return Ok(decisions);
            }
            let mut decisions = decisions;
            let mut synced = inner.synced.subscribe();
            if inner.syncs_done.load(Ordering::Acquire) != seen {
                // A sync ended between the decision and now: it may have brought the claim.
                synced.mark_changed();
            }
            let deadline = tokio::time::Instant::now() + inner.redis.guard().config().timeout;
            while let Ok(Ok(())) = tokio::time::timeout_at(deadline, synced.changed()).await {
                let (again, starved) = self.decide_now(items, now, max_delay, true);
                decisions = again;
                if !starved {
                    break;
                }
            }
            Ok(decisions)
        }
    }

    async fn shutdown(&self) {
        self.inner.stopped.store(true, Ordering::Relaxed);
        self.inner.wake.notify_one();
        if let Err(err) = self.inner.sync(true).await {
            tracing::warn!(error = %err, "hybrid store could not push its last counts");
        }
    }

    /// Forgets the keys here (their counts not pushed yet included) and deletes their
    /// windows' counters in Redis (the window of now, and those either side of it).
    fn settles(&self) -> Result<(), Error> {
        Err(no_reservations())
    }

    async fn keep_reservation(
        &self,
        _record: &super::ReservationRecord,
        _now: u64,
    ) -> Result<(), Error> {
        Err(no_reservations())
    }

    async fn take_reservation(
        &self,
        _id: &str,
        _now: u64,
    ) -> Result<Option<super::ReservationRecord>, Error> {
        Err(no_reservations())
    }

    async fn expired_reservations(
        &self,
        _now: u64,
        _limit: usize,
    ) -> Result<Vec<super::ReservationRecord>, Error> {
        Ok(Vec::new())
    }

    async fn settle(
        &self,
        _items: &[Planned<'_, HybridPlan>],
        _now: u64,
        _settle: super::Settle,
    ) -> Result<Decisions, Error> {
        Err(no_reservations())
    }

    async fn reset(&self, items: &[Planned<'_, HybridPlan>], now: u64) -> Result<(), Error> {
        let inner = &*self.inner;
        let now = inner.store_time(now);
        let accesses = accesses(items);
        inner
            .table
            .access(&accesses, now, &inner.scorer(), |words| {
                for w in words {
                    w.fill(0);
                }
            });
        for item in items {
            let names = window_counters(&item.plan.shape.prefix, item.key, item.rule, now);
            inner.redis.delete(&names).await?;
        }
        Ok(())
    }
}

/// The counters of `key` of `rule` in Redis around `now`: each tier's window of now and the
/// windows either side of it, all in the key's slot.
pub(crate) fn window_counters(prefix: &[u8], key: &[u8], rule: &Rule, now: u64) -> Vec<Vec<u8>> {
    let mut names = Vec::new();
    for (tier, t) in rule.tiers().iter().enumerate() {
        let window = now / t.period_micros();
        for w in window.saturating_sub(1)..=window + 1 {
            names.push(counter_key(prefix, key, tier, w));
        }
    }
    names
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
        self.decide_now(items, now, max_delay, false).0
    }
}

/// Judges entries for the table: keys with counts to push stay; keys whose windows (and the
/// next, which a sliding window weighs them in) are over may go; otherwise the more a key has
/// left of its limit, the less its counts matter. Forgetting a claim only leaves it unused
/// until it lapses.
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
            let left = tier.limit().saturating_sub(tw[COUNT]);
            least = least.min(left as f64 / tier.limit() as f64);
        }
        live.then_some(least)
    }
}

/// Why the hybrid store takes no reports or reservations.
fn no_reservations() -> Error {
    Error::Unsupported {
        what: "the hybrid store counts the permits it admits, so it takes no reports or \
               reservations: use the strict Redis store for rules that do"
            .into(),
    }
}
