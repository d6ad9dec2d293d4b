//! The shard lock: one compare-and-swap to take, one release store to give back.
//!
//! A shard is held for one key's arithmetic (tens of nanoseconds), so a waiter spins briefly,
//! testing before it swaps, and then yields its thread so that a holder that was preempted
//! can finish. Unlike a parking mutex, releasing costs no read-modify-write.

use spin::mutex::{SpinMutex, SpinMutexGuard};

/// Spins (with backoff) this many times before yielding the thread between attempts.
const SPINS: u32 = 64;

#[derive(Debug, Default)]
pub(crate) struct ShardLock<T>(SpinMutex<T>);

impl<T> ShardLock<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(SpinMutex::new(value))
    }

    #[inline]
    pub(crate) fn lock(&self) -> SpinMutexGuard<'_, T> {
        if let Some(guard) = self.0.try_lock() {
            return guard;
        }
        self.lock_contended()
    }

    /// Takes the lock if it is free now; never waits.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<SpinMutexGuard<'_, T>> {
        self.0.try_lock()
    }

    #[cold]
    fn lock_contended(&self) -> SpinMutexGuard<'_, T> {
        let mut spins = 0;
        loop {
            while self.0.is_locked() {
                if spins < SPINS {
                    for _ in 0..(1 << (spins / 16)) {
                        std::hint::spin_loop();
                    }
                    spins += 1;
                } else {
                    std::thread::yield_now();
                }
            }
            if let Some(guard) = self.0.try_lock() {
                return guard;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn many_threads_increment_exactly() {
        let lock = Arc::new(ShardLock::new(0u64));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..100_000 {
                        *lock.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), 800_000);
    }
}
