//! A check decided inside Redis by tollgate's module (`crates/tollgate-redis-module`): the
//! arguments the store sends, and the decision and write they come to, with no I/O. The module
//! reads the key, calls [`Prepared::check`] and carries out the [`Write`]; everything else is
//! here, on the same [`Algorithm`] code the memory store runs.
//!
//! The contract is the Lua functions' (`store/redis/lua/prelude.lua`, `words.lua`): the same
//! check and tier arguments (each led by a NUL byte, which [`unled`] takes off: see the
//! store's `module::check`), the same reply, and the same key, value and expiry written, so an
//! instance that calls the module and one that calls the functions can share keys. One more
//! argument names the algorithm with its own parameters (`rule_args`), as the Lua library
//! names it by the function called. Algorithms that keep their state in one string of words
//! run here: every one but the sliding log, whose Redis state is a sorted set per tier.
//!
//! Not a stable interface: a module and a store built from the same Lua code agree on it
//! ([`CONTRACT`]); a module of other code refuses the call, which the store then makes with
//! `FCALL`.

use std::time::Duration;

use crate::algorithm::{Algorithm, Attempt, Decide, Micros, Settle, Tier, Verdict};
use crate::layout::{self, ALGORITHMS, Header, Kept, batch, doubles, tier};
use crate::rule::Rule;

/// What a store and a module must share to decide alike: a hash (64-bit FNV-1a) of the Lua
/// functions' code, whose decisions the module's follow. The first eight bytes of the rule
/// argument: a module built from other code refuses the call, and the store calls the
/// functions.
pub const CONTRACT: u64 = {
    let mut hash = fnv1a(
        0xcbf2_9ce4_8422_2325,
        &[
            include_str!("store/redis/lua/batch.lua"),
            include_str!("store/redis/lua/counters.lua"),
            include_str!("store/redis/lua/layout.lua"),
            include_str!("store/redis/lua/log.lua"),
            include_str!("store/redis/lua/metered.lua"),
            include_str!("store/redis/lua/prelude.lua"),
            include_str!("store/redis/lua/reservations.lua"),
            include_str!("store/redis/lua/words.lua"),
        ],
    );
    let mut i = 0;
    while i < ALGORITHMS.len() {
        hash = fnv1a(hash, &[ALGORITHMS[i].name, ALGORITHMS[i].lua]);
        i += 1;
    }
    hash
};

const fn fnv1a(mut hash: u64, parts: &[&str]) -> u64 {
    let mut p = 0;
    while p < parts.len() {
        let bytes = parts[p].as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            hash ^= bytes[i] as u64;
            hash = hash.wrapping_mul(0x0100_0000_01b3);
            i += 1;
        }
        p += 1;
    }
    hash
}

/// Why the module refuses a call; its text is the error's, after `ERR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused(pub &'static str);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// What the error of a module built from other code (another [`CONTRACT`]) says: the store
/// calls the functions instead.
pub const OTHER_VERSION: &str = "tollgate module of other code";

/// Whether the module decides checks of `algorithm`: those whose state is words.
pub(crate) fn runs(algorithm: &Algorithm) -> bool {
    layout::kept(algorithm) == Kept::Words
}

/// The argument that names a rule's algorithm to the module: [`CONTRACT`] (eight bytes,
/// little-endian), then three little-endian doubles: the algorithm's index (see
/// `layout::ALGORITHMS`) and its own parameters (`Decide::module_parameters`).
#[cfg(feature = "redis")]
pub(crate) fn rule_args(algorithm: &Algorithm) -> Vec<u8> {
    let [p1, p2] = algorithm.module_parameters();
    let doubles = [layout::index(algorithm) as f64, p1, p2];
    let doubles = doubles.into_iter().flat_map(f64::to_le_bytes);
    CONTRACT.to_le_bytes().into_iter().chain(doubles).collect()
}

