//! A process's membership of a domain: [`Domain`], the handle every pool operation goes
//! through, and `Membership`, which its clones and buffers share: the pool, the member row,
//! the link to the coordinator and, under one lock, what the process holds: its page ledger
//! (`page_ledger`: which pages it uses, its lease, copy-on-write), the Refs it created
//! (`ref_slots`, which also maps Refs) and its DmRPC buffers (`RAddrTable`). Buffer bytes are
//! read and written here.
//!
//! This module never writes a Ref slot or a page's holder bits itself: `ref_slots`, the ledger
//! and, when the process leaves, `members` do.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::coordinator::Link;
use crate::layout::{PoolGeometry, PoolMap, PAGE_SIZE};
use crate::members::Tokens;
use crate::peer::Creator;
use crate::{pages, PoolError, Ref, SharedBuf};

mod page_ledger;
mod ref_slots;

use page_ledger::PageLedger;
use ref_slots::{Collect, CreatedRefs, ValidatedSlot, COLLECT_BUDGET};

/// Most uses of one page by one process (buffers plus outstanding Refs).
pub const MAX_LOCAL_REFS: u32 = 4096;

/// How a process joins a domain. Start from `DomainConfig::new(name)`.
///
/// ```
/// let config = netless_pool::DomainConfig::new("orders");
/// assert_eq!(config.lease_low, 32);
/// ```
#[derive(Clone, Debug)]
pub struct DomainConfig {
    /// The domain's name (letters, digits, `.`, `_`, `-`).
    pub name: String,
    /// Socket directory; `None` means [`netless_shm::socket_dir`].
    pub dir: Option<std::path::PathBuf>,
    /// Size of the pool, if this process founds the domain.
    pub geometry: PoolGeometry,
    /// Refill the lease of free pages when it drops below this many pages...
    pub lease_low: usize,
    /// ...and give pages back to the global free list when it grows above this many. Whole
    /// runs of freed buffers are leased apart, up to twice this many pages, so a buffer of the
    /// same size reuses them.
    pub lease_high: usize,
    /// A Ref nobody mapped within this long is revoked by its creator (its pages are freed).
    pub ref_ttl: Duration,
    /// Who may join (checked with `SO_PEERCRED` before the pool's fd is passed).
    pub acl: netless_shm::Acl,
    /// How long joining may take, however the coordinator paces its bytes (including
    /// waiting for a new coordinator); also the bound of each try at rejoining a new one.
    pub join_timeout: Duration,
}

impl DomainConfig {
    /// Defaults for domain `name`: a 256 MiB pool, leases of 32..256 pages, Refs revoked after
    /// 60 s unmapped, same-uid members only.
    pub fn new(name: &str) -> DomainConfig {
        DomainConfig {
            name: name.to_owned(),
            dir: None,
            geometry: PoolGeometry::default(),
            lease_low: 32,
            lease_high: 256,
            ref_ttl: Duration::from_secs(60),
            acl: netless_shm::Acl::default(),
            join_timeout: Duration::from_secs(5),
        }
    }
}

/// A snapshot of the pool and of this process's part in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Pages in the pool.
    pub pages: usize,
    /// Pages no member holds.
    pub free_pages: usize,
    /// Pages this process holds (buffers, Refs and its lease).
    pub held_pages: usize,
    /// Free pages leased to this process.
    pub leased_pages: usize,
    /// Live members of the domain.
    pub members: usize,
    /// Refs this process created that nobody has mapped yet.
    pub outstanding_refs: usize,
    /// Bytes this process copied (copy-on-write and `rread`/`rwrite`).
    pub bytes_copied: u64,
    /// Pages this process copied on write.
    pub pages_copied: u64,
}

/// A joined domain: the handle every pool operation goes through. Cheap to clone; the process
/// leaves the domain (releasing everything it holds) when the last clone and buffer drop.
#[derive(Clone)]
pub struct Domain {
    pub(crate) membership: Arc<Membership>,
}

impl std::fmt::Debug for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Domain")
            .field("name", &self.membership.name)
            .field(
                "id",
                &format_args!("{:016x}", self.membership.map.domain_id()),
            )
            .field("member", &self.membership.member)
            .finish()
    }
}

