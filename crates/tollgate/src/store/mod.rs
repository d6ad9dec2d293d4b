//! Stores keep the state of keys; the algorithms decide over it. One [`Store`] trait, one
//! implementation per place state lives: process memory, and with the `redis` feature, Redis
//! strict, hybrid and lease. Remote stores share one [guard](guard) that applies each rule's
//! failure policy behind a timeout and a circuit breaker per backend.

mod any;
mod book;
mod buckets;
mod lock;
mod memory;
mod table;
mod tags;

#[cfg(feature = "redis")]
mod breaker;
#[cfg(feature = "redis")]
pub(crate) mod guard;
#[cfg(feature = "redis")]
mod hybrid;
#[cfg(feature = "redis")]
mod lease;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
mod regions;

use std::fmt;
use std::future::Future;

pub use any::{AnyPlan, AnyStore};
pub use book::{DEFAULT_MAX_RESERVATIONS, ReservationRecord, ReservedItem};
#[cfg(feature = "redis")]
pub use guard::StoreFailures;
#[cfg(feature = "redis")]
pub use hybrid::{HybridConfig, HybridPlan, HybridStats, HybridStore};
#[cfg(feature = "redis")]
pub use lease::{LeaseConfig, LeasePlan, LeaseStats, LeaseStore};
pub use memory::{MIN_MAX_BYTES, MemoryPlan, MemoryStore, MemoryStoreBuilder, WhenFull};
#[cfg(feature = "redis")]
pub use redis::{NodeHealth, RedisPlan, RedisStore, RedisStoreBuilder, StoreTime};
#[cfg(feature = "redis")]
pub use regions::{
    InRegion, Peer, PeerHealth, RegionPlan, RegionStore, RegionsConfig, StoreFuture,
};

pub(crate) use crate::algorithm::Settle;
use crate::decision::{Decision, Decisions};
use crate::error::Error;
#[cfg(feature = "redis")]
use crate::error::RuleError;
use crate::rule::Rule;

/// The longest key accepted, in bytes: a store sizes its entries by it.
pub const MAX_KEY_LEN: usize = 4_096;

/// The most items one batch may hold.
pub const MAX_BATCH: usize = 1_024;

/// The algorithms the hybrid store holds: counts that add up across instances.
#[cfg(feature = "redis")]
const HYBRID_ALGORITHMS: &[&str] = &["fixed_window", "sliding_window", "hit_counter"];

/// The algorithms the lease store holds: a budget of permits per window, leased ahead.
#[cfg(feature = "redis")]
const LEASE_ALGORITHMS: &[&str] = &["fixed_window", "hit_counter"];

/// The error of a shared store (`hybrid` or `lease`) that cannot hold `rule`'s algorithm:
/// what the store holds, why, and which stores hold the rule's algorithm.
#[cfg(feature = "redis")]
fn unsupported(rule: &Rule, store: &str, why: &str) -> Error {
    let (holds, other) = match store {
        "hybrid" => (HYBRID_ALGORITHMS, ("lease", LEASE_ALGORITHMS)),
        _ => (LEASE_ALGORITHMS, ("hybrid", HYBRID_ALGORITHMS)),
    };
    let name = rule.algorithm().name();
    let mut elsewhere = vec!["the strict Redis store"];
    let alternative = format!("the {} store", other.0);
    if other.1.contains(&name) {
        elsewhere.push(&alternative);
    }
    Error::from(RuleError {
        rule: rule.name().into(),
        field: "algorithm".into(),
        reason: format!(
            "the {store} store holds only {} ({why}); {name} is held by {} and the memory \
             store",
            match holds {
                [.., last] if holds.len() > 1 =>
                    format!("{} and {last}", holds[..holds.len() - 1].join(", ")),
                _ => holds.join(""),
            },
            elsewhere.join(", "),
        ),
    })
}

/// What became of a reservation committed.
#[derive(Debug)]
pub enum Committed {
    /// Settled: each item's decision after, as a look sees it.
    Settled(Decisions),
    /// No open record: never made, settled already, or expired and settled.
    Unknown,
    /// Its record, taken out after it expired: the caller settles it as its rules say.
    Expired(ReservationRecord),
}

