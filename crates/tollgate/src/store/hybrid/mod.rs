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

mod decide;
mod sync;

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLockReadGuard};
use std::time::Duration;

use tokio::sync::Notify;

use super::guard::{GuardPlan, Guarded, StoreFailures};
use super::redis::{CounterItem, RedisStore, StoreTime, counter_key};
use super::table::{Access, Bounds, Score, Table, WhenFull};
use super::tags::{Tags, Versions};
use super::{LocalStore, Planned, Store};
use crate::algorithm::Tier;
use crate::algorithm::Verdict;
use crate::algorithm::{Algorithm, Attempt, Decide, FixedWindow, Micros, SlidingWindow};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Decisions, Source};
use crate::error::Error;
use crate::layout::packed;
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
    tags: Tags,
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

/// The table accesses of `items`: each key in its rule's tag, with its words.
fn accesses<'a>(items: &[Planned<'a, HybridPlan>]) -> Vec<Access<'a>> {
    items
        .iter()
        .map(|i| Access {
            tag: i.plan.shape.tag,
            key: i.key,
            words: i.plan.shape.words,
        })
        .collect()
}

#[derive(Debug)]
struct Shape {
    tag: u32,
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
            tags: Tags::default(),
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
        runtime.spawn(sync::run(
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
            tag: self.inner.tags.tag(rule)?,
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
/// windows either side of it, all in the key's Cluster slot.
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
    tags: RwLockReadGuard<'a, Versions>,
}

impl Score for Scorer<'_> {
    fn score(&self, tag: u32, words: &mut [u64], now: u64) -> Option<f64> {
        let rule = self.tags.newest(tag)?;
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
