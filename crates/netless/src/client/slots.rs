//! A connection's call slots: one per call in flight, each holding the call's state, its
//! outcome once delivered, and who to wake (a parked thread or an async task). Replies are
//! drained from the response ring into the slots here, each validated first.
//!
//! A slot's state word packs a generation with the state, so every transition names the call
//! it is for: a reply for an abandoned call can never land in the slot's next call.

use std::sync::{Mutex, MutexGuard};
use std::task::Waker;
use std::thread::Thread;
use std::time::Instant;

use netless_ring::prefetch::prefetch_read_range;
use netless_ring::Consumer;

use super::call::Reply;
use crate::status::Status;
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use crate::wire::metadata::Metadata;
use crate::wire::reply::{decode_body, parse_response};

/// A slot word: `generation << 32 | state`.
pub(super) fn pack(generation: u32, state: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(state)
}
pub(super) fn state_of(word: u64) -> u32 {
    word as u32
}
pub(super) fn generation_of(word: u64) -> u32 {
    (word >> 32) as u32
}

pub(super) const IDLE: u32 = 0;
pub(super) const WAITING: u32 = 1;
pub(super) const DELIVERING: u32 = 2;
pub(super) const DONE: u32 = 3;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn deadline_status() -> Status {
    Status::deadline_exceeded("deadline expired before the server replied")
}

/// One call in flight.
pub(super) struct CallSlot {
    /// `generation << 32 | state` in one word, so every transition names the call it is
    /// for: a reply for an abandoned call can never land in the slot's next call.
    pub(super) state: AtomicU64,
    outcome: Mutex<Option<Result<Reply, Status>>>,
    partial: Mutex<(Vec<u8>, usize)>,
    pub(super) waker: Mutex<Option<Waker>>,
    pub(super) thread: Mutex<Option<Thread>>,
    /// Set while `thread` holds a registration, so freeing the slot only locks when needed.
    pub(super) has_thread: AtomicBool,
    pub(super) is_async: AtomicBool,
    pub(super) deadline: Mutex<Option<Instant>>,
}

impl CallSlot {
    fn new() -> CallSlot {
        CallSlot {
            state: AtomicU64::new(u64::from(IDLE)),
            outcome: Mutex::new(None),
            partial: Mutex::new((Vec::new(), 0)),
            waker: Mutex::new(None),
            thread: Mutex::new(None),
            has_thread: AtomicBool::new(false),
            is_async: AtomicBool::new(false),
            deadline: Mutex::new(None),
        }
    }

    /// The slot's state now.
    #[inline(always)]
    pub(super) fn state(&self) -> u32 {
        state_of(self.state.load(Ordering::Acquire))
    }
}

/// The outcome of draining the ring for one's own call.
pub(super) enum OwnReply {
    /// It has not arrived yet.
    NotYet,
    /// It arrived and was decoded.
    Arrived(Result<Metadata, Status>),
}

/// The slots of one connection, their free list, and what waiting callers need to know.
pub(super) struct CallSlots {
    slots: Box<[CallSlot]>,
    /// One bit per slot, set while it is free.
    free: Box<[AtomicU64]>,
    /// Threads parked waiting for another to drain their reply.
    pub(super) parked: AtomicU32,
    /// Replies delivered so far: a spinner keeps spinning while replies keep coming.
    pub(super) delivered: AtomicU64,
    /// Calls given up on whose replies have not arrived yet: the reaper drains the ring for
    /// them, so late replies never fill it up while nobody else is waiting.
    pub(super) abandoned: AtomicU32,
}

impl CallSlots {
    pub(super) fn new(n: usize) -> CallSlots {
        let words = n.div_ceil(64);
        CallSlots {
            slots: (0..n).map(|_| CallSlot::new()).collect(),
            free: (0..words)
                .map(|w| {
                    let bits = (n - w * 64).min(64);
                    AtomicU64::new(if bits == 64 {
                        u64::MAX
                    } else {
                        (1u64 << bits) - 1
                    })
                })
                .collect(),
            parked: AtomicU32::new(0),
            delivered: AtomicU64::new(0),
            abandoned: AtomicU32::new(0),
        }
    }

    /// Slots in all.
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(super) fn get(&self, index: usize) -> &CallSlot {
        &self.slots[index]
    }

