//! [`ReceiveQueue`]: the bounded MPMC queue of `u32` request descriptors that many client
//! processes enqueue into and the worker threads of one server process dequeue from.
//!
//! Shared memory holds the tail (producers' position, untrusted) and the cells; the
//! consumers' head is private to the server ([`ConsumerHead`]), so no client can corrupt
//! it. A cell word is `turn << 32 | value`: for position `pos`, `lap = pos >> log2(cap)`,
//! the cell is free for `pos` when its turn is `2 * lap` and holds `pos`'s value when its
//! turn is `2 * lap + 1` (turns wrap at 32 bits). A value is published by a single CAS of
//! the cell, so a producer crashing at any instant leaves either nothing or a complete item
//! (never a hole); the tail bump that follows may be done by anyone ("helping").
//!
//! This module never blocks, never allocates and never trusts the tail or a cell word:
//! every loop is bounded, an impossible cell is overwritten and skipped, a hole (tail
//! bumped past an unfilled cell, which only a malicious client can create) is skipped.
//! It does not know what the `u32` means.
//!
//! Orderings: a successful fill is AcqRel (Release publishes whatever the client wrote
//! before enqueueing, e.g. the request payload; Acquire orders it after the consumer that
//! freed the cell). The consumer's take is AcqRel for the same reasons mirrored. Tail and
//! head CASes are Release (Acquire on success for head) and their loads Acquire, so that a
//! position observed as "passed" implies the cell transition that allowed passing it is
//! visible; the hole test and the corruption test rely on that (see `try_dequeue`).

use crate::layout::{self, LayoutError};
use crate::sync::hint::spin_loop;
use crate::sync::AtomicU64;
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed, Release};
#[cfg(not(loom))]
use core::ptr::NonNull;

/// Smallest capacity of a receive queue.
pub const MIN_CAPACITY: u32 = 2;
/// Largest capacity of a receive queue.
pub const MAX_CAPACITY: u32 = 1 << 20;

/// Attempts a producer makes before giving up with [`EnqueueError::Contended`].
const ENQUEUE_ATTEMPTS: u32 = 1000;
/// Attempts a consumer makes before answering [`Dequeue::Empty`].
const DEQUEUE_ATTEMPTS: u32 = 1000;

/// Why [`ReceiveQueue::try_enqueue`] did not enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EnqueueError {
    /// Every cell holds an item not yet dequeued: fail the call fast (NACK,
    /// `RESOURCE_EXHAUSTED`) or retry later.
    #[error("receive queue is full: the server is overloaded, fail fast (RESOURCE_EXHAUSTED) or retry later")]
    Full,
    /// The queue's shared state did not settle within a bounded number of attempts: heavy
    /// contention, or a tail corrupted by another client. Treat like `Full`.
    #[error("receive queue stayed contended for {ENQUEUE_ATTEMPTS} attempts (or its shared tail is corrupt): retry later")]
    Contended,
}

/// Outcome of [`ReceiveQueue::try_dequeue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dequeue {
    /// A value a producer enqueued (validate it: any client could have written it).
    Item(u32),
    /// Nothing to take now.
    Empty,
    /// A hole or a corrupt cell was skipped (evidence of a misbehaving client); call again.
    Skipped,
}

/// The consumers' position: private to the server process, shared by its worker threads.
/// Never place it in memory a client can write.
pub struct ConsumerHead(AtomicU64);

impl ConsumerHead {
    /// A head at position 0, for a queue fresh from [`ReceiveQueue::init`] or
    /// [`ReceiveQueue::from_parts`] over zeroed cells.
    pub fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// The current position (number of cells consumed or skipped so far).
    pub fn position(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

impl Default for ConsumerHead {
    fn default() -> Self {
        Self::new()
    }
}

impl core::fmt::Debug for ConsumerHead {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("ConsumerHead")
            .field(&self.position())
            .finish()
    }
}

/// A view of a receive queue in shared memory: cheap to copy, `Send + Sync`.
///
/// ```
/// use netless_ring::{ConsumerHead, Dequeue, ReceiveQueue};
/// use std::sync::atomic::AtomicU64;
///
/// let tail = AtomicU64::new(0);
/// let cells: Vec<AtomicU64> = (0..8).map(|_| AtomicU64::new(0)).collect();
/// let queue = ReceiveQueue::from_parts(&tail, &cells).unwrap();
/// let head = ConsumerHead::new();
/// queue.try_enqueue(42).unwrap();
/// assert_eq!(queue.try_dequeue(&head), Dequeue::Item(42));
/// assert_eq!(queue.try_dequeue(&head), Dequeue::Empty);
/// ```
#[derive(Clone, Copy)]
pub struct ReceiveQueue<'a> {
    tail: &'a AtomicU64,
    /// Invariant: `cells.len() == mask + 1`, a power of two in MIN..=MAX_CAPACITY.
    cells: &'a [AtomicU64],
    mask: u64,
    lap_shift: u32,
}

