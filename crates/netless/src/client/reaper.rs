//! The reaper thread: collects the replies of async calls, so a tokio worker never blocks
//! on the ring. It keeps off the ring while an async call spins on it itself (see
//! `future`), parks while no async call waits, and enforces async deadlines.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use netless_ring::WaitPolicy;

use super::connection::Connection;
use super::future::SPINNER_CHECK;
use super::wait::MAX_SLEEP;
use crate::sync::Ordering;

impl Connection {
    /// The reaper: collects responses for async calls.
    pub(super) fn reap(self: Arc<Self>) {
        let policy = WaitPolicy {
            spin: self.config.wait.spin.min(Duration::from_micros(20)),
            ..self.config.wait
        };
        let mut vacant_seen = false;
        while !self.stopping.load(Ordering::Acquire) {
            if self.async_waiters.load(Ordering::Acquire) == 0
                && self.slots.abandoned.load(Ordering::Acquire) == 0
            {
                thread::park_timeout(Duration::from_millis(100));
                continue;
            }
            if self.spinning.load(Ordering::Acquire) > 0 {
                // Spinning calls poll the ring themselves; stay off it and off the CPU. A
                // role left vacant for a whole check (nobody adopted it) is taken back.
                if self.role_vacant.load(Ordering::Acquire) {
                    if vacant_seen
                        && self
                            .role_vacant
                            .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
                            .is_ok()
                    {
                        self.spinning.store(0, Ordering::Release);
                        vacant_seen = false;
                        continue;
                    }
                    vacant_seen = true;
                } else {
                    vacant_seen = false;
                }
                self.slots.expire_async();
                thread::park_timeout(SPINNER_CHECK);
                continue;
            }
            vacant_seen = false;
            let Some(mut consumer) = self.consumer.try_lock() else {
                // A blocking caller holds the ring (and may for long): async deadlines are
                // still ours to enforce. It unparks us when it lets go.
                self.slots.expire_async();
                thread::park_timeout(Duration::from_millis(1));
                continue;
            };
            if let Err(what) = self
                .slots
                .drain(&mut consumer, None, self.config.max_message)
            {
                drop(consumer);
                self.fail(self.corrupt(&what));
                continue;
            }
            self.slots.expire_async();
            if self.is_dead() {
                drop(consumer);
                // No reply will ever come: nothing abandoned is left to drain. (Not
                // `wake_everyone`: unparking itself would turn this park into a busy loop.)
                self.slots.abandoned.store(0, Ordering::Release);
                self.slots.wake_callers();
                thread::park_timeout(Duration::from_millis(10));
                continue;
            }
            let _ = netless_ring::wait(
                self.doorbell,
                &policy,
                Some(Instant::now() + Duration::from_millis(5)),
                MAX_SLEEP,
                || {
                    (consumer.has_next()
                        || self.spinning.load(Ordering::Acquire) > 0
                        || self.dead.load(Ordering::Acquire)
                        || self.stopping.load(Ordering::Acquire)
                        || (self.async_waiters.load(Ordering::Acquire) == 0
                            && self.slots.abandoned.load(Ordering::Acquire) == 0))
                        .then_some(())
                },
            );
            drop(consumer);
            self.after_consumer_release();
        }
    }
}
