//! The heap's unit table: one owner word per [`UNIT`](super::UNIT) of heap, 0 when free,
//! else the owner word of the member holding it. Allocation takes a run of free units one
//! compare-and-swap at a time and gives them all back if another member wins one; freeing
//! swaps each back to 0 only if it still names the owner, so freeing twice, or a dead
//! member's units by two reclaimers at once, is harmless.

use super::layout::{Geometry, Words, UNIT};
use super::members::MemberId;
use crate::sync::Ordering;

/// A run of heap units: where it starts in the region and how many bytes it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Extent {
    /// Byte offset in the region (the start of a unit).
    pub offset: u64,
    /// Length in bytes (it holds whole units: the last one may be partly used).
    pub len: u64,
}

impl Extent {
    fn units(self) -> usize {
        (self.len as usize).div_ceil(UNIT)
    }
}

/// Takes the units for `len` bytes for `owner`, searching from `hint`.
pub(crate) fn alloc(
    words: &Words,
    g: &Geometry,
    owner: MemberId,
    len: usize,
    hint: usize,
) -> Option<Extent> {
    let units = len.div_ceil(UNIT);
    if units == 0 || units > g.heap_units {
        return None;
    }
    let owner = owner.owner_word();
    let word = |u: usize| words.word(g.unit_word(u));
    let mut start = hint % g.heap_units;
    let mut scanned = 0;
    while scanned < g.heap_units {
        if start + units > g.heap_units {
            scanned += g.heap_units - start;
            start = 0;
            continue;
        }
        // A run looks free: take it unit by unit.
        match (start..start + units).find(|&u| word(u).load(Ordering::Relaxed) != 0) {
            Some(busy) => {
                scanned += busy + 1 - start;
                start = busy + 1;
            }
            None => {
                let mut taken = 0;
                while taken < units
                    && word(start + taken)
                        .compare_exchange(0, owner, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    taken += 1;
                }
                if taken == units {
                    return Some(Extent {
                        offset: g.unit_offset(start),
                        len: len as u64,
                    });
                }
                for u in start..start + taken {
                    let _ = word(u).compare_exchange(owner, 0, Ordering::AcqRel, Ordering::Relaxed);
                }
                scanned += taken + 1;
                start += taken + 1;
            }
        }
    }
    None
}

/// Gives back the units of `extent` that `owner` still holds.
pub(crate) fn free(words: &Words, g: &Geometry, owner: MemberId, extent: Extent) {
    let Some(first) = g.unit_at(extent.offset) else {
        return;
    };
    let owner = owner.owner_word();
    for u in first..(first + extent.units()).min(g.heap_units) {
        let _ = words.word(g.unit_word(u)).compare_exchange(
            owner,
            0,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

/// Gives back every unit `owner` holds; how many.
pub(crate) fn free_all(words: &Words, g: &Geometry, owner: MemberId) -> usize {
    let owner = owner.owner_word();
    (0..g.heap_units)
        .filter(|&u| {
            words
                .word(g.unit_word(u))
                .compare_exchange(owner, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
        .count()
}

/// Whether `extent` (read from the region, so untrusted) starts a unit of the heap, is no
/// longer than `max_len`, and every unit it covers is held by `owner`.
pub(crate) fn owned_by(
    words: &Words,
    g: &Geometry,
    owner: MemberId,
    extent: Extent,
    max_len: u64,
) -> bool {
    let Some(first) = g.unit_at(extent.offset) else {
        return false;
    };
    if extent.len == 0 || extent.len > max_len || extent.len > g.size {
        return false;
    }
    let units = extent.units();
    let owner = owner.owner_word();
    first + units <= g.heap_units
        && (first..first + units)
            .all(|u| words.word(g.unit_word(u)).load(Ordering::Acquire) == owner)
}

/// The distinct owners the unit table names (a snapshot).
pub(crate) fn owners(words: &Words, g: &Geometry) -> std::collections::HashSet<MemberId> {
    (0..g.heap_units)
        .filter_map(|u| {
            MemberId::from_owner_word(words.word(g.unit_word(u)).load(Ordering::Relaxed))
        })
        .collect()
}

/// Units free now (a snapshot).
pub(crate) fn free_units(words: &Words, g: &Geometry) -> usize {
    (0..g.heap_units)
        .filter(|&u| words.word(g.unit_word(u)).load(Ordering::Relaxed) == 0)
        .count()
}

/// Moves `extent` from `from` to `to`, unit by unit, starting with the first: a second
/// mover racing this one fails at the first unit and touches no other. Whether every unit
/// moved.
pub(crate) fn hand_over(
    words: &Words,
    g: &Geometry,
    extent: Extent,
    from: MemberId,
    to: MemberId,
) -> bool {
    let Some(first) = g.unit_at(extent.offset) else {
        return false;
    };
    let (from, to) = (from.owner_word(), to.owner_word());
    (first..(first + extent.units()).min(g.heap_units)).all(|u| {
        let word = words.word(g.unit_word(u));
        word.compare_exchange(from, to, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
            || word.load(Ordering::Acquire) == to
    })
}

/// The member holding the first unit of `extent`, if any.
pub(crate) fn owner_of(words: &Words, g: &Geometry, extent: Extent) -> Option<MemberId> {
    let unit = g.unit_at(extent.offset)?;
    MemberId::from_owner_word(words.word(g.unit_word(unit)).load(Ordering::Acquire))
}
