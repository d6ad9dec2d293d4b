//! The service's core, shared by its protocols: the rules loaded now (swapped whole on a
//! reload), the store (kept across reloads, so counters of unchanged rules survive), and the
//! checks every protocol asks for.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;
use tollgate::engine::{Engine, Headers, Items, Request};
use tollgate::{AnyStore, Decision, Decisions, Error, Item, Limiter, Store};

use crate::config::{self, Config, ConfigError, Overrides, RuleSpec, StoreConfig};
use crate::console::Console;
use crate::metrics::{self, EnvoyStats, RuleMetrics};
use crate::shared::{Overlay, Shared, SharedRules};

mod caller_limit;
mod checks;
pub mod denied;
mod health;
pub mod lists;
mod metered;
mod overrides;
mod rules;
mod store;

pub use caller_limit::MAX_CALLER_LIMITS;
pub use health::Outage;
pub use metered::{Metered, Target};
use store::StoreSettings;
pub use store::check;

/// Rules as loaded: the engine that matches requests and the limiter that holds the rules.
#[derive(Debug)]
pub struct Loaded {
    /// Matches requests and descriptors to rules and keys.
    pub engine: Engine,
    /// The rules on the store; `None` when there are none.
    pub limiter: Option<Limiter<AnyStore>>,
    /// The native rules as written.
    pub specs: Vec<RuleSpec>,
    /// The configuration these came from.
    pub config: Config,
    /// Each rule's counters, by rule name (looked up on every decision: a fast hash).
    metrics: HashMap<&'static str, RuleMetrics, foldhash::fast::RandomState>,
    /// The Envoy service's statistics of each configured limit, by name.
    envoy_stats: HashMap<String, EnvoyStats, foldhash::fast::RandomState>,
    /// Which override applies to a rule's key.
    overrides: overrides::Index,
    /// The rules that take a limit stated by the check, and the rules that count them.
    caller_limits: caller_limit::Index,
    /// Whether some rule holds slots (concurrency): checks then hold them under a permit.
    holds_slots: bool,
    /// How long each rule with a `ban` bans a key that exceeds it, by rule name.
    bans: HashMap<&'static str, std::time::Duration, foldhash::fast::RandomState>,
    /// Keys Redis denied, answered here until their `retry_after` (Redis strict only), and
    /// the rules whose denials it keeps. A new one with every load: reloads, admin edits
    /// and overrides clear it.
    denied: Option<(denied::DeniedCache, std::collections::HashSet<&'static str>)>,
}

impl Loaded {
    /// Forgets the denials kept here: permits were given back, or a key reset.
    pub(super) fn clear_denied(&self) {
        if let Some((cache, _)) = &self.denied {
            cache.clear();
        }
    }

    /// The Envoy service's statistics of the configured limit `name`.
    pub fn envoy_stats(&self, name: &str) -> Option<&EnvoyStats> {
        self.envoy_stats.get(name)
    }
}

/// The service: see the module documentation. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Service {
    current: ArcSwap<Loaded>,
    store: AnyStore,
    files: Vec<PathBuf>,
    /// Rules created, replaced (`Some`) or deleted (`None`) through the admin API, by id; they
    /// take precedence over the files' rules of the same id, across reloads.
    overlay: Mutex<Overlay>,
    /// Overrides set through the admin API, by rule and key (see [`crate::config::Overrides`]).
    overrides: Mutex<Overrides>,
    /// The limits checks have stated, by rule (see [`caller_limit`]).
    caller_limits: Mutex<caller_limit::Kept>,
    /// Where the admin rules are shared with the other instances (a Redis store's server).
    shared: Option<SharedRules>,
    /// The version of the shared rules this instance applied last.
    shared_version: AtomicU64,
    /// Serializes admin edits and shared refreshes, which read, then write the rules.
    edits: tokio::sync::Mutex<()>,
    /// How long the store takes to decide.
    latency: ::metrics::Histogram,
    /// Set when the process was asked to stop: from then on it is not healthy.
    terminating: AtomicBool,
    /// Whether Redis has answered since start (`/healthcheck` waits for it).
    redis_confirmed: AtomicBool,
    /// The console, when an admin token turned it on: what decisions and requests it keeps.
    console: std::sync::OnceLock<Arc<Console>>,
    /// How the rule files loaded, for the console.
    status: Mutex<LoadStatus>,
    /// The allow and deny lists, bans included.
    lists: lists::Lists,
    /// With `CONFIG_TYPE=GRPC_XDS_SOTW`, the Envoy domains the xDS server pushed last that
    /// loaded, as (name, text), served beside the files; `None`: files only. Held while a
    /// reload reads it, so that a push and a file reload never cross.
    pushed: Mutex<Option<Vec<(PathBuf, String)>>>,
}

