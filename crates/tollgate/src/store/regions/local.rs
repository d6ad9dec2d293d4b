//! This region's store as the store of regions calls it, its futures boxed: a store of
//! regions is itself an arm of [`AnyStore`](crate::AnyStore), which is its region's store, so
//! its futures cannot name the region's store's without naming their own.

use std::future::Future;
use std::pin::Pin;

use crate::decision::Decisions;
use crate::error::Error;
use crate::rule::Rule;
use crate::store::redis::RedisStore;
use crate::store::{Planned, ReservationRecord, Settle};

/// A boxed future of an [`InRegion`] store.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The store that keeps a region's per-region rules, as a [`RegionStore`](super::RegionStore)
/// calls it: [`Store`](crate::Store)'s calls, each future boxed. Implemented by
/// [`AnyStore`](crate::AnyStore).
pub trait InRegion: Send + Sync + std::fmt::Debug + 'static {
    /// What the store plans for a rule.
    type Plan: std::fmt::Debug + Send + Sync + 'static;

    /// As [`Store::plan`](crate::Store::plan).
    ///
    /// # Errors
    /// As [`Store::plan`](crate::Store::plan).
    fn plan(&self, rule: &Rule) -> Result<Self::Plan, Error>;

    /// The Redis the store keeps its state in, where global rules' counts live too; `None`
    /// for process memory.
    fn redis(&self) -> Option<&RedisStore>;

    /// As [`Store::settles`](crate::Store::settles).
    ///
    /// # Errors
    /// As [`Store::settles`](crate::Store::settles).
    fn settles(&self) -> Result<(), Error>;

    /// As [`Store::check`](crate::Store::check).
    fn check<'a>(
        &'a self,
        items: &'a [Planned<'a, Self::Plan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> StoreFuture<'a, Result<Decisions, Error>>;

    /// As [`Store::settle`](crate::Store::settle).
    fn settle<'a>(
        &'a self,
        items: &'a [Planned<'a, Self::Plan>],
        now: u64,
        settle: Settle,
    ) -> StoreFuture<'a, Result<Decisions, Error>>;

    /// As [`Store::keep_reservation`](crate::Store::keep_reservation).
    fn keep<'a>(
        &'a self,
        record: &'a ReservationRecord,
        now: u64,
    ) -> StoreFuture<'a, Result<(), Error>>;

    /// As [`Store::take_reservation`](crate::Store::take_reservation).
    fn take<'a>(
        &'a self,
        id: &'a str,
        now: u64,
    ) -> StoreFuture<'a, Result<Option<ReservationRecord>, Error>>;

    /// As [`Store::expired_reservations`](crate::Store::expired_reservations).
    fn expired(
        &self,
        now: u64,
        limit: usize,
    ) -> StoreFuture<'_, Result<Vec<ReservationRecord>, Error>>;

    /// As [`Store::reset`](crate::Store::reset).
    fn reset<'a>(
        &'a self,
        items: &'a [Planned<'a, Self::Plan>],
        now: u64,
    ) -> StoreFuture<'a, Result<(), Error>>;

    /// As [`Store::shutdown`](crate::Store::shutdown).
    fn shutdown(&self) -> StoreFuture<'_, ()>;
}
