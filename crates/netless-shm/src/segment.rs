//! Shared memory segments: anonymous `memfd` files, sealed against resizing, mapped
//! `MAP_SHARED` read-write, or ([`Published`]) written by their creator alone and mapped
//! read-only by everyone else.
//!
//! This module owns the creation, validation (at attach) and mapping of segments, and the
//! lifetime of the fd and the mapping. It never reads or writes the bytes inside: layouts and
//! their validation belong to the crates above, which treat every byte as peer input.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{FileType, MemfdFlags, SealFlags};

use crate::Error;

/// `f_type` of a plain `memfd` (shmem). A hugetlbfs memfd is refused: its pages are reserved
/// only at fault, so a mapping of one can raise `SIGBUS` when the pool runs dry.
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// A shared memory segment: a sealed `memfd` and its shared read-write mapping.
///
/// Created by one process with [`Segment::create`], its fd is sent to peers (see
/// [`crate::send_frame`]) who map it with [`Segment::attach`]. The shrink and grow seals
/// guarantee that no process can change its size, so a mapping never faults with `SIGBUS`.
/// The mapping is unmapped and the fd closed on drop; the memory is freed when the last
/// process drops it.
///
/// ```
/// use netless_shm::Segment;
///
/// let segment = Segment::create("example", 8192)?;
/// // SAFETY: the segment is 8192 bytes long and nobody else maps it yet.
/// unsafe { segment.as_ptr().write(42) };
/// assert_eq!(segment.len(), 8192);
/// # Ok::<(), netless_shm::Error>(())
/// ```
#[derive(Debug)]
pub struct Segment {
    fd: OwnedFd,
    map: MmapRaw,
}

// A `Segment` is an fd plus a plain shared memory mapping that lives as long as it does; it
// hands out only raw pointers, and memory shared with other processes is racy by nature.
// SAFETY: the mapping is plain memory, valid on any thread; all concurrent access through
// `as_ptr` is the caller's business (atomics or raw pointer reads/writes).
unsafe impl Send for Segment {}
// SAFETY: `&Segment` gives only the length, a raw pointer and a borrowed fd; see `Send` above.
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates a new zero-filled segment of `len` bytes.
    ///
    /// `name` is for debugging only (it shows in `/proc/<pid>/maps` as `memfd:<name>`). The fd
    /// is close-on-exec and carries the seals `F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`.
    ///
    /// # Errors
    /// [`Error::EmptySegment`] if `len` is 0; [`Error::Io`] if a system call fails (a name with
    /// a NUL byte or longer than 249 bytes, or the memory limit is reached).
    ///
    /// ```
    /// let segment = netless_shm::Segment::create("ring", 1 << 20)?;
    /// assert!(!segment.is_empty());
    /// # Ok::<(), netless_shm::Error>(())
    /// ```
    pub fn create(name: &str, len: usize) -> Result<Segment, Error> {
        if len == 0 {
            return Err(Error::EmptySegment);
        }
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(Error::os("memfd_create"))?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(Error::os("ftruncate of a new memfd"))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(Error::os("fcntl(F_ADD_SEALS)"))?;
        Self::map(fd, len)
    }

    /// Maps a segment received from a peer, treating the fd as untrusted.
    ///
    /// Refuses it unless it is a regular file (a memfd) of size `1..=max_len` that carries
    /// both `F_SEAL_SHRINK` and `F_SEAL_GROW`, so the peer can never truncate it under us.
    ///
    /// # Errors
    /// [`Error::EmptySegment`], [`Error::SegmentTooLarge`], [`Error::NotSealed`],
    /// [`Error::BadSegment`] (not a regular file, or not a memfd), or [`Error::Io`] (e.g. the
    /// fd is read-only or write-sealed, so it cannot be mapped shared read-write).
    ///
    /// ```
    /// use netless_shm::Segment;
    ///
    /// let created = Segment::create("shared", 4096)?;
    /// // Normally the fd comes from `recv_frame`; here we duplicate our own.
    /// let fd = created.fd().try_clone_to_owned().expect("dup");
    /// let attached = Segment::attach(fd, 1 << 20)?;
    /// assert_eq!(attached.len(), 4096);
    /// # Ok::<(), netless_shm::Error>(())
    /// ```
    pub fn attach(fd: OwnedFd, max_len: usize) -> Result<Segment, Error> {
        let (size, _) = validate(&fd, max_len)?;
        Self::map(fd, size)
    }

    /// Maps `len` bytes of `file` at `offset` (page aligned) shared read-write: a segment
    /// inside a fabric region. The caller has checked that the range is inside the file,
    /// which a fabric's size never shrinks under.
    ///
    /// # Errors
    /// [`Error::EmptySegment`] if `len` is 0; [`Error::Io`] if it cannot be mapped.
    pub fn in_file(file: BorrowedFd<'_>, offset: u64, len: usize) -> Result<Segment, Error> {
        let (fd, map) = map_in_file(file, offset, len, true)?;
        Ok(Segment { fd, map })
    }

    fn map(fd: OwnedFd, len: usize) -> Result<Segment, Error> {
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&fd)
            .map_err(|source| Error::Io {
                op: "mmap(MAP_SHARED, PROT_READ|PROT_WRITE) of a segment",
                source,
            })?;
        Ok(Segment { fd, map })
    }

    /// Length of the segment in bytes (never 0).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always `false`: segments have at least one byte. Present for API symmetry.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// Start of the mapping; page aligned, valid for [`len`](Self::len) bytes while `self`
    /// lives.
    ///
    /// Other processes may write this memory at any time: access it only through atomics or
    /// volatile/raw reads, and validate whatever you read.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// The segment's memfd, to send to a peer with [`crate::send_frame`].
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Maps `len` bytes of `file` at `offset` shared (read-write or read-only), with a
/// descriptor of its own: a segment inside a fabric region.
fn map_in_file(
    file: BorrowedFd<'_>,
    offset: u64,
    len: usize,
    writable: bool,
) -> Result<(OwnedFd, MmapRaw), Error> {
    if len == 0 {
        return Err(Error::EmptySegment);
    }
    let fd = file
        .try_clone_to_owned()
        .map_err(|source| Error::Io { op: "dup", source })?;
    let mut options = MmapOptions::new();
    options.offset(offset).len(len);
    let (map, op) = if writable {
        (
            options.map_raw(&fd),
            "mmap(MAP_SHARED, PROT_READ|PROT_WRITE) of a fabric segment",
        )
    } else {
        (
            options.map_raw_read_only(&fd),
            "mmap(MAP_SHARED, PROT_READ) of a fabric segment",
        )
    };
    let map = map.map_err(|source| Error::Io { op, source })?;
    Ok((fd, map))
}