/// This process's membership of a domain, shared by its [`Domain`] clones and buffers: the
/// pool, its member row, what it holds, and its link to the coordinator. Dropping it leaves
/// the domain.
pub(crate) struct Membership {
    pub(crate) map: Arc<PoolMap>,
    pub(crate) member: usize,
    pub(crate) name: String,
    /// The members file, on which this process holds its liveness token for as long as the
    /// membership lasts, and through which it asks after the others'.
    pub(crate) tokens: Tokens,
    /// This process's pid namespace, as its row records it.
    pid_ns: u64,
    holdings: Mutex<Holdings>,
    link: Mutex<Option<Link>>,
    /// In a fabric: the pool's extent, kept held by a live member (see `fabric`).
    pub(crate) fabric: Mutex<Option<crate::fabric::Hold>>,
}

/// What this process holds in the pool, under one lock: every operation that changes a page's
/// uses takes it once.
struct Holdings {
    /// Its uses of each page and its lease of free pages.
    ledger: PageLedger,
    /// The Refs it created and has not yet seen mapped or revoked.
    created_refs: CreatedRefs,
    /// Its buffers of the DmRPC calls.
    raddrs: RAddrTable,
}

/// A DmRPC-style handle to a buffer allocated with [`Domain::ralloc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RAddr(pub u64);

/// The buffers of the DmRPC calls, by their [`RAddr`]: pages (one local use each) and length.
struct RAddrTable {
    buffers: HashMap<u64, (Vec<u32>, usize)>,
    /// Numbers the next address (shifted left 12 bits).
    next: u64,
}

impl RAddrTable {
    fn new() -> RAddrTable {
        RAddrTable {
            buffers: HashMap::new(),
            next: 1,
        }
    }

    /// Files a buffer under a new address.
    fn insert(&mut self, pages: Vec<u32>, len: usize) -> RAddr {
        let id = self.next << 12;
        self.next += 1;
        self.buffers.insert(id, (pages, len));
        RAddr(id)
    }

    /// The pages and length of the buffer at `addr`.
    fn get(&self, addr: RAddr) -> Result<(&[u32], usize), PoolError> {
        let (pages, len) = self
            .buffers
            .get(&addr.0)
            .ok_or(PoolError::DoubleFree(addr.0))?;
        Ok((pages, *len))
    }

    /// Takes the buffer at `addr` out of the table (to free it, or to write it and
    /// [`RAddrTable::put_back`]).
    fn remove(&mut self, addr: RAddr) -> Result<(Vec<u32>, usize), PoolError> {
        self.buffers
            .remove(&addr.0)
            .ok_or(PoolError::DoubleFree(addr.0))
    }

    /// Files a buffer taken with [`RAddrTable::remove`] under its address again.
    fn put_back(&mut self, addr: RAddr, pages: Vec<u32>, len: usize) {
        self.buffers.insert(addr.0, (pages, len));
    }

    /// Empties the table, returning every buffer's pages.
    fn take_all(&mut self) -> Vec<Vec<u32>> {
        self.buffers.drain().map(|(_, (pages, _))| pages).collect()
    }
}

impl Domain {
    pub(crate) fn from_parts(
        map: Arc<PoolMap>,
        member: usize,
        config: &DomainConfig,
        link: Option<Link>,
        tokens: Tokens,
        pid_ns: u64,
    ) -> Domain {
        Domain {
            membership: Arc::new(Membership {
                name: config.name.clone(),
                tokens,
                pid_ns,
                holdings: Mutex::new(Holdings {
                    ledger: PageLedger::new(map.clone(), member, config),
                    created_refs: CreatedRefs::new(map.clone(), member, config.ref_ttl),
                    raddrs: RAddrTable::new(),
                }),
                map,
                member,
                link: Mutex::new(link),
                fabric: Mutex::new(None),
            }),
        }
    }

    /// The domain's name.
    pub fn name(&self) -> &str {
        &self.membership.name
    }

    /// The domain's id: Refs minted here carry it.
    pub fn id(&self) -> u64 {
        self.membership.map.domain_id()
    }

    /// This process's member index (its bit in the page words).
    pub fn member(&self) -> usize {
        self.membership.member
    }

    /// Whether this process currently coordinates the domain (serves its socket).
    pub fn is_coordinator(&self) -> bool {
        lock(&self.membership.link)
            .as_ref()
            .is_some_and(|l| l.is_coordinator())
    }

