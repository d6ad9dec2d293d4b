//! One limit across regions. Each region keeps its own store (memory aside: Redis, strict,
//! hybrid or lease) for its per-region rules, and a global rule's counts in its own Redis:
//! per key, tier and bucket of time, one hash holding every region's count. A check never
//! waits on another region: it is decided in one call to this region's Redis, from the
//! counts held there. In the background, each instance sends the counts its region took to
//! every peer region's Redis, batched every `interval`, and takes back what the peer holds.
//!
//! Why counts that only grow (`+` admitted, `-` given back, per region, each written only by
//! its region): a copy is merged by keeping the larger value, so replication can repeat, run
//! out of order or from several instances, and a healed link converges with one exchange.
//! Leasing a global budget per region would need one place that grants it, which a
//! partition cuts off from every other region.
//!
//! The bound. A peer's Redis answers each merge with how much of this region's count it
//! holds: that is the peer's acknowledgement. A region admits beyond what every live peer
//! acknowledged at most its *in-flight allowance* per tier, `q = max(1, floor(overshoot x
//! limit / peers))`. Take the last admission in a window, made by some region `r`: the
//! counts it saw were within the limit, and each other region had admitted at most `q` that
//! `r` had not seen. So the regions together admit at most `limit + (regions - 1) x q` per
//! window, whatever the delay between them, the interval, or the load: by default (overshoot
//! 1%) within 1% of the limit, or `regions - 1` permits where that is more. The price is a
//! region's pace while acknowledgements travel: at most `q` per round trip to its slowest
//! live peer plus up to one interval.
//!
//! Partitions. A peer unheard for longer than the rule's `stale_after` is *stale*: its
//! acknowledgements no longer hold a check back. With [`OnPartition::Share`] a region counts,
//! for each stale peer, as much again as it admitted itself since that peer last
//! acknowledged: cut off on all sides, each region admits at most `1 / regions` of what was
//! left, and the regions together stay within the bound. Its decisions say
//! [`Source::Partitioned`], and [`RegionStore::peers`] says which peer is stale. What was
//! admitted meanwhile is sent when the link heals.

mod buckets;
mod local;
mod replicate;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use self::buckets::Shape;
pub use self::local::{InRegion, StoreFuture};
pub use self::replicate::PeerHealth;
use self::replicate::Replication;
use super::guard::{Failure, GuardPlan, Guarded, Route};
use super::redis::{RedisStore, by_slot, counter_key, slot};
use super::{Planned, ReservationRecord, Settle, Store};
use crate::decision::{Decision, Decisions, Source};
use crate::error::Error;
use crate::layout::{packed, regions};
use crate::rule::{OnPartition, Rule, Scope};

/// A peer region: its name, and its Redis (where this region's counts are sent).
#[derive(Clone)]
pub struct Peer {
    /// The peer's region name, as it names itself.
    pub name: String,
    /// The peer region's Redis.
    pub store: RedisStore,
}

impl fmt::Debug for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peer").field("name", &self.name).finish()
    }
}

/// Settings of a [`RegionStore`].
#[derive(Debug, Clone)]
pub struct RegionsConfig {
    /// This region's name: 1 to 64 letters, digits, `-` or `_`.
    pub region: String,
    /// The regions this one shares global rules with (at most 52).
    pub peers: Vec<Peer>,
    /// How often counts are sent to the peers (default 100 ms; 1 ms to 10 s).
    pub interval: Duration,
    /// The most a global limit may be exceeded by, as a fraction of it, while counts travel
    /// (default 0.01): sets each region's in-flight allowance.
    pub overshoot: f64,
}

impl RegionsConfig {
    /// Settings for `region` with `peers` and the defaults.
    pub fn new(region: impl Into<String>, peers: Vec<Peer>) -> Self {
        Self {
            region: region.into(),
            peers,
            interval: Duration::from_millis(100),
            overshoot: 0.01,
        }
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`Error::Store`] naming what is out of range: a name, the peers, the interval or the
    /// overshoot.
    pub fn validate(&self) -> Result<(), Error> {
        let names: Vec<&str> = self.peers.iter().map(|p| p.name.as_str()).collect();
        Self::check(&self.region, &names, self.interval, self.overshoot)
    }

