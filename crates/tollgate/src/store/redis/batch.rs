//! A call of the batch function, owned so that it can go on after its check was answered,
//! and what it answers: six little-endian doubles per tier of every item, read back into
//! decisions in the items' order.

use super::plan::RedisPlan;
use crate::decision::{Decision, Source};
use crate::error::Error;
use crate::layout::{self, batch, packed, verdict};
use crate::rule::Rule;
use crate::store::Planned;

/// The verdicts of a reply (see `layout::verdict`), one per tier, read in order.
pub(super) struct Verdicts<'a> {
    reply: &'a [u8],
}

impl<'a> Verdicts<'a> {
    pub(super) fn new(reply: &'a [u8], tiers: usize) -> Result<Self, Error> {
        if reply.len() != verdict::BYTES * tiers {
            return Err(Error::Store {
                message: format!("reply of {} bytes for {tiers} tiers", reply.len()),
                transient: false,
            });
        }
        Ok(Self { reply })
    }

    /// The next item's decision: one verdict per tier of `rule`, decided by `source`.
    pub(super) fn decision(&mut self, rule: &Rule, source: Source) -> Decision {
        let (this, rest) = self.reply.split_at(verdict::BYTES * rule.tiers().len());
        self.reply = rest;
        let verdict = |i: usize| layout::decode_verdict(&this[verdict::BYTES * i..]);
        rule.merge(verdict).with_source(source)
    }
}

/// A call of the batch function, its keys and arguments owned, so that it can go on after
/// its check was answered.
pub(super) struct Call {
    pub(super) keys: Vec<Vec<u8>>,
    pub(super) args: Vec<Vec<u8>>,
    /// Each item's rule argument for the module's batch, when it decides every item.
    pub(super) module: Option<Vec<Vec<u8>>>,
}

/// What a call of the batch function answered.
pub(super) struct Batched {
    /// Every tier's verdict of every item, six little-endian doubles each.
    pub(super) verdicts: Vec<u8>,
    /// When it decided (µs, on the clock it read).
    pub(super) at: u64,
    /// Which decided: the functions or the module.
    pub(super) source: Source,
}

/// What a call of the batch function does (see `layout::batch`).
#[derive(Debug, Clone, Copy)]
#[repr(u8)]
pub(super) enum Mode {
    /// Decides: writes the costs if every item admits.
    Decide = batch::DECIDE,
    /// Asks every item, writing nothing.
    Look = batch::LOOK,
}

impl Call {
    /// The same call in another mode.
    pub(super) fn in_mode(&self, mode: Mode) -> Self {
        let mut args = self.args.clone();
        args[1][..layout::DOUBLE].copy_from_slice(&packed([f64::from(mode as u8)]));
        Self {
            keys: self.keys.clone(),
            args,
            module: self.module.clone(),
        }
    }
}

/// Reads the verdicts of `items[group]` from a batch `reply`, decided by `source`, into
/// `decisions`.
pub(super) fn read_batch(
    items: &[Planned<'_, RedisPlan>],
    group: &[usize],
    reply: &[u8],
    source: Source,
    decisions: &mut [Option<Decision>],
) -> Result<(), Error> {
    let tiers = group.iter().map(|&i| items[i].plan.tiers).sum();
    let mut verdicts = Verdicts::new(reply, tiers)?;
    for &i in group {
        let rule = items[i].rule;
        decisions[i] = Some(verdicts.decision(rule, source).shadow(rule.is_shadow()));
    }
    Ok(())
}

/// Runs `futures` at once; their outputs in order.
pub(crate) async fn futures_join<F: std::future::Future>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output> {
    let mut pending: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (future, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future ran"))
        .collect()
}
