//! What a remote store does when its backend fails or is slow: each rule's
//! [`FailurePolicy`] decides, the time a check may wait for the backend is bounded, and a
//! circuit breaker, one per backend (a server, or each node of a cluster), keeps checks away
//! from a backend that keeps failing, and only from it.
//!
//! Every remote store (Redis strict, hybrid, lease) holds one guard and sends its backend
//! calls through [`Guard::decide`]; the guard never returns a backend error to the caller.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::breaker::{Breaker, Gate, Probe};
use super::memory::{MemoryPlan, MemoryStore};
use super::{LocalStore, Planned, Store};
use crate::algorithm::Verdict;
use crate::decision::{Decision, Decisions, Source};
use crate::error::Error;
use crate::rule::{FailurePolicy, Rule};

/// When a bounded remote call must have answered (on Tokio's clock, which tests can pause).
pub(crate) type Deadline = tokio::time::Instant;

/// Settings of a guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GuardConfig {
    /// The longest a check waits for the backend.
    pub(crate) timeout: Duration,
    /// Consecutive failures that open the breaker.
    pub(crate) failures: u32,
    /// How long an open breaker keeps checks away before one probes.
    pub(crate) cooldown: Duration,
    /// How long after a backend is first asked a check may wait for its first answer (a
    /// connection being made, the function library being loaded), its failures not counted.
    pub(crate) startup: Duration,
}

impl Default for GuardConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(20),
            failures: 5,
            cooldown: Duration::from_secs(1),
            startup: Duration::from_secs(2),
        }
    }
}

/// The failure policy of one store's rules; see the module documentation.
#[derive(Debug)]
pub(crate) struct Guard {
    config: GuardConfig,
    /// The backend of a single server, and of the calls not bound to a node of a cluster.
    single: Arc<Backend>,
    /// Where rules that fall back to a local share keep their state.
    fallback: MemoryStore,
}

/// One backend of a guard, with a circuit breaker of its own: a server, or a node of a
/// cluster (the master of some slots), so that a dead node keeps only the checks of its own
/// slots away. Until it first answers, and for at most the start-up allowance after it was
/// first asked, a check may wait longer for it and its failures do not count: a connection
/// being made or a function library being loaded is not a failure of the backend.
#[derive(Debug)]
pub(crate) struct Backend {
    /// Names it in logs and metrics: `redis`, or a node's address.
    name: String,
    breaker: Breaker,
    errors: AtomicU64,
    timeouts: AtomicU64,
    answered: AtomicBool,
    born: Instant,
    /// Whether the node runs tollgate's Redis module.
    #[cfg(feature = "redis")]
    pub(crate) module: super::redis::Presence,
}

impl Backend {
    pub(crate) fn new(name: impl Into<String>, config: &GuardConfig) -> Self {
        let cooldown = u64::try_from(config.cooldown.as_micros()).unwrap_or(u64::MAX);
        Self {
            name: name.into(),
            breaker: Breaker::new(config.failures, cooldown),
            errors: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            answered: AtomicBool::new(false),
            born: Instant::now(),
            #[cfg(feature = "redis")]
            module: super::redis::Presence::default(),
        }
    }

    /// Its name: `redis`, or a node's address.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Whether checks are kept away from it now (its breaker is open).
    pub(crate) fn failing(&self) -> bool {
        self.breaker.is_open()
    }

    /// Its calls that failed so far.
    pub(crate) fn failures(&self) -> StoreFailures {
        StoreFailures {
            errors: self.errors.load(Ordering::Relaxed),
            timeouts: self.timeouts.load(Ordering::Relaxed),
        }
    }

    /// Whether it is still within its start-up allowance, never having answered.
    fn warming(&self, allowance: Duration) -> bool {
        !self.answered.load(Ordering::Relaxed) && self.born.elapsed() < allowance
    }

    /// Records an answer, with the probe if the check was one.
    fn success(&self, probe: Option<Probe<'_>>) {
        if !self.answered.load(Ordering::Relaxed) {
            self.answered.store(true, Ordering::Relaxed);
        }
        if self.breaker.success(probe) {
            tracing::info!(backend = self.name, "store answers again; limiting resumed");
        }
    }

    /// Records a failure at `now` (a timeout, or an error), with the probe if the check was
    /// one; within the start-up allowance the breaker does not count it.
    fn failure(
        &self,
        now: u64,
        why: &dyn std::fmt::Display,
        timeout: bool,
        probe: Option<Probe<'_>>,
        startup: Duration,
    ) {
        let counter = if timeout {
            &self.timeouts
        } else {
            &self.errors
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if self.warming(startup) {
            tracing::debug!(backend = self.name, error = %why, "not answering yet, starting");
            return;
        }
        if self.breaker.failure(now, probe) {
            tracing::warn!(
                backend = self.name,
                error = %why,
                "store is failing; rules decide by their failure policy until it answers again"
            );
        }
    }

    /// Records the outcome of a call made outside a guarded check (a write that goes on after
    /// its check was answered).
    pub(crate) fn record(&self, now: u64, outcome: Result<(), &Error>, config: &GuardConfig) {
        match outcome {
            Ok(()) => self.success(None),
            Err(e) => self.failure(now, e, false, None, config.startup),
        }
    }
}

/// The backends one check asks (a single server's; on a cluster, the nodes its slots are on),
/// and which of them answered: the guard gates the check on each one's breaker and records
/// each one's outcome.
#[derive(Debug)]
pub(crate) struct Route<'a> {
    backends: Backends<'a>,
    /// Whether the remote call answers by the deadline the guard gives it, so that the guard
    /// sets no timer of its own (see [`Route::bounded`]).
    bounded: bool,
    /// Bit `i`: backend `i` answered.
    answered: AtomicU64,
    /// The decisions, once they are known while writes are still under way: a timeout after
    /// that does not let the failure policy decide again.
    settled: std::sync::OnceLock<Decisions>,
}

