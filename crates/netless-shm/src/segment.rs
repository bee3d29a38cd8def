//! Shared memory segments: anonymous `memfd` files, sealed against resizing, mapped
//! `MAP_SHARED` read-write.
//!
//! This module owns the creation, validation (at attach) and mapping of segments, and the
//! lifetime of the fd and the mapping. It never reads or writes the bytes inside: layouts and
//! their validation belong to the crates above, which treat every byte as peer input.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{FileType, MemfdFlags, SealFlags};

use crate::Error;

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
        let stat = rustix::fs::fstat(&fd).map_err(Error::os("fstat of a received segment"))?;
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
        let seals = match rustix::fs::fcntl_get_seals(&fd) {
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
        // `size <= max_len`, a usize, so the cast is lossless.
        Self::map(fd, size as usize)
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
}