/// A binary argument without the NUL byte that leads it, or `None` when none does.
pub fn unled(arg: &[u8]) -> Option<&[u8]> {
    arg.strip_prefix(&[0])
}

/// A whole number below 2^53, as every quantity of the contract is.
fn whole(x: f64) -> Result<u64, Refused> {
    layout::whole(x).map_err(Refused)
}

/// The algorithm `rule_args` names.
fn algorithm_of(args: &[u8]) -> Result<Algorithm, Refused> {
    let not_rule = Refused("the rule argument is not a contract and three doubles");
    let (contract, rest) = args.split_first_chunk::<8>().ok_or(not_rule)?;
    if u64::from_le_bytes(*contract) != CONTRACT {
        return Err(Refused(OTHER_VERSION));
    }
    let d: Vec<f64> = doubles(rest)
        .filter(|d| d.len() == 3)
        .ok_or(not_rule)?
        .collect();
    let listed = usize::try_from(whole(d[0])?)
        .ok()
        .and_then(|i| ALGORITHMS.get(i.checked_sub(1)?))
        .ok_or(Refused("no such algorithm in this module"))?;
    (listed.of)([d[1], d[2]]).map_err(Refused)
}

/// A rule as the module decides it, from its arguments; cheap to keep, as a module keeps the
/// rules it has seen.
#[derive(Debug, Clone)]
pub struct Prepared {
    rule: Rule,
    /// State words of every tier: the key's value is this many doubles.
    words: usize,
    /// Per state word, whether it holds a double's bits (see `Decide::double_words`).
    doubles: Vec<bool>,
}

impl Prepared {
    /// The rule of `rule_args` (what the store's `rule_args` makes) and `tier_args` (eleven
    /// doubles per tier, as the functions read them).
    ///
    /// # Errors
    /// [`Refused`] when the arguments are not those a store of this version sends for a rule
    /// it accepted: the module decides nothing it would decide differently from the functions.
    pub fn new(rule_args: &[u8], tier_args: &[u8]) -> Result<Self, Refused> {
        let algorithm = algorithm_of(rule_args)?;
        let fields: Vec<f64> = doubles(tier_args)
            .filter(|d| d.len() % tier::DOUBLES == 0 && d.len() > 0)
            .ok_or(Refused("the tier argument is not eleven doubles per tier"))?
            .collect();
        let mut tiers = Vec::with_capacity(fields.len() / tier::DOUBLES);
        for t in fields.chunks_exact(tier::DOUBLES) {
            let (limit, period) = (whole(t[tier::LIMIT])?, whole(t[tier::PERIOD])?);
            let parameters = &t[tier::PARAMETERS..tier::DOUBLES];
            let tier = if algorithm.takes_calendar() && parameters[4] == 1.0 {
                let bounds = [
                    whole(parameters[0])?,
                    whole(parameters[1])?,
                    whole(parameters[2])?,
                    whole(parameters[3])?,
                ];
                Tier::given_windows(limit, period, bounds)
            } else {
                let tier = Tier::new(limit, Duration::from_micros(period));
                let burst = whole(t[tier::BURST])?;
                let tier = if burst == limit {
                    tier
                } else {
                    tier.with_burst(burst)
                };
                if algorithm.script_parameters(&tier).as_slice() != parameters {
                    return Err(Refused("the tier parameters are not the algorithm's"));
                }
                tier
            };
            let rate = tier.rate();
            let same = [tier.burst(), rate.per_permit, rate.per_micro, {
                algorithm.words(&tier) as u64
            }];
            let sent = [tier::BURST, tier::PER_PERMIT, tier::PER_MICRO, tier::WORDS].map(|i| t[i]);
            if same.map(|n| n as f64) != sent {
                return Err(Refused("the tier arguments are not the algorithm's"));
            }
            tiers.push(tier);
        }
        let rule = Rule::new("module", algorithm, tiers)
            .map_err(|_| Refused("the rule is not one tollgate accepts"))?;
        if !runs(rule.algorithm()) {
            return Err(Refused("the sliding log is not decided by the module"));
        }
        let words = rule.words();
        let mut doubles = vec![false; words];
        for i in 0..rule.tiers().len() {
            let first = rule.tier_words(i).start;
            for &j in rule.algorithm().double_words() {
                doubles[first + j] = true;
            }
        }
        Ok(Self {
            rule,
            words,
            doubles,
        })
    }

