//! The server's half of the handshake with one client, on a thread of its own with one
//! deadline for the whole exchange, so that a client that sends its bytes slowly (or not at
//! all) holds up no one else's admission, no hang-up and no reclaiming.
//!
//! `SO_PEERCRED` is checked against the ACL before anything is read or any fd is passed;
//! then `Greeting` out, `Hello` with the client's connection segment (and a member's proof
//! of its page-pool membership, checked here) in, a slot in the
//! connection table, and `Welcome` out with the replica segment of the client's trust group
//! (its uid's, made now if it is the first) and the read-only control segment
//! (`wire::handshake`). The acceptor starts at most [`MAX_HANDSHAKES`] at once and refuses
//! the rest at once.

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use netless_shm::{peer_cred, recv_frame_by, send_frame_by};

use super::conn::{lock, Admitted, Conn};
use super::state::ServerState;
use crate::config::Dispatch;
use crate::segment::layout::conn_tag;
use crate::segment::ConnSegment;
use crate::status::{Code, Status};
use crate::sync::Ordering;
use crate::wire::handshake::{Frame, MAX_HELLO_READ, NO_CPU, NO_MEMBER, PROTOCOL_VERSION};
use netless_pool::MemberClaim;

/// Most handshakes in progress at once; a client arriving beyond them is refused at once
/// with `RESOURCE_EXHAUSTED` (and may retry).
pub(super) const MAX_HANDSHAKES: usize = 128;
/// Most of them one uid but the server's own may have in progress: a user that opens
/// connections and sends nothing leaves room for the others.
pub(super) const MAX_HANDSHAKES_PER_UID: usize = MAX_HANDSHAKES / 4;
/// How long one whole handshake may take, however the client paces its bytes.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// A handshake thread's stack: it only encodes and decodes a few small frames.
const HANDSHAKE_STACK: usize = 256 * 1024;
/// How long a refusal may take to send when the server is too busy to handshake.
const BUSY_REFUSAL: Duration = Duration::from_millis(20);

/// The connections handshakes admitted, for the acceptor to watch, and the eventfd that
/// tells it some arrived.
pub(super) struct Inbox {
    admitted: Mutex<Vec<Arc<Conn>>>,
    wake: OwnedFd,
}

impl Inbox {
    /// Hands an admitted connection to the acceptor, and wakes it.
    pub(super) fn deliver(&self, conn: Arc<Conn>) {
        lock(&self.admitted).push(conn);
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }
}

/// The handshakes in progress.
pub(super) struct Handshakes {
    /// Each handshake's thread, a handle on its socket to cut it short when the server
    /// stops, and the peer's uid.
    in_flight: Vec<(JoinHandle<()>, UnixStream, u32)>,
    inbox: Arc<Inbox>,
}

impl Handshakes {
    pub(super) fn new() -> Result<Handshakes, Status> {
        let wake = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(|e| Status::resource_exhausted(format!("eventfd: {e}")))?;
        Ok(Handshakes {
            in_flight: Vec::new(),
            inbox: Arc::new(Inbox {
                admitted: Mutex::new(Vec::new()),
                wake,
            }),
        })
    }

