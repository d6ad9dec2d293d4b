//! Global rules' counts on Redis (`lua/regions.lua`): a check in this region, and the two
//! sides of a replication round. Nothing here knows peers or staleness; the regions store
//! (`store/regions`) says which, and what the numbers mean.

use super::batch::futures_join;
use super::connection::store_error;
use super::keys::{by_slot, slot};
use super::script::{self, Entry};
use super::store::RedisStore;
use crate::error::Error;
use crate::layout::regions;

impl RedisStore {
    /// Whether this store is a Redis Cluster's.
    pub(crate) fn clustered(&self) -> bool {
        self.connection.as_cluster().is_some()
    }

    /// Decides (or settles) items of global rules in one call: `keys` all in one slot;
    /// `args` as `regional_check` in `lua/regions.lua` reads them. The answer holds `width`
    /// doubles per item.
    pub(crate) async fn regional_check(
        &self,
        keys: &[Vec<u8>],
        args: &[&[u8]],
        width: usize,
    ) -> Result<Vec<f64>, Error> {
        let doubles = self
            .regional(&script::REGIONAL_CHECK_ENTRY, keys, args)
            .await?;
        match doubles.split_first() {
            Some((_, answer)) if answer.len() % width == 0 => Ok(answer.to_vec()),
            _ => Err(invalid("check", doubles.len())),
        }
    }

    /// This region's side of a replication round (`regional_sync`): `keys` with, per key,
    /// its packed arguments; this region's `+` and `-` of each key, in order. One call, or
    /// on a cluster one per slot, at once.
    pub(crate) async fn regional_sync(
        &self,
        region: &str,
        peers: &[&str],
        keys: &[Vec<u8>],
        items: &[Vec<u8>],
    ) -> Result<Vec<f64>, Error> {
        let head: Vec<&[u8]> = vec![region.as_bytes()];
        let tail: Vec<&[u8]> = peers.iter().map(|p| p.as_bytes()).collect();
        self.by_slots(
            &script::REGIONAL_SYNC_ENTRY,
            "sync",
            keys,
            items,
            &head,
            &tail,
            regions::SYNCED,
        )
        .await
    }

    /// A peer's side of a replication round (`regional_merge`), called on the peer's store:
    /// keeps `sender`'s counts of `keys` (packed per key in `items`) where larger, and
    /// answers, per key, the sender's `+` it holds and `receiver`'s own `+` and `-`.
    pub(crate) async fn regional_merge(
        &self,
        sender: &str,
        receiver: &str,
        keys: &[Vec<u8>],
        items: &[Vec<u8>],
    ) -> Result<Vec<f64>, Error> {
        let head: Vec<&[u8]> = vec![sender.as_bytes(), receiver.as_bytes()];
        self.by_slots(
            &script::REGIONAL_MERGE_ENTRY,
            "merge",
            keys,
            items,
            &head,
            &[],
            regions::MERGED,
        )
        .await
    }

    /// Calls `entry` with `keys` and their packed `items` between the arguments `head` and
    /// `tail`: one call on a single server, one per slot on a cluster, all at once. The
    /// answer holds `width` doubles per key, in the order of `keys`.
    #[allow(clippy::too_many_arguments)]
    async fn by_slots(
        &self,
        entry: &Entry,
        what: &str,
        keys: &[Vec<u8>],
        items: &[Vec<u8>],
        head: &[&[u8]],
        tail: &[&[u8]],
        width: usize,
    ) -> Result<Vec<f64>, Error> {
        let groups = match self.clustered() {
            false => vec![(0..keys.len()).collect::<Vec<usize>>()],
            true => by_slot(keys.iter().map(|k| slot(k))),
        };
        let calls = groups.iter().map(|group| async move {
            let names: Vec<Vec<u8>> = group.iter().map(|&i| keys[i].clone()).collect();
            let packed: Vec<u8> = group.iter().flat_map(|&i| items[i].clone()).collect();
            let mut args: Vec<&[u8]> = head.to_vec();
            args.push(&packed);
            args.extend_from_slice(tail);
            self.regional(entry, &names, &args).await
        });
        let mut answer = vec![0.0; width * keys.len()];
        for (group, doubles) in groups.iter().zip(futures_join(calls).await) {
            let doubles = doubles?;
            if doubles.len() != 1 + width * group.len() {
                return Err(invalid(what, doubles.len()));
            }
            for (n, &i) in group.iter().enumerate() {
                answer[width * i..width * (i + 1)]
                    .copy_from_slice(&doubles[1 + width * n..1 + width * (n + 1)]);
            }
        }
        Ok(answer)
    }

    /// The hashes of `keys` (one slot), each as its fields and values: what a region's
    /// Redis holds of a global rule's buckets. The reads are sent at once (pipelined).
    pub(crate) async fn regional_fields(
        &self,
        keys: &[Vec<u8>],
    ) -> Result<Vec<Vec<(String, f64)>>, Error> {
        let reads = keys.iter().map(|key| {
            let mut command = redis::cmd("HGETALL");
            command.arg(key);
            self.connection
                .query::<Vec<(String, String)>>(command, None)
        });
        futures_join(reads)
            .await
            .into_iter()
            .map(|fields| {
                let fields = fields.map_err(store_error)?;
                Ok(fields
                    .into_iter()
                    .filter_map(|(name, value)| Some((name, value.parse().ok()?)))
                    .collect())
            })
            .collect()
    }

    async fn regional(
        &self,
        entry: &Entry,
        keys: &[Vec<u8>],
        args: &[&[u8]],
    ) -> Result<Vec<f64>, Error> {
        let reply = self
            .connection
            .invoke(entry, keys, args, None)
            .await
            .map_err(store_error)?;
        if reply.len() % 8 != 0 {
            return Err(invalid("call", reply.len()));
        }
        Ok(reply
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("eight bytes")))
            .collect())
    }
}

fn invalid(what: &str, len: usize) -> Error {
    Error::Store {
        message: format!("a global rule's {what} answered {len} values, not what was asked"),
        transient: false,
    }
}