/// How the rule files loaded: how many times (the version of the rules), when, and the last
/// reload that failed, if any.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LoadStatus {
    /// Loads that succeeded (the first at start).
    pub version: u64,
    /// When the rules in use loaded (seconds since the epoch).
    pub loaded_at: u64,
    /// The last reload that failed since then: when, and why.
    pub last_error: Option<(u64, String)>,
}

/// Why an admin edit was refused.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    /// The rule, or the rules it would make, are invalid.
    #[error("{0}")]
    Invalid(String),
    /// The Redis that shares the rules did not take the edit; nothing changed.
    #[error("the shared rules could not be written: {0}")]
    Unavailable(String),
}

/// The outcome of one check: admitted only if every decision admits (all-or-nothing).
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// One decision per rule that applied, in order.
    pub decisions: Decisions,
    /// When a concurrency rule applied and admitted: the permit its slots are held under.
    pub permit: Option<Permit>,
    /// Refused by a deny entry that answers 403 rather than 429.
    pub forbidden: bool,
}

/// Slots held on concurrency rules: the id to release them by, and how long until the permit
/// ends (the slots free themselves shortly after).
#[derive(Debug, Clone)]
pub struct Permit {
    /// 32 hex digits.
    pub id: String,
    /// Until the permit ends unless extended.
    pub expires_in: std::time::Duration,
}

impl Outcome {
    /// The outcome of `decisions`, holding no slots.
    pub fn of(decisions: Decisions) -> Self {
        Self {
            decisions,
            permit: None,
            forbidden: false,
        }
    }
}

impl Outcome {
    /// Whether the request is admitted: no rule denied it.
    pub fn allowed(&self) -> bool {
        self.decisions.iter().all(Decision::allowed)
    }
}

/// A check the service refuses: the caller's mistake, said plainly.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A bad cost, key or rule name, or too many items.
    #[error("{0}")]
    Invalid(String),
    /// No open reservation has the id given.
    #[error("{0}")]
    UnknownReservation(String),
    /// The store could not take it now (a report or settlement Redis did not take, a full
    /// book of reservations): nothing is made up, the caller hears of it.
    #[error("{0}")]
    Unavailable(String),
    /// What the store never does (reports and reservations on the hybrid and lease stores).
    #[error("{0}")]
    Unsupported(String),
    /// What the rules do not let a caller do: state a limit for a rule that takes none.
    #[error("{0}")]
    Forbidden(String),
}

impl From<Error> for CheckError {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        match e {
            Error::UnknownReservation { .. } => Self::UnknownReservation(message),
            Error::Store { .. } | Error::ReservationsFull { .. } => Self::Unavailable(message),
            Error::Unsupported { .. } => Self::Unsupported(message),
            _ => Self::Invalid(message),
        }
    }
}

/// The region this process answers for, when its store has regions: what the check API's
/// answers name when a global rule decided.
pub static REGION: std::sync::OnceLock<Box<str>> = std::sync::OnceLock::new();

