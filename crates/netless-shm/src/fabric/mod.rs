//! A memory fabric: one region that several processes, containers or hosts map (a DAX
//! device, a file on a shared DAX, hugetlbfs or tmpfs mount), and the structures in it that
//! let them find and outlive one another without sharing a kernel: a versioned superblock,
//! a member table with heartbeat leases, a service directory, and a heap of units that
//! segments are cut from. Only offsets are stored in it, never pointers.
//!
//! Every process that opens a region joins it as a member ([`Fabric::open`]) and keeps a
//! thread that beats its heartbeat, watches the others, and reclaims what a dead member
//! held once it has been dead for two leases (long enough for everyone still using its
//! segments to have noticed). This module owns the region's own layout; what is in the
//! segments, and what the request and reply words of a connect slot mean, is the caller's.
//!
//! ```
//! use netless_shm::fabric::{Fabric, FabricOptions};
//!
//! let path = std::env::temp_dir().join(format!("netless-doc-fabric-{}", std::process::id()));
//! let fabric = Fabric::open(&path, &FabricOptions::default())?;
//! let extent = fabric.alloc(100_000)?;
//! let segment = fabric.map(extent)?;
//! assert_eq!(segment.len() as u64, extent.len);
//! fabric.free(extent);
//! # drop(segment);
//! # drop(fabric);
//! # std::fs::remove_file(path).ok();
//! # Ok::<(), netless_shm::Error>(())
//! ```

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};

mod alloc;
mod directory;
mod layout;
mod mailbox;
mod members;
mod upkeep;

pub use alloc::Extent;
pub use directory::{Entry, ENTRY_EXTENTS};
pub use layout::{DIRECTORY, MAX_NAME, MAX_SIZE, MEMBERS, MIN_SIZE, UNIT};
pub use mailbox::{Mailbox, Phase, Request, MAX_REASON, SLOTS_PER_UNIT, SLOT_BYTES, WORDS};
pub use members::{MemberId, MemberSlot};

use crate::coherence::{Coherence, Faults, View};
use crate::sync::Ordering;
use crate::{Error, Published, PublishedView, Segment};
use layout::{Geometry, Words};
use members::{Judge, Observer};

/// The byte of the fabric file whose exclusive lock serialises sizing and formatting.
const SETUP_LOCK: u64 = 1 << 49;
/// The first of the bytes `Fabric::lock_name` locks.
const NAME_LOCKS: u64 = 1 << 48;

/// A lock taken with [`Fabric::lock_name`]; released when it drops.
#[derive(Debug)]
pub struct NameLock {
    _file: File,
}

/// Default lease: a member whose heartbeat has not moved for this long is dead.
pub const DEFAULT_LEASE: Duration = Duration::from_millis(800);
/// Default size of a region created by [`Fabric::open`].
pub const DEFAULT_SIZE: u64 = 256 << 20;

/// How to open (or create) a region.
#[derive(Clone, Debug)]
pub struct FabricOptions {
    /// Size of a region created now; an existing region keeps its own.
    pub size: u64,
    /// Coherence of a region created now; an existing region's is read from it.
    pub coherence: Coherence,
    /// Lease of a region created now; an existing region's is read from it.
    pub lease: Duration,
    /// Test backend for software coherence: this member sees the region's data through the
    /// non-coherent emulator ([`crate::coherence::Emulated`]: a private copy, other members'
    /// writes seen only through invalidations, its own published only through flushes),
    /// leaving out the operations the faults name. `None`: the real memory.
    pub emulation: Option<Faults>,
    /// With [`FabricOptions::emulation`], the operations this member leaves out on the
    /// region's own tables (members, directory, connect slots) rather than on its data
    /// (rings, pool pages), so tests can break one plane at a time.
    pub control_faults: Faults,
    /// Test backend for hosts: this member claims a kernel of its own (a random boot id),
    /// so the others judge it by its heartbeat alone and wake it by no futex, as they would
    /// a process on another host.
    pub another_kernel: bool,
}

