//! The connection to Redis, and its one way of sending a command, in layers:
//!
//! - [`Connection::query`] sends one command and reads its reply: on one server, on a
//!   pipelined [`Wire`] of the [`Pool`]; on a cluster, through redis-rs's cluster client,
//!   which follows `MOVED` and `ASK`. A deadline bounds it.
//! - [`Connection::query_slot`] is the same, sent to the master of a named slot (for a
//!   command whose keys do not come first, as the module's).
//! - [`Connection::invoke`] calls a function of tollgate's Lua library on top of `query`:
//!   it loads the library where a server lacks it and falls back to scripts (`EVALSHA`)
//!   where a server has no functions.
//! - [`traced`] wraps any of them in a client span when the check is traced.
//!
//! Nothing here knows rules, keys or decisions; the rest of the store sends through this.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use redis::RedisError;
use redis::cluster_async::ClusterConnection;

use super::script::{self, Entry};
use super::wire::{self, Command, Wire, within};
use crate::error::Error;
use crate::store::guard::Deadline;

/// A store's connection to Redis, one server's or a cluster's. Cheap to clone: clones share
/// the connections and what was learnt of the server (its library, whether it has functions).
#[derive(Clone)]
pub(super) struct Connection {
    kind: Kind,
    /// Set once the server turned out to have no functions: checks run as scripts.
    scripts_only: Arc<AtomicBool>,
    library: Arc<Library>,
}

/// Where commands go.
#[derive(Clone)]
enum Kind {
    Single(Arc<Pool>),
    Cluster(ClusterConnection),
}

/// Loads of the function library, one at a time: after a restart, every check in flight finds
/// its function missing, and one load serves them all (each load blocks Redis for about a
/// millisecond).
#[derive(Default)]
struct Library {
    /// How many loads this store has made.
    loads: AtomicU64,
    loading: tokio::sync::Mutex<()>,
}

/// Pipelined connections to one server (one unless configured), taken in turn; concurrent
/// checks are written together on each (see [`Wire`]). Each connects on first use and again
/// after a failure.
pub(super) struct Pool {
    wires: Vec<Arc<Wire>>,
    next: AtomicUsize,
}

impl Pool {
    pub(super) fn new(
        info: &redis::ConnectionInfo,
        tls: Option<Arc<rustls::ClientConfig>>,
        connections: usize,
    ) -> Self {
        let wires = (0..connections.max(1))
            .map(|_| Wire::new(info.clone(), tls.clone()))
            .collect();
        Self {
            wires,
            next: AtomicUsize::new(0),
        }
    }

    fn pick(&self) -> &Arc<Wire> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.wires.len();
        &self.wires[i]
    }
}

impl Connection {
    /// Pipelined connections to one server.
    pub(super) fn single(pool: Pool) -> Self {
        Self::of(Kind::Single(Arc::new(pool)))
    }

    /// A cluster's connection (redis-rs's, which keeps one per node).
    pub(super) fn cluster(connection: ClusterConnection) -> Self {
        Self::of(Kind::Cluster(connection))
    }

    fn of(kind: Kind) -> Self {
        Self {
            kind,
            scripts_only: Arc::new(AtomicBool::new(false)),
            library: Arc::new(Library::default()),
        }
    }

    /// The cluster's connection, if this is one.
    pub(super) fn as_cluster(&self) -> Option<&ClusterConnection> {
        match &self.kind {
            Kind::Single(_) => None,
            Kind::Cluster(cluster) => Some(cluster),
        }
    }