/// Checks an fd received from a peer: a regular, non-empty memfd on shmem (not hugetlbfs) of
/// at most `max_len` bytes, sealed against shrinking and growing. Its size and seals.
fn validate(fd: &OwnedFd, max_len: usize) -> Result<(usize, SealFlags), Error> {
    let stat = rustix::fs::fstat(fd).map_err(Error::os("fstat of a received segment"))?;
    let file_type = FileType::from_raw_mode(stat.st_mode);
    if file_type != FileType::RegularFile {
        return Err(Error::BadSegment {
            reason: format!("it is a {file_type:?}, not a memfd"),
        });
    }
    let size = u64::try_from(stat.st_size).map_err(|_| Error::BadSegment {
        reason: format!("fstat reports a negative size {}", stat.st_size),
    })?;
    if size == 0 {
        return Err(Error::EmptySegment);
    }
    if size > max_len as u64 {
        return Err(Error::SegmentTooLarge {
            len: size,
            max: max_len,
        });
    }
    let seals = match rustix::fs::fcntl_get_seals(fd) {
        Ok(seals) => seals,
        Err(rustix::io::Errno::INVAL) => {
            return Err(Error::BadSegment {
                reason: "it does not support seals (not a memfd)".to_owned(),
            })
        }
        Err(errno) => return Err(Error::os("fcntl(F_GET_SEALS)")(errno)),
    };
    if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
        return Err(Error::NotSealed {
            seals: seals.bits(),
        });
    }
    let fs = rustix::fs::fstatfs(fd).map_err(Error::os("fstatfs of a received segment"))?;
    #[allow(clippy::unnecessary_cast)] // `f_type`'s type differs between libc targets.
    if fs.f_type as i64 != TMPFS_MAGIC {
        return Err(Error::BadSegment {
            reason: format!(
                "it is not a plain memfd (file system {:#x}; hugetlbfs memfds are refused)",
                fs.f_type
            ),
        });
    }
    // `size <= max_len`, a usize, so the cast is lossless.
    Ok((size as usize, seals))
}

