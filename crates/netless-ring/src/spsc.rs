//! The response ring: a single-producer single-consumer ring of variable-length byte
//! records in 64-byte slots. The client that owns a connection creates it and consumes
//! from it ([`Consumer`]); the server produces into it ([`Producer`], serialised by the
//! server's own lock).
//!
//! Each record starts on a slot boundary with an 8-byte record word
//! `tag << 32 | len` followed by `len` body bytes, and occupies
//! `ceil((8 + len) / 64)` slots; `tag` is the low 32 bits of `position + 1` of its first
//! slot, so a record word left from an earlier lap never carries the tag the consumer
//! expects. Records never wrap: one that does not fit before the end of the slot array is
//! preceded by a PAD record (`len == u32::MAX`, "continue at slot 0"). The producer writes
//! the body with a plain `memcpy`, then publishes the record word with a Release store; the
//! consumer Acquire-loads it. The consumer publishes its head (in slots) with a Release
//! store once it has finished with a record; the producer Acquire-loads it only when its
//! cached copy says the ring is full.
//!
//! Stale *body* bytes of an earlier lap could happen to sit where the next record word will
//! go and carry the right tag by chance (bodies are application data). So before publishing
//! a record the producer makes sure the slot after it holds a "barrier" word that can never
//! match (`!tag << 32`), whenever that slot is free. It writes them a few slots ahead
//! (`CLEAR_AHEAD`), not just after each record: the slot after a record is where the
//! consumer polls next, and its line is best left to it until the next record goes there.
//!
//! This module validates every value it reads from the other side (a head outside
//! `tail - nslots ..= tail`, a `len` that does not fit, a PAD at slot 0 → `Corrupt`), never
//! loops on it, and never allocates on the push / peek / release paths. It does not know
//! what the bytes mean.

use crate::layout::{self, LayoutError, SLOT_BYTES};
use crate::sync::AtomicU64;
use crate::sync::Ordering::{Acquire, Relaxed, Release};
#[cfg(not(loom))]
use core::{marker::PhantomData, ptr::NonNull};

/// Smallest number of slots of a response ring.
pub const MIN_SLOTS: u32 = 4;
/// Largest number of slots of a response ring (1 GiB).
pub const MAX_SLOTS: u32 = 1 << 24;

/// `len` of a PAD record.
const PAD_LEN: u32 = u32::MAX;
/// Slots past a record's end that the producer has barrier words in before it publishes.
const CLEAR_AHEAD: u64 = 8;
/// Size of the record word at the start of a record.
const RECORD_WORD_BYTES: usize = 8;
/// `u64` words per slot.
const WORDS_PER_SLOT: usize = SLOT_BYTES / 8;

/// Why [`Producer::try_push`] did not push.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    /// Not enough free slots now: retry once the client has consumed responses.
    #[error("response ring is full: the client has not consumed its responses yet, retry later")]
    Full,
    /// The record is longer than [`Producer::max_record_len`] and can never be pushed.
    #[error("record is larger than this response ring can ever hold: send it by reference")]
    TooLarge,
    /// The consumer's head (in memory the client writes) is impossible.
    #[error("response ring head is corrupt: the client is misbehaving, close the connection")]
    Corrupt,
}

/// The other side wrote an impossible record word into the response ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("response ring holds a corrupt record: the server is misbehaving, close the connection")]
pub struct Corrupt;

#[inline]
fn tag(position: u64) -> u32 {
    position.wrapping_add(1) as u32
}

#[inline]
fn record_word(tag: u32, len: u32) -> u64 {
    (u64::from(tag) << 32) | u64::from(len)
}

/// Slots a record with a `len`-byte body occupies.
#[inline]
fn slots_for(len: usize) -> u64 {
    // len <= u32::MAX here, so no overflow on 64-bit targets.
    (RECORD_WORD_BYTES + len).div_ceil(SLOT_BYTES) as u64
}

