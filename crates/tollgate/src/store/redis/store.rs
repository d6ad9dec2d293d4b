//! The Redis store itself: what it holds, what it says of its health, and the [`Store`]
//! methods, each of which hands over to the file that does its job (checks to `check.rs`,
//! settlements and reservations to `settle.rs`).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::args::{self, StoreTime};
use super::connection::{Connection, store_error};
use super::plan::RedisPlan;
use super::topology::{NodeHealth, Topology};
use crate::decision::Decisions;
use crate::error::Error;
use crate::layout::header;
use crate::rule::Rule;
use crate::store::book::{Remembered, ReservationRecord};
use crate::store::guard::{Guard, StoreFailures};
use crate::store::{Committed, Planned, Settle, Store};

/// Strict limiting shared by every instance that uses the same Redis server or Redis Cluster.
/// Exact under any concurrency: each check is one atomic call, every tier and key at once.
///
/// When Redis fails or does not answer within the timeout (20 ms by default), each rule's
/// [`FailurePolicy`](crate::FailurePolicy) decides, and [`Decision::source`] says so. After 5
/// consecutive failures a circuit breaker, one per store and its clones, stops asking Redis
/// for a cooldown (1 s), then lets one check probe it; the first answer resumes strict
/// limiting. A check that timed out may still be counted if Redis answers it later.
///
/// Cheap to clone: clones share the connections, the breaker and the fallback state.
#[derive(Clone)]
pub struct RedisStore {
    pub(super) connection: Connection,
    pub(super) time: StoreTime,
    pub(super) guard: Arc<Guard>,
    /// In front of every key the store writes (see [`RedisStoreBuilder::key_prefix`]).
    pub(super) key_prefix: Arc<[u8]>,
    /// The most a key's TTL is lengthened by, in ms (see [`RedisStoreBuilder::expiry_jitter`]).
    pub(super) expiry_jitter_ms: u64,
    /// Counts checks, to spread their TTLs over the jitter.
    pub(super) jitter_turn: Arc<AtomicU64>,
    /// On a cluster, the node of each slot, each with its own breaker.
    pub(super) topology: Option<Arc<Topology>>,
    /// The most open reservations kept.
    pub(super) max_reservations: usize,
    /// The latest reservations this store kept, to commit each in one call (one server).
    pub(super) remembered: Arc<Remembered>,
    /// Whether checks call tollgate's Redis module where a node has it ([`module`]).
    pub(super) module: bool,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.connection.as_cluster() {
            None => "single",
            Some(_) => "cluster",
        };
        f.debug_struct("RedisStore")
            .field("kind", &kind)
            .field("time", &self.time)
            .field("guard", &self.guard.config())
            .finish()
    }
}

impl RedisStore {
    /// Whether a Redis store can hold `rule` (as planning it would say), without one: every
    /// algorithm, with a local share on failure that fits in memory.
    ///
    /// # Errors
    /// [`Error::Rule`] for a local share too large.
    pub fn holds(rule: &Rule) -> Result<(), Error> {
        Guard::holds(rule)
    }

    /// Whether Redis is being kept away now from some checks, decided by their rule's
    /// failure policy: on one server, every check; on a cluster, those of the slots of a node
    /// that keeps failing (see [`nodes`](Self::nodes)).
    pub fn degraded(&self) -> bool {
        self.guard.degraded() || self.nodes().iter().any(|n| n.failing)
    }

    /// Whether Redis is being kept away from every check: one server that keeps failing, or
    /// every master of a cluster (or, while no master is known for any slot, the store-wide
    /// backend every check then goes to).
    pub fn down(&self) -> bool {
        let nodes = self.nodes();
        if nodes.is_empty() {
            self.guard.degraded()
        } else {
            nodes.iter().all(|n| n.failing)
        }
    }

    /// On a cluster, each master that serves slots: its address, how many slots, whether its
    /// breaker keeps its checks away now, and its failures. Empty for one server.
    pub fn nodes(&self) -> Vec<NodeHealth> {
        self.topology
            .as_ref()
            .map(|t| t.health())
            .unwrap_or_default()
    }

    /// The calls to Redis that failed or timed out so far, by this store and its clones, and
    /// by the hybrid and lease stores built on it when they decide through Redis; on a
    /// cluster, every node's.
    pub fn failures(&self) -> StoreFailures {
        let nodes = self
            .topology
            .as_ref()
            .map(|t| t.failures())
            .unwrap_or_default();
        self.guard.failures() + nodes
    }

    /// Whose clock the functions decide at.
    pub(crate) fn time(&self) -> StoreTime {
        self.time
    }

    /// The failure handling of this store and of the hybrid and lease stores built on it.
    pub(crate) fn guard(&self) -> &Guard {
        &self.guard
    }