impl Service {
    /// The service of `config`, read from `files` (the paths as given: reloads read them
    /// again), on the store it configures.
    ///
    /// # Errors
    /// What [`check`] refuses, or a store that cannot be made.
    pub async fn start(files: Vec<PathBuf>, config: Config) -> anyhow::Result<Self> {
        check(&config)?;
        let store = StoreSettings::of(&config.store)?.open().await?;
        if let Some(regions) = store.regions() {
            // One store per process: its region answers every check of this process.
            let _ = REGION.set(regions.region().into());
        }
        let shared = match &config.store {
            StoreConfig::Redis {
                url,
                cluster,
                options,
                ..
            } => Some(SharedRules::open(url.as_deref(), cluster, options).await?),
            StoreConfig::Memory { .. } => None,
        };
        let mut kept = Shared::default();
        let mut listed = (0, Vec::new());
        if let Some(shared) = &shared {
            match shared.read().await {
                Ok(read) => kept = read,
                Err(e) => tracing::warn!(error = %e, "cannot read the shared admin rules yet"),
            }
            match shared.read_lists().await {
                Ok(read) => listed = read,
                Err(e) => tracing::warn!(error = %e, "cannot read the shared lists yet"),
            }
        } else {
            if let Some(file) = &config.server.overrides_file {
                kept.overrides = overrides::read_file(file)?;
            }
            if let Some(file) = &config.server.lists_file {
                listed.1 = lists::read_file(file)?;
            }
        }
        let lists = lists::Lists::new(listed.1);
        lists.set_version(listed.0);
        let Shared {
            version,
            overlay,
            overrides,
        } = kept;
        let loaded = compose(
            config,
            &overlay,
            &overrides,
            &caller_limit::Kept::new(),
            &store,
        )
        .map_err(anyhow::Error::msg)?;
        metrics::reload(true);
        Ok(Self {
            redis_confirmed: AtomicBool::new(false),
            console: std::sync::OnceLock::new(),
            status: Mutex::new(LoadStatus {
                version: 1,
                loaded_at: crate::console::now_micros() / 1_000_000,
                last_error: None,
            }),
            current: ArcSwap::from_pointee(loaded),
            files,
            overlay: Mutex::new(overlay),
            overrides: Mutex::new(overrides),
            caller_limits: Mutex::new(caller_limit::Kept::new()),
            shared,
            shared_version: AtomicU64::new(version),
            edits: tokio::sync::Mutex::new(()),
            latency: metrics::store_latency(store.kind()),
            terminating: AtomicBool::new(false),
            store,
            lists,
            pushed: Mutex::new(None),
        })
    }

    /// The rules loaded now.
    pub fn loaded(&self) -> arc_swap::Guard<Arc<Loaded>> {
        self.current.load()
    }

    /// Turns the console on, its recorders keeping at most `record_bytes`, recording requests
    /// `always` or while the console is in use; from then on every check is counted. On a
    /// Redis store, this instance publishes its summary there and reads the others'. Once
    /// only: later calls return the console made first.
    pub fn enable_console(&self, record_bytes: usize, always: bool) -> Arc<Console> {
        let mut made = false;
        let console = self
            .console
            .get_or_init(|| {
                made = true;
                Arc::new(Console::new(record_bytes, always))
            })
            .clone();
        if made && let Some(shared) = self.shared.clone() {
            tokio::spawn(crate::console::instances::follow(console.clone(), shared));
        }
        console
    }

    /// The console, when it is on.
    pub fn console(&self) -> Option<&Arc<Console>> {
        self.console.get()
    }

    /// How the rule files loaded.
    pub fn status(&self) -> LoadStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The rule files or directories served, as given at start.
    pub fn sources(&self) -> &[PathBuf] {
        &self.files
    }

    /// The Envoy domains an xDS server pushed last (see [`crate::provider::xds`]), locked:
    /// `None` until the service is told it takes pushes by setting it.
    pub fn pushed(&self) -> std::sync::MutexGuard<'_, Option<Vec<(PathBuf, String)>>> {
        self.pushed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The store: its kind, and a shared store's health.
    pub fn store(&self) -> &AnyStore {
        &self.store
    }

    /// Forgets `key` under the rule `rule` (an operator lifting a limit on one key).
    ///
    /// # Errors
    /// An unknown rule, a bad key, or a shared store that did not take it.
    pub async fn reset_key(&self, rule: &str, key: &[u8]) -> Result<(), CheckError> {
        let loaded = self.loaded();
        let Some(limiter) = &loaded.limiter else {
            return Err(CheckError::Invalid(format!("unknown rule `{rule}`")));
        };
        limiter.reset(rule, key).await.map_err(CheckError::from)?;
        loaded.clear_denied();
        Ok(())
    }
}

