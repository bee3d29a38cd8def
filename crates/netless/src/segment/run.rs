//! One validated view of a run of blocks in a replica's receive buffer: the only code that
//! turns a run into memory, reads a request's headers and body out of it (the server) and
//! writes a request into it (the client).
//!
//! A [`BlockRun`] exists only for a run that lies inside the buffer
//! ([`ReplicaSegment::run`](super::ReplicaSegment::run) checks that) and holds at least one
//! block of 64 bytes or more, so a header at its start is always there; every other access is
//! bounds-checked against the run's own length, and nothing outside this module needs `unsafe`
//! to touch request memory. Whether the run is the caller's to read or write (its
//! block-table words) is the caller's check, as is every header field read here: the bytes
//! belong to another process until validated.
//!
//! The memory is shared: another process may write the bytes behind a slice [`BlockRun::bytes`]
//! hands out while it is read (as it may write any mapping of shared memory), so a reader
//! copies what must not change under it (a method name) and validates what it uses. A write
//! whose source lies in the run (a slice of it written back) is refused, so this process
//! never writes memory it holds borrowed through the same call.

use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::wire::header::{
    CompactHeader, ShortHeader, WireHeader, COMPACT_HEADER_LEN, HEADER_LEN, SHORT_HEADER_LEN,
};

/// A run of blocks of a replica's receive buffer, `len` bytes from `start`, borrowed from the
/// mapped segment (`'a`).
#[derive(Clone, Copy)]
pub(crate) struct BlockRun<'a> {
    start: NonNull<u8>,
    len: usize,
    segment: PhantomData<&'a [u8]>,
}

