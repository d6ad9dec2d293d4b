//! The lease store (quota pre-allocation): an instance takes a batch of permits from a key's
//! global budget in Redis and spends it in its own memory; only when its lease runs short does
//! a check wait for Redis, to lease more. A permit is spent only after Redis granted it, so the
//! instances together never admit more than the limit.
//!
//! It leases fixed windows: each window's budget is one Redis counter of the permits granted,
//! and permits leased but not spent expire with their window. A sliding window's, bucket's or
//! log's budget is not a count that can be handed out ahead.
//!
//! The batch follows the instance's own rate: enough for `target` more of what it spent since
//! its last lease (a busy instance leases more, an idle one little). Redis grants it only what
//! the limit leaves once the other instances leasing the window have their due (their even
//! share of the limit, less what they leased, and no more than their rate needs for the rest
//! of the window), so equally busy instances end with equal shares of a limit, within a
//! lease's rounding. Once fewer than `threshold` of the limit are left, Redis grants at most
//! half of what is left (but what the check needs), so that the last permits spread over the
//! instances that still need them. An instance leases a key one lease at a time: checks that
//! find its lease short while one is asked for wait for that answer rather than asking again.
//! [`Store::shutdown`] gives the permits not spent back.

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLockReadGuard};
use std::time::Duration;

use super::guard::{GuardPlan, Guarded, Route, StoreFailures};
use super::redis::{CounterItem, RedisStore, StoreTime, counter_key};
use super::table::{Access, Bounds, Score, Table, WhenFull};
use super::tags::{Tags, Versions};
use super::{Planned, Store};
use crate::algorithm::Algorithm;
use crate::algorithm::Tier;
use crate::algorithm::Verdict;
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Decisions, Source};
use crate::error::Error;
use crate::layout::{counters, packed};
use crate::rule::Rule;

/// Settings of a [`LeaseStore`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeaseConfig {
    /// How long a lease should last at the instance's recent rate, within its window
    /// (default 10 s): about one lease per key and instance per `target` at a steady rate.
    pub target: Duration,
    /// Instances expected to share the keys (default 1): a first lease is at most a tenth of
    /// this share of the limit.
    pub instances: u32,
    /// The fraction of a limit below which grants shrink to half of what is left (default
    /// 0.1).
    pub threshold: f64,
    /// The most keys held in this process (default a million).
    pub max_keys: usize,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            target: Duration::from_secs(10),
            instances: 1,
            threshold: 0.1,
            max_keys: 1_000_000,
        }
    }
}

impl LeaseConfig {
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
        if self.target < Duration::from_millis(1) || self.target > Duration::from_secs(86_400) {
            return invalid("target: must be from 1 ms to a day");
        }
        if self.instances == 0 {
            return invalid("instances: must be at least 1");
        }
        if !(self.threshold >= 0.0 && self.threshold <= 1.0) {
            return invalid("threshold: must be from 0 to 1");
        }
        if self.max_keys == 0 {
            return invalid("max_keys: must be at least 1");
        }
        Ok(())
    }
}

/// What a lease store did, since it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseStats {
    /// Items decided.
    pub decisions: u64,
    /// Calls made to Redis to lease (one per check that ran short, per slot on a cluster).
    pub calls: u64,
    /// Permits granted by Redis.
    pub leased: u64,
    /// Permits given back by [`Store::shutdown`].
    pub returned: u64,
}

/// Limits shared by every instance through Redis, spent from leases in each instance's
/// memory; never more than the limit in all. See the module documentation. Cheap to clone.
#[derive(Clone)]
pub struct LeaseStore {
    inner: Arc<Inner>,
}

