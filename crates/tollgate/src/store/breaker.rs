//! A circuit breaker in front of a shared store, so that a dead store is not hammered.
//!
//! Closed: every check goes to the store. After `threshold` consecutive failures it opens:
//! checks skip the store for `cooldown`. Then one check at a time probes it (half-open); a
//! success closes the breaker, a failure opens it for another cooldown, and a probe dropped
//! before its answer (a cancelled request) lets the next check probe. Lock-free: a few atomics
//! read per check.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    /// Microseconds the breaker stays open.
    cooldown: u64,
    failures: AtomicU32,
    /// Until when (µs) the breaker is open; 0 when closed.
    open_until: AtomicU64,
    /// Whether a half-open probe is under way.
    probing: AtomicBool,
}

/// What a check may do now.
#[derive(Debug)]
pub(crate) enum Gate<'a> {
    /// Ask the store; as the half-open probe if there is one.
    Pass(Option<Probe<'a>>),
    /// Do not ask the store; it should be tried again after this many µs.
    Open { retry_after: u64 },
}

/// The one check allowed to probe an open breaker. Dropped without an answer (its future was
/// cancelled), it hands the probe to the next check rather than leaving the breaker open for
/// good.
#[derive(Debug)]
pub(crate) struct Probe<'a> {
    breaker: &'a Breaker,
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        self.breaker.probing.store(false, Ordering::Release);
    }
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cooldown: u64) -> Self {
        Self {
            threshold: threshold.max(1),
            cooldown: cooldown.max(1),
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    pub(crate) fn cooldown(&self) -> u64 {
        self.cooldown
    }

    #[inline]
    pub(crate) fn gate(&self, now: u64) -> Gate<'_> {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Gate::Pass(None);
        }
        if now < until {
            return Gate::Open {
                retry_after: until - now,
            };
        }
        match self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Gate::Pass(Some(Probe { breaker: self })),
            Err(_) => Gate::Open {
                retry_after: self.cooldown,
            },
        }
    }

    /// Whether the breaker is open (or half-open) now: the store is kept away.
    pub(crate) fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    /// Records a store answer, with the probe if this check was one; true when this closed
    /// an open breaker.
    #[inline]
    pub(crate) fn success(&self, probe: Option<Probe<'_>>) -> bool {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if probe.is_none() && self.open_until.load(Ordering::Acquire) == 0 {
            return false;
        }
        let closed = self.open_until.swap(0, Ordering::AcqRel) != 0;
        drop(probe);
        closed
    }

    /// Records a store failure at `now`, with the probe if this check was one; true when this
    /// opened the breaker.
    pub(crate) fn failure(&self, now: u64, probe: Option<Probe<'_>>) -> bool {
        if let Some(probe) = probe {
            self.open_until
                .store(now + self.cooldown, Ordering::Release);
            drop(probe);
            return false;
        }
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        failures >= self.threshold
            && self
                .open_until
                .compare_exchange(0, now + self.cooldown, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(gate: Gate<'_>) -> Option<Probe<'_>> {
        match gate {
            Gate::Pass(probe) => probe,
            Gate::Open { retry_after } => panic!("open for {retry_after} µs"),
        }
    }

    #[test]
    fn opens_after_consecutive_failures_then_probes_one_at_a_time() {
        let breaker = Breaker::new(3, 1_000);
        assert!(!breaker.failure(10, None));
        assert!(!breaker.failure(11, None));
        breaker.success(None);
        assert!(!breaker.failure(12, None));
        assert!(!breaker.failure(13, None));
        assert!(pass(breaker.gate(13)).is_none());
        assert!(
            breaker.failure(14, None),
            "the third consecutive failure opens"
        );
        assert!(matches!(breaker.gate(500), Gate::Open { retry_after: 514 }));
        // After the cooldown one check probes; the others keep away.
        let probe = pass(breaker.gate(1_014));
        assert!(probe.is_some());
        assert!(matches!(breaker.gate(1_015), Gate::Open { .. }));
        // The probe fails: open for another cooldown.
        assert!(!breaker.failure(1_020, probe));
        assert!(matches!(
            breaker.gate(1_500),
            Gate::Open { retry_after: 520 }
        ));
        // The next probe succeeds: closed.
        let probe = pass(breaker.gate(2_020));
        assert!(breaker.success(probe));
        assert!(pass(breaker.gate(2_021)).is_none());
        assert!(
            !breaker.failure(2_022, None),
            "failures count from zero again"
        );
    }

    #[test]
    fn a_probe_dropped_before_its_answer_lets_the_next_check_probe() {
        let breaker = Breaker::new(1, 1_000);
        assert!(breaker.failure(0, None));
        let probe = pass(breaker.gate(1_000));
        assert!(probe.is_some());
        assert!(matches!(breaker.gate(1_001), Gate::Open { .. }));
        // The probing request is cancelled (a client went away, an outer timeout fired).
        drop(probe);
        let next = pass(breaker.gate(1_002));
        assert!(next.is_some(), "a new probe is let through");
        assert!(breaker.success(next));
        assert!(!breaker.is_open());
    }
}