impl<'a> BlockRun<'a> {
    /// # Safety
    /// `start..start + len` must lie inside a mapping that outlives `'a`, and `len` must be at
    /// least [`HEADER_LEN`].
    #[inline(always)]
    pub(super) unsafe fn new(start: *mut u8, len: usize) -> BlockRun<'a> {
        debug_assert!(len >= HEADER_LEN);
        BlockRun {
            // SAFETY: inside a mapping (the caller's contract), so not null.
            start: unsafe { NonNull::new_unchecked(start) },
            len,
            segment: PhantomData,
        }
    }

    /// A run over private bytes, for tests (and fuzz targets) of what reads runs.
    ///
    /// # Panics
    /// If `buf` is shorter than a header.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn over(buf: &'a mut [u8]) -> BlockRun<'a> {
        assert!(buf.len() >= HEADER_LEN, "a run holds at least a header");
        // SAFETY: the buffer outlives 'a (borrowed for it) and holds a header, as asserted.
        unsafe { BlockRun::new(buf.as_mut_ptr(), buf.len()) }
    }

    /// The run's first byte, for prefetch hints (which never fault).
    #[inline(always)]
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.start.as_ptr()
    }

    /// Bytes in the run.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The request header at the start of the run, in either form (`WireHeader` or
    /// `ShortHeader`), as a `WireHeader`, and where the body starts. One copy of the bytes;
    /// validation is the caller's.
    #[inline(always)]
    pub(crate) fn request_header(&self) -> (WireHeader, usize) {
        // SAFETY: the run holds at least HEADER_LEN bytes (the constructor's contract).
        let h = unsafe { WireHeader::read_from(self.start.as_ptr()) };
        if h.kind != crate::wire::header::kind::REQUEST_SHORT {
            return (h, HEADER_LEN);
        }
        // SAFETY: the first SHORT_HEADER_LEN of those bytes, already copied in `h`, viewed as
        // the short form: both are plain integers, and any bit pattern is a valid ShortHeader.
        let short: ShortHeader =
            unsafe { std::ptr::read_unaligned((&h as *const WireHeader).cast()) };
        (short.expand(), SHORT_HEADER_LEN)
    }

    /// The short header at the start of the run (whatever its `kind` says; the caller checks
    /// it). One copy of the bytes.
    #[inline(always)]
    pub(crate) fn short_header(&self) -> ShortHeader {
        // SAFETY: the run holds at least HEADER_LEN >= SHORT_HEADER_LEN bytes (the
        // constructor's contract).
        unsafe { ShortHeader::read_from(self.start.as_ptr()) }
    }

    /// The compact header at byte `at`, if a whole one lies inside the run. One copy of the
    /// bytes; validation is the caller's.
    #[inline(always)]
    pub(crate) fn compact_header(&self, at: usize) -> Option<CompactHeader> {
        // len >= HEADER_LEN > COMPACT_HEADER_LEN (the constructor's contract): no underflow.
        if at > self.len - COMPACT_HEADER_LEN {
            return None;
        }
        // SAFETY: at + COMPACT_HEADER_LEN <= len: a whole header inside the run.
        Some(unsafe { CompactHeader::read_from(self.start.as_ptr().add(at)) })
    }

    /// The `len` bytes at `at`, if they lie inside the run. Another process may write them
    /// while they are read: callers copy what must not change under them (a method name).
    #[inline(always)]
    pub(crate) fn bytes(&self, at: usize, len: usize) -> Option<&'a [u8]> {
        if at > self.len || self.len - at < len {
            return None;
        }
        // SAFETY: at + len <= self.len: inside the run, which lies inside a mapping that
        // outlives 'a; u8 has no invalid values.
        Some(unsafe { std::slice::from_raw_parts(self.start.as_ptr().add(at), len) })
    }

    /// Writes `parts`, one after another, from byte `at`, for a run the caller owns (claimed,
    /// not yet published); `false` if they do not fit the run (nothing written), or if a part
    /// lies in it (a slice `bytes` gave, written back: refused, with the parts before it
    /// written), which no caller does.
    #[inline(always)]
    pub(crate) fn write(&self, at: usize, parts: &[&[u8]]) -> bool {
        let total = parts.iter().map(|p| p.len()).sum::<usize>();
        if at > self.len || self.len - at < total {
            return false;
        }
        let mut dst = at;
        for part in parts {
            if self.holds_any_of(part) {
                return false;
            }
            // SAFETY: dst + part.len() <= at + total <= len: inside the run, which lies inside
            // a live mapping; `part` is readable for its length and lies outside the run
            // (checked just above), so the two do not overlap.
            unsafe {
                netless_shm::copy::copy_bytes(
                    part.as_ptr(),
                    self.start.as_ptr().add(dst),
                    part.len(),
                )
            };
            dst += part.len();
        }
        true
    }

    /// Writes `header` (a value: it cannot lie in the run), then `parts`, from byte `at`, as
    /// [`BlockRun::write`] does.
    #[inline(always)]
    pub(crate) fn write_after<const N: usize>(
        &self,
        at: usize,
        header: [u8; N],
        parts: &[&[u8]],
    ) -> bool {
        let total = parts.iter().map(|p| p.len()).sum::<usize>();
        if at > self.len || self.len - at < N || self.len - at - N < total {
            return false;
        }
        // SAFETY: at + N <= len: inside the run, which lies inside a live mapping; the header
        // is a value of ours, so it does not overlap the run.
        unsafe { std::ptr::write_unaligned(self.start.as_ptr().add(at).cast::<[u8; N]>(), header) };
        let mut dst = at + N;
        for part in parts {
            if self.holds_any_of(part) {
                return false;
            }
            // SAFETY: dst + part.len() <= at + N + total <= len: inside the run; `part` lies
            // outside the run (checked just above), so the two do not overlap.
            unsafe {
                netless_shm::copy::copy_bytes(
                    part.as_ptr(),
                    self.start.as_ptr().add(dst),
                    part.len(),
                )
            };
            dst += part.len();
        }
        true
    }

    /// Whether any byte of `bytes` lies in the run.
    #[inline(always)]
    fn holds_any_of(&self, bytes: &[u8]) -> bool {
        let (run, from) = (self.start.as_ptr() as usize, bytes.as_ptr() as usize);
        from < run + self.len && run < from + bytes.len()
    }

    /// Writes bytes `offset..offset + len` of the concatenation of `pieces` from byte `at` (a
    /// fragment of a request body); `false` (and nothing written) if they do not fit the run,
    /// the pieces hold fewer bytes, or one of them lies in the run (as `write`).
    pub(crate) fn write_range(
        &self,
        at: usize,
        pieces: &[&[u8]],
        offset: usize,
        len: usize,
    ) -> bool {
        let total = pieces.iter().map(|p| p.len()).sum::<usize>();
        if at > self.len
            || self.len - at < len
            || offset.checked_add(len).is_none_or(|end| end > total)
            || pieces.iter().any(|p| self.holds_any_of(p))
        {
            return false;
        }
        let (mut offset, mut len, mut dst) = (offset, len, at);
        for piece in pieces {
            if len == 0 {
                break;
            }
            if offset >= piece.len() {
                offset -= piece.len();
                continue;
            }
            let n = (piece.len() - offset).min(len);
            // SAFETY: n bytes are readable from piece[offset..]; dst + n <= at + len <= self.len,
            // inside the run; the piece lies outside the run (checked above).
            unsafe {
                netless_shm::copy::copy_bytes(
                    piece.as_ptr().add(offset),
                    self.start.as_ptr().add(dst),
                    n,
                )
            };
            dst += n;
            len -= n;
            offset = 0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(buf: &mut [u8]) -> BlockRun<'_> {
        BlockRun::over(buf)
    }

    #[test]
    fn reads_and_writes_stay_inside_the_run() {
        let mut buf = vec![0u8; 128];
        let run = run_of(&mut buf);
        assert!(run.write(120, &[b"abcd", b"efgh"]));
        assert!(
            !run.write(121, &[b"abcd", b"efgh"]),
            "one byte past the end"
        );
        assert!(!run.write(usize::MAX, &[b"a"]));
        assert_eq!(run.bytes(120, 8), Some(&b"abcdefgh"[..]));
        assert_eq!(run.bytes(121, 8), None);
        assert_eq!(run.bytes(usize::MAX, 2), None);
        assert_eq!(run.bytes(128, 0), Some(&b""[..]));
        assert!(run.compact_header(120).is_some());
        assert!(run.compact_header(121).is_none());
        assert!(run.compact_header(usize::MAX).is_none());
    }

    #[test]
    fn a_slice_of_the_run_is_not_written_back_into_it() {
        let mut buf: Vec<u8> = (0..128).collect();
        let run = run_of(&mut buf);
        let own = run.bytes(0, 16).unwrap();
        assert!(!run.write(8, &[own]), "a source inside the run");
        assert!(!run.write_range(8, &[own], 0, 4));
        assert_eq!(run.bytes(8, 2), Some(&[8u8, 9][..]), "nothing written");
    }

    #[test]
    fn a_range_of_the_pieces_lands_where_asked() {
        let mut buf = vec![0u8; 64];
        let run = run_of(&mut buf);
        assert!(run.write_range(10, &[b"abc", b"", b"defg"], 2, 4));
        assert_eq!(run.bytes(10, 4), Some(&b"cdef"[..]));
        assert!(
            !run.write_range(10, &[b"abc", b"defg"], 5, 3),
            "past the pieces"
        );
        assert!(!run.write_range(62, &[b"abcdefg"], 0, 3), "past the run");
    }

    #[test]
    fn either_header_form_reads_back() {
        let h = WireHeader {
            token: 7,
            call_id: 9,
            kind: crate::wire::header::kind::REQUEST,
            body_len: 4,
            frag_len: 4,
            method_len: 4,
            ..WireHeader::default()
        };
        let mut buf = vec![0u8; 64];
        let run = run_of(&mut buf);
        assert!(run.write(0, &[h.as_bytes()]));
        assert_eq!(run.request_header(), (h, HEADER_LEN));
        let short = ShortHeader::of(&h).unwrap();
        assert!(run.write(0, &[short.as_bytes()]));
        assert_eq!(run.request_header(), (h, SHORT_HEADER_LEN));
        assert_eq!(run.short_header(), short);
    }
}
