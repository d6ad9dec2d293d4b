//! tollgate: rate limiting with every classic algorithm, exact under any concurrency.
//!
//! A [`Rule`] names an [`Algorithm`] and one or more [`Tier`]s (e.g. 10 per second *and* 50
//! per 10 seconds); a check consumes from every tier or from none. A [`Limiter`] enforces
//! rules over a [`Store`]: process memory ([`MemoryStore`], the default), or with the `redis`
//! feature, Redis and Redis Cluster in strict, hybrid or lease mode, with a failure policy per
//! rule. [`Limiter::check`] answers with a [`Decision`]; [`Limiter::acquire`] waits until
//! admitted or until its timeout; [`Limiter::check_batch`] decides several keys under several
//! rules all-or-nothing. On the memory store, [`Limiter::check_now`] answers without a future.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Algorithm, Limiter, Rule, Tier, TokenBucket};
//!
//! let rule = Rule::new(
//!     "api",
//!     Algorithm::TokenBucket(TokenBucket::default()),
//!     [Tier::per_second(10), Tier::new(50, Duration::from_secs(10))],
//! )?;
//! let limiter = Limiter::new(rule);
//! let decision = limiter.check_now("tenant-42", 1)?;
//! assert!(decision.allowed());
//! assert_eq!(decision.remaining(), 9);
//! assert_eq!((decision.rule(), decision.window()), ("api", Duration::from_secs(1)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Time is read from a [`Clock`]; tests use a [`ManualClock`] and advance it instead of
//! sleeping.
//!
//! Also: [`engine`], which turns HTTP requests and Envoy descriptors into the (rule, key)
//! items to check; [`retry`], backoff with full jitter for clients of throttled APIs; and,
//! with the `tower` feature, `layer`, a tower layer for axum and hyper services.

mod algorithm;
mod clock;
mod decision;
/// README.md's Rust snippets, compiled and run as doctests, so that they work as pasted.
#[cfg(all(doctest, feature = "redis", feature = "tower"))]
#[doc = include_str!("../../../README.md")]
mod readme {}
/// docs/library.md's Rust snippets, compiled (and those that need no server run) as doctests.
#[cfg(all(doctest, feature = "redis", feature = "tower"))]
#[doc = include_str!("../../../docs/library.md")]
mod library {}

pub mod engine;
mod error;
/// A check decided inside Redis by tollgate's module: for `tollgate-redis-module` only.
#[cfg(feature = "inside-redis")]
#[doc(hidden)]
pub mod inside;
#[cfg(feature = "tower")]
pub mod layer;
// The store writes what the module reads: built for the module alone, the encoders and the
// store's names go unused.
#[cfg(feature = "inside-redis")]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
mod layout;
mod limiter;
mod permit;
mod reservation;
pub mod retry;
mod rule;
mod store;

pub use algorithm::{
    Algorithm, Calendar, CalendarUnit, LeakyBucket, Settle, SubWindows, Tier, TokenBucket,
    UnknownTimeZone, WarmUp, Weekday,
};
pub use clock::{Clock, MAX_TIMESTAMP, ManualClock, SystemClock};
pub use decision::{Decision, Decisions, Source};
pub use error::{Error, RuleError};
pub use limiter::{Item, Limiter, LimiterBuilder};
pub use permit::Permit;
pub use reservation::Reservation;
pub use rule::{FailurePolicy, Global, OnExpiry, OnPartition, Reservations, Rule, Scope};
pub use store::{
    AnyPlan, AnyStore, Committed, DEFAULT_MAX_RESERVATIONS, LocalStore, MAX_BATCH, MAX_KEY_LEN,
    MIN_MAX_BYTES, MemoryPlan, MemoryStore, MemoryStoreBuilder, Planned, ReservationRecord,
    ReservedItem, Store, WhenFull,
};
#[cfg(feature = "redis")]
pub use store::{
    HybridConfig, HybridPlan, HybridStats, HybridStore, InRegion, LeaseConfig, LeasePlan,
    LeaseStats, LeaseStore, NodeHealth, Peer, PeerHealth, RedisPlan, RedisStore, RedisStoreBuilder,
    RegionPlan, RegionStore, RegionsConfig, StoreFailures, StoreFuture, StoreTime,
};