/// The slot array: raw shared memory normally, `u64` atomics under loom (so the model
/// checks that body bytes are published by the record word's Release/Acquire).
#[derive(Clone, Copy)]
struct Slots<'a> {
    #[cfg(not(loom))]
    base: NonNull<u8>,
    #[cfg(not(loom))]
    _memory: PhantomData<&'a [AtomicU64]>,
    #[cfg(loom)]
    words: &'a [AtomicU64],
    /// Power of two in MIN_SLOTS..=MAX_SLOTS.
    nslots: u64,
}

// `Slots` is a pointer to shared memory valid for `'a` (constructor contracts). Its record
// words are only accessed atomically; body bytes are written only by the single producer
// into slots the consumer released, and read only by the single consumer after the Acquire
// of the record word. That discipline holds whatever thread each side runs on.
#[cfg(not(loom))]
// SAFETY: see the paragraph above.
unsafe impl Send for Slots<'_> {}
#[cfg(not(loom))]
// SAFETY: as above; shared access gives only atomic loads/stores of record words.
unsafe impl Sync for Slots<'_> {}

impl<'a> Slots<'a> {
    #[inline]
    fn mask(&self) -> u64 {
        self.nslots - 1
    }

    #[inline]
    fn max_record_len(&self) -> usize {
        (self.nslots / 2) as usize * SLOT_BYTES - RECORD_WORD_BYTES
    }

    /// The record word of the slot at `position` (masked, so always in bounds).
    #[cfg(not(loom))]
    #[inline]
    fn record_word(&self, position: u64) -> &'a AtomicU64 {
        let index = (position & self.mask()) as usize;
        // SAFETY: index < nslots and the array is nslots * 64 bytes valid for 'a, 8-aligned;
        // record words are only ever accessed atomically while they may be shared.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(index * SLOT_BYTES).cast::<u64>()) }
    }

    #[cfg(loom)]
    #[inline]
    fn record_word(&self, position: u64) -> &'a AtomicU64 {
        &self.words[(position & self.mask()) as usize * WORDS_PER_SLOT]
    }

    /// Where the body of the record whose first slot is at `position` starts.
    #[cfg(not(loom))]
    #[inline]
    fn body_ptr(&self, position: u64) -> *mut u8 {
        let offset = (position & self.mask()) as usize * SLOT_BYTES + RECORD_WORD_BYTES;
        // SAFETY: the slot is inside the array (masked), so its body's first byte is too.
        unsafe { self.base.as_ptr().add(offset) }
    }

    /// Copies the concatenation of `parts` (`len` bytes) into the body of the record whose
    /// first slot is at `position`.
    ///
    /// # Safety
    /// `(position & mask) + slots_for(len) <= nslots`, the sum of `parts`' lengths is `len`,
    /// and the consumer has released those slots (the single producer owns them).
    #[cfg(not(loom))]
    #[inline]
    unsafe fn write_body(&self, position: u64, parts: &[&[u8]], len: usize) {
        debug_assert!(
            (position & self.mask()) as usize * SLOT_BYTES + RECORD_WORD_BYTES + len
                <= self.nslots as usize * SLOT_BYTES
        );
        let mut dst = self.body_ptr(position);
        for part in parts {
            // The parts add up to `len`, so every write stays inside the body; a `&[u8]`
            // argument cannot overlap the slots, which the producer owns now.
            // SAFETY: in bounds and exclusive, as just said (and the caller's contract).
            unsafe {
                netless_shm::copy::copy_bytes(part.as_ptr(), dst, part.len());
                dst = dst.add(part.len());
            }
        }
    }

    #[cfg(loom)]
    unsafe fn write_body(&self, position: u64, parts: &[&[u8]], _len: usize) {
        let mut index = (position & self.mask()) as usize * WORDS_PER_SLOT + 1;
        let (mut word, mut filled) = (0u64, 0);
        for &byte in parts.iter().flat_map(|part| part.iter()) {
            word |= u64::from(byte) << (8 * filled);
            filled += 1;
            if filled == 8 {
                self.words[index].store(word, Relaxed);
                index += 1;
                (word, filled) = (0, 0);
            }
        }
        if filled > 0 {
            self.words[index].store(word, Relaxed);
        }
    }

    /// The body of the record at `position`.
    ///
    /// # Safety
    /// `(position & mask) + slots_for(len) <= nslots`, and the returned slice must not be
    /// used after the consumer releases the record.
    #[cfg(not(loom))]
    #[inline]
    unsafe fn body<'r>(&self, position: u64, len: usize) -> &'r [u8] {
        let offset = (position & self.mask()) as usize * SLOT_BYTES + RECORD_WORD_BYTES;
        // SAFETY: in bounds by the caller's contract; the producer does not write these
        // bytes until the record is released (SPSC protocol).
        unsafe { core::slice::from_raw_parts(self.base.as_ptr().add(offset), len) }
    }

    #[cfg(loom)]
    fn copy_body(&self, position: u64, len: usize, out: &mut [u8]) -> usize {
        let first = (position & self.mask()) as usize * WORDS_PER_SLOT + 1;
        let n = len.min(out.len());
        for (i, chunk) in out[..n].chunks_mut(8).enumerate() {
            let bytes = self.words[first + i].load(Relaxed).to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        n
    }
}

