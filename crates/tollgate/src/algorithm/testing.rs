//! A test bench for algorithms: one key's state on a manual timeline, evaluated all-or-nothing
//! across tiers exactly as the stores do.

use super::Tier;
use crate::Decision;
use crate::algorithm::{Algorithm, Attempt, Micros};
use crate::clock::ManualClock;
use crate::rule::Rule;

pub(crate) const SECOND: u64 = 1_000_000;
pub(crate) const START: u64 = ManualClock::DEFAULT_START_MICROS;

#[derive(Debug)]
pub(crate) struct Key {
    rule: Rule,
    pub(crate) state: Vec<u64>,
    pub(crate) now: u64,
}

impl Key {
    pub(crate) fn new(algorithm: Algorithm, tiers: impl IntoIterator<Item = Tier>) -> Self {
        Self::with_rule(Rule::new("test", algorithm, tiers).expect("valid rule"))
    }

    pub(crate) fn with_rule(rule: Rule) -> Self {
        Self {
            state: vec![0; rule.words()],
            rule,
            now: START,
        }
    }

    pub(crate) fn at(&mut self, now: u64) -> &mut Self {
        self.now = now;
        self
    }

    pub(crate) fn advance(&mut self, micros: u64) -> &mut Self {
        self.now += micros;
        self
    }

    pub(crate) fn check(&mut self, cost: u64) -> Decision {
        self.attempt(cost, None)
    }

    pub(crate) fn attempt(&mut self, cost: u64, max_delay: Option<u64>) -> Decision {
        self.rule.check_cost(cost).expect("cost within capacity");
        let attempt = Attempt {
            now: Micros::new(self.now),
            cost,
            max_delay,
            commit: true,
            settle: None,
        };
        self.rule
            .evaluate(self.rule.algorithm(), &mut self.state, attempt)
    }

    /// Settles `cost` at the current time as `settle` says, then looks.
    pub(crate) fn settle(&mut self, cost: u64, settle: crate::algorithm::Settle) -> Decision {
        let attempt = Attempt {
            now: Micros::new(self.now),
            cost,
            max_delay: None,
            commit: true,
            settle: Some(settle),
        };
        self.rule
            .evaluate(self.rule.algorithm(), &mut self.state, attempt)
    }

    /// How many of `n` checks of `cost` at the current time are admitted.
    pub(crate) fn admitted(&mut self, n: u64, cost: u64) -> u64 {
        (0..n).filter(|_| self.check(cost).allowed()).count() as u64
    }

    /// Denied now; one microsecond before `retry_after` still denied (consuming nothing), at
    /// exactly `retry_after` admitted: the wait is the earliest one, and never early.
    pub(crate) fn retry_after_is_exact(&mut self, cost: u64) -> bool {
        let wait = self.check(cost).retry_after().expect("denied");
        let wait = u64::try_from(wait.as_micros()).unwrap();
        self.advance(wait - 1);
        let before = self.state.clone();
        if self.check(cost).allowed() {
            return false;
        }
        assert!(
            before == self.state || before.iter().all(|&w| w == 0),
            "a denial consumed state"
        );
        self.advance(1);
        self.check(cost).allowed()
    }
}
