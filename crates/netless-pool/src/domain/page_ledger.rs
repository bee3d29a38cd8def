//! The page ledger: which pool pages this process uses, how often, and its lease of free
//! pages; the copy-on-write decision is made here.
//!
//! The shared pool records *which* members hold a page (one bit each); the ledger counts,
//! privately, how many of this process's buffers and outstanding Refs use each page, and sets
//! or clears the process's bit when that count leaves or reaches zero. A page may be written
//! in place only when this process counts one use and is the page's only holder; otherwise a
//! write copies it first (copy-on-write). New pages come from the lease, a stock of free pages
//! this process holds alone, refilled and trimmed in batches between two marks. A buffer's
//! contiguous run of pages that comes back whole (every page's last use, ours alone) stays
//! leased as a run, so the next buffer of up to its length takes it with no atomic per page
//! and writes memory that is still mapped and cached.
//!
//! The ledger never reads or writes a Ref slot (`ref_slots` does, using the ledger for every
//! page it takes or gives back), and never writes a page's bytes except to copy a shared page
//! on write.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::layout::{MemberRow, PoolMap, MAX_REF_BYTES, PAGE_SIZE};
use crate::{pages, PoolError};

use super::{DomainConfig, MAX_LOCAL_REFS};

/// This process's uses of pool pages and its lease of free pages.
pub(super) struct PageLedger {
    map: Arc<PoolMap>,
    member: usize,
    /// Local uses of each page of the pool (buffers plus outstanding Refs).
    counts: Vec<u32>,
    /// Free pages held by this process alone, with no local use yet.
    lease: Vec<u32>,
    /// Free contiguous runs held by this process alone (first page, pages), most recently
    /// freed last: part of the lease, kept whole for the next multi-page buffer.
    runs: Vec<(u32, u32)>,
    /// Refill the lease below this many pages...
    lease_low: usize,
    /// ...and give pages back above this many.
    lease_high: usize,
}

impl PageLedger {
    /// An empty ledger for `member` of the pool `map`, with the config's lease marks (the low
    /// one at least 1, the high one at least twice the low one).
    pub(super) fn new(map: Arc<PoolMap>, member: usize, config: &DomainConfig) -> PageLedger {
        let npages = map.npages() as usize;
        let lease_low = config.lease_low.max(1);
        PageLedger {
            map,
            member,
            counts: vec![0; npages],
            lease: Vec::new(),
            runs: Vec::new(),
            lease_low,
            lease_high: config.lease_high.max(lease_low * 2),
        }
    }

    /// Free pages leased to this process (single pages and runs).
    pub(super) fn leased_pages(&self) -> usize {
        self.lease.len() + self.run_pages()
    }

    fn run_pages(&self) -> usize {
        self.runs.iter().map(|&(_, n)| n as usize).sum()
    }

    /// Most pages the lease keeps as whole runs, beyond the single pages' high mark.
    fn runs_high(&self) -> usize {
        2 * self.lease_high
    }

    fn row(&self) -> &MemberRow {
        &self.map.members()[self.member]
    }

    /// One more local use of `page`, taking a holder bit on the first.
    pub(super) fn use_page(&mut self, page: u32) -> Result<(), PoolError> {
        let c = &mut self.counts[page as usize];
        if *c >= MAX_LOCAL_REFS {
            return Err(PoolError::CountOverflow {
                page,
                max: MAX_LOCAL_REFS,
            });
        }
        *c += 1;
        if *c == 1 {
            pages::add_holder(&self.map, self.member, page);
        }
        Ok(())
    }

    /// One more local use of each of `pages`, or (on an overflow) of none of them.
    pub(super) fn use_pages(&mut self, pages: &[u32]) -> Result<(), PoolError> {
        for (k, &p) in pages.iter().enumerate() {
            if let Err(e) = self.use_page(p) {
                self.unuse_pages(&pages[..k]);
                return Err(e);
            }
        }
        Ok(())
    }

