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

/// The system clock: wall time, read through the CPU's time-stamp counter (a few nanoseconds
/// per reading) and re-anchored to the wall clock every second, so that instances whose
/// clocks are synchronised keep agreeing on aligned windows over days of uptime.
///
/// Never goes backwards: when the counter has run ahead of the wall clock, time slows down
/// (by at most [`Self::MAX_SLEW`] per re-anchoring) until the wall clock catches up. A clone
/// starts from its original's anchor and re-anchors on its own.
///
/// How counter time maps to wall time: now is `offset + counter nanoseconds since the base
/// reading / 1000`, never below `floor`. A re-anchoring (one thread at a time, elected by
/// `next`) stores `floor`, then `offset` with release ordering; a reading loads `offset` with
/// acquire ordering, then `floor`, so that a new offset is never read with an old floor. All
/// of it lives inline, so that a reading chases no pointer.
#[derive(Debug)]
pub struct SystemClock {
    counter: quanta::Clock,
    /// The counter's raw reading when the clock was made.
    base: u64,
    /// Microseconds since the epoch at `base`, as last corrected.
    offset: AtomicU64,
    /// Readings never go below this: the time reported when the anchor last moved, and 1 µs.
    floor: AtomicU64,
    /// Counter nanoseconds since `base` from which the next reading re-anchors.
    next: AtomicU64,
}

/// Nanoseconds of counter time between two re-anchorings.
const REANCHOR_NANOS: u64 = 1_000_000_000;

impl SystemClock {
    /// The most a re-anchoring slows the clock down to let wall time catch up: 500 µs per
    /// second, far more than the drift of a calibrated counter (tens of µs per second).
    pub const MAX_SLEW: Duration = Duration::from_micros(500);

    /// A clock anchored at the current wall time.
    pub fn new() -> Self {
        let counter = quanta::Clock::new();
        let base = counter.raw();
        Self {
            counter,
            base,
            offset: AtomicU64::new(wall_micros()),
            floor: AtomicU64::new(0),
            next: AtomicU64::new(REANCHOR_NANOS),
        }
    }

    /// Counter nanoseconds since the clock was made.
    #[inline]
    fn nanos(&self) -> u64 {
        self.counter.delta_as_nanos(self.base, self.counter.raw())
    }

    /// Moves the anchor to the wall clock at `nanos`, unless another thread is doing so.
    #[cold]
    fn reanchor(&self, nanos: u64) {
        let due = self.next.load(Ordering::Relaxed);
        if self
            .next
            .compare_exchange(
                due,
                nanos + REANCHOR_NANOS,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return;
        }
        let elapsed = nanos / 1_000;
        let current =
            (self.offset.load(Ordering::Acquire) + elapsed).max(self.floor.load(Ordering::Relaxed));
        let slew = Self::MAX_SLEW.as_micros() as u64;
        // Ahead of the wall clock: stand still for at most `slew`, then run from there.
        let now = wall_micros().max(current.saturating_sub(slew));
        self.floor.store(current + 1, Ordering::Relaxed);
        self.offset.store(now - elapsed, Ordering::Release);
    }
}

impl Clone for SystemClock {
    fn clone(&self) -> Self {
        Self {
            counter: self.counter.clone(),
            base: self.base,
            offset: AtomicU64::new(self.offset.load(Ordering::Acquire)),
            floor: AtomicU64::new(self.floor.load(Ordering::Relaxed)),
            next: AtomicU64::new(self.next.load(Ordering::Relaxed)),
        }
    }
}

fn wall_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now_micros(&self) -> u64 {
        let offset = self.offset.load(Ordering::Acquire);
        let floor = self.floor.load(Ordering::Relaxed);
        let nanos = self.nanos();
        if nanos >= self.next.load(Ordering::Relaxed) {
            self.reanchor(nanos);
        }
        (offset + nanos / 1_000).max(floor)
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

    /// A clock whose counter has drifted `ahead` µs of (or behind, if negative) the wall.
    fn drifted(ahead: i64) -> SystemClock {
        let clock = SystemClock::new();
        let offset = clock
            .offset
            .load(Ordering::Relaxed)
            .saturating_add_signed(ahead);
        clock.offset.store(offset, Ordering::Relaxed);
        clock
    }

    /// Re-anchors now, as the first reading a second later would.
    fn reanchor(clock: &SystemClock) {
        clock.next.store(0, Ordering::Relaxed);
        clock.now_micros();
    }

    #[test]
    fn a_clock_ahead_of_the_wall_slows_down_until_the_wall_catches_up_never_going_back() {
        let clock = drifted(10_000);
        let mut last = clock.now_micros();
        assert!(last >= wall_micros() + 9_000);
        // Each re-anchoring after a millisecond gives back 500 µs of that millisecond.
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(1));
            reanchor(&clock);
            for _ in 0..100 {
                let now = clock.now_micros();
                assert!(now >= last, "went back from {last} to {now}");
                last = now;
            }
        }
        // 40 re-anchorings of 500 µs each took the 10 ms back.
        let now = clock.now_micros();
        assert!(
            now.abs_diff(wall_micros()) < 2_000,
            "{now} vs {}",
            wall_micros()
        );
    }

    #[test]
    fn a_clock_behind_the_wall_jumps_to_it_at_the_next_reanchoring() {
        let clock = drifted(-10_000_000);
        assert!(clock.now_micros() + 9_000_000 < wall_micros());
        reanchor(&clock);
        assert!(clock.now_micros().abs_diff(wall_micros()) < 2_000);
    }

    #[test]
    fn a_clone_starts_from_its_originals_anchor() {
        let clock = drifted(-10_000_000);
        let clone = clock.clone();
        assert!(clone.now_micros() + 9_000_000 < wall_micros());
        reanchor(&clone);
        assert!(clone.now_micros().abs_diff(wall_micros()) < 2_000);
    }
}
