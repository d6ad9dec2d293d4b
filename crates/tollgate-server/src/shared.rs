//! Admin rules shared by every instance on one Redis (or Redis Cluster): the admin API's edits
//! live in a Redis hash, `tg:admin:{rules}` (rule id to the rule as JSON, or `null` for a
//! deleted one), with a version, `tg:admin:{rules}:version`, that every edit increments in
//! the same transaction. Each instance reads the hash at start and again whenever the version
//! moves (polled every second), so an edit made through any instance reaches all of them.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};

use crate::config::RuleSpec;

const RULES: &str = "tg:admin:{rules}";
const VERSION: &str = "tg:admin:{rules}:version";

/// How often instances look for edits made elsewhere.
pub const POLL: Duration = Duration::from_secs(1);

/// A connection to the Redis that holds the shared rules.
#[derive(Clone)]
pub enum SharedRules {
    /// One server.
    Single(ConnectionManager),
    /// A cluster (both keys share one slot).
    Cluster(redis::cluster_async::ClusterConnection),
}

impl std::fmt::Debug for SharedRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Single(_) => "SharedRules(single)",
            Self::Cluster(_) => "SharedRules(cluster)",
        })
    }
}

/// The admin rules as Redis holds them, with their version.
pub type Overlay = BTreeMap<String, Option<RuleSpec>>;

impl SharedRules {
    /// Connects (lazily, for one server) to the Redis of `url`, or of the cluster `nodes`.
    ///
    /// # Errors
    /// A malformed URL, or a cluster none of whose nodes answers.
    pub async fn open(url: Option<&str>, nodes: &[String]) -> anyhow::Result<Self> {
        Ok(match url {
            Some(url) => {
                let client = redis::Client::open(url)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(2)))
                    .set_response_timeout(Some(Duration::from_secs(2)))
                    .set_number_of_retries(1);
                Self::Single(ConnectionManager::new_lazy_with_config(client, config)?)
            }
            None => {
                let client = redis::cluster::ClusterClientBuilder::new(nodes.to_vec())
                    .connection_timeout(Duration::from_secs(2))
                    .response_timeout(Duration::from_secs(2))
                    .build()?;
                Self::Cluster(client.get_async_connection().await?)
            }
        })
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        match self.clone() {
            Self::Single(mut c) => cmd.query_async(&mut c).await,
            Self::Cluster(mut c) => cmd.query_async(&mut c).await,
        }
    }

    async fn pipe<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> redis::RedisResult<T> {
        async fn run<C: ConnectionLike, T: redis::FromRedisValue>(
            mut c: C,
            pipe: &redis::Pipeline,
        ) -> redis::RedisResult<T> {
            pipe.query_async(&mut c).await
        }
        match self.clone() {
            Self::Single(c) => run(c, pipe).await,
            Self::Cluster(c) => run(c, pipe).await,
        }
    }

    /// The version of the shared rules (0: none ever written).
    ///
    /// # Errors
    /// Redis did not answer.
    pub async fn version(&self) -> redis::RedisResult<u64> {
        let version: Option<u64> = self.query(redis::cmd("GET").arg(VERSION)).await?;
        Ok(version.unwrap_or(0))
    }

    /// The shared rules and their version, read together.
    ///
    /// # Errors
    /// Redis did not answer, or holds a rule that is not valid JSON of a rule.
    pub async fn read(&self) -> anyhow::Result<(u64, Overlay)> {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("GET")
            .arg(VERSION)
            .cmd("HGETALL")
            .arg(RULES);
        let (version, entries): (Option<u64>, BTreeMap<String, String>) = self.pipe(&pipe).await?;
        let mut overlay = Overlay::new();
        for (id, json) in entries {
            let spec: Option<RuleSpec> = serde_json::from_str(&json)
                .map_err(|e| anyhow::anyhow!("shared rule `{id}` in {RULES}: {e}"))?;
            overlay.insert(id, spec);
        }
        Ok((version.unwrap_or(0), overlay))
    }

    /// Writes `spec` (or a deletion) for `id` and moves the version, in one transaction.
    ///
    /// # Errors
    /// Redis did not answer; nothing was written then.
    pub async fn write(&self, id: &str, spec: Option<&RuleSpec>) -> anyhow::Result<u64> {
        let json = serde_json::to_string(&spec)?;
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HSET")
            .arg(RULES)
            .arg(id)
            .arg(json)
            .ignore()
            .cmd("INCR")
            .arg(VERSION);
        let (version,): (u64,) = self.pipe(&pipe).await?;
        Ok(version)
    }
}
