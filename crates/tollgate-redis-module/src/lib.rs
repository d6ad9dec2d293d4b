//! tollgate's Redis module: checks decided inside Redis with the algorithm code the memory
//! store runs ([`tollgate::inside`]), on the same keys, values and expiries as tollgate's Lua
//! functions, so that instances with and without the module share keys. Load it with
//! `redis-server --loadmodule libtollgate_redis_module.so`; stores find it on their own.
//!
//! - `TOLLGATE.CHECK key check rule tiers`: one key of a rule, as its algorithm's function.
//! - `TOLLGATE.BATCH numkeys key... check items rule tiers [rule tiers ...]`: one key per item,
//!   all-or-nothing, as the batch function.
//! - `TOLLGATE.SETTLE`, with the arguments of `BATCH`: a report, give-back or renewal of each
//!   item's cost, as the settle function.
//!
//! Every argument after the keys is led by a NUL byte (see the store's `module::check`).
//! Keys are declared to Redis (`CHECK`: first key 1; the others through the get-keys API), so
//! Cluster routing, `COMMAND GETKEYS`, ACL key patterns and `CROSSSLOT` work as for any
//! command; flags `write deny-oom`. The time, when the caller sends none, is the server's
//! (`RedisModule_CachedMicroseconds`), never the machine's. Effects, not the command, are
//! replicated: the `SET ... PXAT` or `DEL` a check comes to, as Lua's are, so a replica or an
//! AOF needs no module and re-decides nothing.
//!
//! All the unsafe code of tollgate is here, in calls into Redis: directly on a check's path
//! (its arguments, its key and its write: each wrapper of `redis-module` there cost Redis
//! instructions per check), through `redis-module` elsewhere.

use std::cell::RefCell;

use hashbrown::HashMap;

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::{
    CallOptions, CallOptionsBuilder, CallResult, Context, RedisError, RedisResult, RedisString,
    RedisValue, Status, raw,
};
use tollgate::inside::{Check, Item, Prepared, Refused, Ttl, Write};

/// Rules prepared from their arguments: by their tier argument, then their rule argument
/// (rules of one tier argument differ in their algorithm alone). Bounded: cleared when full.
/// Redis runs commands on one thread, so each thread's own map is the only one.
type Rules = HashMap<Vec<u8>, Vec<(Vec<u8>, Prepared)>>;

/// The most tier arguments kept.
const MAX_RULES: usize = 1_000;

thread_local! {
    static RULES: RefCell<Rules> = RefCell::new(HashMap::new());
}

/// A command's arguments as Redis passes them. They live for the command and are neither
/// retained nor freed here: the crate's `RedisString`s retain and free each, which cost a
/// check as much as finding its rule.
type Args<'a> = &'a [*mut raw::RedisModuleString];

/// An argument's bytes, for as long as the command runs.
fn bytes(arg: &*mut raw::RedisModuleString) -> &[u8] {
    let mut len = 0;
    // SAFETY: Redis fills the pointer when the module loads (which `init` requires); `arg`
    // is an argument of the command being run, whose bytes Redis keeps until it returns.
    unsafe {
        let ptr_len = raw::RedisModule_StringPtrLen.expect("checked when the module loads");
        let bytes = ptr_len(*arg, &mut len);
        if bytes.is_null() {
            return &[];
        }
        std::slice::from_raw_parts(bytes.cast::<u8>(), len)
    }
}

/// Runs `command` on the arguments Redis passed, and answers its reply, or an error if it
/// panics: a panic must not take Redis down with it.
fn run(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    command: fn(&Context, Args<'_>) -> RedisResult,
) -> c_int {
    let context = Context::new(ctx);
    let args: Args<'_> = match usize::try_from(argc) {
        // SAFETY: Redis passes `argc` arguments at `argv`, alive while the command runs.
        Ok(n) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, n) },
        _ => &[],
    };
    let reply = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| command(&context, args)))
        .unwrap_or(Err(RedisError::Str(
            "ERR tollgate: the module failed to decide this check (a bug: please report it)",
        )));
    context.reply(reply) as c_int
}