    /// One local use of `page` fewer; on the last, the page goes to the lease (if we hold it
    /// alone) or our holder bit is cleared.
    pub(super) fn unuse_page(&mut self, page: u32) {
        let c = &mut self.counts[page as usize];
        if *c == 0 {
            tracing::error!("netless-pool: page {page} released more often than used (bug)");
            return;
        }
        *c -= 1;
        if *c > 0 {
            return;
        }
        if pages::sole_holder(&self.map, self.member, page) && self.lease.len() < self.lease_high {
            self.lease.push(page);
        } else if let Err(e) = pages::release(&self.map, self.member, page) {
            tracing::error!("netless-pool: {e}");
        }
    }

    /// One local use fewer of each of `pages`. A contiguous stretch of them whose every
    /// page this drops to no use, and that this process holds alone, is leased back whole.
    pub(super) fn unuse_pages(&mut self, pages: &[u32]) {
        let mut rest = pages;
        while let Some(&first) = rest.first() {
            let n = rest
                .iter()
                .enumerate()
                .take_while(|&(i, &p)| p == first.wrapping_add(i as u32))
                .count();
            let (run, tail) = rest.split_at(n);
            rest = tail;
            if n < 2 || !self.lease_run(first, n) {
                for &p in run {
                    self.unuse_page(p);
                }
            }
        }
    }

    /// Drops the last local use of pages `[first, first + n)` and keeps them as a leased
    /// run, if each has exactly one use and this process is its only holder; otherwise
    /// changes nothing and returns false.
    fn lease_run(&mut self, first: u32, n: usize) -> bool {
        let range = first as usize..first as usize + n;
        let Some(counts) = self.counts.get(range.clone()) else {
            return false;
        };
        if counts.iter().any(|&c| c != 1)
            || !range
                .clone()
                .all(|p| pages::sole_holder(&self.map, self.member, p as u32))
        {
            return false;
        }
        self.counts[range].fill(0);
        self.runs.push((first, n as u32));
        // Over the mark, the oldest runs go back to the free list (a run longer than the
        // mark too).
        while self.run_pages() > self.runs_high() {
            let (p, k) = self.runs.remove(0);
            for page in p..p + k {
                pages::release_sole(&self.map, self.member, page);
            }
        }
        true
    }

    /// A leased run of at least `n` pages, its first `n` pages given one use each (the rest
    /// stays leased). The best fit, the most recently freed of equals; a run whose pages are
    /// not all ours alone any more (another process wrote our page words) is dropped.
    fn take_run(&mut self, n: usize) -> Option<u32> {
        loop {
            let (at, &(first, len)) = self
                .runs
                .iter()
                .enumerate()
                .filter(|&(_, &(_, len))| len as usize >= n)
                .min_by_key(|&(i, &(_, len))| (len, std::cmp::Reverse(i)))?;
            self.runs.remove(at);
            let sole = (first..first + len).all(|p| pages::sole_holder(&self.map, self.member, p));
            if !sole {
                tracing::error!(
                    "netless-pool: a leased run of pages {first}..{} is not ours alone any \
                     more (another process wrote our page words)",
                    first + len
                );
                for p in first..first + len {
                    pages::release_sole(&self.map, self.member, p);
                }
                continue;
            }
            let n32 = n as u32;
            if len > n32 + 1 {
                self.runs.push((first + n32, len - n32));
            } else if len == n32 + 1 {
                self.lease.push(first + n32);
            }
            self.counts[first as usize..first as usize + n].fill(1);
            return Some(first);
        }
    }

    /// Gives every leased run back to the free list (the pool is short of pages).
    fn release_runs(&mut self) {
        for (p, k) in std::mem::take(&mut self.runs) {
            for page in p..p + k {
                pages::release_sole(&self.map, self.member, page);
            }
        }
    }

    fn refill(&mut self, need: usize) -> Result<(), PoolError> {
        if self.lease.len() >= need {
            return Ok(());
        }
        let target = need.max((self.lease_low + self.lease_high) / 2);
        let want = target - self.lease.len();
        // First fit: the lowest free pages were most likely used before, so they are already
        // faulted in (a page of the memfd costs a fault and zeroing on first touch).
        let mut cursor = 0;
        pages::claim_batch(&self.map, self.member, want, &mut cursor, &mut self.lease);
        if self.lease.len() < need {
            return Err(PoolError::Exhausted(format!(
                "needed {need} free pages, the pool of {} pages has only {} free: free \
                 buffers, or give the domain a bigger pool",
                self.map.npages(),
                pages::free_count(&self.map) + self.lease.len()
            )));
        }
        Ok(())
    }

