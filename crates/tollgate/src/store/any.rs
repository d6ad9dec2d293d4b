//! A store chosen at run time: the service reads which from its configuration. Each arm is one
//! of this crate's stores; a check costs one match over the arm.

#[cfg(feature = "redis")]
use super::{
    HybridPlan, HybridStore, InRegion, LeasePlan, LeaseStore, RedisPlan, RedisStore, RegionPlan,
    RegionStore, StoreFailures, StoreFuture,
};
use super::{LocalStore, MemoryPlan, MemoryStore, Planned, Store};
#[cfg(feature = "redis")]
use super::{ReservationRecord, Settle};
use crate::decision::Decisions;
use crate::error::Error;
use crate::rule::Rule;

/// One of this crate's stores, chosen at run time.
#[derive(Debug, Clone)]
pub enum AnyStore {
    /// Process memory.
    Memory(MemoryStore),
    /// Redis strict: one atomic round trip per check.
    #[cfg(feature = "redis")]
    Redis(RedisStore),
    /// Decided in memory, synced with Redis in the background.
    #[cfg(feature = "redis")]
    Hybrid(HybridStore),
    /// Permits leased from Redis in batches.
    #[cfg(feature = "redis")]
    Lease(LeaseStore),
    /// This region's store, and global rules across regions.
    #[cfg(feature = "redis")]
    Regions(RegionStore<AnyStore>),
}

/// What a rule is in an [`AnyStore`]: the plan of its arm.
#[derive(Debug)]
pub enum AnyPlan {
    /// Planned on the memory store.
    Memory(MemoryPlan),
    /// Planned on the Redis store.
    #[cfg(feature = "redis")]
    Redis(RedisPlan),
    /// Planned on the hybrid store.
    #[cfg(feature = "redis")]
    Hybrid(HybridPlan),
    /// Planned on the lease store.
    #[cfg(feature = "redis")]
    Lease(LeasePlan),
    /// Planned on a store of regions.
    #[cfg(feature = "redis")]
    Regions(Box<RegionPlan<AnyPlan>>),
}

impl AnyPlan {
    fn memory(&self) -> Option<&MemoryPlan> {
        match self {
            Self::Memory(p) => Some(p),
            #[cfg(feature = "redis")]
            _ => None,
        }
    }

    #[cfg(feature = "redis")]
    fn redis(&self) -> Option<&RedisPlan> {
        match self {
            Self::Redis(p) => Some(p),
            _ => None,
        }
    }

    #[cfg(feature = "redis")]
    fn hybrid(&self) -> Option<&HybridPlan> {
        match self {
            Self::Hybrid(p) => Some(p),
            _ => None,
        }
    }

    #[cfg(feature = "redis")]
    fn lease(&self) -> Option<&LeasePlan> {
        match self {
            Self::Lease(p) => Some(p),
            _ => None,
        }
    }

    #[cfg(feature = "redis")]
    fn regions(&self) -> Option<&RegionPlan<AnyPlan>> {
        match self {
            Self::Regions(p) => Some(p),
            _ => None,
        }
    }
}

impl AnyStore {
    /// The name of the arm: `memory`, `redis`, `hybrid` or `lease` (for a store of regions,
    /// its region's store's).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Memory(_) => "memory",
            #[cfg(feature = "redis")]
            Self::Redis(_) => "redis",
            #[cfg(feature = "redis")]
            Self::Hybrid(_) => "hybrid",
            #[cfg(feature = "redis")]
            Self::Lease(_) => "lease",
            #[cfg(feature = "redis")]
            Self::Regions(r) => r.local().kind(),
        }
    }

    /// The store of regions, if this is one.
    #[cfg(feature = "redis")]
    pub fn regions(&self) -> Option<&RegionStore<AnyStore>> {
        match self {
            Self::Regions(r) => Some(r),
            _ => None,
        }
    }

    /// The failed calls of a shared store; `None` for process memory, which makes none.
    #[cfg(feature = "redis")]
    pub fn failures(&self) -> Option<StoreFailures> {
        match self {
            Self::Memory(_) => None,
            Self::Redis(r) => Some(r.failures()),
            Self::Hybrid(h) => Some(h.failures()),
            Self::Lease(l) => Some(l.failures()),
            Self::Regions(r) => r.local().failures(),
        }
    }

    /// The Redis store under a shared store; `None` for process memory.
    #[cfg(feature = "redis")]
    pub fn redis(&self) -> Option<&RedisStore> {
        match self {
            Self::Memory(_) => None,
            Self::Redis(r) => Some(r),
            Self::Hybrid(h) => Some(h.redis()),
            Self::Lease(l) => Some(l.redis()),
            Self::Regions(r) => r.local().redis(),
        }
    }

    /// Whether a shared store's failure policies decide now, because its backend keeps
    /// failing; never for process memory.
    #[cfg(feature = "redis")]
    pub fn degraded(&self) -> bool {
        match self {
            Self::Memory(_) => false,
            Self::Redis(r) => r.degraded(),
            Self::Hybrid(h) => h.degraded(),
            Self::Lease(l) => l.degraded(),
            Self::Regions(r) => r.local().degraded(),
        }
    }
}

