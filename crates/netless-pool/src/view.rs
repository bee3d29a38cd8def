//! The pool's pages seen through a coherence view: how a member of a software-coherent
//! fabric writes a buffer's pages back before it shares them, and invalidates a mapped
//! buffer's pages before it reads them (see `netless_shm::coherence`).
//!
//! On coherent memory the view's flushes and invalidations are fences; on the non-coherent
//! emulator this member has a private copy of the pages that only those operations move
//! to and from the pool. The pages carry no checksum of their own: whoever sends a Ref over
//! non-coherent memory sends a checksum of its bytes beside it (the receiver's check is
//! what catches a page not yet written back).

use std::sync::Arc;

use netless_shm::coherence::{Coherence, Faults, View};

use crate::layout::{PoolMap, PAGE_SIZE};
use crate::{Domain, PoolError, SharedBuf};

/// A member's view of its pool's pages.
pub struct PagesView {
    // Declared first: it points into `map`'s mapping, which must outlive it.
    view: View<'static>,
    pages_at: usize,
    npages: usize,
    /// This member's row, where the bytes it writes back are counted.
    member: usize,
    map: Arc<PoolMap>,
}

impl std::fmt::Debug for PagesView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagesView")
            .field("coherence", &self.view.coherence())
            .field("npages", &self.npages)
            .finish()
    }
}

impl Domain {
    /// A view of the pool's pages with `coherence`, or through the non-coherent emulator
    /// (leaving out what `emulation`'s faults name).
    ///
    /// # Errors
    /// [`PoolError::Corrupt`] if the pool's mapping cannot be viewed (never for a pool this
    /// crate laid out).
    pub fn pages_view(
        &self,
        coherence: Coherence,
        emulation: Option<Faults>,
    ) -> Result<PagesView, PoolError> {
        let map = self.membership.map.clone();
        let base = map.segment().as_ptr();
        let len = map.segment().len();
        // SAFETY: the mapping is `len` bytes and lives in `map`, which the view is stored
        // beside and drops after; other processes touch it atomically or through views.
        let view = unsafe { View::from_raw(base, len, coherence, emulation) }
            .map_err(|e| PoolError::Corrupt(format!("pool view: {e}")))?;
        let pages_at = map.page_ptr(0) as usize - base as usize;
        let npages = map.npages() as usize;
        Ok(PagesView {
            view,
            pages_at,
            npages,
            member: self.membership.member,
            map,
        })
    }
}

impl PagesView {
    fn page_range(&self, buf: &SharedBuf) -> Result<(), PoolError> {
        if !Arc::ptr_eq(&self.map, &buf.domain().membership.map) {
            return Err(PoolError::Corrupt(
                "the buffer is of another pool than the view".into(),
            ));
        }
        if buf.pages().iter().any(|&p| p as usize >= self.npages) {
            return Err(PoolError::Corrupt("a page outside the pool".into()));
        }
        Ok(())
    }

    /// Writes `data` into `buf`'s pages (a buffer this member just allocated and nobody
    /// else has seen) and writes them back to the pool (counted in
    /// [`PoolStats::bytes_copied`](crate::PoolStats::bytes_copied), as
    /// [`Domain::alloc_from`] is).
    ///
    /// # Errors
    /// [`PoolError::OutOfBounds`] if `data` is longer than the buffer.
    pub fn write_back(&mut self, buf: &SharedBuf, data: &[u8]) -> Result<(), PoolError> {
        self.page_range(buf)?;
        if data.len() > buf.len() {
            return Err(PoolError::OutOfBounds {
                offset: 0,
                len: data.len(),
                size: buf.len(),
            });
        }
        let io = |e: netless_shm::ViewError| PoolError::Corrupt(format!("pool view: {e}"));
        for (chunk, &page) in data.chunks(PAGE_SIZE).zip(buf.pages()) {
            let at = self.pages_at + page as usize * PAGE_SIZE;
            self.view.write(at, chunk).map_err(io)?;
            self.view.flush(at, PAGE_SIZE).map_err(io)?;
        }
        self.map.members()[self.member]
            .bytes_copied
            .fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Reads `buf`'s bytes (a buffer mapped from a peer's Ref) into `out`, invalidating its
    /// pages first so they come from the pool, not from what this member saw before.
    ///
    /// # Errors
    /// [`PoolError::Corrupt`] if a page lies outside the pool.
    pub fn read_fresh(&mut self, buf: &SharedBuf, out: &mut Vec<u8>) -> Result<(), PoolError> {
        self.page_range(buf)?;
        out.clear();
        out.resize(buf.len(), 0);
        let io = |e: netless_shm::ViewError| PoolError::Corrupt(format!("pool view: {e}"));
        for (chunk, &page) in out.chunks_mut(PAGE_SIZE).zip(buf.pages()) {
            let at = self.pages_at + page as usize * PAGE_SIZE;
            self.view.invalidate(at, PAGE_SIZE).map_err(io)?;
            self.view.read(at, chunk).map_err(io)?;
        }
        Ok(())
    }
}