    /// A new buffer of `len` bytes, contiguous in the pool when a free run that long exists.
    /// Its initial contents are unspecified (old pool bytes of this domain); write before
    /// reading.
    ///
    /// # Errors
    /// [`PoolError::Exhausted`] if the pool has too few free pages;
    /// [`PoolError::Config`] if `len` exceeds [`crate::MAX_REF_BYTES`].
    pub fn alloc(&self, len: usize) -> Result<SharedBuf, PoolError> {
        let pages = self.membership.alloc_pages(len)?;
        Ok(SharedBuf::new(self.clone(), pages, len))
    }

    /// A new buffer holding a copy of `data` (counted in [`PoolStats::bytes_copied`]).
    pub fn alloc_from(&self, data: &[u8]) -> Result<SharedBuf, PoolError> {
        let mut buf = self.alloc(data.len())?;
        buf.write(0, data)?;
        Ok(buf)
    }

    /// Maps a Ref another process (or this one) created: the returned buffer shares the
    /// Ref's pages, reads them in place, and copies a page only when it writes to it. A Ref
    /// maps once; mapping consumes it.
    ///
    /// # Errors
    /// [`PoolError::ForeignRef`] for another domain's Ref; [`PoolError::InvalidRef`] for a
    /// forged or corrupt one; [`PoolError::RefGone`] if it was already mapped, revoked, or its
    /// creator exited; [`PoolError::CountOverflow`].
    pub fn map(&self, r: &Ref) -> Result<SharedBuf, PoolError> {
        let pages = self.membership.map_ref(r, None)?;
        Ok(SharedBuf::new(self.clone(), pages, r.len()))
    }

    /// Maps a Ref only if process `pid` (as this process sees it: in its pid namespace)
    /// created it: for a server that receives Refs from a connection whose peer it knows
    /// (`SO_PEERCRED`), so a peer cannot make it map Refs meant for someone else.
    ///
    /// # Errors
    /// As [`Domain::map`], and [`PoolError::InvalidRef`] if another process created it.
    pub fn map_from(&self, r: &Ref, pid: u32) -> Result<SharedBuf, PoolError> {
        let from = Creator::Pid(pid, self.membership.pid_ns);
        let pages = self.membership.map_ref(r, Some(from))?;
        Ok(SharedBuf::new(self.clone(), pages, r.len()))
    }

    /// Whether process `pid`, as this process sees it (the pid `SO_PEERCRED` reports, in
    /// this process's pid namespace), is a live member of this domain. A member of another
    /// pid namespace is never found this way: its pid means another process here (a peer
    /// proves its membership in any namespace with [`Domain::verify_member`]).
    pub fn has_member(&self, pid: u32) -> bool {
        let m = &self.membership;
        crate::members::has_live_pid(&m.map, &m.tokens, m.member, pid, m.pid_ns)
    }

    /// Revokes a Ref this process created and nobody mapped: its hold on the pages ends.
    ///
    /// # Errors
    /// [`PoolError::RefGone`] if it was mapped or revoked already, or is not ours.
    pub fn revoke(&self, r: &Ref) -> Result<(), PoolError> {
        self.membership.revoke(r)
    }

    /// Frees this process's hold on Refs that were mapped since the last call (creating a Ref
    /// does this too), and revokes Refs older than the configured TTL.
    pub fn collect(&self) {
        let holdings = &mut *self.membership.holdings();
        holdings
            .created_refs
            .collect(&mut holdings.ledger, Collect::Full);
    }

    /// Pool and process statistics (counting free pages scans the page words).
    pub fn stats(&self) -> PoolStats {
        let membership = &self.membership;
        let holdings = membership.holdings();
        let row = &membership.map.members()[membership.member];
        PoolStats {
            pages: membership.map.npages() as usize,
            free_pages: pages::free_count(&membership.map),
            held_pages: pages::held_by(&membership.map, membership.member),
            leased_pages: holdings.ledger.leased_pages(),
            members: crate::members::live_count(&membership.map),
            outstanding_refs: holdings.created_refs.outstanding(),
            bytes_copied: row.bytes_copied.load(Ordering::Relaxed),
            pages_copied: row.pages_copied.load(Ordering::Relaxed),
        }
    }

