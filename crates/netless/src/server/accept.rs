//! The acceptor thread: admits clients over the service's Unix socket and watches each
//! connection's socket for the hang-up that says its client died.
//!
//! Admission checks `SO_PEERCRED` against the ACL before anything is read or any fd passed,
//! then runs the handshake (`wire::handshake`): the client's connection segment in, the
//! replica segment out. A hang-up retires the connection at once (no worker serves it
//! again) and, once no worker can still be touching its requests, frees every block that
//! carries its tag. The acceptor never reads a request.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use netless_shm::{peer_cred, recv_frame, send_frame};

use super::conn::{Admitted, Conn};
use super::state::ServerState;
use super::worker::BUSY;
use crate::segment::layout::{block_state, conn_tag};
use crate::segment::ConnSegment;
use crate::status::{Code, Status};
use crate::sync::Ordering;
use crate::wire::handshake::{Frame, PROTOCOL_VERSION};

/// How long a retired connection waits before its blocks are freed, so that a worker which
/// has just dequeued one of its requests has finished looking at it.
const RECLAIM_GRACE: Duration = Duration::from_millis(20);
/// Handshake time limit per connection.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(500);

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
    listener: UnixListener,
    /// Readable once the server stops.
    stop: OwnedFd,
    live: HashMap<RawFd, Arc<Conn>>,
    dying: Vec<Dying>,
    /// Bumped per accepted socket: the generation in a connection's tag.
    generation: u32,
}

impl Acceptor {
    pub(super) fn new(server: Arc<ServerState>, listener: UnixListener, stop: OwnedFd) -> Self {
        Acceptor {
            server,
            listener,
            stop,
            live: HashMap::new(),
            dying: Vec::new(),
            generation: 0,
        }
    }

