//! Waiting for a reply from a blocking call: the caller that holds the response ring's
//! consumer drains it for everyone (its own reply decoded straight into its buffer) and
//! waits on the doorbell per the client's wait policy; the others park until their reply is
//! delivered or the ring is free again.

use std::thread;
use std::time::{Duration, Instant};

use netless_ring::prefetch::prefetch_write_range;

use super::connection::Connection;
use super::slots::{deadline_status, lock, OwnReply, DONE};
use crate::status::Status;
use crate::sync::Ordering;
use crate::wire::metadata::Metadata;

/// Longest a waiter sleeps before re-checking for death or a deadline, whatever a peer did.
pub(super) const MAX_SLEEP: Duration = Duration::from_millis(50);

/// Why a caller holding the ring stopped waiting on it.
enum WaitEnd {
    /// Its own reply arrived and was decoded.
    OwnReply(Result<Metadata, Status>),
    /// The ring holds garbage: the connection must close.
    Corrupt(Status),
    /// The call completed by another path, or the connection died: look at the slot again.
    Recheck,
    /// The deadline passed.
    TimedOut,
}

impl Connection {
    /// Waits for the reply to `call_id` (in slot `index`) until `deadline`, draining the ring
    /// while it holds it, or parked while another caller does; the payload goes into `out`.
    pub(super) fn wait_blocking(
        &self,
        index: usize,
        call_id: u64,
        deadline: Option<Instant>,
        out: &mut Vec<u8>,
    ) -> Result<Metadata, Status> {
        let slot = self.slots.get(index);
        let mut registered = false;
        let result = loop {
            if slot.state() == DONE {
                break self.slots.take_outcome(index, out);
            }
            if self.is_dead() {
                break self
                    .slots
                    .abandon(index, out)
                    .unwrap_or_else(|| Err(self.death_status()));
            }
            if let Some(mut consumer) = self.consumer.try_lock() {
                // We hold the ring: drain it, and wait on it, until our reply is in (or
                // something else ends the call); the lock is kept across the wait so the reply
                // is decoded the moment it lands.
                let ended = loop {
                    let max = self.config.max_message;
                    match self
                        .slots
                        .drain(&mut consumer, Some((call_id, &mut *out)), max)
                    {
                        Ok(OwnReply::Arrived(result)) => break WaitEnd::OwnReply(result),
                        Ok(OwnReply::NotYet) => {}
                        Err(what) => break WaitEnd::Corrupt(self.corrupt(&what)),
                    }
                    if slot.state() == DONE || self.is_dead() {
                        break WaitEnd::Recheck;
                    }
                    // Use the wait to get the next call's blocks ready.
                    let sharers = self.replica.sharers();
                    if let Some((start, count)) = self.lease.prepare_spare(
                        self.replica.table(),
                        self.replica.shared_head(),
                        sharers,
                    ) {
                        if let Some(run) = self.replica.run(start, count) {
                            prefetch_write_range(run.as_ptr(), run.len(), 64);
                        }
                    }
                    let waited = netless_ring::wait(
                        self.doorbell(),
                        &self.config.wait,
                        deadline,
                        self.max_sleep,
                        || {
                            (consumer.has_next() || self.is_dead() || slot.state() == DONE)
                                .then_some(())
                        },
                    );
                    if waited.is_err() {
                        break WaitEnd::TimedOut;
                    }
                };
                drop(consumer);
                self.after_consumer_release();
                match ended {
                    WaitEnd::OwnReply(result) => {
                        self.slots.free(index);
                        break result;
                    }
                    WaitEnd::Corrupt(status) => self.fail(status),
                    WaitEnd::Recheck => {}
                    WaitEnd::TimedOut => {
                        break self
                            .slots
                            .abandon(index, out)
                            .unwrap_or_else(|| Err(deadline_status()));
                    }
                }
            } else {
                if !registered {
                    *lock(&slot.thread) = Some(thread::current());
                    slot.has_thread.store(true, Ordering::Release);
                    self.slots.parked.fetch_add(1, Ordering::AcqRel);
                    registered = true;
                }
                // Re-check after registering so a delivery in between is not missed.
                if slot.state() == DONE {
                    continue;
                }
                let mut nap = Duration::from_millis(1);
                if let Some(d) = deadline {
                    let now = Instant::now();
                    if now >= d {
                        break self
                            .slots
                            .abandon(index, out)
                            .unwrap_or_else(|| Err(deadline_status()));
                    }
                    nap = nap.min(d - now);
                }
                thread::park_timeout(nap);
            }
        };
        // The slot (and its thread registration) was cleared when it was freed, before
        // anyone else could allocate it.
        if registered {
            self.slots.parked.fetch_sub(1, Ordering::AcqRel);
        }
        result
    }

    /// Called after dropping the consumer lock: let a parked waiter or the reaper take over.
    pub(crate) fn after_consumer_release(&self) {
        self.slots.unpark_waiting();
        // With a spinner, the reaper keeps off the ring anyway: waking it (a system call and
        // a context switch) after every poll would cost more than the call.
        if self.async_waiters.load(Ordering::Acquire) > 0
            && self.spinning.load(Ordering::Acquire) == 0
        {
            self.unpark_reaper();
        }
    }
}