/// A segment its creator writes and every peer maps read-only: a `memfd` sealed against
/// resizing and against any new writable mapping (`F_SEAL_FUTURE_WRITE`), so the creator's
/// own mapping, made before the seal, is the only one that can write it.
///
/// ```
/// use netless_shm::{Published, PublishedView};
///
/// let published = Published::create("registers", 4096)?;
/// // SAFETY: the segment is 4096 bytes long and only this thread writes it.
/// unsafe { published.as_ptr().write(7) };
/// let fd = published.fd().try_clone_to_owned().expect("dup");
/// let view = PublishedView::attach(fd, 1 << 20)?;
/// // SAFETY: the view is 4096 bytes long.
/// assert_eq!(unsafe { view.as_ptr().read() }, 7);
/// # Ok::<(), netless_shm::Error>(())
/// ```
#[derive(Debug)]
pub struct Published {
    segment: Segment,
}

impl Published {
    /// Creates a zero-filled segment of `len` bytes, mapped read-write here, and seals it so
    /// that nobody can map it writable again.
    ///
    /// # Errors
    /// As [`Segment::create`]; [`Error::Io`] if the kernel lacks `F_SEAL_FUTURE_WRITE`
    /// (Linux 5.1).
    pub fn create(name: &str, len: usize) -> Result<Published, Error> {
        if len == 0 {
            return Err(Error::EmptySegment);
        }
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(Error::os("memfd_create"))?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(Error::os("ftruncate of a new memfd"))?;
        let segment = Segment::map(fd, len)?;
        rustix::fs::fcntl_add_seals(
            &segment.fd,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE | SealFlags::SEAL,
        )
        .map_err(Error::os("fcntl(F_ADD_SEALS, F_SEAL_FUTURE_WRITE)"))?;
        Ok(Published { segment })
    }

    /// Maps `len` bytes of `file` at `offset` read-write as a published segment inside a
    /// fabric region. Nothing seals it: any member of the fabric can map it writable, so it
    /// is read-only to peers only by their own mappings ([`PublishedView::in_file`]).
    ///
    /// # Errors
    /// As [`Segment::in_file`].
    pub fn in_file(file: BorrowedFd<'_>, offset: u64, len: usize) -> Result<Published, Error> {
        Ok(Published {
            segment: Segment::in_file(file, offset, len)?,
        })
    }

    /// Length in bytes (never 0).
    pub fn len(&self) -> usize {
        self.segment.len()
    }

    /// Always `false`: segments have at least one byte. Present for API symmetry.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Start of the creator's writable mapping, page aligned, valid for [`len`](Self::len)
    /// bytes while `self` lives. Peers read it concurrently: write through atomics.
    pub fn as_ptr(&self) -> *mut u8 {
        self.segment.as_ptr()
    }

    /// The memfd, to send to peers, who map it with [`PublishedView::attach`].
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.segment.fd()
    }
}

/// A peer's [`Published`] segment, mapped read-only.
#[derive(Debug)]
pub struct PublishedView {
    fd: OwnedFd,
    map: MmapRaw,
}

// SAFETY: as for `Segment`: a read-only shared mapping, valid on any thread; it hands out
// only a raw pointer.
unsafe impl Send for PublishedView {}
// SAFETY: `&PublishedView` gives only the length, a raw pointer to memory this process
// cannot write, and a borrowed fd: nothing a second thread could race on.
unsafe impl Sync for PublishedView {}