impl Default for FabricOptions {
    fn default() -> Self {
        FabricOptions {
            size: DEFAULT_SIZE,
            coherence: Coherence::Hardware,
            lease: DEFAULT_LEASE,
            emulation: None,
            control_faults: Faults::default(),
            another_kernel: false,
        }
    }
}

/// A member's handle on a fabric region (cheap to clone; the membership ends when the last
/// clone drops).
#[derive(Clone, Debug)]
pub struct Fabric {
    inner: Arc<Inner>,
}

/// Called on every tick of the fabric's thread with the fabric; returns `false` to stop
/// being called.
pub type Watcher = Box<dyn FnMut(&Fabric) -> bool + Send>;

struct Inner {
    path: PathBuf,
    file: File,
    /// Holds this member's liveness token (a lock byte of the file) while it is open.
    token_file: File,
    /// The view single-writer fields go through, in a software-coherent region. Declared
    /// before `map`, which it points into, so it drops first.
    _view: Option<Box<Mutex<View<'static>>>>,
    map: MmapRaw,
    words: Words,
    geometry: Geometry,
    coherence: Coherence,
    lease: Duration,
    emulation: Option<Faults>,
    me: MemberId,
    boot_id: [u8; 16],
    ticks: Mutex<Ticks>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Set once the others reclaimed this member's slot (see `Fabric::is_evicted`).
    evicted: crate::sync::AtomicBool,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric")
            .field("path", &self.path)
            .field("member", &self.me)
            .field("coherence", &self.coherence)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Ticks {
    observer: Observer,
    /// Extents to free once the time passes (peers may still touch them until then).
    later: Vec<(Instant, Extent)>,
    watchers: Vec<Watcher>,
    next_hint: usize,
    /// Directory entries seen mid-publication, and since when (a publisher that died
    /// claiming one leaves it so).
    claiming: std::collections::HashMap<u32, (u64, Instant)>,
    /// Owners of units that are no slot's occupant (a member evicted while it allocated),
    /// and since when.
    stale: std::collections::HashMap<MemberId, Instant>,
    ticks: u64,
}

impl Fabric {
    /// Opens the region at `path` and joins it, creating and formatting it (with `options`)
    /// if the file does not exist or is empty.
    ///
    /// # Errors
    /// [`Error::Fabric`] if the file holds something else, another layout version, or the
    /// member table is full; [`Error::Io`] if it cannot be opened or mapped.
    pub fn open(path: &Path, options: &FabricOptions) -> Result<Fabric, Error> {
        let fail = |reason: String| Error::Fabric {
            path: path.to_owned(),
            reason,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|source| Error::Io {
                op: "open of a fabric file",
                source,
            })?;
        // Sizing and formatting happen under an exclusive lock byte of the file, so two
        // creators never size one file differently, nor format it twice (one kernel's
        // openers; a region shared across kernels is made once, before the others join).
        let setup = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|source| Error::Io {
                op: "open of a fabric file",
                source,
            })?;
        crate::liveness::lock_byte_exclusive(&setup, SETUP_LOCK, Duration::from_secs(10))?;
        let mut size = region_size(&file)?;
        let sized_here = size == 0;
        if sized_here {
            if !(MIN_SIZE..=MAX_SIZE).contains(&options.size) {
                return Err(fail(format!(
                    "cannot create a region of {} bytes: choose {MIN_SIZE} to {MAX_SIZE}",
                    options.size
                )));
            }
            // Racing creators set the same length.
            file.set_len(options.size).map_err(|source| Error::Io {
                op: "ftruncate of a new fabric file",
                source,
            })?;
            size = options.size;
        }
        let geometry = Geometry::of(size).ok_or_else(|| {
            fail(format!(
                "a region of {size} bytes is out of range ({MIN_SIZE} to {MAX_SIZE})"
            ))
        })?;
        let map = MmapOptions::new()
            .len(size as usize)
            .map_raw(&file)
            .map_err(|source| Error::Io {
                op: "mmap(MAP_SHARED) of a fabric region",
                source,
            })?;
        // SAFETY: the mapping is `size` bytes, page aligned, and lives in `Inner` as long as
        // any `Words` copy (they are all inside `Inner`, or held with a `Fabric`).
        let plain = unsafe { Words::new(map.as_mut_ptr(), size as usize, None) };
        let (coherence, lease) =
            format_or_check(&plain, size, options, sized_here).map_err(fail)?;
        drop(setup);
        // In a software-coherent region the single-writer fields go through a view: written
        // back at once, invalidated before they are read (through the emulator in tests).
        let view = match coherence {
            Coherence::Hardware => None,
            Coherence::Software => {
                // The region's own tables take the control plane's faults, not the data's.
                let faults = options.emulation.map(|_| options.control_faults);
                let (base, len) = (map.as_mut_ptr(), size as usize);
                // SAFETY: the view covers the mapping, which `Inner` keeps for longer (it is
                // declared after the view); other members touch it atomically or by views.
                let view = unsafe { View::from_raw(base, len, Coherence::Software, faults) }
                    .map_err(|e| fail(format!("cannot view it: {e}")))?;
                Some(Box::new(Mutex::new(view)))
            }
        };
        let view_ptr = view.as_deref().map(std::ptr::NonNull::from);
        // SAFETY: as for `plain`; the view lives in `Inner` beside the mapping.
        let words = unsafe { Words::new(map.as_mut_ptr(), size as usize, view_ptr) };
        let boot_id = if options.another_kernel {
            members::random_boot_id()
        } else {
            members::boot_id()
        };
        let (me, token_file) = join(path, &words, &geometry, boot_id, lease).map_err(fail)?;
        let inner = Arc::new(Inner {
            path: path.to_owned(),
            file,
            token_file,
            _view: view,
            map,
            words,
            geometry,
            coherence,
            lease,
            emulation: options.emulation,
            me,
            boot_id,
            ticks: Mutex::new(Ticks::default()),
            thread: Mutex::new(None),
            evicted: crate::sync::AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&inner);
        let thread = std::thread::Builder::new()
            .name("netless-fabric".into())
            .spawn(move || upkeep::run(weak))
            .map_err(|source| Error::Io {
                op: "spawn of the fabric thread",
                source,
            })?;
        *lock(&inner.thread) = Some(thread);
        Ok(Fabric { inner })
    }