/// The turn at which a cell is free for a position of `lap`.
#[inline]
fn turn_empty(lap: u64) -> u32 {
    lap.wrapping_mul(2) as u32
}

#[inline]
fn empty_word(lap: u64) -> u64 {
    u64::from(turn_empty(lap)) << 32
}

#[inline]
fn full_word(lap: u64, value: u32) -> u64 {
    // (2 * lap) as u32 is even, so `| 1` is (2 * lap + 1) as u32.
    (u64::from(turn_empty(lap) | 1) << 32) | u64::from(value)
}

#[inline]
fn turn_of(word: u64) -> u32 {
    (word >> 32) as u32
}

impl<'a> ReceiveQueue<'a> {
    /// Bytes a region holding a queue of `capacity` cells needs (header, tail line, cells).
    pub const fn bytes_needed(capacity: u32) -> usize {
        2 * 64 + capacity as usize * 8
    }

    /// Builds a queue over a tail word and cells the caller owns (tests, loom models, or
    /// memory laid out by the caller). `cells.len()` must be a power of two in
    /// [`MIN_CAPACITY`]`..=`[`MAX_CAPACITY`]; a fresh queue has tail 0 and all cells 0.
    pub fn from_parts(tail: &'a AtomicU64, cells: &'a [AtomicU64]) -> Result<Self, LayoutError> {
        let capacity = cells.len() as u64;
        layout::check_capacity(capacity, MIN_CAPACITY.into(), MAX_CAPACITY.into())?;
        Ok(Self {
            tail,
            cells,
            mask: capacity - 1,
            lap_shift: capacity.trailing_zeros(),
        })
    }

    /// Server side: initialises a queue of `capacity` cells at `region` (header, tail 0,
    /// all cells free for lap 0) and returns a view of it. Re-initialising an existing
    /// queue discards its contents.
    ///
    /// # Safety
    /// - `region` is valid for reads and writes of `region_len` bytes for `'a` and stays
    ///   mapped for `'a`;
    /// - those bytes are only ever accessed as the atomics of this layout, by this and
    ///   other processes (no non-atomic Rust reference to them exists);
    /// - no thread of this process uses a view of a queue at `region` while `init` runs.
    #[cfg(not(loom))]
    pub unsafe fn init(
        region: NonNull<u8>,
        region_len: usize,
        capacity: u32,
    ) -> Result<Self, LayoutError> {
        layout::check_capacity(capacity.into(), MIN_CAPACITY.into(), MAX_CAPACITY.into())?;
        layout::check_region(region, region_len, Self::bytes_needed(capacity))?;
        // SAFETY: region checked for alignment and PAYLOAD_OFFSET bytes; validity and atomic
        // access are the caller's contract.
        let parts = unsafe { layout::region_parts(region) };
        layout::clear_header(parts.header);
        // SAFETY: bytes_needed(capacity) bytes are valid, so `capacity` u64 cells fit after
        // PAYLOAD_OFFSET; 8-aligned (region 64-aligned); only accessed atomically.
        let cells = unsafe { atomic_cells(parts.payload, capacity) };
        parts.position.store(0, Relaxed);
        for cell in cells {
            cell.store(empty_word(0), Relaxed);
        }
        layout::write_header(parts.header, layout::RECEIVE_QUEUE_MAGIC, capacity);
        Self::from_parts(parts.position, cells)
    }

    /// Server side: writes the header of the queue at `region` back as `init` wrote it, in
    /// case a faulty peer overwrote it (a client attaching later would refuse the queue),
    /// leaving its tail and cells alone. Nothing of this process reads the header after
    /// `init`.
    ///
    /// # Safety
    /// As for [`init`](Self::init), except that views of the queue may be in use.
    #[cfg(not(loom))]
    pub unsafe fn restore_header(
        region: NonNull<u8>,
        region_len: usize,
        capacity: u32,
    ) -> Result<(), LayoutError> {
        layout::check_capacity(capacity.into(), MIN_CAPACITY.into(), MAX_CAPACITY.into())?;
        layout::check_region(region, region_len, Self::bytes_needed(capacity))?;
        // SAFETY: region checked for alignment and size; validity and atomic access are the
        // caller's contract.
        let parts = unsafe { layout::region_parts(region) };
        layout::write_header(parts.header, layout::RECEIVE_QUEUE_MAGIC, capacity);
        Ok(())
    }

