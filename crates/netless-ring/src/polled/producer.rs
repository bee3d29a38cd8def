//! The producer side of a polled ring: see the module documentation of [`super`].

use netless_shm::coherence::{View, ViewError, LINE};

use super::{
    header_bytes, lines_for, record_crc, AttachError, PolledRing, CONSUMER_EPOCH, CONSUMER_LINE,
    HEAD, PRODUCER_EPOCH, PRODUCER_LINE, RECORDS, RECORD_HEADER_BYTES, SKIP_LEN, TAIL,
};

/// Why [`Producer::try_push`] did not push.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    /// Not enough free lines now: retry once the consumer has consumed records.
    #[error("polled ring is full: the consumer has not consumed its records yet, retry later")]
    Full,
    /// The payload is longer than [`Producer::max_record_len`] and can never be pushed.
    #[error("record is larger than this polled ring can ever hold")]
    TooLarge,
    /// The consumer's head is impossible (behind a head it published before, or ahead of
    /// the tail).
    #[error("polled ring head {head} is impossible at tail {tail}: the consumer is misbehaving")]
    Corrupt {
        /// The head read.
        head: u64,
        /// The producer's tail.
        tail: u64,
    },
    /// The view refused an access: the ring does not lie in it (a caller's mistake).
    #[error(transparent)]
    View(#[from] ViewError),
}

/// The single producer of a polled ring, on one host's [`View`].
#[derive(Debug)]
pub struct Producer<'a> {
    view: View<'a>,
    ring: PolledRing,
    nonce: u64,
    /// Lines published.
    tail: u64,
    /// Records published.
    records: u64,
    /// The consumer's head as last read.
    head: u64,
    epoch: u64,
    consumer_epoch: u64,
}

impl<'a> Producer<'a> {
    /// Reads the positions, bumps the epoch and publishes it (header already checked).
    pub(super) fn attach(
        ring: PolledRing,
        mut view: View<'a>,
        nonce: u64,
    ) -> Result<Producer<'a>, AttachError> {
        view.invalidate(ring.offset + PRODUCER_LINE, LINE)?;
        view.invalidate(ring.offset + CONSUMER_LINE, LINE)?;
        let tail = view.load_u64(ring.offset + TAIL)?;
        let records = view.load_u64(ring.offset + RECORDS)?;
        let epoch = view.load_u64(ring.offset + PRODUCER_EPOCH)?;
        let head = view.load_u64(ring.offset + HEAD)?;
        let consumer_epoch = view.load_u64(ring.offset + CONSUMER_EPOCH)?;
        // Every record takes at least a line, so there are no more records than lines.
        if !ring.positions_possible(head, tail) || records > tail || epoch == u64::MAX {
            return Err(AttachError::Corrupt { head, tail });
        }
        let mut producer = Producer {
            view,
            ring,
            nonce,
            tail,
            records,
            head,
            epoch: epoch + 1,
            consumer_epoch,
        };
        producer.publish()?;
        Ok(producer)
    }

    /// Longest payload [`Producer::try_push`] accepts.
    pub fn max_record_len(&self) -> usize {
        self.ring.max_record_len()
    }

    /// This producer's epoch (1 for the first producer to attach after `init`).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The consumer's epoch as last read (0 until a consumer attached): it changes when the
    /// consumer restarts. Read when the producer attaches and whenever it finds the ring full.
    pub fn consumer_epoch(&self) -> u64 {
        self.consumer_epoch
    }

    /// Records published so far (the next record's `seq` is this + 1).
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Lines free as far as this producer knows.
    #[inline]
    fn free(&self) -> u64 {
        self.ring.data_lines - (self.tail - self.head)
    }

    /// Lines from the tail to the end of the data.
    #[inline]
    fn to_end(&self) -> u64 {
        self.ring.data_lines - self.tail % self.ring.data_lines
    }

    /// Reads the consumer's line: its head (checked) and epoch.
    fn refresh_head(&mut self) -> Result<(), PushError> {
        let offset = self.ring.offset;
        self.view.invalidate(offset + CONSUMER_LINE, LINE)?;
        let head = self.view.load_u64(offset + HEAD)?;
        // The head only moves forward, and never past the tail.
        if head < self.head || head > self.tail {
            return Err(PushError::Corrupt {
                head,
                tail: self.tail,
            });
        }
        self.head = head;
        self.consumer_epoch = self.view.load_u64(offset + CONSUMER_EPOCH)?;
        Ok(())
    }

    /// Stores the producer's line and flushes it: what is published from now on.
    fn publish(&mut self) -> Result<(), ViewError> {
        let offset = self.ring.offset;
        self.view.store_u64(offset + RECORDS, self.records)?;
        self.view.store_u64(offset + PRODUCER_EPOCH, self.epoch)?;
        // The tail last: on a coherent machine it is the word that publishes.
        self.view.store_u64(offset + TAIL, self.tail)?;
        self.view.flush(offset + PRODUCER_LINE, LINE)
    }

    /// Writes and flushes the skip marker at the tail, and advances past it (unpublished).
    fn write_skip(&mut self) -> Result<(), ViewError> {
        let seq = self.records + 1;
        let header = header_bytes(seq, SKIP_LEN, record_crc(self.nonce, seq, SKIP_LEN, &[]));
        let at = self.ring.line_offset(self.tail);
        self.view.write(at, &header)?;
        self.view.flush(at, RECORD_HEADER_BYTES)?;
        self.tail += self.to_end();
        Ok(())
    }

    /// Pushes one record of `payload`: writes it, flushes its lines, then publishes the tail.
    ///
    /// # Errors
    /// [`PushError::Full`] (nothing written but, maybe, a published skip marker),
    /// [`PushError::TooLarge`], [`PushError::Corrupt`] (the consumer's head is impossible).
    pub fn try_push(&mut self, payload: &[u8]) -> Result<(), PushError> {
        if payload.len() > self.max_record_len() {
            return Err(PushError::TooLarge);
        }
        let need = lines_for(payload.len());
        let skip = if need > self.to_end() {
            self.to_end()
        } else {
            0
        };
        if self.free() < skip + need {
            self.refresh_head()?;
        }
        if self.free() < skip + need {
            // A skip marker that fits now makes room at line 0 once the consumer passes it;
            // publishing it alone lets a record as long as the whole ring through.
            if skip > 0 && self.free() >= skip {
                self.write_skip()?;
                self.publish()?;
            }
            return Err(PushError::Full);
        }
        if skip > 0 {
            self.write_skip()?;
        }
        let seq = self.records + 1;
        let len = payload.len() as u32;
        let header = header_bytes(seq, len, record_crc(self.nonce, seq, len, payload));
        let at = self.ring.line_offset(self.tail);
        self.view.write(at, &header)?;
        self.view.write(at + RECORD_HEADER_BYTES, payload)?;
        self.view.flush(at, RECORD_HEADER_BYTES + payload.len())?;
        self.tail += need;
        self.records = seq;
        self.publish()?;
        Ok(())
    }
}