    /// Readable when a handshake admitted a connection.
    pub(super) fn wake_fd(&self) -> BorrowedFd<'_> {
        self.inbox.wake.as_fd()
    }

    /// Starts the handshake with a client that just connected (its connection's tag takes
    /// `generation`), or refuses it at once if [`MAX_HANDSHAKES`] are in progress.
    pub(super) fn start(&mut self, server: &Arc<ServerState>, socket: UnixStream, generation: u32) {
        self.in_flight
            .retain(|(thread, _, _)| !thread.is_finished());
        // Read without waiting: the kernel recorded them at connect.
        let uid = peer_cred(&socket).map_or(u32::MAX, |c| c.uid);
        let busy = if self.in_flight.len() >= MAX_HANDSHAKES {
            Some(format!("is admitting {MAX_HANDSHAKES} clients already"))
        } else if uid != server.owner_uid
            && self.in_flight.iter().filter(|h| h.2 == uid).count() >= MAX_HANDSHAKES_PER_UID
        {
            Some(format!(
                "is admitting {MAX_HANDSHAKES_PER_UID} clients of uid {uid} already, the most \
                 it admits at once for one user"
            ))
        } else {
            None
        };
        if let Some(why) = busy {
            let status =
                Status::resource_exhausted(format!("service `{}` {why}: retry", server.service));
            refuse(&socket, status, Instant::now() + BUSY_REFUSAL);
            return;
        }
        let Ok(handle) = socket.try_clone() else {
            return;
        };
        let (server, inbox) = (server.clone(), self.inbox.clone());
        let spawned = thread::Builder::new()
            .name("netless-handshake".into())
            .stack_size(HANDSHAKE_STACK)
            .spawn(move || {
                let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
                if let Some(conn) = admit(&server, socket, generation, deadline) {
                    inbox.deliver(conn);
                }
            });
        match spawned {
            Ok(thread) => self.in_flight.push((thread, handle, uid)),
            Err(e) => tracing::warn!("netless: cannot spawn a handshake thread: {e}"),
        }
    }

    /// The connections admitted since the last call.
    /// Where connections admitted elsewhere (through a fabric) are handed in.
    pub(super) fn inbox(&self) -> Arc<Inbox> {
        self.inbox.clone()
    }

    pub(super) fn take_admitted(&self) -> Vec<Arc<Conn>> {
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(&self.inbox.wake, &mut counter);
        std::mem::take(&mut *lock(&self.inbox.admitted))
    }

    /// Cuts every handshake in progress short and waits for their threads.
    pub(super) fn stop(&mut self) {
        for (_, socket, _) in &self.in_flight {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
        for (thread, _, _) in self.in_flight.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Sends `status` as the reason a client is refused, then half-closes so it reads it.
fn refuse(socket: &UnixStream, status: Status, deadline: Instant) -> Option<Arc<Conn>> {
    let _ = send_frame_by(socket, &Frame::Reject(status).encode(), &[], deadline);
    let _ = socket.shutdown(std::net::Shutdown::Write);
    None
}

/// A client's socket during its handshake: shut down if the handshake does not admit it
/// (closing it is not enough: the acceptor holds a second handle, to cut it short).
struct Handshaking(Option<UnixStream>);

impl Drop for Handshaking {
    fn drop(&mut self) {
        if let Some(socket) = &self.0 {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// The handshake with a new client, all of it by `deadline`; its connection, installed in
/// the table, or `None` if it was refused or failed.
fn admit(
    server: &ServerState,
    socket: UnixStream,
    generation: u32,
    deadline: Instant,
) -> Option<Arc<Conn>> {
    let mut handshaking = Handshaking(Some(socket));
    let socket = handshaking.0.as_ref()?;
    let _ = socket.set_nonblocking(false);
    // The ACL is checked before anything is read or any fd is passed.
    let acl = &server.config.acl;
    let uid = match peer_cred(socket) {
        Ok(cred) if acl.allows(&cred) => cred.uid,
        Ok(cred) => {
            // Who else is admitted is the owner's business: the log says, the peer does not.
            tracing::info!(
                "netless: service `{}` refused uid {} gid {} (its ACL admits uids {:?}, gids {:?})",
                server.service,
                cred.uid,
                cred.gid,
                acl.uids(),
                acl.gids()
            );
            let status = Status::new(
                Code::PermissionDenied,
                format!(
                    "uid {} gid {} is not allowed to use service `{}`: ask its owner to admit \
                     your uid or a group of yours (ServerConfig::acl)",
                    cred.uid, cred.gid, server.service,
                ),
            );
            return refuse(socket, status, deadline);
        }
        Err(e) => {
            let status = Status::unavailable(format!("cannot read peer credentials: {e}"));
            return refuse(socket, status, deadline);
        }
    };
    let greeting = Frame::Greeting {
        version: PROTOCOL_VERSION,
    };
    send_frame_by(socket, &greeting.encode(), &[], deadline).ok()?;
    let (bytes, fds) = recv_frame_by(socket, 2, MAX_HELLO_READ, deadline).ok()?;
    // A client of another protocol may send a hello of another length: its version first.
    if let Some(version) = Frame::hello_version(&bytes).filter(|&v| v != PROTOCOL_VERSION) {
        let status = Status::unavailable(format!(
            "client speaks netless protocol {version}, server {PROTOCOL_VERSION}: use the same \
             netless release on both sides"
        ));
        return refuse(socket, status, deadline);
    }
    let (client_max, client_domain, claim, cpu) = match Frame::decode(&bytes) {
        Some(Frame::Hello {
            max_message,
            domain,
            member,
            generation,
            cpu,
            ..
        }) => (
            max_message as usize,
            domain,
            (member != NO_MEMBER).then_some(MemberClaim { member, generation }),
            (cpu != NO_CPU).then_some(cpu),
        ),
        _ => {
            return refuse(
                socket,
                Status::invalid_argument("malformed handshake"),
                deadline,
            )
        }
    };
    let mut fds = fds.into_iter();
    let Some(fd) = fds.next() else {
        let status = Status::invalid_argument("the hello carried no connection segment");
        return refuse(socket, status, deadline);
    };
    // Refs only from a process that proves it is the member it claims to be (the open file
    // its liveness token is held on, checked and closed here), and only its own Refs.
    let peer_member = match (&server.config.domain, claim, fds.next()) {
        (Some(domain), Some(claim), Some(file)) if client_domain == server.domain_id() => {
            domain.verify_member(claim, file)
        }
        _ => None,
    };
    let (segment, producer) = match ConnSegment::attach(fd, server.config.max_client_ring) {
        Ok(s) => s,
        Err(e) => return refuse(socket, Status::invalid_argument(e), deadline),
    };
    let socket = handshaking.0.take()?;
    let newcomer = Newcomer {
        uid,
        segment,
        producer,
        client_max,
        peer_member,
        generation,
        cpu,
    };
    let conn = match install(server, newcomer, &socket) {
        Ok(conn) => conn,
        Err(status) => return refuse(&socket, status, deadline),
    };
    let welcome = Frame::Welcome {
        version: PROTOCOL_VERSION,
        conn_index: conn.index,
        tag: conn.tag,
        token: conn.token,
        domain: server.domain_id(),
        by_ref: conn.peer_member.is_some(),
    };
    let sent = match (server.group(&conn), server.control.fd()) {
        (Some(group), Some(control)) => {
            // Put back what a faulty member of the group may have overwritten.
            group.replica.restore_headers();
            let fds = [group.replica.segment().fd(), control];
            send_frame_by(&conn.socket, &welcome.encode(), &fds, deadline).is_ok()
        }
        _ => false,
    };
    if !sent {
        server.conns.remove(conn.index);
        server.count_connection(-1);
        let _ = conn.socket.shutdown(std::net::Shutdown::Both);
        return None;
    }
    let _ = conn.socket.set_read_timeout(None);
    let _ = conn.socket.set_write_timeout(None);
    Some(conn)
}

/// What a handshake learnt of a client it is about to admit.
pub(super) struct Newcomer {
    pub(super) uid: u32,
    pub(super) segment: ConnSegment,
    pub(super) producer: netless_ring::Producer<'static>,
    pub(super) client_max: usize,
    /// The pool member the client proved it is, if it did: Refs are taken from it alone.
    pub(super) peer_member: Option<netless_pool::PeerMember>,
    pub(super) generation: u32,
    /// The CPU the client said its calls come from, if it did.
    pub(super) cpu: Option<u32>,
}

/// Admits `n` if the limits allow: a slot in the connection table, in its uid's trust group,
/// watched through `socket`; the status to refuse it with otherwise.
pub(super) fn install(
    server: &ServerState,
    n: Newcomer,
    socket: &UnixStream,
) -> Result<Arc<Conn>, Status> {
    if server.is_stopping() {
        return Err(Status::unavailable(format!(
            "service `{}` is shutting down",
            server.service
        )));
    }
    let conn = {
        // One admission at a time takes a slot: the count, the vacant slot and the install
        // must agree.
        let _admitting = lock(&server.admitting);
        let limit = server
            .server_control()
            .max_connections
            .load(Ordering::Relaxed);
        if server.conns.live() >= limit {
            let status = Status::resource_exhausted(format!(
                "service `{}` admits at most {limit} connections now (its max_connections register)",
                server.service
            ));
            return Err(status);
        }
        if n.uid != server.owner_uid {
            let most = server.config.per_uid_connections();
            if server.conns.live_of(n.uid) >= most {
                let status = Status::resource_exhausted(format!(
                    "uid {} holds {most} connections to service `{}`, the most one user \
                     other than its owner may (ServerConfig::max_connections_per_uid): close \
                     some, or retry later",
                    n.uid, server.service
                ));
                return Err(status);
            }
        }
        let Some(index) = server.conns.vacant(home_queue(server, n.cpu)) else {
            let status = Status::resource_exhausted(format!(
                "service `{}` has its maximum of {} connections",
                server.service, server.config.max_connections
            ));
            return Err(status);
        };
        // Clients of another uid never share a writable segment with this one.
        let group = server.group_of(n.uid)?;
        let conn = Arc::new(Conn::new(Admitted {
            index,
            group: group.index,
            uid: n.uid,
            tag: conn_tag(index, n.generation),
            token: random_token(),
            segment: n.segment,
            producer: n.producer,
            socket: socket.try_clone().map_err(|e| {
                Status::resource_exhausted(format!("cannot keep the client's socket: {e}"))
            })?,
            client_max: n.client_max,
            peer_member: n.peer_member,
        }));
        server.conns.install(&conn);
        // Counted before the client hears it is connected, so stats read after its
        // `connect` returns include it.
        server.count_connection(1);
        conn
    };
    Ok(conn)
}

/// Where a new connection from a client on `cpu` belongs, as (queue, queues): with
/// [`Dispatch::CpuLocal`], the queue of the worker pinned to that CPU (of several, the
/// one serving the fewest connections), which a connection whose index is the queue
/// modulo the queues goes to. `None`: anywhere (no hint, another dispatch, or no worker
/// of ours runs on that CPU).
fn home_queue(server: &ServerState, cpu: Option<u32>) -> Option<(u32, u32)> {
    let config = &server.config;
    let queues = server.spec.nqueues;
    if config.dispatch != Dispatch::CpuLocal || queues < 2 || config.pin_cpus.is_empty() {
        return None;
    }
    let cpu = usize::try_from(cpu?).ok()?;
    (0..config.workers)
        .filter(|w| config.pin_cpus[w % config.pin_cpus.len()] == cpu)
        .map(|w| (w as u32 % queues, queues))
        .min_by_key(|&home| server.conns.live_at(home))
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
