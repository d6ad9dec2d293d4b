//! Checks whose keys span Redis Cluster slots. Keys of different slots cannot meet in one
//! call, so such a check takes from every slot at once, each slot's items all-or-nothing in
//! one call of the batch function; when any slot denies or fails (or the check is abandoned
//! to its failure policy), every slot that took gives back what it took, at the time it took
//! it. A permit is counted before it is admitted, so no limit is ever exceeded, whatever the
//! concurrency.
//!
//! The price is under-admission, in two cases. While a denied check holds what it took (one
//! round trip, between its take and its give-back), another check of those keys may find them
//! full and be denied. And where a give-back fails (its master failed between the two calls),
//! what was taken stays taken until it expires or refills, said in a warning.
//!
//! A slot with an item whose algorithm cannot give back (warm-up) is taken only after every
//! other slot admitted, one such slot at a time, and looked at without taking once one
//! denied: what such a slot took is lost only when a later one of them denies.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use tokio::sync::oneshot;

use super::batch::{Batched, Call, Mode, futures_join};
use super::connection::store_error;
use super::script;
use super::store::RedisStore;
use crate::algorithm::Settle;
use crate::decision::Source;
use crate::error::Error;
use crate::layout::{DOUBLE, batch, packed};
use crate::store::guard::Backend;

/// One slot's part of a check.
pub(super) struct Part {
    /// The call that takes the slot's items, all-or-nothing.
    pub(super) take: Call,
    /// Each item's number of tiers and whether its rule is in shadow mode, in order.
    pub(super) items: Vec<(usize, bool)>,
    /// Whether every item's algorithm gives back what it took.
    pub(super) gives_back: bool,
    /// The slot's master, whose breaker counts a give-back's outcome.
    pub(super) node: Option<Arc<Backend>>,
}

/// A part's verdicts (of its take, or of a look when another part denied first), as the
/// batch function replies without its time, and which decided them.
pub(super) type Outcome = Result<(Vec<u8>, Source), Error>;

/// What a part took: when (µs, the function's clock), and which items wrote their cost.
struct Taken {
    at: u64,
    written: Vec<bool>,
}

