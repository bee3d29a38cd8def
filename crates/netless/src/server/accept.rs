//! The acceptor thread: accepts clients on the service's Unix socket, starts each one's
//! handshake on a thread of its own (`handshake`), and watches every admitted connection's
//! socket for the hang-up that says its client died.
//!
//! A hang-up retires the connection at once (no worker serves it again) and, once no worker
//! can still be touching its requests, frees every block that carries its tag. The acceptor
//! never reads a request and never waits on a client.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::audit::Audit;
use super::conn::Conn;
use super::handshake::Handshakes;
use super::state::ServerState;
use super::worker::BUSY;
use crate::segment::layout::block_state;
use crate::status::Status;
use crate::sync::Ordering;

/// How long a retired connection waits before its blocks are freed, so that a worker which
/// has just dequeued one of its requests has finished looking at it.
const RECLAIM_GRACE: Duration = Duration::from_millis(20);

/// A retired connection waiting for its blocks to be freed.
struct Dying {
    conn: Arc<Conn>,
    tail_at_death: u64,
    since: Instant,
}

/// The acceptor thread's state: the listening socket, the live connections by socket, and
/// the retired ones whose blocks are not yet free.
pub(super) struct Acceptor {
    server: Arc<ServerState>,
    /// The service's socket (none when it serves in a fabric only).
    listener: Option<UnixListener>,
    /// Readable once the server stops.
    stop: OwnedFd,
    live: HashMap<RawFd, Arc<Conn>>,
    dying: Vec<Dying>,
    /// Bumped per accepted socket: the generation in a connection's tag.
    generation: u32,
    handshakes: Handshakes,
    audit: Audit,
}

impl Acceptor {
    pub(super) fn new(
        server: Arc<ServerState>,
        listener: Option<UnixListener>,
        stop: OwnedFd,
    ) -> Result<Self, Status> {
        Ok(Acceptor {
            server,
            listener,
            stop,
            live: HashMap::new(),
            dying: Vec::new(),
            generation: 0,
            handshakes: Handshakes::new()?,
            audit: Audit::new(),
        })
    }

    /// Where connections admitted through a fabric are handed in.
    pub(super) fn inbox(&self) -> Arc<super::handshake::Inbox> {
        self.handshakes.inbox()
    }

