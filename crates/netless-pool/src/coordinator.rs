//! Joining a domain: who hands out the pool, who notices deaths, and who takes over.
//!
//! The first process to join a domain founds it: it creates the pool (a sealed memfd),
//! binds the domain's Unix socket and serves it from a thread. Later processes connect, are
//! checked against the ACL (`SO_PEERCRED`), get a member row and the pool's fd, and keep the
//! socket open: its hang-up is the kernel's notice that the member died, and the coordinator
//! then reaps it (`members`: every page and Ref the member held is released). A joining
//! process checks the coordinator the same way: it must be a process the ACL admits.
//!
//! Every process locks its liveness token in the domain's `members` file before it asks to
//! join, and the coordinator admits it only if it sees that token held: the row is judged by
//! the token from its first moment, by whoever reads it, in any pid namespace.
//!
//! Hand-over: every member's watcher thread blocks on its socket. When the coordinator exits,
//! the sockets close, one member wins the domain's lock file and serves the socket (it already
//! has the pool), and the others reconnect to it. A process that finds no coordinator founds a
//! new pool only if no member holds the domain's shared `members` lock; otherwise it waits for
//! the hand-over. The socket and the lock files are reached through the checked socket
//! directory (`netless_shm::SocketDir`).

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use netless_shm::SocketDir;
use rustix::event::{PollFd, PollFlags};
use rustix::fs::FlockOperation;

use crate::domain::lock;
use crate::layout::{member_state, PoolMap, MAX_MEMBERS};
use crate::members::{
    claim_row, pid_namespace, reap_dead_members, row_alive, token_in_use, Identity, Tokens,
};
use crate::{Domain, DomainConfig, PoolError};

const JOIN_MAGIC: &[u8; 4] = b"NLDJ";
const WELCOME_MAGIC: &[u8; 4] = b"NLDW";
const PROTOCOL: u32 = 2;
const TICK: Duration = Duration::from_millis(250);

/// The files of domain `name` in the socket directory (the names of its entries).
struct Paths {
    dir: SocketDir,
    socket: String,
    lock: String,
    members: String,
}

impl Paths {
    /// The socket's path, for messages.
    fn socket_path(&self) -> PathBuf {
        self.dir.path().join(&self.socket)
    }

    /// Opens (creating) one of the domain's lock files. Readable by others: members of
    /// other uids the ACL admits lock them too.
    fn open(&self, name: &str) -> Result<File, PoolError> {
        Ok(self.dir.open_lock_file(name, 0o644)?)
    }
}

fn paths(config: &DomainConfig) -> Result<Paths, PoolError> {
    // A directory of a uid the ACL admits is as trusted as that uid's coordinator.
    let dir = SocketDir::resolve(config.dir.as_deref(), config.acl.uids())?;
    let stem = format!("netless-domain.{}", config.name);
    // Validates the name, and that the socket's path fits in a socket address.
    netless_shm::service_socket_path(dir.path(), &stem)?;
    Ok(Paths {
        socket: format!("{stem}.sock"),
        lock: format!("{stem}.lock"),
        members: format!("{stem}.members"),
        dir,
    })
}

fn try_flock(file: &File, op: FlockOperation) -> bool {
    rustix::fs::flock(file, op).is_ok()
}

enum Attempt {
    NoCoordinator,
    Joined(UnixStream, Option<OwnedFd>, usize),
}

fn join_err(config: &DomainConfig, reason: String) -> PoolError {
    PoolError::Join {
        name: config.name.clone(),
        reason,
    }
}