    /// Calls `entry`'s function with `keys` and `args`, in one round trip, answered by
    /// `deadline` (a timeout error once it passes). A server that lacks the library gets it
    /// loaded and the call repeated, and one without functions (before Redis 7) gets the same
    /// code as a script, from then on. [`traced`] as an `FCALL`. Not an `async fn`, a layer
    /// more of the check's future.
    pub(super) fn invoke<'a>(
        &'a self,
        entry: &'a Entry,
        keys: &'a [Vec<u8>],
        args: &'a [&'a [u8]],
        deadline: Option<Deadline>,
    ) -> impl Future<Output = Result<Vec<u8>, RedisError>> + 'a {
        traced(
            "FCALL",
            &entry.function,
            keys.len(),
            self.function(entry, keys, args, deadline),
        )
    }

    /// [`invoke`](Self::invoke), without its span.
    async fn function(
        &self,
        entry: &Entry,
        keys: &[Vec<u8>],
        args: &[&[u8]],
        deadline: Option<Deadline>,
    ) -> Result<Vec<u8>, RedisError> {
        // Servers without functions are rare, and their path is boxed, as are the rare paths
        // below: inline, they would make every check's future larger.
        if self.scripts_only.load(Ordering::Relaxed) {
            return within(deadline, Box::pin(self.script(entry, keys, args))).await;
        }
        let loads = self.library.loads.load(Ordering::Acquire);
        match self.query(fcall(entry, keys, args), deadline).await {
            Err(err) if function_not_found(&err) => {
                let load = Box::pin(self.load_library(entry, keys, args, loads));
                within(deadline, load).await
            }
            Err(err) if functions_refused(&err) => {
                within(deadline, Box::pin(self.to_scripts(err, entry, keys, args))).await
            }
            reply => reply,
        }
    }

    /// Loads the library, unless another check loaded it since this one read `loads`, and
    /// repeats the call; or, when the server cannot load it, calls the script.
    async fn load_library(
        &self,
        entry: &Entry,
        keys: &[Vec<u8>],
        args: &[&[u8]],
        loads: u64,
    ) -> Result<Vec<u8>, RedisError> {
        let one_at_a_time = self.library.loading.lock().await;
        if self.library.loads.load(Ordering::Acquire) == loads {
            let mut load = redis::cmd("FUNCTION");
            load.arg("LOAD").arg("REPLACE").arg(&script::LIBRARY.code);
            match self.query::<()>(load, None).await {
                Ok(()) => {
                    self.library.loads.fetch_add(1, Ordering::Release);
                }
                // ERR: no FUNCTION command, or a server that cannot run the library; NOPERM: a
                // user allowed scripts but not functions. Busy, loading or failing servers pass.
                Err(err) if matches!(err.code(), Some("ERR" | "NOPERM")) => {
                    drop(one_at_a_time);
                    return self.to_scripts(err, entry, keys, args).await;
                }
                Err(err) => return Err(err),
            }
        }
        drop(one_at_a_time);
        self.query(fcall(entry, keys, args), None).await
    }

    /// Switches to scripts for good, because of `err`, and calls the script.
    async fn to_scripts(
        &self,
        err: RedisError,
        entry: &Entry,
        keys: &[Vec<u8>],
        args: &[&[u8]],
    ) -> Result<Vec<u8>, RedisError> {
        if !self.scripts_only.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %err, "redis cannot run functions; checks run as scripts");
        }
        self.script(entry, keys, args).await
    }

    /// Calls `entry` by `EVALSHA` (loading the script on `NOSCRIPT`).
    async fn script(
        &self,
        entry: &Entry,
        keys: &[Vec<u8>],
        args: &[&[u8]],
    ) -> Result<Vec<u8>, RedisError> {
        let mut invocation = entry.script.prepare_invoke();
        for name in keys {
            invocation.key(name);
        }
        for arg in args {
            invocation.arg(arg);
        }
        match &self.kind {
            Kind::Single(pool) => {
                let mut connection = pool.pick().handle();
                invocation.invoke_async(&mut connection).await
            }
            Kind::Cluster(c) => invocation.invoke_async(&mut c.clone()).await,
        }
    }

    /// [`query`](Self::query), sent on a cluster to the master of `slot` (a command whose
    /// keys do not come first).
    pub(super) async fn query_slot<T: redis::FromRedisValue>(
        &self,
        command: redis::Cmd,
        slot: u16,
    ) -> Result<T, RedisError> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        match &self.kind {
            Kind::Single(_) => self.query(command, None).await,
            Kind::Cluster(c) => {
                let node = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                // A routed command's server error comes back as a value.
                let reply = c
                    .clone()
                    .route_command(command, RoutingInfo::SingleNode(node))
                    .await?
                    .extract_error()?;
                Ok(redis::from_redis_value(reply)?)
            }
        }
    }

    /// Sends `command` and reads its reply, answered by `deadline` (a timeout error once it
    /// passes): on one server by the timer of its connection's reader (see [`Wire`]).
    pub(super) async fn query<T: redis::FromRedisValue>(
        &self,
        command: impl Command,
        deadline: Option<Deadline>,
    ) -> Result<T, RedisError> {
        match &self.kind {
            Kind::Single(pool) => {
                let reply = pool.pick().query(&command, deadline).await?;
                Ok(redis::from_redis_value(reply)?)
            }
            Kind::Cluster(c) => {
                within(deadline, command.into_cmd().query_async(&mut c.clone())).await
            }
        }
    }
}