    /// Checks settings before their peers' stores are made: as [`validate`](Self::validate).
    ///
    /// # Errors
    /// As [`validate`](Self::validate).
    pub fn check(
        region: &str,
        peers: &[&str],
        interval: Duration,
        overshoot: f64,
    ) -> Result<(), Error> {
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.len() <= 64
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        let problem = if !name_ok(region) {
            Some(format!(
                "region {region:?}: must be 1 to 64 letters, digits, - or _"
            ))
        } else if let Some(peer) = peers.iter().find(|p| !name_ok(p)) {
            Some(format!(
                "peer {peer:?}: must be 1 to 64 letters, digits, - or _"
            ))
        } else if peers.contains(&region) {
            Some(format!("peer {region:?} is this region"))
        } else if (1..peers.len()).any(|i| peers[..i].contains(&peers[i])) {
            Some("peers: a region is listed twice".into())
        } else if peers.len() > 52 {
            Some("peers: at most 52".into())
        } else if interval < Duration::from_millis(1) || interval > Duration::from_secs(10) {
            Some(format!("interval {interval:?}: must be from 1ms to 10s"))
        } else if !(overshoot > 0.0 && overshoot <= 1.0) {
            Some(format!(
                "overshoot {overshoot}: must be above 0 and at most 1"
            ))
        } else {
            None
        };
        match problem {
            Some(message) => Err(Error::Store {
                message: format!("regions: {message}"),
                transient: false,
            }),
            None => Ok(()),
        }
    }
}

/// A store of regions: per-region rules on this region's store, global rules on every
/// region's counts (see the module documentation). Cheap to clone.
pub struct RegionStore<L> {
    local: Arc<L>,
    redis: RedisStore,
    replication: Arc<Replication>,
}

impl<L> Clone for RegionStore<L> {
    fn clone(&self) -> Self {
        Self {
            local: self.local.clone(),
            redis: self.redis.clone(),
            replication: self.replication.clone(),
        }
    }
}

impl<L: InRegion> fmt::Debug for RegionStore<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionStore")
            .field("region", &self.replication.region)
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

/// What a rule is in a [`RegionStore`].
#[derive(Debug)]
pub enum RegionPlan<P> {
    /// A per-region rule, planned on this region's store.
    Local(P),
    /// A global rule.
    Global(GlobalPlan),
}

/// A global rule's plan: its key names' prefix and each tier's buckets.
#[derive(Debug)]
pub struct GlobalPlan {
    /// `tg:g:<rule>:`, after the store's own prefix: the same in every region, so that the
    /// regions' counts of a key meet in one hash.
    prefix: Vec<u8>,
    shapes: Vec<Shape>,
    on_partition: OnPartition,
    stale_after: Duration,
    guard: GuardPlan,
}

impl Guarded for GlobalPlan {
    fn guard(&self) -> &GuardPlan {
        &self.guard
    }
}

impl<L: InRegion> RegionStore<L> {
    /// A store of regions over `local`, this region's store, which must keep its state in
    /// Redis: global rules' counts live there. Starts sending counts to the peers, on the
    /// current Tokio runtime.
    ///
    /// # Errors
    /// [`Error::Store`] for settings out of range, or a `local` store in process memory.
    pub fn new(local: L, config: RegionsConfig) -> Result<Self, Error> {
        config.validate()?;
        let Some(redis) = local.redis().cloned() else {
            return Err(Error::Store {
                message: "regions: global rules keep their counts in each region's Redis; \
                          this region's store is process memory"
                    .into(),
                transient: false,
            });
        };
        let replication = Replication::start(redis.clone(), config);
        Ok(Self {
            local: Arc::new(local),
            redis,
            replication,
        })
    }

    /// This region's store, for per-region rules.
    pub fn local(&self) -> &L {
        &self.local
    }

    /// This region's name.
    pub fn region(&self) -> &str {
        &self.replication.region
    }

