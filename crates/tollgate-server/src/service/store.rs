//! The store a configuration describes: its settings checked without connecting (what
//! `validate`, `serve` and every reload refuse alike), then opened.

use tollgate::{
    AnyStore, Error, HybridConfig, HybridStore, LeaseConfig, LeaseStore, MemoryStore,
    MemoryStoreBuilder, Peer, RedisStore, RedisStoreBuilder, RegionStore, RegionsConfig, Scope,
};

use crate::config::{Config, ConfigError, RedisMode, RegionsSettings, StoreConfig};

/// The store a configuration describes, before it is opened: settings only, checked and
/// opened from one place, so that `validate`, `serve` and a reload refuse the same things.
#[derive(Debug, Clone)]
pub(super) enum StoreSettings {
    Memory(MemoryStoreBuilder),
    Redis {
        redis: Box<RedisStoreBuilder>,
        mode: Mode,
        /// This region and its peers: their names and Redis builders.
        regions: Option<Box<Regions>>,
    },
}

/// A store's regions, before they are opened.
#[derive(Debug, Clone)]
pub(super) struct Regions {
    settings: RegionsSettings,
    peers: Vec<(String, RedisStoreBuilder)>,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Mode {
    Strict,
    Hybrid(HybridConfig),
    Lease(LeaseConfig),
}

impl StoreSettings {
    /// The settings of `config`, with the certificates it names read from their files.
    ///
    /// # Errors
    /// A certificate file that cannot be read, or half of a client certificate.
    pub(super) fn of(config: &StoreConfig) -> Result<Self, Error> {
        Ok(match config {
            StoreConfig::Memory {
                max_keys,
                max_bytes,
                when_full,
            } => Self::Memory(
                MemoryStore::builder()
                    .max_keys(*max_keys)
                    .max_bytes(*max_bytes)
                    .when_full(*when_full),
            ),
            StoreConfig::Redis {
                url,
                cluster,
                mode,
                timeout,
                instances,
                sync_interval,
                max_unclaimed,
                options,
                regions,
            } => {
                let certificates = options.certificates().map_err(|message| Error::Store {
                    message,
                    transient: false,
                })?;
                // Every Redis this store reaches, its region's and the peers', the same way.
                let configure = |url: &Option<String>, cluster: &[String]| {
                    let mut redis = match url {
                        Some(url) => RedisStore::builder(url),
                        None => RedisStore::cluster_builder(cluster),
                    }
                    .timeout(*timeout)
                    .connections(options.connections)
                    .key_prefix(options.key_prefix.as_bytes())
                    .expiry_jitter(options.expiry_jitter)
                    .module(options.module);
                    if let Some(certificates) = &certificates {
                        if let Some(ca) = &certificates.root_cert {
                            redis = redis.root_certificate(ca.clone());
                        }
                        if let Some(client) = &certificates.client_tls {
                            redis = redis.client_certificate(
                                client.client_cert.clone(),
                                client.client_key.clone(),
                            );
                        }
                    }
                    redis
                };
                let redis = configure(url, cluster);
                let mode = match mode {
                    RedisMode::Strict => Mode::Strict,
                    RedisMode::Hybrid => Mode::Hybrid(HybridConfig {
                        sync_interval: *sync_interval,
                        max_unclaimed: *max_unclaimed,
                        instances: *instances,
                        ..HybridConfig::default()
                    }),
                    RedisMode::Lease => Mode::Lease(LeaseConfig {
                        instances: *instances,
                        ..LeaseConfig::default()
                    }),
                };
                let regions = regions.as_ref().map(|settings| {
                    let peers = settings
                        .peers
                        .iter()
                        .map(|peer| {
                            // A peer's checks are never sent: it only merges counts.
                            let builder = configure(&peer.url, &peer.cluster).module(false);
                            (peer.name.clone(), builder)
                        })
                        .collect();
                    Box::new(Regions {
                        settings: (**settings).clone(),
                        peers,
                    })
                });
                Self::Redis {
                    redis: Box::new(redis),
                    mode,
                    regions,
                }
            }
        })
    }

    /// What opening the store would refuse in its settings, without connecting.
    fn validate(&self) -> Result<(), Error> {
        match self {
            Self::Memory(memory) => memory.validate(),
            Self::Redis {
                redis,
                mode,
                regions,
            } => {
                redis.validate()?;
                if let Some(regions) = regions {
                    let settings = &regions.settings;
                    let names: Vec<&str> = regions.peers.iter().map(|(n, _)| n.as_str()).collect();
                    RegionsConfig::check(
                        &settings.region,
                        &names,
                        settings.interval,
                        settings.overshoot,
                    )?;
                    for (_, peer) in &regions.peers {
                        peer.validate()?;
                    }
                }
                match mode {
                    Mode::Strict => Ok(()),
                    Mode::Hybrid(config) => config.validate(),
                    Mode::Lease(config) => config.validate(),
                }
            }
        }
    }