/// The items of one arm, each pointing at its arm's plan; `None` when a plan belongs to another
/// arm (impossible through a [`Limiter`](crate::Limiter), which plans on the store it holds).
fn narrow<'a, P>(
    items: &[Planned<'a, AnyPlan>],
    arm: impl Fn(&'a AnyPlan) -> Option<&'a P>,
) -> Option<Narrowed<'a, P>> {
    match items {
        [item] => Some(Narrowed::One([narrow_one(item, arm)?])),
        items => items
            .iter()
            .map(|i| narrow_one(i, &arm))
            .collect::<Option<_>>()
            .map(Narrowed::Many),
    }
}

/// Items of one arm: a single item (most checks) without a list of its own.
enum Narrowed<'a, P> {
    One([Planned<'a, P>; 1]),
    Many(Vec<Planned<'a, P>>),
}

impl<'a, P> std::ops::Deref for Narrowed<'a, P> {
    type Target = [Planned<'a, P>];

    fn deref(&self) -> &Self::Target {
        match self {
            Self::One(one) => one,
            Self::Many(many) => many,
        }
    }
}

/// One item of an arm; `None` when its plan belongs to another arm.
fn narrow_one<'a, P>(
    item: &Planned<'a, AnyPlan>,
    arm: impl Fn(&'a AnyPlan) -> Option<&'a P>,
) -> Option<Planned<'a, P>> {
    Some(Planned {
        rule: item.rule,
        plan: arm(item.plan)?,
        key: item.key,
        cost: item.cost,
    })
}

fn foreign() -> Error {
    Error::Store {
        message: "a rule planned on another store was checked on this one".into(),
        transient: false,
    }
}

impl Store for AnyStore {
    type Plan = AnyPlan;

    fn plan(&self, rule: &Rule) -> Result<AnyPlan, Error> {
        Ok(match self {
            Self::Memory(s) => AnyPlan::Memory(s.plan(rule)?),
            #[cfg(feature = "redis")]
            Self::Redis(s) => AnyPlan::Redis(s.plan(rule)?),
            #[cfg(feature = "redis")]
            Self::Hybrid(s) => AnyPlan::Hybrid(s.plan(rule)?),
            #[cfg(feature = "redis")]
            Self::Lease(s) => AnyPlan::Lease(s.plan(rule)?),
            #[cfg(feature = "redis")]
            Self::Regions(s) => AnyPlan::Regions(Box::new(s.plan(rule)?)),
        })
    }

    async fn check(
        &self,
        items: &[Planned<'_, AnyPlan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> Result<Decisions, Error> {
        // The memory store decides at once, a single item without a list. A remote store's
        // check is a large future (the Redis store's: 840 bytes), boxed so that every check
        // through this type, memory ones included, does not carry and move it.
        match self {
            Self::Memory(s) => {
                if let [item] = items {
                    let item = narrow_one(item, AnyPlan::memory).ok_or_else(foreign)?;
                    return Ok(Decisions::one(s.check_one_now(&item, now, max_delay)));
                }
                let items = narrow(items, AnyPlan::memory).ok_or_else(foreign)?;
                Ok(s.check_now(&items, now, max_delay))
            }
            #[cfg(feature = "redis")]
            Self::Redis(s) => {
                let items = narrow(items, AnyPlan::redis).ok_or_else(foreign)?;
                Box::pin(s.check(&items, now, max_delay)).await
            }
            #[cfg(feature = "redis")]
            Self::Hybrid(s) => {
                let items = narrow(items, AnyPlan::hybrid).ok_or_else(foreign)?;
                Box::pin(s.check(&items, now, max_delay)).await
            }
            #[cfg(feature = "redis")]
            Self::Lease(s) => {
                let items = narrow(items, AnyPlan::lease).ok_or_else(foreign)?;
                Box::pin(s.check(&items, now, max_delay)).await
            }
            #[cfg(feature = "redis")]
            Self::Regions(s) => {
                let items = narrow(items, AnyPlan::regions).ok_or_else(foreign)?;
                Box::pin(s.check(&items, now, max_delay)).await
            }
        }
    }

    fn settles(&self) -> Result<(), Error> {
        match self {
            Self::Memory(s) => s.settles(),
            #[cfg(feature = "redis")]
            Self::Redis(s) => s.settles(),
            #[cfg(feature = "redis")]
            Self::Hybrid(s) => s.settles(),
            #[cfg(feature = "redis")]
            Self::Lease(s) => s.settles(),
            #[cfg(feature = "redis")]
            Self::Regions(s) => s.settles(),
        }
    }

    async fn settle(
        &self,
        items: &[Planned<'_, AnyPlan>],
        now: u64,
        settle: super::Settle,
    ) -> Result<Decisions, Error> {
        match self {
            Self::Memory(s) => {
                let items = narrow(items, AnyPlan::memory).ok_or_else(foreign)?;
                s.settle(&items, now, settle).await
            }
            #[cfg(feature = "redis")]
            Self::Redis(s) => {
                let items = narrow(items, AnyPlan::redis).ok_or_else(foreign)?;
                s.settle(&items, now, settle).await
            }
            #[cfg(feature = "redis")]
            Self::Hybrid(s) => {
                let items = narrow(items, AnyPlan::hybrid).ok_or_else(foreign)?;
                s.settle(&items, now, settle).await
            }
            #[cfg(feature = "redis")]
            Self::Lease(s) => {
                let items = narrow(items, AnyPlan::lease).ok_or_else(foreign)?;
                s.settle(&items, now, settle).await
            }
            #[cfg(feature = "redis")]
            Self::Regions(s) => {
                let items = narrow(items, AnyPlan::regions).ok_or_else(foreign)?;
                Box::pin(s.settle(&items, now, settle)).await
            }
        }
    }

    async fn keep_reservation(
        &self,
        record: &super::ReservationRecord,
        now: u64,
    ) -> Result<(), Error> {
        match self {
            Self::Memory(s) => s.keep_reservation(record, now).await,
            #[cfg(feature = "redis")]
            Self::Redis(s) => s.keep_reservation(record, now).await,
            #[cfg(feature = "redis")]
            Self::Hybrid(s) => s.keep_reservation(record, now).await,
            #[cfg(feature = "redis")]
            Self::Lease(s) => s.keep_reservation(record, now).await,
            #[cfg(feature = "redis")]
            Self::Regions(s) => Box::pin(s.keep_reservation(record, now)).await,
        }
    }

    async fn reserve(
        &self,
        items: &[Planned<'_, AnyPlan>],
        now: u64,
        record: &super::ReservationRecord,
    ) -> Result<(Decisions, bool), Error> {
        #[cfg(feature = "redis")]
        if let Self::Redis(s) = self {
            let items = narrow(items, AnyPlan::redis).ok_or_else(foreign)?;
            return Box::pin(s.reserve(&items, now, record)).await;
        }
        Box::pin(super::reserve_apart(self, items, now, record)).await
    }

    fn kept_record(&self, id: &str) -> Option<super::ReservationRecord> {
        #[cfg(feature = "redis")]
        if let Self::Redis(s) = self {
            return s.kept_record(id);
        }
        let _ = id;
        None
    }

    async fn commit(
        &self,
        id: &str,
        items: &[Planned<'_, AnyPlan>],
        at: u64,
        actual: u64,
        now: u64,
    ) -> Result<super::Committed, Error> {
        #[cfg(feature = "redis")]
        if let Self::Redis(s) = self {
            let items = narrow(items, AnyPlan::redis).ok_or_else(foreign)?;
            return Box::pin(s.commit(id, &items, at, actual, now)).await;
        }
        Box::pin(super::commit_apart(self, id, items, at, actual, now)).await
    }

    async fn take_reservation(
        &self,
        id: &str,
        now: u64,
    ) -> Result<Option<super::ReservationRecord>, Error> {
        match self {
            Self::Memory(s) => s.take_reservation(id, now).await,
            #[cfg(feature = "redis")]
            Self::Redis(s) => s.take_reservation(id, now).await,
            #[cfg(feature = "redis")]
            Self::Hybrid(s) => s.take_reservation(id, now).await,
            #[cfg(feature = "redis")]
            Self::Lease(s) => s.take_reservation(id, now).await,
            #[cfg(feature = "redis")]
            Self::Regions(s) => Box::pin(s.take_reservation(id, now)).await,
        }
    }

    async fn expired_reservations(
        &self,
        now: u64,
        limit: usize,
    ) -> Result<Vec<super::ReservationRecord>, Error> {
        match self {
            Self::Memory(s) => s.expired_reservations(now, limit).await,
            #[cfg(feature = "redis")]
            Self::Redis(s) => s.expired_reservations(now, limit).await,
            #[cfg(feature = "redis")]
            Self::Hybrid(s) => s.expired_reservations(now, limit).await,
            #[cfg(feature = "redis")]
            Self::Lease(s) => s.expired_reservations(now, limit).await,
            #[cfg(feature = "redis")]
            Self::Regions(s) => Box::pin(s.expired_reservations(now, limit)).await,
        }
    }

    async fn reset(&self, items: &[Planned<'_, AnyPlan>], now: u64) -> Result<(), Error> {
        match self {
            Self::Memory(s) => {
                let items = narrow(items, AnyPlan::memory).ok_or_else(foreign)?;
                s.reset(&items, now).await
            }
            #[cfg(feature = "redis")]
            Self::Redis(s) => {
                let items = narrow(items, AnyPlan::redis).ok_or_else(foreign)?;
                s.reset(&items, now).await
            }
            #[cfg(feature = "redis")]
            Self::Hybrid(s) => {
                let items = narrow(items, AnyPlan::hybrid).ok_or_else(foreign)?;
                s.reset(&items, now).await
            }
            #[cfg(feature = "redis")]
            Self::Lease(s) => {
                let items = narrow(items, AnyPlan::lease).ok_or_else(foreign)?;
                s.reset(&items, now).await
            }
            #[cfg(feature = "redis")]
            Self::Regions(s) => {
                let items = narrow(items, AnyPlan::regions).ok_or_else(foreign)?;
                Box::pin(s.reset(&items, now)).await
            }
        }
    }

    async fn shutdown(&self) {
        match self {
            Self::Memory(s) => s.shutdown().await,
            #[cfg(feature = "redis")]
            Self::Redis(s) => s.shutdown().await,
            #[cfg(feature = "redis")]
            Self::Hybrid(s) => s.shutdown().await,
            #[cfg(feature = "redis")]
            Self::Lease(s) => s.shutdown().await,
            #[cfg(feature = "redis")]
            Self::Regions(s) => Box::pin(s.shutdown()).await,
        }
    }
}

#[cfg(feature = "redis")]
impl InRegion for AnyStore {
    type Plan = AnyPlan;

    fn plan(&self, rule: &Rule) -> Result<AnyPlan, Error> {
        Store::plan(self, rule)
    }

    fn redis(&self) -> Option<&RedisStore> {
        AnyStore::redis(self)
    }

    fn settles(&self) -> Result<(), Error> {
        Store::settles(self)
    }

    fn check<'a>(
        &'a self,
        items: &'a [Planned<'a, AnyPlan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> StoreFuture<'a, Result<Decisions, Error>> {
        Box::pin(Store::check(self, items, now, max_delay))
    }

    fn settle<'a>(
        &'a self,
        items: &'a [Planned<'a, AnyPlan>],
        now: u64,
        settle: Settle,
    ) -> StoreFuture<'a, Result<Decisions, Error>> {
        Box::pin(Store::settle(self, items, now, settle))
    }

    fn keep<'a>(
        &'a self,
        record: &'a ReservationRecord,
        now: u64,
    ) -> StoreFuture<'a, Result<(), Error>> {
        Box::pin(self.keep_reservation(record, now))
    }

    fn take<'a>(
        &'a self,
        id: &'a str,
        now: u64,
    ) -> StoreFuture<'a, Result<Option<ReservationRecord>, Error>> {
        Box::pin(self.take_reservation(id, now))
    }

    fn expired(
        &self,
        now: u64,
        limit: usize,
    ) -> StoreFuture<'_, Result<Vec<ReservationRecord>, Error>> {
        Box::pin(self.expired_reservations(now, limit))
    }

    fn reset<'a>(
        &'a self,
        items: &'a [Planned<'a, AnyPlan>],
        now: u64,
    ) -> StoreFuture<'a, Result<(), Error>> {
        Box::pin(Store::reset(self, items, now))
    }

    fn shutdown(&self) -> StoreFuture<'_, ()> {
        Box::pin(Store::shutdown(self))
    }
}
