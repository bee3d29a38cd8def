//! The atomics this crate is built on: `netless_shm::sync`, which is `std::sync::atomic`
//! normally and `loom`'s under `cfg(loom)`, so the model tests in `tests/loom.rs` explore
//! every interleaving.
//!
//! Owns nothing but names (re-exported so tests and callers can name the exact atomic types
//! the `from_parts` constructors take); never touches the OS.

pub use netless_shm::sync::{
    fence, hint, yield_now, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