    /// Decides the check of `attempt_args` (six doubles, as the functions read them) on a key
    /// whose value is `stored` (`None`: no such key), at the caller's time or, when it sends
    /// none, at `server_now()` (µs since the Unix epoch). As `words` in `lua/words.lua`: every
    /// tier consumes or none does; a denial records only what a denial records.
    ///
    /// # Errors
    /// [`Refused`] for arguments of the wrong shape, a settlement (see [`settle`]), or a
    /// stored value that is not this rule's state.
    pub fn check(
        &self,
        attempt_args: &[u8],
        stored: Option<&[u8]>,
        server_now: impl FnOnce() -> u64,
    ) -> Result<Outcome, Refused> {
        let check = Check::new(attempt_args, server_now)?;
        let item = Item {
            prepared: self,
            cost: check.cost,
            shadow: false,
            stored,
        };
        // Unlike a batch's, a single check's look writes too: a state read as new (expired,
        // of an algorithm that forgets) is deleted, as `words` in `lua/words.lua` does.
        let mut write = Write::Nothing;
        let reply = decide_items(&check, &[item], true, true, |w| write = w)?;
        Ok(Outcome { reply, write })
    }

    /// Its rule.
    #[cfg(all(test, feature = "redis"))]
    pub(crate) fn rule(&self) -> &Rule {
        &self.rule
    }

    /// The state words of a key whose value is `stored` (`None`: no such key), read at `now`:
    /// as new when expired, for an algorithm that forgets (see `Decide::forgets`).
    fn state(&self, stored: Option<&[u8]>, now: u64) -> Result<Vec<u64>, Refused> {
        let mut state = vec![0u64; self.words];
        self.state_into(stored, now, &mut state)?;
        Ok(state)
    }

    /// [`Self::state`], into `state` (this rule's words, zeros).
    fn state_into(
        &self,
        stored: Option<&[u8]>,
        now: u64,
        state: &mut [u64],
    ) -> Result<(), Refused> {
        if let Some(value) = stored {
            self.read(value, state)?;
            let (rule, algorithm) = (&self.rule, self.rule.algorithm());
            if algorithm.forgets() && rule.expires_at(algorithm, state).get() <= now {
                state.fill(0);
            }
        }
        Ok(())
    }

    /// Reads the state words of `value`, as the functions keep them: a double per word.
    fn read(&self, value: &[u8], state: &mut [u64]) -> Result<(), Refused> {
        let not_state = Refused("the key holds no state of this rule");
        let doubles = doubles(value)
            .filter(|d| d.len() == self.words)
            .ok_or(not_state)?;
        for ((word, d), &double) in state.iter_mut().zip(doubles).zip(&self.doubles) {
            *word = match double {
                true => d.to_bits(),
                false => whole(d).map_err(|_| not_state)?,
            };
        }
        Ok(())
    }

