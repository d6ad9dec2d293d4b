//! Errors: a definition that can never work, a request that can never succeed, a wait that ran
//! out. A denial is not an error; it is a [`Decision`](crate::Decision).

use std::time::Duration;

use crate::Decision;

/// A rule definition that was rejected when it was built: which rule, which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rule `{rule}`: {field}: {reason}")]
pub struct RuleError {
    /// The rule's name.
    pub rule: String,
    /// The offending field, e.g. `tiers[1].period`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Why a check could not produce a decision.
///
/// Large variants are boxed, so that `Result<Decision, Error>` is no larger than a
/// [`Decision`]: a check's result is moved by value on every call, and a wider enum costs
/// every check its copies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The cost is larger than a tier can ever admit: retrying will never help.
    #[error(
        "cost {cost} exceeds what tier {tier} of rule `{rule}` can ever admit ({capacity} permits)"
    )]
    CostExceedsCapacity {
        /// The rule's name.
        rule: String,
        /// Index of the tier in the rule.
        tier: usize,
        /// The cost asked for.
        cost: u64,
        /// The most that tier admits at once.
        capacity: u64,
    },
    /// The store holds its most open reservations: settle some, or wait for them to expire.
    #[error(
        "the store holds {max} open reservations, its most: commit or cancel some, or let them \
         expire"
    )]
    ReservationsFull {
        /// The most it holds.
        max: usize,
    },
    /// No open reservation has this id: it is unknown, already settled, or expired.
    #[error("no open reservation `{id}`: unknown, settled or expired")]
    UnknownReservation {
        /// The id given.
        id: String,
    },
    /// A report's cost beyond what can be counted exactly (2^53).
    #[error("cost {cost} is more than can be counted (at most {max})")]
    CostTooLarge {
        /// The cost given.
        cost: u64,
        /// The largest accepted.
        max: u64,
    },
    /// A rule that cannot be enforced as defined, or not on this store.
    #[error(transparent)]
    Rule(Box<RuleError>),
    /// A batch names a rule the limiter does not have.
    #[error("unknown rule `{rule}`")]
    UnknownRule {
        /// The name given.
        rule: String,
    },
    /// A batch holds more items than [`MAX_BATCH`](crate::MAX_BATCH).
    #[error("a batch of {len} items exceeds the maximum of {max}")]
    TooManyItems {
        /// Items in the batch.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// The key is longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes.
    #[error("key of {len} bytes exceeds the maximum of {max} bytes")]
    KeyTooLong {
        /// The key's length.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// The store could not be opened or answered with an error. `transient` when retrying may
    /// help (a timeout, a dropped or refused connection), rather than a mistake in the
    /// configuration (a malformed URL, wrong credentials).
    #[error("store: {message}")]
    Store {
        /// What the store said.
        message: String,
        /// Whether retrying may help.
        transient: bool,
    },
    /// What was asked is not something this store does: a report or a reservation on the
    /// hybrid or lease store, which count admitted permits only.
    #[error("{what}")]
    Unsupported {
        /// What, and why.
        what: String,
    },
    /// [`Limiter::acquire`](crate::Limiter::acquire) could not be admitted within its timeout.
    /// It gives up as soon as the wait is known to exceed the timeout, without sleeping first.
    #[error("not admitted within {timeout:?}; the last decision asked to retry after {:?}", .decision.retry_after())]
    Timeout {
        /// The timeout given.
        timeout: Duration,
        /// The last denial.
        decision: Box<Decision>,
    },
}

impl From<RuleError> for Error {
    fn from(error: RuleError) -> Self {
        Error::Rule(Box::new(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_is_no_larger_than_its_decision() {
        assert_eq!(
            std::mem::size_of::<Result<Decision, Error>>(),
            std::mem::size_of::<Decision>()
        );
    }
}