    /// The region's file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// This process's membership.
    pub fn member(&self) -> MemberId {
        self.inner.me
    }

    /// The region's coherence.
    pub fn coherence(&self) -> Coherence {
        self.inner.coherence
    }

    /// Whether this member works through the non-coherent emulator, and with what faults
    /// ([`FabricOptions::emulation`]).
    pub fn emulation(&self) -> Option<Faults> {
        self.inner.emulation
    }

    /// The region's lease.
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// Units of heap free now, in bytes.
    pub fn free_bytes(&self) -> u64 {
        (alloc::free_units(&self.inner.words, &self.inner.geometry) * UNIT) as u64
    }

    /// Heap bytes in all.
    pub fn heap_bytes(&self) -> u64 {
        (self.inner.geometry.heap_units * UNIT) as u64
    }

    /// The member slots not free now, alive or not (for tools: [`Fabric::is_alive`] says
    /// which are alive).
    pub fn members(&self) -> Vec<MemberSlot> {
        members::occupied(&self.inner.words, &self.inner.geometry)
    }

    /// Whether `member` is alive now (see the module docs for how it is judged).
    pub fn is_alive(&self, member: MemberId) -> bool {
        if member == self.inner.me {
            return !self.is_evicted();
        }
        let judge = self.judge();
        lock(&self.inner.ticks).observer.alive(&judge, member)
    }