    /// Whether the store can hold `rule`, as planning it there would say.
    fn holds(&self, rule: &tollgate::Rule) -> Result<(), Error> {
        let regional = matches!(
            self,
            Self::Redis {
                regions: Some(_),
                ..
            }
        );
        if matches!(rule.scope_of(), Scope::Global(_)) && !regional {
            return Err(Error::from(tollgate::RuleError {
                rule: rule.name().into(),
                field: "scope".into(),
                reason: "a global rule is one limit across regions: it needs a Redis store \
                         with `regions` (this region and its peers)"
                    .into(),
            }));
        }
        match self {
            Self::Memory(memory) => memory.holds(rule),
            Self::Redis { mode, .. } => match mode {
                Mode::Strict => RedisStore::holds(rule),
                Mode::Hybrid(_) => HybridStore::holds(rule),
                Mode::Lease(_) => LeaseStore::holds(rule),
            },
        }
    }

    /// Why the store takes no reservations or reports, if it takes none: the hybrid and lease
    /// stores admit in each instance and settle counts later, so a debt or a give-back there
    /// would have no bound.
    fn settles(&self) -> Result<(), String> {
        let name = match self {
            Self::Redis {
                mode: Mode::Hybrid(_),
                ..
            } => "hybrid",
            Self::Redis {
                mode: Mode::Lease(_),
                ..
            } => "lease",
            _ => return Ok(()),
        };
        Err(format!(
            "reservations: the {name} store takes no reservations or reports (its instances \
             admit apart and settle their counts later, so a debt or a give-back would have no \
             bound); use mode: strict, or the memory store"
        ))
    }

    /// Opens the store (a cluster connects now; a single server on first use).
    pub(super) async fn open(self) -> anyhow::Result<AnyStore> {
        Ok(match self {
            Self::Memory(memory) => AnyStore::Memory(memory.build()?),
            Self::Redis {
                redis,
                mode,
                regions,
            } => {
                let redis = redis.build().await?;
                let local = match mode {
                    Mode::Strict => AnyStore::Redis(redis),
                    Mode::Hybrid(config) => AnyStore::Hybrid(HybridStore::new(&redis, config)?),
                    Mode::Lease(config) => AnyStore::Lease(LeaseStore::new(&redis, config)?),
                };
                let Some(regions) = regions else {
                    return Ok(local);
                };
                let mut peers = Vec::with_capacity(regions.peers.len());
                for (name, builder) in regions.peers {
                    let store = builder
                        .build()
                        .await
                        .map_err(|e| anyhow::anyhow!("store.regions: peer `{name}`: {e}"))?;
                    peers.push(Peer { name, store });
                }
                let settings = regions.settings;
                let config = RegionsConfig {
                    interval: settings.interval,
                    overshoot: settings.overshoot,
                    ..RegionsConfig::new(settings.region, peers)
                };
                AnyStore::Regions(RegionStore::new(local, config)?)
            }
        })
    }
}

/// Checks what `serve` would refuse or could not enforce in `config`, without connecting to
/// anything: the server's settings, the store's, and whether the store holds every rule.
/// `validate`, `serve` and every reload run this one check; errors name the file, line and
/// column of the section or rule at fault.
///
/// # Errors
/// The first thing found, at its place.
pub fn check(config: &Config) -> Result<(), ConfigError> {
    let server = &config.server;
    let limits = server.connections;
    let problem = if limits.max_connections == 0 {
        Some("server.max_connections: must be at least 1")
    } else if limits.header_timeout.is_zero() {
        Some("server.header_timeout: must be longer than zero")
    } else if limits.idle_timeout.is_zero() {
        Some("server.idle_timeout: must be longer than zero")
    } else if server.max_body_bytes < 1_024 {
        Some("server.max_body_bytes: must be at least 1024")
    } else if server.grpc_max_message_bytes < 1_024 {
        Some("server.grpc_max_message_bytes: must be at least 1024")
    } else if server
        .tracing
        .as_ref()
        .is_some_and(|t| !(0.0..=1.0).contains(&t.sampling_rate))
    {
        Some("server.tracing.sampling_rate: must be from 0 to 1")
    } else {
        None
    };
    if let Some(problem) = problem {
        return Err(config.places.server().error(problem));
    }
    for (name, files) in [("tls", &server.tls), ("grpc_tls", &server.grpc_tls)] {
        if let Some(files) = files {
            crate::net::tls::server_config(files).map_err(|e| {
                config
                    .places
                    .server()
                    .error(format!("server.{name}: {e:#}"))
            })?;
        }
    }
    let store = StoreSettings::of(&config.store)
        .and_then(|store| store.validate().map(|()| store))
        .map_err(|e| config.places.store().error(e.to_string()))?;
    for rule in config.engine.rules() {
        store
            .holds(rule)
            .map_err(|e| config.places.rule(rule.name()).error(e.to_string()))?;
    }
    // A rule that says how its reservations live expects them to be taken.
    for spec in config.specs.iter().filter(|s| s.reservations.is_some()) {
        store.settles().map_err(|e| {
            config
                .places
                .rule(&spec.id)
                .error(format!("rule `{}`: {e}", spec.id))
        })?;
    }
    Ok(())
}
