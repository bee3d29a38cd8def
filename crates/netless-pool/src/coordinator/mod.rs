//! Joining a domain: who hands out the pool, who notices deaths, and who takes over.
//!
//! The first process to join a domain founds it: it creates the pool (a sealed memfd),
//! binds the domain's Unix socket and serves it from a thread. Later processes connect, are
//! checked against the ACL (`SO_PEERCRED`), get a member row and the pool's fd, and keep the
//! socket open: its hang-up is the kernel's notice that the member died, and the coordinator
//! then reaps it (`members`: every page and Ref the member held is released). A joining
//! process checks the coordinator the same way: it must be a process the ACL admits.
//!
//! Every process holds its liveness token in the domain's `members` file before it asks to
//! join, and the coordinator admits it only if it sees that token held: the row is judged by
//! the token from its first moment, by whoever reads it, in any pid namespace. A joiner holds
//! it on a new open file of the members file that the coordinator passes it once the ACL
//! admitted it (`files`: the domain's files are their owner's alone).
//!
//! Hand-over: every member's watcher thread blocks on its socket. When the coordinator exits,
//! the sockets close, one member wins the domain's lock file and serves the socket (it already
//! has the pool), and the others reconnect to it. A process that finds no coordinator founds a
//! new pool only if no member holds the domain's shared `members` lock; otherwise it waits for
//! the hand-over. Only processes that may open the domain's files (its socket directory's
//! owner, root) found a domain or take one over.

use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::fs::FlockOperation;

use crate::domain::lock;
use crate::layout::PoolMap;
use crate::members::{claim_row, reap_dead_members, reap_hung_up, Identity, Tokens};
use crate::{Domain, DomainConfig, PoolError};

mod admit;
mod files;
pub(crate) mod handshake;

use admit::{Admission, Conn, Joins, Watched};
use files::{paths, try_flock, Paths};
use handshake::{join_err, try_connect, Attempt, Joined};

const TICK: Duration = Duration::from_millis(250);
/// How long a member waits for a new coordinator before it warns that someone holds the
/// domain's lock without serving it.
const LOST_WARNING: Duration = Duration::from_secs(10);

