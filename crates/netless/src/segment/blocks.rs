//! Client-side allocation of request blocks (64-byte slots by default) in a replica's
//! receive buffer (NEBULA §V-B).
//!
//! The buffer is an array of blocks with one word each in the block table: FREE, or OWNED by
//! the connection (its tag) whose message it holds. A sender claims ⌈size/block⌉ contiguous
//! blocks with one CAS per word, so a claim is atomic and attributable: when a client dies
//! the server frees exactly the words carrying its tag. The server frees a request's blocks
//! (OWNED → FREE) as soon as it has read it, so every freed block is at once available to
//! every connection sharing the buffer.
//!
//! Where to look: first the run this connection used last (still warm in its cache, and
//! free again once the server has read the request: a sequential caller reuses the same
//! lines every call); then from the buffer's shared allocation head, scanning forward over
//! busy blocks to the next free run (NEBULA's scrub when the head meets the tail), wrapping
//! once. The head lives in shared memory and any client writes it, so it is only a hint,
//! clamped into this connection's partition before use. Nothing here reads message contents.
//!
//! A connection holds at most its quota of blocks (the server closes one that keeps more):
//! the lease keeps an upper bound of what it holds (what it held when it last counted its
//! words, plus what it claimed since: the server frees blocks without telling it) and counts
//! its words again only when a claim would take that bound past the quota.

use super::layout::block_state::{owned, FREE};
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Largest run, in bytes, claimed ahead of need.
const MAX_SPARE_BYTES: u32 = 8 * 1024;

/// Where one connection allocates, and its hints.
pub(crate) struct BlockLease {
    tag: u32,
    /// This connection's partition of the table: `first..first + len`.
    first: u32,
    len: u32,
    /// Blocks per spare run at most.
    max_spare: u32,
    /// The run claimed last, `start << 32 | count` (0: none): the fast path.
    hot: AtomicU64,
    /// A run claimed ahead of need (OWNED by us, holding no message), `start << 32 | count`
    /// (0: none). Claiming it costs no shared-memory access, so the CAS on the block table
    /// happens while the previous call waits for its reply instead of on the next call's
    /// critical path.
    spare: AtomicU64,
    /// Calls to skip before trying to prepare a spare again after failing to.
    spare_backoff: AtomicU32,
    /// Allocation head for a partition no other connection shares the head of.
    own_head: AtomicU32,
    /// Most blocks this connection may hold at once.
    quota: u32,
    /// An upper bound of the blocks it holds (see the module docs).
    held: AtomicU32,
}

impl BlockLease {
    /// A lease over blocks `partition` of the table, for the connection tagged `tag`, which
    /// may hold `quota` of them at once.
    pub(crate) fn new(
        tag: u32,
        partition: std::ops::Range<u32>,
        block_size: usize,
        quota: u32,
    ) -> BlockLease {
        let len = partition.end.saturating_sub(partition.start);
        BlockLease {
            tag,
            first: partition.start,
            len,
            max_spare: (MAX_SPARE_BYTES / block_size.max(1) as u32).max(1),
            hot: AtomicU64::new(0),
            spare: AtomicU64::new(0),
            spare_backoff: AtomicU32::new(0),
            own_head: AtomicU32::new(partition.start),
            quota,
            held: AtomicU32::new(0),
        }
    }

    /// Claims a run of `count` consecutive blocks for one message (OWNED by us); `None` when
    /// the partition has no such run free right now. `shared_head` is the buffer's shared
    /// allocation head, if the partition is shared.
    pub(crate) fn claim(
        &self,
        table: &[AtomicU32],
        shared_head: Option<&AtomicU32>,
        count: u32,
    ) -> Option<u32> {
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
        if !self.within_quota(table, count) {
            return None;
        }
        let hot = self.hot.load(Ordering::Relaxed);
        if hot as u32 == count {
            let start = (hot >> 32) as u32;
            if self.inside(start, count) && self.try_take(table, start, count) {
                return Some(start);
            }
        }
        let head = shared_head.unwrap_or(&self.own_head);
        let start = self.scan(table, head, count)?;
        self.hot.store(
            (u64::from(start) << 32) | u64::from(count),
            Ordering::Relaxed,
        );
        Some(start)
    }

