//! The page allocator: who holds each page, and which pages are free.
//!
//! A page's word is its holder set, one bit per member: the page's reference count at process
//! granularity (within a process, how many buffers and refs use the page is that process's
//! own business). A page is free exactly when its word is 0. Setting and clearing one's own
//! bit are idempotent, so when a member dies mid-operation the survivors release its pages
//! exactly by clearing its bit everywhere; a counter could not be repaired that way.
//!
//! The free hints (one bit per page) are the global free list: set when a page's word drops
//! to 0, cleared by whoever claims it. They are advisory: a claim is the page word's
//! `0 → bit` compare-exchange, so a stale hint only costs a failed claim, and a lost one is
//! restored by the next reap.

use std::sync::atomic::Ordering;

use crate::layout::{PoolMap, HOLDER_MASK};
use crate::PoolError;

pub(crate) fn bit(member: usize) -> u64 {
    // Member indexes come from our own row or are checked against MAX_MEMBERS first; the
    // mask keeps a bad one from overflowing the shift.
    debug_assert!(member < crate::layout::MAX_MEMBERS, "member index {member}");
    1 << (member & 63)
}

fn set_hint(map: &PoolMap, page: u32) {
    map.hints()[page as usize / 64].fetch_or(1 << (page % 64), Ordering::Release);
}