    /// Client side: attaches to a queue a server initialised at `region`. The capacity is
    /// read from the header once, validated (power of two, fits `region_len`) and never
    /// re-read.
    ///
    /// # Safety
    /// - `region` is valid for reads and writes of `region_len` bytes for `'a` and stays
    ///   mapped for `'a`;
    /// - those bytes are only ever accessed as the atomics of this layout (no non-atomic
    ///   Rust reference to them exists in this process). Their *values* need not be
    ///   trusted: they are validated.
    #[cfg(not(loom))]
    pub unsafe fn attach(region: NonNull<u8>, region_len: usize) -> Result<Self, LayoutError> {
        layout::check_region(region, region_len, layout::PAYLOAD_OFFSET)?;
        // SAFETY: checked above; the rest is the caller's contract.
        let parts = unsafe { layout::region_parts(region) };
        let capacity =
            layout::read_header(parts.header, layout::RECEIVE_QUEUE_MAGIC, "receive queue")?;
        layout::check_capacity(capacity.into(), MIN_CAPACITY.into(), MAX_CAPACITY.into())?;
        layout::check_region(region, region_len, Self::bytes_needed(capacity))?;
        // SAFETY: the region holds bytes_needed(capacity) bytes (checked just above).
        let cells = unsafe { atomic_cells(parts.payload, capacity) };
        Self::from_parts(parts.position, cells)
    }

    /// Number of cells.
    pub fn capacity(&self) -> u32 {
        self.cells.len() as u32
    }

    /// The shared tail position as producers last published it. Untrusted (any producer
    /// can write it): use only as a hint, e.g. to know when every entry enqueued before some
    /// moment has been dequeued.
    pub fn tail_hint(&self) -> u64 {
        self.tail.load(Relaxed)
    }

    /// Approximate number of queued items: shared tail minus `head`, clamped to
    /// `0..=capacity` (the tail is untrusted, so this is only a hint, e.g. for an SLO
    /// check before enqueueing).
    pub fn len_hint(&self, head: &ConsumerHead) -> u64 {
        let queued = self.tail.load(Relaxed).wrapping_sub(head.0.load(Relaxed));
        if (queued as i64) <= 0 {
            0
        } else {
            queued.min(self.mask + 1)
        }
    }

    /// Consumer (server) side: puts back a tail no honest producer leaves: more than a lap
    /// ahead of `head` (producers would find every cell "stale" and give up, the consumer
    /// would never believe it, and the queue would stay jammed for good), more than a lap
    /// behind it, or behind it at a cell producers can neither fill nor pass (one a faulty
    /// client scribbled on after the consumer skipped it: the head never comes back to it,
    /// so nobody would ever free it). The repaired tail is just past the run of filled
    /// cells from `head`, where the next producer fills; any other tail within a lap of
    /// `head` is left alone (a producer that filled a cell and has not bumped the tail yet
    /// leaves it one behind, at a cell the others bump past). Returns the tail it wrote, if
    /// it repaired one. Costs one load when the tail is sane (two when it is behind), and
    /// up to a lap of cell loads when it is not.
    pub fn repair_tail(&self, head: &ConsumerHead) -> Option<u64> {
        let h = head.0.load(Acquire);
        let seen = self.tail.load(Acquire);
        let ahead = seen.wrapping_sub(h) as i64;
        let lap = (self.mask + 1) as i64;
        // Producers at `seen` fill a cell at turn offset 0 and bump past one at 1 to 3;
        // they give up on any other (as Full or Contended).
        let passable = || {
            let word = self.cell(seen).load(Acquire);
            turn_of(word).wrapping_sub(turn_empty(seen >> self.lap_shift)) <= 3
        };
        if (0..=lap).contains(&ahead) || (-lap..0).contains(&ahead) && passable() {
            return None;
        }
        let mut t = h;
        for _ in 0..=self.mask {
            let word = self.cell(t).load(Acquire);
            if turn_of(word).wrapping_sub(turn_empty(t >> self.lap_shift)) != 1 {
                break;
            }
            t = t.wrapping_add(1);
        }
        // Failure: a producer or another repair moved it meanwhile; the next check sees.
        self.tail
            .compare_exchange(seen, t, Release, Relaxed)
            .is_ok()
            .then_some(t)
    }