/// Takes every part (see the module's doc) and sends each part's outcome to `answer`. What
/// was taken is given back as soon as a part denies or fails, or the check stops waiting for
/// the answer (its timeout passed: its failure policy decides), and a take that lands after
/// that is given back as it lands; the answer comes once given back. Runs as a task of its
/// own, so that what a check took is given back even when the check is dropped.
pub(super) async fn take(
    store: RedisStore,
    now: u64,
    parts: Vec<Part>,
    answer: oneshot::Sender<Vec<Outcome>>,
) {
    let mut answer = answer;
    let mut outcomes: Vec<Option<Outcome>> = parts.iter().map(|_| None).collect();
    let mut taken: Vec<Option<Taken>> = parts.iter().map(|_| None).collect();
    let (mut denied, mut abandoned) = (false, false);

    // The parts that give back, at once.
    type Reply<'a> = Pin<Box<dyn Future<Output = Result<Batched, Error>> + Send + 'a>>;
    let mut takes: Vec<(usize, Reply<'_>)> = (0..parts.len())
        .filter(|&p| parts[p].gives_back)
        .map(|p| {
            let take = store.run(&parts[p].take, parts[p].node.as_deref(), now);
            (p, Box::pin(take) as Reply<'_>)
        })
        .collect();
    let mut gives: Vec<Pin<Box<dyn Future<Output = ()> + Send + '_>>> = Vec::new();
    std::future::poll_fn(|cx| {
        abandoned = abandoned || answer.poll_closed(cx).is_ready();
        takes.retain_mut(|(p, reply)| {
            let Poll::Ready(reply) = reply.as_mut().poll(cx) else {
                return true;
            };
            let (outcome, took) = read(&parts[*p], reply);
            denied |= took.is_none();
            (outcomes[*p], taken[*p]) = (Some(outcome), took);
            false
        });
        if denied || abandoned {
            for (part, took) in parts.iter().zip(taken.iter_mut()) {
                if let Some(took) = took.take() {
                    gives.push(Box::pin(give_back(&store, now, part, took)));
                }
            }
        }
        gives.retain_mut(|give| give.as_mut().poll(cx).is_pending());
        if takes.is_empty() && gives.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    if abandoned {
        return;
    }

    // Then the others, one at a time while every part admits; looked at once one denied.
    for p in (0..parts.len()).filter(|&p| !parts[p].gives_back) {
        if denied {
            let look = parts[p].take.in_mode(Mode::Look);
            let looked = store.run(&look, parts[p].node.as_deref(), now).await;
            outcomes[p] = Some(looked.map(|b| (b.verdicts, b.source)));
            continue;
        }
        let took = store
            .run(&parts[p].take, parts[p].node.as_deref(), now)
            .await;
        let (outcome, took) = read(&parts[p], took);
        denied |= took.is_none();
        outcomes[p] = Some(outcome);
    }

    let outcomes = outcomes.into_iter().map(|o| o.expect("every part decided"));
    let abandoned = answer.send(outcomes.collect()).is_err();
    if denied || abandoned {
        let gives = parts
            .iter()
            .zip(taken.iter_mut())
            .filter_map(|(part, took)| Some(give_back(&store, now, part, took.take()?)));
        futures_join(gives).await;
    }
}

/// A part's outcome from the reply of its take, and what it took: `None` unless every item
/// of the part admitted (those of rules in shadow mode aside).
fn read(part: &Part, reply: Result<Batched, Error>) -> (Outcome, Option<Taken>) {
    let Batched {
        verdicts,
        at,
        source,
    } = match reply {
        Ok(reply) => reply,
        Err(e) => return (Err(e), None),
    };
    let tiers: usize = part.items.iter().map(|(tiers, _)| tiers).sum();
    if verdicts.len() != 48 * tiers {
        let message = format!("reply of {} bytes for {tiers} tiers", verdicts.len());
        let error = Error::Store {
            message,
            transient: false,
        };
        return (Err(error), None);
    }
    let allowed = |tier: usize| verdicts[48 * tier..48 * tier + 8] == 1f64.to_le_bytes();
    let mut first = 0;
    let mut admitted = true;
    let mut written = Vec::with_capacity(part.items.len());
    for (i, &(tiers, shadow)) in part.items.iter().enumerate() {
        let all = (first..first + tiers).all(allowed);
        admitted &= all || shadow;
        written.push(all && cost(&part.take, i) > 0.0);
        first += tiers;
    }
    let took = admitted.then_some(Taken { at, written });
    (Ok((verdicts, source)), took)
}

/// Where item `i`'s cost is in a batch call's second argument (see `layout::batch`: after
/// the mode, each item's doubles).
fn cost_at(i: usize) -> std::ops::Range<usize> {
    let at = DOUBLE * (1 + batch::ITEM * i + batch::COST);
    at..at + DOUBLE
}

/// Item `i`'s cost in a batch call.
fn cost(call: &Call, i: usize) -> f64 {
    f64::from_le_bytes(call.args[1][cost_at(i)].try_into().expect("eight bytes"))
}

/// Gives back what `part` took: each item that wrote its cost, credited at the time it was
/// taken. A failure leaves it taken, said in a warning, and counts against the slot's master.
async fn give_back(store: &RedisStore, now: u64, part: &Part, took: Taken) {
    if !took.written.contains(&true) {
        return;
    }
    let mut give = Call {
        keys: part.take.keys.clone(),
        args: part.take.args.clone(),
        module: part.take.module.clone(),
    };
    give.args[0] = store
        .header_of(now, 0, None, Some(Settle::Credit { at: took.at }))
        .to_vec();
    for (i, written) in took.written.iter().enumerate() {
        if !written {
            give.args[1][cost_at(i)].copy_from_slice(&packed([0.0]));
        }
    }
    let outcome = store
        .of_items(
            &script::SETTLE_ENTRY,
            "TOLLGATE.SETTLE",
            &give,
            part.node.as_deref(),
            now,
        )
        .await
        .map(drop)
        .map_err(store_error);
    if let Err(e) = &outcome {
        tracing::warn!(
            error = %e,
            "a check across slots, denied or left to its failure policy, could not give back \
             what one slot took: it stays taken until it expires or refills"
        );
    }
    if let Some(node) = &part.node {
        node.record(now, outcome.as_ref().map(|_| ()), &store.guard.config());
    }
}