/// [`Store::reserve`] in two steps: the check, then the record, given back when the record
/// is refused.
///
/// # Errors
/// As [`Store::keep_reservation`].
pub(crate) async fn reserve_apart<S: Store>(
    store: &S,
    items: &[Planned<'_, S::Plan>],
    now: u64,
    record: &ReservationRecord,
) -> Result<(Decisions, bool), Error> {
    let decisions = store.check(items, now, None).await?;
    let by_policy = decisions.iter().any(|d| {
        matches!(
            d.source(),
            crate::Source::FailOpen | crate::Source::FailClosed | crate::Source::Fallback
        )
    });
    if !decisions.allowed() || by_policy {
        return Ok((decisions, false));
    }
    if let Err(e) = store.keep_reservation(record, now).await {
        // Nothing may stay taken for a reservation nobody can settle.
        let credit = Settle::Credit { at: now };
        if let Err(lost) = store.settle(items, now, credit).await {
            tracing::warn!(error = %lost, "a refused reservation's estimate stays taken");
        }
        return Err(e);
    }
    Ok((decisions, true))
}

/// [`Store::commit`] in two steps: the record taken out, then the settlement.
///
/// # Errors
/// As [`Store::settle`].
pub(crate) async fn commit_apart<S: Store>(
    store: &S,
    id: &str,
    items: &[Planned<'_, S::Plan>],
    at: u64,
    actual: u64,
    now: u64,
) -> Result<Committed, Error> {
    let Some(record) = store.take_reservation(id, now).await? else {
        return Ok(Committed::Unknown);
    };
    if record.expires <= now {
        return Ok(Committed::Expired(record));
    }
    settle_at(store, items, at, actual, now)
        .await
        .map(Committed::Settled)
}

/// Settles `items`, each at its estimate (its cost, taken at `at`), at the real cost
/// `actual`: an item whose estimate was short takes the excess ([`Settle::Report`]), one
/// whose estimate was more gives back the difference ([`Settle::Credit`]), one that was
/// exact is looked at; slots held (a concurrency rule's) all come back. The decisions of every item, in order.
///
/// # Errors
/// As [`Store::settle`].
pub(crate) async fn settle_at<S: Store>(
    store: &S,
    items: &[Planned<'_, S::Plan>],
    at: u64,
    actual: u64,
    now: u64,
) -> Result<Decisions, Error> {
    let mut decisions: Vec<Option<Decision>> = vec![None; items.len()];
    let kinds = [None, Some(Settle::Report), Some(Settle::Credit { at })];
    for kind in kinds {
        let (places, group): (Vec<usize>, Vec<Planned<'_, S::Plan>>) = items
            .iter()
            .enumerate()
            .filter_map(|(place, item)| {
                let (settle, cost) = match actual.cmp(&item.cost) {
                    // Slots held come back whole, whatever the work cost.
                    _ if item.rule.algorithm().holds_slots() => {
                        (Some(Settle::Credit { at }), item.cost)
                    }
                    std::cmp::Ordering::Greater => (Some(Settle::Report), actual - item.cost),
                    std::cmp::Ordering::Less => (Some(Settle::Credit { at }), item.cost - actual),
                    std::cmp::Ordering::Equal => (None, 0),
                };
                (settle == kind).then(|| (place, item.with_cost(cost)))
            })
            .unzip();
        if group.is_empty() {
            continue;
        }
        let settled = match kind {
            Some(settle) => store.settle(&group, now, settle).await?,
            None => store.check(&group, now, None).await?,
        };
        for (place, decision) in places.into_iter().zip(settled.iter()) {
            decisions[place] = Some(*decision);
        }
    }
    Ok(Decisions::many(decisions.into_iter().flatten().collect()))
}

/// Refuses a rule with a calendar period on `store` (hybrid, lease), whose instances count
/// windows of one length apart.
#[cfg(feature = "redis")]
fn no_calendar(rule: &Rule, store: &str) -> Result<(), Error> {
    match rule
        .tiers()
        .iter()
        .position(|t| t.calendar_period().is_some())
    {
        None => Ok(()),
        Some(i) => Err(Error::from(RuleError {
            rule: rule.name().into(),
            field: format!("tiers[{i}].period"),
            reason: format!(
                "the {store} store counts windows of one length in each instance: a calendar \
                 period takes the memory store or the strict Redis store"
            ),
        })),
    }
}

/// One item of a batch as a store sees it: `cost` permits of `key` under `rule`, which the
/// store planned as `plan`. Built by the [`Limiter`](crate::Limiter).
#[derive(Debug)]
pub struct Planned<'a, P> {
    pub(crate) rule: &'a Rule,
    pub(crate) plan: &'a P,
    pub(crate) key: &'a [u8],
    pub(crate) cost: u64,
}

impl<'a, P> Planned<'a, P> {
    /// The same item at `cost`.
    pub(crate) fn with_cost(&self, cost: u64) -> Self {
        Self {
            rule: self.rule,
            plan: self.plan,
            key: self.key,
            cost,
        }
    }
}

/// Where the state of keys lives. A store decides a batch of items all-or-nothing, across
/// rules: the batch is admitted only if every item is (rules in shadow mode aside), and then
/// every item consumes its cost; otherwise none does. Items are distinct (rule, key) pairs.
///
/// Stores are cheap to clone (clones share their state and connections) and safe to use from
/// any number of tasks at once. Implemented by the stores of this crate.
pub trait Store: Clone + Send + Sync + 'static {
    /// What the store prepares once per rule: a tag in a table, key names, arguments.
    type Plan: fmt::Debug + Send + Sync + 'static;

    /// Prepares `rule` for checks. Planning a rule again (a hot reload) is cheap, and a rule
    /// of the same name and state layout finds its keys' state again.
    ///
    /// # Errors
    /// [`Error::Rule`] when this store cannot hold the rule (an algorithm it does not support,
    /// a state larger than its bounds).
    fn plan(&self, rule: &Rule) -> Result<Self::Plan, Error>;

    /// Decides `items` at `now` (µs since the epoch, the limiter's clock; a store may decide
    /// on its own clock instead). `max_delay` is how long the caller accepts to wait for a
    /// shaping algorithm (`None`: a plain check).
    ///
    /// # Errors
    /// [`Error::Store`] only from a store without a failure policy; the remote stores of this
    /// crate decide by the rule's policy instead.
    fn check(
        &self,
        items: &[Planned<'_, Self::Plan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> impl Future<Output = Result<Decisions, Error>> + Send;

    /// Whether the store takes settlements and reservations; one that does not refuses them
    /// with [`Error::Unsupported`], taking nothing.
    fn settles(&self) -> Result<(), Error>;

    /// Settles `items` at `now` (µs, as for [`check`](Self::check)): takes each item's cost
    /// whatever its key's state ([`Settle::Report`]), or gives it back
    /// ([`Settle::Credit`]); each item on its own, as nothing is refused. The decisions say
    /// what each key has left after it, as a look (cost 0) sees it: denied while in debt.
    ///
    /// # Errors
    /// [`Error::Store`] when a shared store's backend did not take it: no failure policy
    /// makes up a settlement. [`Error::Unsupported`] from a store that does not hold
    /// settlements (the hybrid and lease stores count admitted permits only).
    fn settle(
        &self,
        items: &[Planned<'_, Self::Plan>],
        now: u64,
        settle: Settle,
    ) -> impl Future<Output = Result<Decisions, Error>> + Send;

    /// Keeps a reservation's record (see [`ReservationRecord`]) until it is taken out or expires, at
    /// `now` (µs).
    ///
    /// # Errors
    /// [`Error::ReservationsFull`] when the store holds its most open reservations already;
    /// [`Error::Unsupported`] when it holds none (hybrid, lease); [`Error::Store`] when a
    /// shared store did not take it.
    fn keep_reservation(
        &self,
        record: &ReservationRecord,
        now: u64,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Decides `items` as [`check`](Self::check) does and, when the store admitted them (no
    /// failure policy decided), keeps `record` as [`keep_reservation`](Self::keep_reservation)
    /// does: in one call where the store can (Redis on one server), so that nothing comes
    /// between. Returns the decisions and whether the record was kept; when it is not kept,
    /// nothing stays taken.
    ///
    /// # Errors
    /// As [`keep_reservation`](Self::keep_reservation).
    fn reserve(
        &self,
        items: &[Planned<'_, Self::Plan>],
        now: u64,
        record: &ReservationRecord,
    ) -> impl Future<Output = Result<(Decisions, bool), Error>> + Send {
        reserve_apart(self, items, now, record)
    }

    /// The record of reservation `id`, if this store kept it and still remembers it, forgotten
    /// here (not in the book): a store whose [`commit`](Self::commit) is one call (Redis on
    /// one server) remembers the latest records it kept, so that a limiter commits them
    /// without reading them first. None by default.
    fn kept_record(&self, id: &str) -> Option<ReservationRecord> {
        let _ = id;
        None
    }

    /// Takes reservation `id`'s record out and, if it was open at `now`, settles `items` (its
    /// items, each at its estimate, taken at `at`) at the real cost `actual`: each item takes
    /// what `actual` exceeds its estimate by, or gives back what it falls short of it by. In
    /// one call where the store can; a limiter calls it with a record from
    /// [`kept_record`](Self::kept_record).
    ///
    /// # Errors
    /// As [`settle`](Self::settle).
    fn commit(
        &self,
        id: &str,
        items: &[Planned<'_, Self::Plan>],
        at: u64,
        actual: u64,
        now: u64,
    ) -> impl Future<Output = Result<Committed, Error>> + Send {
        commit_apart(self, id, items, at, actual, now)
    }

    /// Takes the record of reservation `id` out: `None` when there is none (unknown, settled,
    /// or expired and taken out by [`expired_reservations`](Self::expired_reservations)).
    /// Each record is taken out once, whatever the concurrency.
    ///
    /// # Errors
    /// As [`keep_reservation`](Self::keep_reservation).
    fn take_reservation(
        &self,
        id: &str,
        now: u64,
    ) -> impl Future<Output = Result<Option<ReservationRecord>, Error>> + Send;

    /// Takes out up to `limit` records expired at `now` (µs), oldest first: each is handed
    /// to one caller only, so that it is settled once.
    ///
    /// # Errors
    /// As [`keep_reservation`](Self::keep_reservation).
    fn expired_reservations(
        &self,
        now: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ReservationRecord>, Error>> + Send;

    /// Finishes what the store holds for the shared state (pending counts, unused leases)
    /// before the process exits. Checks after it still work, from process memory.
    fn shutdown(&self) -> impl Future<Output = ()> + Send;

    /// Forgets the state of each item's key under its rule (costs are unused) at `now` (µs,
    /// as for [`check`](Self::check)): its next check finds it as a key never seen. For an
    /// operator who lifts a limit on one key by hand.
    ///
    /// # Errors
    /// [`Error::Store`] when a shared store's backend did not take it.
    fn reset(
        &self,
        items: &[Planned<'_, Self::Plan>],
        now: u64,
    ) -> impl Future<Output = Result<(), Error>> + Send;
}

/// A store that decides in this process without waiting: the memory store, and the hybrid
/// store, whose decisions never wait for Redis.
pub trait LocalStore: Store {
    /// Decides one item now, as [`Store::check`] does, without waiting.
    fn check_one_now(
        &self,
        item: &Planned<'_, Self::Plan>,
        now: u64,
        max_delay: Option<u64>,
    ) -> Decision;

    /// Decides `items` now, as [`Store::check`] does, without waiting.
    fn check_now(
        &self,
        items: &[Planned<'_, Self::Plan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> Decisions;
}