impl PublishedView {
    /// Maps a segment received from a peer read-only, treating the fd as untrusted: as
    /// [`Segment::attach`] checks, and it must also be sealed against writable mappings
    /// (`F_SEAL_FUTURE_WRITE` or `F_SEAL_WRITE`), so no other process can be writing it
    /// but its creator.
    ///
    /// # Errors
    /// As [`Segment::attach`]; [`Error::NotSealed`] without a write seal.
    pub fn attach(fd: OwnedFd, max_len: usize) -> Result<PublishedView, Error> {
        let (size, seals) = validate(&fd, max_len)?;
        if !seals.intersects(SealFlags::FUTURE_WRITE | SealFlags::WRITE) {
            return Err(Error::NotSealed {
                seals: seals.bits(),
            });
        }
        let map = MmapOptions::new()
            .len(size)
            .map_raw_read_only(&fd)
            .map_err(|source| Error::Io {
                op: "mmap(MAP_SHARED, PROT_READ) of a published segment",
                source,
            })?;
        Ok(PublishedView { fd, map })
    }

    /// Maps `len` bytes of `file` at `offset` read-only: a peer's published segment inside
    /// a fabric region.
    ///
    /// # Errors
    /// As [`Segment::in_file`].
    pub fn in_file(file: BorrowedFd<'_>, offset: u64, len: usize) -> Result<PublishedView, Error> {
        let (fd, map) = map_in_file(file, offset, len, false)?;
        Ok(PublishedView { fd, map })
    }

    /// Length in bytes (never 0).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always `false`.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The memfd (whoever holds it can map it read-only, never writable).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Start of the read-only mapping, page aligned, valid for [`len`](Self::len) bytes while
    /// `self` lives. Writing through it faults; its creator writes it at any time, so read
    /// it through atomics and validate what you read.
    pub fn as_ptr(&self) -> *const u8 {
        self.map.as_ptr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_rejects_zero_length() {
        assert!(matches!(
            Segment::create("zero", 0),
            Err(Error::EmptySegment)
        ));
    }

    #[test]
    fn create_is_zero_filled_and_page_aligned() {
        let segment = Segment::create("zeroes", 3 * 4096 + 5).unwrap();
        assert_eq!(segment.len(), 3 * 4096 + 5);
        assert_eq!(segment.as_ptr() as usize % 4096, 0);
        // SAFETY: the mapping is `len` bytes long and only this thread touches it.
        let bytes = unsafe { std::slice::from_raw_parts(segment.as_ptr(), segment.len()) };
        assert!(bytes.iter().all(|&b| b == 0));
    }

    #[test]
    fn attach_rejects_non_memfd() {
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let err = Segment::attach(file.into(), usize::MAX).unwrap_err();
        assert!(
            matches!(err, Error::BadSegment { .. } | Error::NotSealed { .. }),
            "{err}"
        );
    }

    #[test]
    fn published_segments_are_read_only_to_peers() {
        let published = Published::create("published", 4096).unwrap();
        let fd = || published.fd().try_clone_to_owned().unwrap();
        // Nobody maps it writable again, not even through a second fd of ours.
        assert!(Segment::attach(fd(), 1 << 20).is_err());
        let view = PublishedView::attach(fd(), 1 << 20).unwrap();
        // SAFETY: the mapping is 4096 bytes; this thread alone writes it.
        unsafe { published.as_ptr().add(100).write(9) };
        // SAFETY: the view maps the same 4096 bytes; offset 100 is inside, and nothing
        // writes it while it is read.
        assert_eq!(unsafe { view.as_ptr().add(100).read() }, 9);
        // A plain segment is not sealed against writes: refused as a published one.
        let plain = Segment::create("plain", 4096).unwrap();
        let err = PublishedView::attach(plain.fd().try_clone_to_owned().unwrap(), 1 << 20);
        assert!(matches!(err, Err(Error::NotSealed { .. })), "{err:?}");
    }

    #[test]
    fn attach_rejects_hugetlb_memfds() {
        let Ok(fd) = rustix::fs::memfd_create(
            "huge",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING | MemfdFlags::HUGETLB,
        ) else {
            eprintln!("SKIPPED: this kernel makes no hugetlb memfd");
            return;
        };
        // One huge page (2 MiB by default); a kernel with none reserved still sizes the file.
        if rustix::fs::ftruncate(&fd, 2 << 20).is_err() {
            eprintln!("SKIPPED: cannot size a hugetlb memfd here");
            return;
        }
        // Sealed like a plain one, so only the file system check stands between it and a
        // mapping.
        let _ = rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW);
        let err = Segment::attach(fd, 1 << 30).unwrap_err();
        assert!(matches!(err, Error::BadSegment { .. }), "{err}");
    }
}
