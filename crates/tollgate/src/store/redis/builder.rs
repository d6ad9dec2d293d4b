//! How a Redis store is set up: [`RedisStoreBuilder`], its URLs, TLS and settings, checked
//! before anything connects; then the connection to one server or to a cluster.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use redis::cluster::ClusterClientBuilder;

use super::args::StoreTime;
use super::connection::{Connection, Pool, store_error};
use super::store::RedisStore;
use super::topology::Topology;
use crate::error::Error;
use crate::store::book::DEFAULT_MAX_RESERVATIONS;
use crate::store::guard::{Guard, GuardConfig};

/// Pipelined connections to one server: one, whose batches of checks Redis decides with the
/// fewest reads and writes; more split the batches (measured in BENCHMARKS.md).
const DEFAULT_CONNECTIONS: usize = 1;

/// How long establishing a connection may take before it counts as a failure.
const CONNECTION_TIMEOUT: Duration = Duration::from_millis(500);

/// How many times a cluster call follows redirections and retries.
const CLUSTER_RETRIES: u32 = 16;

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
            max_reservations: DEFAULT_MAX_RESERVATIONS,
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
    /// together (default [`DEFAULT_MAX_RESERVATIONS`](DEFAULT_MAX_RESERVATIONS)): a
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
                Connection::single(Pool::new(info, tls, self.connections))
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
                Connection::cluster(connection)
            }
        };
        let topology = match connection.as_cluster() {
            None => None,
            Some(cluster) => {
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

fn install_tls_provider() {
    // Only the first call installs; later ones find it there.
    let _ = rustls::crypto::ring::default_provider().install_default();
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
}
