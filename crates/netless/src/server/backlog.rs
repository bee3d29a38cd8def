//! Replies that found a client's response ring full: each connection's backlog, in order,
//! and the list of connections that have one. Workers never wait for room in a ring: they
//! leave the reply here and retry between entries and while idle. A backlog older than
//! `response_stall_limit`, or larger than [`MAX_BACKLOG_BYTES`], closes its connection: its
//! client stopped reading.
//!
//! A client makes room without telling anyone, so while a backlog exists an idle worker
//! sleeps at most [`BACKLOG_POLL`] between looks, and a connection's first backlogged reply
//! wakes its group's workers to start looking: a reply larger than the ring (sent by a
//! deferred reply from any thread, or by a worker) moves on as the client reads, not when
//! an idle worker's long sleep ends.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use netless_ring::Producer;

use super::conn::{lock, Conn};
use super::state::ServerState;
use crate::sync::{AtomicBool, Ordering};

/// Most bytes of replies a connection's backlog holds; a client that lets more pile up in
/// it is not reading, and its connection is closed.
pub const MAX_BACKLOG_BYTES: usize = 4 << 20;

/// The longest an idle worker sleeps while any connection has a backlog: how long the rest
/// of a reply may wait after its client made room in the ring.
pub(super) const BACKLOG_POLL: std::time::Duration = std::time::Duration::from_micros(100);

/// The connections with replies in their backlog.
pub(super) struct Backlogs {
    conns: Mutex<Vec<Arc<Conn>>>,
    /// Whether `conns` holds anything (read by workers between entries).
    any: AtomicBool,
}

impl Backlogs {
    pub(super) fn new() -> Backlogs {
        Backlogs {
            conns: Mutex::new(Vec::new()),
            any: AtomicBool::new(false),
        }
    }

    /// The ring was full: keeps the record (`parts`) in the connection's backlog for the
    /// workers to push when the client has made room, and notifies the client. `Ok` also
    /// when the client is gone or the server stopping (nothing to send to); `Err` when the
    /// backlog would pass [`MAX_BACKLOG_BYTES`] (its client is not reading).
    #[inline(never)]
    pub(super) fn push(
        &self,
        server: &ServerState,
        conn: &Conn,
        parts: &[&[u8]],
    ) -> Result<(), &'static str> {
        if conn.is_dead() || server.is_stopping() {
            return Ok(());
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        {
            let mut backlog = lock(&conn.backlog);
            if backlog.bytes + len > MAX_BACKLOG_BYTES {
                return Err("the client stopped draining its response ring");
            }
            let first = backlog.records.is_empty();
            backlog.records.push_back(parts.concat());
            backlog.bytes += len;
            backlog.since.get_or_insert_with(Instant::now);
            if first {
                // The table's `Arc` of it (a live connection is there).
                let me = server
                    .conns
                    .get(conn.index)
                    .filter(|c| std::ptr::eq(&**c, conn));
                if let Some(me) = me {
                    lock(&self.conns).push(me);
                }
                self.any.store(true, Ordering::Release);
                // Idle workers may be in a long sleep: wake them to look often
                // (`BACKLOG_POLL`) while the backlog lasts.
                if let Some(group) = server.group(conn) {
                    for queue in group.replica.queues() {
                        netless_ring::notify(queue.doorbell());
                    }
                }
            }
        }
        netless_ring::notify(conn.segment.doorbell());
        Ok(())
    }

    /// Whether any connection has a backlog.
    #[inline(always)]
    pub(super) fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Pushes what the backlogged connections' rings have room for now, in order; closes a
    /// connection whose oldest backlogged reply has waited past `response_stall_limit`.
    /// Workers call it between entries and while idle; it costs one load when no connection
    /// has a backlog.
    #[inline]
    pub(super) fn drain(&self, server: &ServerState) {
        if !self.any() {
            return;
        }
        self.drain_now(server);
    }

    #[inline(never)]
    fn drain_now(&self, server: &ServerState) {
        let conns = std::mem::take(&mut *lock(&self.conns));
        let mut left = Vec::new();
        for conn in conns {
            if conn.is_dead() || server.is_stopping() {
                continue;
            }
            let stalled = {
                let mut backlog = lock(&conn.backlog);
                let mut pushed = false;
                while let Some(record) = backlog.records.front() {
                    match server
                        .push_once(&conn, &|p: &mut Producer<'static>| p.try_push(&[record]))
                    {
                        Ok(()) => {
                            backlog.bytes -= record.len();
                            backlog.records.pop_front();
                            pushed = true;
                        }
                        Err(_) => break,
                    }
                }
                if backlog.records.is_empty() {
                    backlog.since = None;
                } else if pushed {
                    // Progress: the client reads, if slowly; the limit runs from now.
                    backlog.since = Some(Instant::now());
                }
                if pushed {
                    netless_ring::notify(conn.segment.doorbell());
                }
                backlog
                    .since
                    .is_some_and(|t| t.elapsed() > server.config.response_stall_limit)
            };
            if stalled {
                server.violated(&conn, "the client stopped draining its response ring");
                lock(&conn.backlog).records.clear();
            } else if !lock(&conn.backlog).records.is_empty() {
                left.push(conn);
            }
        }
        let mut conns = lock(&self.conns);
        conns.extend(left);
        self.any.store(!conns.is_empty(), Ordering::Release);
    }
}
