//! Replication of global rules' counts: every `interval`, the buckets this instance's checks
//! wrote are read from this region's Redis (with what the peers' last answers said, taken in
//! first) and sent to every peer's Redis, all peers at once. A bucket stays pending for a
//! peer until that peer took it: a partition loses nothing, it only delays. A peer's health
//! is when it last answered: a peer unheard past a rule's `stale_after` is stale for it.
//!
//! Cost: per round, one call to this region's Redis and one to each peer's, whatever the
//! number of checks in between (a round with nothing to send pings the peers instead, so
//! that an idle link's health is still known).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::{Peer, RegionsConfig};
use crate::error::Error;
use crate::layout::regions;
use crate::store::redis::{RedisStore, futures_join};

/// The longest a round waits for a peer's answer.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);

/// The most buckets pending at once; past it, new buckets are not sent (and said so).
const MAX_PENDING: usize = 1_000_000;

/// A peer's health as this instance last heard it.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerHealth {
    /// The peer's region name.
    pub name: String,
    /// How long ago the peer last answered (`None`: never, since this instance started).
    pub last_heard: Option<Duration>,
    /// How long its last answer took: about the round trip between the regions.
    pub lag: Duration,
    /// Its failed rounds so far.
    pub failures: u64,
    /// Buckets of this region's counts the peer has not taken yet.
    pub pending: usize,
    /// Whether its last round failed: the peer does not answer now.
    pub failing: bool,
}

pub(super) struct Replication {
    pub(super) region: String,
    names: Vec<String>,
    peers: Vec<PeerState>,
    pub(super) overshoot: f64,
    interval: Duration,
    redis: RedisStore,
    started: Instant,
    pending: Mutex<HashMap<Vec<u8>, Pending>>,
    /// Buckets not sent because too many were pending.
    dropped: AtomicU64,
    /// Whether the last round could not reach this region's own Redis (said once).
    unsynced: AtomicBool,
    /// A check waited for acknowledgements (denied in flight): a round takes its answers in
    /// at once, not at the next round.
    urgent: AtomicBool,
    stop: AtomicBool,
    wake: Notify,
    done: Notify,
    finished: AtomicBool,
}

struct PeerState {
    peer: Peer,
    /// µs since `started` of its last answer; 0: none yet (taken as heard at start).
    last_ok: AtomicU64,
    lag: AtomicU64,
    failures: AtomicU64,
    failing: AtomicBool,
}

/// A bucket this region wrote, not yet taken by every peer.
struct Pending {
    /// When its hash expires.
    expires: Instant,
    /// Bit `p`: peer `p` has not taken it since it last changed.
    peers: u64,
    /// Bumped by each write, so a round clears only what it sent.
    version: u64,
    /// Peer `p`'s last answer for it (this region's `+` it holds, its own `+` and `-`), to
    /// take in at the next round.
    answers: Vec<Option<[f64; 3]>>,
}

impl Replication {
    pub(super) fn start(redis: RedisStore, config: RegionsConfig) -> Arc<Self> {
        let names = config.peers.iter().map(|p| p.name.clone()).collect();
        let peers = config
            .peers
            .into_iter()
            .map(|peer| PeerState {
                peer,
                last_ok: AtomicU64::new(0),
                lag: AtomicU64::new(0),
                failures: AtomicU64::new(0),
                failing: AtomicBool::new(false),
            })
            .collect();
        let replication = Arc::new(Self {
            region: config.region,
            names,
            peers,
            overshoot: config.overshoot,
            interval: config.interval,
            redis,
            started: Instant::now(),
            pending: Mutex::new(HashMap::new()),
            dropped: AtomicU64::new(0),
            unsynced: AtomicBool::new(false),
            urgent: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            wake: Notify::new(),
            done: Notify::new(),
            finished: AtomicBool::new(false),
        });
        let task = replication.clone();
        tokio::spawn(async move { task.run().await });
        replication
    }