    /// Checks that the store answers.
    ///
    /// # Errors
    /// [`Error::Store`] saying why not.
    pub async fn ping(&self) -> Result<(), Error> {
        let pong = self
            .connection
            .query::<String>(redis::cmd("PING"), None)
            .await;
        pong.map(drop).map_err(store_error)
    }

    /// The header of a check's call at `now` (see [`args::header`]).
    pub(super) fn header(
        &self,
        now: u64,
        cost: u64,
        max_delay: Option<u64>,
    ) -> [u8; header::BYTES] {
        self.header_of(now, cost, max_delay, None)
    }

    /// The header of a call at `now`, with what a settlement does, and this call's share of
    /// the expiry jitter.
    pub(super) fn header_of(
        &self,
        now: u64,
        cost: u64,
        max_delay: Option<u64>,
        settle: Option<Settle>,
    ) -> [u8; header::BYTES] {
        args::header(self.time, self.jitter(), now, cost, max_delay, settle)
    }

    /// This check's share of the expiry jitter (ms): one of 16 steps up to the jitter, in
    /// turn, so that the functions' cache of parsed arguments stays small.
    fn jitter(&self) -> u64 {
        if self.expiry_jitter_ms == 0 {
            return 0;
        }
        let turn = self.jitter_turn.fetch_add(1, Ordering::Relaxed);
        // The steps' order scrambled (a multiplicative hash), so that neighbours differ.
        let step = (turn.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) + 1;
        self.expiry_jitter_ms * step / 16
    }

    /// The bytes in front of every key this store writes (see
    /// [`RedisStoreBuilder::key_prefix`]).
    pub fn key_prefix(&self) -> &[u8] {
        &self.key_prefix
    }

    /// `name` with the store's key prefix in front.
    pub(crate) fn key(&self, name: &[u8]) -> Vec<u8> {
        [&self.key_prefix[..], name].concat()
    }

    /// The prefix of a rule's window counters (hybrid and lease):
    /// `<key prefix>tg:c:<rule>:<fingerprint>:`.
    pub(crate) fn counter_prefix(&self, rule: &Rule) -> Vec<u8> {
        self.key(format!("tg:c:{}:{:08x}:", rule.name(), rule.fingerprint()).as_bytes())
    }
}

impl Store for RedisStore {
    type Plan = RedisPlan;

    fn plan(&self, rule: &Rule) -> Result<RedisPlan, Error> {
        Ok(RedisPlan::new(
            rule,
            &self.key_prefix,
            self.guard.plan(rule)?,
            self.module,
        ))
    }

    async fn check(
        &self,
        items: &[Planned<'_, RedisPlan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> Result<Decisions, Error> {
        let (mut route, places) = self.route(items);
        // One item on one server: its command answers by the deadline, on the timer of its
        // pipeline rather than one of its own.
        if let (None, [_]) = (self.connection.as_cluster(), items) {
            route = route.bounded();
        }
        let remote = |deadline| self.remote(items, now, max_delay, &route, &places, deadline);
        Ok(self
            .guard
            .decide(items, now, max_delay, &route, remote)
            .await)
    }

    fn settles(&self) -> Result<(), Error> {
        Ok(())
    }

    async fn settle(
        &self,
        items: &[Planned<'_, RedisPlan>],
        now: u64,
        settle: Settle,
    ) -> Result<Decisions, Error> {
        let (route, places) = self.route(items);
        let remote = |_| self.remote_settle(items, now, settle, &route, &places);
        self.guard.settle(now, &route, remote).await
    }

    async fn reserve(
        &self,
        items: &[Planned<'_, RedisPlan>],
        now: u64,
        record: &ReservationRecord,
    ) -> Result<(Decisions, bool), Error> {
        self.book_reserve(items, now, record).await
    }

    fn kept_record(&self, id: &str) -> Option<ReservationRecord> {
        self.remembered.take(id)
    }

    async fn commit(
        &self,
        id: &str,
        items: &[Planned<'_, RedisPlan>],
        at: u64,
        actual: u64,
        now: u64,
    ) -> Result<Committed, Error> {
        self.book_commit(id, items, at, actual, now).await
    }

    async fn keep_reservation(&self, record: &ReservationRecord, now: u64) -> Result<(), Error> {
        self.book_keep(record, now).await
    }

    async fn take_reservation(
        &self,
        id: &str,
        now: u64,
    ) -> Result<Option<ReservationRecord>, Error> {
        self.book_take(id, now).await
    }

    async fn expired_reservations(
        &self,
        now: u64,
        limit: usize,
    ) -> Result<Vec<ReservationRecord>, Error> {
        self.book_expired(now, limit).await
    }

    async fn shutdown(&self) {}

    async fn reset(&self, items: &[Planned<'_, RedisPlan>], _now: u64) -> Result<(), Error> {
        for item in items {
            self.delete(&item.plan.keys(item.key)).await?;
        }
        Ok(())
    }
}
