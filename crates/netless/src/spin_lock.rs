//! A small spin lock for the server's per-connection response producer.
//!
//! It exists because the response path is the hot path: taking it is one atomic swap and
//! releasing it one plain store, where `std::sync::Mutex` costs two locked instructions, each
//! of which waits for the core's pending stores to shared memory. Contention is rare (two
//! workers answering the same connection at the same instant); a waiter spins briefly and
//! then yields. It lives in private memory only, never in a shared segment.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// Mutual exclusion by spinning.
pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialised by `locked` (see `lock`/`try_lock`), so sharing the
// lock between threads only ever gives one thread at a time a `&mut T`; T must be Send to move
// that access between threads.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub(crate) fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock if it is free.
    pub(crate) fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        // `then`, not `then_some`: building a guard on failure would release the holder's lock
        // when it is dropped.
        (!self.locked.swap(true, Ordering::Acquire)).then(|| SpinGuard { lock: self })
    }

    /// The value, without taking the lock.
    ///
    /// # Safety
    /// No other thread may use this lock (or the value) while the returned reference lives:
    /// for a lock only one thread ever touches (e.g. a server with a single worker), where
    /// even one atomic swap is worth saving because it stalls until the core's pending stores
    /// to shared memory complete.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn get_unsynchronized(&self) -> &mut T {
        // SAFETY: the caller guarantees exclusive use.
        unsafe { &mut *self.value.get() }
    }

    /// Takes the lock, spinning (then yielding) while another thread holds it.
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        let mut spins = 0u32;
        loop {
            if let Some(guard) = self.try_lock() {
                return guard;
            }
            while self.locked.load(Ordering::Relaxed) {
                spins = spins.saturating_add(1);
                if spins < 128 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }
}

/// Holds a [`SpinLock`]; releases it on drop.
pub(crate) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while this thread holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard exists only while this thread holds the lock, and `&mut self`
        // makes this the only reference derived from it.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn excludes_across_threads() {
        let lock = Arc::new(SpinLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *lock.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), 40_000);
        let held = lock.try_lock().unwrap();
        assert!(lock.try_lock().is_none());
        drop(held);
        assert!(lock.try_lock().is_some());
    }
}