    /// What to store for `state`, as good as new at `expires` (µs), the stored one at `kept`:
    /// as `write` in `lua/words.lua`.
    fn write(
        &self,
        stored: Option<&[u8]>,
        state: &[u64],
        expires: u64,
        kept: Option<u64>,
        clock: Clock,
    ) -> Write {
        let mut value = Vec::with_capacity(8 * state.len());
        for (&word, &double) in state.iter().zip(&self.doubles) {
            let double = match double {
                true => f64::from_bits(word),
                false => word as f64,
            };
            value.extend_from_slice(&double.to_le_bytes());
        }
        let unchanged = match stored {
            Some(stored) => stored == value.as_slice(),
            None => value.iter().all(|&b| b == 0),
        };
        if unchanged {
            return Write::Nothing;
        }
        if expires <= clock.now {
            return match stored {
                Some(_) => Write::Delete,
                None => Write::Nothing,
            };
        }
        let second = |t: u64| t.div_ceil(1_000_000) * 1_000_000;
        let at = second(expires);
        let ttl = if kept.is_some_and(|kept| at <= second(kept)) {
            Ttl::Keep
        } else if clock.server_time {
            Ttl::At((at as f64 / 1_000.0 + clock.ttl_padding) as i64)
        } else {
            Ttl::In((at - clock.now).div_ceil(1_000) as i64 + clock.ttl_padding as i64)
        };
        Write::Set { value, ttl }
    }
}

/// A check's argument: its time (µs since the Unix epoch) and cost, the longest delay its
/// caller accepts, what a settlement does, and how TTLs are written.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    now: u64,
    /// The cost of a check of one item; a batch's items have their own.
    cost: u64,
    max_delay: Option<u64>,
    /// A settlement's change, instead of a check.
    settle: Option<Settle>,
    clock: Clock,
}

impl Check {
    /// The check (or settlement) of `args` (six doubles, as the functions read them), at the
    /// caller's time or, when it sends none, at `server_now()`.
    ///
    /// # Errors
    /// [`Refused`] for an argument of the wrong shape, and on the server's time when
    /// `server_now()` is 0 (no clock read): never a decision at the epoch.
    pub fn new(args: &[u8], server_now: impl FnOnce() -> u64) -> Result<Self, Refused> {
        let header = Header::decode(args).map_err(Refused)?;
        let (server_time, now) = match header.at {
            None => match server_now() {
                0 => return Err(Refused("the server's clock could not be read")),
                now => (true, now),
            },
            Some(at) => (false, at.max(1)),
        };
        Ok(Self {
            now,
            cost: header.cost,
            max_delay: header.max_delay,
            settle: header.settle,
            clock: Clock {
                now,
                server_time,
                // Whole milliseconds, as a store sends: a TTL is never negative nor NaN.
                ttl_padding: header.ttl_padding as f64,
            },
        })
    }

    /// When it is decided (µs since the Unix epoch).
    pub fn now(&self) -> u64 {
        self.now
    }
}

/// One item of a batch: a key of a rule, checked for `cost`.
#[derive(Debug, Clone, Copy)]
pub struct Item<'a> {
    /// Its rule.
    pub prepared: &'a Prepared,
    /// Its cost.
    pub cost: u64,
    /// Whether its rule is in shadow mode: its denial does not deny the batch.
    pub shadow: bool,
    /// Its key's value (`None`: no such key).
    pub stored: Option<&'a [u8]>,
}

/// A batch's items as the batch function's second argument describes them (see
/// `lua/batch.lua`): whether it only looks, and each item's cost and shadow mode. Every item
/// must have one key: the module decides no sliding log.
///
/// # Errors
/// [`Refused`] for an argument of the wrong shape, or an item of several keys.
pub fn described(args: &[u8]) -> Result<(bool, Vec<(u64, bool)>), Refused> {
    let d: Vec<f64> = doubles(args)
        .filter(|d| d.len() % batch::ITEM == 1)
        .ok_or(Refused("the batch argument is not 1 + 4 doubles per item"))?
        .collect();
    let items = d[1..]
        .chunks_exact(batch::ITEM)
        .map(|item| match item[batch::KEYS] == 1.0 {
            true => Ok((whole(item[batch::COST])?, item[batch::SHADOW] == 1.0)),
            false => Err(Refused("the sliding log is not decided by the module")),
        })
        .collect::<Result<_, _>>()?;
    Ok((d[0] == f64::from(batch::LOOK), items))
}