/// Constructors of a response ring; the ring itself is the pair [`Producer`] /
/// [`Consumer`].
///
/// ```
/// use netless_ring::ResponseRing;
/// use std::sync::atomic::AtomicU64;
///
/// let mut head = AtomicU64::new(0);
/// let mut slots: Vec<AtomicU64> = (0..16 * 8).map(|_| AtomicU64::new(0)).collect();
/// let (mut producer, mut consumer) = ResponseRing::from_parts(&mut head, &mut slots).unwrap();
/// producer.try_push(&[b"header:", b"payload"]).unwrap();
/// let record = consumer.peek().unwrap().unwrap();
/// assert_eq!(record.body(), b"header:payload");
/// record.release();
/// assert!(consumer.peek().unwrap().is_none());
/// ```
#[derive(Debug)]
pub enum ResponseRing {}

impl ResponseRing {
    /// Bytes a region holding a ring of `nslots` slots needs (header, head line, slots).
    pub const fn bytes_needed(nslots: u32) -> usize {
        layout::PAYLOAD_OFFSET + nslots as usize * SLOT_BYTES
    }

    /// Builds a ring over memory the caller owns exclusively for `'a` (tests, loom models):
    /// `slot_words` is `nslots * 8` words, `nslots` a power of two in
    /// [`MIN_SLOTS`]`..=`[`MAX_SLOTS`]. A fresh ring has head 0 and all words 0 (this
    /// function does not clear them).
    #[allow(clippy::type_complexity)]
    pub fn from_parts<'a>(
        head: &'a mut AtomicU64,
        slot_words: &'a mut [AtomicU64],
    ) -> Result<(Producer<'a>, Consumer<'a>), LayoutError> {
        let nslots = (slot_words.len() / WORDS_PER_SLOT) as u64;
        layout::check_capacity(nslots, MIN_SLOTS.into(), MAX_SLOTS.into())?;
        if !slot_words.len().is_multiple_of(WORDS_PER_SLOT) {
            return Err(LayoutError::BadCapacity {
                capacity: slot_words.len() as u64,
                min: u64::from(MIN_SLOTS) * WORDS_PER_SLOT as u64,
                max: u64::from(MAX_SLOTS) * WORDS_PER_SLOT as u64,
            });
        }
        let head: &'a AtomicU64 = head;
        #[cfg(not(loom))]
        let slots = Slots {
            // Writes through this pointer are allowed: the words are `UnsafeCell`s and we
            // hold the only borrow of them for 'a.
            base: NonNull::from(&mut *slot_words).cast::<u8>(),
            _memory: PhantomData,
            nslots,
        };
        #[cfg(loom)]
        let slots = Slots {
            words: &*slot_words,
            nslots,
        };
        Ok(Self::split(head, slots))
    }

    fn split<'a>(head: &'a AtomicU64, slots: Slots<'a>) -> (Producer<'a>, Consumer<'a>) {
        let position = head.load(Acquire);
        (
            Producer {
                head,
                slots,
                tail: position,
                cached_head: position,
                cleared: position,
            },
            Consumer {
                head_word: head,
                slots,
                head: position,
            },
        )
    }

    /// Client side: initialises a ring of `nslots` slots at `region` (header, head 0, all
    /// slots zeroed) and returns its consumer.
    ///
    /// # Safety
    /// - `region` is valid for reads and writes of `region_len` bytes for `'a` and stays
    ///   mapped for `'a`;
    /// - in this process, nothing else accesses those bytes during `'a` except the one
    ///   [`Producer`] obtained with [`ResponseRing::attach`] (no Rust references to them,
    ///   no second consumer, no second producer);
    /// - no other process writes the region while `init` runs. Afterwards the server's
    ///   producer writes slots and reads the head; a misbehaving server may change bytes
    ///   under the consumer, which is why record contents must be parsed defensively.
    #[cfg(not(loom))]
    pub unsafe fn init<'a>(
        region: NonNull<u8>,
        region_len: usize,
        nslots: u32,
    ) -> Result<Consumer<'a>, LayoutError> {
        layout::check_capacity(nslots.into(), MIN_SLOTS.into(), MAX_SLOTS.into())?;
        layout::check_region(region, region_len, Self::bytes_needed(nslots))?;
        // SAFETY: region checked for alignment and size; the rest is the caller's contract.
        let parts = unsafe { layout::region_parts(region) };
        layout::clear_header(parts.header);
        // SAFETY: nslots * 64 bytes follow the payload offset (size checked above); nobody
        // else accesses them during init (caller's contract).
        unsafe { core::ptr::write_bytes(parts.payload.as_ptr(), 0, nslots as usize * SLOT_BYTES) };
        parts.position.store(0, Relaxed);
        layout::write_header(parts.header, layout::RESPONSE_RING_MAGIC, nslots);
        let slots = Slots {
            base: parts.payload,
            _memory: PhantomData,
            nslots: nslots.into(),
        };
        Ok(Self::split(parts.position, slots).1)
    }

    /// Server side: attaches to a ring a client initialised at `region` and returns its
    /// producer. The slot count is read from the header once, validated and never
    /// re-read; the producer starts at the head the client published.
    ///
    /// # Safety
    /// - `region` is valid for reads and writes of `region_len` bytes for `'a` and stays
    ///   mapped for `'a`;
    /// - in this process, nothing else accesses those bytes during `'a` except the ring's
    ///   one [`Consumer`] (when both sides live in one process): at most one producer per
    ///   ring at a time (serialise pushes with a lock if several threads respond).
    ///   Values the client wrote are validated, not trusted.
    #[cfg(not(loom))]
    pub unsafe fn attach<'a>(
        region: NonNull<u8>,
        region_len: usize,
    ) -> Result<Producer<'a>, LayoutError> {
        layout::check_region(region, region_len, layout::PAYLOAD_OFFSET)?;
        // SAFETY: checked above; the rest is the caller's contract.
        let parts = unsafe { layout::region_parts(region) };
        let nslots =
            layout::read_header(parts.header, layout::RESPONSE_RING_MAGIC, "response ring")?;
        layout::check_capacity(nslots.into(), MIN_SLOTS.into(), MAX_SLOTS.into())?;
        layout::check_region(region, region_len, Self::bytes_needed(nslots))?;
        let slots = Slots {
            base: parts.payload,
            _memory: PhantomData,
            nslots: nslots.into(),
        };
        Ok(Self::split(parts.position, slots).0)
    }
}

