//! `SharedBuf`: an owned buffer of pool pages, read in place and written copy-on-write.

use crate::layout::PAGE_SIZE;
use crate::{Domain, PoolError, Ref};

/// A buffer in the domain's page pool, owned by this process.
///
/// Reads borrow the pool's pages directly. Writes copy a page first if anyone else (another
/// buffer or Ref of this process, or another process) shares it, so what a receiver of
/// [`SharedBuf::share`] sees never changes under it. Dropping the buffer is `rfree`.
///
/// ```
/// use netless_pool::Domain;
///
/// let domain = Domain::private(Default::default())?;
/// let mut a = domain.alloc_from(&[7u8; 10_000])?;
/// let r = a.share()?;                 // a 32-byte Ref; the pages are now shared
/// let b = domain.map(&r)?;            // the receiver's view, no bytes copied
/// a.write(0, &[1, 2, 3])?;            // copy-on-write: only the first page is copied
/// assert_eq!(b.to_vec()[..3], [7, 7, 7]);
/// assert_eq!(a.to_vec()[..3], [1, 2, 3]);
/// # Ok::<(), netless_pool::PoolError>(())
/// ```
pub struct SharedBuf {
    domain: Domain,
    pages: Vec<u32>,
    len: usize,
}

impl std::fmt::Debug for SharedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBuf")
            .field("len", &self.len)
            .field("pages", &self.pages.len())
            .finish()
    }
}

impl SharedBuf {
    pub(crate) fn new(domain: Domain, pages: Vec<u32>, len: usize) -> SharedBuf {
        SharedBuf { domain, pages, len }
    }

    /// Bytes in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The domain it lives in.
    pub fn domain(&self) -> &Domain {
        &self.domain
    }

    /// The buffer as one slice, if its pages are contiguous in the pool (allocations are,
    /// when a free run was available); `None` otherwise (use [`SharedBuf::chunks`]).
    ///
    /// The bytes live in shared memory: honest members never write a shared page, but a
    /// malicious member of the domain could; copy what you validate and then rely on.
    pub fn as_slice(&self) -> Option<&[u8]> {
        let first = *self.pages.first()?;
        let contiguous = self
            .pages
            .iter()
            .enumerate()
            .all(|(i, &p)| p == first + i as u32);
        // Honest members never write a shared page; a malicious one can change the bytes (as
        // in any shared-memory read), never the bounds (see the method's doc).
        // SAFETY: pages [first, first + n) are in bounds and held while `self` is borrowed,
        // and len <= n * PAGE_SIZE, so the slice lies inside the mapping.
        contiguous.then(|| unsafe {
            std::slice::from_raw_parts(self.domain.membership.map.page_ptr(first), self.len)
        })
    }

    /// The buffer's bytes page by page, borrowed from the pool (no copy).
    pub fn chunks(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let map = &self.domain.membership.map;
        self.pages.iter().enumerate().map(move |(i, &p)| {
            let n = (self.len - i * PAGE_SIZE).min(PAGE_SIZE);
            // SAFETY: as in `as_slice`, for one page.
            unsafe { std::slice::from_raw_parts(map.page_ptr(p), n) }
        })
    }

    /// Copies `out.len()` bytes from `offset` (`rread`).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), PoolError> {
        self.domain
            .membership
            .read(&self.pages, self.len, offset, out)
    }

    /// Copies `data` in at `offset` (`rwrite`), copying first any touched page that is
    /// shared.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), PoolError> {
        self.domain
            .membership
            .write(&mut self.pages, self.len, offset, data)
    }

    /// The whole buffer as a `Vec`.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for c in self.chunks() {
            netless_shm::copy::extend(&mut v, c);
        }
        v
    }

    /// A Ref to this buffer's current contents, for one receiver to [`Domain::map`]
    /// (`create_ref`). Costs a ref slot and one page-table page per 4 MiB, never a data copy;
    /// from now on a write by either side copies the page it touches.
    pub fn share(&self) -> Result<Ref, PoolError> {
        self.domain.membership.create_ref(&self.pages, self.len)
    }

    /// Pool page indexes of the buffer (for diagnostics).
    pub fn pages(&self) -> &[u32] {
        &self.pages
    }
}

impl Drop for SharedBuf {
    fn drop(&mut self) {
        self.domain.membership.release_pages(&self.pages);
    }
}
