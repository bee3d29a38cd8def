//! The coordinator's side of the pool handshake: each join on a thread of its own, checked
//! against the ACL, offered a members file of its own, checked against its liveness token,
//! given a member row and the pool. A member is admitted with one socket at a time: a
//! rejoin of a row whose socket the coordinator still holds is refused, so no member can
//! make it hold more than [`MAX_MEMBERS`] sockets plus the joins in progress. It never
//! watches the members it admitted (the coordinator's thread does).

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::files::Paths;
use super::handshake::{offer, refusal, welcome, Request, JOIN_LEN};
use crate::domain::lock;
use crate::layout::{member_state, PoolMap, MAX_MEMBERS};
use crate::members::{claim_row, pid_namespace, token_in_use, Tokens};
use crate::DomainConfig;

/// Most joins in progress at once; a process arriving beyond them is refused at once (and
/// retries, as for any refusal).
const MAX_JOINS: usize = 64;
/// How long one whole join may take, however the joining process paces its bytes.
const JOIN_TIMEOUT: Duration = Duration::from_secs(2);

/// What every join of one coordinator needs: who may join, where the members file is, the
/// pool, and the coordinator's own row.
pub(super) struct Admission {
    pub(super) config: DomainConfig,
    pub(super) paths: Arc<Paths>,
    pub(super) map: Arc<PoolMap>,
    pub(super) tokens: Tokens,
    pub(super) me: usize,
    pub(super) watched: Watched,
}

/// The generation of each member row whose socket the coordinator holds, or is handing a
/// welcome on: the one socket of that member it watches.
pub(super) struct Watched(Mutex<[Option<u32>; MAX_MEMBERS]>);

impl Watched {
    pub(super) fn new() -> Watched {
        Watched(Mutex::new([None; MAX_MEMBERS]))
    }

    /// Takes row `member` of `generation` for a rejoin; false if a socket of it is watched.
    fn claim(&self, member: usize, generation: u32) -> bool {
        let mut rows = lock(&self.0);
        if rows[member] == Some(generation) {
            return false;
        }
        rows[member] = Some(generation);
        true
    }

    /// Row `member` is a new member's, of `generation`: any socket of the row's earlier
    /// members is stale (the coordinator closes it when it takes the new one).
    fn replace(&self, member: usize, generation: u32) {
        lock(&self.0)[member] = Some(generation);
    }

    /// The socket of row `member` of `generation` is gone (or was never handed over).
    pub(super) fn release(&self, member: usize, generation: u32) {
        let mut rows = lock(&self.0);
        if rows[member] == Some(generation) {
            rows[member] = None;
        }
    }
}

/// A member's socket, which the coordinator watches for its hang-up.
pub(super) struct Conn {
    pub(super) stream: UnixStream,
    pub(super) member: usize,
    /// The row's generation when the member was admitted: a hang-up concerns that one only.
    pub(super) generation: u32,
}

/// The joins in progress, each on a thread of its own with one deadline, so that a member
/// that sends its request slowly (or not at all) holds up no one else's join, no hang-up and
/// no reaping; and the members they admitted, for the coordinator to watch.
pub(super) struct Joins {
    /// Each join's thread, and a handle on its socket to cut it short on stop.
    in_flight: Vec<(JoinHandle<()>, UnixStream)>,
    admitted: Arc<Mutex<Vec<Conn>>>,
}

