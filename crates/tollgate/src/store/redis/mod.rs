//! The Redis store, on one server or a Redis Cluster: strict limiting shared by every instance.
//!
//! Each check is one call of its algorithm's function (`FCALL`; the library is loaded when a
//! server lacks it, and servers without functions get the same code by `EVALSHA`): one round
//! trip, atomic, all tiers at once. Concurrent checks are pipelined on a few shared
//! connections. Every key written expires when its state becomes equivalent to a key never
//! seen.
//!
//! Key names: `tg:<rule>:<fingerprint>:<key length>:{k<key>}` (and `:<tier>` for the sliding
//! log's one sorted set per tier). The braces make the key's bytes the hash tag, so all keys of
//! one check live in one cluster slot. The fingerprint changes with the rule's definition, so a
//! changed rule starts from fresh state rather than misreading the old one.

mod script;

use std::fmt;
use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use redis::RedisError;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;

use self::script::Entry;
use crate::algorithm::Decide;
use crate::decision::{Decision, Source, Verdict};
use crate::error::Error;
use crate::rule::Rule;

/// Connections to one Redis server or one Redis Cluster. Cheap to clone: clones share the
/// connections, and every limiter built on them pipelines its checks there.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    /// Set once the server turned out to have no functions: checks run as scripts.
    scripts_only: Arc<AtomicBool>,
}

#[derive(Clone)]
enum Connection {
    Single(Arc<Pool>),
    Cluster(ClusterConnection),
}

/// Multiplexed connections to one server (one unless configured), taken in turn; concurrent
/// checks are pipelined on each. Each connects on first use and reconnects by itself.
struct Pool {
    client: redis::Client,
    managers: Vec<ConnectionManager>,
    next: AtomicUsize,
}

impl Pool {
    fn new(client: &redis::Client, connections: usize) -> Result<Self, RedisError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECTION_TIMEOUT))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(2))
            .set_number_of_retries(2);
        let managers = (0..connections.max(1))
            .map(|_| ConnectionManager::new_lazy_with_config(client.clone(), config.clone()))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            client: client.clone(),
            managers,
            next: AtomicUsize::new(0),
        })
    }

    fn pick(&self) -> ConnectionManager {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.managers.len();
        self.managers[i].clone()
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.connection {
            Connection::Single(_) => "single",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore").field("kind", &kind).finish()
    }
}

/// Added to every TTL when scripts decide at the caller's time (see [`RedisStore::check`]).
const CALLER_TIME_TTL_PADDING_MS: u64 = 60_000;

/// Pipelined connections to one server: one, whose batches of checks Redis decides with the
/// fewest reads and writes; more split the batches (measured in BENCHMARKS.md).
const DEFAULT_CONNECTIONS: usize = 1;

/// How long establishing a connection may take before it counts as a failure.
const CONNECTION_TIMEOUT: Duration = Duration::from_millis(500);

impl RedisStore {
    /// Opens a store on one server: `redis://[user:password@]host[:port][/db]`, or
    /// `rediss://...` for TLS verified against the system's roots. Connects on first use and
    /// reconnects by itself, so a process may start while Redis is down.
    ///
    /// Must be called within a Tokio runtime.
    ///
    /// # Errors
    /// [`Error::Store`] for a malformed URL.
    pub fn open(url: &str) -> Result<Self, Error> {
        install_tls_provider();
        Self::single(redis::Client::open(url).map_err(store_error)?)
    }

