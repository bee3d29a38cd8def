//! Client-side leasing of request blocks in a replica's shared receive buffer.
//!
//! The receive buffer is shared by every client of a replica: a block is FREE, or leased to
//! one connection (its tag) and either OWNED (holds a message in flight) or CACHED (done; kept
//! for that connection's next message). A client claims blocks with one CAS per block, so a
//! claim is atomic and attributable: when a client dies, the server frees exactly the words
//! carrying its tag. The server moves OWNED → CACHED when it has finished with a message; this
//! module moves CACHED → OWNED (reuse), FREE → OWNED (new lease) and CACHED → FREE (trim).
//! It never reads message contents.

use std::sync::Mutex;

use crate::layout::block_state::{cached, owned, tag_of, FREE};
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Largest run claimed ahead of need.
const MAX_SPARE_BLOCKS: u32 = 8;

/// The blocks one connection holds, and how to get more.
pub(crate) struct BlockLease {
    tag: u32,
    cache_limit: usize,
    /// The run claimed last, `start << 32 | count` (0: none): the lock-free fast path, since
    /// a client making one call at a time reuses the same run every time.
    hot: AtomicU64,
    /// A run claimed ahead of need (OWNED by us, holding no message), `start << 32 | count`
    /// (0: none). Claiming it costs no shared-memory access, so the CAS on the block table
    /// happens while the previous call waits for its reply instead of on the next call's
    /// critical path.
    spare: AtomicU64,
    /// Calls to skip before trying to prepare a spare again after failing to.
    spare_backoff: AtomicU32,
    state: Mutex<LeaseState>,
}

struct LeaseState {
    /// Blocks leased to us (OWNED or CACHED), kept sorted.
    blocks: Vec<u32>,
    /// Where the next scan for free blocks starts.
    scan_hint: u32,
}

impl BlockLease {
    pub(crate) fn new(tag: u32, cache_limit: usize, scan_hint: u32) -> BlockLease {
        BlockLease {
            tag,
            cache_limit: cache_limit.max(1),
            hot: AtomicU64::new(0),
            spare: AtomicU64::new(0),
            spare_backoff: AtomicU32::new(0),
            state: Mutex::new(LeaseState {
                blocks: Vec::new(),
                scan_hint,
            }),
        }
    }

