//! The Redis store, on one server or a Redis Cluster: strict limiting shared by every instance.
//!
//! Needs Redis 6.2 or later. Each check of one key is one call of its algorithm's function
//! (`FCALL`; the library is loaded when a server lacks it, and servers without functions get
//! the same code by `EVALSHA`): one round trip, atomic, all tiers at once. A batch of several
//! keys is one call of the batch function, all-or-nothing across them. Concurrent checks are
//! pipelined on a shared connection, and those ready in the same pass of the scheduler are
//! written to it together (one server; a cluster's connections pipeline as they come). Every
//! key written expires when its state becomes equivalent to a key never seen, rounded up to the
//! next whole second (writes within that second keep the TTL, which costs Redis less than
//! setting one; the sliding log's sets expire exactly).
//!
//! On a Redis Cluster, keys of different slots cannot meet in one call: a batch whose keys
//! span slots takes from every slot at once, and gives back where it took when any slot
//! denies ([`across`]), so no limit is exceeded. Each master has its own circuit breaker
//! ([`topology`]), so a dead master keeps away only the checks of its slots.
//!
//! Key names: `tg:<rule>:<fingerprint>:<key length>:{k<key>}` (and `:<tier>` for the sliding
//! log's one sorted set per tier). The braces make the key's bytes the hash tag, so all keys of
//! one check live in one cluster slot. The fingerprint changes with the rule's definition, so a
//! changed rule starts from fresh state rather than misreading the old one.

mod across;
mod module;
mod script;
mod topology;
mod wire;

use std::borrow::Cow;
use std::fmt;
use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use redis::RedisError;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;

pub(crate) use self::module::Presence;
pub(crate) use self::script::Entry;
pub use self::topology::NodeHealth;
use self::topology::Topology;
use self::wire::{Command, Wire, within};
use super::book::ReservationRecord;
use super::guard::{
    Backend, Deadline, Failure, Guard, GuardConfig, GuardPlan, Guarded, Route, StoreFailures,
};
use super::{Planned, Settle};
use crate::algorithm::Verdict;
use crate::decision::{Decision, Decisions, Source};
use crate::error::Error;
use crate::rule::Rule;

/// Whose clock the Redis functions decide at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreTime {
    /// The Redis server's `TIME`: instances whose clocks disagree still agree on windows.
    #[default]
    Server,
    /// The limiter's own clock, sent with each check: for tests on a manual clock. Keys then
    /// live a minute longer by the server's clock than the limiter's clock says they must.
    Local,
}

/// Strict limiting shared by every instance that uses the same Redis server or Redis Cluster.
/// Exact under any concurrency: each check is one atomic call, every tier and key at once.
///
/// When Redis fails or does not answer within the timeout (20 ms by default), each rule's
/// [`FailurePolicy`](crate::FailurePolicy) decides, and [`Decision::source`] says so. After 5
/// consecutive failures a circuit breaker, one per store and its clones, stops asking Redis
/// for a cooldown (1 s), then lets one check probe it; the first answer resumes strict
/// limiting. A check that timed out may still be counted if Redis answers it later.
///
/// Cheap to clone: clones share the connections, the breaker and the fallback state.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    /// Set once the server turned out to have no functions: checks run as scripts.
    scripts_only: Arc<AtomicBool>,
    library: Arc<Library>,
    time: StoreTime,
    guard: Arc<Guard>,
    /// In front of every key the store writes (see [`RedisStoreBuilder::key_prefix`]).
    key_prefix: Arc<[u8]>,
    /// The most a key's TTL is lengthened by, in ms (see [`RedisStoreBuilder::expiry_jitter`]).
    expiry_jitter_ms: u64,
    /// Counts checks, to spread their TTLs over the jitter.
    jitter_turn: Arc<AtomicU64>,
    /// On a cluster, the node of each slot, each with its own breaker.
    topology: Option<Arc<Topology>>,
    /// The most open reservations kept.
    max_reservations: usize,
    /// The latest reservations this store kept, to commit each in one call (one server).
    remembered: Arc<super::book::Remembered>,
    /// Whether checks call tollgate's Redis module where a node has it ([`module`]).
    module: bool,
}

/// Loads of the function library, one at a time: after a restart, every check in flight finds
/// its function missing, and one load serves them all (each load blocks Redis for about a
/// millisecond).
#[derive(Default)]
struct Library {
    /// How many loads this store has made.
    loads: AtomicU64,
    loading: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
enum Connection {
    Single(Arc<Pool>),
    Cluster(ClusterConnection),
}

/// Pipelined connections to one server (one unless configured), taken in turn; concurrent
/// checks are written together on each (see [`Wire`]). Each connects on first use and again
/// after a failure.
struct Pool {
    wires: Vec<Arc<Wire>>,
    next: AtomicUsize,
}

impl Pool {
    fn new(
        info: &redis::ConnectionInfo,
        tls: Option<Arc<rustls::ClientConfig>>,
        connections: usize,
    ) -> Self {
        let wires = (0..connections.max(1))
            .map(|_| Wire::new(info.clone(), tls.clone()))
            .collect();
        Self {
            wires,
            next: AtomicUsize::new(0),
        }
    }

    fn pick(&self) -> &Arc<Wire> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.wires.len();
        &self.wires[i]
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.connection {
            Connection::Single(_) => "single",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore")
            .field("kind", &kind)
            .field("time", &self.time)
            .field("guard", &self.guard.config())
            .finish()
    }
}

/// Added to every TTL when functions decide at the caller's time (see [`StoreTime::Local`]).
const CALLER_TIME_TTL_PADDING_MS: u64 = 60_000;

/// Bytes of a call's header: six little-endian doubles (see `lua/prelude.lua`).
const HEADER: usize = 48;

/// Pipelined connections to one server: one, whose batches of checks Redis decides with the
/// fewest reads and writes; more split the batches (measured in BENCHMARKS.md).
const DEFAULT_CONNECTIONS: usize = 1;

/// How long establishing a connection may take before it counts as a failure.
const CONNECTION_TIMEOUT: Duration = Duration::from_millis(500);

/// Where a [`RedisStore`] connects and how it behaves, fixed when it is built: the store and
/// its clones then share one set of connections, one circuit breaker and one count of
/// failures, so no later call or clone can split them.
#[derive(Clone)]
pub struct RedisStoreBuilder {
    target: Target,
    root_certificate: Option<Vec<u8>>,
    client_certificate: Option<(Vec<u8>, Vec<u8>)>,
    connections: usize,
    time: StoreTime,
    guard: GuardConfig,
    key_prefix: Vec<u8>,
    expiry_jitter: Duration,
    max_reservations: usize,
    module: bool,
}

#[derive(Clone)]
enum Target {
    Server(String),
    Cluster(Vec<String>),
}

impl fmt::Debug for RedisStoreBuilder {
    // URLs may carry passwords: only their count is shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match &self.target {
            Target::Server(_) => "server".to_string(),
            Target::Cluster(nodes) => format!("cluster of {} nodes", nodes.len()),
        };
        f.debug_struct("RedisStoreBuilder")
            .field("target", &target)
            .field("root_certificate", &self.root_certificate.is_some())
            .field("client_certificate", &self.client_certificate.is_some())
            .field("connections", &self.connections)
            .field("key_prefix", &String::from_utf8_lossy(&self.key_prefix))
            .field("expiry_jitter", &self.expiry_jitter)
            .field("time", &self.time)
            .field("guard", &self.guard)
            .finish()
    }
}