    /// Claims a fresh run from the allocation head, skipping the last-run and spare fast
    /// paths (for a pipeline, whose last run is still in flight).
    pub(crate) fn claim_fresh(
        &self,
        table: &[AtomicU32],
        shared_head: Option<&AtomicU32>,
        count: u32,
    ) -> Option<u32> {
        if !self.within_quota(table, count) {
            return None;
        }
        self.scan(table, shared_head.unwrap_or(&self.own_head), count)
    }

    /// Whether taking `count` more blocks keeps this connection within its quota; if so,
    /// they are counted as held.
    #[inline(always)]
    fn within_quota(&self, table: &[AtomicU32], count: u32) -> bool {
        let held = self.held.fetch_add(count, Ordering::Relaxed);
        if u64::from(held) + u64::from(count) <= u64::from(self.quota) {
            return true;
        }
        self.recount(table, count)
    }

    /// Counts the words we hold, for a claim of `count` blocks the upper bound put past the
    /// quota; whether the claim stays within it.
    #[cold]
    fn recount(&self, table: &[AtomicU32], count: u32) -> bool {
        let mine = owned(self.tag);
        let held = table
            .get(self.first as usize..(self.first + self.len) as usize)
            .map_or(0, |words| {
                words
                    .iter()
                    .filter(|w| w.load(Ordering::Relaxed) == mine)
                    .count() as u32
            });
        let fits = u64::from(held) + u64::from(count) <= u64::from(self.quota);
        self.held
            .store(if fits { held + count } else { held }, Ordering::Relaxed);
        fits
    }

