//! The reaper thread: collects the replies of async calls, so a tokio worker never blocks
//! on the ring. It keeps off the ring while an async call spins on it itself (see
//! `future`), parks while no async call waits, and enforces async deadlines.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use netless_ring::WaitPolicy;

use super::connection::Connection;
use super::future::SPINNER_CHECK;
use crate::sync::Ordering;

/// The reaper thread's state.
pub(super) struct Reaper {
    pub(super) conn: Arc<Connection>,
}

impl Reaper {
    /// The reaper: collects responses for async calls.
    pub(super) fn run(self) {
        let conn = &*self.conn;
        let policy = WaitPolicy {
            spin: conn.config.wait.spin.min(Duration::from_micros(20)),
            ..conn.config.wait
        };
        let mut vacant_seen = false;
        while !conn.stopping.load(Ordering::Acquire) {
            if conn.async_waiters.load(Ordering::Acquire) == 0
                && conn.slots.abandoned.load(Ordering::Acquire) == 0
            {
                thread::park_timeout(Duration::from_millis(100));
                continue;
            }
            if conn.spinning.load(Ordering::Acquire) > 0 {
                // Spinning calls poll the ring themselves; stay off it and off the CPU. A
                // role left vacant for a whole check (nobody adopted it) is taken back.
                if conn.role_vacant.load(Ordering::Acquire) {
                    if vacant_seen
                        && conn
                            .role_vacant
                            .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
                            .is_ok()
                    {
                        conn.spinning.store(0, Ordering::Release);
                        vacant_seen = false;
                        continue;
                    }
                    vacant_seen = true;
                } else {
                    vacant_seen = false;
                }
                conn.slots.expire_async();
                thread::park_timeout(SPINNER_CHECK);
                continue;
            }
            vacant_seen = false;
            let Some(mut consumer) = conn.consumer.try_lock() else {
                // A blocking caller holds the ring (and may for long): async deadlines are
                // still ours to enforce. It unparks us when it lets go.
                conn.slots.expire_async();
                thread::park_timeout(Duration::from_millis(1));
                continue;
            };
            if let Err(what) = conn
                .slots
                .drain(&mut consumer, None, conn.config.max_message)
            {
                drop(consumer);
                conn.fail(conn.corrupt(&what));
                continue;
            }
            conn.slots.expire_async();
            if conn.is_dead() {
                drop(consumer);
                // No reply will ever come: nothing abandoned is left to drain. (Not
                // `wake_everyone`: unparking itself would turn this park into a busy loop.)
                conn.slots.abandoned.store(0, Ordering::Release);
                conn.slots.wake_callers();
                thread::park_timeout(Duration::from_millis(10));
                continue;
            }
            let _ = netless_ring::wait(
                conn.doorbell(),
                &policy,
                Some(Instant::now() + Duration::from_millis(5)),
                conn.max_sleep,
                || {
                    (consumer.has_next()
                        || conn.spinning.load(Ordering::Acquire) > 0
                        || conn.dead.load(Ordering::Acquire)
                        || conn.stopping.load(Ordering::Acquire)
                        || (conn.async_waiters.load(Ordering::Acquire) == 0
                            && conn.slots.abandoned.load(Ordering::Acquire) == 0))
                        .then_some(())
                },
            );
            drop(consumer);
            conn.after_consumer_release();
        }
    }
}
