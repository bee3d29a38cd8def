//! The atomics shim: re-exports `std::sync::atomic` normally and `loom::sync::atomic` under
//! `cfg(loom)`, so the lock-free structures above this crate can be model-checked.
//!
//! It owns nothing but names; it never adds behaviour of its own. Code in shared memory uses
//! these types (never `std::sync::atomic` directly) so a loom build swaps all of them at once.
//! Under loom, atomics are not real memory, so [`crate::futex_wait`] and
//! [`crate::futex_wake`] degrade to a yield (see their docs).

// The one module that names std's atomics and spin hints, which clippy.toml bans elsewhere.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Spin-loop hints (`std::hint` or `loom::hint`).
pub mod hint {
    /// Tells the CPU (or the loom scheduler) that the caller is busy-waiting.
    ///
    /// ```
    /// netless_shm::sync::hint::spin_loop();
    /// ```
    #[inline]
    pub fn spin_loop() {
        #[cfg(not(loom))]
        std::hint::spin_loop();
        #[cfg(loom)]
        loom::hint::spin_loop();
    }
}

/// Gives up the rest of the time slice (`std::thread::yield_now` or `loom::thread::yield_now`).
///
/// ```
/// netless_shm::sync::yield_now();
/// ```
#[inline]
pub fn yield_now() {
    #[cfg(not(loom))]
    std::thread::yield_now();
    #[cfg(loom)]
    loom::thread::yield_now();
}