    /// Whether this member was evicted: judged dead by the others and its slot reclaimed
    /// (it was stopped, or its thread starved, for longer than a lease). An evicted member
    /// no longer beats, allocates or reclaims; its connections fail.
    pub fn is_evicted(&self) -> bool {
        self.inner.evicted.load(Ordering::Acquire)
    }

    /// Serialises what this kernel's members do under `name` (making, joining and leaving a
    /// structure they share) until the returned lock drops: an exclusive lock on a byte of
    /// the fabric file named after it, which the kernel drops if the holder dies. Names
    /// whose bytes collide only wait for each other.
    ///
    /// # Errors
    /// [`Error::Io`] if the lock is not granted within ten seconds.
    pub fn lock_name(&self, name: &str) -> Result<NameLock, Error> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        name.hash(&mut h);
        let byte = NAME_LOCKS + (h.finish() & 0xffff_ffff);
        let file = OpenOptions::new()
            .write(true)
            .open(&self.inner.path)
            .map_err(|source| Error::Io {
                op: "open of a fabric file",
                source,
            })?;
        crate::liveness::lock_byte_exclusive(&file, byte, Duration::from_secs(10))?;
        Ok(NameLock { _file: file })
    }

    /// Whether `member` runs on this kernel (same boot id), so futexes and locks reach it.
    pub fn same_kernel(&self, member: MemberId) -> bool {
        let g = &self.inner.geometry;
        (member.index as usize) < MEMBERS
            && members::read_boot_id(&self.inner.words, g.member(member.index as usize))
                == self.inner.boot_id
            && self.inner.boot_id != [0; 16]
    }

