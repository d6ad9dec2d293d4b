//! The window counters the hybrid and lease stores keep on Redis (`lua/counters.lua`):
//! adds, leases and claims of several counters in one call per slot. These stores decide in
//! memory; Redis only keeps the counts every instance shares.

use super::args::StoreTime;
use super::connection::store_error;
use super::keys::{by_slot, slot};
use super::script::{self, Entry};
use super::store::RedisStore;
use crate::error::Error;
use crate::layout::{counters, packed};

impl RedisStore {
    /// Adds to window counters (see `lua/counters.lua`): `args` holds each key's delta and
    /// TTL; the answer's values are the counts after.
    pub(crate) async fn add(&self, keys: &[Vec<u8>], args: &[Vec<u8>]) -> Result<Answer, Error> {
        let items = CounterItem::one_key_each(keys, args);
        self.counters(&script::ADD_ENTRY, &[], &items, counters::ADDED)
            .await
    }

    /// Leases from window counters for the instance `id` at `now` (as for
    /// [`claim`](Self::claim); see `lua/counters.lua`); the answer's values are each item's
    /// grant and count after.
    pub(crate) async fn lease(
        &self,
        id: &[u8],
        now: u64,
        items: &[CounterItem],
    ) -> Result<Answer, Error> {
        let time = packed([self.caller_time(now)]);
        self.counters(&script::LEASE_ENTRY, &[id, &time], items, counters::LEASED)
            .await
    }

    /// Pushes to window counters and claims from them for the instance `id` at `now` (µs, on
    /// the caller's clock; the server's with [`StoreTime::Server`]; see `lua/counters.lua`);
    /// the answer holds five values per item.
    pub(crate) async fn claim(
        &self,
        id: &[u8],
        now: u64,
        items: &[CounterItem],
    ) -> Result<Answer, Error> {
        let time = packed([self.caller_time(now)]);
        self.counters(&script::CLAIM_ENTRY, &[id, &time], items, counters::CLAIMED)
            .await
    }

    /// `now` as the counters functions read the caller's time: -1 for the server's.
    fn caller_time(&self, now: u64) -> f64 {
        match self.time {
            StoreTime::Server => -1.0,
            StoreTime::Local => now as f64,
        }
    }

    /// Calls a counters function with `items`, and `whole`, arguments of the whole call (the
    /// first before the items', the others after): one call on a single server, one per slot
    /// on a cluster. The answer holds `width` values per item, in the order of `items`.
    async fn counters(
        &self,
        entry: &Entry,
        whole: &[&[u8]],
        items: &[CounterItem],
        width: usize,
    ) -> Result<Answer, Error> {
        let groups: Vec<Vec<usize>> = match self.connection.as_cluster() {
            None => vec![(0..items.len()).collect()],
            Some(_) => by_slot(items.iter().map(|i| slot(&i.keys[0]))),
        };
        let mut answer = Answer {
            time: 0,
            values: vec![0.0; width * items.len()],
            calls: 0,
        };
        for group in groups {
            let names: Vec<Vec<u8>> = group
                .iter()
                .flat_map(|&i| items[i].keys.iter().cloned())
                .collect();
            let packed: Vec<u8> = group
                .iter()
                .flat_map(|&i| items[i].args.iter().copied())
                .collect();
            answer.calls += 1;
            let args: Vec<&[u8]> = match whole {
                [] => vec![&packed[..]],
                [first, rest @ ..] => [&[*first, &packed[..]], rest].concat(),
            };
            let reply = self
                .connection
                .invoke(entry, &names, &args, None)
                .await
                .map_err(store_error)?;
            let doubles: Vec<f64> = reply
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().expect("eight bytes")))
                .collect();
            if doubles.len() != 1 + width * group.len() {
                return Err(Error::Store {
                    message: format!(
                        "counters replied {} values for {} items",
                        doubles.len(),
                        group.len()
                    ),
                    transient: false,
                });
            }
            answer.time = answer.time.max(doubles[0] as u64);
            for (n, &i) in group.iter().enumerate() {
                let values = &doubles[1 + width * n..1 + width * (n + 1)];
                answer.values[width * i..width * (i + 1)].copy_from_slice(values);
            }
        }
        Ok(answer)
    }

    /// Deletes `keys` (of one slot).
    pub(crate) async fn delete(&self, keys: &[Vec<u8>]) -> Result<(), Error> {
        let mut del = redis::cmd("DEL");
        for key in keys {
            del.arg(key);
        }
        self.connection
            .query::<u64>(del, None)
            .await
            .map(drop)
            .map_err(store_error)
    }
}

/// One item of a counters call: its keys (in one slot) and its packed arguments.
#[derive(Debug)]
pub(crate) struct CounterItem {
    pub(crate) keys: Vec<Vec<u8>>,
    pub(crate) args: Vec<u8>,
}

impl CounterItem {
    pub(super) fn one_key_each(keys: &[Vec<u8>], args: &[Vec<u8>]) -> Vec<Self> {
        keys.iter()
            .zip(args)
            .map(|(key, args)| Self {
                keys: vec![key.clone()],
                args: args.clone(),
            })
            .collect()
    }
}

/// What a counters function answered: Redis's time (µs), the values, and the calls made.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) time: u64,
    pub(crate) values: Vec<f64>,
    pub(crate) calls: u64,
}