#[derive(Debug)]
enum Backends<'a> {
    One(&'a Backend),
    Many(Vec<Arc<Backend>>),
}

impl<'a> Route<'a> {
    /// A check that asks `backend` alone.
    pub(crate) fn one(backend: &'a Backend) -> Self {
        Self {
            backends: Backends::One(backend),
            bounded: false,
            answered: AtomicU64::new(0),
            settled: std::sync::OnceLock::new(),
        }
    }

    /// A check that asks each of `backends` (at most 64; more share the last's fate).
    pub(crate) fn many(backends: Vec<Arc<Backend>>) -> Self {
        Self {
            backends: Backends::Many(backends),
            bounded: false,
            answered: AtomicU64::new(0),
            settled: std::sync::OnceLock::new(),
        }
    }

    /// This route, for a remote call that answers by the deadline it is given (a timeout
    /// error once it passes): one timer for many calls (a pipeline's) rather than one each.
    pub(crate) fn bounded(mut self) -> Self {
        self.bounded = true;
        self
    }

    fn len(&self) -> usize {
        match &self.backends {
            Backends::One(_) => 1,
            Backends::Many(many) => many.len(),
        }
    }

    /// The `i`th backend asked.
    pub(crate) fn get(&self, i: usize) -> &Backend {
        match &self.backends {
            Backends::One(one) => one,
            Backends::Many(many) => &many[i],
        }
    }

    /// Tells the guard that backend `i` answered.
    pub(crate) fn answered(&self, i: usize) {
        self.answered.fetch_or(1 << i.min(63), Ordering::Relaxed);
    }

    /// Says that the check is decided (`decisions`) though its writes are under way: from
    /// then on the guard answers with these, whatever the writes' timing.
    pub(crate) fn settle(&self, decisions: Decisions) {
        let _ = self.settled.set(decisions);
    }

    fn has_answered(&self, i: usize) -> bool {
        self.answered.load(Ordering::Relaxed) & (1 << i.min(63)) != 0
    }
}

/// Why the backends did not decide a guarded call.
#[derive(Debug)]
enum Unanswered {
    /// A breaker keeps a backend away; asked again in `retry_after` µs.
    Open { retry_after: u64 },
    /// A backend failed, or none answered within the timeout: why.
    Failed(String),
}

/// Why a guarded call failed: the error, and the backend of the route at fault (`None`: each
/// one that did not answer).
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) error: Error,
    pub(crate) backend: Option<usize>,
    /// Whether the backend did not answer by the deadline (a bounded call's).
    pub(crate) timed_out: bool,
}

impl Failure {
    /// `error`, the fault of the route's `backend` (`None`: each one that did not answer).
    pub(crate) fn of(error: Error, backend: Option<usize>) -> Self {
        Self {
            error,
            backend,
            timed_out: false,
        }
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Self::of(error, None)
    }
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

impl std::ops::Add for StoreFailures {
    type Output = Self;
    fn add(self, other: Self) -> Self {
        Self {
            errors: self.errors + other.errors,
            timeouts: self.timeouts + other.timeouts,
        }
    }
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

/// The probes of a route's backends, one each.
enum Probes<'a> {
    One(Option<Probe<'a>>),
    Many(Vec<Option<Probe<'a>>>),
}

impl<'a> Probes<'a> {
    fn take(&mut self, i: usize) -> Option<Probe<'a>> {
        match self {
            Self::One(one) => one.take(),
            Self::Many(many) => many[i].take(),
        }
    }
}

impl Guard {
    pub(crate) fn new(config: GuardConfig, backend: &'static str) -> Self {
        Self {
            config,
            single: Arc::new(Backend::new(backend, &config)),
            fallback: MemoryStore::new(),
        }
    }

    pub(crate) fn config(&self) -> GuardConfig {
        self.config
    }

    /// The backend of a single server (and of calls not bound to a cluster's node).
    pub(crate) fn single(&self) -> &Backend {
        &self.single
    }

    /// The same, shared.
    pub(crate) fn single_shared(&self) -> Arc<Backend> {
        self.single.clone()
    }

    /// Whether the single backend is being kept away now (the failure policy decides its
    /// checks).
    pub(crate) fn degraded(&self) -> bool {
        self.single.failing()
    }