    /// Admits, watches and reclaims until the server stops; then closes every connection.
    pub(super) fn run(mut self) {
        use rustix::event::{poll, PollFd, PollFlags};
        while !self.server.is_stopping() {
            let conns: Vec<Arc<Conn>> = self.live.values().cloned().collect();
            let admissions = self.handshakes.wake_fd();
            let mut fds = Vec::with_capacity(conns.len() + 3);
            fds.push(PollFd::new(&self.stop, PollFlags::IN));
            // Without a listener the stop fd stands in (its event ends the loop first).
            match &self.listener {
                Some(listener) => fds.push(PollFd::new(listener, PollFlags::IN)),
                None => fds.push(PollFd::new(&self.stop, PollFlags::IN)),
            }
            fds.push(PollFd::new(&admissions, PollFlags::IN));
            for c in &conns {
                fds.push(PollFd::new(&c.socket, PollFlags::IN));
            }
            let wait = if self.dying.is_empty() {
                self.audit.due_in().max(Duration::from_millis(1))
            } else {
                Duration::from_millis(5)
            };
            let timeout = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: wait.as_nanos().min(999_999_999) as i64,
            };
            match poll(&mut fds, Some(&timeout)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    tracing::error!("netless acceptor poll failed: {e}");
                    thread::sleep(Duration::from_millis(10));
                }
            }
            if !fds[0].revents().is_empty() {
                break;
            }
            let accept_ready = !fds[1].revents().is_empty();
            let admitted = !fds[2].revents().is_empty();
            let hung: Vec<Arc<Conn>> = fds[3..]
                .iter()
                .zip(&conns)
                .filter(|(fd, c)| !fd.revents().is_empty() || c.is_dead())
                .map(|(_, c)| c.clone())
                .collect();
            drop(fds);
            for conn in hung {
                self.hang_up(conn);
            }
            if admitted {
                self.watch_admitted();
            }
            if let (true, Some(listener)) = (accept_ready, &self.listener) {
                while let Ok((socket, _)) = listener.accept() {
                    self.generation = self.generation.wrapping_add(1);
                    self.handshakes.start(&self.server, socket, self.generation);
                }
            }
            self.repair_tails();
            let server = &self.server;
            self.dying.retain(|d| !try_reclaim(server, d));
            let dying: Vec<u32> = self.dying.iter().map(|d| d.conn.tag).collect();
            self.audit.run(server, &dying);
            self.server.update_depth_limit();
        }
        // Handshakes in progress end now; what they admitted closes with the rest.
        self.handshakes.stop();
        self.watch_admitted();
        for conn in self.live.values() {
            conn.close(Status::unavailable(format!(
                "service `{}` is shutting down",
                self.server.service
            )));
        }
    }

    /// Puts back a queue tail a faulty client jammed, thrown outside a lap of the head or
    /// left behind it at a cell scribbled on (no producer could enqueue, and the head would
    /// never pass a dead connection's last entry).
    fn repair_tails(&self) {
        let server = &self.server;
        for group in server.groups.iter() {
            for (q, view) in group.replica.queues().iter().enumerate() {
                if let Some(tail) = view.queue().repair_tail(&group.heads[q]) {
                    server.dropped.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        "netless: service `{}`: receive queue {q} of uid {}'s clients had its \
                         tail jammed by a faulty client; put back at {tail}",
                        server.service,
                        group.uid
                    );
                }
            }
        }
    }

    /// Starts watching the connections handshakes admitted.
    fn watch_admitted(&mut self) {
        for conn in self.handshakes.take_admitted() {
            self.live.insert(conn.socket.as_raw_fd(), conn);
        }
    }

    /// A byte or a hang-up on `conn`'s socket (clients send nothing after the handshake), or
    /// the connection closed: retires it if its client is gone or it is dead.
    fn hang_up(&mut self, conn: Arc<Conn>) {
        let mut probe = [0u8; 1];
        let _ = conn.socket.set_nonblocking(true);
        let peer_gone = !matches!((&conn.socket).read(&mut probe), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock);
        if !peer_gone && !conn.is_dead() {
            return;
        }
        self.live.remove(&conn.socket.as_raw_fd());
        // No worker serves it again.
        conn.dead.store(true, Ordering::Release);
        self.server.conns.retire(conn.index);
        let _ = conn.socket.shutdown(std::net::Shutdown::Both);
        // Everything it enqueued lies before the tail. The tail is written by clients: put
        // back first if thrown away, never believed more than a lap ahead, and one behind
        // the head (a producer that has not bumped it yet) means nothing is left to drain.
        self.repair_tails();
        let server = &self.server;
        // (A connection always has its group; without one nothing of it can be queued.)
        let tail_at_death = server.group(&conn).map_or(0, |group| {
            let (view, head) = group.queue(conn.index as usize % group.heads.len());
            let (head, queue) = (head.position(), view.queue());
            let lap = u64::from(queue.capacity());
            let ahead = queue.tail_hint().wrapping_sub(head) as i64;
            if ahead <= 0 {
                head
            } else {
                head + (ahead as u64).min(lap)
            }
        });
        self.audit.connection_ended();
        self.dying.push(Dying {
            tail_at_death,
            since: Instant::now(),
            conn,
        });
    }
}

/// Frees a retired connection's blocks once no worker can be touching its requests; whether
/// it did (and the connection's slot is free again).
fn try_reclaim(server: &ServerState, d: &Dying) -> bool {
    let drained = server.group(&d.conn).is_none_or(|group| {
        let head = &group.heads[d.conn.index as usize % group.heads.len()];
        head.position().wrapping_sub(d.tail_at_death) as i64 >= 0
    });
    // Pairs with the workers' Release stores of the head: what they did before moving it
    // (marking themselves BUSY) is visible to the checks below.
    std::sync::atomic::fence(Ordering::Acquire);
    if !(drained
        && server.workers.iter().all(|w| {
            let serving = w.serving.load(Ordering::Acquire);
            serving != BUSY && serving != d.conn.tag && w.held.load(Ordering::Acquire) != BUSY
        })
        && d.since.elapsed() >= RECLAIM_GRACE)
    {
        return false;
    }
    let owned = block_state::owned(d.conn.tag);
    for word in server.words_of(&d.conn) {
        let _ = word.compare_exchange(
            owned,
            block_state::FREE,
            Ordering::Release,
            Ordering::Relaxed,
        );
    }
    server.conns.remove(d.conn.index);
    server.count_connection(-1);
    true
}
