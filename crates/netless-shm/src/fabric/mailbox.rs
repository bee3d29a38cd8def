//! Connect slots: how a client and a server that share nothing but the fabric meet.
//!
//! A server publishes a mailbox extent with its directory entry: [`SLOTS_PER_UNIT`] slots
//! of [`SLOT_BYTES`]. A client claims a free slot (compare-and-swap FREE(n) to CLAIMED(n+1)),
//! writes its owner word and request words, and publishes REQUEST; the server answers with
//! reply words and ACCEPTED, or a status and REFUSED. The slot then stands for the
//! connection: the client writes its "gone" line, the server its own (with a reason), each
//! with the slot's sequence number so a stale one never counts; the server frees the slot
//! once both are done or the client is dead. The meaning of the request and reply words is
//! the caller's; this module only moves them and checks sequence numbers.

use super::layout::{Words, LINE, UNIT};
use super::members::MemberId;
use crate::sync::Ordering;

/// Bytes of one connect slot.
pub const SLOT_BYTES: usize = 8 * LINE;
/// Slots in one unit of mailbox.
pub const SLOTS_PER_UNIT: usize = UNIT / SLOT_BYTES;
/// Request and reply words per slot.
pub const WORDS: usize = 8;
/// Longest reason a server leaves in a slot.
pub const MAX_REASON: usize = 2 * LINE - 16;

// Line 0: the state word alone (swapped by both sides); lines 1 and 2: the client's owner
// word and request; line 3: the server's reply; line 4: the client's "gone"; line 5: the
// server's "gone"; lines 6 and 7: the server's code and reason. One writer per line.
const S_STATE: usize = 0;
const S_CLIENT: usize = LINE;
const S_REQUEST: usize = LINE + 8;
const S_REPLY: usize = 3 * LINE;
const S_CLIENT_GONE: usize = 4 * LINE;
const S_SERVER_GONE: usize = 5 * LINE;
const S_RELEASED: usize = 5 * LINE + 8;
const S_CODE: usize = 6 * LINE;
const S_REASON_LEN: usize = 6 * LINE + 8;
const S_REASON: usize = 6 * LINE + 16;

/// Phases of a slot (the low byte of its state; the sequence number is above).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Nobody's.
    Free = 0,
    /// A client is writing its request.
    Claimed = 1,
    /// A request awaits the server.
    Request = 2,
    /// The server admitted the client: the slot stands for the connection.
    Accepted = 3,
    /// The server refused the client (a code and a reason are in the slot).
    Refused = 4,
}

impl Phase {
    fn of(state: u64) -> Option<Phase> {
        Some(match state & 0xff {
            0 => Phase::Free,
            1 => Phase::Claimed,
            2 => Phase::Request,
            3 => Phase::Accepted,
            4 => Phase::Refused,
            _ => return None,
        })
    }
}

/// A mailbox: the slots in one extent of the region.
#[derive(Clone, Debug)]
pub struct Mailbox {
    pub(crate) words: Words,
    pub(crate) base: usize,
    pub(crate) slots: usize,
    /// Keeps the mapping (and the view `words` uses) alive.
    pub(crate) _fabric: super::Fabric,
}

/// A request a client left in a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The slot.
    pub slot: usize,
    /// The slot's sequence number for this connection.
    pub seq: u64,
    /// Who asks (as the slot says: check it against the member table).
    pub client: Option<MemberId>,
    /// The request words.
    pub words: [u64; WORDS],
}

impl Mailbox {
    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The atomic state word of `slot`.
    fn state_word(&self, slot: usize) -> &crate::sync::AtomicU64 {
        assert!(slot < self.slots);
        self.words.word(self.base + slot * SLOT_BYTES + S_STATE)
    }

    /// A single-writer field of `slot`, fresh.
    fn load(&self, slot: usize, off: usize) -> u64 {
        assert!(slot < self.slots);
        self.words.load(self.base + slot * SLOT_BYTES + off)
    }

    /// Stores (and writes back) a single-writer field of `slot`.
    fn store(&self, slot: usize, off: usize, value: u64) {
        assert!(slot < self.slots);
        self.words.store(self.base + slot * SLOT_BYTES + off, value);
    }

    /// The slot's phase and sequence number (`None` for a phase no one writes).
    pub fn state(&self, slot: usize) -> Option<(Phase, u64)> {
        let s = self.state_word(slot).load(Ordering::Acquire);
        Some((Phase::of(s)?, s >> 8))
    }