/// Runs `call`, a command `name` (`operation`: what it runs, on `keys` keys), within a
/// `trace` span of target `tollgate::redis` when it is part of a traced check (a span of
/// target `tollgate::traces`, the service's): the store's own calls, and those of checks
/// not sampled, make no trace of their own. With no subscriber interested, it costs one
/// check of a cached flag. Not an `async fn`, which would hold `call` twice: as its
/// argument, and as what it awaits.
pub(super) fn traced<T>(
    name: &'static str,
    operation: &str,
    keys: usize,
    call: impl Future<Output = Result<T, RedisError>>,
) -> impl Future<Output = Result<T, RedisError>> {
    let traced = tracing::enabled!(target: "tollgate::redis", tracing::Level::TRACE)
        && tracing::Span::current()
            .metadata()
            .is_some_and(|m| m.target() == "tollgate::traces");
    let span = match traced {
        true => tracing::trace_span!(
            target: "tollgate::redis",
            "redis",
            otel.name = name,
            otel.kind = "client",
            db.system = "redis",
            db.operation = %operation,
            db.redis.keys = keys,
        ),
        false => tracing::Span::none(),
    };
    tracing::Instrument::instrument(call, span)
}

/// The call of `entry`'s function with `keys` and `args`.
fn fcall<'a>(entry: &'a Entry, keys: &'a [Vec<u8>], args: &'a [&'a [u8]]) -> FCall<'a> {
    FCall { entry, keys, args }
}

/// An `FCALL` (see [`fcall`]).
struct FCall<'a> {
    entry: &'a Entry,
    keys: &'a [Vec<u8>],
    args: &'a [&'a [u8]],
}

impl wire::Command for FCall<'_> {
    fn pack(&self, out: &mut Vec<u8>) {
        wire::pack_count(out, 3 + self.keys.len() + self.args.len());
        wire::pack_arg(out, &[b"FCALL"]);
        wire::pack_arg(out, &[self.entry.function.as_bytes()]);
        wire::pack_arg(
            out,
            &[itoa::Buffer::new().format(self.keys.len()).as_bytes()],
        );
        for key in self.keys {
            wire::pack_arg(out, &[key]);
        }
        for arg in self.args {
            wire::pack_arg(out, &[arg]);
        }
    }

    fn into_cmd(self) -> redis::Cmd {
        // Sized up front: growing the command's buffers cost more than the rest of building it.
        let data = self.entry.function.len()
            + self.keys.iter().map(Vec::len).sum::<usize>()
            + self.args.iter().map(|a| a.len()).sum::<usize>()
            + 8;
        let mut call = redis::Cmd::with_capacity(3 + self.keys.len() + self.args.len(), data);
        call.arg("FCALL")
            .arg(&self.entry.function)
            .arg(self.keys.len())
            .arg(self.keys);
        for arg in self.args {
            call.arg(arg);
        }
        call
    }
}

/// Whether `err` says the called function is not on the server (a new or restarted one).
fn function_not_found(err: &RedisError) -> bool {
    err.code() == Some("ERR")
        && err
            .detail()
            .is_some_and(|d| d.to_ascii_lowercase().contains("function not found"))
}

/// Whether `err` says functions cannot be called here: no `FCALL` (before Redis 7, or
/// renamed away), or a user not allowed it.
fn functions_refused(err: &RedisError) -> bool {
    match err.code() {
        Some("NOPERM") => true,
        Some("ERR") => err
            .detail()
            .is_some_and(|d| d.to_ascii_lowercase().contains("unknown command")),
        _ => false,
    }
}

/// A store error, saying whether retrying may help.
pub(crate) fn store_error(err: RedisError) -> Error {
    let transient = err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_io_error()
        || err.is_cluster_error();
    Error::Store {
        message: err.to_string(),
        transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::module;

    #[test]
    fn commands_packed_directly_are_redis_rs_s() {
        let key = b"tollgate:k\x00\xff".to_vec();
        let check = module::check(&key, b"\x01\x02", b"rule", b"");
        let mut packed = Vec::new();
        check.pack(&mut packed);
        assert_eq!(packed, check.into_cmd().get_packed_command());
        let keys = [key.clone(), b"other".to_vec()];
        for args in [&[][..], &[&b"a"[..], b"", b"\r\n"][..]] {
            let call = fcall(&script::BATCH_ENTRY, &keys, args);
            let mut packed = Vec::new();
            call.pack(&mut packed);
            assert_eq!(packed, call.into_cmd().get_packed_command());
        }
    }
}