    /// Releases the pool references of members that died, at once (the coordinator does this
    /// when it sees a member's socket close). Returns how many members were reaped.
    pub fn reap_dead(&self) -> usize {
        let m = &self.membership;
        crate::members::reap_dead_members(&m.map, &m.tokens, Some(m.member))
    }

    // ----- The DmRPC calls (DmRPC Table II), on top of the same machinery. -----

    /// `ralloc(size)`: allocates a buffer and returns its address handle.
    pub fn ralloc(&self, size: usize) -> Result<RAddr, PoolError> {
        let pages = self.membership.alloc_pages(size)?;
        Ok(self.membership.holdings().raddrs.insert(pages, size))
    }

    /// `rfree(addr)`: frees a buffer from [`Domain::ralloc`] or [`Domain::map_ref`].
    ///
    /// # Errors
    /// [`PoolError::DoubleFree`] if `addr` was already freed or never allocated.
    pub fn rfree(&self, addr: RAddr) -> Result<(), PoolError> {
        let (pages, _) = self.membership.holdings().raddrs.remove(addr)?;
        self.membership.release_pages(&pages);
        Ok(())
    }

    /// `create_ref(addr, size)`: a Ref to the first `size` bytes of `addr`'s buffer. The
    /// buffer becomes copy-on-write for both sides.
    pub fn create_ref(&self, addr: RAddr, size: usize) -> Result<Ref, PoolError> {
        // One lock for the lookup and the Ref, so a concurrent rfree or rwrite of `addr`
        // cannot release the pages in between.
        let holdings = &mut *self.membership.holdings();
        let (pages, len) = holdings.raddrs.get(addr)?;
        if size > len {
            return Err(PoolError::OutOfBounds {
                offset: 0,
                len: size,
                size: len,
            });
        }
        let pages = pages[..size.div_ceil(PAGE_SIZE)].to_vec();
        holdings
            .created_refs
            .create(&mut holdings.ledger, &pages, size)
    }

    /// `map_ref(ref)`: maps a Ref and returns its address handle.
    pub fn map_ref(&self, r: &Ref) -> Result<RAddr, PoolError> {
        let pages = self.membership.map_ref(r, None)?;
        Ok(self.membership.holdings().raddrs.insert(pages, r.len()))
    }

    /// `rread(addr, offset, out)`: copies bytes out of a buffer.
    pub fn rread(&self, addr: RAddr, offset: usize, out: &mut [u8]) -> Result<(), PoolError> {
        let holdings = self.membership.holdings();
        let (pages, len) = holdings.raddrs.get(addr)?;
        self.membership.read(pages, len, offset, out)
    }

