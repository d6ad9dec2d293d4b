//! Admin rules and overrides shared by every instance on one Redis (or Redis Cluster): the
//! admin API's edits live in Redis hashes after the store's key prefix, `tg:admin:{rules}`
//! (rule id to the rule as JSON, or `null` for a deleted one) and
//! `tg:admin:{rules}:overrides` (`[rule, key]` as JSON to the override as JSON), with a
//! version, `tg:admin:{rules}:version`, that every edit increments in the same transaction.
//! Each instance reads them at start and again whenever the version moves (polled every
//! second), so an edit made through any instance reaches all of them. The allow and deny
//! lists live beside them, `tg:admin:{rules}:lists`, with a version of their own.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};

use crate::config::{ListEntry, OverrideSpec, Overrides, RedisOptions, RuleSpec};

/// The hash of rules and its version, after the store's key prefix.
const RULES: &str = "tg:admin:{rules}";
const OVERRIDES: &str = "tg:admin:{rules}:overrides";
const VERSION: &str = "tg:admin:{rules}:version";
/// The allow and deny lists (`[list, rule, key]` as JSON to the entry as JSON) and their own
/// version: bans change them often, and that need not re-read the rules.
const LISTS: &str = "tg:admin:{rules}:lists";
const LISTS_VERSION: &str = "tg:admin:{rules}:lists:version";

/// How often instances look for edits made elsewhere.
pub const POLL: Duration = Duration::from_secs(1);

/// A connection to the Redis that holds the shared rules, and the names of their keys.
#[derive(Clone)]
pub struct SharedRules {
    connection: Connection,
    rules: String,
    overrides: String,
    version: String,
    lists: String,
    lists_version: String,
    /// The console's summaries of the instances (see [`crate::console::instances`]).
    instances: String,
}

#[derive(Clone)]
enum Connection {
    /// One server.
    Single(ConnectionManager),
    /// A cluster (both keys share one slot).
    Cluster(redis::cluster_async::ClusterConnection),
}

impl std::fmt::Debug for SharedRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.connection {
            Connection::Single(_) => "single",
            Connection::Cluster(_) => "cluster",
        };
        write!(f, "SharedRules({kind}, {})", self.rules)
    }
}

/// The admin rules as Redis holds them, with their version.
pub type Overlay = BTreeMap<String, Option<RuleSpec>>;

/// What the admin API keeps, as read together: the version, the rules, the overrides.
#[derive(Debug, Default)]
pub struct Shared {
    /// The version of what was read (0: nothing ever written).
    pub version: u64,
    /// The admin rules.
    pub overlay: Overlay,
    /// The overrides.
    pub overrides: Overrides,
}

