//! tollgate's Redis module: `TOLLGATE.CHECK key check rule tiers` (each argument after the
//! key led by a NUL byte) decides a check inside
//! Redis with the algorithm code the memory store runs ([`tollgate::inside`]), on the same
//! keys, values and expiries as tollgate's Lua functions, so instances with and without the
//! module share keys. Load it with `redis-server --loadmodule libtollgate_redis_module.so`;
//! stores find it on their own.
//!
//! - One key per call, declared to Redis (first key 1), so Cluster routing, `COMMAND GETKEYS`,
//!   ACL key patterns and `CROSSSLOT` work as for any command; flags `write deny-oom`.
//! - The time, when the caller sends none, is the server's (`RedisModule_CachedMicroseconds`),
//!   never the machine's.
//! - Effects, not the command, are replicated: the `SET ... PXAT` or `DEL` the check comes to,
//!   as Lua's are, so a replica or an AOF needs no module and re-decides nothing.
//!
//! All the unsafe code of tollgate is here, in calls into Redis (most within `redis-module`).

use std::cell::RefCell;
use std::collections::HashMap;

use redis_module::{
    CallOptions, CallOptionsBuilder, CallResult, Context, KeyType, RedisError, RedisResult,
    RedisString, RedisValue,
};
use tollgate::inside::{Prepared, Ttl, Write};

/// Rules prepared from their arguments: by their tier argument, then their rule argument
/// (rules of one tier argument differ in their algorithm alone). Bounded: cleared when full.
/// Redis runs commands on one thread, so each thread's own map is the only one.
type Rules = HashMap<Vec<u8>, Vec<(Vec<u8>, Prepared)>>;

/// The most tier arguments kept.
const MAX_RULES: usize = 1_000;

thread_local! {
    static RULES: RefCell<Rules> = RefCell::new(HashMap::new());
}

/// `TOLLGATE.CHECK key check rule tiers`: the reply of the Lua function of the rule's
/// algorithm, six little-endian doubles per tier.
fn check(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let [_, key, attempt, rule, tiers] = args.as_slice() else {
        return Err(RedisError::WrongArity);
    };
    let (attempt, rule, tiers) = (unled(attempt)?, unled(rule)?, unled(tiers)?);
    let outcome = with_prepared(rule, tiers, |prepared| {
        let handle = ctx.open_key(key);
        if !matches!(handle.key_type(), KeyType::Empty | KeyType::String) {
            return Err(RedisError::WrongType);
        }
        prepared
            .check(attempt, handle.read()?, server_micros)
            .map_err(refused)
    })?;
    match outcome.write {
        Write::Nothing => {}
        Write::Delete => replicated(ctx, "DEL", &[key.as_slice()])?,
        Write::Set { value, ttl } => {
            let (option, ms) = match ttl {
                Ttl::Keep => ("KEEPTTL", None),
                Ttl::At(ms) => ("PXAT", Some(ms.to_string())),
                Ttl::In(ms) => ("PX", Some(ms.to_string())),
            };
            let mut set: Vec<&[u8]> = vec![key.as_slice(), &value, option.as_bytes()];
            set.extend(ms.as_ref().map(String::as_bytes));
            replicated(ctx, "SET", &set)?;
        }
    }
    Ok(RedisValue::StringBuffer(outcome.reply))
}

/// Calls `f` with the rule of `rule` and `tiers`, prepared once.
fn with_prepared<T>(
    rule: &[u8],
    tiers: &[u8],
    f: impl FnOnce(&Prepared) -> Result<T, RedisError>,
) -> Result<T, RedisError> {
    RULES.with_borrow_mut(|rules| {
        let known = rules
            .get(tiers)
            .and_then(|of_tiers| of_tiers.iter().find(|(r, _)| r.as_slice() == rule));
        if let Some((_, prepared)) = known {
            return f(prepared);
        }
        let prepared = Prepared::new(rule, tiers).map_err(refused)?;
        if rules.len() >= MAX_RULES {
            rules.clear();
        }
        let of_tiers = rules.entry(tiers.to_vec()).or_default();
        of_tiers.push((rule.to_vec(), prepared));
        f(&of_tiers.last().expect("just pushed").1)
    })
}

/// An argument after the key, without the NUL byte that leads it.
fn unled(arg: &RedisString) -> Result<&[u8], RedisError> {
    tollgate::inside::unled(arg.as_slice()).ok_or(RedisError::Str(
        "ERR tollgate: an argument is not led by a NUL byte",
    ))
}

fn refused(refused: tollgate::inside::Refused) -> RedisError {
    RedisError::String(format!("ERR tollgate: {refused}"))
}

/// Calls `command` with `args`, replicated to replicas and the AOF as it is.
fn replicated(ctx: &Context, command: &str, args: &[&[u8]]) -> Result<(), RedisError> {
    thread_local! {
        static REPLICATED: CallOptions = CallOptionsBuilder::new().replicate().errors_as_replies().build();
    }
    REPLICATED.with(
        |options| match ctx.call_ext::<_, CallResult>(command, options, args) {
            Ok(_) => Ok(()),
            Err(err) => Err(RedisError::String(
                err.to_utf8_string()
                    .unwrap_or_else(|| format!("ERR tollgate: {command} failed")),
            )),
        },
    )
}

/// The server's time of the command being run (µs since the Unix epoch), as scripts see it;
/// on a server too old to cache it, the server's time now, in milliseconds.
fn server_micros() -> u64 {
    // SAFETY: Redis fills these pointers when the module loads (the first on Redis 7 and
    // later); each takes no arguments and reads the server's clock.
    let micros = unsafe {
        match redis_module::raw::RedisModule_CachedMicroseconds {
            Some(cached) => cached(),
            None => redis_module::raw::RedisModule_Milliseconds.map_or(0, |ms| ms() * 1_000),
        }
    };
    u64::try_from(micros).unwrap_or(0)
}

/// The module's entry points (`RedisModule_OnLoad`), which Redis calls by name.
#[allow(missing_docs)]
mod entry {
    use super::check;
    use redis_module::redis_module;

    redis_module! {
        name: "tollgate",
        version: 1,
        allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
        data_types: [],
        commands: [
            ["tollgate.check", check, "write deny-oom", 1, 1, 1, ""],
        ],
    }
}