    /// Each peer's health as this instance last heard it.
    pub fn peers(&self) -> Vec<PeerHealth> {
        self.replication.health()
    }

    /// Buckets this instance admitted in but never sent to the peers, because a million
    /// were pending already (a partition that lasted long over many keys): the peers
    /// undercount them. Said in an error log line when it first happens.
    pub fn dropped(&self) -> u64 {
        self.replication.dropped()
    }

    /// Whether a peer is unheard for longer than `stale_after`.
    pub fn partitioned(&self, stale_after: Duration) -> bool {
        self.replication.stale_mask(stale_after) != 0
    }

    /// What each region admitted, net of what it gave back, of `key` under global `rule`
    /// in the window holding `now` (µs), tier by tier, as this region's Redis holds it.
    ///
    /// # Errors
    /// [`Error::Store`] when Redis does not answer; [`Error::Unsupported`] for a rule that
    /// is not global here.
    pub async fn usage(
        &self,
        rule: &Rule,
        plan: &RegionPlan<L::Plan>,
        key: &[u8],
        now: u64,
    ) -> Result<Vec<Vec<(String, u64)>>, Error> {
        let RegionPlan::Global(global) = plan else {
            return Err(Error::Unsupported {
                what: format!("rule {} is not global", rule.name()),
            });
        };
        let mut tiers = Vec::new();
        for (t, shape) in global.shapes.iter().enumerate() {
            let buckets = shape.at(now);
            let keys: Vec<Vec<u8>> = buckets
                .ids
                .iter()
                .map(|&b| counter_key(&global.prefix, key, t, b))
                .collect();
            let hashes = self.redis.regional_fields(&keys).await?;
            let mut by_region: Vec<(String, f64)> = Vec::new();
            for (fields, weight) in hashes.iter().zip(&buckets.weights) {
                for (name, value) in fields {
                    let (sign, region) = match name.split_at_checked(1) {
                        Some(("+", region)) => (1.0, region),
                        Some(("-", region)) => (-1.0, region),
                        _ => continue,
                    };
                    match by_region.iter_mut().find(|(r, _)| r == region) {
                        Some((_, sum)) => *sum += sign * weight * value,
                        None => by_region.push((region.to_string(), sign * weight * value)),
                    }
                }
            }
            by_region.sort_by(|a, b| a.0.cmp(&b.0));
            tiers.push(
                by_region
                    .into_iter()
                    .map(|(r, v)| (r, v.max(0.0).round() as u64))
                    .collect(),
            );
        }
        Ok(tiers)
    }

