//! The API a Rust service calls: rules enforced over any store.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::algorithm::Settle;
use crate::clock::{Clock, MAX_TIMESTAMP, SystemClock};
use crate::decision::{Decision, Decisions};
use crate::error::{Error, RuleError};
use crate::reservation::{Reservation, new_id};
use crate::rule::Rule;
use crate::rule::{OnExpiry, Reservations};
use crate::store::{Committed, ReservationRecord, ReservedItem, settle_at};
use crate::store::{LocalStore, MAX_BATCH, MAX_KEY_LEN, MemoryStore, Planned, Store};

/// Costs of a settlement stay below this (2^53), where every quantity is exact in a double.
const MAX_COST: u64 = 1 << 53;

/// The most expired reservations a full book settles to make room for a new one.
const SWEEP: usize = 1_000;

/// A permit ends a tenth of its slots' lease early, at most a second (see [`Limiter::hold`]).
const PERMIT_MARGIN: u64 = 10;

/// Enforces one or more [`Rule`]s over a [`Store`]: process memory by default, or Redis
/// (strict, hybrid or lease) with the `redis` feature.
///
/// [`check`](Self::check) asks every rule about one key and admits only if all admit;
/// [`check_batch`](Self::check_batch) asks about several keys under several rules at once,
/// all-or-nothing; [`acquire`](Self::acquire) waits until admitted or until its timeout. On a
/// store that decides in process, [`check_now`](Self::check_now) answers without a future.
///
/// Thread-safe: share one limiter (e.g. in an `Arc`). Limiters built on clones of one store
/// share its state, so a rule set can be rebuilt (a hot reload) without losing counts.
pub struct Limiter<S: Store = MemoryStore, C: Clock = SystemClock> {
    rules: Box<[RulePlan<S::Plan>]>,
    /// Rule names are looked up on every batch item: a fast hash, seeded per process.
    by_name: HashMap<&'static str, usize, foldhash::fast::RandomState>,
    store: S,
    clock: C,
}

struct RulePlan<P> {
    rule: Rule,
    plan: P,
}

impl<S: Store, C: Clock + fmt::Debug> fmt::Debug for Limiter<S, C>
where
    S: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rules: Vec<&str> = self.rules.iter().map(|r| r.rule.name()).collect();
        f.debug_struct("Limiter")
            .field("rules", &rules)
            .field("store", &self.store)
            .field("clock", &self.clock)
            .finish()
    }
}

/// One item of a batch: `cost` permits of `key` under the limiter's rule named `rule`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item<'a> {
    /// The rule's name.
    pub rule: &'a str,
    /// The key, any bytes up to [`MAX_KEY_LEN`].
    pub key: &'a [u8],
    /// Permits asked for; 0 looks without consuming.
    pub cost: u64,
}

impl<'a> Item<'a> {
    /// `cost` permits of `key` under the rule named `rule`.
    pub fn new(rule: &'a str, key: &'a (impl AsRef<[u8]> + ?Sized), cost: u64) -> Self {
        Self {
            rule,
            key: key.as_ref(),
            cost,
        }
    }
}

impl Limiter {
    /// A limiter for `rule` in process memory (at most a million keys), on the system clock.
    pub fn new(rule: Rule) -> Self {
        Self::builder(rule)
            .build()
            .expect("every rule fits the default memory store")
    }

    /// Configures a limiter for `rule` (more rules, the store, the clock).
    pub fn builder(rule: Rule) -> LimiterBuilder {
        LimiterBuilder {
            rules: vec![rule],
            store: MemoryStore::new(),
            clock: SystemClock::new(),
        }
    }
}

impl<S: Store, C: Clock> Limiter<S, C> {
    /// Decides whether `key` may take `cost` permits now under every rule of this limiter, and
    /// takes them from all if so. A cost of 0 looks without taking. The decision is the
    /// binding rule's.
    ///
    /// # Errors
    /// [`Error::CostExceedsCapacity`] when a tier can never admit `cost`;
    /// [`Error::KeyTooLong`] beyond [`MAX_KEY_LEN`] bytes. A denial is not an error, and
    /// neither is a failing store: the rule's failure policy decides.
    pub async fn check(&self, key: impl AsRef<[u8]>, cost: u64) -> Result<Decision, Error> {
        let key = key.as_ref();
        self.validate_key(key, cost)?;
        self.decide_key(key, cost, None).await
    }

