//! The polled ring: a single-producer single-consumer ring of variable-length records for
//! memory shared without hardware cache coherence (a CXL-style fabric region), accessed only
//! through a [`View`], so it works the same on a coherent machine, a non-coherent fabric and
//! the non-coherent emulator ([`netless_shm::coherence::Emulated`]).
//!
//! Every cache line of the ring has a single writer, and the two sides' lines lie two lines
//! apart (so an adjacent-line prefetch of one never drags in the other). A region of
//! `len` bytes at a 64-byte aligned `offset` of the view holds, in 64-byte lines:
//!
//! ```text
//! line 0   header    magic "NLPOLLR1", layout version, data lines N, nonce   (init writes)
//! line 2   producer  tail (lines published), records published, epoch       (producer)
//! line 4   consumer  head (lines consumed), records consumed, epoch         (consumer)
//! line 6.. data      N lines of records                                     (producer)
//! ```
//!
//! Lines 1, 3 and 5 are never used. Positions (`tail`, `head`) count lines from the ring's
//! start and never wrap; line `p` of the data is `p % N`. A record starts on a line with a
//! 16-byte header `seq: u64, len: u32, crc: u32` (little-endian), the payload after it, and
//! takes `ceil((16 + len) / 64)` lines; `seq` is the record's index + 1 (zeroed memory never
//! matches) and `crc` is the CRC-32C of the ring's nonce, `seq`, `len` and the payload, so a
//! record of an earlier lap, of an earlier ring in the same place, or one read while being
//! written never validates. Records never wrap: one that does not fit before the end of the
//! data is preceded by a skip marker (`len == u32::MAX`, same `seq`, "continue at line 0"),
//! which uses up the rest of the lap and no sequence number.
//!
//! The producer writes a record, flushes its lines, then stores and flushes its tail; it
//! invalidates the consumer's line only when its cached head says the ring is full. The
//! consumer invalidates the producer's line only when it has consumed every record it knew
//! of, then for each record invalidates its lines, checks it (sequence number, length in
//! bounds, checksum of the copy it took), and stores and flushes its head. A record that
//! fails a check is reported ([`PopError::Stale`], [`PopError::Torn`]) and not consumed:
//! it is never delivered. An epoch on each side's line, bumped whenever that side attaches,
//! tells the other that its peer restarted ([`PopError::Restarted`],
//! [`Producer::consumer_epoch`]); the restarted side carries on from the positions it had
//! flushed, so nothing published is lost or repeated.
//!
//! Every value read from the peer's line or from a record is validated before use (a tail or
//! head out of range, a length that does not fit → an error); nothing here panics on the
//! content of the region, loops on it, or reads outside it. What the bytes mean is the
//! caller's business.

mod checksum;
mod consumer;
mod producer;

use netless_shm::coherence::{View, ViewError, LINE};

use crate::layout::LayoutError;
use checksum::Crc32c;
pub use consumer::{Consumer, PopError};

/// The CRC-32C of `bytes` (the records' checksum), for data that travels beside a ring
/// record and must prove itself whole too (a page read from non-coherent memory).
pub fn crc32c(bytes: &[u8]) -> u32 {
    Crc32c::new().update(bytes).finish()
}
pub use producer::{Producer, PushError};

/// Magic of a polled ring's header: `"NLPOLLR1"`.
pub const POLLED_RING_MAGIC: u64 = u64::from_le_bytes(*b"NLPOLLR1");
/// Version of the polled ring's layout; written at `init`, checked at attach.
pub const POLLED_LAYOUT_VERSION: u32 = 1;
/// Bytes before the data lines: header, producer and consumer lines and the gaps.
pub const CONTROL_BYTES: usize = 6 * LINE;
/// Bytes of a record's header.
pub const RECORD_HEADER_BYTES: usize = 16;
/// Fewest data lines of a polled ring.
pub const MIN_DATA_LINES: u64 = 2;
/// Most data lines of a polled ring (1 GiB).
pub const MAX_DATA_LINES: u64 = 1 << 24;

/// `len` of a skip marker.
const SKIP_LEN: u32 = u32::MAX;

/// Offsets of the words, from the ring's start.
const MAGIC: usize = 0;
const VERSION: usize = 8;
const DATA_LINES: usize = 16;
const NONCE: usize = 24;
const PRODUCER_LINE: usize = 2 * LINE;
const TAIL: usize = PRODUCER_LINE;
const RECORDS: usize = PRODUCER_LINE + 8;
const PRODUCER_EPOCH: usize = PRODUCER_LINE + 16;
const CONSUMER_LINE: usize = 4 * LINE;
const HEAD: usize = CONSUMER_LINE;
const CONSUMED: usize = CONSUMER_LINE + 8;
const CONSUMER_EPOCH: usize = CONSUMER_LINE + 16;