/// Joins domain `config.name`, founding it if nobody coordinates it.
pub(crate) fn join(config: &DomainConfig) -> Result<Domain, PoolError> {
    config.geometry.validate()?;
    let paths = paths(config)?;
    // Held from before we ask to join until this process leaves (or dies), on the members
    // file the coordinator offers, or our own if we found the domain.
    let me = Identity::this_process(random_token());
    let deadline = Instant::now() + config.join_timeout;
    loop {
        let attempt = try_connect(config, &paths, &me, (None, None), deadline, &|_| true)?;
        if let Attempt::Joined(joined) = attempt {
            return become_member(config, paths, me, joined, deadline);
        }
        let not_founded = match found(config, &paths, me)? {
            Ok(Founded {
                map,
                row,
                tokens,
                lock_file,
            }) => {
                let listener = paths.bind(&config.acl).map_err(|e| join_err(config, e))?;
                let role = Role::Coordinate(lock_file, listener);
                let link = Link::start(config, paths, map.clone(), &tokens, me, row, role);
                return Ok(Domain::from_parts(
                    map,
                    row.0,
                    config,
                    Some(link),
                    tokens,
                    me.pid_ns,
                ));
            }
            Err(not_founded) => not_founded,
        };
        if Instant::now() >= deadline {
            return Err(join_err(config, not_founded.why(config, &paths)));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Takes the membership the coordinator welcomed us to.
fn become_member(
    config: &DomainConfig,
    paths: Paths,
    me: Identity,
    joined: Joined,
    deadline: Instant,
) -> Result<Domain, PoolError> {
    let members = joined
        .members
        .ok_or_else(|| join_err(config, "the coordinator offered no members file".into()))?;
    let fd = joined
        .pool
        .ok_or_else(|| join_err(config, "the coordinator passed no pool".into()))?;
    let map = Arc::new(PoolMap::attach(fd, None)?);
    // Shared with every member, so that nobody founds a new pool while we live. Only a
    // founder holds it exclusively, and for a moment: anyone longer is interfering.
    while !try_flock(&members, FlockOperation::NonBlockingLockShared) {
        if Instant::now() >= deadline {
            return Err(join_err(
                config,
                "a process holds the domain's members file locked exclusively: a member \
                 interfering?"
                    .into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let tokens = Tokens::new(Arc::new(members));
    let row = (joined.member, joined.generation);
    let role = Role::Watch(joined.stream);
    let link = Link::start(config, paths, map.clone(), &tokens, me, row, role);
    Ok(Domain::from_parts(
        map,
        row.0,
        config,
        Some(link),
        tokens,
        me.pid_ns,
    ))
}

/// A domain this process just founded: it holds the domain's lock and coordinates.
struct Founded {
    map: Arc<PoolMap>,
    /// Our member row and its generation.
    row: (usize, u32),
    /// The members file, our token held on it.
    tokens: Tokens,
    lock_file: File,
}

/// Why a process that found no coordinator did not found the domain.
enum NotFounded {
    /// It may not open the domain's files.
    NotOurs,
    /// Someone holds the domain's lock: a member taking over (or a process interfering).
    LockHeld,
    /// Members hold the members file: one of them will take over.
    MembersAlive,
}

impl NotFounded {
    /// Why nobody answered and we did not found the domain, for the caller.
    fn why(&self, config: &DomainConfig, paths: &Paths) -> String {
        let socket = paths.socket_path();
        let (socket, timeout) = (socket.display(), config.join_timeout);
        let owner = paths.dir.owner();
        match self {
            NotFounded::NotOurs => format!(
                "no coordinator answered on {socket} within {timeout:?}, and this process (uid \
                 {}) may not found the domain: only processes of uid {owner} (the socket \
                 directory's owner) or root can; start one of them first",
                rustix::process::geteuid().as_raw(),
            ),
            NotFounded::LockHeld => format!(
                "no coordinator answered on {socket} within {timeout:?}, and a process holds the \
                 domain's lock {} without serving it: a member taking over, or a hung one \
                 (only processes of uid {owner} or root can open it)",
                paths.lock_path().display(),
            ),
            NotFounded::MembersAlive => format!(
                "no coordinator answered on {socket} within {timeout:?} while members are \
                 alive: is a member process hung?"
            ),
        }
    }
}

/// Founds the domain if nobody is a member of it: with the domain's lock and no member
/// holding the members file, nobody is.
fn found(
    config: &DomainConfig,
    paths: &Paths,
    me: Identity,
) -> Result<Result<Founded, NotFounded>, PoolError> {
    let (Some(lock_file), Some(members)) = (paths.open_lock()?, paths.open_members()?) else {
        return Ok(Err(NotFounded::NotOurs));
    };
    if !try_flock(&lock_file, FlockOperation::NonBlockingLockExclusive) {
        return Ok(Err(NotFounded::LockHeld));
    }
    if !try_flock(&members, FlockOperation::NonBlockingLockExclusive) {
        return Ok(Err(NotFounded::MembersAlive));
    }
    // Shared from now on, as every member holds it. Not atomic (flock drops the exclusive
    // lock first), but nobody else can found the domain while we hold its lock.
    if !try_flock(&members, FlockOperation::NonBlockingLockShared) {
        return Err(join_err(
            config,
            "a process took the domain's members file as we founded the domain".into(),
        ));
    }
    netless_shm::hold_liveness_token(&members, me.token)?;
    let tokens = Tokens::new(Arc::new(members));
    let map = Arc::new(PoolMap::create(config.geometry, random_id())?);
    let row = claim_row(&map, me, None, &tokens)
        .ok_or_else(|| join_err(config, "cannot claim a member row".into()))?;
    Ok(Ok(Founded {
        map,
        row,
        tokens,
        lock_file,
    }))
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

/// Blocks until the coordinator's end of `stream` closes (or we shut ours down to stop): the
/// coordinator never writes after its welcome. A signal interrupting the read is no hang-up.
fn wait_for_hang_up(mut stream: &UnixStream) {
    let mut byte = [0u8; 1];
    while let Err(e) = stream.read(&mut byte) {
        if e.kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// What a member's domain thread does.
enum Role {
    /// Watch the coordinator's socket (and take over when it closes).
    Watch(UnixStream),
    /// Coordinate: hold the domain's lock and serve its socket.
    Coordinate(File, UnixListener),
}

/// What a member whose coordinator went away became.
enum Rejoined {
    /// A member again, watching this socket to its new coordinator.
    Member(UnixStream),
    /// The coordinator: it holds the domain's lock and listens on its socket.
    Coordinator(File, UnixListener),
    /// Nothing: the membership is ending.
    Stopped,
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
    paths: Arc<Paths>,
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
        (member, generation): (usize, u32),
        role: Role,
    ) -> Link {
        let shared = Self::new_shared();
        let serve = Serve {
            config: config.clone(),
            paths: Arc::new(paths),
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
            wait_for_hang_up(&stream);
            if self.stopping() {
                return;
            }
            // Closed on our side too before we rejoin: a coordinator watches one socket per
            // member, and refuses a rejoin while it still holds one.
            let _ = stream.shutdown(std::net::Shutdown::Both);
            match self.rejoin() {
                Rejoined::Member(joined) => stream = joined,
                Rejoined::Coordinator(lock_file, listener) => {
                    tracing::info!(
                        "netless-pool: member {} took over domain `{}`",
                        self.member,
                        self.config.name
                    );
                    self.shared.coordinator.store(true, Ordering::Release);
                    return self.coordinate(lock_file, listener);
                }
                Rejoined::Stopped => return,
            }
        }
    }

    /// Rejoins the domain's next coordinator, or becomes it, unless stopped first. Each try at
    /// joining has a deadline, and the socket of the one in progress is where `Link::stop`
    /// finds it.
    fn rejoin(&self) -> Rejoined {
        let lost = Instant::now();
        let mut warned = false;
        let publish = |s: &UnixStream| {
            *lock(&self.shared.socket) = s.try_clone().ok();
            // Checked after publishing: a stop that came first is seen here, one that comes
            // later shuts this socket down.
            !self.stopping()
        };
        loop {
            let ask = (
                Some((self.map.domain_id(), self.member, self.generation)),
                self.tokens.file(),
            );
            let deadline = Instant::now() + self.config.join_timeout;
            match try_connect(&self.config, &self.paths, &self.me, ask, deadline, &publish) {
                Ok(Attempt::Joined(joined)) => return Rejoined::Member(joined.stream),
                Ok(Attempt::NoCoordinator) => {}
                Err(_) if self.stopping() => return Rejoined::Stopped,
                Err(e) => {
                    // Keep trying: a slow or restarting coordinator must not leave this
                    // member unable to take over later.
                    tracing::warn!("netless-pool: rejoining the domain's coordinator: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            // Only a process that may open the domain's files takes it over; the others wait
            // for one that may.
            let pause = match self.paths.open_lock() {
                Ok(Some(lock_file)) => {
                    if try_flock(&lock_file, FlockOperation::NonBlockingLockExclusive) {
                        match self.paths.bind(&self.config.acl) {
                            Ok(listener) => return Rejoined::Coordinator(lock_file, listener),
                            Err(e) => tracing::warn!("netless-pool: take-over failed: {e}"),
                        }
                    } else if !warned && lost.elapsed() >= LOST_WARNING {
                        warned = true;
                        tracing::warn!(
                            "netless-pool: domain `{}` has had no coordinator for {:?}, and a \
                             process holds its lock {} without serving it (only processes of \
                             uid {} or root can open it): this member keeps trying",
                            self.config.name,
                            lost.elapsed(),
                            self.paths.lock_path().display(),
                            self.paths.dir.owner()
                        );
                    }
                    Duration::from_millis(2)
                }
                Ok(None) => Duration::from_millis(50),
                Err(e) => {
                    tracing::warn!("netless-pool: cannot take the domain over: {e}");
                    Duration::from_millis(100)
                }
            };
            if self.stopping() {
                return Rejoined::Stopped;
            }
            std::thread::sleep(pause);
        }
    }

    /// The coordinator's thread: admit members, reap the dead, until stopped.
    fn coordinate(self, lock_file: File, listener: UnixListener) {
        let mut conns: Vec<Conn> = Vec::new();
        let mut joins = Joins::new();
        let admission = Arc::new(Admission {
            config: self.config.clone(),
            paths: self.paths.clone(),
            map: self.map.clone(),
            tokens: self.tokens.clone(),
            me: self.member,
            watched: Watched::new(),
        });
        reap_dead_members(&self.map, &self.tokens, Some(self.member));
        let mut last_sweep = Instant::now();
        while !self.stopping() {
            let mut fds = Vec::with_capacity(2 + conns.len());
            fds.push(PollFd::new(&self.shared.wake_rx, PollFlags::IN));
            fds.push(PollFd::new(&listener, PollFlags::IN));
            for c in &conns {
                fds.push(PollFd::new(&c.stream, PollFlags::IN));
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
            for (i, c) in conns.iter().enumerate() {
                if !ready[2 + i] {
                    continue;
                }
                let mut byte = [0u8; 1];
                let hung_up = match (&c.stream).read(&mut byte) {
                    Ok(0) => true,
                    // Members never write after joining: one that does is cut off (it
                    // rejoins, if it still runs).
                    Ok(_) => false,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => true,
                };
                gone.push(i);
                admission.watched.release(c.member, c.generation);
                if hung_up {
                    let (map, tokens) = (&self.map, &self.tokens);
                    reap_hung_up(map, tokens, c.member, c.generation, self.member);
                }
            }
            for i in gone.into_iter().rev() {
                conns.swap_remove(i);
            }
            if ready[1] {
                while let Ok((stream, _)) = listener.accept() {
                    joins.start(&admission, stream);
                }
            }
            // Joins end on their own threads; their members are watched from the next turn,
            // one socket per row: an earlier one is a member's that was reaped (or left)
            // while its socket stayed open, and goes.
            for conn in joins.take_admitted() {
                if let Some(i) = conns.iter().position(|c| c.member == conn.member) {
                    let _ = conns
                        .swap_remove(i)
                        .stream
                        .shutdown(std::net::Shutdown::Both);
                }
                conns.push(conn);
            }
            joins.prune();
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
