//! Which node of a Redis Cluster serves each slot, each node with its own [`Backend`] (circuit
//! breaker and failure counts), so that a dead master keeps away only the checks of its own
//! slots. Read from `CLUSTER SLOTS` when the store is built and every second after, by a task
//! that ends with the store: a replica promoted in a dead master's place is a new node, with
//! a closed breaker, as soon as the cluster says so.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use redis::cluster_async::ClusterConnection;

use crate::store::guard::{Backend, GuardConfig, StoreFailures};

/// Slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16_384;

/// How often the slots are read again.
const REFRESH: Duration = Duration::from_secs(1);

/// The nodes serving the slots now.
#[derive(Debug)]
pub(crate) struct Topology {
    config: GuardConfig,
    map: RwLock<Map>,
    /// Failures of nodes no longer serving any slot, so that totals never go back.
    retired_errors: AtomicU64,
    retired_timeouts: AtomicU64,
}

#[derive(Debug, Default)]
struct Map {
    /// Per slot, the index of its node in `nodes`; `u16::MAX` when no node is known.
    slots: Vec<u16>,
    nodes: Vec<Arc<Backend>>,
}

/// A node's health, as metrics and readiness report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHealth {
    /// `host:port`.
    pub address: String,
    /// Slots it serves.
    pub slots: usize,
    /// Whether its breaker keeps checks away now.
    pub failing: bool,
    /// Its calls that failed so far.
    pub failures: StoreFailures,
}

impl Topology {
    pub(crate) fn new(config: GuardConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
            map: RwLock::new(Map {
                slots: vec![u16::MAX; SLOTS],
                nodes: Vec::new(),
            }),
            retired_errors: AtomicU64::new(0),
            retired_timeouts: AtomicU64::new(0),
        })
    }

    /// The node serving `slot`, if known.
    pub(crate) fn node(&self, slot: u16) -> Option<Arc<Backend>> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let index = *map.slots.get(usize::from(slot))?;
        map.nodes.get(usize::from(index)).cloned()
    }

    /// Each node's health, in address order.
    pub(crate) fn health(&self) -> Vec<NodeHealth> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let mut served = vec![0usize; map.nodes.len()];
        for &index in &map.slots {
            if let Some(count) = served.get_mut(usize::from(index)) {
                *count += 1;
            }
        }
        let mut nodes: Vec<NodeHealth> = map
            .nodes
            .iter()
            .zip(served)
            .map(|(node, slots)| NodeHealth {
                address: node.name().to_string(),
                slots,
                failing: node.failing(),
                failures: node.failures(),
            })
            .collect();
        nodes.sort_by(|a, b| a.address.cmp(&b.address));
        nodes
    }

    /// The failures of every node so far, those no longer serving included.
    pub(crate) fn failures(&self) -> StoreFailures {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let retired = StoreFailures {
            errors: self.retired_errors.load(Ordering::Relaxed),
            timeouts: self.retired_timeouts.load(Ordering::Relaxed),
        };
        map.nodes
            .iter()
            .map(|n| n.failures())
            .fold(retired, |a, b| a + b)
    }

    /// Serves the slots of `ranges` (start, end, node address), keeping the backends of the
    /// nodes it knew.
    fn update(&self, ranges: &[(u16, u16, String)]) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let mut known: HashMap<String, Arc<Backend>> = map
            .nodes
            .drain(..)
            .map(|n| (n.name().to_string(), n))
            .collect();
        let mut slots = vec![u16::MAX; SLOTS];
        let mut nodes: Vec<Arc<Backend>> = Vec::new();
        let mut index: HashMap<&str, u16> = HashMap::new();
        for (start, end, address) in ranges {
            let i = *index.entry(address).or_insert_with(|| {
                let node = known
                    .remove(address.as_str())
                    .unwrap_or_else(|| Arc::new(Backend::new(address.clone(), &self.config)));
                nodes.push(node);
                (nodes.len() - 1) as u16
            });
            for slot in *start..=(*end).min((SLOTS - 1) as u16) {
                slots[usize::from(slot)] = i;
            }
        }
        for (_, gone) in known {
            let failures = gone.failures();
            self.retired_errors
                .fetch_add(failures.errors, Ordering::Relaxed);
            self.retired_timeouts
                .fetch_add(failures.timeouts, Ordering::Relaxed);
        }
        *map = Map { slots, nodes };
    }

    /// Reads the slots from the cluster once.
    pub(crate) async fn refresh(&self, connection: &ClusterConnection) -> redis::RedisResult<()> {
        let reply: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut connection.clone())
            .await?;
        self.update(&ranges(&reply));
        Ok(())
    }

    /// Reads the slots every second, for as long as the store that holds `topology` lives.
    pub(crate) fn follow(topology: &Arc<Self>, connection: ClusterConnection) {
        let weak: Weak<Self> = Arc::downgrade(topology);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(REFRESH);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let Some(topology) = weak.upgrade() else {
                    return;
                };
                let read = tokio::time::timeout(REFRESH, topology.refresh(&connection)).await;
                if let Ok(Err(e)) = read {
                    tracing::debug!(error = %e, "cannot read the cluster's slots");
                }
            }
        });
    }
}

/// The (start, end, master address) of each range of a `CLUSTER SLOTS` reply; what cannot be
/// read is left out.
fn ranges(reply: &redis::Value) -> Vec<(u16, u16, String)> {
    let redis::Value::Array(entries) = reply else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|entry| {
            let redis::Value::Array(parts) = entry else {
                return None;
            };
            let number = |v: &redis::Value| match v {
                redis::Value::Int(n) => u16::try_from(*n).ok(),
                _ => None,
            };
            let (start, end) = (number(parts.first()?)?, number(parts.get(1)?)?);
            let redis::Value::Array(master) = parts.get(2)? else {
                return None;
            };
            let host = match master.first()? {
                redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                redis::Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            let port = match master.get(1)? {
                redis::Value::Int(p) => *p,
                _ => return None,
            };
            Some((start, end, format!("{host}:{port}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_keeps_its_backend_across_updates_and_a_new_one_starts_afresh() {
        let topology = Topology::new(GuardConfig::default());
        topology.update(&[
            (0, 8_191, "10.0.0.1:7000".into()),
            (8_192, 16_383, "10.0.0.2:7000".into()),
        ]);
        let first = topology.node(100).unwrap();
        assert_eq!(first.name(), "10.0.0.1:7000");
        assert_eq!(topology.node(9_000).unwrap().name(), "10.0.0.2:7000");
        // The second master dies; its replica takes its slots.
        topology.update(&[
            (0, 8_191, "10.0.0.1:7000".into()),
            (8_192, 16_383, "10.0.0.3:7000".into()),
        ]);
        assert!(Arc::ptr_eq(&first, &topology.node(100).unwrap()));
        assert_eq!(topology.node(9_000).unwrap().name(), "10.0.0.3:7000");
        let health = topology.health();
        assert_eq!(
            health.iter().map(|h| h.slots).collect::<Vec<_>>(),
            [8_192, 8_192]
        );
    }
}