/// Why a side could not initialise or attach to a polled ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    /// The region's place or size, or its header, is wrong.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The region does not lie inside the view.
    #[error(transparent)]
    View(#[from] ViewError),
    /// The header was written for a ring of another size.
    #[error("polled ring header says {found} data lines, the region has {expected}: wrong offset or length")]
    Geometry {
        /// Data lines in the header.
        found: u64,
        /// Data lines of the region given.
        expected: u64,
    },
    /// The positions in the producer's and consumer's lines are impossible.
    #[error("polled ring positions are corrupt (head {head}, tail {tail}): a peer scribbled on the ring; initialise it again")]
    Corrupt {
        /// The consumer's head.
        head: u64,
        /// The producer's tail.
        tail: u64,
    },
}

/// The place and size of a polled ring in a region: validated, not yet read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolledRing {
    offset: usize,
    data_lines: u64,
}

impl PolledRing {
    /// Bytes a ring of `data_lines` data lines takes.
    pub const fn bytes_needed(data_lines: u64) -> usize {
        CONTROL_BYTES + data_lines as usize * LINE
    }

    /// The ring in the `len` bytes at `offset` of a view: as many data lines as fit (up to
    /// [`MAX_DATA_LINES`]).
    ///
    /// # Errors
    /// [`LayoutError::Misaligned`] unless `offset` is a multiple of 64;
    /// [`LayoutError::TooSmall`] if fewer than [`MIN_DATA_LINES`] data lines fit.
    pub fn new(offset: usize, len: usize) -> Result<PolledRing, LayoutError> {
        if !offset.is_multiple_of(LINE) {
            return Err(LayoutError::Misaligned { addr: offset });
        }
        let needed = PolledRing::bytes_needed(MIN_DATA_LINES);
        if len < needed {
            return Err(LayoutError::TooSmall { needed, got: len });
        }
        let data_lines = (((len - CONTROL_BYTES) / LINE) as u64).min(MAX_DATA_LINES);
        Ok(PolledRing { offset, data_lines })
    }

    /// Offset of the ring in the view.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Bytes the ring uses from its offset on.
    pub fn len(&self) -> usize {
        PolledRing::bytes_needed(self.data_lines)
    }

    /// Always `false`: a ring has at least [`MIN_DATA_LINES`] lines.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Number of data lines.
    pub fn data_lines(&self) -> u64 {
        self.data_lines
    }

    /// Longest payload a record can carry: the whole data area less its header.
    pub fn max_record_len(&self) -> usize {
        self.data_lines as usize * LINE - RECORD_HEADER_BYTES
    }

    /// Writes an empty ring: header, zero positions and epochs, flushed. Run by one host
    /// while no producer or consumer is attached; the data lines are left as they are
    /// (nothing before a published tail is ever read, and the new nonce keeps records of an
    /// earlier ring there from validating).
    ///
    /// # Errors
    /// [`AttachError::View`] if the ring does not lie inside `view`.
    pub fn init(&self, view: &mut View<'_>) -> Result<(), AttachError> {
        view.invalidate(self.offset, LINE)?;
        let old_nonce = view.load_u64(self.offset + NONCE)?;
        let mut nonce = netless_shm::monotonic_ns() ^ (u64::from(std::process::id()) << 40);
        if nonce == old_nonce {
            nonce = nonce.wrapping_add(1);
        }
        view.write(self.offset, &[0; CONTROL_BYTES])?;
        view.flush(self.offset, CONTROL_BYTES)?;
        view.store_u64(self.offset + VERSION, u64::from(POLLED_LAYOUT_VERSION))?;
        view.store_u64(self.offset + DATA_LINES, self.data_lines)?;
        view.store_u64(self.offset + NONCE, nonce)?;
        view.flush(self.offset, LINE)?;
        view.store_u64(self.offset + MAGIC, POLLED_RING_MAGIC)?;
        view.flush(self.offset, LINE)?;
        Ok(())
    }