    /// Waits until `key` may take `cost` permits under every rule, takes them, and returns the
    /// decision; fails with [`Error::Timeout`] as soon as it is clear that `timeout` is not
    /// enough. A shaping algorithm (leaky bucket shaper, warm-up) reserves its turn and this
    /// waits out the delay.
    ///
    /// Waiting callers are not queued: when permits free up, whoever checks first takes them.
    ///
    /// # Errors
    /// As [`check`](Self::check), plus [`Error::Timeout`].
    pub async fn acquire(
        &self,
        key: impl AsRef<[u8]>,
        cost: u64,
        timeout: Duration,
    ) -> Result<Decision, Error> {
        let key = key.as_ref();
        self.validate_key(key, cost)?;
        let attempt = |patience| self.decide_key(key, cost, Some(patience));
        wait_until_admitted(&self.clock, timeout, attempt).await
    }

    /// Decides `items` all-or-nothing: the batch is admitted only if every item is, and then
    /// each takes its cost; otherwise none does (see [`Decisions`]). Items of the same rule
    /// and key count as one item of their total cost. Atomic on every store, but for keys of
    /// different slots of a Redis Cluster (see [`RedisStore`](crate::RedisStore)).
    ///
    /// # Errors
    /// [`Error::UnknownRule`] for a rule this limiter does not have, [`Error::TooManyItems`]
    /// beyond [`MAX_BATCH`], and as [`check`](Self::check).
    pub async fn check_batch(&self, items: &[Item<'_>]) -> Result<Decisions, Error> {
        let batch = self.batch(items)?;
        let decisions = self
            .store
            .check(&batch.planned, now(&self.clock), None)
            .await?;
        Ok(batch.spread(decisions))
    }

    /// Takes `cost` permits of `key` under every rule of this limiter, whatever its state: a
    /// report of work whose cost is known once it is done (an LLM answer's tokens). Past a
    /// limit the key is in debt, and its checks are denied until time pays the debt back (see
    /// [`Settle::Report`]). The decision says what the key has left: denied while in debt.
    ///
    /// # Errors
    /// [`Error::CostTooLarge`] for a cost of 2^53 or more; [`Error::KeyTooLong`];
    /// [`Error::Store`] when a shared store did not take it (a report is never made up by a
    /// failure policy: the caller hears of it); [`Error::Unsupported`] on the hybrid and
    /// lease stores.
    pub async fn report(&self, key: impl AsRef<[u8]>, cost: u64) -> Result<Decision, Error> {
        let key = key.as_ref();
        let items: Vec<Item<'_>> = self
            .rules()
            .map(|r| Item::new(r.name(), key, cost))
            .collect();
        let decisions = self.settle_batch(&items, Settle::Report).await?;
        Ok(decisions.binding().expect("a limiter has a rule"))
    }

    /// Settles `items`: takes each item's cost whatever its key's state
    /// ([`Settle::Report`]), or gives it back ([`Settle::Credit`], what a reservation did not
    /// use). Each item on its own: nothing is refused. The decisions say what each key has
    /// left after it.
    ///
    /// # Errors
    /// As [`report`](Self::report), and as [`check_batch`](Self::check_batch) for the items.
    pub async fn settle_batch(
        &self,
        items: &[Item<'_>],
        settle: Settle,
    ) -> Result<Decisions, Error> {
        self.store.settles()?;
        let batch = self.settled_batch(items)?;
        let decisions = self
            .store
            .settle(&batch.planned, now(&self.clock), settle)
            .await?;
        Ok(batch.spread(decisions))
    }

    /// Reserves an estimate of work whose cost is known once it is done: decides `items` as
    /// [`check_batch`](Self::check_batch) does (all-or-nothing, exact where a check is), and
    /// when admitted, records what was taken under an id, to be settled by
    /// [`commit`](Self::commit) (the real cost: less gives the difference back where the
    /// algorithm can, more takes the excess as a report does) or [`cancel`](Self::cancel)
    /// (gives it all back). Unsettled within `ttl` (or the shortest of its rules'
    /// [`Reservations::ttl`](crate::Reservations)), a reservation settles by itself as its
    /// rules say: consumed at its estimate (the default: a caller that crashed never gets its
    /// work for free) or released; see [`settle_expired`](Self::settle_expired). On a Redis
    /// store the record lives in Redis: it outlives the process, and any instance settles it.
    ///
    /// # Errors
    /// As [`check_batch`](Self::check_batch); [`Error::ReservationsFull`] when the store holds
    /// its most open reservations, none expired (a full book first settles up to 1,000 that
    /// expired; what was taken is given back); [`Error::Unsupported`] on a
    /// store that holds none (hybrid, lease);
    /// [`Error::Store`] when a shared store did not keep the record (what was taken is given
    /// back as well).
    pub async fn reserve(
        &self,
        items: &[Item<'_>],
        ttl: Option<Duration>,
    ) -> Result<Reservation, Error> {
        self.store.settles()?;
        let batch = self.batch(items)?;
        let ttl = ttl.unwrap_or_else(|| {
            let rules = batch
                .planned
                .iter()
                .map(|p| p.rule.reservation_policy().ttl);
            rules.min().unwrap_or_default()
        });
        self.recorded(batch, ttl, |_| true).await
    }

    /// Decides `items` as [`check_batch`](Self::check_batch) does, and when admitted, holds
    /// the slots taken on concurrency rules (see [`Algorithm::Concurrency`]) under a permit:
    /// the id of the answer, to [`release`](Self::release) them by when the work is done, or
    /// to [`extend`](Self::extend) their lease by while it goes on. Unreleased, the slots
    /// free themselves when their lease ends (a holder that crashed keeps none for longer).
    /// Items of other rules take their cost as a check does and are not part of the permit.
    /// With no concurrency rule among the items taking a slot (a look, of cost 0, takes
    /// none), this is a check: no permit.
    ///
    /// The permit ends a little before the slots' lease (a tenth of it, at most a second), so
    /// that a store deciding on its own clock (Redis) frees nothing a later
    /// holder took while the clocks differ by less than that.
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    ///
    /// [`Algorithm::Concurrency`]: crate::Algorithm::Concurrency
    pub async fn hold(&self, items: &[Item<'_>]) -> Result<Reservation, Error> {
        let batch = self.batch(items)?;
        if !batch
            .planned
            .iter()
            .any(|p| p.cost > 0 && p.rule.algorithm().holds_slots())
        {
            let decisions = self
                .store
                .check(&batch.planned, now(&self.clock), None)
                .await?;
            return Ok(Reservation {
                id: None,
                decisions: batch.spread(decisions),
                expires: 0,
            });
        }
        self.store.settles()?;
        self.recorded(batch, Reservations::MAX_TTL, |rule| {
            rule.algorithm().holds_slots()
        })
        .await
    }

    /// Gives back the slots held under `permit` (see [`hold`](Self::hold)); the decisions say
    /// what each key has left. The same as [`cancel`](Self::cancel).
    ///
    /// # Errors
    /// [`Error::UnknownReservation`] for a permit unknown, released or whose lease ended; as
    /// [`report`](Self::report).
    pub async fn release(&self, permit: &str) -> Result<Decisions, Error> {
        self.settle_reservation(permit, 0).await
    }

    /// Renews the lease of every slot held under `permit` (or by reservation `permit`) from
    /// now, for as long as it was first given; returns when the permit now ends (µs since
    /// the epoch, the limiter's clock). Renewing a permit while it is released by another
    /// task may find it unknown.
    ///
    /// # Errors
    /// As [`release`](Self::release); when the store did not take the renewal, the permit is
    /// unknown from then on, and its slots free themselves when their lease ends.
    pub async fn extend(&self, permit: &str) -> Result<u64, Error> {
        let now = now(&self.clock);
        let unknown = || Error::UnknownReservation { id: permit.into() };
        let Some(mut record) = self.store.take_reservation(permit, now).await? else {
            return Err(unknown());
        };
        if record.expires <= now {
            self.expired(&record).await?;
            return Err(unknown());
        }
        let items: Vec<Item<'_>> = record
            .items
            .iter()
            .filter(|i| {
                let rule = self.by_name.get(i.rule.as_str());
                rule.is_some_and(|&at| self.rules[at].rule.algorithm().holds_slots())
            })
            .map(|i| Item::new(&i.rule, &i.key, i.cost))
            .collect();
        if !items.is_empty() {
            self.settle_batch(&items, Settle::Renew).await?;
        }
        let lasts = record.expires - record.at;
        record.expires = now.saturating_add(lasts);
        record.at = now;
        self.store.keep_reservation(&record, now).await?;
        Ok(record.expires)
    }

    /// Decides `batch` and, when admitted, records the items `recorded` picks by their rule
    /// under a new id, to be settled within `ttl` (shortened to end within the lease of any
    /// slots held).
    async fn recorded(
        &self,
        batch: Batch<'_, S::Plan>,
        ttl: Duration,
        recorded: impl Fn(&Rule) -> bool,
    ) -> Result<Reservation, Error> {
        let now = now(&self.clock);
        let mut ttl = u64::try_from(ttl.min(Reservations::MAX_TTL).as_micros()).unwrap_or(u64::MAX);
        for p in batch
            .planned
            .iter()
            .filter(|p| p.rule.algorithm().holds_slots())
        {
            if let Some(lease) = p.rule.tiers().iter().map(|t| t.period_micros()).min() {
                ttl = ttl.min(lease - (lease / PERMIT_MARGIN).min(1_000_000));
            }
        }
        let record = ReservationRecord {
            id: new_id(),
            at: now,
            expires: now.saturating_add(ttl),
            items: batch
                .planned
                .iter()
                .filter(|p| recorded(p.rule))
                .map(|p| ReservedItem {
                    rule: p.rule.name().to_string(),
                    key: p.key.to_vec(),
                    cost: p.cost,
                    // Slots free themselves when their lease ends: a release after it would
                    // free another holder's.
                    release: p.rule.reservation_policy().on_expiry == OnExpiry::Released
                        && !p.rule.algorithm().holds_slots(),
                })
                .collect(),
        };
        let mut reserved = self.store.reserve(&batch.planned, now, &record).await;
        if matches!(reserved, Err(Error::ReservationsFull { .. }))
            && self
                .settle_expired(SWEEP)
                .await
                .is_ok_and(|settled| settled > 0)
        {
            // A full book makes room from the reservations that expired in it first.
            reserved = self.store.reserve(&batch.planned, now, &record).await;
        }
        let (decisions, kept) = reserved?;
        let decisions = batch.spread(decisions);
        if !kept {
            return Ok(Reservation {
                id: None,
                decisions,
                expires: 0,
            });
        }
        Ok(Reservation {
            id: Some(record.id),
            decisions,
            expires: record.expires,
        })
    }

    /// Settles reservation `id` at its real cost `actual`, for each of its items: less than
    /// the estimate gives the difference back where the algorithm can, more takes the excess
    /// as [`report`](Self::report) does. The decisions say what each key has left. A
    /// reservation is settled once: a second commit (or one after it expired) finds it gone.
    ///
    /// # Errors
    /// [`Error::UnknownReservation`] for an id unknown, settled or expired; as
    /// [`report`](Self::report).
    pub async fn commit(&self, id: &str, actual: u64) -> Result<Decisions, Error> {
        if actual >= MAX_COST {
            return Err(Error::CostTooLarge {
                cost: actual,
                max: MAX_COST - 1,
            });
        }
        self.settle_reservation(id, actual).await
    }

    /// Cancels reservation `id`: every item's estimate comes back where the algorithm can.
    ///
    /// # Errors
    /// As [`commit`](Self::commit).
    pub async fn cancel(&self, id: &str) -> Result<Decisions, Error> {
        self.settle_reservation(id, 0).await
    }

    /// Settles up to `limit` reservations expired unsettled, as their rules say: an estimate
    /// to release comes back, one consumed stays taken. Any number of processes may call this
    /// at once (a service does every second): each reservation is settled by one. Returns how
    /// many were settled.
    ///
    /// # Errors
    /// As [`report`](Self::report).
    pub async fn settle_expired(&self, limit: usize) -> Result<usize, Error> {
        let records = self
            .store
            .expired_reservations(now(&self.clock), limit)
            .await?;
        for record in &records {
            self.expired(record).await?;
        }
        Ok(records.len())
    }

    /// Settles reservation `id` at `actual`: in one call of the store when it kept the record
    /// and remembers it; else its record taken out, then settled. One expired but not yet
    /// settled by [`settle_expired`](Self::settle_expired) is settled now, as its rules say,
    /// and is as unknown as one settled.
    async fn settle_reservation(&self, id: &str, actual: u64) -> Result<Decisions, Error> {
        let now = now(&self.clock);
        let committed = match self.store.kept_record(id) {
            Some(record) => {
                let items = self.planned_of(&record);
                self.store
                    .commit(id, &items, record.at, actual, now)
                    .await?
            }
            None => match self.store.take_reservation(id, now).await? {
                None => Committed::Unknown,
                Some(record) if record.expires <= now => Committed::Expired(record),
                Some(record) => {
                    let items = self.planned_of(&record);
                    let settled = settle_at(&self.store, &items, record.at, actual, now).await?;
                    Committed::Settled(settled)
                }
            },
        };
        match committed {
            Committed::Settled(decisions) => Ok(decisions),
            Committed::Unknown => Err(Error::UnknownReservation { id: id.into() }),
            Committed::Expired(record) => {
                self.expired(&record).await?;
                Err(Error::UnknownReservation { id: id.into() })
            }
        }
    }

    /// The items of `record` whose rules this limiter still has (a reload may have removed
    /// some: they have nothing left to settle), each at its estimate.
    fn planned_of<'a>(&'a self, record: &'a ReservationRecord) -> Vec<Planned<'a, S::Plan>> {
        record
            .items
            .iter()
            .filter_map(|i| {
                let &index = self.by_name.get(i.rule.as_str())?;
                Some(self.rules[index].planned(&i.key, i.cost))
            })
            .collect()
    }

    /// Settles `record`, expired unsettled, as its rules say: what is to be released comes
    /// back.
    async fn expired(&self, record: &ReservationRecord) -> Result<(), Error> {
        let released: Vec<Item<'_>> = record
            .items
            .iter()
            .filter(|i| i.release && i.cost > 0 && self.by_name.contains_key(i.rule.as_str()))
            .map(|i| Item::new(&i.rule, &i.key, i.cost))
            .collect();
        if !released.is_empty() {
            self.settle_batch(&released, Settle::Credit { at: record.at })
                .await?;
        }
        Ok(())
    }

    /// Forgets `key`'s state under the rule named `rule` (its next check finds it new): an
    /// operator lifting a limit on one key by hand.
    ///
    /// # Errors
    /// [`Error::UnknownRule`], [`Error::KeyTooLong`], or [`Error::Store`] when a shared
    /// store's backend did not take it.
    pub async fn reset(&self, rule: &str, key: impl AsRef<[u8]>) -> Result<(), Error> {
        let key = key.as_ref();
        self.validate_key(key, 0)?;
        let Some(&index) = self.by_name.get(rule) else {
            return Err(Error::UnknownRule {
                rule: rule.to_string(),
            });
        };
        let item = self.rules[index].planned(key, 0);
        let now = now(&self.clock);
        self.store.reset(std::slice::from_ref(&item), now).await
    }

    /// The rules of this limiter, in order.
    pub fn rules(&self) -> impl ExactSizeIterator<Item = &Rule> {
        self.rules.iter().map(|r| &r.rule)
    }

    /// The first rule of this limiter: its only one when built with one.
    pub fn rule(&self) -> &Rule {
        &self.rules[0].rule
    }

    /// How the store planned the rule named `name`, e.g. a
    /// [`RedisPlan`](crate::RedisPlan) that names its keys.
    pub fn plan(&self, name: &str) -> Option<&S::Plan> {
        let &index = self.by_name.get(name)?;
        Some(&self.rules[index].plan)
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Finishes the store's shared business (pending counts, unused leases) before exit.
    pub async fn shutdown(&self) {
        self.store.shutdown().await;
    }

    /// Every rule about `key`, in one call of the store.
    async fn decide_key(
        &self,
        key: &[u8],
        cost: u64,
        max_delay: Option<u64>,
    ) -> Result<Decision, Error> {
        let now = now(&self.clock);
        if let [only] = &*self.rules {
            let item = only.planned(key, cost);
            let decisions = self
                .store
                .check(std::slice::from_ref(&item), now, max_delay);
            return Ok(decisions.await?[0]);
        }
        let items: Vec<_> = self.rules.iter().map(|r| r.planned(key, cost)).collect();
        let decisions = self.store.check(&items, now, max_delay).await?;
        Ok(decisions.binding().expect("a limiter has a rule"))
    }

    /// Rejects a key or a cost that no check of this limiter's rules can accept.
    #[inline]
    fn validate_key(&self, key: &[u8], cost: u64) -> Result<(), Error> {
        validate_key(key)?;
        self.rules.iter().try_for_each(|r| r.rule.check_cost(cost))
    }

    /// `items` resolved to their rules' plans, duplicates merged, each validated.
    fn batch<'a>(&'a self, items: &[Item<'a>]) -> Result<Batch<'a, S::Plan>, Error> {
        let batch = self.merged(items)?;
        for p in &batch.planned {
            p.rule.check_cost(p.cost)?;
        }
        Ok(batch)
    }

    /// `items` resolved for a settlement: as [`batch`](Self::batch), any cost below 2^53
    /// (a report may take more than a tier holds: that is a debt).
    fn settled_batch<'a>(&'a self, items: &[Item<'a>]) -> Result<Batch<'a, S::Plan>, Error> {
        let batch = self.merged(items)?;
        if let Some(p) = batch.planned.iter().find(|p| p.cost >= MAX_COST) {
            return Err(Error::CostTooLarge {
                cost: p.cost,
                max: MAX_COST - 1,
            });
        }
        Ok(batch)
    }

    /// `items` resolved to their rules' plans, duplicates merged, keys and rules validated.
    fn merged<'a>(&'a self, items: &[Item<'a>]) -> Result<Batch<'a, S::Plan>, Error> {
        if items.len() > MAX_BATCH {
            return Err(Error::TooManyItems {
                len: items.len(),
                max: MAX_BATCH,
            });
        }
        let mut planned: Vec<Planned<'a, S::Plan>> = Vec::with_capacity(items.len());
        // Filled at the first repeated item; empty while every item is its own.
        let mut positions = Vec::new();
        for item in items {
            validate_key(item.key)?;
            let &index = self
                .by_name
                .get(item.rule)
                .ok_or_else(|| Error::UnknownRule {
                    rule: item.rule.into(),
                })?;
            let rule = &self.rules[index];
            let same = planned
                .iter()
                .position(|p| std::ptr::eq(p.rule, &rule.rule) && p.key == item.key);
            match same {
                Some(at) => {
                    if positions.is_empty() {
                        positions.extend(0..planned.len());
                    }
                    planned[at].cost = planned[at].cost.saturating_add(item.cost);
                    positions.push(at);
                }
                None => {
                    if !positions.is_empty() {
                        positions.push(planned.len());
                    }
                    planned.push(rule.planned(item.key, item.cost));
                }
            }
        }
        Ok(Batch { planned, positions })
    }
}

impl<S: LocalStore, C: Clock> Limiter<S, C> {
    /// Decides whether `key` may take `cost` permits now under every rule, as
    /// [`check`](Self::check) does, without a future: for stores that decide in this process
    /// (memory, hybrid). Never blocks.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    #[inline]
    pub fn check_now(&self, key: impl AsRef<[u8]>, cost: u64) -> Result<Decision, Error> {
        let key = key.as_ref();
        if let [only] = &*self.rules {
            validate_key(key)?;
            only.rule.check_cost(cost)?;
            let item = only.planned(key, cost);
            return Ok(self.store.check_one_now(&item, now(&self.clock), None));
        }
        self.decide_now(key, cost, None)
    }

    /// Decides whether `key` may take `cost` permits, accepting a shaping algorithm's delay
    /// (leaky bucket shaper, warm-up) of up to `max_delay`, without waiting: an admitted
    /// decision's [`delay`](Decision::delay) is how long the caller must wait before going on,
    /// and its turn is reserved. For callers that schedule work themselves, and for
    /// simulations on a [`ManualClock`](crate::ManualClock).
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub fn reserve_now(
        &self,
        key: impl AsRef<[u8]>,
        cost: u64,
        max_delay: Duration,
    ) -> Result<Decision, Error> {
        let patience = u64::try_from(max_delay.as_micros()).unwrap_or(u64::MAX);
        self.decide_now(key.as_ref(), cost, Some(patience))
    }

    /// Every rule about `key`, decided now, allowing a shaping delay of `max_delay` µs.
    fn decide_now(&self, key: &[u8], cost: u64, max_delay: Option<u64>) -> Result<Decision, Error> {
        self.validate_key(key, cost)?;
        let items: Vec<_> = self.rules.iter().map(|r| r.planned(key, cost)).collect();
        let decisions = self.store.check_now(&items, now(&self.clock), max_delay);
        Ok(decisions.binding().expect("a limiter has a rule"))
    }

    /// Decides `items` all-or-nothing, as [`check_batch`](Self::check_batch) does, without a
    /// future.
    ///
    /// # Errors
    /// As [`check_batch`](Self::check_batch).
    pub fn check_batch_now(&self, items: &[Item<'_>]) -> Result<Decisions, Error> {
        let batch = self.batch(items)?;
        let decisions = self.store.check_now(&batch.planned, now(&self.clock), None);
        Ok(batch.spread(decisions))
    }
}

impl<P> RulePlan<P> {
    #[inline]
    fn planned<'a>(&'a self, key: &'a [u8], cost: u64) -> Planned<'a, P> {
        Planned {
            rule: &self.rule,
            plan: &self.plan,
            key,
            cost,
        }
    }
}

/// A batch as the store sees it, and where each item the caller gave went.
struct Batch<'a, P> {
    planned: Vec<Planned<'a, P>>,
    /// For each item given, its index in `planned`; empty when each item is its own.
    positions: Vec<usize>,
}

impl<P> Batch<'_, P> {
    /// One decision per item given, from the store's decisions of the merged items.
    fn spread(&self, decisions: Decisions) -> Decisions {
        if self.positions.is_empty() {
            return decisions;
        }
        Decisions::many(self.positions.iter().map(|&at| decisions[at]).collect())
    }
}

/// Rejects a key longer than [`MAX_KEY_LEN`].
#[inline]
fn validate_key(key: &[u8]) -> Result<(), Error> {
    if key.len() > MAX_KEY_LEN {
        return Err(Error::KeyTooLong {
            len: key.len(),
            max: MAX_KEY_LEN,
        });
    }
    Ok(())
}

/// Now, kept within the range the algorithms accept (0 means "never" in state words).
#[inline]
pub(crate) fn now(clock: &impl Clock) -> u64 {
    clock.now_micros().clamp(1, MAX_TIMESTAMP)
}

/// Repeats `attempt(patience)` until it admits, sleeping on `clock` for the delay a shaper
/// gave or the wait a denial asked for; gives up as soon as that wait exceeds what is left of
/// `timeout`, without sleeping first. `patience` is the µs left before the deadline.
async fn wait_until_admitted<F, Fut>(
    clock: &impl Clock,
    timeout: Duration,
    mut attempt: F,
) -> Result<Decision, Error>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<Decision, Error>>,
{
    let timeout_micros = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX);
    let deadline = now(clock).saturating_add(timeout_micros);
    loop {
        let patience = deadline.saturating_sub(now(clock));
        let decision = attempt(patience).await?;
        if decision.allowed() {
            if decision.delay_micros() > 0 {
                clock.sleep(decision.delay()).await;
            }
            return Ok(decision);
        }
        if decision.retry_after_micros() > patience {
            return Err(Error::Timeout {
                timeout,
                decision: Box::new(decision),
            });
        }
        clock
            .sleep(Duration::from_micros(decision.retry_after_micros()))
            .await;
    }
}

/// Configures a [`Limiter`].
#[derive(Debug)]
pub struct LimiterBuilder<S: Store = MemoryStore, C: Clock = SystemClock> {
    rules: Vec<Rule>,
    store: S,
    clock: C,
}

impl<S: Store, C: Clock> LimiterBuilder<S, C> {
    /// Adds a rule: [`Limiter::check`] asks every rule about its key.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Keeps state in `store` instead of a new memory store of its own.
    pub fn store<T: Store>(self, store: T) -> LimiterBuilder<T, C> {
        LimiterBuilder {
            rules: self.rules,
            store,
            clock: self.clock,
        }
    }

    /// Reads time from `clock` (e.g. a [`ManualClock`](crate::ManualClock) in tests).
    pub fn clock<D: Clock>(self, clock: D) -> LimiterBuilder<S, D> {
        LimiterBuilder {
            rules: self.rules,
            store: self.store,
            clock,
        }
    }

    /// Plans every rule on the store and builds the limiter.
    ///
    /// # Errors
    /// [`Error::Rule`] for two rules of one name, or a rule the store cannot hold.
    pub fn build(self) -> Result<Limiter<S, C>, Error> {
        let mut by_name = HashMap::with_capacity_and_hasher(self.rules.len(), Default::default());
        let mut rules = Vec::with_capacity(self.rules.len());
        for rule in self.rules {
            if by_name.insert(rule.name(), rules.len()).is_some() {
                return Err(Error::from(RuleError {
                    rule: rule.name().into(),
                    field: "name".into(),
                    reason: "two rules of one limiter have this name".into(),
                }));
            }
            let plan = self.store.plan(&rule)?;
            rules.push(RulePlan { rule, plan });
        }
        Ok(Limiter {
            rules: rules.into(),
            by_name,
            store: self.store,
            clock: self.clock,
        })
    }
}
