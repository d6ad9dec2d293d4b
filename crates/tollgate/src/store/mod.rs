//! Stores keep the state words of keys; the algorithms decide over them.

mod lock;
mod memory;

pub(crate) use memory::{MemoryConfig, MemoryStore};
