//! Time as a type: microseconds, since the Unix epoch for an instant (as a clock reads it), or
//! a span. The algorithms take and give times as `Micros`; their state words stay `u64`,
//! whose meaning each algorithm's file states.

/// Microseconds: since the Unix epoch for an instant, or a span. Every time an algorithm
/// computes stays below 2^53 (see [`MAX_EXACT`](super::MAX_EXACT)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct Micros(u64);

impl Micros {
    /// `micros` microseconds.
    #[inline]
    pub(crate) const fn new(micros: u64) -> Self {
        Self(micros)
    }

    /// The count of microseconds.
    #[inline]
    pub(crate) const fn get(self) -> u64 {
        self.0
    }
}
