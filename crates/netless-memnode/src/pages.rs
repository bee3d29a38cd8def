//! The node's pages: 4 KiB buffers with a reference count each, shared between the objects
//! that contain them (DmRPC-net's page manager). A page is never written once stored, so
//! sharing one needs no copy and reading one needs no lock beyond the lookup. This module
//! never decides which object holds which page; `state` does.

use bytes::Bytes;

/// A page's index in the store.
pub(crate) type PageId = u32;

/// Refcounted immutable pages, in slots reused after they are freed.
#[derive(Debug, Default)]
pub(crate) struct PageStore {
    slots: Vec<Option<Slot>>,
    free: Vec<PageId>,
    used: u64,
}

#[derive(Debug)]
struct Slot {
    refs: u64,
    data: Bytes,
}

impl PageStore {
    /// Pages stored (each counted once however many objects share it).
    pub(crate) fn len(&self) -> u64 {
        self.used
    }

    /// Stores `data` (one page, 4096 bytes) with one reference.
    pub(crate) fn insert(&mut self, data: Bytes) -> PageId {
        self.used += 1;
        let slot = Some(Slot { refs: 1, data });
        match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = slot;
                id
            }
            None => {
                // The node's capacity bounds the pages stored, far below u32::MAX.
                let id = PageId::try_from(self.slots.len()).unwrap_or(PageId::MAX);
                self.slots.push(slot);
                id
            }
        }
    }

    /// One more object holds page `id`.
    pub(crate) fn share(&mut self, id: PageId) {
        if let Some(Some(slot)) = self.slots.get_mut(id as usize) {
            slot.refs += 1;
        } else {
            debug_assert!(false, "sharing page {id}, which is not stored");
        }
    }

    /// One object fewer holds page `id`; the last one frees it.
    pub(crate) fn release(&mut self, id: PageId) {
        let Some(entry) = self.slots.get_mut(id as usize) else {
            debug_assert!(false, "releasing page {id}, which was never stored");
            return;
        };
        let Some(slot) = entry else {
            debug_assert!(false, "releasing page {id}, which is free");
            return;
        };
        slot.refs -= 1;
        if slot.refs == 0 {
            *entry = None;
            self.free.push(id);
            self.used -= 1;
        }
    }

    /// Page `id`'s bytes (a reference count, not a copy); empty if it is not stored.
    pub(crate) fn data(&self, id: PageId) -> Bytes {
        match self.slots.get(id as usize) {
            Some(Some(slot)) => slot.data.clone(),
            _ => {
                debug_assert!(false, "reading page {id}, which is not stored");
                Bytes::new()
            }
        }
    }

    /// How many objects hold page `id` (0 if it is free).
    #[cfg(test)]
    pub(crate) fn refs(&self, id: PageId) -> u64 {
        match self.slots.get(id as usize) {
            Some(Some(slot)) => slot.refs,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_pages_are_freed_by_their_last_holder_and_slots_reused() {
        let mut store = PageStore::default();
        let a = store.insert(Bytes::from_static(b"a"));
        let b = store.insert(Bytes::from_static(b"b"));
        store.share(a);
        assert_eq!((store.len(), store.refs(a)), (2, 2));
        store.release(a);
        assert_eq!((store.len(), store.refs(a)), (2, 1));
        store.release(a);
        assert_eq!((store.len(), store.refs(a)), (1, 0));
        let c = store.insert(Bytes::from_static(b"c"));
        assert_eq!(c, a, "a freed slot is reused");
        assert_eq!(&store.data(c)[..], b"c");
        assert_eq!(&store.data(b)[..], b"b");
    }
}