    /// The per-region items of `items`, as the local store's.
    fn locals<'a: 'b, 'b>(
        items: impl IntoIterator<Item = &'b Planned<'a, RegionPlan<L::Plan>>>,
    ) -> Vec<Planned<'a, L::Plan>> {
        items
            .into_iter()
            .filter_map(|item| match item.plan {
                RegionPlan::Local(plan) => Some(Planned {
                    rule: item.rule,
                    plan,
                    key: item.key,
                    cost: item.cost,
                }),
                RegionPlan::Global(_) => None,
            })
            .collect()
    }

    /// Decides (`mode`) the global items at `now`, their buckets found at `at`: one call per
    /// slot; a check spanning slots gives back what it took where a later slot denies.
    async fn global(
        &self,
        items: &[(&Rule, &GlobalPlan, &[u8], u64)],
        now: u64,
        at: u64,
        mode: u8,
    ) -> Result<Vec<Decision>, Error> {
        let groups = self.slot_groups(items.iter().map(|i| i.2));
        let mut decisions: Vec<Option<Decision>> = vec![None; items.len()];
        let mut taken: Vec<Vec<usize>> = Vec::new();
        for group in groups {
            let chosen: Vec<_> = group.iter().map(|&i| items[i]).collect();
            let (answer, allowed) = self.call(&chosen, now, at, mode).await?;
            for (&i, decision) in group.iter().zip(answer) {
                decisions[i] = Some(decision);
            }
            if mode == regions::CHECK && !allowed {
                for earlier in taken.drain(..) {
                    let back: Vec<_> = earlier.iter().map(|&i| items[i]).collect();
                    self.call(&back, now, now, regions::CREDIT).await?;
                }
                break;
            }
            taken.push(group);
        }
        // Items after a denying slot were not asked: they are reported as looked at.
        let unasked: Vec<usize> = (0..items.len())
            .filter(|&i| decisions[i].is_none())
            .collect();
        if !unasked.is_empty() {
            let look: Vec<_> = unasked.iter().map(|&i| items[i]).collect();
            let groups = self.slot_groups(look.iter().map(|i| i.2));
            for group in groups {
                let chosen: Vec<_> = group.iter().map(|&i| look[i]).collect();
                let (answer, _) = self.call(&chosen, now, at, regions::LOOK).await?;
                for (&i, decision) in group.iter().zip(answer) {
                    decisions[unasked[i]] = Some(decision);
                }
            }
        }
        Ok(decisions.into_iter().flatten().collect())
    }

    /// Positions of `keys` grouped by their slot on a cluster; one group on one server.
    fn slot_groups<'k>(&self, keys: impl ExactSizeIterator<Item = &'k [u8]>) -> Vec<Vec<usize>> {
        match self.redis.clustered() {
            false => vec![(0..keys.len()).collect()],
            true => by_slot(keys.map(|key| slot(&counter_key(b"", key, 0, 0)))),
        }
    }

    /// One call of `regional_check` for items of one slot.
    async fn call(
        &self,
        items: &[(&Rule, &GlobalPlan, &[u8], u64)],
        now: u64,
        at: u64,
        mode: u8,
    ) -> Result<(Vec<Decision>, bool), Error> {
        let replication = &self.replication;
        let peers = replication.peer_names();
        let width = items
            .iter()
            .map(|(rule, ..)| regions::ITEM_ANSWER + regions::TIER_ANSWER * rule.tiers().len())
            .max()
            .unwrap_or(regions::ITEM_ANSWER);
        let head = packed::<{ regions::HEAD }>([mode as f64, peers.len() as f64, width as f64]);
        let mut keys = Vec::new();
        let mut body: Vec<u8> = Vec::new();
        let mut touched = Vec::new();
        let mut geometry = Vec::with_capacity(items.len());
        for (rule, plan, key, cost) in items {
            let stale = replication.stale_mask(plan.stale_after);
            let on_partition = match plan.on_partition {
                OnPartition::Share => 0.0,
                OnPartition::Region => 1.0,
            };
            let head = [
                *cost as f64,
                f64::from(u8::from(rule.is_shadow())),
                rule.tiers().len() as f64,
                on_partition,
                stale as f64,
            ];
            body.extend(head.iter().flat_map(|d| d.to_le_bytes()));
            let mut shapes = Vec::with_capacity(plan.shapes.len());
            for (t, shape) in plan.shapes.iter().enumerate() {
                let buckets = shape.at(at);
                let tier = [
                    shape.limit as f64,
                    shape.allowance(peers.len(), replication.overshoot) as f64,
                    buckets.ids.len() as f64,
                    buckets.ttl(at).as_millis() as f64,
                ];
                body.extend(tier.iter().flat_map(|d| d.to_le_bytes()));
                body.extend(buckets.weights.iter().flat_map(|d| d.to_le_bytes()));
                for &b in &buckets.ids {
                    keys.push(counter_key(&plan.prefix, key, t, b));
                }
                if mode != regions::LOOK {
                    let current = keys.last().cloned().expect("a tier has a bucket");
                    touched.push((current, buckets.ttl(at)));
                }
                shapes.push(buckets);
            }
            geometry.push((stale != 0, shapes));
        }
        let mut args: Vec<&[u8]> = vec![replication.region.as_bytes(), &head];
        args.extend(peers.iter().map(|p| p.as_bytes()));
        args.push(&body);
        let answer = self.redis.regional_check(&keys, &args, width).await?;
        let mut decisions = Vec::with_capacity(items.len());
        let mut allowed = true;
        for (n, ((rule, plan, _, cost), (partitioned, shapes))) in
            items.iter().zip(&geometry).enumerate()
        {
            let reply = &answer[n * width..(n + 1) * width];
            let admitted = reply[0] == 1.0;
            let charged = match mode {
                regions::LOOK | regions::CREDIT => 0,
                regions::CHECK if !admitted => 0,
                _ => *cost,
            };
            let verdicts: Vec<_> = shapes
                .iter()
                .enumerate()
                .map(|(t, buckets)| {
                    let tier = &reply[regions::ITEM_ANSWER + t * regions::TIER_ANSWER..];
                    buckets.verdict(
                        &plan.shapes[t],
                        now,
                        tier[0],
                        tier[2] as u8,
                        charged,
                        2 * replication.interval_micros(),
                    )
                })
                .collect();
            let source = match partitioned | (reply[1] == 1.0) {
                true => Source::Partitioned,
                false => Source::Global,
            };
            if (0..shapes.len())
                .any(|t| reply[regions::ITEM_ANSWER + t * regions::TIER_ANSWER + 2] == 2.0)
            {
                replication.waiting();
            }
            let decision = rule
                .merge(|t| verdicts[t])
                .with_source(source)
                .shadow(rule.is_shadow());
            allowed &= decision.allowed();
            decisions.push(decision);
        }
        if mode != regions::LOOK && (mode != regions::CHECK || allowed) {
            replication.touched(touched);
        }
        Ok((decisions, allowed))
    }
}

