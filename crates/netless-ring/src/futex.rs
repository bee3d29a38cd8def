//! The one place this crate reaches the kernel's shared futex: `FUTEX_WAIT` / `FUTEX_WAKE`
//! on a 32-bit word that waiters and wakers in different processes map.
//!
//! It forwards to `netless_shm` (the OS layer owns the system calls; under `cfg(loom)` its
//! wait is one check plus a yield, its wake a no-op) and never interprets the word. Keeping
//! the indirection here means the doorbell names one private module, whatever backs it.

pub(crate) use netless_shm::{futex_wait, futex_wait_any, futex_wake, FutexWait, WAIT_ANY_MAX};