impl Joins {
    pub(super) fn new() -> Joins {
        Joins {
            in_flight: Vec::new(),
            admitted: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Starts the join of the process that just connected on `stream`.
    pub(super) fn start(&mut self, admission: &Arc<Admission>, stream: UnixStream) {
        self.prune();
        if self.in_flight.len() >= MAX_JOINS {
            refuse(
                &stream,
                "the coordinator is busy admitting members: retry",
                Instant::now() + Duration::from_millis(20),
            );
            return;
        }
        let Ok(handle) = stream.try_clone() else {
            return;
        };
        let admission = admission.clone();
        let admitted = self.admitted.clone();
        let spawned = std::thread::Builder::new()
            .name("netless-pool-join".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                let deadline = Instant::now() + JOIN_TIMEOUT;
                match admission.admit(&stream, deadline) {
                    Some((member, generation)) => lock(&admitted).push(Conn {
                        stream,
                        member,
                        generation,
                    }),
                    // Shut down, not just closed: the coordinator holds a second handle.
                    None => {
                        let _ = stream.shutdown(std::net::Shutdown::Both);
                    }
                }
            });
        match spawned {
            Ok(thread) => self.in_flight.push((thread, handle)),
            Err(e) => tracing::warn!("netless-pool: cannot spawn a join thread: {e}"),
        }
    }

    /// Forgets the joins that ended (and the handles on their sockets).
    pub(super) fn prune(&mut self) {
        self.in_flight.retain(|(thread, _)| !thread.is_finished());
    }

    /// The members admitted since the last call, with their sockets.
    pub(super) fn take_admitted(&self) -> Vec<Conn> {
        std::mem::take(&mut *lock(&self.admitted))
    }

    /// Cuts every join in progress short and waits for their threads.
    pub(super) fn stop(&mut self) {
        for (_, stream) in &self.in_flight {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        for (thread, _) in self.in_flight.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Tells a joining process why it is refused.
fn refuse(stream: &UnixStream, why: &str, deadline: Instant) -> Option<(usize, u32)> {
    let _ = netless_shm::send_frame_by(stream, &refusal(why), &[], deadline);
    None
}

impl Admission {
    /// Handles one join, all of it by `deadline`; returns the member row to watch and its
    /// generation.
    fn admit(&self, stream: &UnixStream, deadline: Instant) -> Option<(usize, u32)> {
        let (map, tokens) = (&*self.map, &self.tokens);
        let _ = stream.set_nonblocking(false);
        let cred = netless_shm::peer_cred(stream).ok()?;
        if !self.config.acl.allows(&cred) {
            let why = format!(
                "uid {} gid {} is not allowed by the domain's ACL",
                cred.uid, cred.gid
            );
            return refuse(stream, &why, deadline);
        }
        // A new open file of the members file, for this process alone: the token it holds
        // there is its own, gone when it is. Its uid may not open the file itself.
        let members = match self.paths.open_members() {
            Ok(Some(file)) => file,
            Ok(None) => {
                return refuse(
                    stream,
                    "the coordinator cannot open the members file",
                    deadline,
                )
            }
            Err(e) => {
                tracing::warn!("netless-pool: opening the members file for a joiner: {e}");
                return refuse(stream, &e.to_string(), deadline);
            }
        };
        netless_shm::send_frame_by(stream, &offer(), &[members.as_fd()], deadline).ok()?;
        // Our copy goes at once: the open file must be the joiner's alone.
        drop(members);
        let (req, _) = netless_shm::recv_frame_by(stream, 0, JOIN_LEN, deadline).ok()?;
        let Request { rejoin, who } = match Request::decode(&req) {
            Ok(request) => request,
            Err(why) => return refuse(stream, &why, deadline),
        };
        // Its row is judged by its token from the moment it exists: the token must be held,
        // in the file we see, by now.
        if who.token == 0 || who.token > netless_shm::MAX_LIVENESS_TOKEN || !tokens.held(who.token)
        {
            return refuse(
                stream,
                "the joining process holds no liveness token in the domain's members file we \
                 see (is the socket directory the same file system for both?)",
                deadline,
            );
        }
        // What the kernel says of a process of our own pid namespace beats what it claims.
        let ours = pid_namespace();
        if who.pid_ns == ours && ours != 0 && i64::from(who.pid) != i64::from(cred.pid) {
            let why = format!(
                "the joining process says it is pid {}, its socket says pid {}",
                who.pid, cred.pid
            );
            return refuse(stream, &why, deadline);
        }
        let (member, generation, pass_fd) = match rejoin {
            None => {
                if token_in_use(map, who.token) {
                    return refuse(stream, "liveness token already in use: retry", deadline);
                }
                match claim_row(map, who, Some(self.me), tokens) {
                    Some((m, g)) => {
                        self.watched.replace(m, g);
                        (m, g, true)
                    }
                    None => {
                        let why = format!("the domain is full ({MAX_MEMBERS} members)");
                        return refuse(stream, &why, deadline);
                    }
                }
            }
            Some((domain, member, generation)) => {
                let row = map.members().get(member)?;
                let expect = u64::from(generation) << 32 | member_state::ALIVE;
                if domain != map.domain_id()
                    || row.state.load(Ordering::Acquire) != expect
                    || row.token.load(Ordering::Acquire) != who.token
                    || row.pid.load(Ordering::Acquire) != who.pid
                    || row.pid_ns.load(Ordering::Acquire) != who.pid_ns
                {
                    return refuse(
                        stream,
                        "rejoin as a member this domain does not know",
                        deadline,
                    );
                }
                // A member rejoins once its socket closed: its coordinator went away.
                if !self.watched.claim(member, generation) {
                    let why = format!(
                        "member {member} is connected to this coordinator already: a member \
                         rejoins only once its coordinator went away"
                    );
                    return refuse(stream, &why, deadline);
                }
                (member, generation, false)
            }
        };
        let reply = welcome(map.domain_id(), member, generation);
        let fd = map.segment().fd();
        let fds = if pass_fd { vec![fd.as_fd()] } else { vec![] };
        if netless_shm::send_frame_by(stream, &reply, &fds, deadline).is_err() {
            self.watched.release(member, generation);
            return None;
        }
        let _ = stream.set_read_timeout(None);
        let _ = stream.set_write_timeout(None);
        Some((member, generation))
    }
}
