//! Stores keep the state words of keys; the algorithms decide over them.

mod breaker;
mod lock;
mod memory;
mod redis;

pub(crate) use breaker::{Breaker, Gate};
pub(crate) use memory::{MemoryConfig, MemoryStore};
pub(crate) use redis::Plan;
pub use redis::RedisStore;
