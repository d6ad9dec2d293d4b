//! Checks on Redis: one item in one call of its algorithm's function (or of tollgate's
//! module where a node loads it), several in one call of the batch function, all-or-nothing;
//! on a cluster, a batch whose keys span slots takes from every slot at once ([`across`]).
//! No failure policy here: the guard calls [`RedisStore::remote`] and decides on failure.

use std::sync::Arc;

use redis::RedisError;

use super::across;
use super::batch::{Batched, Call, Mode, Verdicts, read_batch};
use super::connection::{store_error, traced};
use super::keys::slot;
use super::module;
use super::plan::{RedisPlan, slot_groups};
use super::script::{self, Entry};
use super::store::RedisStore;
use crate::decision::{Decision, Decisions, Source};
use crate::error::Error;
use crate::layout::{batch, packed};
use crate::store::Planned;
use crate::store::guard::{Backend, Deadline, Failure, Route};

impl RedisStore {
    /// The backends `items` ask: the single server's, or, on a cluster, the node of each
    /// slot their keys are on (the store-wide backend for a slot no node is known for yet),
    /// with each item's place among them.
    pub(super) fn route(&self, items: &[Planned<'_, RedisPlan>]) -> (Route<'_>, Vec<usize>) {
        let Some(topology) = &self.topology else {
            return (Route::one(self.guard.single()), Vec::new());
        };
        let mut nodes: Vec<Arc<Backend>> = Vec::with_capacity(1);
        let mut places = Vec::with_capacity(items.len());
        for item in items {
            let node = topology
                .node(slot(&item.plan.keys(item.key)[0]))
                .unwrap_or_else(|| self.guard.single_shared());
            let place = match nodes.iter().position(|n| Arc::ptr_eq(n, &node)) {
                Some(place) => place,
                None => {
                    nodes.push(node);
                    nodes.len() - 1
                }
            };
            places.push(place);
        }
        (Route::many(nodes), places)
    }

    /// Decides `items` on Redis, with no failure policy: the guard calls this. Tells `route`
    /// which backends answered; a failure names the one at fault (`places[i]`: item `i`'s
    /// backend in the route; none on one server).
    pub(super) async fn remote(
        &self,
        items: &[Planned<'_, RedisPlan>],
        now: u64,
        max_delay: Option<u64>,
        route: &Route<'_>,
        places: &[usize],
        deadline: Option<Deadline>,
    ) -> Result<Decisions, Failure> {
        let place = |i: usize| places.get(i).copied().unwrap_or(0);
        if let [item] = items {
            let decision = self
                .check_one(item, now, max_delay, route.get(place(0)), deadline)
                .await
                .map_err(|failure| Failure {
                    backend: Some(place(0)),
                    ..failure
                })?;
            route.answered(place(0));
            return Ok(Decisions::one(decision.shadow(item.rule.is_shadow())));
        }
        // Only a check of one item is bounded (see `check`).
        debug_assert!(deadline.is_none());
        // StoreFuture: inline, it would make the future of every check larger.
        Box::pin(self.check_many(items, now, max_delay, route, places)).await
    }

    /// Decides several items, all-or-nothing. On one server, or when every key is in one
    /// slot, one call of the batch function. Across slots, every slot takes at once, and
    /// gives back if another denies ([`across`]): no limit is exceeded, and the check is
    /// answered once what it took is given back, so that the caller's next check sees it.
    async fn check_many(
        &self,
        items: &[Planned<'_, RedisPlan>],
        now: u64,
        max_delay: Option<u64>,
        route: &Route<'_>,
        places: &[usize],
    ) -> Result<Decisions, Failure> {
        let groups = match self.connection.as_cluster() {
            None => vec![(0..items.len()).collect()],
            Some(_) => slot_groups(items),
        };
        let place = |group: &[usize]| places.get(group[0]).copied().unwrap_or(0);
        let mut decisions: Vec<Option<Decision>> = vec![None; items.len()];
        if let [group] = &groups[..] {
            let call = self.batch_call(items, group, now, max_delay, Mode::Decide);
            let node = route.get(place(group));
            let batched = self
                .run(&call, Some(node), now)
                .await
                .map_err(|error| Failure::of(error, Some(place(group))))?;
            route.answered(place(group));
            let (reply, source) = (&batched.verdicts, batched.source);
            read_batch(items, group, reply, source, &mut decisions)?;
        } else {
            let parts = groups
                .iter()
                .map(|group| {
                    let take = self.batch_call(items, group, now, max_delay, Mode::Decide);
                    across::Part {
                        node: self
                            .topology
                            .as_ref()
                            .and_then(|t| t.node(slot(&take.keys[0]))),
                        take,
                        items: group
                            .iter()
                            .map(|&i| (items[i].plan.tiers, items[i].rule.is_shadow()))
                            .collect(),
                        gives_back: group.iter().all(|&i| items[i].plan.gives_back),
                    }
                })
                .collect();
            let (answer, answered) = tokio::sync::oneshot::channel();
            // A task of its own, in the check's span: what it takes is given back if this
            // check is dropped.
            let task = tokio::spawn(tracing::Instrument::instrument(
                across::take(self.clone(), now, parts, answer),
                tracing::Span::current(),
            ));
            let outcomes = answered.await.map_err(|_| {
                Failure::from(Error::Store {
                    message: "a check across slots ended without an answer".into(),
                    transient: true,
                })
            })?;
            let mut failure = None;
            for (group, outcome) in groups.iter().zip(outcomes) {
                match outcome {
                    Ok((reply, source)) => {
                        route.answered(place(group));
                        read_batch(items, group, &reply, source, &mut decisions)?;
                    }
                    Err(error) => {
                        failure.get_or_insert(Failure::of(error, Some(place(group))));
                    }
                }
            }
            if let Some(failure) = failure {
                let _ = task.await;
                return Err(failure);
            }
            if !decisions.iter().flatten().all(Decision::allowed) {
                let decided = decisions.iter().map(|d| d.expect("every item decided"));
                route.settle(Decisions::many(decided.collect()));
                let _ = task.await;
            }
        }
        let decisions = decisions
            .into_iter()
            .map(|d| d.expect("every item decided"));
        Ok(Decisions::many(decisions.collect()))
    }

    /// Decides one item in one call: of tollgate's module where `node` has it ([`module`]),
    /// else of its algorithm's function.
    async fn check_one(
        &self,
        item: &Planned<'_, RedisPlan>,
        now: u64,
        max_delay: Option<u64>,
        node: &Backend,
        deadline: Option<Deadline>,
    ) -> Result<Decision, Failure> {
        // A timeout error once the deadline has passed is the deadline's.
        let failure = |err: RedisError| Failure {
            timed_out: err.is_timeout() && deadline.is_some_and(|d| Deadline::now() >= d),
            error: store_error(err),
            backend: None,
        };
        let plan = item.plan;
        let header = self.header(now, item.cost, max_delay);
        // One key for word states: named without a list around it.
        let (one, many);
        let keys: &[Vec<u8>] = if plan.entry.key_per_tier {
            many = plan.keys(item.key);
            &many
        } else {
            one = [plan.name(item.key)];
            &one
        };
        let tier_args = plan.tier_args_at(item.rule, now);
        if let Some(rule_args) = &plan.module
            && node.module.worth_asking(now)
            && module::quotable(&keys[0])
        {
            let call = module::check(&keys[0], &header, rule_args, &tier_args);
            let asked = self.connection.query::<Vec<u8>>(call, deadline);
            match traced("TOLLGATE.CHECK", "TOLLGATE.CHECK", 1, asked).await {
                Ok(reply) => {
                    node.module.present();
                    let mut verdicts = Verdicts::new(&reply, plan.tiers)?;
                    return Ok(verdicts.decision(item.rule, Source::RedisModule));
                }
                Err(err) if module::missing(&err) => node.module.absent(now, node.name(), &err),
                Err(err) => return Err(failure(err)),
            }
        }
        let args: [&[u8]; 2] = [&header, &tier_args];
        let reply = self
            .connection
            .invoke(plan.entry, keys, &args, deadline)
            .await
            .map_err(failure)?;
        let mut verdicts = Verdicts::new(&reply, plan.tiers)?;
        Ok(verdicts.decision(item.rule, Source::Redis))
    }

    /// The call of the batch function that decides `items[group]`, all-or-nothing, in `mode`.
    pub(super) fn batch_call(
        &self,
        items: &[Planned<'_, RedisPlan>],
        group: &[usize],
        now: u64,
        max_delay: Option<u64>,
        mode: Mode,
    ) -> Call {
        let header = self.header(now, 0, max_delay);
        let mut described = packed([f64::from(mode as u8)]);
        let mut keys = Vec::new();
        for &i in group {
            let Planned {
                rule,
                plan,
                key,
                cost,
            } = &items[i];
            let names = plan.keys(key);
            let mut item = [0.0; batch::ITEM];
            item[batch::ALGORITHM] = plan.algorithm as f64;
            item[batch::COST] = *cost as f64;
            item[batch::SHADOW] = f64::from(u8::from(rule.is_shadow()));
            item[batch::KEYS] = names.len() as f64;
            described.extend(packed(item));
            keys.extend(names);
        }
        let mut args = vec![header.to_vec(), described];
        args.extend(
            group
                .iter()
                .map(|&i| items[i].plan.tier_args_at(items[i].rule, now).into_owned()),
        );
        // The module decides a batch of items of one key each, of its algorithms.
        let module = group
            .iter()
            .map(|&i| items[i].plan.module.clone())
            .collect();
        Call { keys, args, module }
    }

    /// Calls `entry` (the batch or the settle function) with `call`, or where `node` has
    /// the module ([`module`]), its `command` (`TOLLGATE.BATCH`, `TOLLGATE.SETTLE`) with the
    /// same: the reply, and which answered it.
    pub(super) async fn of_items(
        &self,
        entry: &Entry,
        command: &'static str,
        call: &Call,
        node: Option<&Backend>,
        now: u64,
    ) -> Result<(Vec<u8>, Source), RedisError> {
        let args: Vec<&[u8]> = call.args.iter().map(Vec::as_slice).collect();
        if let (Some(rules), Some(node)) = (&call.module, node)
            && node.module.worth_asking(now)
            && module::quotable_all(&call.keys)
        {
            let items = module::items(command, &call.keys, &args, rules);
            let asked = self
                .connection
                .query_slot::<Vec<u8>>(items, slot(&call.keys[0]));
            match traced(command, command, call.keys.len(), asked).await {
                Ok(reply) => {
                    node.module.present();
                    return Ok((reply, Source::RedisModule));
                }
                Err(err) if module::missing(&err) => node.module.absent(now, node.name(), &err),
                Err(err) => return Err(err),
            }
        }
        let reply = self
            .connection
            .invoke(entry, &call.keys, &args, None)
            .await?;
        Ok((reply, Source::Redis))
    }

    /// Runs a call of the batch function, or of the module's batch where `node` has it
    /// ([`module`]), for a check at `now`: its verdicts, the time it decided at (µs, on the
    /// clock it read), and which decided.
    pub(super) async fn run(
        &self,
        call: &Call,
        node: Option<&Backend>,
        now: u64,
    ) -> Result<Batched, Error> {
        let (mut reply, source) = self
            .of_items(&script::BATCH_ENTRY, "TOLLGATE.BATCH", call, node, now)
            .await
            .map_err(store_error)?;
        let Some(end) = reply.len().checked_sub(8) else {
            return Err(Error::Store {
                message: "a batch's reply without its time".into(),
                transient: false,
            });
        };
        let at = f64::from_le_bytes(reply[end..].try_into().expect("eight bytes"));
        reply.truncate(end);
        Ok(Batched {
            verdicts: reply,
            at: at as u64,
            source,
        })
    }
}