/// Each command's entry, as Redis calls it: [`run`] with the command's function.
macro_rules! entries {
    ($($entry:ident => $command:ident),*) => {$(
        extern "C" fn $entry(
            ctx: *mut raw::RedisModuleCtx,
            argv: *mut *mut raw::RedisModuleString,
            argc: c_int,
        ) -> c_int {
            run(ctx, argv, argc, $command)
        }
    )*};
}

entries!(check => checked, batch => batched, settle => settled);

/// `TOLLGATE.CHECK key check rule tiers`: the reply of the Lua function of the rule's
/// algorithm, six little-endian doubles per tier.
fn checked(ctx: &Context, args: Args<'_>) -> RedisResult {
    let [_, key, check, rule, tiers] = args else {
        return Err(RedisError::WrongArity);
    };
    let (check, rule, tiers) = (unled(check)?, unled(rule)?, unled(tiers)?);
    let opened = Opened::new(ctx, *key)?;
    let outcome = with_rules(&[(rule, tiers)], |prepared| {
        prepared[0]
            .check(check, opened.value()?, server_micros)
            .map_err(refused)
    })?;
    opened.store(outcome.write)?;
    Ok(RedisValue::StringBuffer(outcome.reply))
}

/// `TOLLGATE.BATCH numkeys key... check items rule tiers [rule tiers ...]`: the reply of the
/// batch function, every tier's verdict of every item, then the time decided at (µs), all
/// little-endian doubles. `items` as the batch function's (one key per item).
fn batched(ctx: &Context, args: Args<'_>) -> RedisResult {
    of_items(ctx, args, true, |check, items, dry| {
        tollgate::inside::decide(check, items, !dry)
    })
}

/// `TOLLGATE.SETTLE numkeys key... check items rule tiers [rule tiers ...]`: the reply of the
/// settle function (a report, give-back or renewal of each item's cost, then every tier's
/// verdict of a look), as `TOLLGATE.BATCH` takes its arguments.
fn settled(ctx: &Context, args: Args<'_>) -> RedisResult {
    of_items(ctx, args, false, |check, items, _| {
        tollgate::inside::settle(check, items)
    })
}

