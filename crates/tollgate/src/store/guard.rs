//! What a remote store does when its backend fails or is slow: each rule's
//! [`FailurePolicy`] decides, the time a check may wait for the backend is bounded, and a
//! circuit breaker, one per backend, keeps checks away from a backend that keeps failing.
//!
//! Every remote store (Redis strict, hybrid, lease) holds one guard and sends its backend
//! calls through [`Guard::decide`]; the guard never returns a backend error to the caller.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::breaker::{Breaker, Gate};
use super::memory::{MemoryPlan, MemoryStore};
use super::{LocalStore, Planned, Store};
use crate::decision::{Decision, Decisions, Source, Verdict};
use crate::error::Error;
use crate::rule::{FailurePolicy, Rule};

/// Settings of a guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GuardConfig {
    /// The longest a check waits for the backend.
    pub(crate) timeout: Duration,
    /// Consecutive failures that open the breaker.
    pub(crate) failures: u32,
    /// How long an open breaker keeps checks away before one probes.
    pub(crate) cooldown: Duration,
}

impl Default for GuardConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(20),
            failures: 5,
            cooldown: Duration::from_secs(1),
        }
    }
}

/// The failure policy of one backend's rules; see the module documentation.
#[derive(Debug)]
pub(crate) struct Guard {
    config: GuardConfig,
    breaker: Breaker,
    /// Where rules that fall back to a local share keep their state.
    fallback: MemoryStore,
    /// Names the backend in logs.
    backend: &'static str,
    /// Backend calls that failed with an error, and that did not answer within the timeout.
    errors: AtomicU64,
    timeouts: AtomicU64,
}

/// Calls to a shared store's backend that failed, since the store was opened (its clones
/// share the counts). A check the circuit breaker keeps away makes no call and counts in
/// neither.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreFailures {
    /// Calls answered with an error, or lost with their connection.
    pub errors: u64,
    /// Calls not answered within the store's timeout.
    pub timeouts: u64,
}

/// What a rule needs of the guard: its local share, planned on the fallback store.
#[derive(Debug, Clone)]
pub(crate) struct GuardPlan {
    local: Option<(Rule, MemoryPlan)>,
}

impl GuardPlan {
    /// The plan of a rule that does not fall back to a local share.
    #[cfg(test)]
    pub(crate) fn none() -> Self {
        Self { local: None }
    }
}

/// A remote store's plan, which carries its guard plan.
pub(crate) trait Guarded {
    fn guard(&self) -> &GuardPlan;
}

impl Guard {
    pub(crate) fn new(config: GuardConfig, backend: &'static str) -> Self {
        let cooldown = u64::try_from(config.cooldown.as_micros()).unwrap_or(u64::MAX);
        Self {
            config,
            breaker: Breaker::new(config.failures, cooldown),
            fallback: MemoryStore::new(),
            backend,
            errors: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
        }
    }

    pub(crate) fn config(&self) -> GuardConfig {
        self.config
    }

    /// Whether the backend is being kept away now (the failure policy decides every check).
    pub(crate) fn degraded(&self) -> bool {
        self.breaker.is_open()
    }

    /// The backend calls that failed so far.
    pub(crate) fn failures(&self) -> StoreFailures {
        StoreFailures {
            errors: self.errors.load(Ordering::Relaxed),
            timeouts: self.timeouts.load(Ordering::Relaxed),
        }
    }

    /// Whether the guard can hold `rule`'s local share (as [`plan`](Self::plan) would say).
    pub(crate) fn holds(rule: &Rule) -> Result<(), Error> {
        match rule.local() {
            Some(local) => super::memory::fits(local, MemoryStore::DEFAULT_MAX_BYTES),
            None => Ok(()),
        }
    }

    pub(crate) fn plan(&self, rule: &Rule) -> Result<GuardPlan, Error> {
        let local = match rule.local() {
            Some(local) => Some((local.clone(), self.fallback.plan(local)?)),
            None => None,
        };
        Ok(GuardPlan { local })
    }

    /// Decides `items` by `remote()`, the backend's answer, unless the breaker keeps the
    /// backend away; when the backend fails or does not answer within the timeout, by each
    /// rule's failure policy. Cancelling the returned future is safe at any point.
    pub(crate) async fn decide<P: Guarded, F, Fut>(
        &self,
        items: &[Planned<'_, P>],
        now: u64,
        max_delay: Option<u64>,
        remote: F,
    ) -> Decisions
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Decisions, Error>>,
    {
        let probe = match self.breaker.gate(now) {
            Gate::Open { retry_after } => {
                return self.by_policy(items, now, max_delay, retry_after);
            }
            Gate::Pass(probe) => probe,
        };
        let failure = match tokio::time::timeout(self.config.timeout, remote()).await {
            Ok(Ok(decisions)) => {
                if self.breaker.success(probe) {
                    tracing::info!(
                        backend = self.backend,
                        "store answers again; limiting resumed"
                    );
                }
                return decisions;
            }
            Ok(Err(err)) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                err.to_string()
            }
            Err(_) => {
                self.timeouts.fetch_add(1, Ordering::Relaxed);
                format!("no answer within {:?}", self.config.timeout)
            }
        };
        if self.breaker.failure(now, probe) {
            tracing::warn!(
                backend = self.backend,
                error = failure,
                "store is failing; rules decide by their failure policy until it answers again"
            );
        }
        self.by_policy(items, now, max_delay, self.breaker.cooldown())
    }

    /// The decisions of the failure policies; `retry_after` (µs) is when the backend is asked
    /// again. All-or-nothing as ever: a rule failing closed denies the batch, and then the
    /// rules that fall back to their local share consume nothing either.
    pub(crate) fn by_policy<P: Guarded>(
        &self,
        items: &[Planned<'_, P>],
        now: u64,
        max_delay: Option<u64>,
        retry_after: u64,
    ) -> Decisions {
        let mut decisions: Vec<Option<Decision>> = Vec::with_capacity(items.len());
        let mut local = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let decision = match (item.rule.failure_policy(), &item.plan.guard().local) {
                (FailurePolicy::Local { .. }, Some((rule, _))) if item.cost > rule.capacity() => {
                    // The share alone can never admit this cost; the shared store may again.
                    let limit = rule.capacity();
                    let verdict = Verdict::deny(limit, limit, retry_after, retry_after);
                    Some(Decision::of(rule, 0, verdict).with_source(Source::Fallback))
                }
                (FailurePolicy::Local { .. }, Some((rule, plan))) => {
                    local.push((i, rule, plan));
                    None
                }
                (FailurePolicy::Closed, _) => {
                    Some(Decision::unchecked(item.rule, Some(retry_after)))
                }
                _ => Some(Decision::unchecked(item.rule, None)),
            };
            decisions.push(decision.map(|d| d.shadow(item.rule.is_shadow())));
        }
        let blocked = decisions.iter().flatten().any(|d| !d.allowed());
        if !local.is_empty() {
            let fallback: Vec<Planned<'_, MemoryPlan>> = local
                .iter()
                .map(|&(i, rule, plan)| Planned {
                    rule,
                    plan,
                    key: items[i].key,
                    // A denied batch consumes nothing: the local share only looks.
                    cost: if blocked { 0 } else { items[i].cost },
                })
                .collect();
            let answers = self.fallback.check_now(&fallback, now, max_delay);
            for (&(i, _, _), answer) in local.iter().zip(answers.iter()) {
                decisions[i] = Some(answer.with_source(Source::Fallback));
            }
        }
        Decisions::many(
            decisions
                .into_iter()
                .map(|d| d.expect("every item decided"))
                .collect(),
        )
    }
}