/// Items of a batch, split: the per-region ones (with their places), the global ones.
type Split<'a, 'b, P> = (
    Vec<usize>,
    Vec<&'b Planned<'a, RegionPlan<P>>>,
    Vec<usize>,
    Vec<(&'a Rule, &'a GlobalPlan, &'a [u8], u64)>,
);

fn split<'a, 'b, P>(items: &'b [Planned<'a, RegionPlan<P>>]) -> Split<'a, 'b, P> {
    let (mut local_at, mut local, mut global_at, mut global) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, item) in items.iter().enumerate() {
        match item.plan {
            RegionPlan::Local(_) => {
                local_at.push(i);
                local.push(item);
            }
            RegionPlan::Global(plan) => {
                global_at.push(i);
                global.push((item.rule, plan, item.key, item.cost));
            }
        }
    }
    (local_at, local, global_at, global)
}

/// Decisions in the batch's order, from the two parts' and their places.
fn joined(len: usize, parts: [(&[usize], Vec<Decision>); 2]) -> Decisions {
    let mut all: Vec<Option<Decision>> = vec![None; len];
    for (places, decisions) in parts {
        for (&i, d) in places.iter().zip(decisions) {
            all[i] = Some(d);
        }
    }
    Decisions::many(all.into_iter().flatten().collect())
}

fn global_failure(error: Error) -> Failure {
    Failure::of(error, None)
}

impl<L: InRegion> Store for RegionStore<L> {
    type Plan = RegionPlan<L::Plan>;

    fn plan(&self, rule: &Rule) -> Result<RegionPlan<L::Plan>, Error> {
        match rule.scope_of() {
            Scope::Region => Ok(RegionPlan::Local(self.local().plan(rule)?)),
            Scope::Global(global) => Ok(RegionPlan::Global(GlobalPlan {
                prefix: self.redis.key(format!("tg:g:{}:", rule.name()).as_bytes()),
                shapes: rule
                    .tiers()
                    .iter()
                    .map(|tier| Shape::of(rule.algorithm(), tier))
                    .collect(),
                on_partition: global.on_partition,
                stale_after: global.stale_after,
                guard: self.redis.guard().plan(rule)?,
            })),
        }
    }