    /// Opens a store on one server over TLS, verifying the server against `root_ca_pem` (a PEM
    /// CA certificate) instead of the system's roots.
    ///
    /// # Errors
    /// [`Error::Store`] for a malformed URL or certificate.
    pub fn open_tls(url: &str, root_ca_pem: Vec<u8>) -> Result<Self, Error> {
        install_tls_provider();
        let certificates = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root_ca_pem),
        };
        Self::single(redis::Client::build_with_tls(url, certificates).map_err(store_error)?)
    }

    fn new(connection: Connection) -> Self {
        Self {
            connection,
            scripts_only: Arc::new(AtomicBool::new(false)),
        }
    }

    fn single(client: redis::Client) -> Result<Self, Error> {
        let pool = Pool::new(&client, DEFAULT_CONNECTIONS).map_err(store_error)?;
        Ok(Self::new(Connection::Single(Arc::new(pool))))
    }

    /// The same store with `connections` pipelined connections to its server (default 1;
    /// at least 1), for a process whose checks outrun one. A cluster keeps one connection
    /// per node whatever this says.
    ///
    /// # Errors
    /// [`Error::Store`] if the connections cannot be configured.
    pub fn with_connections(self, connections: usize) -> Result<Self, Error> {
        match self.connection {
            Connection::Single(pool) => {
                let pool = Pool::new(&pool.client, connections).map_err(store_error)?;
                Ok(Self {
                    connection: Connection::Single(Arc::new(pool)),
                    scripts_only: self.scripts_only,
                })
            }
            Connection::Cluster(_) => Ok(self),
        }
    }

    /// Connects to a Redis Cluster through any of its `nodes` (`redis://host:port` URLs);
    /// `MOVED` and `ASK` redirections are followed.
    ///
    /// # Errors
    /// [`Error::Store`] when no node can be reached or the URLs are malformed.
    pub async fn open_cluster(nodes: &[&str]) -> Result<Self, Error> {
        install_tls_provider();
        let client = ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(CONNECTION_TIMEOUT)
            .response_timeout(Duration::from_secs(2))
            .retries(2)
            .build()
            .map_err(store_error)?;
        let connection = client.get_async_connection().await.map_err(store_error)?;
        Ok(Self::new(Connection::Cluster(connection)))
    }

    /// Checks that the store answers.
    ///
    /// # Errors
    /// [`Error::Store`] saying why not.
    pub async fn ping(&self) -> Result<(), Error> {
        let pong = self.query::<String>(&redis::cmd("PING")).await;
        pong.map(drop).map_err(store_error)
    }

    /// Decides a check of `cost` for `key` in one round trip. `now` is the caller's time, or
    /// `None` for the server's `TIME`. With the caller's time, keys live a minute longer than
    /// its clock says (the server expires them by its own clock, which need not agree).
    ///
    /// Calls the algorithm's function; a server that lacks the library gets it loaded and the
    /// call repeated, and one without functions (before Redis 7) gets the same code as a
    /// script, from then on.
    pub(crate) async fn check(
        &self,
        plan: &Plan,
        key: &[u8],
        now: Option<u64>,
        cost: u64,
        max_delay: Option<u64>,
    ) -> Result<Decision, RedisError> {
        let ttl_padding = if now.is_some() {
            CALLER_TIME_TTL_PADDING_MS
        } else {
            0
        };
        let header = packed([
            now.map_or(-1.0, |t| t as f64),
            cost as f64,
            max_delay.map_or(-1.0, |d| d as f64),
            ttl_padding as f64,
        ]);
        let keys = plan.keys(key);
        let reply = if self.scripts_only.load(Ordering::Relaxed) {
            self.script(plan, &keys, &header).await?
        } else {
            let mut call = redis::cmd("FCALL");
            call.arg(&plan.entry.function).arg(keys.len()).arg(&keys);
            call.arg(&header[..]).arg(&plan.tier_args[..]);
            match self.query(&call).await {
                Err(err) if function_not_found(&err) => {
                    self.load_library(plan, &keys, &header, &call).await?
                }
                Err(err) if functions_refused(&err) => {
                    self.to_scripts(err, plan, &keys, &header).await?
                }
                reply => reply?,
            }
        };
        if reply.len() != 6 * 8 * plan.tiers {
            return Err(RedisError::from((
                redis::ErrorKind::Parse,
                "reply of unexpected length",
            )));
        }
        let verdict = |i: usize| {
            let field = |j: usize| {
                let at = 8 * (6 * i + j);
                f64::from_le_bytes(reply[at..at + 8].try_into().unwrap()) as u64
            };
            Verdict::from_reply([0, 1, 2, 3, 4, 5].map(field))
        };
        Ok(Decision::merge(plan.tiers, verdict).with_source(Source::Redis))
    }

    /// Loads the library and repeats `call`; or, when the server cannot load it, decides by
    /// script.
    async fn load_library(
        &self,
        plan: &Plan,
        keys: &[Vec<u8>],
        header: &[u8],
        call: &redis::Cmd,
    ) -> Result<Vec<u8>, RedisError> {
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg("REPLACE").arg(&script::LIBRARY.code);
        match self.query::<()>(&load).await {
            Ok(()) => self.query(call).await,
            // ERR: no FUNCTION command, or a server that cannot run the library; NOPERM: a
            // user allowed scripts but not functions. Busy, loading or failing servers pass.
            Err(err) if matches!(err.code(), Some("ERR" | "NOPERM")) => {
                self.to_scripts(err, plan, keys, header).await
            }
            Err(err) => Err(err),
        }
    }

    /// Switches to scripts for good, because of `err`, and decides by script.
    async fn to_scripts(
        &self,
        err: RedisError,
        plan: &Plan,
        keys: &[Vec<u8>],
        header: &[u8],
    ) -> Result<Vec<u8>, RedisError> {
        if !self.scripts_only.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %err, "redis cannot run functions; checks run as scripts");
        }
        self.script(plan, keys, header).await
    }

    /// Decides by `EVALSHA` (loading the script on `NOSCRIPT`).
    async fn script(
        &self,
        plan: &Plan,
        keys: &[Vec<u8>],
        header: &[u8],
    ) -> Result<Vec<u8>, RedisError> {
        let mut invocation = plan.entry.script.prepare_invoke();
        for name in keys {
            invocation.key(name);
        }
        invocation.arg(header).arg(&plan.tier_args[..]);
        match &self.connection {
            Connection::Single(pool) => invocation.invoke_async(&mut pool.pick()).await,
            Connection::Cluster(c) => invocation.invoke_async(&mut c.clone()).await,
        }
    }

    async fn query<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> Result<T, RedisError> {
        match &self.connection {
            Connection::Single(pool) => command.query_async(&mut pool.pick()).await,
            Connection::Cluster(c) => command.query_async(&mut c.clone()).await,
        }
    }
}

