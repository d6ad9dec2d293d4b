//! One tier's answer: what an algorithm returns.

/// One tier's answer, in microseconds; what an algorithm returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Verdict {
    pub(crate) allowed: bool,
    /// The tier's capacity as reported to callers (limit, or burst for buckets).
    pub(crate) limit: u64,
    /// Permits that could still be taken now, after this check.
    pub(crate) remaining: u64,
    /// Until the tier is back to its full allowance if nothing else arrives (µs).
    pub(crate) reset_after: u64,
    /// When denied: until the same check would be admitted if nothing else arrives (µs, ≥ 1).
    pub(crate) retry_after: u64,
    /// When admitted by a shaping algorithm: how long to wait before proceeding (µs).
    pub(crate) delay: u64,
}

impl Verdict {
    #[inline]
    pub(crate) fn allow(limit: u64, remaining: u64, reset_after: u64) -> Self {
        Self {
            allowed: true,
            limit,
            remaining,
            reset_after,
            ..Self::default()
        }
    }

    #[inline]
    pub(crate) fn deny(limit: u64, remaining: u64, reset_after: u64, retry_after: u64) -> Self {
        Self {
            allowed: false,
            limit,
            remaining,
            reset_after,
            retry_after: retry_after.max(1),
            delay: 0,
        }
    }

    #[inline]
    pub(crate) fn with_delay(mut self, delay: u64) -> Self {
        self.delay = delay;
        self
    }
}