/// A command of items (`TOLLGATE.BATCH`, `TOLLGATE.SETTLE`): reads their keys, `decides`
/// them (with whether the call only looks), carries out the writes, and answers the verdicts,
/// and the time decided at if `timed`.
fn of_items(
    ctx: &Context,
    args: Args<'_>,
    timed: bool,
    decides: impl FnOnce(&Check, &[Item<'_>], bool) -> Result<(Vec<u8>, Vec<Write>), Refused>,
) -> RedisResult {
    let n = args
        .get(1)
        .and_then(|n| std::str::from_utf8(bytes(n)).ok()?.parse::<usize>().ok())
        .filter(|&n| n > 0 && args.len() == 4 + 3 * n)
        .ok_or(RedisError::WrongArity)?;
    let keys = &args[2..2 + n];
    if ctx.is_keys_position_request() {
        for i in 0..n {
            ctx.key_at_pos((2 + i) as i32);
        }
        return Ok(RedisValue::NoReply);
    }
    let check = Check::new(unled(&args[2 + n])?, server_micros).map_err(refused)?;
    let (dry, described) = tollgate::inside::described(unled(&args[3 + n])?).map_err(refused)?;
    if described.len() != n {
        return Err(RedisError::Str("ERR tollgate: one key per item"));
    }
    let rules = args[4 + n..]
        .chunks_exact(2)
        .map(|pair| Ok((unled(&pair[0])?, unled(&pair[1])?)))
        .collect::<Result<Vec<_>, RedisError>>()?;
    let mut opened = keys
        .iter()
        .map(|&key| Opened::new(ctx, key).map(Some))
        .collect::<Result<Vec<_>, _>>()?;
    let (mut reply, writes) = with_rules(&rules, |prepared| {
        let values = opened
            .iter()
            .map(|key| key.as_ref().map_or(Ok(None), Opened::value))
            .collect::<Result<Vec<_>, _>>()?;
        let items: Vec<Item<'_>> = (0..n)
            .map(|i| Item {
                prepared: prepared[i],
                cost: described[i].0,
                shadow: described[i].1,
                stored: values[i],
            })
            .collect();
        decides(&check, &items, dry).map_err(refused)
    })?;
    // A key named twice is closed before any write and opened again for its own: a handle
    // left open across another's write of its key could point at what that write freed.
    for i in 1..n {
        if keys[..i]
            .iter()
            .any(|earlier| bytes(earlier) == bytes(&keys[i]))
        {
            opened[i] = None;
        }
    }
    for ((&key, write), opened) in keys.iter().zip(writes).zip(opened) {
        match opened {
            Some(opened) => opened.store(write)?,
            None => store(ctx, key, write)?,
        }
    }
    if timed {
        reply.extend((check.now() as f64).to_le_bytes());
    }
    Ok(RedisValue::StringBuffer(reply))
}

/// Calls `f` with the rules of `rules` (rule and tier arguments), each prepared once.
fn with_rules<T>(
    rules: &[(&[u8], &[u8])],
    f: impl FnOnce(&[&Prepared]) -> Result<T, RedisError>,
) -> Result<T, RedisError> {
    RULES.with_borrow_mut(|kept| {
        fn find<'k>(kept: &'k Rules, (rule, tiers): (&[u8], &[u8])) -> Option<&'k Prepared> {
            let of_tiers = kept.get(tiers)?;
            let found = of_tiers.iter().find(|(r, _)| r.as_slice() == rule);
            found.map(|(_, prepared)| prepared)
        }
        // Known already (every call but a rule's first): one lookup each, and for a single
        // rule, the most common call, no vector.
        if let [rule] = rules
            && let Some(prepared) = find(kept, *rule)
        {
            return f(&[prepared]);
        }
        let known: Option<Vec<&Prepared>> = rules.iter().map(|&r| find(kept, r)).collect();
        if let Some(prepared) = known {
            return f(&prepared);
        }
        for &(rule, tiers) in rules {
            if find(kept, (rule, tiers)).is_none() {
                let prepared = Prepared::new(rule, tiers).map_err(refused)?;
                if kept.len() + rules.len() > MAX_RULES {
                    kept.clear();
                }
                let of_tiers = kept.entry(tiers.to_vec()).or_default();
                of_tiers.push((rule.to_vec(), prepared));
            }
        }
        let prepared: Vec<&Prepared> = rules
            .iter()
            .map(|&r| find(kept, r).expect("kept above"))
            .collect();
        f(&prepared)
    })
}

/// Carries out `write` on `key`, replicated as it is.
fn store(ctx: &Context, key: *mut raw::RedisModuleString, write: Write) -> Result<(), RedisError> {
    match write {
        Write::Nothing => Ok(()),
        write => Opened::new(ctx, key)?.store(write),
    }
}

/// A key of a command, opened once to read and to write, and closed when dropped: a string
/// or no key. The module loads with `NO_IMPLICIT_SIGNAL_MODIFIED`, so closing it signals
/// nothing (a denial that writes nothing leaves `WATCH` and client tracking alone) and a
/// write signals the key itself.
struct Opened<'a> {
    ctx: &'a Context,
    name: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
}

impl<'a> Opened<'a> {
    fn new(ctx: &'a Context, name: *mut raw::RedisModuleString) -> Result<Self, RedisError> {
        let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
        // SAFETY: called on Redis's thread, within a command, with the context it gave it.
        let key = unsafe { api(raw::RedisModule_OpenKey)?(ctx.ctx, name, mode) };
        if key.is_null() {
            return Err(RedisError::Str("ERR tollgate: the key could not be opened"));
        }
        let opened = Self { ctx, name, key };
        // SAFETY: the key is open.
        match unsafe { api(raw::RedisModule_KeyType)?(key) } as isize {
            raw::REDISMODULE_KEYTYPE_EMPTY | raw::REDISMODULE_KEYTYPE_STRING => Ok(opened),
            _ => Err(RedisError::WrongType),
        }
    }

    /// The key's value, `None` when there is no such key.
    fn value(&self) -> Result<Option<&[u8]>, RedisError> {
        // SAFETY: the key is open and a string or empty; the bytes stay as they are until
        // the key is written or closed, both of which take `self`.
        unsafe {
            if api(raw::RedisModule_KeyType)?(self.key) as isize == raw::REDISMODULE_KEYTYPE_EMPTY {
                return Ok(None);
            }
            let mut len = 0;
            let read = raw::REDISMODULE_READ as c_int;
            let bytes = api(raw::RedisModule_StringDMA)?(self.key, &mut len, read);
            if bytes.is_null() {
                return Err(RedisError::Str("ERR tollgate: the key could not be read"));
            }
            Ok(Some(std::slice::from_raw_parts(bytes.cast::<u8>(), len)))
        }
    }