    /// Buckets never sent because too many were pending (the peers undercount them).
    pub(super) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    pub(super) fn peer_names(&self) -> &[String] {
        &self.names
    }

    pub(super) fn interval_micros(&self) -> u64 {
        self.interval.as_micros() as u64
    }

    fn elapsed(&self) -> u64 {
        (self.started.elapsed().as_micros() as u64).max(1)
    }

    /// The peers unheard for longer than `stale_after`: bit `p` for peer `p`.
    pub(super) fn stale_mask(&self, stale_after: Duration) -> u64 {
        let now = self.elapsed();
        let stale_after = stale_after.as_micros() as u64;
        self.peers
            .iter()
            .enumerate()
            .filter(|(_, p)| now.saturating_sub(p.last_ok.load(Ordering::Relaxed)) > stale_after)
            .fold(0, |mask, (i, _)| mask | (1 << i))
    }

    pub(super) fn health(&self) -> Vec<PeerHealth> {
        let now = self.elapsed();
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        self.peers
            .iter()
            .enumerate()
            .map(|(i, p)| PeerHealth {
                name: p.peer.name.clone(),
                last_heard: match p.last_ok.load(Ordering::Relaxed) {
                    0 => None,
                    at => Some(Duration::from_micros(now.saturating_sub(at))),
                },
                lag: Duration::from_micros(p.lag.load(Ordering::Relaxed)),
                failures: p.failures.load(Ordering::Relaxed),
                pending: pending.values().filter(|b| b.peers & (1 << i) != 0).count(),
                failing: p.failing.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Says that a check was denied while its region's permits were in flight: the next
    /// round takes the peers' acknowledgements in as soon as they answer.
    pub(super) fn waiting(&self) {
        self.urgent.store(true, Ordering::Relaxed);
    }

    /// Buckets a check wrote (its key and how long it lives): pending for every peer.
    pub(super) fn touched(&self, buckets: Vec<(Vec<u8>, Duration)>) {
        let now = Instant::now();
        if self.peers.is_empty() {
            return;
        }
        let all = (1u64 << self.peers.len()) - 1;
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for (key, ttl) in buckets {
            if let Some(bucket) = pending.get_mut(&key) {
                bucket.peers = all;
                bucket.version += 1;
                continue;
            }
            if pending.len() >= MAX_PENDING {
                if self.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::error!(
                        max = MAX_PENDING,
                        "regions: too many buckets wait for the peers; new ones are not sent, \
                         so the peers undercount this region"
                    );
                }
                continue;
            }
            pending.insert(
                key,
                Pending {
                    expires: now + ttl,
                    peers: all,
                    version: 0,
                    answers: vec![None; self.peers.len()],
                },
            );
        }
    }

    async fn run(self: Arc<Self>) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !self.stop.load(Ordering::Relaxed) {
            tokio::select! {
                _ = ticks.tick() => {}
                () = self.wake.notified() => {}
            }
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            self.round().await;
        }
        self.finished.store(true, Ordering::Relaxed);
        self.done.notify_waiters();
    }

    /// Stops the rounds after one last, within the peers' timeout, so that what this
    /// instance admitted reaches them.
    pub(super) async fn finish(&self) {
        if self.stop.swap(true, Ordering::Relaxed) {
            return;
        }
        let done = self.done.notified();
        self.wake.notify_one();
        if !self.finished.load(Ordering::Relaxed) {
            let _ = tokio::time::timeout(2 * PEER_TIMEOUT, done).await;
        }
        let _ = tokio::time::timeout(2 * PEER_TIMEOUT, self.round()).await;
    }

    /// One round: takes in the peers' answers and reads this region's counts in one call,
    /// then sends them to every peer at once.
    async fn round(&self) {
        let now = Instant::now();
        let ttl_ms = |expires: Instant| expires.saturating_duration_since(now).as_millis() as f64;
        let (keys, items, versions) = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.retain(|_, b| b.expires > now);
            let mut keys = Vec::with_capacity(pending.len());
            let mut items = Vec::with_capacity(pending.len());
            let mut versions = Vec::with_capacity(pending.len());
            for (key, bucket) in pending.iter_mut() {
                if bucket.peers == 0 && bucket.answers.iter().all(Option::is_none) {
                    continue;
                }
                let mut item = vec![ttl_ms(bucket.expires)];
                for answer in &mut bucket.answers {
                    item.extend(answer.take().unwrap_or([-1.0; 3]));
                }
                keys.push(key.clone());
                items.push(
                    item.iter()
                        .flat_map(|d| d.to_le_bytes())
                        .collect::<Vec<u8>>(),
                );
                versions.push((bucket.version, bucket.peers, bucket.expires));
            }
            pending.retain(|_, b| b.peers != 0);
            (keys, items, versions)
        };
        if keys.is_empty() {
            self.ping().await;
            return;
        }
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        let own = match self
            .redis
            .regional_sync(&self.region, &names, &keys, &items)
            .await
        {
            Ok(own) => {
                if self.unsynced.swap(false, Ordering::Relaxed) {
                    tracing::warn!("regions: this region's Redis answers rounds again");
                }
                own
            }
            Err(e) => {
                if !self.unsynced.swap(true, Ordering::Relaxed) {
                    tracing::error!(
                        error = %e,
                        "regions: this region's Redis does not answer; its counts wait to be \
                         sent to the peers"
                    );
                }
                self.requeue(&keys, &versions);
                return;
            }
        };
        let sends = self.peers.iter().enumerate().map(|(p, peer)| {
            let chosen: Vec<usize> = (0..keys.len())
                .filter(|&i| versions[i].1 & (1 << p) != 0)
                .collect();
            let own = &own;
            let keys = &keys;
            let versions = &versions;
            async move {
                if chosen.is_empty() {
                    return (p, Ok(Vec::new()), chosen);
                }
                let names: Vec<Vec<u8>> = chosen.iter().map(|&i| keys[i].clone()).collect();
                let items: Vec<Vec<u8>> = chosen
                    .iter()
                    .map(|&i| {
                        let plus = own[regions::SYNCED * i];
                        let minus = own[regions::SYNCED * i + 1];
                        [plus, minus, ttl_ms(versions[i].2)]
                            .iter()
                            .flat_map(|d| d.to_le_bytes())
                            .collect()
                    })
                    .collect();
                let merge =
                    peer.peer
                        .store
                        .regional_merge(&self.region, &peer.peer.name, &names, &items);
                let answer = match tokio::time::timeout(PEER_TIMEOUT, merge).await {
                    Ok(answer) => answer,
                    Err(_) => Err(Error::Store {
                        message: format!("no answer within {PEER_TIMEOUT:?}"),
                        transient: true,
                    }),
                };
                (p, answer, chosen)
            }
        });
        let started = Instant::now();
        let outcomes = futures_join(sends).await;
        self.answered(&keys, &versions, outcomes, started);
        if self.urgent.swap(false, Ordering::Relaxed) {
            self.acknowledge().await;
        }
    }

