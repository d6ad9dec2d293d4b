//! Settlements and reservations on Redis: a report, a give-back or a renewal of each item
//! (one call of the settle function per slot, no failure policy), and the reservations'
//! book (a sorted set of records under one hash tag), with a reservation decided and kept,
//! and committed, each in one call on one server.

use std::sync::atomic::{AtomicU8, Ordering};

use super::batch::{Mode, futures_join, read_batch};
use super::connection::store_error;
use super::keys::slot;
use super::plan::{RedisPlan, slot_groups};
use super::script::{self, Entry};
use super::store::RedisStore;
use crate::decision::{Decision, Decisions, Source};
use crate::error::Error;
use crate::layout::{book, packed};
use crate::store::book::{ReservationRecord, full};
use crate::store::guard::{Failure, Route};
use crate::store::{Committed, Planned, Settle};

/// What a reservation made in one call became.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Reserved {
    /// No answer: a failure policy decided.
    Unanswered,
    /// The book was full: nothing taken.
    Full,
    /// Admitted, and its record kept.
    Kept,
    /// Not admitted: nothing kept.
    Denied,
}

impl RedisStore {
    /// The name of the reservations' index (`None`) or of reservation `id`'s record: one hash
    /// tag for all, so that each call about them is atomic, on a cluster too.
    pub(super) fn book_key(&self, id: Option<&str>) -> Vec<u8> {
        match id {
            None => self.key(b"tg:r:{reservations}"),
            Some(id) => self.key(format!("tg:r:{{reservations}}:{id}").as_bytes()),
        }
    }

    /// Calls `entry` about the reservations, guarded as a settlement: no failure policy.
    pub(super) async fn book_call(
        &self,
        entry: &Entry,
        keys: &[Vec<u8>],
        args: &[&[u8]],
        now: u64,
    ) -> Result<Vec<u8>, Error> {
        let backend = match &self.topology {
            Some(topology) => topology
                .node(slot(&keys[0]))
                .unwrap_or_else(|| self.guard.single_shared()),
            None => self.guard.single_shared(),
        };
        let route = Route::many(vec![backend]);
        let remote = |_| async {
            let reply = self
                .connection
                .invoke(entry, keys, args, None)
                .await
                .map_err(|error| Failure::of(store_error(error), Some(0)))?;
            route.answered(0);
            Ok::<_, Failure>(reply)
        };
        self.guard.settle(now, &route, remote).await
    }