/// Whether `err` says the called function is not on the server (a new or restarted one).
fn function_not_found(err: &RedisError) -> bool {
    err.code() == Some("ERR")
        && err
            .detail()
            .is_some_and(|d| d.to_ascii_lowercase().contains("function not found"))
}

/// Whether `err` says functions cannot be called here: no `FCALL` (before Redis 7, or
/// renamed away), or a user not allowed it.
fn functions_refused(err: &RedisError) -> bool {
    match err.code() {
        Some("NOPERM") => true,
        Some("ERR") => err
            .detail()
            .is_some_and(|d| d.to_ascii_lowercase().contains("unknown command")),
        _ => false,
    }
}

/// Everything about a rule that its checks send: the script, key names and tier arguments,
/// prepared once.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    entry: &'static Entry,
    /// `tg:<rule>:<fingerprint>:`
    prefix: Vec<u8>,
    tiers: usize,
    /// ARGV[2]: eleven little-endian doubles per tier.
    tier_args: Vec<u8>,
}

impl Plan {
    pub(crate) fn new(rule: &Rule) -> Self {
        let algorithm = rule.algorithm();
        let entry = script::entry(algorithm);
        let mut tier_args = Vec::with_capacity(88 * rule.tiers().len());
        for (i, tier) in rule.tiers().iter().enumerate() {
            let rate = tier.rate();
            let words = rule.tier_words(i).len() as u64;
            // Every integer is below 2^53, so the doubles carry it exactly.
            let integers = [
                tier.limit(),
                tier.period_micros(),
                tier.burst(),
                rate.per_permit,
                rate.per_micro,
                words,
            ];
            tier_args.extend(packed(integers.map(|n| n as f64)));
            tier_args.extend(packed(algorithm.script_parameters(tier)));
        }
        Self {
            entry,
            prefix: format!("tg:{}:{:08x}:", rule.name(), rule.fingerprint()).into_bytes(),
            tiers: rule.tiers().len(),
            tier_args,
        }
    }

