//! Lock-free building blocks that live in shared memory: the receive queue a server's
//! clients enqueue request descriptors into ([`ReceiveQueue`]), the per-connection
//! response ring ([`ResponseRing`]: [`Producer`] / [`Consumer`]) and the doorbell that
//! lets a waiter sleep on a shared futex ([`doorbell`]); and, for memory shared without
//! hardware cache coherence, the [`polled`] ring.
//!
//! Everything here operates on memory the caller provides (a region of a mapped segment)
//! and knows nothing about RPC. Every word in that memory may have been written by a
//! crashed or malicious peer process, so every value read from it is validated: a bad
//! value yields an error (`Corrupt`, `Skipped`, `Contended`), never a panic, an
//! out-of-bounds access or an unbounded loop. Hot paths allocate nothing and take no
//! locks. Byte layouts are in [`layout`].
//!
//! Under `cfg(loom)` the atomics come from `loom` (see [`sync`]) and the constructors that
//! take raw regions are compiled out; the `from_parts` constructors remain.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
// Without loom the shim's atomics are std's own types, so clippy.toml's ban on std's atomics
// (by type, not by path) cannot tell them from a direct use; clippy enforces it under
// `--cfg loom`, where the shim's are loom's and any std atomic left escapes the models.
#![cfg_attr(not(loom), allow(clippy::disallowed_types, clippy::disallowed_methods))]

pub mod contention;
pub mod doorbell;
mod futex;
pub mod layout;
// Works through `netless_shm::coherence` views of real mappings: not modelled under loom.
#[cfg(not(loom))]
pub mod polled;
pub mod prefetch;
pub mod receive_queue;
pub mod spsc;
pub mod sync;

pub use doorbell::{
    announce_sleep_any, notify, notify_all, wait, wait_any_counted, wait_counted, DoorbellWords,
    ParseWaitModeError, SleepOutcome, SleepSet, Sleeper, TimedOut, WaitMode, WaitPolicy,
};
pub use layout::LayoutError;
pub use netless_shm::WAIT_ANY_MAX;
pub use receive_queue::{ConsumerHead, Dequeue, EnqueueError, ReceiveQueue};
pub use spsc::{Consumer, Corrupt, Producer, PushError, Record, ResponseRing};

#[cfg(all(test, not(loom)))]
mod tests {
    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_are_send_and_sync() {
        send_sync::<crate::ReceiveQueue<'static>>();
        send_sync::<crate::ConsumerHead>();
        send_sync::<crate::Producer<'static>>();
        send_sync::<crate::Consumer<'static>>();
        send_sync::<crate::DoorbellWords>();
    }
}