    fn judge(&self) -> Judge<'_> {
        Judge {
            words: &self.inner.words,
            geometry: &self.inner.geometry,
            boot_id: self.inner.boot_id,
            lease: self.inner.lease,
            token_file: &self.inner.token_file,
        }
    }

    /// Takes heap units for `len` bytes (whole units, the extent says `len`), held by this
    /// member.
    ///
    /// # Errors
    /// [`Error::Fabric`] if no run of free units is long enough.
    pub fn alloc(&self, len: usize) -> Result<Extent, Error> {
        if self.is_evicted() {
            return Err(Error::Fabric {
                path: self.inner.path.clone(),
                reason: "this process was evicted from it (stopped for longer than a lease): \
                         open it again"
                    .into(),
            });
        }
        let len = len.max(1);
        let units = len.div_ceil(UNIT);
        let hint = {
            let mut ticks = lock(&self.inner.ticks);
            ticks.next_hint = ticks.next_hint.wrapping_add(units);
            ticks.next_hint
        };
        alloc::alloc(
            &self.inner.words,
            &self.inner.geometry,
            self.inner.me,
            len,
            hint,
        )
        .ok_or_else(|| Error::Fabric {
            path: self.inner.path.clone(),
            reason: format!(
                "no {} bytes free in its heap ({} of {} free): make the region larger or stop \
                 some of its services",
                units * UNIT,
                self.free_bytes(),
                self.heap_bytes()
            ),
        })
    }

    /// Gives `extent` back at once: only when no other member can still be using it.
    pub fn free(&self, extent: Extent) {
        alloc::free(
            &self.inner.words,
            &self.inner.geometry,
            self.inner.me,
            extent,
        );
    }

    /// Gives `extent` back after two leases, by which time every member that used it has
    /// seen why it should stop.
    pub fn free_later(&self, extent: Extent) {
        let at = Instant::now() + 2 * self.inner.lease;
        lock(&self.inner.ticks).later.push((at, extent));
    }

    /// The member holding `extent` (its first unit), if any.
    pub fn owner_of(&self, extent: Extent) -> Option<MemberId> {
        alloc::owner_of(&self.inner.words, &self.inner.geometry, extent)
    }

    /// Takes `extent` over from a member that is no longer alive (memory several members
    /// share, which outlives whoever made it): whether it is now this member's. Of members
    /// racing to, one wins.
    pub fn adopt(&self, extent: Extent) -> bool {
        let me = self.inner.me;
        match self.owner_of(extent) {
            Some(owner) if owner == me => true,
            Some(owner) if !self.is_alive(owner) => {
                alloc::hand_over(&self.inner.words, &self.inner.geometry, extent, owner, me)
            }
            _ => false,
        }
    }

    /// Gives `extent`, held by this member, to `heir`: whether it moved.
    pub fn hand_over(&self, extent: Extent, heir: MemberId) -> bool {
        alloc::hand_over(
            &self.inner.words,
            &self.inner.geometry,
            extent,
            self.inner.me,
            heir,
        )
    }

    /// Whether `extent`, read from the region, is units `owner` holds, at most `max_len`
    /// bytes long.
    pub fn is_owned_by(&self, extent: Extent, owner: MemberId, max_len: u64) -> bool {
        alloc::owned_by(
            &self.inner.words,
            &self.inner.geometry,
            owner,
            extent,
            max_len,
        )
    }

    /// Maps `extent` read-write as a [`Segment`] (check [`Fabric::is_owned_by`] first when
    /// it came from the region).
    ///
    /// # Errors
    /// [`Error::Fabric`] if it is not inside the heap; [`Error::Io`] if it cannot be mapped.
    pub fn map(&self, extent: Extent) -> Result<Segment, Error> {
        self.check_extent(extent)?;
        Segment::in_file(self.inner.file.as_fd(), extent.offset, extent.len as usize)
    }

    /// Maps `extent` read-write as this member's [`Published`] segment.
    ///
    /// # Errors
    /// As [`Fabric::map`].
    pub fn map_published(&self, extent: Extent) -> Result<Published, Error> {
        self.check_extent(extent)?;
        Published::in_file(self.inner.file.as_fd(), extent.offset, extent.len as usize)
    }

    /// Maps `extent` read-only as a [`PublishedView`].
    ///
    /// # Errors
    /// As [`Fabric::map`].
    pub fn map_read_only(&self, extent: Extent) -> Result<PublishedView, Error> {
        self.check_extent(extent)?;
        PublishedView::in_file(self.inner.file.as_fd(), extent.offset, extent.len as usize)
    }

    fn check_extent(&self, extent: Extent) -> Result<(), Error> {
        let g = &self.inner.geometry;
        let ok = g.unit_at(extent.offset).is_some()
            && extent.len > 0
            && extent
                .offset
                .checked_add(extent.len)
                .is_some_and(|end| end <= g.size);
        if ok {
            Ok(())
        } else {
            Err(Error::Fabric {
                path: self.inner.path.clone(),
                reason: format!("extent {extent:?} is not inside its heap"),
            })
        }
    }

    /// Publishes a service entry owned by this member; its index.
    ///
    /// # Errors
    /// [`Error::Fabric`] if the name is empty or too long, or the directory is full.
    pub fn publish(
        &self,
        name: &str,
        replica: Option<u32>,
        extents: [Extent; ENTRY_EXTENTS],
        attrs: u64,
    ) -> Result<u32, Error> {
        let entry = Entry {
            index: 0,
            owner: self.inner.me,
            name: name.to_owned(),
            replica,
            extents,
            attrs,
        };
        directory::publish(&self.inner.words, &self.inner.geometry, &entry).ok_or_else(|| {
            Error::Fabric {
                path: self.inner.path.clone(),
                reason: if name.is_empty() || name.len() > MAX_NAME {
                    format!("a service name must be 1 to {MAX_NAME} bytes")
                } else {
                    format!("its directory's {DIRECTORY} entries are all taken")
                },
            }
        })
    }

    /// Withdraws entry `index` (if this member still owns it).
    pub fn withdraw(&self, index: u32) {
        directory::withdraw(
            &self.inner.words,
            &self.inner.geometry,
            index,
            self.inner.me,
        );
    }

    /// The live entries published as `name` (and `replica`) whose owner is alive.
    pub fn lookup(&self, name: &str, replica: Option<u32>) -> Vec<Entry> {
        directory::find(&self.inner.words, &self.inner.geometry, name, replica)
            .into_iter()
            .filter(|e| self.is_alive(e.owner))
            .collect()
    }

    /// Every published entry (for tools), alive or not.
    pub fn entries(&self) -> Vec<Entry> {
        (0..DIRECTORY as u32)
            .filter_map(|i| directory::read(&self.inner.words, &self.inner.geometry, i))
            .collect()
    }

    /// The mailbox in `extent` (check [`Fabric::is_owned_by`] first when it came from the
    /// region).
    ///
    /// # Errors
    /// As [`Fabric::map`].
    pub fn mailbox(&self, extent: Extent) -> Result<Mailbox, Error> {
        self.check_extent(extent)?;
        Ok(Mailbox {
            words: self.inner.words,
            base: extent.offset as usize,
            slots: extent.len as usize / SLOT_BYTES,
            _fabric: self.clone(),
        })
    }

    /// Calls `watcher` on every tick of the fabric's thread (every tenth of a lease) until
    /// it returns `false`.
    pub fn watch(&self, watcher: Watcher) {
        lock(&self.inner.ticks).watchers.push(watcher);
    }

    /// How often the fabric's thread ticks.
    pub fn tick(&self) -> Duration {
        tick_of(self.inner.lease)
    }
}