    /// Reads and checks the header; returns the nonce.
    fn check_header(&self, view: &mut View<'_>) -> Result<u64, AttachError> {
        if self
            .offset
            .checked_add(self.len())
            .is_none_or(|end| end > view.len())
        {
            return Err(ViewError::OutOfBounds {
                offset: self.offset,
                len: self.len(),
                region: view.len(),
            }
            .into());
        }
        view.invalidate(self.offset, LINE)?;
        let magic = view.load_u64(self.offset + MAGIC)?;
        if magic != POLLED_RING_MAGIC {
            return Err(LayoutError::BadMagic {
                what: "polled ring",
                found: magic,
                expected: POLLED_RING_MAGIC,
            }
            .into());
        }
        let version = view.load_u64(self.offset + VERSION)?;
        if version != u64::from(POLLED_LAYOUT_VERSION) {
            return Err(LayoutError::VersionMismatch {
                found: version.min(u64::from(u32::MAX)) as u32,
                expected: POLLED_LAYOUT_VERSION,
            }
            .into());
        }
        let found = view.load_u64(self.offset + DATA_LINES)?;
        if found != self.data_lines {
            return Err(AttachError::Geometry {
                found,
                expected: self.data_lines,
            });
        }
        view.load_u64(self.offset + NONCE).map_err(Into::into)
    }

    /// Attaches the (one) producer through `view`, this host's view of the region. A
    /// producer that attaches again (after a restart) continues from the tail it had flushed
    /// and bumps its epoch, which the consumer reports once as [`PopError::Restarted`].
    ///
    /// # Errors
    /// [`AttachError`]: a bad header, or positions out of range.
    pub fn producer<'a>(self, mut view: View<'a>) -> Result<Producer<'a>, AttachError> {
        let nonce = self.check_header(&mut view)?;
        Producer::attach(self, view, nonce)
    }

    /// Attaches the (one) consumer through `view`, this host's view of the region. A
    /// consumer that attaches again continues from the head it had flushed and bumps its
    /// epoch ([`Producer::consumer_epoch`]).
    ///
    /// # Errors
    /// [`AttachError`]: a bad header, or positions out of range.
    pub fn consumer<'a>(self, mut view: View<'a>) -> Result<Consumer<'a>, AttachError> {
        let nonce = self.check_header(&mut view)?;
        Consumer::attach(self, view, nonce)
    }

    /// Offset in the view of data line `position % N`.
    #[inline]
    fn line_offset(&self, position: u64) -> usize {
        self.offset + CONTROL_BYTES + (position % self.data_lines) as usize * LINE
    }

    /// Whether `head <= tail <= head + N`.
    #[inline]
    fn positions_possible(&self, head: u64, tail: u64) -> bool {
        head <= tail && tail - head <= self.data_lines
    }
}

/// Lines a record with a `len`-byte payload takes.
#[inline]
fn lines_for(len: usize) -> u64 {
    (RECORD_HEADER_BYTES + len).div_ceil(LINE) as u64
}

/// A record's header bytes.
#[inline]
fn header_bytes(seq: u64, len: u32, crc: u32) -> [u8; RECORD_HEADER_BYTES] {
    let mut header = [0; RECORD_HEADER_BYTES];
    header[..8].copy_from_slice(&seq.to_le_bytes());
    header[8..12].copy_from_slice(&len.to_le_bytes());
    header[12..].copy_from_slice(&crc.to_le_bytes());
    header
}

/// The checksum of a record.
#[inline]
fn record_crc(nonce: u64, seq: u64, len: u32, payload: &[u8]) -> u32 {
    Crc32c::new()
        .update(&nonce.to_le_bytes())
        .update(&seq.to_le_bytes())
        .update(&len.to_le_bytes())
        .update(payload)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_is_checked() {
        assert_eq!(
            PolledRing::new(8, 4096),
            Err(LayoutError::Misaligned { addr: 8 })
        );
        let needed = CONTROL_BYTES + 128;
        assert_eq!(
            PolledRing::new(0, needed - 1),
            Err(LayoutError::TooSmall {
                needed,
                got: needed - 1
            })
        );
        let ring = PolledRing::new(64, needed + 63).unwrap();
        assert_eq!(ring.data_lines(), 2);
        assert_eq!(ring.len(), needed);
        assert_eq!(ring.max_record_len(), 128 - 16);
        assert_eq!(
            PolledRing::new(0, usize::MAX - 63).unwrap().data_lines(),
            MAX_DATA_LINES
        );
    }

    #[test]
    fn records_take_whole_lines() {
        assert_eq!(lines_for(0), 1);
        assert_eq!(lines_for(48), 1);
        assert_eq!(lines_for(49), 2);
        assert_eq!(lines_for(112), 2);
    }
}