impl SharedRules {
    /// Connects (lazily, for one server) to the Redis of `url`, or of the cluster `nodes`,
    /// with the store's TLS certificates and key prefix.
    ///
    /// # Errors
    /// A malformed URL, a certificate that cannot be read, or a cluster none of whose nodes
    /// answers.
    pub async fn open(
        url: Option<&str>,
        nodes: &[String],
        options: &RedisOptions,
    ) -> anyhow::Result<Self> {
        let certificates = options.certificates().map_err(anyhow::Error::msg)?;
        let connection = match url {
            Some(url) => {
                let client = match &certificates {
                    Some(certificates) => redis::Client::build_with_tls(url, certificates.clone())?,
                    None => redis::Client::open(url)?,
                };
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(2)))
                    .set_response_timeout(Some(Duration::from_secs(2)))
                    .set_number_of_retries(1);
                Connection::Single(ConnectionManager::new_lazy_with_config(client, config)?)
            }
            None => {
                let mut builder = redis::cluster::ClusterClientBuilder::new(nodes.to_vec())
                    .connection_timeout(Duration::from_secs(2))
                    .response_timeout(Duration::from_secs(2));
                if let Some(certificates) = certificates {
                    builder = builder.certs(certificates);
                }
                Connection::Cluster(builder.build()?.get_async_connection().await?)
            }
        };
        Ok(Self {
            connection,
            rules: format!("{}{RULES}", options.key_prefix),
            overrides: format!("{}{OVERRIDES}", options.key_prefix),
            version: format!("{}{VERSION}", options.key_prefix),
            lists: format!("{}{LISTS}", options.key_prefix),
            lists_version: format!("{}{LISTS_VERSION}", options.key_prefix),
            instances: format!("{}tg:console:{{instances}}", options.key_prefix),
        })
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        match self.connection.clone() {
            Connection::Single(mut c) => cmd.query_async(&mut c).await,
            Connection::Cluster(mut c) => cmd.query_async(&mut c).await,
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
        match self.connection.clone() {
            Connection::Single(c) => run(c, pipe).await,
            Connection::Cluster(c) => run(c, pipe).await,
        }
    }

    /// The version of the shared rules (0: none ever written).
    ///
    /// # Errors
    /// Redis did not answer.
    pub async fn version(&self) -> redis::RedisResult<u64> {
        let version: Option<u64> = self.query(redis::cmd("GET").arg(&self.version)).await?;
        Ok(version.unwrap_or(0))
    }

    /// The shared rules and overrides and their version, read together.
    ///
    /// # Errors
    /// Redis did not answer, or holds a rule or an override that is not valid JSON of one.
    pub async fn read(&self) -> anyhow::Result<Shared> {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("GET")
            .arg(&self.version)
            .cmd("HGETALL")
            .arg(&self.rules)
            .cmd("HGETALL")
            .arg(&self.overrides);
        type Read = (
            Option<u64>,
            BTreeMap<String, String>,
            BTreeMap<String, String>,
        );
        let (version, entries, kept): Read = self.pipe(&pipe).await?;
        let mut overlay = Overlay::new();
        for (id, json) in entries {
            let spec: Option<RuleSpec> = serde_json::from_str(&json)
                .map_err(|e| anyhow::anyhow!("shared rule `{id}` in {}: {e}", self.rules))?;
            overlay.insert(id, spec);
        }
        let mut overrides = Overrides::new();
        for (name, json) in kept {
            let bad = |e: serde_json::Error| {
                anyhow::anyhow!("override {name} in {}: {e}", self.overrides)
            };
            let (rule, key): (String, String) = serde_json::from_str(&name).map_err(bad)?;
            let spec: OverrideSpec = serde_json::from_str(&json).map_err(bad)?;
            overrides.insert((rule, key), spec);
        }
        Ok(Shared {
            version: version.unwrap_or(0),
            overlay,
            overrides,
        })
    }

    /// Writes `spec` (or a deletion) for `rule`'s `key` and moves the version, in one
    /// transaction.
    ///
    /// # Errors
    /// Redis did not answer; nothing was written then.
    pub async fn write_override(
        &self,
        rule: &str,
        key: &str,
        spec: Option<&OverrideSpec>,
    ) -> anyhow::Result<u64> {
        let name = serde_json::to_string(&(rule, key))?;
        let mut pipe = redis::pipe();
        pipe.atomic();
        match spec {
            Some(spec) => pipe
                .cmd("HSET")
                .arg(&self.overrides)
                .arg(name)
                .arg(serde_json::to_string(spec)?)
                .ignore(),
            None => pipe.cmd("HDEL").arg(&self.overrides).arg(name).ignore(),
        };
        pipe.cmd("INCR").arg(&self.version);
        let (version,): (u64,) = self.pipe(&pipe).await?;
        Ok(version)
    }

    /// The version of the shared lists (0: none ever written).
    ///
    /// # Errors
    /// Redis did not answer.
    pub async fn lists_version(&self) -> redis::RedisResult<u64> {
        let version: Option<u64> = self
            .query(redis::cmd("GET").arg(&self.lists_version))
            .await?;
        Ok(version.unwrap_or(0))
    }

    /// The shared list entries and their version, read together; entries that do not read as
    /// one are skipped (and logged).
    ///
    /// # Errors
    /// Redis did not answer.
    pub async fn read_lists(&self) -> anyhow::Result<(u64, Vec<ListEntry>)> {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("GET")
            .arg(&self.lists_version)
            .cmd("HGETALL")
            .arg(&self.lists);
        let (version, kept): (Option<u64>, BTreeMap<String, String>) = self.pipe(&pipe).await?;
        let mut entries = Vec::with_capacity(kept.len());
        for (name, json) in kept {
            match serde_json::from_str(&json) {
                Ok(entry) => entries.push(entry),
                Err(e) => {
                    tracing::warn!(entry = name, error = %e, "a list entry in Redis is not one")
                }
            }
        }
        Ok((version.unwrap_or(0), entries))
    }

    /// Writes `entries` (`Some`) or deletes them (the entry's list, rule and key, `None`),
    /// and moves the lists' version, in one transaction.
    ///
    /// # Errors
    /// Redis did not answer; nothing was written then.
    pub async fn write_lists(&self, entries: &[(&ListEntry, bool)]) -> anyhow::Result<u64> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (entry, keep) in entries {
            let name = serde_json::to_string(&(entry.list, &entry.rule, &entry.key))?;
            if *keep {
                pipe.cmd("HSET")
                    .arg(&self.lists)
                    .arg(name)
                    .arg(serde_json::to_string(entry)?)
                    .ignore();
            } else {
                pipe.cmd("HDEL").arg(&self.lists).arg(name).ignore();
            }
        }
        pipe.cmd("INCR").arg(&self.lists_version);
        let (version,): (u64,) = self.pipe(&pipe).await?;
        Ok(version)
    }

    /// Publishes the summary (JSON) of the instance `id`; the hash lives a minute past the
    /// last instance that publishes.
    ///
    /// # Errors
    /// Redis did not answer.
    pub async fn publish_instance(&self, id: &str, summary: &str) -> anyhow::Result<()> {
        let mut pipe = redis::pipe();
        pipe.cmd("HSET")
            .arg(&self.instances)
            .arg(id)
            .arg(summary)
            .ignore()
            .cmd("PEXPIRE")
            .arg(&self.instances)
            .arg(60_000)
            .ignore();
        self.pipe::<()>(&pipe).await?;
        Ok(())
    }

    /// Every instance's summary, by name.
    ///
    /// # Errors
    /// Redis did not answer.
    pub async fn instances(&self) -> anyhow::Result<BTreeMap<String, String>> {
        Ok(self
            .query(redis::cmd("HGETALL").arg(&self.instances))
            .await?)
    }

    /// Removes the summary of an instance gone.
    ///
    /// # Errors
    /// Redis did not answer.
    pub async fn forget_instance(&self, id: &str) -> anyhow::Result<()> {
        self.query::<()>(redis::cmd("HDEL").arg(&self.instances).arg(id))
            .await?;
        Ok(())
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
            .arg(&self.rules)
            .arg(id)
            .arg(json)
            .ignore()
            .cmd("INCR")
            .arg(&self.version);
        let (version,): (u64,) = self.pipe(&pipe).await?;
        Ok(version)
    }
}
