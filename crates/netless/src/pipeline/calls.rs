//! A pipeline's calls in flight: one slot per call, its id made of the slot and the slot's
//! generation, so a reply (whose id comes from memory the server writes) is accepted only
//! for the call in flight in its slot; the outcomes waiting for the next `poll`; and the
//! replies taken from the response ring to their calls.

use std::collections::HashMap;

use super::kept::KeptRuns;
use super::Pipeline;
use crate::client::Connection;
use crate::status::Status;
use crate::wire::reply::{for_each_compact_reply, is_reply_batch, outcome, parse_response};

/// Set in a slot whose call is in flight.
const BUSY: u32 = 1 << 31;

/// A call's id: its slot's generation (16 bits, wrapping) above its slot index (16 bits,
/// `max_in_flight` ≤ 65536), so that every id fits a `CompactHeader`'s 32 bits.
fn call_id(generation: u32, index: u32) -> u64 {
    (u64::from(generation & 0xffff) << 16) | u64::from(index & 0xffff)
}

/// The calls of one pipeline.
pub(super) struct Calls {
    /// Per call slot: the generation of its last call, with [`BUSY`] set while it is in
    /// flight (a reply is accepted only for a busy slot of its generation).
    slots: Vec<u32>,
    free: Vec<u32>,
    /// Requests staged or published and not yet answered.
    pub(super) in_flight: u32,
    /// Calls that failed after they were accepted (a batch the queue refused), reported at
    /// the next `poll`.
    pub(super) failed: Vec<(u64, Status)>,
    /// Responses arriving in fragments, by call id.
    pub(super) partial: HashMap<u64, Vec<u8>>,
}

impl Calls {
    pub(super) fn new(n: u32) -> Calls {
        Calls {
            slots: vec![0; n as usize],
            free: (0..n).rev().collect(),
            in_flight: 0,
            failed: Vec::new(),
            partial: HashMap::new(),
        }
    }

    /// Slots in all (`max_in_flight`).
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether every slot is in use.
    #[inline(always)]
    pub(super) fn all_busy(&self) -> bool {
        self.free.is_empty()
    }

    /// A free slot, taken off the free list (`claim` it, or `give_back`).
    #[inline(always)]
    pub(super) fn take_free(&mut self) -> Option<u32> {
        self.free.pop()
    }

    /// Puts back a slot `take_free` gave that took no call.
    pub(super) fn give_back(&mut self, index: u32) {
        self.free.push(index);
    }

    /// Takes call slot `index` (just popped from the free list) for a new call: its id.
    #[inline(always)]
    pub(super) fn claim(&mut self, index: u32) -> u64 {
        let generation = (self.slots[index as usize] & !BUSY).wrapping_add(1) & 0xffff;
        self.slots[index as usize] = generation | BUSY;
        call_id(generation, index)
    }

    /// Whether `call_id` names the call in flight in its slot (a reply to anything else is
    /// refused: ids come from memory the server writes).
    #[inline(always)]
    pub(super) fn is_live(&self, call_id: u64) -> bool {
        call_id >> 32 == 0
            && self.slots.get(Pipeline::slot(call_id)) == Some(&((call_id >> 16) as u32 | BUSY))
    }

    /// Frees the slot of a call that has its outcome (a duplicate reply then finds it idle).
    #[inline]
    pub(super) fn complete(&mut self, kept: &mut KeptRuns, call_id: u64) {
        let index = Pipeline::slot(call_id);
        if let Some(slot) = self.slots.get_mut(index) {
            if *slot & BUSY != 0 {
                *slot &= !BUSY;
                self.free.push(index as u32);
                self.in_flight = self.in_flight.saturating_sub(1);
                kept.answered(index);
            }
        }
    }

    /// Takes every reply in `conn`'s response ring to `on_reply(call_id, reply)`, without
    /// waiting, validating each (the server writes the ring); returns how many. A malformed
    /// record or a reply to no call in flight closes the connection (`Err`).
    pub(super) fn take_replies(
        &mut self,
        conn: &Connection,
        kept: &mut KeptRuns,
        on_reply: &mut impl FnMut(u64, Result<&[u8], Status>),
    ) -> Result<usize, Status> {
        let fail = |what: &str| {
            let status = conn.corrupt(what);
            conn.fail(status.clone());
            Err(status)
        };
        let mut delivered = 0;
        let Some(mut consumer) = conn.consumer.try_lock() else {
            return Ok(delivered);
        };
        loop {
            let record = match consumer.peek() {
                Ok(Some(record)) => record,
                Ok(None) => break,
                Err(e) => return fail(&e.to_string()),
            };
            let body = record.body();
            if is_reply_batch(body) {
                let max = conn.config.max_message;
                let done = for_each_compact_reply(body, max, |id, code, bytes| {
                    if !self.is_live(id) {
                        return Err("a reply to no call in flight");
                    }
                    on_reply(id, outcome(code, bytes.0, bytes.1));
                    self.complete(kept, id);
                    Ok(())
                });
                match done {
                    Ok(n) => delivered += n,
                    Err(what) => return fail(what),
                }
                record.release();
                continue;
            }
            let parsed = parse_response(body, conn.config.max_message).and_then(|parsed| {
                let live = self.is_live(parsed.0.call_id);
                live.then_some(parsed).ok_or("a reply to no call in flight")
            });
            let (h, code, fragment) = match parsed {
                Ok(v) => v,
                Err(what) => return fail(what),
            };
            let whole;
            let bytes: &[u8] = if h.frag_len == h.body_len {
                fragment
            } else {
                let buf = self.partial.entry(h.call_id).or_default();
                if h.frag_offset as usize != buf.len() {
                    return fail("response fragments out of order");
                }
                netless_shm::copy::extend(buf, fragment);
                if buf.len() < h.body_len as usize {
                    record.release();
                    continue;
                }
                whole = self.partial.remove(&h.call_id).unwrap_or_default();
                &whole
            };
            let md_end = h.metadata_len as usize;
            on_reply(h.call_id, outcome(code, &bytes[..md_end], &bytes[md_end..]));
            record.release();
            self.complete(kept, h.call_id);
            delivered += 1;
        }
        Ok(delivered)
    }
}