/// The rules of the files' `config` with the admin API's `overlay` and `overrides` applied,
/// and the rules that count the limits `stated` by checks, on `store`.
fn compose(
    mut config: Config,
    overlay: &Overlay,
    overrides: &Overrides,
    stated: &caller_limit::Kept,
    store: &AnyStore,
) -> Result<Loaded, String> {
    if !overlay.is_empty() {
        let mut specs: Vec<RuleSpec> = config
            .specs
            .into_iter()
            .filter(|s| !overlay.contains_key(&s.id))
            .collect();
        specs.extend(overlay.values().flatten().cloned());
        let routes = specs
            .iter()
            .map(RuleSpec::route)
            .collect::<Result<Vec<_>, _>>()?;
        let domains = config.engine.domains().cloned().collect();
        config.engine = Engine::new(routes, domains)?;
        config.specs = specs;
    }
    // Each override a rule of its own, beside the rules; one of a rule gone stays unused.
    let mut derived = Vec::new();
    for ((rule, key), spec) in overrides {
        let base = config
            .engine
            .routes()
            .iter()
            .find(|r| r.rule.name() == rule);
        if let Some(base) = base {
            derived.push(overrides::derive(&base.rule, key, spec)?);
        }
    }
    let index = overrides::Index::new(overrides, config.engine.rules(), &derived);
    // Each limit stated a rule of its own; one of a rule that no longer takes one stays unused.
    let takes: Vec<&tollgate::Rule> = config
        .engine
        .rules()
        .filter(|r| {
            config
                .specs
                .iter()
                .any(|s| s.caller_limit && s.id == r.name())
        })
        .collect();
    let first_stated = derived.len();
    for (rule, tier) in stated {
        if let Some(base) = takes.iter().find(|r| r.name() == rule) {
            derived.push(caller_limit::derive(base, tier)?);
        }
    }
    let caller_limits =
        caller_limit::Index::new(takes.into_iter(), stated, &derived[first_stated..]);
    build(config, derived, index, caller_limits, store).map_err(|e| e.to_string())
}

/// A limiter for the rules of `config` and the rules `derived` from overrides and stated
/// limits, on `store`.
fn build(
    config: Config,
    derived: Vec<tollgate::Rule>,
    overrides: overrides::Index,
    caller_limits: caller_limit::Index,
    store: &AnyStore,
) -> Result<Loaded, Error> {
    // Derived rules' decisions name their rules: one series per rule, whatever the overrides.
    let metrics = config
        .engine
        .rules()
        .map(|r| (r.name(), RuleMetrics::new(r.name())))
        .collect();
    let rules: Vec<_> = config.engine.rules().cloned().chain(derived).collect();
    let mut rules = rules.into_iter();
    let limiter = match rules.next() {
        None => None,
        Some(first) => {
            let builder = rules.fold(Limiter::builder(first), |b, r| b.rule(r));
            Some(builder.store(store.clone()).build()?)
        }
    };
    let envoy_stats = config
        .engine
        .domains()
        .flat_map(|d| d.stats_names())
        .map(|name| (name.to_string(), EnvoyStats::new(name)))
        .collect();
    let holds_slots = limiter
        .as_ref()
        .is_some_and(|l| l.rules().any(|r| r.algorithm().holds_slots()));
    let bans = config
        .specs
        .iter()
        .filter_map(|spec| {
            let ban = spec.ban().ok()??;
            let rule = config.engine.rules().find(|r| r.name() == spec.id)?;
            Some((rule.name(), ban))
        })
        .collect();
    let denied = match (&limiter, store.kind(), config.server.denied_cache_bytes) {
        (Some(limiter), "redis", bytes) if bytes > 0 => {
            // Native rules and those derived from them (overrides, stated limits: named
            // `rule/...`), not Envoy domains', whose every hit Redis counts.
            let native: std::collections::HashSet<&str> = config
                .engine
                .routes()
                .iter()
                .map(|r| r.rule.name())
                .collect();
            let rules = limiter
                .rules()
                .filter(|r| {
                    let base = r.name().split_once('/').map_or(r.name(), |(b, _)| b);
                    native.contains(base) && denied::caches(r)
                })
                .map(tollgate::Rule::name)
                .collect();
            Some((denied::DeniedCache::new(bytes), rules))
        }
        _ => None,
    };
    Ok(Loaded {
        engine: config.engine.clone(),
        denied,
        limiter,
        holds_slots,
        bans,
        specs: config.specs.clone(),
        config,
        metrics,
        envoy_stats,
        overrides,
        caller_limits,
    })
}
