//! The API a Rust service calls to limit across instances: one rule, state in Redis.

use std::time::Duration;

use crate::algorithm::Decide;
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Source};
use crate::error::{Error, RuleError};
use crate::limiter::{Limiter, now, validate, wait_until_admitted};
use crate::rule::Rule;
use crate::store::{Breaker, Gate, Plan, RedisStore};

/// What a rule does when Redis fails: answers with an error, or not within the timeout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FailurePolicy {
    /// Admit without counting: availability before protection.
    Open,
    /// Deny until Redis answers again: protection before availability.
    Closed,
    /// Limit in this process, with `share` (above 0, at most 1) of every tier's limit and
    /// burst: each instance enforces its share, e.g. `1 / instances`.
    Local {
        /// The fraction of each limit this instance enforces alone.
        share: f64,
    },
}

/// Whose clock a script decides at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreTime {
    /// The Redis server's `TIME`: instances whose clocks disagree still agree on windows.
    Server,
    /// The limiter's own clock, sent with each check: for tests on a manual clock. Keys then
    /// live a minute longer by the server's clock than the limiter's clock says they must.
    Local,
}

/// Limits the keys of one [`Rule`] across every instance that shares a Redis server or
/// cluster. Exact under any concurrency: each check is one atomic script, all tiers at once.
///
/// When Redis fails or does not answer within the timeout (20 ms by default), the rule's
/// [`FailurePolicy`] decides, and [`Decision::source`] says so. After 5 consecutive failures a
/// circuit breaker stops asking Redis for a cooldown (1 s), then lets one check probe it; the
/// first answer resumes strict limiting. Checks never panic and never wait longer than the
/// timeout. A check that timed out may still be counted if Redis answers it later.
#[derive(Debug)]
pub struct RedisLimiter<C: Clock + Clone = SystemClock> {
    rule: Rule,
    plan: Plan,
    store: RedisStore,
    clock: C,
    time: StoreTime,
    policy: FailurePolicy,
    timeout: Duration,
    breaker: Breaker,
    fallback: Option<Limiter<C>>,
}

impl RedisLimiter {
    /// Configures a limiter for `rule` on `store`.
    pub fn builder(rule: Rule, store: RedisStore) -> RedisLimiterBuilder {
        RedisLimiterBuilder {
            rule,
            store,
            clock: SystemClock::new(),
            time: StoreTime::Server,
            policy: FailurePolicy::Open,
            timeout: Duration::from_millis(20),
            failures: 5,
            cooldown: Duration::from_secs(1),
        }
    }
}

impl<C: Clock + Clone> RedisLimiter<C> {
    /// Decides whether `key` may take `cost` permits now, and takes them if so, in one round
    /// trip. A cost of 0 looks without taking.
    ///
    /// # Errors
    /// As [`Limiter::check`]. A failing store is not an error: the policy decides.
    pub async fn check(&self, key: impl AsRef<[u8]>, cost: u64) -> Result<Decision, Error> {
        let key = key.as_ref();
        validate(&self.rule, key, cost)?;
        Ok(self.decide(key, cost, None).await)
    }

    /// Waits until `key` may take `cost` permits, takes them, and returns the decision; fails
    /// with [`Error::Timeout`] as soon as it is clear that `timeout` is not enough.
    ///
    /// # Errors
    /// As [`Limiter::acquire`].
    pub async fn acquire(
        &self,
        key: impl AsRef<[u8]>,
        cost: u64,
        timeout: Duration,
    ) -> Result<Decision, Error> {
        let key = key.as_ref();
        validate(&self.rule, key, cost)?;
        let attempt = |patience| self.decide(key, cost, Some(patience));
        wait_until_admitted(&self.clock, timeout, attempt).await
    }

    /// The rule this limiter enforces.
    pub fn rule(&self) -> &Rule {
        &self.rule
    }

    /// The Redis keys that hold `key`'s state, for inspection.
    pub fn redis_keys(&self, key: impl AsRef<[u8]>) -> Vec<Vec<u8>> {
        self.plan.keys(key.as_ref())
    }

