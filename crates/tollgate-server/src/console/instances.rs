//! Instances on one Redis publish a summary there every [`PUBLISH`] (their name, version,
//! when they started and were last seen, their rate, and each rule's decisions of the last
//! minute), in one hash (`tg:console:{instances}`, after the store's key prefix); each reads
//! the others' back, so any instance's console shows the deployment. An instance shutting down
//! takes its summary off; one that stopped otherwise is left out once its summary goes
//! unrenewed for [`STALE`], and removed.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Console;
use super::series::Counts;
use crate::shared::SharedRules;

/// How often an instance publishes its summary.
pub const PUBLISH: Duration = Duration::from_secs(2);

/// How long a summary counts once its instance stops renewing it.
pub const STALE: Duration = Duration::from_secs(15);

/// What an instance publishes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Its name.
    pub id: String,
    /// tollgate's version.
    pub version: String,
    /// When it started (seconds since the epoch).
    pub started: u64,
    /// When it published this (seconds since the epoch).
    pub seen: u64,
    /// Decisions per second, over the last 10 s.
    pub rate: f64,
    /// Each rule's decisions of the last 60 s.
    pub rules: Vec<(String, Counts)>,
}

/// A name for this instance: the host's name and a random part.
pub fn new_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "tollgate".into());
    let random = super::now_micros() ^ u64::from(std::process::id()).rotate_left(32);
    format!(
        "{host}-{:06x}",
        random.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40
    )
}

/// This instance's summary now.
pub fn summary(console: &Console) -> Summary {
    let second = console.now() / 1_000_000;
    let mut rules: Vec<(String, Counts)> = console
        .recent(second)
        .into_iter()
        .map(|(name, recent)| (name.to_string(), recent.last60))
        .filter(|(_, counts)| counts.total() > 0)
        .collect();
    rules.sort_by(|a, b| a.0.cmp(&b.0));
    Summary {
        id: console.instance.clone(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        started: console.started,
        seen: second,
        rate: console.last(second, 10).total() as f64 / 10.0,
        rules,
    }
}

/// Publishes this instance's summary and reads the others', every [`PUBLISH`], for as long as
/// the console lives.
pub async fn follow(console: Arc<Console>, shared: SharedRules) {
    let weak = Arc::downgrade(&console);
    drop(console);
    let mut every = tokio::time::interval(PUBLISH);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(console) = weak.upgrade() else {
            return;
        };
        if console.retired() {
            return;
        }
        let mine = summary(&console);
        let json = serde_json::to_string(&mine).unwrap_or_default();
        if let Err(e) = shared.publish_instance(&mine.id, &json).await {
            tracing::debug!(error = %e, "cannot publish this instance's summary");
            continue;
        }
        // Retired while publishing: the shutdown's removal may have come first; remove again.
        if console.retired() {
            let _ = shared.forget_instance(&mine.id).await;
            return;
        }
        match shared.instances().await {
            Ok(all) => {
                let now = mine.seen;
                let mut peers = Vec::new();
                for (id, json) in all {
                    let summary: Option<Summary> = serde_json::from_str(&json).ok();
                    match summary {
                        Some(s) if s.seen + STALE.as_secs() >= now => {
                            if s.id != mine.id {
                                peers.push(s);
                            }
                        }
                        _ => {
                            let _ = shared.forget_instance(&id).await;
                        }
                    }
                }
                peers.sort_by(|a, b| a.id.cmp(&b.id));
                console.set_peers(peers);
            }
            Err(e) => tracing::debug!(error = %e, "cannot read the other instances' summaries"),
        }
    }
}
