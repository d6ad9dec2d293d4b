//! This region's store as the store of regions calls it: an [`AnyStore`] behind an object,
//! whose futures are boxed. A store of regions is itself an arm of [`AnyStore`], so its
//! futures cannot name the local store's without naming their own.

use std::future::Future;
use std::pin::Pin;

use crate::decision::Decisions;
use crate::error::Error;
use crate::store::{AnyPlan, AnyStore, Planned, ReservationRecord, Settle, Store};

pub(super) type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`Store`]'s calls on this region's store, each future boxed.
pub(super) trait Local: Send + Sync + std::fmt::Debug {
    fn any(&self) -> &AnyStore;

    fn check<'a>(
        &'a self,
        items: &'a [Planned<'a, AnyPlan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> Boxed<'a, Result<Decisions, Error>>;

    fn settle<'a>(
        &'a self,
        items: &'a [Planned<'a, AnyPlan>],
        now: u64,
        settle: Settle,
    ) -> Boxed<'a, Result<Decisions, Error>>;

    fn keep<'a>(&'a self, record: &'a ReservationRecord, now: u64) -> Boxed<'a, Result<(), Error>>;

    fn take<'a>(
        &'a self,
        id: &'a str,
        now: u64,
    ) -> Boxed<'a, Result<Option<ReservationRecord>, Error>>;

    fn expired(&self, now: u64, limit: usize) -> Boxed<'_, Result<Vec<ReservationRecord>, Error>>;

    fn reset<'a>(
        &'a self,
        items: &'a [Planned<'a, AnyPlan>],
        now: u64,
    ) -> Boxed<'a, Result<(), Error>>;

    fn shutdown(&self) -> Boxed<'_, ()>;
}

impl Local for AnyStore {
    fn any(&self) -> &AnyStore {
        self
    }

    fn check<'a>(
        &'a self,
        items: &'a [Planned<'a, AnyPlan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> Boxed<'a, Result<Decisions, Error>> {
        Box::pin(Store::check(self, items, now, max_delay))
    }

    fn settle<'a>(
        &'a self,
        items: &'a [Planned<'a, AnyPlan>],
        now: u64,
        settle: Settle,
    ) -> Boxed<'a, Result<Decisions, Error>> {
        Box::pin(Store::settle(self, items, now, settle))
    }

    fn keep<'a>(&'a self, record: &'a ReservationRecord, now: u64) -> Boxed<'a, Result<(), Error>> {
        Box::pin(self.keep_reservation(record, now))
    }

    fn take<'a>(
        &'a self,
        id: &'a str,
        now: u64,
    ) -> Boxed<'a, Result<Option<ReservationRecord>, Error>> {
        Box::pin(self.take_reservation(id, now))
    }

    fn expired(&self, now: u64, limit: usize) -> Boxed<'_, Result<Vec<ReservationRecord>, Error>> {
        Box::pin(self.expired_reservations(now, limit))
    }

    fn reset<'a>(
        &'a self,
        items: &'a [Planned<'a, AnyPlan>],
        now: u64,
    ) -> Boxed<'a, Result<(), Error>> {
        Box::pin(Store::reset(self, items, now))
    }

    fn shutdown(&self) -> Boxed<'_, ()> {
        Box::pin(Store::shutdown(self))
    }
}