    /// Claims a run like the last one ahead of need, so the next `claim` of that size is free
    /// of shared-memory traffic; returns it (for prefetching) if one was prepared now.
    /// `sharers` is how many connections allocate in this partition: a spare holds blocks
    /// others could use, so none is taken where the partition is small for its sharers.
    pub(crate) fn prepare_spare(
        &self,
        table: &[AtomicU32],
        shared_head: Option<&AtomicU32>,
        sharers: u32,
    ) -> Option<(u32, u32)> {
        if self.spare.load(Ordering::Relaxed) != 0 {
            return None;
        }
        if self.spare_backoff.load(Ordering::Relaxed) > 0 {
            self.spare_backoff.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        let count = self.hot.load(Ordering::Relaxed) as u32;
        let roomy = u64::from(count) * 8 * u64::from(sharers.max(1)) <= u64::from(self.len);
        if count == 0 || count > self.max_spare || !roomy {
            return None;
        }
        let Some(start) = self.claim(table, shared_head, count) else {
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
    #[inline]
    pub(crate) fn likely_next(&self, count: u32) -> Option<u32> {
        let hot = self.hot.load(Ordering::Relaxed);
        (hot != 0 && hot as u32 == count).then_some((hot >> 32) as u32)
    }

    /// Gives back a run we claimed but never sent, by CAS: a word no longer ours (the server
    /// reclaimed it once our connection ended, and someone claimed it since) is left alone.
    #[inline]
    pub(crate) fn unclaim(&self, table: &[AtomicU32], start: u32, count: u32) {
        for b in start..start.saturating_add(count) {
            if let Some(word) = table.get(b as usize) {
                let _ = word.compare_exchange(
                    owned(self.tag),
                    FREE,
                    Ordering::Release,
                    Ordering::Relaxed,
                );
            }
        }
    }

    /// Whether every word of `start..start + count` is OWNED by us (a run kept for reuse is
    /// checked before each reuse: the table is memory the server writes).
    #[inline]
    pub(crate) fn holds(&self, table: &[AtomicU32], start: u32, count: u32) -> bool {
        self.inside(start, count)
            && table
                .get(start as usize..(start + count) as usize)
                .is_some_and(|words| {
                    words
                        .iter()
                        .all(|w| w.load(Ordering::Acquire) == owned(self.tag))
                })
    }

    /// Our tag and quota.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn identity(&self) -> (u32, u32) {
        (self.tag, self.quota)
    }

    /// Blocks in this connection's partition.
    pub(crate) fn partition_len(&self) -> u32 {
        self.len
    }

    /// Frees the spare run, if any (on close).
    pub(crate) fn release_all(&self, table: &[AtomicU32]) {
        self.hot.store(0, Ordering::Relaxed);
        let spare = self.spare.swap(0, Ordering::Acquire);
        if spare != 0 {
            self.unclaim(table, (spare >> 32) as u32, spare as u32);
        }
    }

    #[inline]
    fn inside(&self, start: u32, count: u32) -> bool {
        start >= self.first
            && u64::from(start) + u64::from(count) <= u64::from(self.first) + u64::from(self.len)
    }

    /// First fit from the allocation head, skipping busy blocks, wrapping once.
    fn scan(&self, table: &[AtomicU32], head: &AtomicU32, count: u32) -> Option<u32> {
        let (first, n) = (self.first, self.len);
        if count == 0 || count > n || (first + n) as usize > table.len() {
            return None;
        }
        // Untrusted hint: clamp it into the partition (dividing only when it is outside).
        let mut at = head.load(Ordering::Relaxed).wrapping_sub(first);
        if at >= n {
            at %= n;
        }
        let next = |at: u32| {
            if at + count >= n {
                at + count - n
            } else {
                at + count
            }
        };
        // The run at the head is usually free (the server frees runs in the order they were
        // taken): CAS it straight away. Loading its words first would fetch their line
        // shared, and each CAS would then need a second trip to own it.
        if at + count <= n && self.try_take(table, first + at, count) {
            head.store(first + next(at), Ordering::Relaxed);
            return Some(first + at);
        }
        let mut scanned = 0u32;
        while scanned < n {
            if at + count > n {
                scanned += n - at;
                at = 0;
                continue;
            }
            // Find the first busy word in the candidate run to skip past it.
            let busy = (0..count)
                .find(|&k| table[(first + at + k) as usize].load(Ordering::Relaxed) != FREE);
            match busy {
                None if self.try_take(table, first + at, count) => {
                    head.store(first + next(at), Ordering::Relaxed);
                    return Some(first + at);
                }
                None => {
                    scanned += 1;
                    at += 1;
                }
                Some(k) => {
                    scanned += k + 1;
                    at += k + 1;
                }
            }
        }
        None
    }

    /// CASes `count` words from FREE to OWNED(tag), rolling back on failure.
    fn try_take(&self, table: &[AtomicU32], start: u32, count: u32) -> bool {
        for k in 0..count {
            let word = &table[(start + k) as usize];
            // Acquire: a reused block's previous contents were read by the server before it
            // freed the block (its Release store); we must not overwrite them earlier.
            if word
                .compare_exchange(FREE, owned(self.tag), Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                for j in 0..k {
                    let _ = table[(start + j) as usize].compare_exchange(
                        owned(self.tag),
                        FREE,
                        Ordering::Release,
                        Ordering::Relaxed,
                    );
                }
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(n: usize) -> Vec<AtomicU32> {
        (0..n).map(|_| AtomicU32::new(0)).collect()
    }

    #[test]
    fn claim_reuses_the_hot_run_once_freed() {
        let t = table(16);
        let head = AtomicU32::new(0);
        let lease = BlockLease::new(5, 0..16, 64, u32::MAX);
        let a = lease.claim(&t, Some(&head), 1).unwrap();
        assert_eq!(t[a as usize].load(Ordering::Relaxed), owned(5));
        // Still OWNED: a second claim takes a new block.
        let b = lease.claim(&t, Some(&head), 1).unwrap();
        assert_ne!(a, b);
        // The server frees `b` (the hot run): it is reused.
        t[b as usize].store(FREE, Ordering::Relaxed);
        assert_eq!(lease.claim(&t, Some(&head), 1), Some(b));
        let r = lease.claim(&t, Some(&head), 3).unwrap();
        for k in 0..3 {
            assert_eq!(t[(r + k) as usize].load(Ordering::Relaxed), owned(5));
        }
        lease.unclaim(&t, r, 3);
        assert_eq!(t[r as usize].load(Ordering::Relaxed), FREE);
        assert_eq!(lease.claim(&t, Some(&head), 3), Some(r));
    }

    #[test]
    fn scan_skips_busy_runs_and_wraps() {
        let t = table(8);
        // Another connection holds 2..5; the head points into it.
        for w in &t[2..5] {
            w.store(owned(9), Ordering::Relaxed);
        }
        let head = AtomicU32::new(3);
        let lease = BlockLease::new(5, 0..8, 64, u32::MAX);
        assert_eq!(lease.claim(&t, Some(&head), 3), Some(5));
        assert_eq!(head.load(Ordering::Relaxed), 0);
        assert_eq!(lease.claim(&t, Some(&head), 2), Some(0));
        assert_eq!(lease.claim(&t, Some(&head), 1), None);
        assert_eq!(t[2].load(Ordering::Relaxed), owned(9));
    }

    #[test]
    fn partitions_are_respected_and_a_wild_head_is_clamped() {
        let t = table(12);
        let head = AtomicU32::new(u32::MAX);
        let lease = BlockLease::new(5, 4..8, 64, u32::MAX);
        let mut got = Vec::new();
        while let Some(b) = lease.claim(&t, Some(&head), 1) {
            got.push(b);
        }
        got.sort();
        assert_eq!(got, vec![4, 5, 6, 7]);
        assert!(t[..4]
            .iter()
            .chain(&t[8..])
            .all(|w| w.load(Ordering::Relaxed) == FREE));
    }

    #[test]
    fn holds_only_runs_wholly_ours_inside_the_partition() {
        let t = table(16);
        let lease = BlockLease::new(5, 4..12, 64, u32::MAX);
        let head = AtomicU32::new(4);
        let r = lease.claim(&t, Some(&head), 3).unwrap();
        assert!(lease.holds(&t, r, 3));
        // A word the server (or anyone) changed: no longer ours.
        t[(r + 1) as usize].store(owned(9), Ordering::Relaxed);
        assert!(!lease.holds(&t, r, 3));
        assert!(!lease.holds(&t, 0, 2), "outside the partition");
        assert!(!lease.holds(&t, 11, u32::MAX), "no overflow");
        assert_eq!(lease.partition_len(), 8);
    }

    #[test]
    fn spares_only_where_the_partition_is_roomy() {
        let t = table(64);
        let head = AtomicU32::new(0);
        let lease = BlockLease::new(5, 0..64, 64, u32::MAX);
        let a = lease.claim(&t, Some(&head), 2).unwrap();
        // 2 blocks × 8 × 8 sharers > 64: no spare.
        assert_eq!(lease.prepare_spare(&t, Some(&head), 8), None);
        let (s, n) = lease.prepare_spare(&t, Some(&head), 1).unwrap();
        assert_eq!(n, 2);
        assert_ne!(s, a);
        assert_eq!(lease.claim(&t, Some(&head), 2), Some(s));
        lease.release_all(&t);
    }

    #[test]
    fn a_lease_holds_no_more_than_its_quota() {
        let t = table(64);
        let head = AtomicU32::new(0);
        let lease = BlockLease::new(5, 0..64, 64, 10);
        let a = lease.claim(&t, Some(&head), 4).unwrap();
        let _b = lease.claim(&t, Some(&head), 4).unwrap();
        // 8 held: 4 more would pass the quota of 10, and the count confirms it.
        assert_eq!(lease.claim(&t, Some(&head), 4), None);
        assert_eq!(lease.claim_fresh(&t, Some(&head), 4), None);
        assert_eq!(lease.claim(&t, Some(&head), 2).map(|_| ()), Some(()));
        // The server frees a run: the next claim that needs the room counts again.
        for w in &t[a as usize..a as usize + 4] {
            w.store(FREE, Ordering::Relaxed);
        }
        assert!(lease.claim(&t, Some(&head), 4).is_some());
        let held = t
            .iter()
            .filter(|w| w.load(Ordering::Relaxed) == owned(5))
            .count();
        assert_eq!(held, 10);
    }
}
