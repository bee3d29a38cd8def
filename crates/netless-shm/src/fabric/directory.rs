//! The service directory: names to the segments of the replica serving them.
//!
//! A server claims a free entry (compare-and-swap of its state word to CLAIMING), writes its
//! owner word, name and extents, then publishes it (state LIVE, release). A client reads an
//! entry's fields, then the state again: if it changed meanwhile, the read is discarded.
//! Nothing read is trusted: the name is compared byte for byte, and every extent must be
//! units the entry's owner holds (checked in the unit table) before anyone maps it.

use super::alloc::Extent;
use super::layout::{Geometry, Words, DIRECTORY, LINE, MAX_NAME};
use super::members::{generation, phase, MemberId};
use crate::sync::Ordering;

// Line 0: the state word alone (swapped by whoever claims or withdraws the entry); lines
// 1 and 2: the publisher's fields; lines 3 to 7: the name.
const E_STATE: usize = 0;
const E_OWNER: usize = LINE;
const E_REPLICA: usize = LINE + 8;
const E_NAME_LEN: usize = LINE + 16;
const E_EXTENTS: usize = LINE + 24;
/// Extents an entry carries.
pub const ENTRY_EXTENTS: usize = 3;
const E_ATTRS: usize = E_EXTENTS + ENTRY_EXTENTS * 16;
const E_NAME: usize = 3 * LINE;

const FREE: u64 = 0;
const CLAIMING: u64 = 1;
const LIVE: u64 = 2;

/// A published service: who serves it and where its segments are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its index in the directory.
    pub index: u32,
    /// The member serving it.
    pub owner: MemberId,
    /// The service's name.
    pub name: String,
    /// Replica number, if it is one of several.
    pub replica: Option<u32>,
    /// Its segments (their meaning is the caller's).
    pub extents: [Extent; ENTRY_EXTENTS],
    /// Attributes the server published (their meaning is the caller's).
    pub attrs: u64,
}

fn replica_word(replica: Option<u32>) -> u64 {
    replica.map_or(0, |r| u64::from(r) + 1)
}

/// Publishes `entry` (its `index` is ignored) in a free slot; the slot's index.
pub(crate) fn publish(words: &Words, g: &Geometry, entry: &Entry) -> Option<u32> {
    if entry.name.is_empty() || entry.name.len() > MAX_NAME {
        return None;
    }
    for index in 0..DIRECTORY {
        let base = g.entry(index);
        let state = words.word(base + E_STATE);
        let s = state.load(Ordering::Acquire);
        if phase(s) != FREE {
            continue;
        }
        let gen = u64::from(generation(s).wrapping_add(1));
        if state
            .compare_exchange(
                s,
                (gen << 8) | CLAIMING,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            continue;
        }
        words.store(base + E_OWNER, entry.owner.owner_word());
        words.store(base + E_REPLICA, replica_word(entry.replica));
        words.store(base + E_NAME_LEN, entry.name.len() as u64);
        for (i, e) in entry.extents.iter().enumerate() {
            words.store(base + E_EXTENTS + 16 * i, e.offset);
            words.store(base + E_EXTENTS + 16 * i + 8, e.len);
        }
        words.store(base + E_ATTRS, entry.attrs);
        words.write(base + E_NAME, entry.name.as_bytes());
        state.store((gen << 8) | LIVE, Ordering::Release);
        return Some(index as u32);
    }
    None
}

/// Withdraws entry `index` if `owner` still owns it.
pub(crate) fn withdraw(words: &Words, g: &Geometry, index: u32, owner: MemberId) {
    if index as usize >= DIRECTORY {
        return;
    }
    let base = g.entry(index as usize);
    let state = words.word(base + E_STATE);
    let s = state.load(Ordering::Acquire);
    if phase(s) == FREE || words.load(base + E_OWNER) != owner.owner_word() {
        return;
    }
    let _ = state.compare_exchange(
        s,
        u64::from(generation(s)) << 8,
        Ordering::AcqRel,
        Ordering::Relaxed,
    );
}

/// Withdraws every entry `owner` published or was publishing (one it died claiming too);
/// how many.
pub(crate) fn withdraw_all(words: &Words, g: &Geometry, owner: MemberId) -> usize {
    (0..DIRECTORY as u32)
        .filter(|&i| {
            let base = g.entry(i as usize);
            let s = words.word(base + E_STATE).load(Ordering::Acquire);
            let ours = phase(s) != FREE && words.load(base + E_OWNER) == owner.owner_word();
            if ours {
                withdraw(words, g, i, owner);
            }
            ours
        })
        .count()
}

/// Frees entry `index` if it is still mid-publication in state `seen` (its publisher died
/// between claiming it and publishing it); whether it did.
pub(crate) fn free_stuck(words: &Words, g: &Geometry, index: u32, seen: u64) -> bool {
    let state = words.word(g.entry(index as usize) + E_STATE);
    phase(seen) == CLAIMING
        && state
            .compare_exchange(
                seen,
                u64::from(generation(seen)) << 8,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
}

/// The state word of entry `index`, if it is mid-publication.
pub(crate) fn claiming(words: &Words, g: &Geometry, index: u32) -> Option<u64> {
    let s = words
        .word(g.entry(index as usize) + E_STATE)
        .load(Ordering::Acquire);
    (phase(s) == CLAIMING).then_some(s)
}

/// Entry `index` if it is published and reads consistently (no change while it was read).
pub(crate) fn read(words: &Words, g: &Geometry, index: u32) -> Option<Entry> {
    if index as usize >= DIRECTORY {
        return None;
    }
    let base = g.entry(index as usize);
    let state = words.word(base + E_STATE);
    let before = state.load(Ordering::Acquire);
    if phase(before) != LIVE {
        return None;
    }
    let owner = MemberId::from_owner_word(words.load(base + E_OWNER))?;
    let replica = match words.load(base + E_REPLICA) {
        0 => None,
        r => Some(u32::try_from(r - 1).ok()?),
    };
    let name_len = usize::try_from(words.load(base + E_NAME_LEN)).ok()?;
    if name_len == 0 || name_len > MAX_NAME {
        return None;
    }
    let mut name = vec![0u8; name_len];
    words.read(base + E_NAME, &mut name);
    let mut extents = [Extent { offset: 0, len: 0 }; ENTRY_EXTENTS];
    for (i, e) in extents.iter_mut().enumerate() {
        e.offset = words.load(base + E_EXTENTS + 16 * i);
        e.len = words.load(base + E_EXTENTS + 16 * i + 8);
    }
    let attrs = words.load(base + E_ATTRS);
    if state.load(Ordering::Acquire) != before {
        return None;
    }
    Some(Entry {
        index,
        owner,
        name: String::from_utf8(name).ok()?,
        replica,
        extents,
        attrs,
    })
}

/// Every published entry named `name` (and `replica`).
pub(crate) fn find(words: &Words, g: &Geometry, name: &str, replica: Option<u32>) -> Vec<Entry> {
    (0..DIRECTORY as u32)
        .filter_map(|i| read(words, g, i))
        .filter(|e| e.name == name && e.replica == replica)
        .collect()
}