    /// The Redis keys holding `key`'s state, all with the same hash tag.
    pub(crate) fn keys(&self, key: &[u8]) -> Vec<Vec<u8>> {
        let mut base = Vec::with_capacity(self.prefix.len() + key.len() + 32);
        base.extend_from_slice(&self.prefix);
        // Writing to a Vec cannot fail.
        let _ = write!(base, "{}:{{k", key.len());
        base.extend_from_slice(key);
        base.push(b'}');
        if !self.entry.key_per_tier {
            return vec![base];
        }
        (0..self.tiers)
            .map(|i| {
                let mut name = base.clone();
                let _ = write!(name, ":{i}");
                name
            })
            .collect()
    }
}

/// Doubles as the scripts unpack them: little-endian, eight bytes each.
fn packed<const N: usize>(values: [f64; N]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A store error, saying whether retrying may help.
pub(crate) fn store_error(err: RedisError) -> Error {
    let transient = err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_io_error()
        || err.is_cluster_error();
    Error::Store {
        message: err.to_string(),
        transient,
    }
}

fn install_tls_provider() {
    // Only the first call installs; later ones find it there.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::rule::Tier;

    /// Redis Cluster's slot of a key name: CRC16 (XMODEM) of its hash tag, modulo 16384.
    fn slot(name: &[u8]) -> u16 {
        let tag = name
            .iter()
            .position(|&b| b == b'{')
            .and_then(|open| {
                let rest = &name[open + 1..];
                let close = rest.iter().position(|&b| b == b'}')?;
                (close > 0).then(|| &rest[..close])
            })
            .unwrap_or(name);
        let mut crc: u16 = 0;
        for &byte in tag {
            crc ^= u16::from(byte) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc % 16_384
    }

    #[test]
    fn slots_are_computed_as_redis_does() {
        // Known values from the Redis Cluster specification and redis-cli CLUSTER KEYSLOT.
        assert_eq!(slot(b"123456789"), 0x31c3);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo"), 12_182);
    }

    #[test]
    fn every_key_of_a_check_shares_one_hash_tag() {
        let rule = Rule::new(
            "api",
            Algorithm::SlidingLog,
            [Tier::per_second(5), Tier::per_minute(50)],
        )
        .unwrap();
        let plan = Plan::new(&rule);
        for key in [&b"tenant-1"[..], b"", b"}{weird}", b"\xff\x00"] {
            let keys = plan.keys(key);
            assert_eq!(keys.len(), 2);
            let slots: Vec<u16> = keys.iter().map(|k| slot(k)).collect();
            assert_eq!(slots[0], slots[1], "{key:?}");
        }
        let name = String::from_utf8(plan.keys(b"tenant-1")[1].clone()).unwrap();
        assert_eq!(
            name,
            format!("tg:api:{:08x}:8:{{ktenant-1}}:1", rule.fingerprint())
        );
    }

    #[test]
    fn one_key_per_rule_for_word_algorithms() {
        let rule = Rule::new(
            "api",
            Algorithm::Gcra,
            [Tier::per_second(5), Tier::per_minute(9)],
        )
        .unwrap();
        assert_eq!(Plan::new(&rule).keys(b"k").len(), 1);
    }

    #[test]
    fn tier_arguments_carry_exact_doubles() {
        let rule = Rule::new(
            "api",
            Algorithm::WarmUp(crate::WarmUp::new(Duration::from_secs(2))),
            [Tier::per_second(3)],
        )
        .unwrap();
        let plan = Plan::new(&rule);
        assert_eq!(plan.tier_args.len(), 11 * 8);
        let double =
            |i: usize| f64::from_le_bytes(plan.tier_args[8 * i..8 * i + 8].try_into().unwrap());
        assert_eq!(double(0), 3.0);
        assert_eq!(double(6), 1_000_000.0 / 3.0);
    }
}