    /// What a faulty producer can do to the shared tail (any process that maps the queue can
    /// write it): for tests of [`ReceiveQueue::repair_tail`] across processes.
    #[doc(hidden)]
    pub fn overwrite_tail(&self, value: u64) {
        self.tail.store(value, Release);
    }

    #[inline]
    fn cell(&self, position: u64) -> &'a AtomicU64 {
        // In bounds: `position & mask < cells.len()` by the struct invariant.
        &self.cells[(position & self.mask) as usize]
    }

    /// Producer (client) side: enqueues `value`, lock-free, in a bounded number of steps.
    pub fn try_enqueue(&self, value: u32) -> Result<(), EnqueueError> {
        for attempt in 0..ENQUEUE_ATTEMPTS {
            let t = self.tail.load(Acquire);
            let lap = t >> self.lap_shift;
            let cell = self.cell(t);
            // First try: assume the cell is free for `t` and CAS straight away. The cell's
            // line usually sits in the consumer's cache (it polls it); a load first would
            // fetch it shared and the CAS would then need a second trip to own it.
            let word = if attempt == 0 {
                match cell.compare_exchange(empty_word(lap), full_word(lap, value), AcqRel, Acquire)
                {
                    Ok(_) => {
                        let _ = self
                            .tail
                            .compare_exchange(t, t.wrapping_add(1), Release, Relaxed);
                        return Ok(());
                    }
                    Err(actual) => actual,
                }
            } else {
                cell.load(Acquire)
            };
            match turn_of(word).wrapping_sub(turn_empty(lap)) {
                // Free for position t: claim and fill it in one step.
                0 => {
                    if cell
                        .compare_exchange(word, full_word(lap, value), AcqRel, Relaxed)
                        .is_ok()
                    {
                        // Failure means another producer already helped.
                        let _ = self
                            .tail
                            .compare_exchange(t, t.wrapping_add(1), Release, Relaxed);
                        return Ok(());
                    }
                }
                // 1: filled for t, tail not bumped yet. 2, 3: consumed (or skipped) for t,
                // so t is certainly behind. Help bump the tail; failure means it moved.
                1..=3 => {
                    let _ = self
                        .tail
                        .compare_exchange(t, t.wrapping_add(1), Release, Relaxed);
                }
                // Still holds the item of position t - capacity.
                u32::MAX => return Err(EnqueueError::Full),
                // Tail stale (we were preempted) or corrupt: re-read.
                _ => spin_loop(),
            }
        }
        Err(EnqueueError::Contended)
    }

    /// Consumer (server worker) side: takes the next item, never blocks, bounded steps.
    /// `head` must be the one head of this queue shared by all its consumers.
    pub fn try_dequeue(&self, head: &ConsumerHead) -> Dequeue {
        self.dequeue(head, true, false, |_| {})
    }

    /// Like [`ReceiveQueue::try_dequeue`], with two knobs for a polling consumer:
    /// `check_holes: false` reports an unfilled cell as `Empty` without reading the shared
    /// tail (see [`ReceiveQueue::try_dequeue_no_hole_check`]), and `on_full` is called with
    /// the value of a filled cell *before* the consumer claims it, so the consumer can start
    /// fetching what the value names (e.g. prefetch a request) while the claim's CAS waits
    /// for the cell's cache line. `on_full` may be called for a value another consumer then
    /// wins; it must only take hints.
    pub fn try_dequeue_with(
        &self,
        head: &ConsumerHead,
        check_holes: bool,
        on_full: impl FnMut(u32),
    ) -> Dequeue {
        self.dequeue(head, check_holes, false, on_full)
    }

    /// [`ReceiveQueue::try_dequeue_with`] for a queue that only one thread ever consumes
    /// (with this `head`): taking an item is then two plain Release stores instead of two
    /// CASes, so the consumer does not stall until the cell's cache line is back from the
    /// producer's core. Using it from two consumers at once would hand an item to both.
    #[inline(always)]
    pub fn try_dequeue_single_consumer(
        &self,
        head: &ConsumerHead,
        check_holes: bool,
        mut on_full: impl FnMut(u32),
    ) -> Dequeue {
        // The common case inline: the cell at the head is full (`dequeue`'s first turn).
        let h = head.0.load(Acquire);
        let lap = h >> self.lap_shift;
        let cell = self.cell(h);
        let word = cell.load(Acquire);
        if turn_of(word).wrapping_sub(turn_empty(lap)) == 1 {
            on_full(word as u32);
            cell.store(empty_word(lap.wrapping_add(1)), Release);
            head.0.store(h.wrapping_add(1), Release);
            return Dequeue::Item(word as u32);
        }
        self.dequeue(head, check_holes, true, on_full)
    }

    /// Starts taking the cell the next enqueue will fill exclusive (a hint; see
    /// [`crate::prefetch`]), so a producer about to enqueue overlaps that transfer with
    /// writing its message.
    pub fn prefetch_next_cell(&self) {
        let t = self.tail.load(Relaxed);
        crate::prefetch::prefetch_write((self.cell(t) as *const AtomicU64).cast());
    }

    /// Starts taking exclusive the cell `ahead` positions past the next one to fill (a hint).
    /// A producer enqueueing steadily calls it with a line's worth of cells, so the line its
    /// later enqueues need arrives while it writes messages, not during the enqueue's CAS;
    /// the consumer, polling the cell at the tail, is not robbed of that line.
    pub fn prefetch_cell_ahead(&self, ahead: u64) {
        let t = self.tail.load(Relaxed).wrapping_add(ahead);
        crate::prefetch::prefetch_write((self.cell(t) as *const AtomicU64).cast());
    }

    /// Like [`ReceiveQueue::try_dequeue`], but an unfilled cell is reported `Empty` without
    /// reading the shared tail, so a consumer polling an idle queue touches only the one cell
    /// a producer will write next (the tail's cache line stays with the producers). Holes a
    /// malicious producer made are then not skipped: call `try_dequeue` every so often (e.g.
    /// every few hundred polls, and before sleeping) so they are.
    pub fn try_dequeue_no_hole_check(&self, head: &ConsumerHead) -> Dequeue {
        self.dequeue(head, false, false, |_| {})
    }

    #[inline]
    fn dequeue(
        &self,
        head: &ConsumerHead,
        check_holes: bool,
        single_consumer: bool,
        mut on_full: impl FnMut(u32),
    ) -> Dequeue {
        for _ in 0..DEQUEUE_ATTEMPTS {
            let h = head.0.load(Acquire);
            let lap = h >> self.lap_shift;
            let cell = self.cell(h);
            let word = cell.load(Acquire);
            let freed = empty_word(lap.wrapping_add(1));
            // While head == h, an honest cell at h is at turn offset 0 (not filled yet),
            // 1 (filled), 2 (taken by a worker that has not bumped head yet) or 3 (taken,
            // then refilled for h + capacity). Positions two laps ahead need head > h.
            match turn_of(word).wrapping_sub(turn_empty(lap)) {
                1 => {
                    on_full(word as u32);
                    if single_consumer {
                        // No other consumer can race us for this cell, and producers never
                        // write a full cell, so plain stores free it and advance the head.
                        cell.store(freed, Release);
                        head.0.store(h.wrapping_add(1), Release);
                        return Dequeue::Item(word as u32);
                    }
                    if cell.compare_exchange(word, freed, AcqRel, Relaxed).is_ok() {
                        advance(head, h);
                        return Dequeue::Item(word as u32);
                    }
                }
                2 | 3 => advance(head, h),
                0 => {
                    // Not filled. A producer bumps the tail past h only after cell h is
                    // full, and our Acquire load of the tail then makes that fill visible to
                    // the CAS below (which would fail). So "tail > h and still unfilled" is
                    // a hole only a malicious client creates: skip it. A tail more than a
                    // lap ahead is not believed (it would make us skip forever).
                    if !check_holes {
                        return Dequeue::Empty;
                    }
                    let ahead = self.tail.load(Acquire).wrapping_sub(h);
                    if ahead == 0 || ahead > self.mask + 1 {
                        if ahead != 0 {
                            // Jammed by a tail no honest producer leaves: put it back.
                            let _ = self.repair_tail(head);
                        }
                        return Dequeue::Empty;
                    }
                    if cell.compare_exchange(word, freed, AcqRel, Relaxed).is_ok() {
                        advance(head, h);
                        return Dequeue::Skipped;
                    }
                }
                _ => {
                    // Impossible while head == h. If head moved, our h was stale (the
                    // cell transition we saw happens-after that head bump, so this load
                    // sees it): retry. Otherwise the cell is corrupt: free it and skip.
                    if head.0.load(Acquire) != h {
                        continue;
                    }
                    if cell.compare_exchange(word, freed, AcqRel, Relaxed).is_ok() {
                        advance(head, h);
                        return Dequeue::Skipped;
                    }
                }
            }
        }
        Dequeue::Empty
    }
}