    async fn check(
        &self,
        items: &[Planned<'_, RegionPlan<L::Plan>>],
        now: u64,
        max_delay: Option<u64>,
    ) -> Result<Decisions, Error> {
        // Per-region rules alone (most checks): one list, the local store's.
        if items
            .iter()
            .all(|item| matches!(item.plan, RegionPlan::Local(_)))
        {
            return self.local.check(&Self::locals(items), now, max_delay).await;
        }
        let (local_at, local, global_at, global) = split(items);
        let guarded: Vec<Planned<'_, GlobalPlan>> = global
            .iter()
            .map(|&(rule, plan, key, cost)| Planned {
                rule,
                plan,
                key,
                cost,
            })
            .collect();
        let guard = self.redis.guard();
        let route = Route::one(guard.single());
        let remote = |_| async {
            self.global(&global, now, now, regions::CHECK)
                .await
                .map(Decisions::many)
                .map_err(global_failure)
        };
        let decided = guard.decide(&guarded, now, max_delay, &route, remote).await;
        let by_store = decided
            .iter()
            .all(|d| matches!(d.source(), Source::Global | Source::Partitioned));
        let decided: Vec<Decision> = decided.iter().copied().collect();
        if local.is_empty() {
            return Ok(joined(
                items.len(),
                [(&global_at, decided), (&[], Vec::new())],
            ));
        }
        let globally = decided.iter().all(|d| d.allowed());
        let local_items = Self::locals(local.iter().copied());
        let local_decided = if globally {
            self.local.check(&local_items, now, max_delay).await?
        } else {
            // Denied already: the per-region rules are looked at, taking nothing.
            let looks: Vec<_> = local_items.iter().map(|i| i.with_cost(0)).collect();
            self.local.check(&looks, now, max_delay).await?
        };
        if globally && by_store && !local_decided.allowed() {
            // All-or-nothing: what the global rules took comes back.
            if let Err(e) = self.global(&global, now, now, regions::CREDIT).await {
                tracing::warn!(error = %e, "a denied batch's global permits stay taken");
            }
        }
        let local_decided: Vec<Decision> = local_decided.iter().copied().collect();
        Ok(joined(
            items.len(),
            [(&global_at, decided), (&local_at, local_decided)],
        ))
    }

    fn settles(&self) -> Result<(), Error> {
        self.local().settles()
    }

    async fn settle(
        &self,
        items: &[Planned<'_, RegionPlan<L::Plan>>],
        now: u64,
        settle: Settle,
    ) -> Result<Decisions, Error> {
        let (local_at, local, global_at, global) = split(items);
        let global_decided = match settle {
            _ if global.is_empty() => Vec::new(),
            Settle::Report => self.global(&global, now, now, regions::REPORT).await?,
            Settle::Credit { at } => self.global(&global, now, at, regions::CREDIT).await?,
            // Nothing to renew: no global rule holds slots.
            Settle::Renew => self.global(&global, now, now, regions::LOOK).await?,
        };
        let local_decided = match local.is_empty() {
            true => Vec::new(),
            false => {
                let local = Self::locals(local.iter().copied());
                self.local
                    .settle(&local, now, settle)
                    .await?
                    .iter()
                    .copied()
                    .collect()
            }
        };
        Ok(joined(
            items.len(),
            [(&global_at, global_decided), (&local_at, local_decided)],
        ))
    }

    async fn keep_reservation(&self, record: &ReservationRecord, now: u64) -> Result<(), Error> {
        self.local.keep(record, now).await
    }

    async fn take_reservation(
        &self,
        id: &str,
        now: u64,
    ) -> Result<Option<ReservationRecord>, Error> {
        self.local.take(id, now).await
    }

    async fn expired_reservations(
        &self,
        now: u64,
        limit: usize,
    ) -> Result<Vec<ReservationRecord>, Error> {
        self.local.expired(now, limit).await
    }

    async fn shutdown(&self) {
        self.replication.finish().await;
        self.local.shutdown().await;
    }

    async fn reset(
        &self,
        items: &[Planned<'_, RegionPlan<L::Plan>>],
        now: u64,
    ) -> Result<(), Error> {
        let (_, local, _, global) = split(items);
        if let Some((rule, ..)) = global.first() {
            return Err(Error::Unsupported {
                what: format!(
                    "rule {} is global: its counts are merged from every region and only \
                     grow, so a reset here would come back with the next exchange; its \
                     window ends the count",
                    rule.name()
                ),
            });
        }
        let local = Self::locals(local.iter().copied());
        self.local.reset(&local, now).await
    }
}
