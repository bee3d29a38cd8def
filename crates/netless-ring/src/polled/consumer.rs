//! The consumer side of a polled ring: see the module documentation of [`super`].

use netless_shm::coherence::{View, ViewError, LINE};

use super::{
    lines_for, record_crc, AttachError, PolledRing, CONSUMED, CONSUMER_EPOCH, CONSUMER_LINE, HEAD,
    PRODUCER_EPOCH, PRODUCER_LINE, RECORDS, RECORD_HEADER_BYTES, SKIP_LEN, TAIL,
};

/// Why [`Consumer::try_pop`] delivered no record. Nothing was consumed on any of them: the
/// next call looks at the same place again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PopError {
    /// The tail says a record is there, but its line holds another sequence number: an
    /// earlier record's line not yet written back (the producer published before its
    /// write-back arrived, or never flushed), or a producer writing where it should not.
    #[error("polled ring record {expected} is not there yet (its line holds {found}): a stale line; retry, and if it persists the producer is not flushing")]
    Stale {
        /// The sequence number due.
        expected: u64,
        /// The one in the record's header.
        found: u64,
    },
    /// The record due has the right sequence number but a length that does not fit or a
    /// checksum that does not match: torn (read while being rewritten) or forged.
    #[error("polled ring record {seq} is torn or forged (length or checksum wrong); retry, and if it persists the producer is misbehaving")]
    Torn {
        /// The record's sequence number.
        seq: u64,
    },
    /// The producer's tail is impossible (behind one it published, or more than the ring
    /// ahead of the head).
    #[error("polled ring tail {tail} is impossible at head {head}: the producer is misbehaving")]
    Corrupt {
        /// The consumer's head.
        head: u64,
        /// The tail read.
        tail: u64,
    },
    /// The producer attached again (restarted): reported once per change of epoch. Not a
    /// failure: records it published before are still delivered in order, none twice.
    #[error("the polled ring's producer restarted (epoch {epoch})")]
    Restarted {
        /// The producer's new epoch.
        epoch: u64,
    },
    /// The view refused an access: the ring does not lie in it (a caller's mistake).
    #[error(transparent)]
    View(#[from] ViewError),
}

/// A record's header as read, not yet validated beyond its sequence number.
#[derive(Debug, Clone, Copy)]
struct Header {
    seq: u64,
    len: u32,
    crc: u32,
}

/// The single consumer of a polled ring, on one host's [`View`].
#[derive(Debug)]
pub struct Consumer<'a> {
    view: View<'a>,
    ring: PolledRing,
    nonce: u64,
    /// Lines consumed.
    head: u64,
    /// Records consumed.
    consumed: u64,
    /// The producer's tail as last read.
    tail: u64,
    epoch: u64,
    producer_epoch: u64,
}