impl RedisStoreBuilder {
    fn new(target: Target) -> Self {
        Self {
            target,
            root_certificate: None,
            client_certificate: None,
            connections: DEFAULT_CONNECTIONS,
            time: StoreTime::Server,
            guard: GuardConfig::default(),
            key_prefix: Vec::new(),
            expiry_jitter: Duration::ZERO,
            max_reservations: super::DEFAULT_MAX_RESERVATIONS,
            module: true,
        }
    }

    /// Whether checks call tollgate's Redis module (`TOLLGATE.CHECK`) on the nodes that load
    /// it, rather than its Lua functions (default: yes). Either decides the same on the same
    /// keys; the module costs Redis less. Nodes without it are found by asking and get the
    /// functions; see docs/operating.md.
    pub fn module(mut self, module: bool) -> Self {
        self.module = module;
        self
    }

    /// Keeps at most `max_reservations` open reservations in Redis, for every instance
    /// together (default [`DEFAULT_MAX_RESERVATIONS`](super::DEFAULT_MAX_RESERVATIONS)): a
    /// reservation beyond them is refused, and what it took given back.
    pub fn max_reservations(mut self, max_reservations: usize) -> Self {
        self.max_reservations = max_reservations;
        self
    }

    /// Pipelined connections to a single server (default 1; at least 1), for a process whose
    /// checks outrun one. A cluster keeps one connection per node whatever this says.
    pub fn connections(mut self, connections: usize) -> Self {
        self.connections = connections;
        self
    }

    /// Whose clock the functions decide at (default: the server's).
    pub fn store_time(mut self, time: StoreTime) -> Self {
        self.time = time;
        self
    }

    /// The longest a check waits for Redis before the rule's failure policy decides
    /// (default 20 ms; must be longer than zero).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.guard.timeout = timeout;
        self
    }

    /// Stops asking Redis after `failures` consecutive failures (at least 1), for `cooldown`
    /// (longer than zero), then probes it with one check (defaults: 5 and 1 s).
    pub fn circuit_breaker(mut self, failures: u32, cooldown: Duration) -> Self {
        self.guard.failures = failures;
        self.guard.cooldown = cooldown;
        self
    }

    /// How long after a server (or a cluster's node) is first asked a check may wait for
    /// its first answer, while its connection is made and the function library loaded; its
    /// failures meanwhile do not count towards its circuit breaker (default 2 s; 0: none).
    pub fn startup_allowance(mut self, allowance: Duration) -> Self {
        self.guard.startup = allowance;
        self
    }

    /// Verifies `rediss://` servers against `pem` (a PEM CA certificate) instead of the
    /// web PKI roots it carries (Mozilla's, from webpki-roots).
    pub fn root_certificate(mut self, pem: Vec<u8>) -> Self {
        self.root_certificate = Some(pem);
        self
    }

    /// Presents `cert` (a PEM certificate chain) and `key` (its PEM private key) to
    /// `rediss://` servers that ask clients for a certificate (mutual TLS).
    pub fn client_certificate(mut self, cert: Vec<u8>, key: Vec<u8>) -> Self {
        self.client_certificate = Some((cert, key));
        self
    }

    /// Bytes put in front of every key the store writes (none by default; keys start with
    /// `tg:`), so that deployments sharing one Redis keep apart. Stores with different
    /// prefixes share nothing; a cluster hashes only the braces' part, so a prefix never
    /// moves a key to another slot.
    pub fn key_prefix(mut self, prefix: impl Into<Vec<u8>>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Lengthens the TTL of the keys checks write by a spread of up to `jitter` (none by
    /// default), so that the keys of a window that many clients share do not all expire in
    /// the same instant. Decisions do not change: a key's state is read for what it says at
    /// the time of the check, however long the key outlives it.
    pub fn expiry_jitter(mut self, jitter: Duration) -> Self {
        self.expiry_jitter = jitter;
        self
    }

    /// Checks the URLs and settings without connecting: what [`build`](Self::build) would
    /// refuse before it tries to reach Redis.
    ///
    /// # Errors
    /// [`Error::Store`] naming the malformed URL or the setting out of range.
    pub fn validate(&self) -> Result<(), Error> {
        let invalid = |message: String| Error::Store {
            message,
            transient: false,
        };
        if self.guard.timeout.is_zero() {
            return Err(invalid("timeout: must be longer than zero".into()));
        }
        if self.guard.failures == 0 {
            return Err(invalid(
                "circuit breaker: failures must be at least 1".into(),
            ));
        }
        if self.guard.cooldown.is_zero() {
            return Err(invalid(
                "circuit breaker: cooldown must be longer than zero".into(),
            ));
        }
        if self.connections == 0 {
            return Err(invalid("connections: must be at least 1".into()));
        }
        if self.expiry_jitter > Duration::from_secs(86_400) {
            return Err(invalid("expiry jitter: must be at most a day".into()));
        }
        let urls = match &self.target {
            Target::Server(url) => std::slice::from_ref(url),
            Target::Cluster(nodes) if nodes.is_empty() => {
                return Err(invalid("a cluster needs at least one node".into()));
            }
            Target::Cluster(nodes) => nodes.as_slice(),
        };
        for url in urls {
            redis::Client::open(url.as_str())
                .map_err(|err| invalid(format!("{}: {err}", redacted(url))))?;
        }
        Ok(())
    }

    /// The TLS configuration of a single server's connections: the root certificate given,
    /// else the web's roots (webpki-roots), and the client certificate if given.
    fn tls_config(&self) -> Result<rustls::ClientConfig, Error> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let bad = |what: &str, err: &dyn fmt::Display| Error::Store {
            message: format!("{what}: {err}"),
            transient: false,
        };
        let mut roots = rustls::RootCertStore::empty();
        match &self.root_certificate {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|err| bad("root certificate", &err))?;
                    roots
                        .add(cert)
                        .map_err(|err| bad("root certificate", &err))?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let config = rustls::ClientConfig::builder().with_root_certificates(roots);
        match &self.client_certificate {
            None => Ok(config.with_no_client_auth()),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|err| bad("client certificate", &err))?;
                let key =
                    PrivateKeyDer::from_pem_slice(key).map_err(|err| bad("client key", &err))?;
                config
                    .with_client_auth_cert(chain, key)
                    .map_err(|err| bad("client certificate", &err))
            }
        }
    }

    /// Builds the store: a single server connects on first use and reconnects by itself (a
    /// process may start while Redis is down); a cluster connects now, through any node that
    /// answers, and follows `MOVED` and `ASK` redirections.
    ///
    /// # Errors
    /// [`Error::Store`] for what [`validate`](Self::validate) refuses, a malformed
    /// certificate, a cluster none of whose nodes answers, or when polled outside a Tokio
    /// runtime (the connections need one).
    pub async fn build(self) -> Result<RedisStore, Error> {
        self.validate()?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::Store {
                message: "a Redis store needs a Tokio runtime: build it inside one".into(),
                transient: false,
            });
        }
        install_tls_provider();
        let connection = match &self.target {
            Target::Server(url) => {
                let client = redis::Client::open(url.as_str()).map_err(store_error)?;
                let info = client.get_connection_info();
                let tls = match info.addr() {
                    redis::ConnectionAddr::TcpTls { .. } => Some(Arc::new(self.tls_config()?)),
                    _ => None,
                };
                Connection::Single(Arc::new(Pool::new(info, tls, self.connections)))
            }
            Target::Cluster(nodes) => {
                // While slots migrate, a call meets MOVED, ASK and TRYAGAIN answers in a row:
                // followed again and again, a millisecond or two apart, until the slot
                // settles or the check's timeout lets its policy decide.
                let mut builder = ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(CONNECTION_TIMEOUT)
                    .response_timeout(Duration::from_secs(2))
                    .retries(CLUSTER_RETRIES)
                    .min_retry_wait(1)
                    .max_retry_wait(10)
                    .retry_wait_formula(1, 2);
                // The Cluster client is redis-rs's, and takes the certificates as its own.
                if self.root_certificate.is_some() || self.client_certificate.is_some() {
                    builder = builder.certs(redis::TlsCertificates {
                        client_tls: self.client_certificate.as_ref().map(|(cert, key)| {
                            redis::ClientTlsConfig {
                                client_cert: cert.clone(),
                                client_key: key.clone(),
                            }
                        }),
                        root_cert: self.root_certificate.clone(),
                    });
                }
                let client = builder.build().map_err(store_error)?;
                let connection = client.get_async_connection().await.map_err(store_error)?;
                Connection::Cluster(connection)
            }
        };
        let topology = match &connection {
            Connection::Single(_) => None,
            Connection::Cluster(cluster) => {
                let topology = Topology::new(self.guard);
                if let Err(e) = topology.refresh(cluster).await {
                    tracing::warn!(error = %e, "cannot read the cluster's slots yet");
                }
                Topology::follow(&topology, cluster.clone());
                Some(topology)
            }
        };
        Ok(RedisStore {
            connection,
            scripts_only: Arc::new(AtomicBool::new(false)),
            library: Arc::new(Library::default()),
            time: self.time,
            guard: Arc::new(Guard::new(self.guard, "redis")),
            key_prefix: self.key_prefix.into(),
            expiry_jitter_ms: u64::try_from(self.expiry_jitter.as_millis()).unwrap_or(u64::MAX),
            jitter_turn: Arc::new(AtomicU64::new(0)),
            topology,
            max_reservations: self.max_reservations,
            remembered: Arc::default(),
            module: self.module,
        })
    }
}

