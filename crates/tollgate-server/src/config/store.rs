//! Where counters live: the memory store's bounds, or a Redis store's address, mode and
//! connection settings.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tollgate::WhenFull;

/// Where counters live.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreConfig {
    /// Process memory.
    Memory {
        /// The most keys held.
        max_keys: usize,
        /// The most bytes held.
        max_bytes: usize,
        /// What a full store does with a new key.
        when_full: WhenFull,
    },
    /// Redis or Redis Cluster.
    Redis {
        /// A server's URL.
        url: Option<String>,
        /// A cluster's seed nodes, instead of `url`.
        cluster: Vec<String>,
        /// strict, hybrid or lease.
        mode: RedisMode,
        /// The longest a check waits for Redis before the rule's failure policy decides.
        timeout: Duration,
        /// Instances expected to share the keys (hybrid and lease).
        instances: u32,
        /// Hybrid: how often counts are synced.
        sync_interval: Duration,
        /// Hybrid: the most permits of a key one instance admits per window beyond its
        /// claim (`None`: the store's default).
        max_unclaimed: Option<u64>,
        /// Connections, keys and TLS.
        options: Box<RedisOptions>,
        /// The regions this region shares its global rules with; none: every rule is this
        /// region's alone.
        regions: Option<Box<RegionsSettings>>,
    },
}

/// This region, and the peer regions it shares global rules with (see docs/operating.md,
/// "Regions").
#[derive(Debug, Clone, PartialEq)]
pub struct RegionsSettings {
    /// This region's name.
    pub region: String,
    /// How often this instance sends its region's counts to the peers.
    pub interval: Duration,
    /// The most a global limit may be exceeded by while counts travel, as a fraction of it.
    pub overshoot: f64,
    /// The peer regions.
    pub peers: Vec<PeerSettings>,
}

/// A peer region: its name and its Redis, reached with the store's own connection settings
/// (key prefix, TLS files, timeout).
#[derive(Debug, Clone, PartialEq)]
pub struct PeerSettings {
    /// Its name, as it names itself.
    pub name: String,
    /// Its Redis server's URL.
    pub url: Option<String>,
    /// Its Redis Cluster's seed nodes, instead of `url`.
    pub cluster: Vec<String>,
}

/// How the service reaches Redis and names its keys, beyond the address.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisOptions {
    /// Pipelined connections to a single server (1).
    pub connections: usize,
    /// In front of every key (none: keys start with `tg:`).
    pub key_prefix: String,
    /// Keys live up to this much longer than their state, spread (none).
    pub expiry_jitter: Duration,
    /// Whether checks run in tollgate's Redis module where a node has it (yes).
    pub module: bool,
    /// The CA (PEM file) that `rediss://` servers' certificates must chain to, instead of
    /// the web PKI roots tollgate carries (Mozilla's, from webpki-roots).
    pub tls_ca: Option<PathBuf>,
    /// A client certificate chain (PEM file) for servers that ask for one, with `tls_key`.
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM file).
    pub tls_key: Option<PathBuf>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            connections: 1,
            key_prefix: String::new(),
            expiry_jitter: Duration::ZERO,
            module: true,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
        }
    }
}

impl RedisOptions {
    /// The TLS certificates these options name, read from their files; `None` when they
    /// name none.
    ///
    /// # Errors
    /// A file that cannot be read, or a certificate without its key (or a key without its
    /// certificate).
    pub fn certificates(&self) -> Result<Option<redis::TlsCertificates>, String> {
        let read = |what: &str, path: &Path| {
            std::fs::read(path).map_err(|e| format!("{what} `{}`: {e}", path.display()))
        };
        let client_tls = match (&self.tls_cert, &self.tls_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read("tls_cert", cert)?,
                client_key: read("tls_key", key)?,
            }),
            (Some(_), None) => return Err("tls_cert needs tls_key, its private key".into()),
            (None, Some(_)) => return Err("tls_key needs tls_cert, its certificate".into()),
        };
        let root_cert = match &self.tls_ca {
            Some(ca) => Some(read("tls_ca", ca)?),
            None => None,
        };
        Ok(
            (client_tls.is_some() || root_cert.is_some()).then_some(redis::TlsCertificates {
                client_tls,
                root_cert,
            }),
        )
    }
}

/// How long a check waits for Redis when a file sets no `timeout`.
pub const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_millis(20);
/// How often the hybrid store syncs when a file sets no `sync_interval`.
pub const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// The memory store's key bound when a file sets none.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;
/// The memory store's byte bound when a file sets none (256 MiB).
pub const DEFAULT_MAX_BYTES: usize = 256 << 20;

impl Default for StoreConfig {
    fn default() -> Self {
        Self::Memory {
            max_keys: DEFAULT_MAX_KEYS,
            max_bytes: DEFAULT_MAX_BYTES,
            when_full: WhenFull::Evict,
        }
    }
}

/// How a Redis store decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RedisMode {
    /// One atomic round trip per check.
    Strict,
    /// In memory, synced in the background.
    Hybrid,
    /// From permits leased in batches.
    Lease,
}