    /// Admits, watches and reclaims until the server stops; then closes every connection.
    pub(super) fn run(mut self) {
        use rustix::event::{poll, PollFd, PollFlags};
        while !self.server.is_stopping() {
            let conns: Vec<Arc<Conn>> = self.live.values().cloned().collect();
            let mut fds = Vec::with_capacity(conns.len() + 2);
            fds.push(PollFd::new(&self.stop, PollFlags::IN));
            fds.push(PollFd::new(&self.listener, PollFlags::IN));
            for c in &conns {
                fds.push(PollFd::new(&c.socket, PollFlags::IN));
            }
            let timeout = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: if self.dying.is_empty() {
                    200_000_000
                } else {
                    5_000_000
                },
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
            let hung: Vec<Arc<Conn>> = fds[2..]
                .iter()
                .zip(&conns)
                .filter(|(fd, c)| !fd.revents().is_empty() || c.is_dead())
                .map(|(_, c)| c.clone())
                .collect();
            drop(fds);
            for conn in hung {
                self.hang_up(conn);
            }
            if accept_ready {
                while let Ok((socket, _)) = self.listener.accept() {
                    self.generation = self.generation.wrapping_add(1);
                    if let Some(conn) = self.admit(socket) {
                        self.live.insert(conn.socket.as_raw_fd(), conn);
                    }
                }
            }
            let server = &self.server;
            self.dying.retain(|d| !try_reclaim(server, d));
            self.server.update_depth_limit();
        }
        for conn in self.live.values() {
            conn.close(Status::unavailable(format!(
                "service `{}` is shutting down",
                self.server.service
            )));
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
        // The tail is written by clients: never believe it more than a lap ahead.
        let server = &self.server;
        let q = conn.index as usize % server.heads.len();
        let head = server.heads[q].position();
        let queue = server.replica.queues()[q].queue();
        let lap = u64::from(queue.capacity());
        let tail = queue.tail_hint();
        let tail_at_death = if tail.wrapping_sub(head) <= lap {
            tail
        } else {
            head + lap
        };
        self.dying.push(Dying {
            tail_at_death,
            since: Instant::now(),
            conn,
        });
    }

    /// Handshake with a new client; `None` if it was refused or failed.
    fn admit(&self, socket: UnixStream) -> Option<Arc<Conn>> {
        let server = &*self.server;
        let _ = socket.set_nonblocking(false);
        let _ = socket.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
        let _ = socket.set_write_timeout(Some(HANDSHAKE_TIMEOUT));
        let reject = |status: Status| {
            let _ = send_frame(&socket, &Frame::Reject(status).encode(), &[]);
            // Half-close so the client reads the reason before the socket goes away.
            let _ = socket.shutdown(std::net::Shutdown::Write);
            None
        };
        // The ACL is checked before anything is read or any fd is passed.
        let acl = &server.config.acl;
        let peer_pid = match peer_cred(&socket) {
            Ok(cred) if acl.allows(&cred) => cred.pid.max(0) as u32,
            Ok(cred) => {
                return reject(Status::new(
                    Code::PermissionDenied,
                    format!(
                        "uid {} gid {} is not allowed to use service `{}` (its ACL admits uids {:?}, gids {:?})",
                        cred.uid,
                        cred.gid,
                        server.service,
                        acl.uids(),
                        acl.gids()
                    ),
                ))
            }
            Err(e) => return reject(Status::unavailable(format!("cannot read peer credentials: {e}"))),
        };
        let greeting = Frame::Greeting {
            version: PROTOCOL_VERSION,
        };
        send_frame(&socket, &greeting.encode(), &[]).ok()?;
        let (bytes, mut fds) = recv_frame(&socket, 1).ok()?;
        let (client_max, client_domain) = match Frame::decode(&bytes) {
            Some(Frame::Hello {
                version,
                max_message,
                domain,
            }) if version == PROTOCOL_VERSION => (max_message as usize, domain),
            Some(Frame::Hello { version, .. }) => {
                return reject(Status::unavailable(format!(
                    "client speaks netless protocol {version}, server {PROTOCOL_VERSION}"
                )))
            }
            _ => return reject(Status::invalid_argument("malformed handshake")),
        };
        let Some(fd) = fds.pop() else {
            return reject(Status::invalid_argument(
                "the hello carried no connection segment",
            ));
        };
        let (segment, producer) = match ConnSegment::attach(fd) {
            Ok(s) => s,
            Err(e) => return reject(Status::invalid_argument(e)),
        };
        let limit = server
            .replica
            .server_control()
            .max_connections
            .load(Ordering::Relaxed);
        if server.conns.live() >= limit {
            return reject(Status::resource_exhausted(format!(
                "service `{}` admits at most {limit} connections now (its max_connections register)",
                server.service
            )));
        }
        let Some(index) = server.conns.vacant() else {
            return reject(Status::resource_exhausted(format!(
                "service `{}` has its maximum of {} connections",
                server.service, server.config.max_connections
            )));
        };
        let tag = conn_tag(index, self.generation);
        let token = random_token();
        let conn = Arc::new(Conn::new(Admitted {
            index,
            tag,
            token,
            segment,
            producer,
            socket,
            client_max,
            // Refs only from a process the domain itself admitted (checked against the
            // domain's member table, not the id the client claims), and only its own.
            by_ref: client_domain != 0
                && client_domain == server.domain_id()
                && server
                    .config
                    .domain
                    .as_ref()
                    .is_some_and(|d| d.has_member(peer_pid)),
            peer_pid,
        }));
        server.conns.install(&conn);
        // Counted before the client hears it is connected, so stats read after its
        // `connect` returns include it.
        server.count_connection(1);
        let welcome = Frame::Welcome {
            version: PROTOCOL_VERSION,
            conn_index: index,
            tag,
            token,
            domain: server.domain_id(),
        };
        if send_frame(
            &conn.socket,
            &welcome.encode(),
            &[server.replica.segment().fd()],
        )
        .is_err()
        {
            server.conns.remove(index);
            server.count_connection(-1);
            return None;
        }
        let _ = conn.socket.set_read_timeout(None);
        let _ = conn.socket.set_write_timeout(None);
        Some(conn)
    }
}

/// Frees a retired connection's blocks once no worker can be touching its requests; whether
/// it did (and the connection's slot is free again).
fn try_reclaim(server: &ServerState, d: &Dying) -> bool {
    let q = d.conn.index as usize % server.heads.len();
    let drained = server.heads[q].position().wrapping_sub(d.tail_at_death) as i64 >= 0;
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
    for word in server.words_of(d.conn.index) {
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

/// A per-connection secret so a stray or forged queue entry cannot impersonate a connection.
fn random_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut bytes = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_ok()
    {
        return u64::from_le_bytes(bytes);
    }
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish()
}