    /// `rwrite(addr, offset, data)`: copies bytes into a buffer, copying shared pages first.
    pub fn rwrite(&self, addr: RAddr, offset: usize, data: &[u8]) -> Result<(), PoolError> {
        let (mut pages, len) = self.membership.holdings().raddrs.remove(addr)?;
        let result = self.membership.write(&mut pages, len, offset, data);
        self.membership.holdings().raddrs.put_back(addr, pages, len);
        result
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Membership {
    fn holdings(&self) -> MutexGuard<'_, Holdings> {
        lock(&self.holdings)
    }

    fn row(&self) -> &crate::layout::MemberRow {
        &self.map.members()[self.member]
    }

    pub(crate) fn alloc_pages(&self, len: usize) -> Result<Vec<u32>, PoolError> {
        let holdings = &mut *self.holdings();
        // Refs mapped since the last call give their pages back first, so a buffer of the
        // same size reuses them (a run that comes back whole stays leased as one).
        holdings
            .created_refs
            .collect(&mut holdings.ledger, Collect::Some(COLLECT_BUDGET));
        holdings.ledger.alloc_pages(len)
    }

    pub(crate) fn create_ref(&self, data_pages: &[u32], len: usize) -> Result<Ref, PoolError> {
        let holdings = &mut *self.holdings();
        holdings
            .created_refs
            .create(&mut holdings.ledger, data_pages, len)
    }

    /// Maps a Ref (created by `from`, if given): its slot is validated without the lock, then
    /// taken under it.
    pub(crate) fn map_ref(&self, r: &Ref, from: Option<Creator>) -> Result<Vec<u32>, PoolError> {
        let slot = ValidatedSlot::read(&self.map, r, from)?;
        let pages = slot.take(&mut self.holdings().ledger)?;
        self.row().refs_mapped.fetch_add(1, Ordering::Relaxed);
        Ok(pages)
    }

    fn revoke(&self, r: &Ref) -> Result<(), PoolError> {
        let holdings = &mut *self.holdings();
        holdings.created_refs.revoke(&mut holdings.ledger, r)
    }

    pub(crate) fn release_pages(&self, pages: &[u32]) {
        let holdings = &mut *self.holdings();
        holdings.ledger.unuse_pages(pages);
        // Refs mapped since the last call release their pages here too (collect trims).
        holdings
            .created_refs
            .collect(&mut holdings.ledger, Collect::Some(COLLECT_BUDGET));
    }

    pub(crate) fn write(
        &self,
        pages: &mut [u32],
        len: usize,
        offset: usize,
        data: &[u8],
    ) -> Result<(), PoolError> {
        check_range(offset, data.len(), len)?;
        if data.is_empty() {
            return Ok(());
        }
        let end = offset + data.len();
        let touched = offset / PAGE_SIZE..end.div_ceil(PAGE_SIZE);
        // First every touched page is made ours alone (one lock for them all)...
        {
            let ledger = &mut self.holdings().ledger;
            for i in touched.clone() {
                let page_start = i * PAGE_SIZE;
                let page_len = (len - page_start).min(PAGE_SIZE);
                let (lo, hi) = (offset.max(page_start), end.min(page_start + PAGE_SIZE));
                // Bytes of the old page outside [lo, hi) must be preserved.
                let keep = if lo == page_start && hi - lo >= page_len {
                    0
                } else {
                    page_len
                };
                ledger.private_page(pages, i, keep)?;
            }
        }
        // ...then the bytes go in, one copy per stretch of contiguous pages.
        let mut i = touched.start;
        while i < touched.end {
            let mut j = i + 1;
            while j < touched.end && pages[j] == pages[i].wrapping_add((j - i) as u32) {
                j += 1;
            }
            let (lo, hi) = (offset.max(i * PAGE_SIZE), end.min(j * PAGE_SIZE));
            // SAFETY: pages[i..j] are consecutive pool pages, in bounds, and ours alone with one
            // use each (made so above; the caller borrows the buffer mutably, so nobody shares
            // them meanwhile); [lo, hi) lies within them, starting `lo - i * PAGE_SIZE` bytes
            // into page pages[i].
            unsafe {
                netless_shm::copy::copy_bytes(
                    data[lo - offset..].as_ptr(),
                    self.map.page_ptr(pages[i]).add(lo - i * PAGE_SIZE),
                    hi - lo,
                )
            };
            i = j;
        }
        self.row()
            .bytes_copied
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    pub(crate) fn read(
        &self,
        pages: &[u32],
        len: usize,
        offset: usize,
        out: &mut [u8],
    ) -> Result<(), PoolError> {
        check_range(offset, out.len(), len)?;
        let mut done = 0;
        while done < out.len() {
            let at = offset + done;
            let (i, in_page) = (at / PAGE_SIZE, at % PAGE_SIZE);
            let n = (PAGE_SIZE - in_page).min(out.len() - done);
            // SAFETY: pages[i] is in bounds and held by us, so no member writes it while we
            // read (a page is written only by a sole holder); the range lies within the page.
            unsafe {
                netless_shm::copy::copy_bytes(
                    self.map.page_ptr(pages[i]).add(in_page),
                    out[done..].as_mut_ptr(),
                    n,
                )
            };
            done += n;
        }
        self.row()
            .bytes_copied
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Gives back everything this process holds, then its member row.
    fn leave(&self) {
        let holdings = &mut *self.holdings();
        holdings
            .created_refs
            .collect(&mut holdings.ledger, Collect::All);
        for pages in holdings.raddrs.take_all() {
            holdings.ledger.unuse_pages(&pages);
        }
        holdings.ledger.release_lease();
        // Anything still marked ours (outstanding slots overwritten by others) goes too.
        crate::members::release_member(&self.map, self.member, true);
    }
}

fn check_range(offset: usize, len: usize, size: usize) -> Result<(), PoolError> {
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(PoolError::OutOfBounds { offset, len, size });
    }
    Ok(())
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.leave();
        if let Some(hold) = lock(&self.fabric).take() {
            hold.leave(self);
        }
        if let Some(link) = lock(&self.link).take() {
            link.stop();
        }
    }
}