    /// The single backend's calls that failed so far.
    pub(crate) fn failures(&self) -> StoreFailures {
        self.single.failures()
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

    /// Decides `items` by `remote(deadline)`, the backends' answer (see [`call`](Self::call)
    /// for the deadline), unless a breaker of `route` keeps its backend away; when a backend
    /// fails or does not answer within the timeout (longer within a backend's start-up
    /// allowance), by each rule's failure policy. Each backend's breaker counts its own
    /// outcome: one that answered is not blamed for another's failure.
    /// Cancelling the returned future is safe at any point.
    pub(crate) async fn decide<P: Guarded, F, Fut>(
        &self,
        items: &[Planned<'_, P>],
        now: u64,
        max_delay: Option<u64>,
        route: &Route<'_>,
        remote: F,
    ) -> Decisions
    where
        F: FnOnce(Option<Deadline>) -> Fut,
        Fut: Future<Output = Result<Decisions, Failure>>,
    {
        match self.call(now, route, remote).await {
            Ok(decisions) => decisions,
            Err(Unanswered::Open { retry_after }) => {
                self.by_policy(items, now, max_delay, retry_after)
            }
            Err(Unanswered::Failed(_)) => match route.settled.get() {
                Some(settled) => settled.clone(),
                None => self.by_policy(items, now, max_delay, self.single.breaker.cooldown()),
            },
        }
    }

    /// Settles `items` (a report, a give-back; or keeps or takes a reservation's record) by
    /// `remote()`, as [`decide`](Self::decide) asks the backends, but with no failure policy:
    /// what the backends did not take is an error the caller hears of, never made up here.
    ///
    /// # Errors
    /// [`Error::Store`] when a breaker keeps the backend away, or it failed or did not answer
    /// within the timeout.
    pub(crate) async fn settle<T, F, Fut>(
        &self,
        now: u64,
        route: &Route<'_>,
        remote: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(Option<Deadline>) -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        self.call(now, route, remote).await.map_err(|unanswered| {
            let message = match unanswered {
                Unanswered::Open { retry_after } => format!(
                    "the store keeps failing: asked again in {:?}",
                    std::time::Duration::from_micros(retry_after)
                ),
                Unanswered::Failed(why) => why,
            };
            Error::Store {
                message,
                transient: true,
            }
        })
    }

    /// Calls `remote()` unless a breaker of `route` keeps its backend away, within the
    /// timeout: on a timer of the guard's, or, on a [bounded](Route::bounded) route, by the
    /// deadline it is given (`None` on other routes). Records each backend's outcome in its
    /// breaker.
    async fn call<T, F, Fut>(&self, now: u64, route: &Route<'_>, remote: F) -> Result<T, Unanswered>
    where
        F: FnOnce(Option<Deadline>) -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let mut probes = match &route.backends {
            Backends::One(backend) => match backend.breaker.gate(now) {
                Gate::Open { retry_after } => return Err(Unanswered::Open { retry_after }),
                Gate::Pass(probe) => Probes::One(probe),
            },
            Backends::Many(backends) => {
                let mut probes = Vec::with_capacity(backends.len());
                for backend in backends {
                    match backend.breaker.gate(now) {
                        Gate::Open { retry_after } => {
                            return Err(Unanswered::Open { retry_after });
                        }
                        Gate::Pass(probe) => probes.push(probe),
                    }
                }
                Probes::Many(probes)
            }
        };
        let startup = self.config.startup;
        let warming = (0..route.len()).any(|i| route.get(i).warming(startup));
        let timeout = match warming {
            true => self.config.timeout.max(startup),
            false => self.config.timeout,
        };
        let outcome = match route.bounded {
            true => Ok(remote(Some(Deadline::now() + timeout)).await),
            false => tokio::time::timeout(timeout, remote(None)).await,
        };
        let unanswered = || format!("no answer within {timeout:?}");
        let (blamed, why, timed_out) = match outcome {
            Ok(Ok(decisions)) => {
                for i in 0..route.len() {
                    route.get(i).success(probes.take(i));
                }
                return Ok(decisions);
            }
            Ok(Err(failure)) if failure.timed_out => (failure.backend, unanswered(), true),
            // The store's own words: a settlement's error says "store:" once, around them.
            Ok(Err(failure)) => match failure.error {
                Error::Store { message, .. } => (failure.backend, message, false),
                error => (failure.backend, error.to_string(), false),
            },
            Err(_) => (None, unanswered(), true),
        };
        for i in 0..route.len() {
            let backend = route.get(i);
            let at_fault = match blamed {
                Some(j) => i == j,
                None => !route.has_answered(i),
            };
            if at_fault {
                backend.failure(now, &why, timed_out, probes.take(i), startup);
            } else if route.has_answered(i) {
                backend.success(probes.take(i));
            }
        }
        Err(Unanswered::Failed(why))
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
                    Some(Decision::of(rule.label(), 0, verdict).with_source(Source::Fallback))
                }
                (FailurePolicy::Local { .. }, Some((rule, plan))) => {
                    local.push((i, rule, plan));
                    None
                }
                (FailurePolicy::Closed, _) => Some(item.rule.unchecked(Some(retry_after))),
                _ => Some(item.rule.unchecked(None)),
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
