//! The configuration model: what the rule files of both formats (and the environment's
//! settings) produce, checked and ready to serve: the [`Config`], its server and store
//! settings, the native rules as written, and errors that name the file, line and column.
//! The parsers live with their formats: [`native`] here, Envoy's in `crate::envoy::file`;
//! `crate::provider` reads the files and merges them.

mod duration;
mod error;
mod lists;
pub mod native;
mod overrides;
pub mod places;
mod server;
mod store;

use tollgate::engine::Engine;

pub use duration::parse_duration;
pub use error::{ConfigError, Place, Places};
pub use lists::{ListEntry, ListKind, MAX_LIST_ENTRIES};
pub use native::{RuleSpec, TierSpec, parse_algorithm, parse_rule_spec, parse_rule_text};
pub use overrides::{
    MAX_OVERRIDES, MAX_PATTERNS, OverrideEntry, OverrideSpec, Overrides, entries, from_entries,
};
pub use server::{
    DEFAULT_RECORD_BYTES, EnvoySettings, Limits, ServerConfig, Startup, Statsd, TlsFiles,
    TracingProtocol, TracingSettings, XdsBackoff, XdsSettings, XdsTls,
};
pub use store::{
    DEFAULT_MAX_BYTES, DEFAULT_MAX_KEYS, DEFAULT_REDIS_TIMEOUT, DEFAULT_SYNC_INTERVAL,
    PeerSettings, RedisMode, RedisOptions, RegionsSettings, StoreConfig,
};

/// Everything the rule files say.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listening and limits of the service.
    pub server: ServerConfig,
    /// Where counters live.
    pub store: StoreConfig,
    /// The native rules, as written (the admin API lists and edits them).
    pub specs: Vec<RuleSpec>,
    /// Routes and domains, ready to match.
    pub engine: Engine,
    /// Where each part was written, for errors found after loading.
    pub places: Places,
}
