//! The Redis store, on one server or a Redis Cluster: strict limiting shared by every instance.
//!
//! Needs Redis 6.2 or later. Each check of one key is one call of its algorithm's function
//! (`FCALL`; the library is loaded when a server lacks it, and servers without functions get
//! the same code by `EVALSHA`): one round trip, atomic, all tiers at once. A batch of several
//! keys is one call of the batch function, all-or-nothing across them. Concurrent checks are
//! pipelined on a shared connection, and those ready in the same pass of the scheduler are
//! written to it together (one server; a cluster's connections pipeline as they come). Every
//! key written expires when its state becomes equivalent to a key never seen, rounded up to the
//! next whole second (writes within that second keep the TTL, which costs Redis less than
//! setting one; the sliding log's sets expire exactly).
//!
//! On a Redis Cluster, keys of different slots cannot meet in one call: a batch whose keys
//! span slots takes from every slot at once, and gives back where it took when any slot
//! denies ([`across`]), so no limit is exceeded. Each master has its own circuit breaker
//! ([`topology`]), so a dead master keeps away only the checks of its slots.
//!
//! Key names: `tg:<rule>:<fingerprint>:<key length>:{k<key>}` (and `:<tier>` for the sliding
//! log's one sorted set per tier). The braces make the key's bytes the hash tag, so all keys of
//! one check live in one cluster slot. The fingerprint changes with the rule's definition, so a
//! changed rule starts from fresh state rather than misreading the old one.

mod across;
mod args;
mod batch;
mod builder;
mod check;
mod connection;
mod counters;
mod keys;
mod module;
mod plan;
mod regional;
mod script;
mod settle;
mod store;
mod topology;
mod wire;

pub use self::args::StoreTime;
pub(crate) use self::batch::futures_join;
pub use self::builder::RedisStoreBuilder;
pub(crate) use self::counters::CounterItem;
pub(crate) use self::keys::{by_slot, counter_key, slot};
pub(crate) use self::module::Presence;
pub use self::plan::RedisPlan;
pub use self::store::RedisStore;
pub use self::topology::NodeHealth;