    /// Settles `items` on Redis, with no failure policy: each slot's items in one call of the
    /// settle function, the slots at once. Nothing is refused, so nothing is all-or-nothing.
    pub(super) async fn remote_settle(
        &self,
        items: &[Planned<'_, RedisPlan>],
        now: u64,
        settle: Settle,
        route: &Route<'_>,
        places: &[usize],
    ) -> Result<Decisions, Failure> {
        let groups = match self.connection.as_cluster() {
            None => vec![(0..items.len()).collect()],
            Some(_) => slot_groups(items),
        };
        let place = |group: &[usize]| places.get(group[0]).copied().unwrap_or(0);
        let calls = groups.iter().map(|group| {
            let mut call = self.batch_call(items, group, now, None, Mode::Decide);
            call.args[0] = self.header_of(now, 0, None, Some(settle)).to_vec();
            async move {
                let node = route.get(place(group));
                let entry = &script::SETTLE_ENTRY;
                let settled = self.of_items(entry, "TOLLGATE.SETTLE", &call, Some(node), now);
                let reply = settled
                    .await
                    .map_err(|error| Failure::of(store_error(error), Some(place(group))))?;
                route.answered(place(group));
                Ok::<_, Failure>(reply)
            }
        });
        let replies = futures_join(calls).await;
        let mut decisions: Vec<Option<Decision>> = vec![None; items.len()];
        for (group, reply) in groups.iter().zip(replies) {
            let (reply, source) = reply?;
            read_batch(items, group, &reply, source, &mut decisions)?;
        }
        let decisions = decisions
            .into_iter()
            .map(|d| d.expect("every item settled"));
        Ok(Decisions::many(decisions.collect()))
    }

    /// Decides `items` and keeps `record` if they are admitted, in one call on one server,
    /// with no failure policy: the guard calls this. Says in `outcome` what became of the
    /// record.
    pub(super) async fn remote_reserve(
        &self,
        items: &[Planned<'_, RedisPlan>],
        now: u64,
        record: &ReservationRecord,
        route: &Route<'_>,
        outcome: &AtomicU8,
    ) -> Result<Decisions, Failure> {
        let failed = |error| Failure::of(error, Some(0));
        let group: Vec<usize> = (0..items.len()).collect();
        let call = self.batch_call(items, &group, now, None, Mode::Decide);
        let mut keys = vec![self.book_key(None), self.book_key(Some(&record.id))];
        keys.extend(call.keys);
        // The record outlives its expiry by an hour, for whoever settles expired ones.
        let ttl_ms = record.expires.saturating_sub(now) / 1_000 + 3_600_000;
        let book = packed::<{ book::KEEP }>([
            record.expires as f64,
            ttl_ms as f64,
            self.max_reservations as f64,
        ]);
        let encoded = record.encode();
        let mut args: Vec<&[u8]> = vec![&book, &encoded];
        args.extend(call.args.iter().map(Vec::as_slice));
        let reply = self
            .connection
            .invoke(&script::RESERVE_ENTRY, &keys, &args, None)
            .await
            .map_err(|e| failed(store_error(e)))?;
        route.answered(0);
        let Some((flag, verdicts)) = reply.split_first_chunk::<8>() else {
            return Err(failed(Error::Store {
                message: "a reservation's reply that cannot be read".into(),
                transient: false,
            }));
        };
        let mut decisions: Vec<Option<Decision>> = vec![None; items.len()];
        read_batch(items, &group, verdicts, Source::Redis, &mut decisions).map_err(failed)?;
        let said = match f64::from_le_bytes(*flag) {
            0.0 => Reserved::Full,
            1.0 => Reserved::Kept,
            _ => Reserved::Denied,
        };
        outcome.store(said as u8, Ordering::Relaxed);
        let decisions = decisions
            .into_iter()
            .map(|d| d.expect("every item decided"));
        Ok(Decisions::many(decisions.collect()))
    }

    /// Decides `items` and, if admitted, keeps `record`: on one server in one call; on a
    /// cluster, where the record's slot is not the keys', a check and then the record.
    pub(super) async fn book_reserve(
        &self,
        items: &[Planned<'_, RedisPlan>],
        now: u64,
        record: &ReservationRecord,
    ) -> Result<(Decisions, bool), Error> {
        // On a cluster the record's slot is not the keys': a check, then the record.
        if self.topology.is_some() {
            return crate::store::reserve_apart(self, items, now, record).await;
        }
        let outcome = AtomicU8::new(Reserved::Unanswered as u8);
        let (route, _) = self.route(items);
        let remote = |_| self.remote_reserve(items, now, record, &route, &outcome);
        let decisions = self.guard.decide(items, now, None, &route, remote).await;
        match outcome.load(Ordering::Relaxed) {
            o if o == Reserved::Full as u8 => Err(full(self.max_reservations)),
            o if o == Reserved::Kept as u8 => {
                self.remembered.remember(record);
                Ok((decisions, true))
            }
            // Denied, or decided by a failure policy: nothing kept.
            _ => Ok((decisions, false)),
        }
    }

    /// Settles reservation `id` at `actual`, taken at `at`: on one server, the record taken
    /// and its items settled in one call; on a cluster, one and then the other.
    pub(super) async fn book_commit(
        &self,
        id: &str,
        items: &[Planned<'_, RedisPlan>],
        at: u64,
        actual: u64,
        now: u64,
    ) -> Result<Committed, Error> {
        if self.topology.is_some() {
            return crate::store::commit_apart(self, id, items, at, actual, now).await;
        }
        let group: Vec<usize> = (0..items.len()).collect();
        let call = self.batch_call(items, &group, now, None, Mode::Decide);
        let mut keys = vec![self.book_key(None), self.book_key(Some(id))];
        keys.extend(call.keys);
        let header = self.header_of(now, 0, None, Some(Settle::Credit { at }));
        let costs = packed::<{ book::COMMIT }>([actual as f64, now as f64]);
        let mut args: Vec<&[u8]> = vec![&costs, &header];
        args.extend(call.args[1..].iter().map(Vec::as_slice));
        let reply = self
            .book_call(&script::COMMIT_ENTRY, &keys, &args, now)
            .await?;
        match reply.split_first() {
            None => Ok(Committed::Unknown),
            Some((b'E', record)) => Ok(Committed::Expired(ReservationRecord::decode(record)?)),
            Some((_, verdicts)) => {
                let mut decisions: Vec<Option<Decision>> = vec![None; items.len()];
                read_batch(items, &group, verdicts, Source::Redis, &mut decisions)?;
                let decisions = decisions
                    .into_iter()
                    .map(|d| d.expect("every item settled"));
                Ok(Committed::Settled(Decisions::many(decisions.collect())))
            }
        }
    }

    /// Keeps `record` in the book, refused when the book is full.
    pub(super) async fn book_keep(
        &self,
        record: &ReservationRecord,
        now: u64,
    ) -> Result<(), Error> {
        let (index, name) = (self.book_key(None), self.book_key(Some(&record.id)));
        // The record outlives its expiry by an hour, for whoever settles expired ones.
        let ttl_ms = record.expires.saturating_sub(now) / 1_000 + 3_600_000;
        let args = packed::<{ book::KEEP }>([
            record.expires as f64,
            ttl_ms as f64,
            self.max_reservations as f64,
        ]);
        let encoded = record.encode();
        let reply = self
            .book_call(&script::KEEP_ENTRY, &[index, name], &[&encoded, &args], now)
            .await?;
        match reply
            .get(..8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap_or_default()))
        {
            Some(1.0) => Ok(()),
            _ => Err(full(self.max_reservations)),
        }
    }

    /// Takes reservation `id`'s record out of the book, if it is there.
    pub(super) async fn book_take(
        &self,
        id: &str,
        now: u64,
    ) -> Result<Option<ReservationRecord>, Error> {
        let keys = [self.book_key(None), self.book_key(Some(id))];
        let reply = self.book_call(&script::TAKE_ENTRY, &keys, &[], now).await?;
        if reply.is_empty() {
            return Ok(None);
        }
        ReservationRecord::decode(&reply).map(Some)
    }

    /// Up to `limit` records of reservations expired by `now`.
    pub(super) async fn book_expired(
        &self,
        now: u64,
        limit: usize,
    ) -> Result<Vec<ReservationRecord>, Error> {
        let args = packed::<{ book::EXPIRED }>([now as f64, limit as f64]);
        let keys = [self.book_key(None)];
        let reply = self
            .book_call(&script::EXPIRED_ENTRY, &keys, &[&args], now)
            .await?;
        let mut records = Vec::new();
        let mut rest = &reply[..];
        while let Some((head, tail)) = rest.split_first_chunk::<8>() {
            let len = f64::from_le_bytes(*head) as usize;
            let Some((record, tail)) = tail.split_at_checked(len) else {
                break;
            };
            records.push(ReservationRecord::decode(record)?);
            rest = tail;
        }
        Ok(records)
    }
}