    /// Takes a free slot.
    pub(super) fn alloc(&self) -> Option<usize> {
        for (w, word) in self.free.iter().enumerate() {
            let mut bits = word.load(Ordering::Relaxed);
            while bits != 0 {
                let bit = bits.trailing_zeros();
                match word.compare_exchange_weak(
                    bits,
                    bits & !(1 << bit),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Some(w * 64 + bit as usize),
                    Err(now) => bits = now,
                }
            }
        }
        None
    }

    /// Gives slot `index` back.
    pub(super) fn free(&self, index: usize) {
        // Every path that completes a call takes its outcome first, so there is nothing to
        // clear here (and no lock on the hot path).
        let slot = &self.slots[index];
        // Only the slot's owner registers a thread, and the owner frees it: a plain load
        // keeps the common case free of locked instructions.
        if slot.has_thread.load(Ordering::Relaxed) && slot.has_thread.swap(false, Ordering::AcqRel)
        {
            *lock(&slot.thread) = None;
        }
        slot.is_async.store(false, Ordering::Relaxed);
        let generation = generation_of(slot.state.load(Ordering::Relaxed));
        slot.state.store(pack(generation, IDLE), Ordering::Release);
        self.free[index / 64].fetch_or(1 << (index % 64), Ordering::Release);
    }

    /// Gives up on a call. If its outcome is being delivered right now, returns it instead.
    pub(super) fn abandon(
        &self,
        index: usize,
        out: &mut Vec<u8>,
    ) -> Option<Result<Metadata, Status>> {
        let slot = &self.slots[index];
        // Only the call's owner abandons it, so the generation in the word is its own.
        let word = slot.state.load(Ordering::Acquire);
        let generation = generation_of(word);
        if state_of(word) == WAITING
            && slot
                .state
                .compare_exchange(
                    word,
                    pack(generation, IDLE),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
        {
            lock(&slot.partial).0 = Vec::new();
            self.free(index);
            self.abandoned.fetch_add(1, Ordering::AcqRel);
            return None;
        }
        while state_of(slot.state.load(Ordering::Acquire)) == DELIVERING {
            std::hint::spin_loop();
        }
        Some(self.take_outcome(index, out))
    }

    /// The outcome of the call done in slot `index`, its payload appended to `out`; frees
    /// the slot.
    pub(super) fn take_outcome(&self, index: usize, out: &mut Vec<u8>) -> Result<Metadata, Status> {
        let outcome = lock(&self.slots[index].outcome).take();
        self.free(index);
        match outcome {
            Some(Ok(reply)) => {
                out.extend_from_slice(&reply.payload);
                Ok(reply.metadata)
            }
            Some(Err(status)) => Err(status),
            None => Err(Status::internal("call completed without an outcome")),
        }
    }

    /// The outcome of the call done in slot `index`; frees the slot.
    pub(super) fn take_reply(&self, index: usize) -> Result<Reply, Status> {
        let outcome = lock(&self.slots[index].outcome).take();
        self.free(index);
        outcome.unwrap_or_else(|| Err(Status::internal("call completed without an outcome")))
    }

    /// Completes the call of `generation` in slot `index` with `outcome` and wakes its
    /// caller; nothing if that call was abandoned meanwhile.
    pub(super) fn deliver(&self, index: usize, generation: u32, outcome: Result<Reply, Status>) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
        let slot = &self.slots[index];
        if slot
            .state
            .compare_exchange(
                pack(generation, WAITING),
                pack(generation, DELIVERING),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return; // abandoned meanwhile (and perhaps reused by a newer call)
        }
        *lock(&slot.outcome) = Some(outcome);
        slot.state.store(pack(generation, DONE), Ordering::Release);
        if let Some(t) = lock(&slot.thread).as_ref() {
            t.unpark();
        }
        if let Some(w) = lock(&slot.waker).take() {
            w.wake();
        }
    }

    /// Wakes the task of one waiting async call (leaving its waker registered).
    pub(super) fn nudge_one_async(&self) {
        for slot in self.slots.iter() {
            if slot.state() == WAITING && slot.is_async.load(Ordering::Relaxed) {
                if let Some(w) = lock(&slot.waker).as_ref() {
                    w.wake_by_ref();
                    return;
                }
            }
        }
    }

