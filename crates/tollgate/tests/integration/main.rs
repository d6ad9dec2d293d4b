//! The library's integration tests, one binary: a module per subject, and `support`, the
//! Redis servers and clusters they start for themselves. Tests that read their own process's
//! memory are in `tests/memory`, a binary of its own.

#[cfg(feature = "redis")]
mod support;

mod concurrency;
mod limiter;
mod memory_store;
mod metered;
mod properties;
mod retry;

#[cfg(feature = "redis")]
mod behaviour;
#[cfg(all(feature = "tower", feature = "redis"))]
mod layer;
#[cfg(feature = "redis")]
mod permits;
#[cfg(feature = "redis")]
mod redis_batch;
#[cfg(feature = "redis")]
mod redis_cluster;
#[cfg(feature = "redis")]
mod redis_connection;
#[cfg(feature = "redis")]
mod redis_differential;
#[cfg(feature = "redis")]
mod redis_exactness;
#[cfg(feature = "redis")]
mod redis_faults;
#[cfg(feature = "redis")]
mod redis_hybrid;
#[cfg(feature = "redis")]
mod redis_keys;
#[cfg(feature = "redis")]
mod redis_lease;
#[cfg(feature = "redis")]
mod redis_module;
#[cfg(feature = "redis")]
mod regions;