/// Moves the head from `h` to `h + 1` unless another worker already did.
#[inline]
fn advance(head: &ConsumerHead, h: u64) {
    // AcqRel: Release so a worker that reads the new head also sees the cell transition
    // that allowed it; Acquire keeps the chain of head bumps transitive.
    let _ = head
        .0
        .compare_exchange(h, h.wrapping_add(1), AcqRel, Relaxed);
}

/// # Safety
/// `payload` is 8-aligned and valid for `capacity * 8` bytes for `'a`, accessed only
/// atomically.
#[cfg(not(loom))]
unsafe fn atomic_cells<'a>(payload: NonNull<u8>, capacity: u32) -> &'a [AtomicU64] {
    // SAFETY: caller's contract; AtomicU64 has the size and alignment of u64 and every bit
    // pattern is valid.
    unsafe { core::slice::from_raw_parts(payload.cast::<AtomicU64>().as_ptr(), capacity as usize) }
}

impl core::fmt::Debug for ReceiveQueue<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ReceiveQueue")
            .field("capacity", &self.capacity())
            .field("tail", &self.tail.load(Relaxed))
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn parts(capacity: usize) -> (AtomicU64, Vec<AtomicU64>) {
        (
            AtomicU64::new(0),
            (0..capacity).map(|_| AtomicU64::new(0)).collect(),
        )
    }

    #[test]
    fn turns() {
        assert_eq!(turn_empty(0), 0);
        assert_eq!(turn_of(full_word(0, 7)), 1);
        assert_eq!(turn_of(full_word(3, 7)), 7);
        assert_eq!(full_word(3, 7) as u32, 7);
        // Wrapping: lap 2^31 has turn 0 again.
        assert_eq!(turn_empty(1 << 31), 0);
        assert_eq!(turn_of(full_word(u64::MAX, 1)), u32::MAX);
    }

    #[test]
    fn rejects_bad_capacities() {
        for n in [0usize, 1, 3, 6, 12] {
            let (tail, cells) = parts(n);
            assert!(matches!(
                ReceiveQueue::from_parts(&tail, &cells),
                Err(LayoutError::BadCapacity { .. })
            ));
        }
    }

    #[test]
    fn fifo_single_thread_with_wrap() {
        let (tail, cells) = parts(4);
        let q = ReceiveQueue::from_parts(&tail, &cells).unwrap();
        let head = ConsumerHead::new();
        for round in 0..100u32 {
            for i in 0..3 {
                q.try_enqueue(round * 10 + i).unwrap();
            }
            assert_eq!(q.len_hint(&head), 3);
            for i in 0..3 {
                assert_eq!(q.try_dequeue(&head), Dequeue::Item(round * 10 + i));
            }
            assert_eq!(q.try_dequeue(&head), Dequeue::Empty);
        }
    }

    #[test]
    fn region_init_and_attach() {
        let capacity = 16;
        #[repr(C, align(64))]
        #[derive(Clone, Copy)]
        struct Line([u8; 64]);
        let lines = ReceiveQueue::bytes_needed(capacity).div_ceil(64);
        let mut backing = vec![Line([0xa5; 64]); lines];
        let region = NonNull::new(backing.as_mut_ptr().cast::<u8>()).unwrap();
        let len = backing.len() * 64;
        // SAFETY: `backing` outlives the views and is only accessed through them.
        let server = unsafe { ReceiveQueue::init(region, len, capacity) }.unwrap();
        // SAFETY: same region.
        let client = unsafe { ReceiveQueue::attach(region, len) }.unwrap();
        assert_eq!(client.capacity(), 16);
        client.try_enqueue(5).unwrap();
        let head = ConsumerHead::new();
        assert_eq!(server.try_dequeue(&head), Dequeue::Item(5));
        // SAFETY: the first 64 bytes of `backing`, accessed only as this layout's atomics.
        let too_small = unsafe { ReceiveQueue::attach(region, 64) };
        assert!(matches!(too_small, Err(LayoutError::TooSmall { .. })));
        // SAFETY: region + 8 is in bounds.
        let misaligned = unsafe { region.add(8) };
        // SAFETY: `len - 8` bytes of `backing` from `misaligned`, accessed only as this
        // layout's atomics (it fails on alignment before reading any).
        let misaligned = unsafe { ReceiveQueue::attach(misaligned, len - 8) };
        assert!(matches!(misaligned, Err(LayoutError::Misaligned { .. })));
    }
}