    /// Wakes every caller waiting on a call (blocked threads and async tasks).
    pub(super) fn wake_callers(&self) {
        for slot in self.slots.iter() {
            if slot.state() != IDLE {
                if let Some(t) = lock(&slot.thread).as_ref() {
                    t.unpark();
                }
                if let Some(w) = lock(&slot.waker).take() {
                    w.wake();
                }
            }
        }
    }

    /// Wakes the parked threads whose calls still wait, so one of them takes the ring.
    pub(super) fn unpark_waiting(&self) {
        if self.parked.load(Ordering::Acquire) == 0 {
            return;
        }
        for slot in self.slots.iter() {
            if slot.state() == WAITING {
                if let Some(t) = lock(&slot.thread).as_ref() {
                    t.unpark();
                }
            }
        }
    }

    /// Fails every async call whose deadline passed.
    pub(super) fn expire_async(&self) {
        let now = Instant::now();
        for (index, slot) in self.slots.iter().enumerate() {
            let word = slot.state.load(Ordering::Acquire);
            if state_of(word) == WAITING
                && slot.is_async.load(Ordering::Relaxed)
                && lock(&slot.deadline).is_some_and(|d| d <= now)
            {
                self.deliver(index, generation_of(word), Err(deadline_status()));
            }
        }
    }

    /// Drains every available response, delivering each to its caller. If `mine` is given
    /// and its response arrives whole, decodes it straight into the caller's buffer and
    /// stops. Every record is validated (the server writes the ring): `Err` with what was
    /// wrong, for the caller to close the connection.
    pub(super) fn drain(
        &self,
        consumer: &mut Consumer<'static>,
        mut mine: Option<(u64, &mut Vec<u8>)>,
        max_message: usize,
    ) -> Result<OwnReply, String> {
        loop {
            let record = match consumer.peek() {
                Ok(Some(record)) => record,
                Ok(None) => return Ok(OwnReply::NotYet),
                Err(e) => return Err(e.to_string()),
            };
            let body = record.body();
            // Ask for every line of the record at once (up to 4 KiB) rather than one miss at a
            // time as the copy below walks it.
            prefetch_read_range(body.as_ptr(), body.len(), 64);
            let (h, code, fragment) = parse_response(body, max_message)?;
            let index = (h.call_id & 0xffff_ffff) as usize;
            let generation = (h.call_id >> 32) as u32;
            let live = self
                .slots
                .get(index)
                .is_some_and(|s| s.state.load(Ordering::Acquire) == pack(generation, WAITING));
            if !live {
                // A reply to an abandoned call: once its last fragment is in, one fewer to
                // wait for.
                let last =
                    u64::from(h.frag_offset) + u64::from(h.frag_len) >= u64::from(h.body_len);
                record.release();
                if last {
                    let _ = self
                        .abandoned
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
                }
                continue;
            }
            let whole = h.frag_len == h.body_len;
            if whole {
                if let Some((id, ref mut out)) = mine {
                    if id == h.call_id {
                        let result = decode_body(&h, code, fragment, out);
                        record.release();
                        return Ok(OwnReply::Arrived(result));
                    }
                }
                let mut payload = Vec::new();
                let result = decode_body(&h, code, fragment, &mut payload)
                    .map(|metadata| Reply { metadata, payload });
                record.release();
                self.deliver(index, generation, result);
                continue;
            }
            // A fragment: collect it; decode once the body is complete.
            let complete = {
                let mut partial = lock(&self.slots[index].partial);
                if h.frag_offset == 0 || partial.0.len() != h.body_len as usize {
                    *partial = (vec![0; h.body_len as usize], 0);
                }
                let off = h.frag_offset as usize;
                netless_shm::copy::copy_slice(&mut partial.0[off..off + fragment.len()], fragment);
                partial.1 += fragment.len();
                (partial.1 >= partial.0.len()).then(|| std::mem::take(&mut partial.0))
            };
            record.release();
            if let Some(body) = complete {
                lock(&self.slots[index].partial).1 = 0;
                let mut payload = Vec::new();
                let result = decode_body(&h, code, &body, &mut payload);
                if let Some((id, ref mut out)) = mine {
                    if id == h.call_id {
                        netless_shm::copy::extend(out, &payload);
                        return Ok(OwnReply::Arrived(result));
                    }
                }
                self.deliver(
                    index,
                    generation,
                    result.map(|metadata| Reply { metadata, payload }),
                );
            }
        }
    }
}