    /// Carries out `write`, replicated as it is.
    fn store(self, write: Write) -> Result<(), RedisError> {
        let (ctx, name) = (self.ctx, self.name);
        match write {
            Write::Nothing => Ok(()),
            Write::Delete => {
                // Closed first: `DEL` frees what the handle points to.
                drop(self);
                replicated(ctx, "DEL", &[bytes(&name)])
            }
            Write::Set { value, ttl } => {
                if let Some(written) = self.written(&value, ttl) {
                    return written;
                }
                drop(self);
                let (option, ms) = match ttl {
                    Ttl::Keep => ("KEEPTTL", None),
                    Ttl::At(ms) => ("PXAT", Some(ms.to_string())),
                    Ttl::In(ms) => ("PX", Some(ms.to_string())),
                };
                let mut set: Vec<&[u8]> = vec![bytes(&name), &value, option.as_bytes()];
                set.extend(ms.as_ref().map(String::as_bytes));
                replicated(ctx, "SET", &set)
            }
        }
    }

    /// What `SET key value` with `ttl` (`KEEPTTL`, `PXAT`, `PX`) does to the key, done
    /// through the key API rather than by calling `SET` (the call, its client, the command's
    /// lookup and its arguments' parsing, cost Redis a fifth of a check): the value written
    /// over the old one in place (the key's expiry kept) or into a new key, then the expiry
    /// set, the key signalled as modified (`WATCH`, client tracking) and the keyspace events
    /// `SET` fires notified, and the `SET` itself replicated, so that replicas and the AOF get
    /// what they get from the functions. `None`, having done nothing, on a server without
    /// absolute expiries in its module API (before Redis 6.2.2).
    fn written(&self, value: &[u8], ttl: Ttl) -> Option<Result<(), RedisError>> {
        let (ctx, name, handle) = (self.ctx.ctx, self.name, self.key);
        // SAFETY: Redis fills these pointers when the module loads, and they are called on
        // its thread, within a command, with the context it gave the command, on a key open
        // to write.
        unsafe {
            let (
                Some(dma),
                Some(truncate),
                Some(at),
                Some(after),
                Some(notify),
                Some(signal),
                Some(replicate),
                Some(expires),
            ) = (
                raw::RedisModule_StringDMA,
                raw::RedisModule_StringTruncate,
                raw::RedisModule_SetAbsExpire,
                raw::RedisModule_SetExpire,
                raw::RedisModule_NotifyKeyspaceEvent,
                raw::RedisModule_SignalModifiedKey,
                raw::RedisModule_Replicate,
                raw::RedisModule_GetAbsExpire,
            )
            else {
                return None;
            };
            let write = raw::REDISMODULE_WRITE as c_int;
            let mut len = 0;
            let mut bytes = dma(handle, &mut len, write);
            // A new key (or a value of another length) is made the value's length first: an
            // existing string keeps its expiry.
            if !bytes.is_null() && len != value.len() {
                if truncate(handle, value.len()) != raw::REDISMODULE_OK as c_int {
                    return Some(Err(RedisError::WrongType));
                }
                bytes = dma(handle, &mut len, write);
            }
            if bytes.is_null() || len != value.len() {
                return Some(Err(RedisError::WrongType));
            }
            std::ptr::copy_nonoverlapping(value.as_ptr(), bytes.cast::<u8>(), len);
            let expiry = match ttl {
                Ttl::Keep => None,
                Ttl::At(ms) => Some(at(handle, ms)),
                Ttl::In(ms) => Some(after(handle, ms)),
            };
            if expiry.is_some_and(|status| status != raw::REDISMODULE_OK as c_int) {
                return Some(Err(RedisError::Str(
                    "ERR tollgate: the key's expiry could not be set",
                )));
            }
            signal(ctx, name);
            notify(ctx, raw::REDISMODULE_NOTIFY_STRING, c"set".as_ptr(), name);
            if expiry.is_some() {
                notify(
                    ctx,
                    raw::REDISMODULE_NOTIFY_GENERIC,
                    c"expire".as_ptr(),
                    name,
                );
            }
            // The key as it is ("s"), the value's bytes ("b"), the option ("c"), the time
            // ("l"). An expiry in some milliseconds goes as the time it came to, as Redis 7
            // replicates `SET ... PX`: a replica, or the AOF read back later, would count from
            // its own now.
            let (set, value, len) = (
                c"SET".as_ptr(),
                value.as_ptr().cast::<std::os::raw::c_char>(),
                value.len(),
            );
            let status = match ttl {
                Ttl::Keep => replicate(
                    ctx,
                    set,
                    c"sbc".as_ptr(),
                    name,
                    value,
                    len,
                    c"KEEPTTL".as_ptr(),
                ),
                Ttl::At(_) | Ttl::In(_) => replicate(
                    ctx,
                    set,
                    c"sbcl".as_ptr(),
                    name,
                    value,
                    len,
                    c"PXAT".as_ptr(),
                    match ttl {
                        Ttl::At(ms) => ms,
                        _ => expires(handle),
                    },
                ),
            };
            if status != raw::REDISMODULE_OK as c_int {
                return Some(Err(RedisError::Str(
                    "ERR tollgate: the write could not be replicated",
                )));
            }
            Some(Ok(()))
        }
    }
}

