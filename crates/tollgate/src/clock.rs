//! Where time comes from.
//!
//! Every timestamp in tollgate is a count of **microseconds since the Unix epoch** (`u64`).
//! Windows are aligned to multiples of their period since the epoch, so every instance that
//! reads the same time uses the same window. Timestamps stay below 2^53 µs (the year 2255),
//! which keeps every value exactly representable in the doubles of a Redis Lua script.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The largest timestamp tollgate accepts: 2^53 µs, beyond which doubles lose integers.
pub const MAX_TIMESTAMP: u64 = 1 << 53;

/// A source of time for limiters. Implementations must be cheap to call and monotonic.
pub trait Clock: Send + Sync + 'static {
    /// Now, in microseconds since the Unix epoch.
    fn now_micros(&self) -> u64;

    /// Waits for `duration` of this clock's time; used by [`Limiter::acquire`](crate::Limiter::acquire).
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send;
}

/// The system clock: wall time read once at construction, advanced by a monotonic TSC-based
/// counter, so it never goes backwards and costs a few nanoseconds per reading.
#[derive(Debug, Clone)]
pub struct SystemClock {
    anchor_micros: u64,
    /// The counter's raw reading at `anchor_micros`.
    anchor: u64,
    clock: quanta::Clock,
}

impl SystemClock {
    /// A clock anchored at the current wall time.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let anchor = clock.raw();
        let anchor_micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        Self {
            anchor_micros,
            anchor,
            clock,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now_micros(&self) -> u64 {
        let elapsed = self.clock.delta_as_nanos(self.anchor, self.clock.raw());
        self.anchor_micros + elapsed / 1_000
    }

    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(duration)
    }
}

/// A clock that only moves when told to. Clones share one time, so a test can hand a clone to
/// a limiter and advance it from outside. [`Clock::sleep`] advances the shared time by the
/// requested duration and returns at once, like tokio's paused time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
}

impl ManualClock {
    /// 2023-11-15T00:00:00Z: midnight UTC, so windows of a second, minute, hour or day all
    /// begin exactly here.
    pub const DEFAULT_START_MICROS: u64 = 1_700_006_400_000_000;

    /// A clock at [`Self::DEFAULT_START_MICROS`].
    pub fn new() -> Self {
        Self::at_micros(Self::DEFAULT_START_MICROS)
    }

    /// A clock at `micros` since the Unix epoch.
    ///
    /// # Panics
    /// If `micros` exceeds [`MAX_TIMESTAMP`].
    pub fn at_micros(micros: u64) -> Self {
        assert!(micros <= MAX_TIMESTAMP, "timestamp beyond 2^53 µs");
        Self {
            micros: Arc::new(AtomicU64::new(micros)),
        }
    }

    /// Moves time forward by `by` (saturating at [`MAX_TIMESTAMP`]).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        let _ = self
            .micros
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(by).min(MAX_TIMESTAMP))
            });
    }

    /// Sets the time to `micros` since the Unix epoch (it may go backwards).
    ///
    /// # Panics
    /// If `micros` exceeds [`MAX_TIMESTAMP`].
    pub fn set_micros(&self, micros: u64) {
        assert!(micros <= MAX_TIMESTAMP, "timestamp beyond 2^53 µs");
        self.micros.store(micros, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_micros(&self) -> u64 {
        self.micros.load(Ordering::SeqCst)
    }

    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send {
        self.advance(duration);
        std::future::ready(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_clones_share_time() {
        let a = ManualClock::at_micros(10);
        let b = a.clone();
        a.advance(Duration::from_micros(5));
        assert_eq!(b.now_micros(), 15);
        b.set_micros(3);
        assert_eq!(a.now_micros(), 3);
    }

    #[test]
    fn system_clock_is_wall_time_and_monotonic() {
        let clock = SystemClock::new();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        let first = clock.now_micros();
        assert!(first.abs_diff(wall) < 5_000_000, "{first} vs {wall}");
        let mut last = first;
        for _ in 0..1000 {
            let now = clock.now_micros();
            assert!(now >= last);
            last = now;
        }
    }
}