    /// Takes the peers' answers of a round's merges in: each becomes pending, to be taken in
    /// by the next sync; a peer that failed keeps its buckets pending.
    #[allow(clippy::type_complexity)]
    fn answered(
        &self,
        keys: &[Vec<u8>],
        versions: &[(u64, u64, Instant)],
        outcomes: Vec<(usize, Result<Vec<f64>, Error>, Vec<usize>)>,
        started: Instant,
    ) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for (p, outcome, chosen) in outcomes {
            match outcome {
                Ok(answers) => {
                    if !chosen.is_empty() {
                        self.heard(p, started.elapsed());
                    }
                    for (n, &i) in chosen.iter().enumerate() {
                        let answer = &answers[regions::MERGED * n..regions::MERGED * (n + 1)];
                        let bucket = pending.entry(keys[i].clone()).or_insert_with(|| Pending {
                            expires: versions[i].2,
                            peers: 0,
                            version: versions[i].0,
                            answers: vec![None; self.peers.len()],
                        });
                        bucket.answers[p] = Some([answer[0], answer[1], answer[2]]);
                        if bucket.version == versions[i].0 {
                            bucket.peers &= !(1 << p);
                        }
                    }
                }
                Err(e) => {
                    self.unheard(p, &e);
                    for &i in &chosen {
                        let bucket = pending.entry(keys[i].clone()).or_insert_with(|| Pending {
                            expires: versions[i].2,
                            peers: 0,
                            version: versions[i].0,
                            answers: vec![None; self.peers.len()],
                        });
                        bucket.peers |= 1 << p;
                    }
                }
            }
        }
    }

    /// Takes the peers' answers in now, in one call to this region's Redis: a check waits on
    /// them.
    async fn acknowledge(&self) {
        let now = Instant::now();
        let (keys, items): (Vec<Vec<u8>>, Vec<Vec<u8>>) = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending
                .iter_mut()
                .filter(|(_, b)| b.answers.iter().any(Option::is_some))
                .map(|(key, bucket)| {
                    let ttl = bucket.expires.saturating_duration_since(now).as_millis() as f64;
                    let mut item = vec![ttl];
                    for answer in &mut bucket.answers {
                        item.extend(answer.take().unwrap_or([-1.0; 3]));
                    }
                    (
                        key.clone(),
                        item.iter().flat_map(|d| d.to_le_bytes()).collect(),
                    )
                })
                .unzip()
        };
        if keys.is_empty() {
            return;
        }
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        if let Err(e) = self
            .redis
            .regional_sync(&self.region, &names, &keys, &items)
            .await
        {
            tracing::warn!(error = %e, "regions: this region's Redis did not take the peers' acknowledgements");
        }
    }

    /// Puts back what a failed round took out.
    fn requeue(&self, keys: &[Vec<u8>], versions: &[(u64, u64, Instant)]) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for (key, &(version, peers, expires)) in keys.iter().zip(versions) {
            let bucket = pending.entry(key.clone()).or_insert_with(|| Pending {
                expires,
                peers: 0,
                version,
                answers: vec![None; self.peers.len()],
            });
            bucket.peers |= peers;
        }
    }

    /// Asks every peer whether it answers: a round with nothing to send.
    async fn ping(&self) {
        let pings = self.peers.iter().enumerate().map(|(p, peer)| async move {
            let started = Instant::now();
            let answer = match tokio::time::timeout(PEER_TIMEOUT, peer.peer.store.ping()).await {
                Ok(answer) => answer,
                Err(_) => Err(Error::Store {
                    message: format!("no answer within {PEER_TIMEOUT:?}"),
                    transient: true,
                }),
            };
            (p, answer, started.elapsed())
        });
        for (p, answer, lag) in futures_join(pings).await {
            match answer {
                Ok(()) => self.heard(p, lag),
                Err(e) => self.unheard(p, &e),
            }
        }
    }

    fn heard(&self, p: usize, lag: Duration) {
        let peer = &self.peers[p];
        peer.last_ok.store(self.elapsed(), Ordering::Relaxed);
        peer.lag.store(lag.as_micros() as u64, Ordering::Relaxed);
        if peer.failing.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                region = %self.region,
                peer = %peer.peer.name,
                "regions: peer region answers again; global rules count on it again"
            );
        }
    }

    fn unheard(&self, p: usize, error: &Error) {
        let peer = &self.peers[p];
        peer.failures.fetch_add(1, Ordering::Relaxed);
        if !peer.failing.swap(true, Ordering::Relaxed) {
            tracing::error!(
                region = %self.region,
                peer = %peer.peer.name,
                error = %error,
                "regions: peer region does not answer; past each global rule's stale_after \
                 this region admits only its share of what is left"
            );
        }
    }
}