impl Drop for Opened<'_> {
    fn drop(&mut self) {
        // SAFETY: the key was opened by `new` and is closed once.
        unsafe {
            if let Ok(close) = api(raw::RedisModule_CloseKey) {
                close(self.key)
            }
        }
    }
}

/// A function of Redis's module API, which Redis fills when the module loads.
fn api<F>(f: Option<F>) -> Result<F, RedisError> {
    f.ok_or(RedisError::Str(
        "ERR tollgate: this Redis lacks a module API call",
    ))
}

/// An argument after the key, without the NUL byte that leads it.
fn unled(arg: &*mut raw::RedisModuleString) -> Result<&[u8], RedisError> {
    tollgate::inside::unled(bytes(arg)).ok_or(RedisError::Str(
        "ERR tollgate: an argument is not led by a NUL byte",
    ))
}

fn refused(refused: Refused) -> RedisError {
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

/// Loads the module: its commands, with their flags and the position of their keys (the
/// first only, or through the get-keys API), and a key it closes is not signalled as
/// modified unless it was written (see [`Opened`]).
fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    type Handler =
        extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;
    let commands: [(&CStr, Handler, &CStr, c_int); 3] = [
        (c"tollgate.check", check, c"write deny-oom", 1),
        (c"tollgate.batch", batch, c"write deny-oom getkeys-api", 0),
        (c"tollgate.settle", settle, c"write deny-oom getkeys-api", 0),
    ];
    // SAFETY: Redis fills these pointers when the module loads, and calls this on its thread
    // with the context of the load.
    unsafe {
        let (Some(create), Some(_)) = (
            raw::RedisModule_CreateCommand,
            raw::RedisModule_StringPtrLen,
        ) else {
            ctx.log_warning("tollgate: this Redis lacks the module API calls the module needs");
            return Status::Err;
        };
        for (name, handler, flags, key) in commands {
            let created = create(
                ctx.ctx,
                name.as_ptr(),
                Some(handler),
                flags.as_ptr(),
                key,
                key,
                key,
            );
            if created != raw::REDISMODULE_OK as c_int {
                ctx.log_warning(&format!("tollgate: could not create {name:?}"));
                return Status::Err;
            }
        }
        if { raw::RedisModule_SetModuleOptions }.is_some() {
            ctx.set_module_options(raw::ModuleOptions::NO_IMPLICIT_SIGNAL_MODIFIED);
        }
    }
    Status::Ok
}

/// The module's entry points (`RedisModule_OnLoad`), which Redis calls by name.
#[allow(missing_docs)]
mod entry {
    use super::init;
    use redis_module::redis_module;

    redis_module! {
        name: "tollgate",
        version: 1,
        allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
        data_types: [],
        init: init,
    }
}
