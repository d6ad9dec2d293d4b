//! A circuit breaker in front of a shared store, so that a dead store is not hammered.
//!
//! Closed: every check goes to the store. After `threshold` consecutive failures it opens:
//! checks skip the store for `cooldown`. Then one check at a time probes it (half-open); a
//! success closes the breaker, a failure opens it for another cooldown. Lock-free: a few
//! atomics read per check.

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Ask the store.
    Pass,
    /// Do not ask the store; it should be tried again after this many µs.
    Open { retry_after: u64 },
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
    pub(crate) fn gate(&self, now: u64) -> Gate {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Gate::Pass;
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
            Ok(_) => Gate::Pass,
            Err(_) => Gate::Open {
                retry_after: self.cooldown,
            },
        }
    }

    /// Records a store answer; true when this closed an open breaker.
    #[inline]
    pub(crate) fn success(&self) -> bool {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.open_until.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.probing.store(false, Ordering::Release);
        self.open_until.swap(0, Ordering::AcqRel) != 0
    }

    /// Records a store failure at `now`; true when this opened the breaker.
    pub(crate) fn failure(&self, now: u64) -> bool {
        if self.probing.swap(false, Ordering::AcqRel) {
            self.open_until
                .store(now + self.cooldown, Ordering::Release);
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

    #[test]
    fn opens_after_consecutive_failures_then_probes_one_at_a_time() {
        let breaker = Breaker::new(3, 1_000);
        assert!(!breaker.failure(10));
        assert!(!breaker.failure(11));
        breaker.success();
        assert!(!breaker.failure(12));
        assert!(!breaker.failure(13));
        assert_eq!(breaker.gate(13), Gate::Pass);
        assert!(breaker.failure(14), "the third consecutive failure opens");
        assert_eq!(breaker.gate(500), Gate::Open { retry_after: 514 });
        // After the cooldown one check probes; the others keep away.
        assert_eq!(breaker.gate(1_014), Gate::Pass);
        assert!(matches!(breaker.gate(1_015), Gate::Open { .. }));
        // The probe fails: open for another cooldown.
        assert!(!breaker.failure(1_020));
        assert_eq!(breaker.gate(1_500), Gate::Open { retry_after: 520 });
        // The next probe succeeds: closed.
        assert_eq!(breaker.gate(2_020), Gate::Pass);
        assert!(breaker.success());
        assert_eq!(breaker.gate(2_021), Gate::Pass);
        assert!(!breaker.failure(2_022), "failures count from zero again");
    }
}