fn tick_of(lease: Duration) -> Duration {
    (lease / 10).max(Duration::from_millis(5))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn region_size(file: &File) -> Result<u64, Error> {
    let meta = file.metadata().map_err(|source| Error::Io {
        op: "fstat of a fabric file",
        source,
    })?;
    if meta.len() > 0 || meta.file_type().is_file() {
        return Ok(meta.len());
    }
    // A DAX device reports no length: ask how far it seeks.
    use std::io::Seek;
    let mut f = file;
    let end = f
        .seek(std::io::SeekFrom::End(0))
        .map_err(|source| Error::Io {
            op: "lseek of a fabric device",
            source,
        })?;
    Ok(end)
}

/// How long an opener that found a sized but unformatted region waits for the process that
/// sized it to format it, before it formats it itself (a DAX device or a file sized by
/// hand has no one else to).
const FORMAT_GRACE: Duration = Duration::from_millis(500);

/// Formats a fresh region (if this process wins the race to), or checks an existing one's
/// superblock; the region's coherence and lease. `sized_here`: this process gave the file its
/// length, so no one else is about to format it with their options.
fn format_or_check(
    words: &Words,
    size: u64,
    options: &FabricOptions,
    sized_here: bool,
) -> Result<(Coherence, Duration), String> {
    let magic = words.word(layout::SB_MAGIC);
    let formatting = words.word(layout::SB_FORMATTING);
    if !sized_here {
        // A creator sizes the file before it formats it: give it the time to, so that the
        // region gets its options, not ours.
        let grace = Instant::now() + FORMAT_GRACE;
        while magic.load(Ordering::Acquire) == 0
            && formatting.load(Ordering::Acquire) == 0
            && Instant::now() < grace
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    if magic.load(Ordering::Acquire) == 0
        && formatting
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    {
        words
            .word(layout::SB_VERSION)
            .store(layout::VERSION, Ordering::Relaxed);
        words.word(layout::SB_SIZE).store(size, Ordering::Relaxed);
        words.word(layout::SB_COHERENCE).store(
            match options.coherence {
                Coherence::Hardware => 1,
                Coherence::Software => 2,
            },
            Ordering::Relaxed,
        );
        let lease_ns = u64::try_from(options.lease.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1_000_000);
        words
            .word(layout::SB_LEASE_NS)
            .store(lease_ns, Ordering::Relaxed);
        magic.store(layout::MAGIC, Ordering::Release);
    }
    // Someone else formats it: wait for the magic, a bounded while.
    let deadline = Instant::now() + Duration::from_secs(2);
    while magic.load(Ordering::Acquire) != layout::MAGIC {
        if magic.load(Ordering::Acquire) != 0 || Instant::now() > deadline {
            return Err(
                "it is not a netless fabric region (no superblock): point --fabric at a \
                 region netless made, or at an empty file"
                    .into(),
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let version = words.word(layout::SB_VERSION).load(Ordering::Acquire);
    if version != layout::VERSION {
        return Err(format!(
            "its layout is version {version}, this build reads {}",
            layout::VERSION
        ));
    }
    let recorded = words.word(layout::SB_SIZE).load(Ordering::Acquire);
    if recorded != size {
        return Err(format!(
            "its superblock says {recorded} bytes but the file has {size}: it was resized \
             after it was formatted"
        ));
    }
    let coherence = match words.word(layout::SB_COHERENCE).load(Ordering::Acquire) {
        1 => Coherence::Hardware,
        2 => Coherence::Software,
        c => return Err(format!("its superblock names coherence {c}, none known")),
    };
    let lease_ns = words.word(layout::SB_LEASE_NS).load(Ordering::Acquire);
    if !(1_000_000..=60_000_000_000).contains(&lease_ns) {
        return Err(format!("its superblock names a lease of {lease_ns} ns"));
    }
    Ok((coherence, Duration::from_nanos(lease_ns)))
}

/// Claims a free member slot: its liveness token first (so no one sees the slot live
/// without it), then the slot.
fn join(
    path: &Path,
    words: &Words,
    g: &Geometry,
    boot_id: [u8; 16],
    lease: Duration,
) -> Result<(MemberId, File), String> {
    for index in 0..MEMBERS {
        let slot = g.member(index);
        let state = words.word(slot + members::M_STATE);
        let s = state.load(Ordering::Acquire);
        if members::phase(s) != members::FREE {
            continue;
        }
        let gen = members::generation(s).wrapping_add(1);
        let me = MemberId {
            index: index as u32,
            generation: gen,
        };
        let token_file = File::open(path).map_err(|e| format!("cannot reopen it: {e}"))?;
        if crate::hold_liveness_token(&token_file, me.token()).is_err() {
            continue;
        }
        let claimed = (u64::from(gen) << 8) | members::LIVE;
        if state
            .compare_exchange(s, claimed, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        words.write(slot + members::M_BOOT_ID, &boot_id);
        let pid_uid =
            u64::from(std::process::id()) | (u64::from(rustix::process::geteuid().as_raw()) << 32);
        words.store(slot + members::M_PID_UID, pid_uid);
        words.store(slot + members::M_LEASE_NS, lease.as_nanos() as u64);
        words.store(
            slot + members::M_HEARTBEAT,
            words.load(slot + members::M_HEARTBEAT).wrapping_add(1),
        );
        return Ok((me, token_file));
    }
    Err(format!(
        "its {MEMBERS} member slots are all taken: stop some of its processes, or wait a lease \
         for dead ones to be reclaimed"
    ))
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Leaving: the slot stays ours (LEFT) until a member reclaims it two leases on, so
        // no one reuses our units while a peer may still be writing them.
        let slot = self.geometry.member(self.me.index as usize);
        let state = self.words.word(slot + members::M_STATE);
        let live = (u64::from(self.me.generation) << 8) | members::LIVE;
        let left = (u64::from(self.me.generation) << 8) | members::LEFT;
        let _ = state.compare_exchange(live, left, Ordering::AcqRel, Ordering::Relaxed);
        // The thread holds only a weak handle: it ends at its next tick.
        let _ = lock(&self.thread).take();
        let _ = &self.map;
    }
}
