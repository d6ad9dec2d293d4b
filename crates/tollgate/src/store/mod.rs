//! Stores keep the state words of keys; the algorithms decide over them.

mod memory;

pub(crate) use memory::{MemoryConfig, MemoryStore};