/// The producing (server) side of a response ring. Not `Clone`: one producer per ring.
pub struct Producer<'a> {
    head: &'a AtomicU64,
    slots: Slots<'a>,
    /// Next free position (slots, monotonic).
    tail: u64,
    /// Last validated consumer head; `tail - cached_head <= nslots`.
    cached_head: u64,
    /// The free slots from `tail` up to here hold barrier words (see the module docs).
    cleared: u64,
}

impl Producer<'_> {
    /// Address of the record word the next push writes (for prefetch hints only: the slots
    /// there may still belong to the consumer).
    #[cfg(not(loom))]
    pub fn next_record_ptr(&self) -> *const u8 {
        (self.slots.record_word(self.tail) as *const AtomicU64).cast()
    }

    /// Starts taking exclusive the slots a record with a `body_len`-byte body would use if
    /// pushed now (a hint, see [`crate::prefetch`]; at most 4 lines), so the copy into them
    /// does not wait for the consumer's core to give them up.
    #[cfg(not(loom))]
    pub fn prefetch_next(&self, body_len: usize) {
        let word = self.slots.record_word(self.tail) as *const AtomicU64;
        crate::prefetch::prefetch_write_range(word.cast(), RECORD_WORD_BYTES + body_len, 4);
    }

    /// Largest body a record can have: `nslots / 2` slots minus the record word.
    pub fn max_record_len(&self) -> usize {
        self.slots.max_record_len()
    }

    /// Number of slots.
    pub fn nslots(&self) -> u32 {
        self.slots.nslots as u32
    }

    /// Next position (in slots) the producer writes.
    pub fn position(&self) -> u64 {
        self.tail
    }

    /// Appends one record whose body is the concatenation of `parts` (e.g. a header and a
    /// payload, without building a temporary buffer). Never blocks or allocates.
    pub fn try_push(&mut self, parts: &[&[u8]]) -> Result<(), PushError> {
        let mut len = 0usize;
        for part in parts {
            len = len.saturating_add(part.len());
        }
        let start = self.reserve(len)?;
        // The record fits before the end of the array and its slots are free (`reserve`).
        // SAFETY: write_body's contract holds, as just said.
        unsafe { self.slots.write_body(start, parts, len) };
        self.publish(start, len);
        Ok(())
    }

    /// [`Producer::try_push`] of a fixed-size header and a payload: the header is copied
    /// with a few plain stores instead of a call, and no list of parts is walked (a lone
    /// reply's path, once per call).
    #[inline]
    pub fn try_push_header<const H: usize>(
        &mut self,
        header: &[u8; H],
        payload: &[u8],
    ) -> Result<(), PushError> {
        let len = H.saturating_add(payload.len());
        let start = self.reserve(len)?;
        // The record's slots start..start + slots_for(len) are free and lie before the end
        // of the array (`reserve`); the arguments are caller memory, not the ring.
        #[cfg(not(loom))]
        // SAFETY: so the body's `len` bytes are in bounds and the producer's alone.
        unsafe {
            let body = self.slots.body_ptr(start);
            core::ptr::copy_nonoverlapping(header.as_ptr(), body, H);
            netless_shm::copy::copy_bytes(payload.as_ptr(), body.add(H), payload.len());
        }
        #[cfg(loom)]
        // SAFETY: as in `try_push`.
        unsafe {
            self.slots.write_body(start, &[header, payload], len)
        };
        self.publish(start, len);
        Ok(())
    }

    /// Claims room for a record with a `len`-byte body: writes the PAD before it if it
    /// would wrap, and the barrier after it; returns its first position. The body is then
    /// written there and [`Producer::publish`]ed.
    #[inline(always)]
    fn reserve(&mut self, len: usize) -> Result<u64, PushError> {
        if len > self.slots.max_record_len() {
            return Err(PushError::TooLarge);
        }
        let nslots = self.slots.nslots;
        let need = slots_for(len);
        let to_end = nslots - (self.tail & self.slots.mask());
        let pad = if need <= to_end { 0 } else { to_end };
        let start = self.tail.wrapping_add(pad);
        let end = start.wrapping_add(need);
        if end.wrapping_sub(self.cached_head) > nslots {
            // Acquire: the consumer's reads of the slots it released happen before we
            // overwrite them.
            let head = self.head.load(Acquire);
            // Untrusted: must be within one ring of our tail, not ahead of it.
            if self.tail.wrapping_sub(head) > nslots {
                return Err(PushError::Corrupt);
            }
            self.cached_head = head;
            if end.wrapping_sub(head) > nslots {
                return Err(PushError::Full);
            }
        }
        if pad != 0 {
            // Release is not needed for the PAD itself (it has no body) but costs nothing.
            self.slots
                .record_word(self.tail)
                .store(record_word(tag(self.tail), PAD_LEN), Release);
        }
        if (end.wrapping_sub(self.cleared) as i64) >= 0 {
            self.clear_ahead(end);
        }
        // The slot at `end`, if free, now holds a barrier: before `cleared`, the barriers
        // written earlier are untouched (only records before `end` were written since). If
        // it is not free it holds the record word of position end - nslots, which carries
        // a different tag and which nobody overwrites before the consumer passes it.
        Ok(start)
    }

    /// Writes barrier words at the free slots from `end` to [`CLEAR_AHEAD`] slots past it,
    /// so that whatever stale bytes they hold cannot be taken for a record, and moves
    /// `cleared` past them. Done ahead, not at `end` alone before each publish: that slot's
    /// line is the one the consumer polls next, and a store there now would take it from
    /// the consumer only to have the next record's stores take it again.
    #[inline(always)]
    fn clear_ahead(&mut self, end: u64) {
        // Free: the consumer has passed the record that used the slot a lap before. `reserve`
        // made sure end - cached_head <= nslots, so this does not wrap.
        let free = self
            .cached_head
            .wrapping_add(self.slots.nslots)
            .wrapping_sub(end);
        let count = free.min(CLEAR_AHEAD);
        for i in 0..count {
            let position = end.wrapping_add(i);
            // Relaxed: published by the Release in `publish` of this or a later record,
            // before the consumer can look at the slot.
            self.slots
                .record_word(position)
                .store(record_word(!tag(position), 0), Relaxed);
        }
        self.cleared = end.wrapping_add(count);
    }

    /// Publishes the record `reserve` placed at `start`, its `len`-byte body written.
    #[inline(always)]
    fn publish(&mut self, start: u64, len: usize) {
        // Release: publishes the body (and PAD, barrier) to the consumer's Acquire load.
        self.slots
            .record_word(start)
            .store(record_word(tag(start), len as u32), Release);
        self.tail = start.wrapping_add(slots_for(len));
    }
}