    /// Claims a run of `count` consecutive blocks for one message (OWNED by us); `None` when
    /// the shared buffer has no such run free right now.
    pub(crate) fn claim(&self, table: &[AtomicU32], count: u32) -> Option<u32> {
        let spare = self.spare.load(Ordering::Relaxed);
        if spare != 0
            && spare as u32 == count
            && self
                .spare
                .compare_exchange(spare, 0, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            return Some((spare >> 32) as u32);
        }
        let hot = self.hot.load(Ordering::Relaxed);
        if hot as u32 == count {
            let start = (hot >> 32) as u32;
            if (start as usize + count as usize) <= table.len()
                && self.try_take(table, start, count, cached(self.tag))
            {
                return Some(start);
            }
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let start = self.claim_locked(&mut state, table, count)?;
        self.hot.store(
            (u64::from(start) << 32) | u64::from(count),
            Ordering::Relaxed,
        );
        Some(start)
    }

    fn claim_locked(&self, state: &mut LeaseState, table: &[AtomicU32], count: u32) -> Option<u32> {
        // Every slow-path claim also trims: idle blocks beyond the cache limit go back to
        // the shared buffer, whichever path found this run.
        if state.blocks.len() > self.cache_limit {
            self.trim(state, table);
        }
        if let Some(start) = self.reuse(state, table, count) {
            return Some(start);
        }
        let start = self.claim_free(state, table, count)?;
        for b in start..start + count {
            if let Err(pos) = state.blocks.binary_search(&b) {
                state.blocks.insert(pos, b);
            }
        }
        if state.blocks.len() > self.cache_limit {
            self.trim(state, table);
        }
        Some(start)
    }

    /// Claims a run like the last one ahead of need, so the next `claim` of that size is free
    /// of shared-memory traffic; returns it (for prefetching) if one was prepared now.
    pub(crate) fn prepare_spare(&self, table: &[AtomicU32]) -> Option<(u32, u32)> {
        if self.spare.load(Ordering::Relaxed) != 0 {
            return None;
        }
        if self.spare_backoff.load(Ordering::Relaxed) > 0 {
            self.spare_backoff.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        let count = self.hot.load(Ordering::Relaxed) as u32;
        // Only small runs: a spare holds buffer space other clients could use, and large
        // messages are bound by copying, not by this claim.
        if count == 0 || count > MAX_SPARE_BLOCKS {
            return None;
        }
        let Some(start) = self.claim(table, count) else {
            self.spare_backoff.store(64, Ordering::Relaxed);
            return None;
        };
        let run = (u64::from(start) << 32) | u64::from(count);
        if self
            .spare
            .compare_exchange(0, run, Ordering::Release, Ordering::Relaxed)
            .is_err()
        {
            self.unclaim(table, start, count);
            return None;
        }
        Some((start, count))
    }

    /// The run the next `claim(count)` will most likely return, for prefetching.
    pub(crate) fn likely_next(&self, count: u32) -> Option<u32> {
        let hot = self.hot.load(Ordering::Relaxed);
        (hot != 0 && hot as u32 == count).then_some((hot >> 32) as u32)
    }

    /// Gives back a run we claimed but never sent: it becomes CACHED for our next message.
    pub(crate) fn unclaim(&self, table: &[AtomicU32], start: u32, count: u32) {
        for b in start..start + count {
            if let Some(word) = table.get(b as usize) {
                let _ = word.compare_exchange(
                    owned(self.tag),
                    cached(self.tag),
                    Ordering::Release,
                    Ordering::Relaxed,
                );
            }
        }
    }

    /// Frees every CACHED block we hold (on close).
    pub(crate) fn release_all(&self, table: &[AtomicU32]) {
        self.hot.store(0, Ordering::Relaxed);
        let spare = self.spare.swap(0, Ordering::Acquire);
        if spare != 0 {
            self.unclaim(table, (spare >> 32) as u32, spare as u32);
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for &b in &state.blocks {
            if let Some(word) = table.get(b as usize) {
                let _ = word.compare_exchange(
                    cached(self.tag),
                    FREE,
                    Ordering::Release,
                    Ordering::Relaxed,
                );
            }
        }
        state.blocks.clear();
    }

    /// Number of blocks leased to us.
    #[cfg(test)]
    pub(crate) fn leased(&self) -> usize {
        self.state.lock().unwrap().blocks.len()
    }

    fn reuse(&self, state: &mut LeaseState, table: &[AtomicU32], count: u32) -> Option<u32> {
        let blocks = &state.blocks;
        let mut i = 0;
        while i + count as usize <= blocks.len() {
            let start = blocks[i];
            let consecutive = (0..count as usize).all(|k| blocks[i + k] == start + k as u32);
            if consecutive && self.try_take(table, start, count, cached(self.tag)) {
                return Some(start);
            }
            i += 1;
        }
        None
    }

    fn claim_free(&self, state: &mut LeaseState, table: &[AtomicU32], count: u32) -> Option<u32> {
        let n = table.len() as u32;
        if count == 0 || count > n {
            return None;
        }
        let mut start = state.scan_hint % n;
        let mut scanned = 0u32;
        while scanned < n {
            if start + count > n {
                scanned += n - start;
                start = 0;
                continue;
            }
            // Find the first non-free word in the candidate run to skip past it.
            let busy =
                (0..count).find(|&k| table[(start + k) as usize].load(Ordering::Relaxed) != FREE);
            match busy {
                None if self.try_take(table, start, count, FREE) => {
                    state.scan_hint = (start + count) % n;
                    return Some(start);
                }
                None => {
                    scanned += 1;
                    start += 1;
                }
                Some(k) => {
                    scanned += k + 1;
                    start += k + 1;
                }
            }
        }
        None
    }

    /// CASes `count` words from `expect` to OWNED(tag), rolling back on failure.
    fn try_take(&self, table: &[AtomicU32], start: u32, count: u32, expect: u32) -> bool {
        for k in 0..count {
            let word = &table[(start + k) as usize];
            // Acquire: a reused block's previous contents were read by the server before it
            // released the block (its Release CAS); we must not overwrite them earlier.
            if word
                .compare_exchange(
                    expect,
                    owned(self.tag),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_err()
            {
                for j in 0..k {
                    table[(start + j) as usize].store(expect, Ordering::Release);
                }
                return false;
            }
        }
        true
    }

    fn trim(&self, state: &mut LeaseState, table: &[AtomicU32]) {
        let tag = self.tag;
        let mut excess = state.blocks.len().saturating_sub(self.cache_limit);
        state.blocks.retain(|&b| {
            let word = &table[b as usize];
            let current = word.load(Ordering::Relaxed);
            if current == FREE || tag_of(current) != tag {
                return false; // no longer ours (freed or overwritten by a faulty peer)
            }
            if excess > 0
                && word
                    .compare_exchange(cached(tag), FREE, Ordering::Release, Ordering::Relaxed)
                    .is_ok()
            {
                excess -= 1;
                return false;
            }
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(n: usize) -> Vec<AtomicU32> {
        (0..n).map(|_| AtomicU32::new(0)).collect()
    }

    #[test]
    fn claim_reuse_and_trim() {
        let t = table(16);
        let lease = BlockLease::new(5, 4, 0);
        let a = lease.claim(&t, 1).unwrap();
        assert_eq!(t[a as usize].load(Ordering::Relaxed), owned(5));
        // Still OWNED: a second claim takes a new block.
        let b = lease.claim(&t, 1).unwrap();
        assert_ne!(a, b);
        // The server finishes with `a`: it is reused.
        t[a as usize].store(cached(5), Ordering::Relaxed);
        assert_eq!(lease.claim(&t, 1), Some(a));
        // A run of 3.
        let r = lease.claim(&t, 3).unwrap();
        for k in 0..3 {
            assert_eq!(t[(r + k) as usize].load(Ordering::Relaxed), owned(5));
        }
        lease.unclaim(&t, r, 3);
        assert_eq!(lease.claim(&t, 3), Some(r));
    }

    #[test]
    fn full_table_gives_none_and_foreign_blocks_untouched() {
        let t = table(4);
        t[1].store(owned(9), Ordering::Relaxed);
        let lease = BlockLease::new(5, 8, 0);
        assert!(lease.claim(&t, 2).is_some()); // 2..4
        assert!(lease.claim(&t, 2).is_none());
        assert!(lease.claim(&t, 1).is_some()); // block 0
        assert!(lease.claim(&t, 1).is_none());
        assert_eq!(t[1].load(Ordering::Relaxed), owned(9));
        assert_eq!(lease.leased(), 3);
    }
}
