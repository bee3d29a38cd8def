//! Trust groups: the clients of one uid, which share a replica segment (receive buffer,
//! queues, block table) with each other and with no one else. A server makes its owner's
//! group when it binds and another the first time a client of a new uid passes its ACL;
//! each group's buffer is sized as the whole server's would be (by the SLO, or the
//! configured bytes), so what one group's members do to their buffer and queues costs the
//! others nothing.
//!
//! Groups are only ever added (under the server's `admitting` lock), never removed while the
//! server runs, so workers read them without a lock.

use std::sync::{Arc, OnceLock};

use netless_ring::ConsumerHead;

use crate::segment::{ControlSegment, Place, ReplicaSegment, ReplicaSpec};
use crate::status::Status;
use crate::sync::{AtomicUsize, Ordering};

/// Most trust groups (distinct client uids) one server serves; a client of one more uid is
/// refused with `RESOURCE_EXHAUSTED`.
pub(crate) const MAX_GROUPS: usize = 8;

/// One trust group: its uid, its replica segment and its queues' consumer positions.
pub(super) struct Group {
    /// Its place in the server's [`Groups`].
    pub(super) index: u32,
    pub(super) uid: u32,
    pub(super) replica: ReplicaSegment,
    /// Consumer position of each receive queue of `replica`.
    pub(super) heads: Box<[ConsumerHead]>,
}

impl Group {
    /// Creates the group of `uid`, number `index`, with a replica segment of `spec` beside
    /// the server's `control` segment.
    pub(super) fn create(
        service: &str,
        index: u32,
        uid: u32,
        spec: ReplicaSpec,
        control: Arc<ControlSegment>,
        place: Place<'_>,
    ) -> Result<Group, Status> {
        let replica = ReplicaSegment::create_in(service, spec, control, place)?;
        Ok(Group {
            index,
            uid,
            heads: (0..spec.nqueues).map(|_| ConsumerHead::new()).collect(),
            replica,
        })
    }

    /// Consumer position of queue `q` and its view, for the worker or acceptor at `q`.
    pub(super) fn queue(&self, q: usize) -> (&crate::segment::replica::QueueView, &ConsumerHead) {
        (&self.replica.queues()[q], &self.heads[q])
    }
}

/// The server's trust groups, in the order they were made (the owner's first).
pub(super) struct Groups {
    slots: Box<[OnceLock<Group>]>,
    count: AtomicUsize,
}

impl Groups {
    /// The groups, starting with `first` (the server owner's).
    pub(super) fn new(first: Group) -> Groups {
        let slots: Box<[OnceLock<Group>]> = (0..MAX_GROUPS).map(|_| OnceLock::new()).collect();
        let _ = slots[0].set(first);
        Groups {
            slots,
            count: AtomicUsize::new(1),
        }
    }

    /// How many groups there are (never 0).
    #[inline(always)]
    pub(super) fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Group `index`, if it exists.
    #[inline(always)]
    pub(super) fn get(&self, index: usize) -> Option<&Group> {
        self.slots.get(index)?.get()
    }

    /// Every group.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Group> {
        self.slots[..self.count()].iter().filter_map(OnceLock::get)
    }

    /// The group of `uid`, made with `create(index)` if it has none yet, or an error if the
    /// server serves [`MAX_GROUPS`] already. The caller serializes calls (the server's
    /// `admitting` lock).
    pub(super) fn of_uid(
        &self,
        uid: u32,
        create: impl FnOnce(u32) -> Result<Group, Status>,
    ) -> Result<&Group, Status> {
        if let Some(group) = self.iter().find(|g| g.uid == uid) {
            return Ok(group);
        }
        let index = self.count();
        let Some(slot) = self.slots.get(index) else {
            return Err(Status::resource_exhausted(format!(
                "the service serves clients of {MAX_GROUPS} uids already, its most: a client \
                 of another uid can connect once the server restarts"
            )));
        };
        let group = create(index as u32)?;
        let _ = slot.set(group);
        // Published after the group is complete: a worker that sees the count sees it.
        self.count.store(index + 1, Ordering::Release);
        slot.get()
            .ok_or_else(|| Status::internal("a trust group vanished"))
    }
}