impl core::fmt::Debug for Producer<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Producer")
            .field("nslots", &self.slots.nslots)
            .field("tail", &self.tail)
            .field("cached_head", &self.cached_head)
            .finish()
    }
}

/// The consuming (client) side of a response ring.
pub struct Consumer<'a> {
    /// Published head, read by the producer.
    head_word: &'a AtomicU64,
    slots: Slots<'a>,
    /// Private head: next position to read (may be ahead of the published one by a PAD).
    head: u64,
}

impl Consumer<'_> {
    /// Number of slots.
    pub fn nslots(&self) -> u32 {
        self.slots.nslots as u32
    }

    /// Next position (in slots) the consumer reads.
    pub fn position(&self) -> u64 {
        self.head
    }

    /// Cheap poll: is a record (possibly after a PAD) published at the head? A corrupt
    /// record counts as "something to look at"; [`Consumer::peek`] reports it.
    pub fn has_next(&self) -> bool {
        let word = self.slots.record_word(self.head).load(Acquire);
        if (word >> 32) as u32 != tag(self.head) {
            return false;
        }
        let index = self.head & self.slots.mask();
        if word as u32 != PAD_LEN || index == 0 {
            return true;
        }
        let next = self.head.wrapping_add(self.slots.nslots - index);
        (self.slots.record_word(next).load(Acquire) >> 32) as u32 == tag(next)
    }

    /// The next record, if one is published; PAD records are consumed on the way. The record
    /// stays at the head until [`Record::release`]; dropping it without releasing leaves it
    /// there for the next `peek`.
    pub fn peek(&mut self) -> Result<Option<Record<'_>>, Corrupt> {
        let Some((start, len, need)) = self.locate()? else {
            return Ok(None);
        };
        Ok(Some(Record {
            head: &mut self.head,
            head_word: self.head_word,
            slots: self.slots,
            start,
            len,
            need,
        }))
    }

    /// Finds the record at the head: `(position, len, slots)`. At most one PAD is skipped
    /// (a PAD at slot 0 is corrupt), so this is at most two iterations.
    fn locate(&mut self) -> Result<Option<(u64, u32, u64)>, Corrupt> {
        let nslots = self.slots.nslots;
        loop {
            // Acquire: pairs with the producer's Release store of the record word, making
            // the body visible.
            let word = self.slots.record_word(self.head).load(Acquire);
            if (word >> 32) as u32 != tag(self.head) {
                return Ok(None);
            }
            let len = word as u32;
            let index = self.head & self.slots.mask();
            let to_end = nslots - index;
            if len == PAD_LEN {
                if index == 0 {
                    return Err(Corrupt);
                }
                self.head = self.head.wrapping_add(to_end);
                continue;
            }
            if len as usize > self.slots.max_record_len() {
                return Err(Corrupt);
            }
            let need = slots_for(len as usize);
            if need > to_end {
                return Err(Corrupt);
            }
            return Ok(Some((self.head, len, need)));
        }
    }
}