    /// Client: takes a free slot and posts `request` in it as `client`; the slot and the
    /// connection's sequence number.
    pub fn post(&self, client: MemberId, request: [u64; WORDS]) -> Option<(usize, u64)> {
        for slot in 0..self.slots {
            let state = self.state_word(slot);
            let s = state.load(Ordering::Acquire);
            if Phase::of(s) != Some(Phase::Free) {
                continue;
            }
            let seq = (s >> 8).wrapping_add(1) & ((1 << 56) - 1);
            if state
                .compare_exchange(
                    s,
                    (seq << 8) | Phase::Claimed as u64,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_err()
            {
                continue;
            }
            self.store(slot, S_CLIENT, client.owner_word());
            for (i, w) in request.iter().enumerate() {
                self.store(slot, S_REQUEST + 8 * i, *w);
            }
            // Published only if the slot is still our claim: a claimant slow enough for the
            // server to have freed its claim finds it gone, and tries another.
            if state
                .compare_exchange(
                    (seq << 8) | Phase::Claimed as u64,
                    (seq << 8) | Phase::Request as u64,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                return Some((slot, seq));
            }
        }
        None
    }

    /// Server: the requests waiting.
    pub fn requests(&self) -> Vec<Request> {
        (0..self.slots)
            .filter_map(|slot| {
                let (phase, seq) = self.state(slot)?;
                if phase != Phase::Request {
                    return None;
                }
                let mut words = [0u64; WORDS];
                for (i, w) in words.iter_mut().enumerate() {
                    *w = self.load(slot, S_REQUEST + 8 * i);
                }
                let client = MemberId::from_owner_word(self.load(slot, S_CLIENT));
                // Read whole, or not at all: the state must not have moved meanwhile.
                (self.state(slot)? == (Phase::Request, seq)).then_some(Request {
                    slot,
                    seq,
                    client,
                    words,
                })
            })
            .collect()
    }

    /// The member that claimed `slot`, as the slot says.
    pub fn client(&self, slot: usize) -> Option<MemberId> {
        MemberId::from_owner_word(self.load(slot, S_CLIENT))
    }

    /// Server: admits the request in `slot` (if it is still connection `seq`'s) with `reply`.
    pub fn accept(&self, slot: usize, seq: u64, reply: [u64; WORDS]) -> bool {
        for (i, w) in reply.iter().enumerate() {
            self.store(slot, S_REPLY + 8 * i, *w);
        }
        self.answer(slot, seq, Phase::Accepted)
    }

    /// Server: refuses the request in `slot` with `code` and `reason`.
    pub fn refuse(&self, slot: usize, seq: u64, code: u32, reason: &str) -> bool {
        self.set_reason(slot, code, reason);
        self.answer(slot, seq, Phase::Refused)
    }

    fn answer(&self, slot: usize, seq: u64, phase: Phase) -> bool {
        self.state_word(slot)
            .compare_exchange(
                (seq << 8) | Phase::Request as u64,
                (seq << 8) | phase as u64,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    fn set_reason(&self, slot: usize, code: u32, reason: &str) {
        let mut end = reason.len().min(MAX_REASON);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        self.store(slot, S_CODE, u64::from(code));
        self.store(slot, S_REASON_LEN, end as u64);
        self.words.write(
            self.base + slot * SLOT_BYTES + S_REASON,
            &reason.as_bytes()[..end],
        );
    }

    /// The code and reason the server left in `slot` (validated: at most [`MAX_REASON`]
    /// bytes of UTF-8, else a placeholder).
    pub fn reason(&self, slot: usize) -> (u32, String) {
        let code = self.load(slot, S_CODE) as u32;
        let len = (self.load(slot, S_REASON_LEN) as usize).min(MAX_REASON);
        let mut bytes = vec![0u8; len];
        self.words
            .read(self.base + slot * SLOT_BYTES + S_REASON, &mut bytes);
        let reason =
            String::from_utf8(bytes).unwrap_or_else(|_| "(an unreadable reason)".to_owned());
        (code, reason)
    }

    /// Client: the reply words if the server accepted connection `seq`.
    pub fn reply(&self, slot: usize) -> [u64; WORDS] {
        let mut words = [0u64; WORDS];
        for (i, w) in words.iter_mut().enumerate() {
            *w = self.load(slot, S_REPLY + 8 * i);
        }
        words
    }

    /// Client: says connection `seq` is over on its side.
    pub fn client_gone(&self, slot: usize, seq: u64) {
        self.store(slot, S_CLIENT_GONE, seq);
    }

    /// Server: says connection `seq` is over on its side, and why.
    pub fn server_gone(&self, slot: usize, seq: u64, code: u32, reason: &str) {
        if self.load(slot, S_SERVER_GONE) == seq {
            return;
        }
        self.set_reason(slot, code, reason);
        self.store(slot, S_SERVER_GONE, seq);
    }

    /// Server: says nothing of it writes into connection `seq`'s client memory any more:
    /// the client may give that memory back.
    pub fn released(&self, slot: usize, seq: u64) {
        self.store(slot, S_RELEASED, seq);
    }

    /// Whether the server released connection `seq`'s client memory.
    pub fn is_released(&self, slot: usize, seq: u64) -> bool {
        self.load(slot, S_RELEASED) == seq
    }

    /// Whether the client said connection `seq` is over.
    pub fn is_client_gone(&self, slot: usize, seq: u64) -> bool {
        self.load(slot, S_CLIENT_GONE) == seq
    }

    /// Whether the server said connection `seq` is over.
    pub fn is_server_gone(&self, slot: usize, seq: u64) -> bool {
        self.load(slot, S_SERVER_GONE) == seq
    }

    /// Server: frees `slot` if it still stands for connection `seq`.
    pub fn release(&self, slot: usize, seq: u64) -> bool {
        let state = self.state_word(slot);
        let s = state.load(Ordering::Acquire);
        s >> 8 == seq
            && state
                .compare_exchange(s, seq << 8, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }
}
