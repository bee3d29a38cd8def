//! Notifying clients once per batch of replies, not once per reply. While a worker serves a
//! batch or runs its handler's [`Handler::poll`](super::Handler::poll), it is inside a
//! [`NotifySection`]: the clients its replies go to are noted and notified once when the
//! outermost section ends (a notification costs a fence, and a system call while the client
//! sleeps, which every later one would repeat until it woke). Deferred replies sent inside
//! a section to a pipelined client are gathered into reply batches that go out then too.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use super::conn::Conn;
use super::state::ServerState;
use crate::wire::reply::ReplyBatch;

/// Deferred replies a worker sent inside a [`NotifySection`], per connection, sent as reply
/// batches when the section ends.
pub(super) struct PendingReplies {
    pub(super) server: Arc<ServerState>,
    pub(super) conn: Arc<Conn>,
    pub(super) batch: ReplyBatch,
}

thread_local! {
    /// How many [`NotifySection`]s this thread is in.
    static SECTIONS: Cell<u32> = const { Cell::new(0) };
    /// Clients owed a notification at the end of the outermost section.
    static OWED: RefCell<Vec<Arc<Conn>>> = const { RefCell::new(Vec::new()) };
    /// Whether `OWED` holds anything (so that a section that sent nothing costs two `Cell`
    /// updates: workers enter one on every idle poll).
    static ANY_OWED: Cell<bool> = const { Cell::new(false) };
    /// Deferred replies sent in the section, to go out as reply batches when it ends.
    pub(super) static PENDING: RefCell<Vec<PendingReplies>> = const { RefCell::new(Vec::new()) };
    pub(super) static ANY_PENDING: Cell<bool> = const { Cell::new(false) };
}

/// While alive, replies sent on this thread notify their clients when the outermost section
/// ends instead of one by one.
pub(super) struct NotifySection;

impl NotifySection {
    pub(super) fn enter() -> NotifySection {
        SECTIONS.set(SECTIONS.get() + 1);
        NotifySection
    }

    /// Whether this thread is inside a section.
    #[inline(always)]
    pub(super) fn active() -> bool {
        SECTIONS.get() > 0
    }
}

impl Drop for NotifySection {
    fn drop(&mut self) {
        let depth = SECTIONS.get() - 1;
        if depth == 0 && ANY_PENDING.replace(false) {
            // Still inside the section, so these record their notifications in OWED.
            let mut pending = PENDING.with_borrow_mut(std::mem::take);
            for p in &mut pending {
                p.server.send_deferred_batch(&p.conn, &mut p.batch);
            }
            pending.clear();
            PENDING.with_borrow_mut(|v| {
                if v.is_empty() {
                    *v = pending;
                }
            });
        }
        SECTIONS.set(depth);
        if depth == 0 && ANY_OWED.replace(false) {
            // Taken out before notifying, so no borrow is held while the `Arc`s drop.
            let owed = OWED.with_borrow_mut(std::mem::take);
            for conn in &owed {
                netless_ring::notify(conn.segment.doorbell());
            }
            OWED.with_borrow_mut(|v| {
                if v.is_empty() {
                    // Keep the allocation for the next section.
                    *v = owed;
                    v.clear();
                }
            });
        }
    }
}

/// Notifies `conn`'s client now, or at the end of the thread's [`NotifySection`].
#[inline]
pub(super) fn notify_client(conn: &Arc<Conn>) {
    if SECTIONS.get() == 0 {
        netless_ring::notify(conn.segment.doorbell());
        return;
    }
    OWED.with_borrow_mut(|owed| {
        if !owed.iter().any(|c| Arc::ptr_eq(c, conn)) {
            owed.push(conn.clone());
        }
    });
    ANY_OWED.set(true);
}
