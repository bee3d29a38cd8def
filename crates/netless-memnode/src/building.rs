//! Objects under construction: the pages of a Put as its chunks arrive, and the private
//! pages of a Derive as its writes arrive. Their pages are counted against the node's
//! capacity from the start ([`Reservation`]) and built outside the node's lock; a client
//! that stops halfway (a dropped connection, a crash) drops the draft, and with it the
//! reservation. Nothing here is visible to other clients until committed.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tonic::Status;

use crate::proto::PageWrite;
use crate::reference::RemoteRef;
use crate::server::Shared;
use crate::state::State;
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// Pages set aside in the node's capacity for one object being built; returned on drop
/// unless committed.
#[derive(Debug)]
pub(crate) struct Reservation {
    shared: Arc<Shared>,
    pages: u64,
}

impl Reservation {
    pub(crate) fn new(shared: Arc<Shared>) -> Reservation {
        Reservation { shared, pages: 0 }
    }

    /// Sets `pages` more pages aside (the caller holds the lock: `state`).
    pub(crate) fn grow(&mut self, state: &mut State, pages: u64) -> Result<(), Status> {
        state.reserve(pages)?;
        self.pages += pages;
        Ok(())
    }

    /// Gives the reservation back and runs `store` under the same lock, so the pages it
    /// stores take the place of those set aside.
    pub(crate) fn commit<R>(mut self, store: impl FnOnce(&mut State) -> R) -> R {
        let mut state = self.shared.lock();
        state.unreserve(std::mem::take(&mut self.pages));
        store(&mut state)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.pages > 0 {
            self.shared.lock().unreserve(self.pages);
        }
    }
}

/// A Put's bytes, cut into pages as they arrive.
#[derive(Debug)]
pub(crate) struct PutPages {
    total: u64,
    received: u64,
    pages: Vec<Bytes>,
    current: BytesMut,
}

impl PutPages {
    pub(crate) fn new(total: u64) -> PutPages {
        PutPages {
            total,
            received: 0,
            // Bounded: the reservation for `total` succeeded, so these pages fit the node.
            pages: Vec::with_capacity(usize::try_from(total.div_ceil(PAGE)).unwrap_or(0)),
            current: BytesMut::new(),
        }
    }

    pub(crate) fn push(&mut self, mut data: &[u8]) -> Result<(), Status> {
        if self.received + data.len() as u64 > self.total {
            return Err(Status::invalid_argument(format!(
                "the Put sent more than the {} bytes its first chunk announced",
                self.total
            )));
        }
        self.received += data.len() as u64;
        while !data.is_empty() {
            if self.current.capacity() == 0 {
                self.current = BytesMut::with_capacity(PAGE_SIZE);
            }
            let take = (PAGE_SIZE - self.current.len()).min(data.len());
            self.current.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.current.len() == PAGE_SIZE {
                self.pages.push(std::mem::take(&mut self.current).freeze());
            }
        }
        Ok(())
    }

    /// The pages, the last one padded with zeros to a whole page.
    pub(crate) fn finish(mut self) -> Result<Vec<Bytes>, Status> {
        if self.received != self.total {
            return Err(Status::invalid_argument(format!(
                "the Put ended after {} of the {} bytes its first chunk announced",
                self.received, self.total
            )));
        }
        if !self.current.is_empty() {
            self.current.resize(PAGE_SIZE, 0);
            self.pages.push(self.current.freeze());
        }
        Ok(self.pages)
    }
}

/// A Derive's private pages: each page a write touches, copied from the base once, then
/// written; every other page stays the base's, shared.
#[derive(Debug)]
pub(crate) struct DerivePages {
    base: RemoteRef,
    base_len: u64,
    base_pages: u64,
    len: u64,
    written: BTreeMap<u64, BytesMut>,
    reservation: Reservation,
}

impl DerivePages {
    pub(crate) fn new(
        shared: Arc<Shared>,
        base: RemoteRef,
        (base_len, base_pages): (u64, u64),
        len: u64,
    ) -> DerivePages {
        DerivePages {
            base,
            base_len,
            base_pages,
            len,
            written: BTreeMap::new(),
            reservation: Reservation::new(shared),
        }
    }