/// One try at joining through the socket as `me`; `rejoin` re-registers an existing member.
fn try_connect(
    config: &DomainConfig,
    paths: &Paths,
    me: &Identity,
    rejoin: Option<(u64, usize, u32)>,
) -> Result<Attempt, PoolError> {
    let stream = match paths.dir.connect(&paths.socket) {
        Ok(s) => s,
        Err(e) if netless_shm::nobody_listens(&e) => return Ok(Attempt::NoCoordinator),
        Err(e) => {
            return Err(join_err(
                config,
                format!("connect to {}: {e}", paths.socket_path().display()),
            ))
        }
    };
    // Nothing goes to a coordinator the ACL would not admit as a member.
    let cred = netless_shm::peer_cred(&stream)?;
    if !config.acl.allows(&cred) {
        return Err(join_err(
            config,
            format!(
                "the coordinator at {} runs as uid {} gid {}, which the domain's ACL does not \
                 allow: another user may be impersonating it; nothing was sent",
                paths.socket_path().display(),
                cred.uid,
                cred.gid
            ),
        ));
    }
    let io = |e: std::io::Error| join_err(config, format!("socket set-up: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(io)?;
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .map_err(io)?;
    let mut req = JOIN_MAGIC.to_vec();
    req.extend_from_slice(&PROTOCOL.to_le_bytes());
    let (domain, member, generation) = rejoin.unwrap_or((0, u32::MAX as usize, 0));
    req.extend_from_slice(&domain.to_le_bytes());
    req.extend_from_slice(&(member as u32).to_le_bytes());
    req.extend_from_slice(&generation.to_le_bytes());
    req.extend_from_slice(&me.token.to_le_bytes());
    req.extend_from_slice(&me.pid.to_le_bytes());
    req.extend_from_slice(&me.pid_ns.to_le_bytes());
    let reply = netless_shm::send_frame(&stream, &req, &[])
        .and_then(|()| netless_shm::recv_frame(&stream, 1));
    let (payload, fds) = match reply {
        Ok(r) => r,
        // The coordinator is exiting: treat as absent and retry.
        Err(netless_shm::Error::PeerClosed) => return Ok(Attempt::NoCoordinator),
        Err(e) => {
            return Err(join_err(
                config,
                format!("handshake with the coordinator: {e}"),
            ))
        }
    };
    if payload.len() < 5 || &payload[..4] != WELCOME_MAGIC {
        return Err(join_err(
            config,
            "the coordinator sent a malformed reply".into(),
        ));
    }
    if payload[4] != 0 {
        return Err(join_err(
            config,
            String::from_utf8_lossy(&payload[5..]).into_owned(),
        ));
    }
    if payload.len() != 5 + 16 {
        return Err(join_err(
            config,
            "the coordinator sent a malformed welcome".into(),
        ));
    }
    let member = u32::from_le_bytes(payload[13..17].try_into().expect("4 bytes")) as usize;
    if member >= MAX_MEMBERS {
        return Err(join_err(
            config,
            format!("the coordinator assigned member {member}"),
        ));
    }
    stream.set_read_timeout(None).map_err(io)?;
    Ok(Attempt::Joined(stream, fds.into_iter().next(), member))
}

/// Joins domain `config.name`, founding it if nobody coordinates it.
pub(crate) fn join(config: &DomainConfig) -> Result<Domain, PoolError> {
    config.geometry.validate()?;
    let paths = paths(config)?;
    let members = Arc::new(paths.open(&paths.members)?);
    // Held from before we ask to join until this process leaves (or dies): the open file is
    // shared by the membership and its domain thread, and closes when both are gone.
    let me = Identity::this_process(random_token());
    netless_shm::hold_liveness_token(&members, me.token)?;
    let tokens = Tokens::new(members.clone());
    let deadline = Instant::now() + config.join_timeout;
    loop {
        if let Attempt::Joined(stream, fd, member) = try_connect(config, &paths, &me, None)? {
            let fd = fd.ok_or_else(|| join_err(config, "the coordinator passed no pool".into()))?;
            let map = Arc::new(PoolMap::attach(fd, None)?);
            rustix::fs::flock(&*members, FlockOperation::LockShared)
                .map_err(|e| join_err(config, format!("flock of the members file: {e}")))?;
            let link = Link::start(
                config,
                paths,
                map.clone(),
                &tokens,
                me,
                member,
                Role::Watch(stream),
            );
            return Ok(Domain::from_parts(
                map,
                member,
                config,
                Some(link),
                tokens,
                me.pid_ns,
            ));
        }
        let lock_file = paths.open(&paths.lock)?;
        // With the domain's lock and no member holding the members file, nobody is a member:
        // found the domain. Members alive but no socket: one of them is taking over.
        if try_flock(&lock_file, FlockOperation::NonBlockingLockExclusive)
            && try_flock(&members, FlockOperation::NonBlockingLockExclusive)
        {
            let map = Arc::new(PoolMap::create(config.geometry, random_id())?);
            let (member, _) = claim_row(&map, me, None, &tokens)
                .ok_or_else(|| join_err(config, "cannot claim a member row".into()))?;
            rustix::fs::flock(&*members, FlockOperation::LockShared)
                .map_err(|e| join_err(config, format!("flock of the members file: {e}")))?;
            let listener = bind(&paths).map_err(|e| join_err(config, e))?;
            let role = Role::Coordinate(lock_file, listener);
            let link = Link::start(config, paths, map.clone(), &tokens, me, member, role);
            return Ok(Domain::from_parts(
                map,
                member,
                config,
                Some(link),
                tokens,
                me.pid_ns,
            ));
        }
        drop(lock_file);
        if Instant::now() >= deadline {
            return Err(join_err(
                config,
                format!(
                    "no coordinator answered on {} within {:?} while members are alive: is \
                     a member process hung?",
                    paths.socket_path().display(),
                    config.join_timeout
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn bind(paths: &Paths) -> Result<UnixListener, String> {
    // We hold the domain's lock: any socket file there is a dead coordinator's.
    let socket = paths.socket_path();
    paths
        .dir
        .remove(&paths.socket)
        .map_err(|e| format!("removing {}: {e}", socket.display()))?;
    let listener = paths
        .dir
        .bind(&paths.socket)
        .map_err(|e| format!("bind {}: {e}", socket.display()))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("set_nonblocking: {e}"))?;
    Ok(listener)
}

/// A fresh liveness token: random, so no two processes of a domain pick the same one.
fn random_token() -> u64 {
    (random_id() & netless_shm::MAX_LIVENESS_TOKEN).max(1)
}

fn random_id() -> u64 {
    let mut bytes = [0u8; 8];
    if File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_err()
    {
        let t = Instant::now().elapsed().as_nanos() as u64;
        return t ^ u64::from(std::process::id()) << 32;
    }
    u64::from_le_bytes(bytes)
}

/// What a member's domain thread does.
enum Role {
    /// Watch the coordinator's socket (and take over when it closes).
    Watch(UnixStream),
    /// Coordinate: hold the domain's lock and serve its socket.
    Coordinate(File, UnixListener),
}

/// A member's connection to its domain: the watcher (or coordinator) thread.
pub(crate) struct Link {
    shared: Arc<LinkShared>,
    thread: Option<JoinHandle<()>>,
}

struct LinkShared {
    stop: AtomicBool,
    coordinator: AtomicBool,
    /// The socket the watcher blocks on (shut down to stop it).
    socket: Mutex<Option<UnixStream>>,
    /// Written to stop a coordinator's poll loop.
    wake: OwnedFd,
    wake_rx: OwnedFd,
}

struct Serve {
    config: DomainConfig,
    paths: Paths,
    map: Arc<PoolMap>,
    /// The members file (this process's token is held on it) and the others' tokens.
    tokens: Tokens,
    /// This process, as its row names it.
    me: Identity,
    member: usize,
    generation: u32,
    shared: Arc<LinkShared>,
}

impl Link {
    fn new_shared() -> Arc<LinkShared> {
        let (rx, tx) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .expect("pipe for the domain thread");
        Arc::new(LinkShared {
            stop: AtomicBool::new(false),
            coordinator: AtomicBool::new(false),
            socket: Mutex::new(None),
            wake: tx,
            wake_rx: rx,
        })
    }

    /// Starts the domain thread of `member`: a watcher of the coordinator's socket, or the
    /// coordinator itself.
    fn start(
        config: &DomainConfig,
        paths: Paths,
        map: Arc<PoolMap>,
        tokens: &Tokens,
        me: Identity,
        member: usize,
        role: Role,
    ) -> Link {
        let shared = Self::new_shared();
        let generation = (map.members()[member].state.load(Ordering::Acquire) >> 32) as u32;
        let serve = Serve {
            config: config.clone(),
            paths,
            map,
            tokens: tokens.clone(),
            me,
            member,
            generation,
            shared: shared.clone(),
        };
        let run: Box<dyn FnOnce() + Send> = match role {
            Role::Watch(stream) => {
                *lock(&shared.socket) = stream.try_clone().ok();
                Box::new(move || serve.watch(stream))
            }
            Role::Coordinate(lock_file, listener) => {
                shared.coordinator.store(true, Ordering::Release);
                Box::new(move || serve.coordinate(lock_file, listener))
            }
        };
        let thread = std::thread::Builder::new()
            .name("netless-domain".into())
            .spawn(run)
            .ok();
        Link { shared, thread }
    }

    pub(crate) fn is_coordinator(&self) -> bool {
        self.shared.coordinator.load(Ordering::Acquire)
    }

    pub(crate) fn stop(mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(s) = lock(&self.shared.socket).as_ref() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        let _ = rustix::io::write(&self.shared.wake, &[1]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Serve {
    fn stopping(&self) -> bool {
        self.shared.stop.load(Ordering::Acquire)
    }

    /// A member's thread: wait for the coordinator's socket to close, then rejoin its
    /// successor or become it.
    fn watch(self, mut stream: UnixStream) {
        loop {
            let mut byte = [0u8; 1];
            // The coordinator never writes after the welcome: any return means it is gone
            // (or we are stopping).
            let _ = stream.read(&mut byte);
            if self.stopping() {
                return;
            }
            loop {
                let rejoin = Some((self.map.domain_id(), self.member, self.generation));
                match try_connect(&self.config, &self.paths, &self.me, rejoin) {
                    Ok(Attempt::Joined(s, _, _)) => {
                        *lock(&self.shared.socket) = s.try_clone().ok();
                        stream = s;
                        break;
                    }
                    Ok(Attempt::NoCoordinator) => {}
                    Err(e) => {
                        // Keep trying: a slow or restarting coordinator must not leave this
                        // member unable to take over later.
                        tracing::warn!("netless-pool: rejoining the domain's coordinator: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
                if let Ok(lock_file) = self.paths.open(&self.paths.lock) {
                    if try_flock(&lock_file, FlockOperation::NonBlockingLockExclusive) {
                        match bind(&self.paths) {
                            Ok(listener) => {
                                tracing::info!(
                                    "netless-pool: member {} took over domain `{}`",
                                    self.member,
                                    self.config.name
                                );
                                self.shared.coordinator.store(true, Ordering::Release);
                                return self.coordinate(lock_file, listener);
                            }
                            Err(e) => tracing::warn!("netless-pool: take-over failed: {e}"),
                        }
                    }
                }
                if self.stopping() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }

    /// The coordinator's thread: admit members, reap the dead, until stopped.
    fn coordinate(self, lock_file: File, listener: UnixListener) {
        let mut conns: Vec<(UnixStream, usize)> = Vec::new();
        let mut joins = Joins::new();
        reap_dead_members(&self.map, &self.tokens, Some(self.member));
        let mut last_sweep = Instant::now();
        while !self.stopping() {
            let mut fds = Vec::with_capacity(2 + conns.len());
            fds.push(PollFd::new(&self.shared.wake_rx, PollFlags::IN));
            fds.push(PollFd::new(&listener, PollFlags::IN));
            for (c, _) in &conns {
                fds.push(PollFd::new(c, PollFlags::IN));
            }
            let timeout = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: TICK.as_nanos() as i64,
            };
            if rustix::event::poll(&mut fds, Some(&timeout)).is_err() {
                continue;
            }
            let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
            drop(fds);
            if ready[0] {
                break;
            }
            let mut gone = Vec::new();
            for (i, (c, m)) in conns.iter().enumerate() {
                if ready[2 + i] {
                    let mut byte = [0u8; 1];
                    // Members never write after joining: readable means hung up.
                    if matches!((&*c).read(&mut byte), Ok(0) | Err(_)) {
                        gone.push(i);
                        if !row_alive(&self.map, &self.tokens, *m) {
                            reap_dead_members(&self.map, &self.tokens, Some(self.member));
                        }
                    }
                }
            }
            for i in gone.into_iter().rev() {
                conns.swap_remove(i);
            }
            if ready[1] {
                while let Ok((stream, _)) = listener.accept() {
                    joins.start(&self, stream);
                }
            }
            // Joins end on their own threads; their members are watched from the next turn.
            conns.extend(joins.take_admitted());
            if last_sweep.elapsed() >= TICK {
                last_sweep = Instant::now();
                reap_dead_members(&self.map, &self.tokens, Some(self.member));
            }
        }
        joins.stop();
        drop(joins.take_admitted());
        // Hand over: remove the socket while we hold the lock, then let the lock go.
        let _ = self.paths.dir.remove(&self.paths.socket);
        drop(listener);
        drop(lock_file);
        self.shared.coordinator.store(false, Ordering::Release);
    }
}

/// Most joins in progress at once; a process arriving beyond them is refused at once (and
/// retries, as for any refusal).
const MAX_JOINS: usize = 64;
/// How long one whole join may take, however the joining process paces its bytes.
const JOIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Bytes of a join request: magic, protocol, domain id, member row and generation (to
/// rejoin), liveness token, pid and pid namespace.
const JOIN_LEN: usize = 44;

/// The joins in progress, each on a thread of its own with one deadline, so that a member
/// that sends its request slowly (or not at all) holds up no one else's join, no hang-up and
/// no reaping; and the members they admitted, for the coordinator to watch.
struct Joins {
    /// Each join's thread, and a handle on its socket to cut it short on stop.
    in_flight: Vec<(JoinHandle<()>, UnixStream)>,
    admitted: Arc<Mutex<Vec<(UnixStream, usize)>>>,
}

impl Joins {
    fn new() -> Joins {
        Joins {
            in_flight: Vec::new(),
            admitted: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Starts the join of the process that just connected on `stream`.
    fn start(&mut self, serve: &Serve, stream: UnixStream) {
        self.in_flight.retain(|(thread, _)| !thread.is_finished());
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
        let (config, map, me) = (serve.config.clone(), serve.map.clone(), serve.member);
        let tokens = serve.tokens.clone();
        let admitted = self.admitted.clone();
        let spawned = std::thread::Builder::new()
            .name("netless-pool-join".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                let deadline = Instant::now() + JOIN_TIMEOUT;
                match admit(&config, (&map, &tokens), me, &stream, deadline) {
                    Some(member) => lock(&admitted).push((stream, member)),
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

    /// The members admitted since the last call, with their sockets.
    fn take_admitted(&self) -> Vec<(UnixStream, usize)> {
        std::mem::take(&mut *lock(&self.admitted))
    }

    /// Cuts every join in progress short and waits for their threads.
    fn stop(&mut self) {
        for (_, stream) in &self.in_flight {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        for (thread, _) in self.in_flight.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Tells a joining process why it is refused.
fn refuse(stream: &UnixStream, why: &str, deadline: Instant) -> Option<usize> {
    let mut reply = WELCOME_MAGIC.to_vec();
    reply.push(1);
    reply.extend_from_slice(why.as_bytes());
    let _ = netless_shm::send_frame_by(stream, &reply, &[], deadline);
    None
}

/// Handles one join request, all of it by `deadline`; returns the member row to watch.
/// `me` is the coordinator's own row.
fn admit(
    config: &DomainConfig,
    (map, tokens): (&PoolMap, &Tokens),
    me: usize,
    stream: &UnixStream,
    deadline: Instant,
) -> Option<usize> {
    let _ = stream.set_nonblocking(false);
    let cred = netless_shm::peer_cred(stream).ok()?;
    if !config.acl.allows(&cred) {
        let why = format!(
            "uid {} gid {} is not allowed by the domain's ACL",
            cred.uid, cred.gid
        );
        return refuse(stream, &why, deadline);
    }
    let (req, _) = netless_shm::recv_frame_by(stream, 0, JOIN_LEN, deadline).ok()?;
    if req.len() != JOIN_LEN || &req[..4] != JOIN_MAGIC {
        return refuse(stream, "malformed join request", deadline);
    }
    if u32::from_le_bytes(req[4..8].try_into().ok()?) != PROTOCOL {
        let why = format!("protocol version mismatch (the coordinator speaks {PROTOCOL})");
        return refuse(stream, &why, deadline);
    }
    let domain = u64::from_le_bytes(req[8..16].try_into().ok()?);
    let member = u32::from_le_bytes(req[16..20].try_into().ok()?) as usize;
    let generation = u32::from_le_bytes(req[20..24].try_into().ok()?);
    let who = Identity {
        token: u64::from_le_bytes(req[24..32].try_into().ok()?),
        pid: u32::from_le_bytes(req[32..36].try_into().ok()?),
        pid_ns: u64::from_le_bytes(req[36..44].try_into().ok()?),
    };
    // Its row is judged by its token from the moment it exists: the token must be held, in
    // the file we see, by now.
    if who.token == 0 || who.token > netless_shm::MAX_LIVENESS_TOKEN || !tokens.held(who.token) {
        return refuse(
            stream,
            "the joining process holds no liveness token in the domain's members file we see \
             (is the socket directory the same file system for both?)",
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
    let (member, generation, pass_fd) = if member == u32::MAX as usize {
        if token_in_use(map, who.token) {
            return refuse(stream, "liveness token already in use: retry", deadline);
        }
        match claim_row(map, who, Some(me), tokens) {
            Some((m, g)) => (m, g, true),
            None => {
                let why = format!("the domain is full ({MAX_MEMBERS} members)");
                return refuse(stream, &why, deadline);
            }
        }
    } else {
        let row = map.members().get(member)?;
        let expect = u64::from(generation) << 32 | member_state::ALIVE;
        if domain != map.domain_id()
            || row.state.load(Ordering::Acquire) != expect
            || row.token.load(Ordering::Acquire) != who.token
        {
            return refuse(
                stream,
                "rejoin as a member this domain does not know",
                deadline,
            );
        }
        (member, generation, false)
    };
    let mut reply = WELCOME_MAGIC.to_vec();
    reply.push(0);
    reply.extend_from_slice(&map.domain_id().to_le_bytes());
    reply.extend_from_slice(&(member as u32).to_le_bytes());
    reply.extend_from_slice(&generation.to_le_bytes());
    let fd = map.segment().fd();
    let fds = if pass_fd { vec![fd.as_fd()] } else { vec![] };
    netless_shm::send_frame_by(stream, &reply, &fds, deadline).ok()?;
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_write_timeout(None);
    Some(member)
}