impl<'a> Consumer<'a> {
    /// Reads the positions, bumps the epoch and publishes it (header already checked).
    pub(super) fn attach(
        ring: PolledRing,
        mut view: View<'a>,
        nonce: u64,
    ) -> Result<Consumer<'a>, AttachError> {
        view.invalidate(ring.offset + PRODUCER_LINE, LINE)?;
        view.invalidate(ring.offset + CONSUMER_LINE, LINE)?;
        let head = view.load_u64(ring.offset + HEAD)?;
        let consumed = view.load_u64(ring.offset + CONSUMED)?;
        let epoch = view.load_u64(ring.offset + CONSUMER_EPOCH)?;
        let tail = view.load_u64(ring.offset + TAIL)?;
        let records = view.load_u64(ring.offset + RECORDS)?;
        let producer_epoch = view.load_u64(ring.offset + PRODUCER_EPOCH)?;
        if !ring.positions_possible(head, tail)
            || consumed > head
            || consumed > records
            || epoch == u64::MAX
        {
            return Err(AttachError::Corrupt { head, tail });
        }
        let mut consumer = Consumer {
            view,
            ring,
            nonce,
            head,
            consumed,
            tail,
            epoch: epoch + 1,
            producer_epoch,
        };
        consumer.publish()?;
        Ok(consumer)
    }

    /// Longest payload a record can carry.
    pub fn max_record_len(&self) -> usize {
        self.ring.max_record_len()
    }

    /// This consumer's epoch (1 for the first consumer to attach after `init`).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The producer's epoch as last read (0 until a producer attached).
    pub fn producer_epoch(&self) -> u64 {
        self.producer_epoch
    }

    /// Records consumed so far (the next record's `seq` is this + 1).
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Stores the consumer's line and flushes it.
    fn publish(&mut self) -> Result<(), ViewError> {
        let offset = self.ring.offset;
        self.view.store_u64(offset + CONSUMED, self.consumed)?;
        self.view.store_u64(offset + CONSUMER_EPOCH, self.epoch)?;
        self.view.store_u64(offset + HEAD, self.head)?;
        self.view.flush(offset + CONSUMER_LINE, LINE)
    }

    /// Reads the producer's line: its tail (checked) and epoch.
    fn refresh_tail(&mut self) -> Result<(), PopError> {
        let offset = self.ring.offset;
        self.view.invalidate(offset + PRODUCER_LINE, LINE)?;
        let tail = self.view.load_u64(offset + TAIL)?;
        let epoch = self.view.load_u64(offset + PRODUCER_EPOCH)?;
        // The tail only moves forward, and never more than the ring ahead of the head.
        if tail < self.tail || !self.ring.positions_possible(self.head, tail) {
            return Err(PopError::Corrupt {
                head: self.head,
                tail,
            });
        }
        self.tail = tail;
        if epoch != self.producer_epoch {
            let known = self.producer_epoch;
            self.producer_epoch = epoch;
            if known != 0 {
                return Err(PopError::Restarted { epoch });
            }
        }
        Ok(())
    }

    /// The header of the entry at the head, with the sequence number due; `None` if the
    /// producer has published nothing more.
    fn next_header(&mut self) -> Result<Option<Header>, PopError> {
        if self.head == self.tail {
            self.refresh_tail()?;
            if self.head == self.tail {
                return Ok(None);
            }
        }
        let at = self.ring.line_offset(self.head);
        self.view.invalidate(at, LINE)?;
        let mut bytes = [0; RECORD_HEADER_BYTES];
        self.view.read(at, &mut bytes)?;
        let mut seq = [0; 8];
        seq.copy_from_slice(&bytes[..8]);
        let mut len = [0; 4];
        len.copy_from_slice(&bytes[8..12]);
        let mut crc = [0; 4];
        crc.copy_from_slice(&bytes[12..]);
        let header = Header {
            seq: u64::from_le_bytes(seq),
            len: u32::from_le_bytes(len),
            crc: u32::from_le_bytes(crc),
        };
        let expected = self.consumed + 1;
        if header.seq != expected {
            return Err(PopError::Stale {
                expected,
                found: header.seq,
            });
        }
        Ok(Some(header))
    }

    /// Passes the skip marker at the head (checked) to line 0 of the next lap.
    fn pass_skip(&mut self, header: Header) -> Result<(), PopError> {
        let torn = PopError::Torn { seq: header.seq };
        let index = self.head % self.ring.data_lines;
        let lines = self.ring.data_lines - index;
        // A skip marker at line 0 would skip a whole lap: never written.
        if index == 0 || lines > self.tail - self.head {
            return Err(torn);
        }
        if header.crc != record_crc(self.nonce, header.seq, SKIP_LEN, &[]) {
            return Err(torn);
        }
        self.head += lines;
        self.publish()?;
        Ok(())
    }

    /// Copies the record at the head into `out`, checks it and consumes it.
    fn take_record(&mut self, header: Header, out: &mut Vec<u8>) -> Result<usize, PopError> {
        let torn = PopError::Torn { seq: header.seq };
        let len = header.len as usize;
        if len > self.max_record_len() {
            return Err(torn);
        }
        let lines = lines_for(len);
        let index = self.head % self.ring.data_lines;
        if lines > self.tail - self.head || index + lines > self.ring.data_lines {
            return Err(torn);
        }
        let at = self.ring.line_offset(self.head);
        if lines > 1 {
            self.view
                .invalidate(at + LINE, (lines as usize - 1) * LINE)?;
        }
        out.resize(len, 0);
        self.view.read(at + RECORD_HEADER_BYTES, out)?;
        // The copy is what is checked and delivered, so bytes changed after it cannot slip in.
        if header.crc != record_crc(self.nonce, header.seq, header.len, out) {
            out.clear();
            return Err(torn);
        }
        self.head += lines;
        self.consumed = header.seq;
        self.publish()?;
        Ok(len)
    }

    /// Takes the next record into `out` (replacing its content): `Ok(Some(len))`, or
    /// `Ok(None)` if none is published. On an error `out` is empty and nothing is consumed.
    ///
    /// # Errors
    /// [`PopError::Stale`] and [`PopError::Torn`] (the record due does not validate; retry),
    /// [`PopError::Corrupt`] (the tail is impossible), [`PopError::Restarted`] (once per
    /// restart of the producer; call again).
    pub fn try_pop(&mut self, out: &mut Vec<u8>) -> Result<Option<usize>, PopError> {
        out.clear();
        let Some(mut header) = self.next_header()? else {
            return Ok(None);
        };
        if header.len == SKIP_LEN {
            self.pass_skip(header)?;
            // At line 0 now, where no skip marker can be: `take_record` refuses its length.
            match self.next_header()? {
                Some(next) => header = next,
                None => return Ok(None),
            }
        }
        self.take_record(header, out).map(Some)
    }
}