    /// Applies `writes` in order, copying each page touched for the first time.
    pub(crate) fn apply(&mut self, writes: &[PageWrite]) -> Result<(), Status> {
        let mut fresh = Vec::new();
        for w in writes {
            let start = u64::from(w.offset);
            let end = start + w.data.len() as u64;
            let limit = self
                .len
                .saturating_sub(w.page.saturating_mul(PAGE))
                .min(PAGE);
            if end > limit || w.page >= self.len.div_ceil(PAGE) {
                return Err(Status::out_of_range(format!(
                    "a write of {} bytes at offset {start} of page {} is outside the new \
                     object of {} bytes (pages hold {PAGE_SIZE} bytes)",
                    w.data.len(),
                    w.page,
                    self.len
                )));
            }
            if !self.written.contains_key(&w.page) && !fresh.contains(&w.page) {
                fresh.push(w.page);
            }
        }
        self.copy_pages(&fresh)?;
        for w in writes {
            if let Some(page) = self.written.get_mut(&w.page) {
                let start = w.offset as usize;
                page[start..start + w.data.len()].copy_from_slice(&w.data);
            }
        }
        Ok(())
    }

    /// Makes private copies of the pages that sharing would get wrong: those past the
    /// base's end, and the base's last page when the object grows (its bytes past the
    /// base's length must read as zero).
    pub(crate) fn finish(mut self) -> Result<(BTreeMap<u64, Bytes>, Reservation), Status> {
        let count = self.len.div_ceil(PAGE);
        let boundary = (!self.base_len.is_multiple_of(PAGE) && self.len > self.base_len)
            .then_some(self.base_len / PAGE);
        let needed: Vec<u64> = (0..count)
            .filter(|i| !self.written.contains_key(i))
            .filter(|&i| i >= self.base_pages || Some(i) == boundary)
            .collect();
        self.copy_pages(&needed)?;
        let written = std::mem::take(&mut self.written)
            .into_iter()
            .map(|(i, page)| (i, page.freeze()))
            .collect();
        Ok((written, self.reservation))
    }

    /// Reserves and copies `indices` from the base: its bytes up to the shorter of the two
    /// lengths, zeros after them.
    fn copy_pages(&mut self, indices: &[u64]) -> Result<(), Status> {
        if indices.is_empty() {
            return Ok(());
        }
        let sources = {
            let shared = self.reservation.shared.clone();
            let mut state = shared.lock();
            let sources = state.base_pages(&self.base, indices)?;
            self.reservation.grow(&mut state, indices.len() as u64)?;
            sources
        };
        let keep = self.base_len.min(self.len);
        for (&i, source) in indices.iter().zip(sources) {
            let mut page = BytesMut::zeroed(PAGE_SIZE);
            if let Some(source) = source {
                let valid = (keep.saturating_sub(i * PAGE).min(PAGE) as usize).min(source.len());
                page[..valid].copy_from_slice(&source[..valid]);
            }
            self.written.insert(i, page);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_is_cut_into_whole_pages() {
        let mut put = PutPages::new(5000);
        put.push(&[1; 3000]).unwrap();
        put.push(&[2; 2000]).unwrap();
        let pages = put.finish().unwrap();
        assert_eq!(pages.len(), 2);
        assert!(pages.iter().all(|p| p.len() == PAGE_SIZE));
        assert_eq!(&pages[0][2999..3001], &[1, 2]);
        assert_eq!(pages[1][5000 - 4096 - 1], 2);
        assert_eq!(pages[1][5000 - 4096], 0, "padding");
    }

    #[test]
    fn a_put_must_send_what_it_announced() {
        let mut put = PutPages::new(10);
        assert_eq!(
            put.push(&[0; 11]).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        let mut put = PutPages::new(10);
        put.push(&[0; 9]).unwrap();
        assert_eq!(
            put.finish().unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        assert!(PutPages::new(0).finish().unwrap().is_empty());
    }
}