    /// Gives pages back to the global free list if the lease grew above its high mark.
    pub(super) fn trim_lease(&mut self) {
        if self.lease.len() > self.lease_high {
            let keep = (self.lease_low + self.lease_high) / 2;
            for page in self.lease.drain(keep..) {
                pages::release_sole(&self.map, self.member, page);
            }
        }
    }

    /// Gives the whole lease back to the global free list (leaving the domain).
    pub(super) fn release_lease(&mut self) {
        self.release_runs();
        for page in std::mem::take(&mut self.lease) {
            pages::release_sole(&self.map, self.member, page);
        }
    }

    /// A page from the lease with one local use.
    pub(super) fn fresh_page(&mut self) -> Result<u32, PoolError> {
        if self.lease.len() < self.lease_low {
            // Below the low mark: refill in a batch, but a short pool only fails when empty.
            let _ = self.refill(1);
        }
        if self.lease.is_empty() {
            self.release_runs();
            let _ = self.refill(1);
        }
        let page = self.lease.pop().ok_or_else(|| {
            PoolError::Exhausted(format!(
                "no free page left in the pool of {} pages: free buffers, or give the domain \
                 a bigger pool",
                self.map.npages()
            ))
        })?;
        self.counts[page as usize] = 1;
        Ok(page)
    }

    /// Pages for a new buffer of `len` bytes, one local use each: contiguous when a free run
    /// that long exists.
    pub(super) fn alloc_pages(&mut self, len: usize) -> Result<Vec<u32>, PoolError> {
        if len > MAX_REF_BYTES {
            return Err(PoolError::Config(format!(
                "a buffer of {len} bytes exceeds the largest of {MAX_REF_BYTES} bytes"
            )));
        }
        let n = len.div_ceil(PAGE_SIZE);
        if n == 1 {
            return Ok(vec![self.fresh_page()?]);
        }
        if n > 1 {
            if let Some(first) = self.take_run(n) {
                return Ok((first..first + n as u32).collect());
            }
            // First fit, as for leases: reuse warm pages.
            let mut cursor = 0;
            let mut run = pages::claim_run(&self.map, self.member, n, &mut cursor);
            if run.is_none() && !self.runs.is_empty() {
                // Our leased runs may be what splits the free pages.
                self.release_runs();
                run = pages::claim_run(&self.map, self.member, n, &mut cursor);
            }
            if let Some(first) = run {
                let pages: Vec<u32> = (first..first + n as u32).collect();
                for &p in &pages {
                    self.counts[p as usize] = 1;
                }
                return Ok(pages);
            }
        }
        // No contiguous run: any pages will do (reads then go page by page).
        if self.refill(n).is_err() {
            self.release_runs();
            self.refill(n)?;
        }
        let at = self.lease.len() - n;
        let pages: Vec<u32> = self.lease.drain(at..).collect();
        for &p in &pages {
            self.counts[p as usize] = 1;
        }
        Ok(pages)
    }

    /// Makes page `i` of `pages` private (copying it if shared) and returns it.
    /// `keep` is how many leading bytes of the old page must survive (0 for a full overwrite).
    pub(super) fn private_page(
        &mut self,
        pages: &mut [u32],
        i: usize,
        keep: usize,
    ) -> Result<u32, PoolError> {
        let old = pages[i];
        if self.counts[old as usize] == 1 && pages::sole_holder(&self.map, self.member, old) {
            return Ok(old);
        }
        let new = self.fresh_page()?;
        if keep > 0 {
            // SAFETY: both pages are in bounds (indexes from our ledger); `new` is ours alone
            // (fresh from the lease), `old` is only read; they are distinct pages.
            unsafe {
                std::ptr::copy_nonoverlapping(self.map.page_ptr(old), self.map.page_ptr(new), keep)
            };
            self.row()
                .bytes_copied
                .fetch_add(keep as u64, Ordering::Relaxed);
        }
        self.row().pages_copied.fetch_add(1, Ordering::Relaxed);
        self.unuse_page(old);
        pages[i] = new;
        Ok(new)
    }
}