/// What a reservation made in one call became.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Reserved {
    /// No answer: a failure policy decided.
    Unanswered,
    /// The book was full: nothing taken.
    Full,
    /// Admitted, and its record kept.
    Kept,
    /// Not admitted: nothing kept.
    Denied,
}

/// How many times a cluster call follows redirections and retries.
const CLUSTER_RETRIES: u32 = 16;

/// A URL with its password, if any, replaced by `***`, for errors and logs.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((credentials, host)) if credentials.contains(':') => {
            let user = credentials.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_string(),
    }
}

impl RedisStore {
    /// The settings of a store on one server: `redis://[user:password@]host[:port][/db]`,
    /// `rediss://...` for TLS, or `unix:///path/to/redis.sock` (also
    /// `redis+unix://...?db=N&user=U&pass=P`) for a server on this host.
    pub fn builder(url: &str) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Target::Server(url.to_string()))
    }

    /// The settings of a store on a Redis Cluster, reached through any of its `nodes`
    /// (`redis://host:port` URLs).
    pub fn cluster_builder<S: AsRef<str>>(nodes: &[S]) -> RedisStoreBuilder {
        let nodes = nodes.iter().map(|n| n.as_ref().to_string()).collect();
        RedisStoreBuilder::new(Target::Cluster(nodes))
    }

    /// A store on one server with the default settings: `RedisStore::builder(url).build()`.
    ///
    /// # Errors
    /// As [`RedisStoreBuilder::build`].
    pub async fn open(url: &str) -> Result<Self, Error> {
        Self::builder(url).build().await
    }

    /// A store on a Redis Cluster with the default settings:
    /// `RedisStore::cluster_builder(nodes).build()`.
    ///
    /// # Errors
    /// As [`RedisStoreBuilder::build`].
    pub async fn open_cluster<S: AsRef<str>>(nodes: &[S]) -> Result<Self, Error> {
        Self::cluster_builder(nodes).build().await
    }

    /// Whether a Redis store can hold `rule` (as planning it would say), without one: every
    /// algorithm, with a local share on failure that fits in memory.
    ///
    /// # Errors
    /// [`Error::Rule`] for a local share too large.
    pub fn holds(rule: &Rule) -> Result<(), Error> {
        Guard::holds(rule)
    }

    /// Whether Redis is being kept away now from some checks, decided by their rule's
    /// failure policy: on one server, every check; on a cluster, those of the slots of a node
    /// that keeps failing (see [`nodes`](Self::nodes)).
    pub fn degraded(&self) -> bool {
        self.guard.degraded() || self.nodes().iter().any(|n| n.failing)
    }

    /// Whether Redis is being kept away from every check: one server that keeps failing, or
    /// every master of a cluster (or, while no master is known for any slot, the store-wide
    /// backend every check then goes to).
    pub fn down(&self) -> bool {
        let nodes = self.nodes();
        if nodes.is_empty() {
            self.guard.degraded()
        } else {
            nodes.iter().all(|n| n.failing)
        }
    }

    /// On a cluster, each master that serves slots: its address, how many slots, whether its
    /// breaker keeps its checks away now, and its failures. Empty for one server.
    pub fn nodes(&self) -> Vec<NodeHealth> {
        self.topology
            .as_ref()
            .map(|t| t.health())
            .unwrap_or_default()
    }

    /// The calls to Redis that failed or timed out so far, by this store and its clones, and
    /// by the hybrid and lease stores built on it when they decide through Redis; on a
    /// cluster, every node's.
    pub fn failures(&self) -> StoreFailures {
        let nodes = self
            .topology
            .as_ref()
            .map(|t| t.failures())
            .unwrap_or_default();
        self.guard.failures() + nodes
    }

    /// Whose clock the functions decide at.
    pub(crate) fn time(&self) -> StoreTime {
        self.time
    }

    /// The failure handling of this store and of the hybrid and lease stores built on it.
    pub(crate) fn guard(&self) -> &Guard {
        &self.guard
    }

    /// Adds to window counters (see `lua/counters.lua`): `args` holds each key's delta and
    /// TTL; the answer's values are the counts after.
    pub(crate) async fn add(&self, keys: &[Vec<u8>], args: &[Vec<u8>]) -> Result<Answer, Error> {
        let items = CounterItem::one_key_each(keys, args);
        self.counters(&script::ADD_ENTRY, &[], &items, 1).await
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
        self.counters(&script::LEASE_ENTRY, &[id, &time], items, 2)
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
        self.counters(&script::CLAIM_ENTRY, &[id, &time], items, 5)
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
        let groups: Vec<Vec<usize>> = match &self.connection {
            Connection::Single(_) => vec![(0..items.len()).collect()],
            Connection::Cluster(_) => by_slot(items.iter().map(|i| slot(&i.keys[0]))),
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
                .invoke(entry, &names, &args)
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
        self.query::<u64>(del).await.map(drop).map_err(store_error)
    }

    /// Checks that the store answers.
    ///
    /// # Errors
    /// [`Error::Store`] saying why not.
    pub async fn ping(&self) -> Result<(), Error> {
        let pong = self.query::<String>(redis::cmd("PING")).await;
        pong.map(drop).map_err(store_error)
    }

    /// The caller's time and TTL padding as the functions read them: `None` for the server's
    /// `TIME`.
    fn header(&self, now: u64, cost: u64, max_delay: Option<u64>) -> [u8; HEADER] {
        self.header_of(now, cost, max_delay, None)
    }

    /// The header of a call, with what a settlement does (see `lua/prelude.lua`).
    fn header_of(
        &self,
        now: u64,
        cost: u64,
        max_delay: Option<u64>,
        settle: Option<Settle>,
    ) -> [u8; HEADER] {
        let (at, padding) = match self.time {
            StoreTime::Server => (-1.0, 0),
            StoreTime::Local => (now as f64, CALLER_TIME_TTL_PADDING_MS),
        };
        let padding = (padding + self.jitter()) as f64;
        let (mode, credit_at) = match settle {
            None => (0.0, 0.0),
            Some(Settle::Report) => (1.0, 0.0),
            Some(Settle::Credit { at }) => (2.0, at as f64),
            Some(Settle::Renew) => (3.0, 0.0),
        };
        let fields = [
            at,
            cost as f64,
            max_delay.map_or(-1.0, |d| d as f64),
            padding,
            mode,
            credit_at,
        ];
        let mut header = [0; HEADER];
        pack_into(&mut header, &fields);
        header
    }

    /// This check's share of the expiry jitter (ms): one of 16 steps up to the jitter, in
    /// turn, so that the functions' cache of parsed arguments stays small.
    fn jitter(&self) -> u64 {
        if self.expiry_jitter_ms == 0 {
            return 0;
        }
        let turn = self.jitter_turn.fetch_add(1, Ordering::Relaxed);
        // The steps' order scrambled (a multiplicative hash), so that neighbours differ.
        let step = (turn.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) + 1;
        self.expiry_jitter_ms * step / 16
    }

    /// The bytes in front of every key this store writes (see
    /// [`RedisStoreBuilder::key_prefix`]).
    pub fn key_prefix(&self) -> &[u8] {
        &self.key_prefix
    }

    /// `name` with the store's key prefix in front.
    pub(crate) fn key(&self, name: &[u8]) -> Vec<u8> {
        [&self.key_prefix[..], name].concat()
    }

    /// The prefix of a rule's window counters (hybrid and lease):
    /// `<key prefix>tg:c:<rule>:<fingerprint>:`.
    pub(crate) fn counter_prefix(&self, rule: &Rule) -> Vec<u8> {
        self.key(format!("tg:c:{}:{:08x}:", rule.name(), rule.fingerprint()).as_bytes())
    }

    /// The backends `items` ask: the single server's, or, on a cluster, the node of each
    /// slot their keys are on (the store-wide backend for a slot no node is known for yet),
    /// with each item's place among them.
    fn route(&self, items: &[Planned<'_, RedisPlan>]) -> (Route<'_>, Vec<usize>) {
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
    async fn remote(
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
        // Boxed: inline, it would make the future of every check larger.
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
        let groups = match &self.connection {
            Connection::Single(_) => vec![(0..items.len()).collect()],
            Connection::Cluster(_) => slot_groups(items),
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

    /// The name of the reservations' index (`None`) or of reservation `id`'s record: one hash
    /// tag for all, so that each call about them is atomic, on a cluster too.
    fn book_key(&self, id: Option<&str>) -> Vec<u8> {
        match id {
            None => self.key(b"tg:r:{reservations}"),
            Some(id) => self.key(format!("tg:r:{{reservations}}:{id}").as_bytes()),
        }
    }

    /// Calls `entry` about the reservations, guarded as a settlement: no failure policy.
    async fn book_call(
        &self,
        entry: &Entry,
        keys: &[Vec<u8>],
        args: &[&[u8]],
        now: u64,
    ) -> Result<Vec<u8>, Error> {
        let backend = match &self.topology {
            Some(topology) => topology
                .node(slot(&keys[0]))
                .unwrap_or_else(|| self.guard.single_shared()),
            None => self.guard.single_shared(),
        };
        let route = Route::many(vec![backend]);
        let remote = |_| async {
            let reply = self
                .invoke(entry, keys, args)
                .await
                .map_err(|error| Failure::of(store_error(error), Some(0)))?;
            route.answered(0);
            Ok::<_, Failure>(reply)
        };
        self.guard.settle(now, &route, remote).await
    }

    /// Settles `items` on Redis, with no failure policy: each slot's items in one call of the
    /// settle function, the slots at once. Nothing is refused, so nothing is all-or-nothing.
    async fn remote_settle(
        &self,
        items: &[Planned<'_, RedisPlan>],
        now: u64,
        settle: Settle,
        route: &Route<'_>,
        places: &[usize],
    ) -> Result<Decisions, Failure> {
        let groups = match &self.connection {
            Connection::Single(_) => vec![(0..items.len()).collect()],
            Connection::Cluster(_) => slot_groups(items),
        };
        let place = |group: &[usize]| places.get(group[0]).copied().unwrap_or(0);
        let calls = groups.iter().map(|group| {
            let mut call = self.batch_call(items, group, now, None, Mode::Decide);
            call.args[0] = self.header_of(now, 0, None, Some(settle)).to_vec();
            async move {
                let node = route.get(place(group));
                let entry = &script::SETTLE_ENTRY;
                let settled = self.of_items(entry, "TOLLGATE.SETTLE", &call, Some(node), now);
                let reply = settled
                    .await
                    .map_err(|error| Failure::of(store_error(error), Some(place(group))))?;
                route.answered(place(group));
                Ok::<_, Failure>(reply)
            }
        });
        let replies = futures_join(calls).await;
        let mut decisions: Vec<Option<Decision>> = vec![None; items.len()];
        for (group, reply) in groups.iter().zip(replies) {
            let (reply, source) = reply?;
            read_batch(items, group, &reply, source, &mut decisions)?;
        }
        let decisions = decisions
            .into_iter()
            .map(|d| d.expect("every item settled"));
        Ok(Decisions::many(decisions.collect()))
    }

    /// Decides `items` and keeps `record` if they are admitted, in one call on one server,
    /// with no failure policy: the guard calls this. Says in `outcome` what became of the
    /// record.
    async fn remote_reserve(
        &self,
        items: &[Planned<'_, RedisPlan>],
        now: u64,
        record: &ReservationRecord,
        route: &Route<'_>,
        outcome: &AtomicU8,
    ) -> Result<Decisions, Failure> {
        let failed = |error| Failure::of(error, Some(0));
        let group: Vec<usize> = (0..items.len()).collect();
        let call = self.batch_call(items, &group, now, None, Mode::Decide);
        let mut keys = vec![self.book_key(None), self.book_key(Some(&record.id))];
        keys.extend(call.keys);
        // The record outlives its expiry by an hour, for whoever settles expired ones.
        let ttl_ms = record.expires.saturating_sub(now) / 1_000 + 3_600_000;
        let book = packed([
            record.expires as f64,
            ttl_ms as f64,
            self.max_reservations as f64,
        ]);
        let encoded = record.encode();
        let mut args: Vec<&[u8]> = vec![&book, &encoded];
        args.extend(call.args.iter().map(Vec::as_slice));
        let reply = self
            .invoke(&script::RESERVE_ENTRY, &keys, &args)
            .await
            .map_err(|e| failed(store_error(e)))?;
        route.answered(0);
        let Some((flag, verdicts)) = reply.split_first_chunk::<8>() else {
            return Err(failed(Error::Store {
                message: "a reservation's reply that cannot be read".into(),
                transient: false,
            }));
        };
        let mut decisions: Vec<Option<Decision>> = vec![None; items.len()];
        read_batch(items, &group, verdicts, Source::Redis, &mut decisions).map_err(failed)?;
        let said = match f64::from_le_bytes(*flag) {
            0.0 => Reserved::Full,
            1.0 => Reserved::Kept,
            _ => Reserved::Denied,
        };
        outcome.store(said as u8, Ordering::Relaxed);
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
            match self
                .traced(
                    "TOLLGATE.CHECK",
                    "TOLLGATE.CHECK",
                    1,
                    self.query_until::<Vec<u8>>(call, deadline),
                )
                .await
            {
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
            .invoke_until(plan.entry, keys, &args, deadline)
            .await
            .map_err(failure)?;
        let mut verdicts = Verdicts::new(&reply, plan.tiers)?;
        Ok(verdicts.decision(item.rule, Source::Redis))
    }

    /// The call of the batch function that decides `items[group]`, all-or-nothing, in `mode`.
    fn batch_call(
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
            described.extend(packed([
                plan.algorithm as f64,
                *cost as f64,
                f64::from(u8::from(rule.is_shadow())),
                names.len() as f64,
            ]));
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
    async fn of_items(
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
            let asked = self.query_slot::<Vec<u8>>(items, slot(&call.keys[0]));
            match self.traced(command, command, call.keys.len(), asked).await {
                Ok(reply) => {
                    node.module.present();
                    return Ok((reply, Source::RedisModule));
                }
                Err(err) if module::missing(&err) => node.module.absent(now, node.name(), &err),
                Err(err) => return Err(err),
            }
        }
        let reply = self.invoke(entry, &call.keys, &args).await?;
        Ok((reply, Source::Redis))
    }

    /// Runs a call of the batch function, or of the module's batch where `node` has it
    /// ([`module`]), for a check at `now`: its verdicts, the time it decided at (µs, on the
    /// clock it read), and which decided.
    async fn run(&self, call: &Call, node: Option<&Backend>, now: u64) -> Result<Batched, Error> {
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

    /// Calls `entry`'s function with `keys` and `args`, in one round trip. A server that lacks
    /// the library gets it loaded and the call repeated, and one without functions (before
    /// Redis 7) gets the same code as a script, from then on. Within a span, the call is a
    /// `trace` span of target `tollgate::redis`, its child (a client span of the check's when
    /// traces are exported); with no subscriber interested in it, it costs one check of a
    /// cached flag.
    pub(crate) async fn invoke(
        &self,
        entry: &Entry,
        keys: &[Vec<u8>],
        args: &[&[u8]],
    ) -> Result<Vec<u8>, RedisError> {
        self.invoke_until(entry, keys, args, None).await
    }

    /// [`invoke`](Self::invoke), answered by `deadline` (a timeout error once it passes). Not
    /// an `async fn`, a layer more of the check's future.
    fn invoke_until<'a>(
        &'a self,
        entry: &'a Entry,
        keys: &'a [Vec<u8>],
        args: &'a [&'a [u8]],
        deadline: Option<Deadline>,
    ) -> impl Future<Output = Result<Vec<u8>, RedisError>> + 'a {
        self.traced(
            "FCALL",
            &entry.function,
            keys.len(),
            self.call(entry, keys, args, deadline),
        )
    }

    /// Runs `call`, a command `name` (`operation`: what it runs, on `keys` keys), within a
    /// `trace` span of target `tollgate::redis` when it is part of a traced check (a span of
    /// target `tollgate::traces`, the service's): the store's own calls, and those of checks
    /// not sampled, make no trace of their own. With no subscriber interested, it costs one
    /// check of a cached flag. Not an `async fn`, which would hold `call` twice: as its
    /// argument, and as what it awaits.
    fn traced<T>(
        &self,
        name: &'static str,
        operation: &str,
        keys: usize,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> impl Future<Output = Result<T, RedisError>> {
        let traced = tracing::enabled!(target: "tollgate::redis", tracing::Level::TRACE)
            && tracing::Span::current()
                .metadata()
                .is_some_and(|m| m.target() == "tollgate::traces");
        let span = match traced {
            true => tracing::trace_span!(
                target: "tollgate::redis",
                "redis",
                otel.name = name,
                otel.kind = "client",
                db.system = "redis",
                db.operation = %operation,
                db.redis.keys = keys,
            ),
            false => tracing::Span::none(),
        };
        tracing::Instrument::instrument(call, span)
    }

    /// [`invoke_until`](Self::invoke_until), without its span.
    async fn call(
        &self,
        entry: &Entry,
        keys: &[Vec<u8>],
        args: &[&[u8]],
        deadline: Option<Deadline>,
    ) -> Result<Vec<u8>, RedisError> {
        // Servers without functions are rare, and their path is boxed, as are the rare paths
        // below: inline, they would make every check's future larger.
        if self.scripts_only.load(Ordering::Relaxed) {
            return within(deadline, Box::pin(self.script(entry, keys, args))).await;
        }
        let loads = self.library.loads.load(Ordering::Acquire);
        match self.query_until(fcall(entry, keys, args), deadline).await {
            Err(err) if function_not_found(&err) => {
                let load = Box::pin(self.load_library(entry, keys, args, loads));
                within(deadline, load).await
            }
            Err(err) if functions_refused(&err) => {
                within(deadline, Box::pin(self.to_scripts(err, entry, keys, args))).await
            }
            reply => reply,
        }
    }

    /// Loads the library, unless another check loaded it since this one read `loads`, and
    /// repeats the call; or, when the server cannot load it, calls the script.
    async fn load_library(
        &self,
        entry: &Entry,
        keys: &[Vec<u8>],
        args: &[&[u8]],
        loads: u64,
    ) -> Result<Vec<u8>, RedisError> {
        let one_at_a_time = self.library.loading.lock().await;
        if self.library.loads.load(Ordering::Acquire) == loads {
            let mut load = redis::cmd("FUNCTION");
            load.arg("LOAD").arg("REPLACE").arg(&script::LIBRARY.code);
            match self.query::<()>(load).await {
                Ok(()) => {
                    self.library.loads.fetch_add(1, Ordering::Release);
                }
                // ERR: no FUNCTION command, or a server that cannot run the library; NOPERM: a
                // user allowed scripts but not functions. Busy, loading or failing servers pass.
                Err(err) if matches!(err.code(), Some("ERR" | "NOPERM")) => {
                    drop(one_at_a_time);
                    return self.to_scripts(err, entry, keys, args).await;
                }
                Err(err) => return Err(err),
            }
        }
        drop(one_at_a_time);
        self.query(fcall(entry, keys, args)).await
    }

    /// Switches to scripts for good, because of `err`, and calls the script.
    async fn to_scripts(
        &self,
        err: RedisError,
        entry: &Entry,
        keys: &[Vec<u8>],
        args: &[&[u8]],
    ) -> Result<Vec<u8>, RedisError> {
        if !self.scripts_only.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %err, "redis cannot run functions; checks run as scripts");
        }
        self.script(entry, keys, args).await
    }

    /// Calls `entry` by `EVALSHA` (loading the script on `NOSCRIPT`).
    async fn script(
        &self,
        entry: &Entry,
        keys: &[Vec<u8>],
        args: &[&[u8]],
    ) -> Result<Vec<u8>, RedisError> {
        let mut invocation = entry.script.prepare_invoke();
        for name in keys {
            invocation.key(name);
        }
        for arg in args {
            invocation.arg(arg);
        }
        match &self.connection {
            Connection::Single(pool) => {
                let mut connection = pool.pick().handle();
                invocation.invoke_async(&mut connection).await
            }
            Connection::Cluster(c) => invocation.invoke_async(&mut c.clone()).await,
        }
    }

    /// [`query`](Self::query), sent on a cluster to the master of `slot` (a command whose
    /// keys do not come first).
    async fn query_slot<T: redis::FromRedisValue>(
        &self,
        command: redis::Cmd,
        slot: u16,
    ) -> Result<T, RedisError> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        match &self.connection {
            Connection::Single(_) => self.query(command).await,
            Connection::Cluster(c) => {
                let node = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                // A routed command's server error comes back as a value.
                let reply = c
                    .clone()
                    .route_command(command, RoutingInfo::SingleNode(node))
                    .await?
                    .extract_error()?;
                Ok(redis::from_redis_value(reply)?)
            }
        }
    }

    async fn query<T: redis::FromRedisValue>(
        &self,
        command: impl Command,
    ) -> Result<T, RedisError> {
        self.query_until(command, None).await
    }

    /// [`query`](Self::query), answered by `deadline` (a timeout error once it passes): on
    /// one server by the timer of its connection's reader (see [`Wire`]).
    async fn query_until<T: redis::FromRedisValue>(
        &self,
        command: impl Command,
        deadline: Option<Deadline>,
    ) -> Result<T, RedisError> {
        match &self.connection {
            Connection::Single(pool) => {
                let reply = pool.pick().query(&command, deadline).await?;
                Ok(redis::from_redis_value(reply)?)
            }
            Connection::Cluster(c) => {
                within(deadline, command.into_cmd().query_async(&mut c.clone())).await
            }
        }
    }
}

impl super::Store for RedisStore {
    type Plan = RedisPlan;

    fn plan(&self, rule: &Rule) -> Result<RedisPlan, Error> {
        Ok(RedisPlan::new(
            rule,
            &self.key_prefix,
            self.guard.plan(rule)?,
            self.module,
        ))
    }

    async fn check(
        &self,
        items: &[Planned<'_, RedisPlan>],
        now: u64,
        max_delay: Option<u64>,
    ) -> Result<Decisions, Error> {
        let (mut route, places) = self.route(items);
        // One item on one server: its command answers by the deadline, on the timer of its
        // pipeline rather than one of its own.
        if let (Connection::Single(_), [_]) = (&self.connection, items) {
            route = route.bounded();
        }
        let remote = |deadline| self.remote(items, now, max_delay, &route, &places, deadline);
        Ok(self
            .guard
            .decide(items, now, max_delay, &route, remote)
            .await)
    }

    fn settles(&self) -> Result<(), Error> {
        Ok(())
    }

    async fn settle(
        &self,
        items: &[Planned<'_, RedisPlan>],
        now: u64,
        settle: Settle,
    ) -> Result<Decisions, Error> {
        let (route, places) = self.route(items);
        let remote = |_| self.remote_settle(items, now, settle, &route, &places);
        self.guard.settle(now, &route, remote).await
    }

    async fn reserve(
        &self,
        items: &[Planned<'_, RedisPlan>],
        now: u64,
        record: &ReservationRecord,
    ) -> Result<(Decisions, bool), Error> {
        // On a cluster the record's slot is not the keys': a check, then the record.
        if self.topology.is_some() {
            return super::reserve_apart(self, items, now, record).await;
        }
        let outcome = AtomicU8::new(Reserved::Unanswered as u8);
        let (route, _) = self.route(items);
        let remote = |_| self.remote_reserve(items, now, record, &route, &outcome);
        let decisions = self.guard.decide(items, now, None, &route, remote).await;
        match outcome.load(Ordering::Relaxed) {
            o if o == Reserved::Full as u8 => Err(super::book::full(self.max_reservations)),
            o if o == Reserved::Kept as u8 => {
                self.remembered.remember(record);
                Ok((decisions, true))
            }
            // Denied, or decided by a failure policy: nothing kept.
            _ => Ok((decisions, false)),
        }
    }

    fn kept_record(&self, id: &str) -> Option<ReservationRecord> {
        self.remembered.take(id)
    }

    async fn commit(
        &self,
        id: &str,
        items: &[Planned<'_, RedisPlan>],
        at: u64,
        actual: u64,
        now: u64,
    ) -> Result<super::Committed, Error> {
        if self.topology.is_some() {
            return super::commit_apart(self, id, items, at, actual, now).await;
        }
        let group: Vec<usize> = (0..items.len()).collect();
        let call = self.batch_call(items, &group, now, None, Mode::Decide);
        let mut keys = vec![self.book_key(None), self.book_key(Some(id))];
        keys.extend(call.keys);
        let header = self.header_of(now, 0, None, Some(Settle::Credit { at }));
        let costs = packed([actual as f64, now as f64]);
        let mut args: Vec<&[u8]> = vec![&costs, &header];
        args.extend(call.args[1..].iter().map(Vec::as_slice));
        let reply = self
            .book_call(&script::COMMIT_ENTRY, &keys, &args, now)
            .await?;
        match reply.split_first() {
            None => Ok(super::Committed::Unknown),
            Some((b'E', record)) => Ok(super::Committed::Expired(ReservationRecord::decode(
                record,
            )?)),
            Some((_, verdicts)) => {
                let mut decisions: Vec<Option<Decision>> = vec![None; items.len()];
                read_batch(items, &group, verdicts, Source::Redis, &mut decisions)?;
                let decisions = decisions
                    .into_iter()
                    .map(|d| d.expect("every item settled"));
                Ok(super::Committed::Settled(Decisions::many(
                    decisions.collect(),
                )))
            }
        }
    }

    async fn keep_reservation(&self, record: &ReservationRecord, now: u64) -> Result<(), Error> {
        let (index, name) = (self.book_key(None), self.book_key(Some(&record.id)));
        // The record outlives its expiry by an hour, for whoever settles expired ones.
        let ttl_ms = record.expires.saturating_sub(now) / 1_000 + 3_600_000;
        let args = packed([
            record.expires as f64,
            ttl_ms as f64,
            self.max_reservations as f64,
        ]);
        let encoded = record.encode();
        let reply = self
            .book_call(&script::KEEP_ENTRY, &[index, name], &[&encoded, &args], now)
            .await?;
        match reply
            .get(..8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap_or_default()))
        {
            Some(1.0) => Ok(()),
            _ => Err(super::book::full(self.max_reservations)),
        }
    }

    async fn take_reservation(
        &self,
        id: &str,
        now: u64,
    ) -> Result<Option<ReservationRecord>, Error> {
        let keys = [self.book_key(None), self.book_key(Some(id))];
        let reply = self.book_call(&script::TAKE_ENTRY, &keys, &[], now).await?;
        if reply.is_empty() {
            return Ok(None);
        }
        ReservationRecord::decode(&reply).map(Some)
    }

    async fn expired_reservations(
        &self,
        now: u64,
        limit: usize,
    ) -> Result<Vec<ReservationRecord>, Error> {
        let args = packed([now as f64, limit as f64]);
        let keys = [self.book_key(None)];
        let reply = self
            .book_call(&script::EXPIRED_ENTRY, &keys, &[&args], now)
            .await?;
        let mut records = Vec::new();
        let mut rest = &reply[..];
        while let Some((head, tail)) = rest.split_first_chunk::<8>() {
            let len = f64::from_le_bytes(*head) as usize;
            let Some((record, tail)) = tail.split_at_checked(len) else {
                break;
            };
            records.push(ReservationRecord::decode(record)?);
            rest = tail;
        }
        Ok(records)
    }

    async fn shutdown(&self) {}

    async fn reset(&self, items: &[Planned<'_, RedisPlan>], _now: u64) -> Result<(), Error> {
        for item in items {
            self.delete(&item.plan.keys(item.key)).await?;
        }
        Ok(())
    }
}

/// The verdicts of a reply, six little-endian doubles per tier, read in order.
struct Verdicts<'a> {
    reply: &'a [u8],
    at: usize,
}

impl<'a> Verdicts<'a> {
    fn new(reply: &'a [u8], tiers: usize) -> Result<Self, Error> {
        if reply.len() != 6 * 8 * tiers {
            return Err(Error::Store {
                message: format!("reply of {} bytes for {tiers} tiers", reply.len()),
                transient: false,
            });
        }
        Ok(Self { reply, at: 0 })
    }

    /// The next item's decision: one verdict per tier of `rule`, decided by `source`.
    fn decision(&mut self, rule: &Rule, source: Source) -> Decision {
        let (reply, at) = (self.reply, self.at);
        let verdict = |i: usize| {
            let field = |j: usize| {
                let at = at + 8 * (6 * i + j);
                let bytes = reply[at..at + 8].try_into().expect("eight bytes");
                f64::from_le_bytes(bytes) as u64
            };
            Verdict::from_reply([0, 1, 2, 3, 4, 5].map(field))
        };
        self.at += 6 * 8 * rule.tiers().len();
        rule.merge(verdict).with_source(source)
    }
}

/// A call of the batch function, its keys and arguments owned, so that it can go on after
/// its check was answered.
struct Call {
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
    /// Each item's rule argument for the module's batch, when it decides every item.
    module: Option<Vec<Vec<u8>>>,
}

/// What a call of the batch function answered.
struct Batched {
    /// Every tier's verdict of every item, six little-endian doubles each.
    verdicts: Vec<u8>,
    /// When it decided (µs, on the clock it read).
    at: u64,
    /// Which decided: the functions or the module.
    source: Source,
}

/// What a call of the batch function does (see `lua/batch.lua`).
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// Decides: writes the costs if every item admits.
    Decide = 0,
    /// Asks every item, writing nothing.
    Look = 1,
}

impl Call {
    /// The same call in another mode.
    fn in_mode(&self, mode: Mode) -> Self {
        let mut args = self.args.clone();
        args[1][..8].copy_from_slice(&packed([f64::from(mode as u8)]));
        Self {
            keys: self.keys.clone(),
            args,
            module: self.module.clone(),
        }
    }
}

/// Reads the verdicts of `items[group]` from a batch `reply`, decided by `source`, into
/// `decisions`.
fn read_batch(
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
async fn futures_join<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
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

/// One item of a counters call: its keys (in one slot) and its packed arguments.
#[derive(Debug)]
pub(crate) struct CounterItem {
    pub(crate) keys: Vec<Vec<u8>>,
    pub(crate) args: Vec<u8>,
}

impl CounterItem {
    fn one_key_each(keys: &[Vec<u8>], args: &[Vec<u8>]) -> Vec<Self> {
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

/// The items of a batch by Redis Cluster slot, in the order their slots first appear.
fn slot_groups(items: &[Planned<'_, RedisPlan>]) -> Vec<Vec<usize>> {
    by_slot(items.iter().map(|item| slot(&item.plan.keys(item.key)[0])))
}

/// Positions grouped by their slot, in the order the slots first appear.
fn by_slot(slots: impl Iterator<Item = u16>) -> Vec<Vec<usize>> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, slot) in slots.enumerate() {
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

/// A window counter's name: `<prefix><key length>:{k<key>}:<tier>:<window>`, the window being
/// its start over the period; the braces keep every counter of a key in one slot.
pub(crate) fn counter_key(prefix: &[u8], key: &[u8], tier: usize, window: u64) -> Vec<u8> {
    let mut name = tagged(prefix, key, 40);
    // Writing to a Vec cannot fail.
    let _ = write!(name, ":{tier}:{window}");
    name
}

/// `<prefix><key length>:{k<key>}`, the key's bytes its hash tag, with room for `more` bytes.
fn tagged(prefix: &[u8], key: &[u8], more: usize) -> Vec<u8> {
    let mut name = Vec::with_capacity(prefix.len() + key.len() + 24 + more);
    name.extend_from_slice(prefix);
    name.extend_from_slice(itoa::Buffer::new().format(key.len()).as_bytes());
    name.extend_from_slice(b":{k");
    name.extend_from_slice(key);
    name.push(b'}');
    name
}

/// Redis Cluster's slot of a key name: CRC16 (XMODEM) of its hash tag, modulo 16384.
pub(crate) fn slot(name: &[u8]) -> u16 {
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

/// The call of `entry`'s function with `keys` and `args`.
fn fcall<'a>(entry: &'a Entry, keys: &'a [Vec<u8>], args: &'a [&'a [u8]]) -> FCall<'a> {
    FCall { entry, keys, args }
}

/// An `FCALL` (see [`fcall`]).
struct FCall<'a> {
    entry: &'a Entry,
    keys: &'a [Vec<u8>],
    args: &'a [&'a [u8]],
}

impl wire::Command for FCall<'_> {
    fn pack(&self, out: &mut Vec<u8>) {
        wire::pack_count(out, 3 + self.keys.len() + self.args.len());
        wire::pack_arg(out, &[b"FCALL"]);
        wire::pack_arg(out, &[self.entry.function.as_bytes()]);
        wire::pack_arg(
            out,
            &[itoa::Buffer::new().format(self.keys.len()).as_bytes()],
        );
        for key in self.keys {
            wire::pack_arg(out, &[key]);
        }
        for arg in self.args {
            wire::pack_arg(out, &[arg]);
        }
    }

    fn into_cmd(self) -> redis::Cmd {
        // Sized up front: growing the command's buffers cost more than the rest of building it.
        let data = self.entry.function.len()
            + self.keys.iter().map(Vec::len).sum::<usize>()
            + self.args.iter().map(|a| a.len()).sum::<usize>()
            + 8;
        let mut call = redis::Cmd::with_capacity(3 + self.keys.len() + self.args.len(), data);
        call.arg("FCALL")
            .arg(&self.entry.function)
            .arg(self.keys.len())
            .arg(self.keys);
        for arg in self.args {
            call.arg(arg);
        }
        call
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

/// What a rule is on Redis: its function, key names and tier arguments, prepared once.
#[derive(Debug, Clone)]
pub struct RedisPlan {
    entry: &'static Entry,
    /// The algorithm's index, as the batch function names it.
    algorithm: usize,
    /// Whether the algorithm gives back a take exactly (see [`across`]).
    gives_back: bool,
    /// `tg:<rule>:<fingerprint>:`
    prefix: Vec<u8>,
    tiers: usize,
    /// ARGV[2]: eleven little-endian doubles per tier.
    tier_args: Vec<u8>,
    /// Whether a tier has a calendar period, whose boundaries go in its arguments at each call.
    calendar: bool,
    guard: GuardPlan,
    /// The rule argument of `TOLLGATE.CHECK` ([`crate::inside::rule_args`]), when its checks
    /// call the module where a node has it.
    module: Option<Vec<u8>>,
}

impl Guarded for RedisPlan {
    fn guard(&self) -> &GuardPlan {
        &self.guard
    }
}

impl RedisPlan {
    fn new(rule: &Rule, key_prefix: &[u8], guard: GuardPlan, module: bool) -> Self {
        let algorithm = rule.algorithm();
        let entry = script::entry(algorithm);
        let name = format!("tg:{}:{:08x}:", rule.name(), rule.fingerprint());
        Self {
            entry,
            algorithm: crate::inside::index(algorithm),
            gives_back: algorithm.gives_back(),
            prefix: [key_prefix, name.as_bytes()].concat(),
            tiers: rule.tiers().len(),
            tier_args: tier_args(rule),
            calendar: rule.tiers().iter().any(|t| t.calendar_period().is_some()),
            guard,
            module: (module && crate::inside::runs(algorithm))
                .then(|| crate::inside::rule_args(algorithm)),
        }
    }

    /// The tiers' arguments for a call at `now` (µs): with each calendar tier's boundaries
    /// around `now` as its parameters (see `window_of` in `lua/prelude.lua`).
    fn tier_args_at(&self, rule: &Rule, now: u64) -> Cow<'_, [u8]> {
        if !self.calendar {
            return Cow::Borrowed(&self.tier_args);
        }
        let mut args = self.tier_args.clone();
        for (i, tier) in rule.tiers().iter().enumerate() {
            if let Some(calendar) = tier.calendar_period() {
                let [b0, b1, b2, b3] = calendar.bounds(now);
                let parameters = packed([b0 as f64, b1 as f64, b2 as f64, b3 as f64, 1.0]);
                args[88 * i + 48..88 * i + 88].copy_from_slice(&parameters);
            }
        }
        Cow::Owned(args)
    }

    /// The Redis key of `key`'s state, or the part its tiers' keys share when each tier has
    /// its own: `<prefix>tg:<rule>:<fingerprint>:<key length>:{k<key>}`.
    fn name(&self, key: &[u8]) -> Vec<u8> {
        // Room for a tier's suffix.
        tagged(&self.prefix, key, 8)
    }

    /// The Redis keys that hold `key`'s state, all with the same hash tag.
    pub fn keys(&self, key: &[u8]) -> Vec<Vec<u8>> {
        let base = self.name(key);
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

/// A rule's tiers as the functions read them: eleven little-endian doubles per tier.
pub(crate) fn tier_args(rule: &Rule) -> Vec<u8> {
    let algorithm = rule.algorithm();
    let mut args = Vec::with_capacity(88 * rule.tiers().len());
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
        args.extend(packed(integers.map(|n| n as f64)));
        args.extend(packed(crate::algorithm::Decide::script_parameters(
            algorithm, tier,
        )));
    }
    args
}

/// Doubles as the functions unpack them: little-endian, eight bytes each.
pub(crate) fn packed<const N: usize>(values: [f64; N]) -> Vec<u8> {
    let mut bytes = vec![0; 8 * N];
    pack_into(&mut bytes, &values);
    bytes
}

/// Writes `values` into `bytes` as [`packed`] does, eight bytes each from the start.
fn pack_into(bytes: &mut [u8], values: &[f64]) {
    for (at, value) in bytes.chunks_exact_mut(8).zip(values) {
        at.copy_from_slice(&value.to_le_bytes());
    }
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
    use crate::algorithm::Tier;

    /// The commands packed straight into a connection's buffer are the bytes redis-rs packs
    /// for the same commands (which a Cluster sends).
    #[test]
    fn commands_packed_directly_are_redis_rs_s() {
        let key = b"tollgate:k\x00\xff".to_vec();
        let check = module::check(&key, b"\x01\x02", b"rule", b"");
        let mut packed = Vec::new();
        check.pack(&mut packed);
        assert_eq!(packed, check.into_cmd().get_packed_command());
        let keys = [key.clone(), b"other".to_vec()];
        for args in [&[][..], &[&b"a"[..], b"", b"\r\n"][..]] {
            let call = fcall(&script::BATCH_ENTRY, &keys, args);
            let mut packed = Vec::new();
            call.pack(&mut packed);
            assert_eq!(packed, call.into_cmd().get_packed_command());
        }
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
        let plan = RedisPlan::new(&rule, b"", GuardPlan::none(), true);
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
        assert_eq!(
            RedisPlan::new(&rule, b"", GuardPlan::none(), true)
                .keys(b"k")
                .len(),
            1
        );
    }

    #[test]
    fn tier_arguments_carry_exact_doubles() {
        let rule = Rule::new(
            "api",
            Algorithm::WarmUp(crate::WarmUp::new(Duration::from_secs(2))),
            [Tier::per_second(3)],
        )
        .unwrap();
        let plan = RedisPlan::new(&rule, b"", GuardPlan::none(), true);
        assert_eq!(plan.tier_args.len(), 11 * 8);
        let double =
            |i: usize| f64::from_le_bytes(plan.tier_args[8 * i..8 * i + 8].try_into().unwrap());
        assert_eq!(double(0), 3.0);
        assert_eq!(double(6), 1_000_000.0 / 3.0);
    }
}