    async fn decide(&self, key: &[u8], cost: u64, max_delay: Option<u64>) -> Decision {
        let now = now(&self.clock);
        if let Gate::Open { retry_after } = self.breaker.gate(now) {
            return self.degraded(key, cost, max_delay, retry_after);
        }
        let at = (self.time == StoreTime::Local).then_some(now);
        let check = self.store.check(&self.plan, key, at, cost, max_delay);
        let failure = match tokio::time::timeout(self.timeout, check).await {
            Ok(Ok(decision)) => {
                if self.breaker.success() {
                    tracing::info!(
                        rule = self.rule.name(),
                        "redis answers again; strict limiting resumed"
                    );
                }
                return decision;
            }
            Ok(Err(err)) => err.to_string(),
            Err(_) => format!("no answer within {:?}", self.timeout),
        };
        if self.breaker.failure(now) {
            tracing::warn!(
                rule = self.rule.name(),
                error = failure,
                policy = ?self.policy,
                "redis is failing; deciding by policy until it answers again"
            );
        }
        self.degraded(key, cost, max_delay, self.breaker.cooldown())
    }

    /// The decision of the failure policy; `retry_after` (µs) is when Redis is asked again.
    fn degraded(
        &self,
        key: &[u8],
        cost: u64,
        max_delay: Option<u64>,
        retry_after: u64,
    ) -> Decision {
        if let Some(local) = &self.fallback {
            return local
                .attempt(key, cost, max_delay)
                .with_source(Source::Fallback);
        }
        let limit = self.rule.algorithm().capacity(&self.rule.tiers()[0]);
        match self.policy {
            FailurePolicy::Closed => Decision::unchecked(limit, Some(retry_after)),
            _ => Decision::unchecked(limit, None),
        }
    }
}

/// Configures a [`RedisLimiter`].
#[derive(Debug)]
pub struct RedisLimiterBuilder<C: Clock + Clone = SystemClock> {
    rule: Rule,
    store: RedisStore,
    clock: C,
    time: StoreTime,
    policy: FailurePolicy,
    timeout: Duration,
    failures: u32,
    cooldown: Duration,
}

impl<C: Clock + Clone> RedisLimiterBuilder<C> {
    /// The clock for waits, the circuit breaker and the local fallback (and for the scripts
    /// with [`StoreTime::Local`]).
    pub fn clock<D: Clock + Clone>(self, clock: D) -> RedisLimiterBuilder<D> {
        RedisLimiterBuilder {
            rule: self.rule,
            store: self.store,
            clock,
            time: self.time,
            policy: self.policy,
            timeout: self.timeout,
            failures: self.failures,
            cooldown: self.cooldown,
        }
    }

    /// Whose clock the scripts decide at (default: the server's).
    pub fn store_time(mut self, time: StoreTime) -> Self {
        self.time = time;
        self
    }

    /// What to do when Redis fails (default: [`FailurePolicy::Open`]).
    pub fn on_failure(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The longest a check waits for Redis before the failure policy decides (default 20 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Stop asking Redis after `failures` consecutive failures, for `cooldown`, then probe it
    /// with one check (defaults: 5 and 1 s).
    pub fn circuit_breaker(mut self, failures: u32, cooldown: Duration) -> Self {
        self.failures = failures;
        self.cooldown = cooldown;
        self
    }

    /// Builds the limiter.
    ///
    /// # Errors
    /// A [`RuleError`] when a local share is not in (0, 1] or the rule scaled to it is not valid.
    pub fn build(self) -> Result<RedisLimiter<C>, RuleError> {
        let fallback = match self.policy {
            FailurePolicy::Local { share } if !(share > 0.0 && share <= 1.0) => {
                return Err(RuleError {
                    rule: self.rule.name().into(),
                    field: "on_failure.share".into(),
                    reason: format!("{share} must be above 0 and at most 1"),
                });
            }
            FailurePolicy::Local { share } => {
                let local = self.rule.scaled(share)?;
                Some(Limiter::builder(local).clock(self.clock.clone()).build())
            }
            _ => None,
        };
        let cooldown = u64::try_from(self.cooldown.as_micros()).unwrap_or(u64::MAX);
        Ok(RedisLimiter {
            plan: Plan::new(&self.rule),
            rule: self.rule,
            store: self.store,
            clock: self.clock,
            time: self.time,
            policy: self.policy,
            timeout: self.timeout,
            breaker: Breaker::new(self.failures, cooldown),
            fallback,
        })
    }
}
