//! The API a Rust service calls: one rule, limited in process memory.

use std::future::Future;
use std::time::Duration;

use crate::algorithm::Attempt;
use crate::clock::{Clock, MAX_TIMESTAMP, SystemClock};
use crate::decision::Decision;
use crate::error::Error;
use crate::rule::Rule;
use crate::store::{MemoryConfig, MemoryStore};

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 4_096;

/// Limits the keys of one [`Rule`] in process memory.
///
/// [`check`](Self::check) answers at once and never blocks; [`acquire`](Self::acquire) waits
/// until admitted or until its timeout. Keys are arbitrary bytes. Thread-safe: share one
/// limiter (e.g. in an `Arc`) between threads and tasks; it is deliberately not `Clone`, since
/// independent copies would not share counts.
#[derive(Debug)]
pub struct Limiter<C: Clock = SystemClock> {
    rule: Rule,
    store: MemoryStore,
    clock: C,
}

impl Limiter {
    /// A limiter for `rule` on the system clock, holding at most a million keys.
    pub fn new(rule: Rule) -> Self {
        Self::builder(rule).build()
    }

    /// Configures a limiter for `rule`.
    pub fn builder(rule: Rule) -> LimiterBuilder {
        LimiterBuilder {
            rule,
            clock: SystemClock::new(),
            config: MemoryConfig::default(),
        }
    }
}

impl<C: Clock> Limiter<C> {
    /// Decides whether `key` may take `cost` permits now, and takes them if so. A cost of 0
    /// looks without taking. Never blocks.
    ///
    /// # Errors
    /// [`Error::CostExceedsCapacity`] when a tier can never admit `cost`;
    /// [`Error::KeyTooLong`] beyond [`MAX_KEY_LEN`] bytes. A denial is not an error.
    #[inline]
    pub fn check(&self, key: impl AsRef<[u8]>, cost: u64) -> Result<Decision, Error> {
        let key = key.as_ref();
        validate(&self.rule, key, cost)?;
        Ok(self.attempt(key, cost, None))
    }

    /// Waits until `key` may take `cost` permits, takes them, and returns the decision; fails
    /// with [`Error::Timeout`] as soon as it is clear that `timeout` is not enough. A shaping
    /// algorithm (leaky bucket shaper, warm-up) reserves its turn and this waits out the delay.
    ///
    /// Waiting callers are not queued: when permits free up, whoever checks first takes them.
    ///
    /// # Errors
    /// As [`check`](Self::check), plus [`Error::Timeout`].
    pub async fn acquire(
        &self,
        key: impl AsRef<[u8]>,
        cost: u64,
        timeout: Duration,
    ) -> Result<Decision, Error> {
        let key = key.as_ref();
        validate(&self.rule, key, cost)?;
        let attempt = |patience| std::future::ready(self.attempt(key, cost, Some(patience)));
        wait_until_admitted(&self.clock, timeout, attempt).await
    }

    /// The rule this limiter enforces.
    pub fn rule(&self) -> &Rule {
        &self.rule
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Keys whose state is held now.
    pub fn keys(&self) -> usize {
        self.store.len()
    }

    /// Keys forgotten while their state still mattered, because the store was full.
    pub fn evictions(&self) -> u64 {
        self.store.evictions()
    }

    /// Decides one check now; `max_delay` as in [`Attempt`].
    #[inline]
    pub(crate) fn attempt(&self, key: &[u8], cost: u64, max_delay: Option<u64>) -> Decision {
        let attempt = Attempt {
            now: now(&self.clock),
            cost,
            max_delay,
            commit: true,
        };
        self.store.check(&self.rule, key, attempt)
    }
}

/// Rejects a key or a cost that no check of `rule` can accept.
#[inline]
pub(crate) fn validate(rule: &Rule, key: &[u8], cost: u64) -> Result<(), Error> {
    if key.len() > MAX_KEY_LEN {
        return Err(Error::KeyTooLong {
            len: key.len(),
            max: MAX_KEY_LEN,
        });
    }
    rule.check_cost(cost)
}

/// Now, kept within the range the algorithms accept (0 means "never" in state words).
#[inline]
pub(crate) fn now(clock: &impl Clock) -> u64 {
    clock.now_micros().clamp(1, MAX_TIMESTAMP)
}

/// Repeats `attempt(patience)` until it admits, sleeping on `clock` for the delay a shaper
/// gave or the wait a denial asked for; gives up as soon as that wait exceeds what is left of
/// `timeout`, without sleeping first. `patience` is the µs left before the deadline.
pub(crate) async fn wait_until_admitted<F, Fut>(
    clock: &impl Clock,
    timeout: Duration,
    mut attempt: F,
) -> Result<Decision, Error>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Decision>,
{
    let timeout_micros = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX);
    let deadline = now(clock).saturating_add(timeout_micros);
    loop {
        let patience = deadline.saturating_sub(now(clock));
        let decision = attempt(patience).await;
        if decision.allowed() {
            if decision.delay_micros() > 0 {
                clock.sleep(decision.delay()).await;
            }
            return Ok(decision);
        }
        if decision.retry_after_micros() > patience {
            return Err(Error::Timeout { timeout, decision });
        }
        clock
            .sleep(Duration::from_micros(decision.retry_after_micros()))
            .await;
    }
}

/// Configures a [`Limiter`].
#[derive(Debug)]
pub struct LimiterBuilder<C: Clock = SystemClock> {
    rule: Rule,
    clock: C,
    config: MemoryConfig,
}

impl<C: Clock> LimiterBuilder<C> {
    /// Reads time from `clock` (e.g. a [`ManualClock`](crate::ManualClock) in tests).
    pub fn clock<D: Clock>(self, clock: D) -> LimiterBuilder<D> {
        LimiterBuilder {
            rule: self.rule,
            clock,
            config: self.config,
        }
    }

    /// Holds at most about `max_keys` keys (default a million): rounded up to a multiple of
    /// the shard count, each shard holding its share. A new key in a full shard evicts the
    /// keys closest to idle.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.config.max_keys = max_keys;
        self
    }

    /// Splits the keys over `shards` independently locked shards (rounded up to a power of
    /// two; default eight per CPU, at least 16).
    pub fn shards(mut self, shards: usize) -> Self {
        self.config.shards = shards;
        self
    }

    /// Drops idle keys at most this often, when new keys arrive (default one second).
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.config.sweep_interval = interval;
        self
    }

    /// Builds the limiter.
    pub fn build(self) -> Limiter<C> {
        Limiter {
            store: MemoryStore::new(&self.rule, self.config),
            rule: self.rule,
            clock: self.clock,
        }
    }
}