impl core::fmt::Debug for Consumer<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Consumer")
            .field("nslots", &self.slots.nslots)
            .field("head", &self.head)
            .finish()
    }
}

/// A record at the consumer's head. Its body is a view into the shared slots: an honest
/// producer does not touch it until [`Record::release`], but a misbehaving one could
/// change bytes under us, so parse it defensively (or [`Record::copy_to`] first).
pub struct Record<'c> {
    head: &'c mut u64,
    head_word: &'c AtomicU64,
    slots: Slots<'c>,
    start: u64,
    len: u32,
    need: u64,
}

impl Record<'_> {
    /// Body length in bytes.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the body is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The body, in place in shared memory.
    #[cfg(not(loom))]
    pub fn body(&self) -> &[u8] {
        // SAFETY: `locate` checked that the record fits before the end of the slot array;
        // the borrow of `self` ends before `release` can run.
        unsafe { self.slots.body(self.start, self.len as usize) }
    }

    /// Copies the first `min(len, out.len())` body bytes into `out`; returns that count.
    pub fn copy_to(&self, out: &mut [u8]) -> usize {
        #[cfg(not(loom))]
        {
            let n = out.len().min(self.len as usize);
            netless_shm::copy::copy_slice(&mut out[..n], &self.body()[..n]);
            n
        }
        #[cfg(loom)]
        {
            self.slots.copy_body(self.start, self.len as usize, out)
        }
    }

    /// Consumes the record: advances the head past it and publishes the head (Release:
    /// our reads of the body happen before the producer reuses the slots).
    pub fn release(self) {
        *self.head = self.start.wrapping_add(self.need);
        self.head_word.store(*self.head, Release);
    }
}