/// Claims page `page` (free, and hint already taken by us) for `member`.
fn claim(map: &PoolMap, member: usize, page: u32) -> bool {
    map.words()[page as usize]
        .compare_exchange(0, bit(member), Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
}

/// Takes up to `want` free pages for `member`, anywhere in the pool, starting the search at
/// `*cursor` (advanced, so successive batches spread over the pool).
pub(crate) fn claim_batch(
    map: &PoolMap,
    member: usize,
    want: usize,
    cursor: &mut usize,
    out: &mut Vec<u32>,
) {
    let hints = map.hints();
    let mut got = 0;
    for step in 0..hints.len() {
        if got == want {
            break;
        }
        let w = (*cursor + step) % hints.len();
        if hints[w].load(Ordering::Relaxed) == 0 {
            continue;
        }
        let taken = hints[w].swap(0, Ordering::AcqRel);
        let mut rest = taken;
        let mut returned = 0u64;
        while rest != 0 {
            let b = rest.trailing_zeros();
            rest &= rest - 1;
            let page = (w * 64) as u32 + b;
            if got == want {
                returned |= 1 << b;
            } else if claim(map, member, page) {
                out.push(page);
                got += 1;
            }
        }
        if returned != 0 {
            hints[w].fetch_or(returned, Ordering::Release);
        }
        *cursor = w;
    }
}

/// Takes `n` contiguous free pages for `member`, or `None` if no free run that long was found.
pub(crate) fn claim_run(map: &PoolMap, member: usize, n: usize, cursor: &mut usize) -> Option<u32> {
    let npages = map.npages() as usize;
    if n == 0 || n > npages {
        return None;
    }
    let hints = map.hints();
    let hinted = |p: usize| hints[p / 64].load(Ordering::Relaxed) & (1 << (p % 64)) != 0;
    let start_at = (*cursor * 64) % npages;
    let mut p = start_at;
    let mut scanned = 0;
    while scanned < npages + n {
        // Find a run of n hinted pages starting at p (no wrap-around: a run is contiguous).
        if p + n > npages {
            scanned += npages - p;
            p = 0;
            continue;
        }
        if hints[p / 64].load(Ordering::Relaxed) == 0 && p.is_multiple_of(64) {
            p += 64;
            scanned += 64;
            continue;
        }
        // Jump to the next hinted page of this word (pages that are held are skipped a word
        // at a time, not bit by bit).
        let rest = hints[p / 64].load(Ordering::Relaxed) >> (p % 64);
        if rest == 0 || rest & 1 == 0 {
            let skip = if rest == 0 {
                64 - p % 64
            } else {
                rest.trailing_zeros() as usize
            };
            p += skip;
            scanned += skip;
            continue;
        }
        let mut len = 0;
        while len < n && hinted(p + len) {
            len += 1;
        }
        if len < n {
            p += len + 1;
            scanned += len + 1;
            continue;
        }
        if let Some(first) = take_run(map, member, p, n) {
            *cursor = (p + n) / 64;
            return Some(first);
        }
        p += 1;
        scanned += 1;
    }
    None
}

/// Clears the hints of pages `[p, p + n)` (all must be set) and claims each page.
fn take_run(map: &PoolMap, member: usize, p: usize, n: usize) -> Option<u32> {
    let hints = map.hints();
    let mut cleared: Vec<(usize, u64)> = Vec::new();
    let mut ok = true;
    let mut q = p;
    while q < p + n {
        let w = q / 64;
        let hi = ((w + 1) * 64).min(p + n);
        let mask = if hi - q == 64 {
            u64::MAX
        } else {
            ((1u64 << (hi - q)) - 1) << (q % 64)
        };
        let mut cur = hints[w].load(Ordering::Relaxed);
        let mut tries = 0;
        let swapped = loop {
            tries += 1;
            // Bounded: a word others keep changing is treated as taken.
            if cur & mask != mask || tries > 64 {
                break false;
            }
            match hints[w].compare_exchange_weak(
                cur,
                cur & !mask,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break true,
                Err(now) => cur = now,
            }
        };
        if !swapped {
            ok = false;
            break;
        }
        cleared.push((w, mask));
        q = hi;
    }
    if ok {
        for i in 0..n {
            let page = (p + i) as u32;
            if !claim(map, member, page) {
                // A stale hint: the page is held. Give back what we claimed; the held page's
                // hint stays clear (its holder sets it when it frees the page).
                for j in 0..i {
                    release_sole(map, member, (p + j) as u32);
                }
                for k in i + 1..n {
                    set_hint(map, (p + k) as u32);
                }
                return None;
            }
        }
        return Some(p as u32);
    }
    for (w, mask) in cleared {
        hints[w].fetch_or(mask, Ordering::Release);
    }
    None
}

/// Drops `member`'s hold on `page`. Returns whether the page became free.
///
/// # Errors
/// [`PoolError::Corrupt`] if `member` did not hold the page (its ledger and the pool
/// disagree: a double free, or another process cleared our bit).
pub(crate) fn release(map: &PoolMap, member: usize, page: u32) -> Result<bool, PoolError> {
    let prev = map.words()[page as usize].fetch_and(!bit(member), Ordering::AcqRel);
    if prev & bit(member) == 0 {
        return Err(PoolError::Corrupt(format!(
            "page {page} was not held by member {member} when it released it (double free, or \
             another process wrote our page words)"
        )));
    }
    if prev == bit(member) {
        set_hint(map, page);
        return Ok(true);
    }
    Ok(false)
}

/// Frees a page `member` holds alone (a leased page).
pub(crate) fn release_sole(map: &PoolMap, member: usize, page: u32) {
    match map.words()[page as usize].compare_exchange(
        bit(member),
        0,
        Ordering::AcqRel,
        Ordering::Relaxed,
    ) {
        Ok(_) => set_hint(map, page),
        Err(_) => {
            let _ = release(map, member, page);
        }
    }
}

/// Whether `member` is the only holder of `page`.
pub(crate) fn sole_holder(map: &PoolMap, member: usize, page: u32) -> bool {
    map.words()[page as usize].load(Ordering::Acquire) == bit(member)
}

/// Whether `member` holds `page`.
pub(crate) fn holds(map: &PoolMap, member: usize, page: u32) -> bool {
    map.words()[page as usize].load(Ordering::Acquire) & bit(member) != 0
}

/// Adds `member` as a holder of `page` (which someone else holds). Returns whether it was
/// new.
pub(crate) fn add_holder(map: &PoolMap, member: usize, page: u32) -> bool {
    map.words()[page as usize].fetch_or(bit(member), Ordering::AcqRel) & bit(member) == 0
}

/// Releases everything a dead `member` held and restores lost free hints. Returns the
/// number of pages that became free.
pub(crate) fn reap(map: &PoolMap, member: usize) -> usize {
    let mut freed = 0;
    for (page, word) in map.words().iter().enumerate() {
        let w = word.load(Ordering::Acquire);
        if w & bit(member) != 0 {
            let prev = word.fetch_and(!bit(member), Ordering::AcqRel);
            if prev == bit(member) {
                set_hint(map, page as u32);
                freed += 1;
            }
        } else if w == 0 {
            // Possibly a page whose claimer or releaser died between the word and its hint.
            set_hint(map, page as u32);
        } else if w & !HOLDER_MASK != 0 {
            tracing::warn!("pool page {page} has garbage in its holder word: {w:#x}");
        }
    }
    freed
}

/// Pages nobody holds.
pub(crate) fn free_count(map: &PoolMap) -> usize {
    map.words()
        .iter()
        .filter(|w| w.load(Ordering::Relaxed) == 0)
        .count()
}

/// Pages `member` holds.
pub(crate) fn held_by(map: &PoolMap, member: usize) -> usize {
    map.words()
        .iter()
        .filter(|w| w.load(Ordering::Relaxed) & bit(member) != 0)
        .count()
}