struct Inner {
    redis: RedisStore,
    config: LeaseConfig,
    /// This instance's name among a window's lessees: random, new for each store.
    id: Vec<u8>,
    /// One lease at a time per key: a check that needs one takes its key's stripe first.
    leasing: Box<[tokio::sync::Mutex<()>]>,
    hasher: foldhash::fast::RandomState,
    table: Table,
    tags: Tags,
    /// Keys that hold a lease, each once (marked `HELD`), for shutdown to give back.
    held: Mutex<Vec<Held>>,
    clock: SystemClock,
    /// Redis's clock minus this process's (µs), from the last lease; 0 on the caller's time.
    offset: AtomicI64,
    /// The latest time a check was decided at (µs, on the counters' clock).
    last_now: AtomicU64,
    decisions: AtomicU64,
    calls: AtomicU64,
    leased: AtomicU64,
    returned: AtomicU64,
    /// Lease calls under way (each in a task of its own), and a wake-up as each lands: what
    /// shutdown waits for before it gives back, so that no grant lands after.
    in_flight: AtomicUsize,
    landed: tokio::sync::Notify,
}

/// A lease call under way, counted in [`Inner::in_flight`] until dropped.
struct InFlight(Arc<Inner>);

impl InFlight {
    fn new(inner: &Arc<Inner>) -> Self {
        inner.in_flight.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(inner))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.landed.notify_one();
    }
}

struct Held {
    rule: Rule,
    shape: Arc<Shape>,
    key: Box<[u8]>,
}

impl Held {
    /// The table accesses of `held`'s keys.
    fn accesses(held: &[Held]) -> Vec<Access<'_>> {
        held.iter()
            .map(|h| Access {
                tag: h.shape.tag,
                key: &h.key,
                words: h.shape.words,
            })
            .collect()
    }
}

/// What a rule is in a lease store.
#[derive(Debug, Clone)]
pub struct LeasePlan {
    shape: Arc<Shape>,
    guard: GuardPlan,
}

#[derive(Debug)]
struct Shape {
    tag: u32,
    words: usize,
    /// `tg:c:<rule>:<fingerprint>:`
    prefix: Vec<u8>,
}

impl Guarded for LeasePlan {
    fn guard(&self) -> &GuardPlan {
        &self.guard
    }
}

// A key's words: flags, then per tier:
const FLAGS: usize = 0;
const KEY_WORDS: usize = 1;
/// The start of the window leased in (µs; 0: none).
const START: usize = 0;
/// Permits granted to this instance in the window.
const LEASED: usize = 1;
/// Permits spent of them.
const USED: usize = 2;
/// When the last lease was granted (µs), and how many were spent then.
const LEASED_AT: usize = 3;
const USED_AT_LEASE: usize = 4;
/// The window's global count as the last answer left it.
const GLOBAL: usize = 5;
/// The size of the last grant.
const LAST_GRANT: usize = 6;
/// When Redis last answered a lease (µs).
const ASKED_AT: usize = 7;
/// The rate this instance spends at, as last measured (see [`rate`]).
const RATE: usize = 8;
const TIER_WORDS: usize = 9;

const HELD: u64 = 1;

impl fmt::Debug for LeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseStore")
            .field("config", &self.inner.config)
            .field("keys", &self.inner.table.len())
            .field("stats", &self.stats())
            .finish()
    }
}

/// A lease a check needs: `need` more permits of tier `tier` of item `item`, `want` if the
/// budget allows.
struct Need {
    item: usize,
    tier: usize,
    window: u64,
    need: u64,
    want: u64,
    /// The rate the tier spends at (permits per million seconds; 0: not measured yet).
    rate: u64,
}

/// Stripes of the one-lease-at-a-time locks: keys that share one wait for each other's
/// leases, which are rare.
const LEASING_STRIPES: usize = 1_024;