impl core::fmt::Debug for Record<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Record")
            .field("position", &self.start)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(slots_for(0), 1);
        assert_eq!(slots_for(56), 1);
        assert_eq!(slots_for(57), 2);
        assert_eq!(ResponseRing::bytes_needed(4), 128 + 256);
    }

    #[test]
    fn region_init_and_attach() {
        #[repr(C, align(64))]
        #[derive(Clone, Copy)]
        struct Line([u8; 64]);
        let nslots = 8;
        let mut backing = vec![Line([0x5a; 64]); ResponseRing::bytes_needed(nslots) / 64];
        let region = NonNull::new(backing.as_mut_ptr().cast::<u8>()).unwrap();
        let len = backing.len() * 64;
        // SAFETY: `backing` outlives both halves and is only accessed through them.
        let mut consumer = unsafe { ResponseRing::init(region, len, nslots) }.unwrap();
        assert!(!consumer.has_next());
        // SAFETY: same region, the only producer.
        let mut producer = unsafe { ResponseRing::attach(region, len) }.unwrap();
        assert_eq!(producer.max_record_len(), 4 * 64 - 8);
        producer.try_push(&[b"abc"]).unwrap();
        let record = consumer.peek().unwrap().unwrap();
        assert_eq!(record.body(), b"abc");
        record.release();
        // SAFETY: the first 200 bytes of `backing`; it fails on the size check before
        // touching them, so it is no second producer.
        let too_small = unsafe { ResponseRing::attach(region, 200) };
        assert!(matches!(too_small, Err(LayoutError::TooSmall { .. })));
    }
}