/// Decides `items` all-or-nothing at `check`'s time, as `run_batch` in `lua/batch.lua`: every
/// item decides; if all admit (items in shadow mode aside) and `writes`, each admitted item's
/// cost is stored; when one denies, each item stores only what a denial records. Returns the
/// verdicts of every tier of every item in order (six little-endian doubles each), and each
/// item's write (nothing, unless `writes`). Items are read before any is written, as the
/// functions read them.
///
/// # Errors
/// [`Refused`] when a key holds no state of its rule.
pub fn decide(
    check: &Check,
    items: &[Item<'_>],
    writes: bool,
) -> Result<(Vec<u8>, Vec<Write>), Refused> {
    let mut stores = Vec::with_capacity(items.len());
    let reply = decide_items(check, items, writes, false, |write| stores.push(write))?;
    Ok((reply, stores))
}

/// [`decide`], giving each item's write to `store`, in order; with
/// `looks_write`, an item of no cost writes its state too (if it changed). Allocates the
/// reply, one vector of every item's words and what each decided, and the values written:
/// the module runs this on every check.
fn decide_items(
    check: &Check,
    items: &[Item<'_>],
    writes: bool,
    looks_write: bool,
    mut store: impl FnMut(Write),
) -> Result<Vec<u8>, Refused> {
    if check.settle.is_some() {
        return Err(Refused("a settlement is not a check"));
    }
    let tiers: usize = items.iter().map(|i| i.prepared.rule.tiers().len()).sum();
    let mut reply = Vec::with_capacity(layout::verdict::BYTES * tiers);
    // Every item's words, then two words per item: whether it was admitted, and when its
    // stored state was as good as new (read only where a key was stored).
    let words: usize = items.iter().map(|i| i.prepared.words).sum();
    let mut states = vec![0u64; words + 2 * items.len()];
    let (mut state, mut decided) = states.split_at_mut(words);
    let mut admitted = true;
    for item in items {
        let (rule, algorithm) = (&item.prepared.rule, item.prepared.rule.algorithm());
        // As the limiter does before any store: a cost no tier can admit is an error, not a
        // decision (the algorithms are not asked when it would be admitted).
        rule.check_cost(item.cost)
            .map_err(|_| Refused("a cost above the rule's capacity"))?;
        let (words, rest) = std::mem::take(&mut state).split_at_mut(item.prepared.words);
        state = rest;
        item.prepared.state_into(item.stored, check.now, words)?;
        let kept = match item.stored {
            Some(_) => rule.expires_at(algorithm, words).get(),
            None => 0,
        };
        let attempt = Attempt {
            now: Micros::new(check.now),
            cost: item.cost,
            max_delay: check.max_delay,
            commit: writes,
            settle: None,
        };
        let mut allowed = true;
        for (i, tier) in rule.tiers().iter().enumerate() {
            let verdict = algorithm.decide(tier, &mut words[rule.tier_words(i)], &attempt);
            allowed &= verdict.allowed;
            reply.extend(reply_of(&verdict));
        }
        admitted &= allowed || item.shadow;
        let (this, rest) = std::mem::take(&mut decided).split_at_mut(2);
        decided = rest;
        this.copy_from_slice(&[u64::from(allowed), kept]);
    }
    let (mut state, decided) = states.split_at_mut(words);
    for (item, d) in items.iter().zip(decided.chunks_exact(2)) {
        let (words, rest) = std::mem::take(&mut state).split_at_mut(item.prepared.words);
        state = rest;
        let (allowed, kept) = (d[0] == 1, item.stored.map(|_| d[1]));
        if !writes || (item.cost == 0 && !looks_write) || (admitted && !allowed) {
            store(Write::Nothing);
            continue;
        }
        let (rule, algorithm) = (&item.prepared.rule, item.prepared.rule.algorithm());
        if !admitted && item.cost > 0 {
            // What was read, which the denial records on: read again, as it is rarer than
            // keeping a copy of every admitted check's state.
            words.fill(0);
            item.prepared.state_into(item.stored, check.now, words)?;
            let attempt = Attempt {
                now: Micros::new(check.now),
                cost: item.cost,
                max_delay: check.max_delay,
                commit: true,
                settle: None,
            };
            rule.denied(algorithm, words, &attempt);
        }
        let expires = rule.expires_at(algorithm, words).get();
        store(
            item.prepared
                .write(item.stored, words, expires, kept, check.clock),
        );
    }
    Ok(reply)
}

/// Settles `items` at `check`'s time, each on its own, as `settle` in `lua/batch.lua`: each
/// item of a cost takes it whatever its key's state (a report), gives it back (a credit), or
/// renews as many slots held (a renewal, nothing to other algorithms), and is then looked at
/// (cost 0): every tier's verdict of every item in order, denied while a key is in debt; and
/// each item's write.
///
/// # Errors
/// [`Refused`] for a check that is not a settlement, or a key that holds no state of its
/// rule.
pub fn settle(check: &Check, items: &[Item<'_>]) -> Result<(Vec<u8>, Vec<Write>), Refused> {
    let settle = check.settle.ok_or(Refused("a check is not a settlement"))?;
    let (now, mut reply, mut stores) = (check.now, Vec::new(), Vec::with_capacity(items.len()));
    for item in items {
        let (rule, algorithm) = (&item.prepared.rule, item.prepared.rule.algorithm());
        let mut state = item.prepared.state(item.stored, now)?;
        // Nothing settled at no cost, nor renewed where no slot is held: the key stays as it
        // is, even one read as new.
        let changes =
            item.cost > 0 && (!matches!(settle, Settle::Renew) || algorithm.holds_slots());
        let kept = item
            .stored
            .map(|_| rule.expires_at(algorithm, &state).get());
        if changes {
            rule.settle_tiers(algorithm, &mut state, Micros::new(now), item.cost, settle);
        }
        let look = Attempt::look(Micros::new(now));
        for (i, tier) in rule.tiers().iter().enumerate() {
            let verdict = algorithm.decide(tier, &mut state[rule.tier_words(i)], &look);
            reply.extend(reply_of(&verdict));
        }
        stores.push(match changes {
            true => {
                let expires = rule.expires_at(algorithm, &state).get();
                item.prepared
                    .write(item.stored, &state, expires, kept, check.clock)
            }
            false => Write::Nothing,
        });
    }
    Ok((reply, stores))
}

/// The time of a check, and how its TTLs are written.
#[derive(Debug, Clone, Copy)]
struct Clock {
    now: u64,
    server_time: bool,
    /// Milliseconds added to every TTL.
    ttl_padding: f64,
}

/// One tier's verdict as the functions reply it: six little-endian doubles.
fn reply_of(v: &Verdict) -> impl Iterator<Item = u8> {
    layout::encode_verdict(v)
        .into_iter()
        .flat_map(f64::to_le_bytes)
}

/// What a check comes to: the reply, and what to store.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Six little-endian doubles per tier, as the functions reply.
    pub reply: Vec<u8>,
    /// What to do to the key.
    pub write: Write,
}

/// What a check does to its key.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Nothing: the state did not change.
    Nothing,
    /// `SET` the value, with its expiry.
    Set {
        /// The state words, as little-endian doubles.
        value: Vec<u8>,
        /// When the key expires.
        ttl: Ttl,
    },
    /// `DEL`: the state is as good as new.
    Delete,
}

/// When a key written expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ttl {
    /// As before (`KEEPTTL`).
    Keep,
    /// At this Unix time in milliseconds (`PXAT`), on the server's clock.
    At(i64),
    /// In this many milliseconds (`PX`), on the caller's.
    In(i64),
}
