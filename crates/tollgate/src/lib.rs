//! tollgate: rate limiting with every classic algorithm, exact under any concurrency.
//!
//! A [`Rule`] names an [`Algorithm`] and one or more [`Tier`]s (e.g. 10 per second *and* 50
//! per 10 seconds); a check consumes from every tier or from none. A [`Limiter`] enforces one
//! rule over arbitrary byte keys in process memory: [`Limiter::check`] answers at once with a
//! [`Decision`], [`Limiter::acquire`] waits until admitted or until its timeout.
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
//! let decision = limiter.check("tenant-42", 1)?;
//! assert!(decision.allowed());
//! assert_eq!(decision.remaining(), 9);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Time is read from a [`Clock`]; tests use a [`ManualClock`] and advance it instead of
//! sleeping.

mod algorithm;
mod clock;
mod decision;
mod error;
mod limiter;
mod redis_limiter;
mod rule;
mod store;

pub use algorithm::{Algorithm, LeakyBucket, SubWindows, TokenBucket, WarmUp};
pub use clock::{Clock, MAX_TIMESTAMP, ManualClock, SystemClock};
pub use decision::{Decision, Source};
pub use error::{Error, RuleError};
pub use limiter::{Limiter, LimiterBuilder, MAX_KEY_LEN};
pub use redis_limiter::{FailurePolicy, RedisLimiter, RedisLimiterBuilder, StoreTime};
pub use rule::{Rule, Tier};
pub use store::RedisStore;