impl LeaseStore {
    /// A lease store on the Redis of `redis` (its connections, clock and failure handling).
    ///
    /// # Errors
    /// [`Error::Store`] for settings out of range.
    pub fn new(redis: &RedisStore, config: LeaseConfig) -> Result<Self, Error> {
        config.validate()?;
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        let clock = SystemClock::new();
        let hasher = foldhash::fast::RandomState::default();
        let mut id = hasher.build_hasher();
        id.write_u64(clock.now_micros());
        id.write_u32(std::process::id());
        Ok(Self {
            inner: Arc::new(Inner {
                redis: redis.clone(),
                config,
                id: format!("{:016x}", id.finish()).into_bytes(),
                leasing: (0..LEASING_STRIPES)
                    .map(|_| tokio::sync::Mutex::new(()))
                    .collect(),
                hasher,
                table: Table::new(Bounds {
                    max_keys: config.max_keys,
                    max_bytes: usize::MAX,
                    shards: (threads * 8).clamp(16, 1_024),
                    when_full: WhenFull::Evict,
                }),
                tags: Tags::default(),
                held: Mutex::new(Vec::new()),
                clock,
                offset: AtomicI64::new(0),
                last_now: AtomicU64::new(0),
                decisions: AtomicU64::new(0),
                calls: AtomicU64::new(0),
                leased: AtomicU64::new(0),
                returned: AtomicU64::new(0),
                in_flight: AtomicUsize::new(0),
                landed: tokio::sync::Notify::new(),
            }),
        })
    }

    /// The Redis store it leases from: its connections, breaker and key prefix.
    pub fn redis(&self) -> &RedisStore {
        &self.inner.redis
    }

    /// Whether Redis is being kept away now: checks spend what is leased, then each rule's
    /// failure policy decides.
    pub fn degraded(&self) -> bool {
        self.inner.redis.degraded()
    }

    /// The lease calls to Redis that failed or timed out so far (see
    /// [`RedisStore::failures`]).
    pub fn failures(&self) -> StoreFailures {
        self.inner.redis.failures()
    }

    /// What the store did so far.
    pub fn stats(&self) -> LeaseStats {
        let i = &self.inner;
        LeaseStats {
            decisions: i.decisions.load(Ordering::Relaxed),
            calls: i.calls.load(Ordering::Relaxed),
            leased: i.leased.load(Ordering::Relaxed),
            returned: i.returned.load(Ordering::Relaxed),
        }
    }

    /// Keys held in this process now.
    pub fn keys(&self) -> usize {
        self.inner.table.len()
    }
}

impl Inner {
    /// The stripes of `items`' keys, locked in ascending order (so never deadlocking).
    async fn leasing(
        &self,
        items: &[Planned<'_, LeasePlan>],
    ) -> Vec<tokio::sync::MutexGuard<'_, ()>> {
        let mut stripes: Vec<usize> = items
            .iter()
            .map(|i| {
                let mut hasher = self.hasher.build_hasher();
                hasher.write_u32(i.plan.shape.tag);
                hasher.write(i.key);
                hasher.finish() as usize % LEASING_STRIPES
            })
            .collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut guards = Vec::with_capacity(stripes.len());
        for stripe in stripes {
            guards.push(self.leasing[stripe].lock().await);
        }
        guards
    }

