//! A tier: one limit of a rule, at most `limit` permits per `period`.

use std::time::Duration;

use super::{Algorithm, Decide, Rate};

/// Integers up to 2^53 are exact in a double; every quantity an algorithm computes stays below
/// this so the Redis Lua scripts (doubles only) decide exactly as the Rust code does.
pub(crate) const MAX_EXACT: u64 = 1 << 53;

/// One limit of a rule: at most `limit` permits per `period`. Bucket algorithms also take a
/// `burst` (their capacity), which defaults to `limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    limit: u64,
    period: Duration,
    burst: Option<u64>,
    period_micros: u64,
    rate: Rate,
}

impl Tier {
    /// At most `limit` permits per `period`.
    pub fn new(limit: u64, period: Duration) -> Self {
        let period_micros = u64::try_from(period.as_micros()).unwrap_or(u64::MAX);
        Self {
            limit,
            period,
            burst: None,
            period_micros,
            rate: Rate::new(limit, period_micros),
        }
    }

    /// At most `limit` permits per second.
    pub fn per_second(limit: u64) -> Self {
        Self::new(limit, Duration::from_secs(1))
    }

    /// At most `limit` permits per minute.
    pub fn per_minute(limit: u64) -> Self {
        Self::new(limit, Duration::from_secs(60))
    }

    /// At most `limit` permits per hour.
    pub fn per_hour(limit: u64) -> Self {
        Self::new(limit, Duration::from_secs(3_600))
    }

    /// At most `limit` permits per day.
    pub fn per_day(limit: u64) -> Self {
        Self::new(limit, Duration::from_secs(86_400))
    }

    /// Sets the capacity of a bucket algorithm (token bucket, leaky bucket, GCRA).
    pub fn with_burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// The burst as set, `None` when it defaults to the limit.
    pub(crate) fn explicit_burst(&self) -> Option<u64> {
        self.burst
    }

    /// Permits per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The capacity of a bucket algorithm: the burst if set, else the limit.
    pub fn burst(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }

    pub(crate) fn period_micros(&self) -> u64 {
        self.period_micros
    }

    pub(crate) fn rate(&self) -> Rate {
        self.rate
    }

    pub(crate) fn validate(&self, algorithm: &Algorithm) -> Result<(), (&'static str, String)> {
        if self.limit == 0 {
            return Err(("limit", "must be at least 1".into()));
        }
        if self.limit >= MAX_EXACT {
            return Err(("limit", "must be below 2^53".into()));
        }
        if self.period.is_zero() {
            return Err(("period", "must be longer than zero".into()));
        }
        if !self.period.subsec_nanos().is_multiple_of(1_000) {
            return Err(("period", "must be a whole number of microseconds".into()));
        }
        if self.period_micros >= MAX_EXACT {
            return Err(("period", "must be shorter than 2^53 microseconds".into()));
        }
        match self.burst {
            Some(_) if !algorithm.uses_burst() => Err((
                "burst",
                format!("is not used by the {} algorithm", algorithm.name()),
            )),
            Some(0) => Err(("burst", "must be at least 1".into())),
            Some(b) if b >= MAX_EXACT => Err(("burst", "must be below 2^53".into())),
            _ => Ok(()),
        }
    }
}