    fn scorer(&self) -> Scorer<'_> {
        Scorer {
            tags: self.tags.read(),
        }
    }

    fn accesses<'a>(items: &[Planned<'a, LeasePlan>]) -> Vec<Access<'a>> {
        items
            .iter()
            .map(|i| Access {
                tag: i.plan.shape.tag,
                key: i.key,
                words: i.plan.shape.words,
            })
            .collect()
    }

    /// Decides `items` from the leases held, all-or-nothing, spending them if admitted. When
    /// some tier's lease is short: the leases to ask for, unless `last` (then it denies).
    fn spend(
        &self,
        items: &[Planned<'_, LeasePlan>],
        now: u64,
        last: bool,
    ) -> Result<Decisions, Vec<Need>> {
        let accesses = Self::accesses(items);
        let result = self.table.access(&accesses, now, &self.scorer(), |words| {
            let mut needs = Vec::new();
            let mut decisions = Vec::with_capacity(items.len());
            for (index, (item, w)) in items.iter().zip(words.iter_mut()).enumerate() {
                let mut verdicts = Vec::with_capacity(item.rule.tiers().len());
                for (t, tier) in item.rule.tiers().iter().enumerate() {
                    let tw = tier_mut(w, t);
                    let window = roll(tier, tw, now);
                    let available = tw[LEASED] - tw[USED];
                    let reset = window + tier.period_micros() - now;
                    let remaining = tier.limit().saturating_sub(tw[GLOBAL]) + available;
                    if item.cost <= available {
                        let left = remaining - item.cost;
                        verdicts.push(Verdict::allow(tier.limit(), left, reset));
                        continue;
                    }
                    // A window whose budget is spent is not asked again before a while.
                    let spent = tw[GLOBAL] >= tier.limit()
                        && now < tw[ASKED_AT].saturating_add(self.recheck());
                    if !last && !spent {
                        needs.push(Need {
                            item: index,
                            tier: t,
                            window,
                            need: item.cost - available,
                            want: self.want(tier, tw, now, item.cost - available),
                            rate: rate(tw, now),
                        });
                    }
                    verdicts.push(Verdict::deny(tier.limit(), remaining, reset, reset));
                }
                let decision = item.rule.merge(|i| verdicts[i]).with_source(Source::Lease);
                decisions.push(decision.shadow(item.rule.is_shadow()));
            }
            if !needs.is_empty() {
                return Err(needs);
            }
            if decisions.iter().all(Decision::allowed) {
                for ((item, w), d) in items.iter().zip(words.iter_mut()).zip(&decisions) {
                    if item.cost == 0 || d.shadowed() {
                        continue;
                    }
                    for t in 0..item.rule.tiers().len() {
                        tier_mut(w, t)[USED] += item.cost;
                    }
                }
            }
            Ok(decisions)
        });
        result.map(Decisions::many)
    }

    /// How long a spent budget is believed before Redis is asked again (an instance that shuts
    /// down gives its permits back, which is rare): the target.
    fn recheck(&self) -> u64 {
        self.config.target.as_micros() as u64
    }

    /// How many permits to ask for, needing `need`: enough for `target` (or the rest of the
    /// window, if shorter) at the rate this instance spends (see [`rate`]), and twice the last
    /// lease if that went in under a second; at first a tenth of its share, at most 64; never
    /// more than its share of the limit but what it needs.
    fn want(&self, tier: &Tier, tw: &[u64], now: u64, need: u64) -> u64 {
        let instances = u64::from(self.config.instances.max(1));
        let batch = if tw[LEASED_AT] == 0 {
            (tier.limit() / (10 * instances)).clamp(1, 64)
        } else {
            let left = (tw[START] + tier.period_micros()).saturating_sub(now);
            let horizon = (self.config.target.as_micros() as u64).min(left);
            // A quarter more: a rate measured over random arrivals is as often under as over.
            let at_rate = u128::from(rate(tw, now)) * u128::from(horizon) * 5 / 4;
            let at_rate = at_rate.div_ceil(1_000_000_000_000) as u64;
            if now.saturating_sub(tw[LEASED_AT]) < 1_000_000 {
                at_rate.max(2 * tw[LAST_GRANT])
            } else {
                at_rate
            }
        };
        batch
            .min(tier.limit().div_ceil(instances))
            .max(need)
            .min(tier.limit())
    }

    /// Asks Redis for the leases `needs` of `items` at `now`, and adds what it grants, in a
    /// task of its own: if the check that asked stops waiting (its timeout passed, and its
    /// failure policy decided), the answer is still taken in when it comes, so that permits
    /// Redis granted are never lost to this instance (they would be missing from the
    /// window's budget until it ends: an answer lost this way once left tenants at 935 of
    /// 1,000). Only an answer that never comes (a connection lost after Redis ran the call)
    /// loses its grant, to the end of its window.
    async fn take(
        self: &Arc<Self>,
        items: &[Planned<'_, LeasePlan>],
        needs: Vec<Need>,
        now: u64,
    ) -> Result<(), Error> {
        let leases: Vec<CounterItem> = needs
            .iter()
            .map(|n| {
                let item = &items[n.item];
                let tier = &item.rule.tiers()[n.tier];
                let period = tier.period_micros();
                let counter =
                    counter_key(&item.plan.shape.prefix, item.key, n.tier, n.window / period);
                let mut lessees = counter.clone();
                lessees.extend_from_slice(b":lessees");
                let ttl = period / 1_000 + 1_000;
                let threshold = (tier.limit() as f64 * self.config.threshold).ceil();
                let args = packed::<{ counters::LEASE }>([
                    n.want as f64,
                    n.need as f64,
                    tier.limit() as f64,
                    ttl as f64,
                    threshold,
                    n.rate as f64 / 1e6,
                    (n.window + period) as f64,
                    self.config.target.as_micros() as f64,
                ]);
                CounterItem {
                    keys: vec![counter, lessees],
                    args,
                }
            })
            .collect();
        let asked: Vec<Held> = items
            .iter()
            .map(|item| Held {
                rule: item.rule.clone(),
                shape: item.plan.shape.clone(),
                key: item.key.into(),
            })
            .collect();
        let in_flight = InFlight::new(self);
        let answer = tokio::spawn(async move {
            let inner = &in_flight.0;
            let local = inner.clock.now_micros();
            let answer = inner.redis.lease(&inner.id, now, &leases).await;
            inner
                .calls
                .fetch_add(answer.as_ref().map_or(1, |a| a.calls), Ordering::Relaxed);
            let answer = answer?;
            if inner.redis.time() == StoreTime::Server {
                let offset = answer.time as i64 - local as i64;
                inner.offset.store(offset, Ordering::Relaxed);
            }
            inner.granted(&asked, &needs, &answer.values, now);
            Ok::<(), Error>(())
        });
        answer.await.map_err(|e| Error::Store {
            message: format!("a lease's task failed: {e}"),
            transient: true,
        })?
    }

    /// Adds the leases Redis granted (`values`: grant and global count per need) to the keys
    /// of `asked`.
    fn granted(&self, asked: &[Held], needs: &[Need], values: &[f64], now: u64) {
        let accesses = Held::accesses(asked);
        let mut held = Vec::new();
        self.table.access(&accesses, now, &self.scorer(), |words| {
            for (n, granted) in needs.iter().zip(values.chunks_exact(2)) {
                let (grant, global) = (granted[0] as u64, granted[1] as u64);
                self.leased.fetch_add(grant, Ordering::Relaxed);
                let item = &asked[n.item];
                let w = &mut words[n.item];
                let tw = tier_mut(w, n.tier);
                if tw[START] != n.window {
                    continue;
                }
                tw[GLOBAL] = global;
                tw[ASKED_AT] = now;
                if grant > 0 {
                    tw[RATE] = rate(tw, now);
                    tw[LEASED] += grant;
                    tw[LEASED_AT] = now;
                    tw[USED_AT_LEASE] = tw[USED];
                    tw[LAST_GRANT] = grant;
                }
                if grant > 0 && w[FLAGS] & HELD == 0 {
                    w[FLAGS] |= HELD;
                    held.push(Held {
                        rule: item.rule.clone(),
                        shape: item.shape.clone(),
                        key: item.key.clone(),
                    });
                }
            }
        });
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(held);
    }

    /// Gives back the permits leased and not spent in the current windows.
    async fn give_back(&self, now: u64) -> Result<(), Error> {
        let held: Vec<Held> =
            std::mem::take(&mut *self.held.lock().unwrap_or_else(|e| e.into_inner()));
        let accesses = Held::accesses(&held);
        let mut returns = Vec::new();
        self.table.access(&accesses, now, &self.scorer(), |words| {
            for (h, w) in held.iter().zip(words.iter_mut()) {
                w[FLAGS] &= !HELD;
                for (t, tier) in h.rule.tiers().iter().enumerate() {
                    let tw = tier_mut(w, t);
                    let unused = tw[LEASED] - tw[USED];
                    if unused > 0 && tw[START] + tier.period_micros() > now {
                        let period = tier.period_micros();
                        let key = counter_key(&h.shape.prefix, &h.key, t, tw[START] / period);
                        returns.push((key, unused));
                        tw[LEASED] = tw[USED];
                    }
                }
            }
        });
        if returns.is_empty() {
            return Ok(());
        }
        let keys: Vec<Vec<u8>> = returns.iter().map(|(k, _)| k.clone()).collect();
        let args: Vec<Vec<u8>> = returns
            .iter()
            .map(|&(_, unused)| packed::<{ counters::ADD }>([-(unused as f64), 0.0]))
            .collect();
        self.redis.add(&keys, &args).await?;
        let total: u64 = returns.iter().map(|&(_, n)| n).sum();
        self.returned.fetch_add(total, Ordering::Relaxed);
        Ok(())
    }
}

/// Moves a tier to the window of `now`, dropping what was leased in an earlier one (its
/// permits expired with it) but keeping how fast it spends; returns the window's start.
fn roll(tier: &Tier, tw: &mut [u64], now: u64) -> u64 {
    let period = tier.period_micros();
    let window = now - now % period;
    if tw[START] < window {
        // The rate carries over; the new window's first lease is measured from now.
        let rate = rate(tw, now);
        let leased_at = if tw[LEASED_AT] == 0 { 0 } else { now };
        tw.copy_from_slice(&[window, 0, 0, leased_at, 0, 0, 0, 0, rate]);
    }
    tw[START]
}

/// The rate a tier spends at, in permits per million seconds: measured since its last lease
/// when that is a second ago at least (a burst over milliseconds says little), else as last
/// measured.
fn rate(tw: &[u64], now: u64) -> u64 {
    let elapsed = now.saturating_sub(tw[LEASED_AT]);
    if tw[LEASED_AT] == 0 || elapsed < 1_000_000 {
        return tw[RATE];
    }
    let spent = tw[USED].saturating_sub(tw[USED_AT_LEASE]);
    (u128::from(spent) * 1_000_000_000_000 / u128::from(elapsed)) as u64
}

fn tier_mut(w: &mut [u64], tier: usize) -> &mut [u64] {
    &mut w[KEY_WORDS + TIER_WORDS * tier..KEY_WORDS + TIER_WORDS * (tier + 1)]
}

impl LeaseStore {
    /// Whether a lease store can hold `rule` (as planning it would say), without one: a
    /// fixed window (or a hit counter, which counts as one: admitted hits only), with a
    /// local share on failure that fits in memory.
    ///
    /// # Errors
    /// [`Error::Rule`] saying which algorithms the lease store holds.
    pub fn holds(rule: &Rule) -> Result<(), Error> {
        if !matches!(
            rule.algorithm(),
            Algorithm::FixedWindow | Algorithm::HitCounter
        ) {
            return Err(super::unsupported(
                rule,
                "lease",
                "a budget of permits per window, leased ahead",
            ));
        }
        super::no_calendar(rule, "lease")?;
        super::guard::Guard::holds(rule)
    }
}

impl Store for LeaseStore {
    type Plan = LeasePlan;

    fn plan(&self, rule: &Rule) -> Result<LeasePlan, Error> {
        Self::holds(rule)?;
        let shape = Shape {
            tag: self.inner.tags.tag(rule)?,
            words: KEY_WORDS + TIER_WORDS * rule.tiers().len(),
            prefix: self.inner.redis.counter_prefix(rule),
        };
        Ok(LeasePlan {
            shape: Arc::new(shape),
            guard: self.inner.redis.guard().plan(rule)?,
        })
    }

    async fn check(
        &self,
        items: &[Planned<'_, LeasePlan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> Result<Decisions, Error> {
        let inner = &*self.inner;
        inner
            .decisions
            .fetch_add(items.len() as u64, Ordering::Relaxed);
        let at = now
            .saturating_add_signed(inner.offset.load(Ordering::Relaxed))
            .max(1);
        inner.last_now.fetch_max(at, Ordering::Relaxed);
        if let Ok(decisions) = inner.spend(items, at, false) {
            return Ok(decisions);
        }
        let remote = |_| async {
            // One lease at a time per key (the wait within the store's timeout): a lease
            // asked for meanwhile may be enough.
            let _leasing = inner.leasing(items).await;
            let needs = match inner.spend(items, at, false) {
                Ok(decisions) => return Ok(decisions),
                Err(needs) => needs,
            };
            self.inner.take(items, needs, at).await?;
            let at = now
                .saturating_add_signed(inner.offset.load(Ordering::Relaxed))
                .max(1);
            Ok(inner
                .spend(items, at, true)
                .unwrap_or_else(|_| unreachable!("a last spend asks for nothing")))
        };
        let guard = inner.redis.guard();
        let route = Route::one(guard.single());
        Ok(guard.decide(items, now, max_delay, &route, remote).await)
    }

    async fn shutdown(&self) {
        let inner = &*self.inner;
        // A grant still on its way is waited for (as long as a slow answer can take), so
        // that what it grants is given back with the rest rather than lost to its window.
        let patience = inner
            .redis
            .guard()
            .config()
            .timeout
            .max(Duration::from_secs(2));
        let deadline = tokio::time::Instant::now() + patience;
        while inner.in_flight.load(Ordering::Acquire) > 0 {
            let landed = tokio::time::timeout_at(deadline, inner.landed.notified()).await;
            if landed.is_err() {
                tracing::warn!(
                    "lease store: a lease call still under way at shutdown; what it grants \
                     stays taken until its window ends"
                );
                break;
            }
        }
        let now = inner.last_now.load(Ordering::Relaxed).max(1);
        if let Err(err) = inner.give_back(now).await {
            tracing::warn!(error = %err, "lease store could not give back its unused permits");
        }
    }

    /// Forgets the keys' leases here and deletes their windows' counters in Redis (the
    /// window of now, and those either side of it). Other instances spend the leases they
    /// hold, then lease from the new budget.
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
        _items: &[Planned<'_, LeasePlan>],
        _now: u64,
        _settle: super::Settle,
    ) -> Result<Decisions, Error> {
        Err(no_reservations())
    }

    async fn reset(&self, items: &[Planned<'_, LeasePlan>], now: u64) -> Result<(), Error> {
        let inner = &*self.inner;
        let now = now.saturating_add_signed(inner.offset.load(Ordering::Relaxed));
        inner
            .table
            .access(&Inner::accesses(items), now, &inner.scorer(), |words| {
                for w in words {
                    w.fill(0);
                }
            });
        for item in items {
            let names =
                super::hybrid::window_counters(&item.plan.shape.prefix, item.key, item.rule, now);
            inner.redis.delete(&names).await?;
        }
        Ok(())
    }
}

/// Judges entries for the table: keys holding permits they have not spent stay (dropping
/// them only wastes those permits, but still); keys whose window is over may go; otherwise
/// the more a key has left, the less it matters.
struct Scorer<'a> {
    tags: RwLockReadGuard<'a, Versions>,
}

impl Score for Scorer<'_> {
    fn score(&self, tag: u32, words: &mut [u64], now: u64) -> Option<f64> {
        let rule = self.tags.newest(tag)?;
        let (mut least, mut live) = (1.0_f64, false);
        for (t, tier) in rule.tiers().iter().enumerate() {
            let tw = tier_mut(words, t);
            if tw[START] + tier.period_micros() <= now {
                continue;
            }
            live = true;
            if tw[LEASED] > tw[USED] {
                return Some(-1.0);
            }
            let left = tier.limit().saturating_sub(tw[GLOBAL]);
            least = least.min(left as f64 / tier.limit() as f64);
        }
        live.then_some(least)
    }
}

/// Why the lease store takes no reports or reservations.
fn no_reservations() -> Error {
    Error::Unsupported {
        what: "the lease store counts the permits it admits, so it takes no reports or \
               reservations: use the strict Redis store for rules that do"
            .into(),
    }
}
