//! The client: connects to a service, sends requests into the replica's shared receive buffer
//! and queue, and collects responses from its own response ring.
//!
//! A `Client` is one connection. It is `Send + Sync + Clone`: clones share the connection and
//! any number of threads (and async tasks) may have calls in flight at once. Whichever waiting
//! thread holds the ring's consumer lock drains responses and hands each to its caller; other
//! waiters park until theirs arrives. Async calls are completed by a reaper thread started on
//! first use, so a tokio worker never blocks. A monitor thread watches the Unix socket: its
//! hang-up (the server died) fails every waiting call with `UNAVAILABLE` at once.
//!
//! Every byte read from the response ring is validated here; a malformed response closes the
//! connection with `INTERNAL` instead of being trusted.

use std::future::Future;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use netless_ring::prefetch::{prefetch_read_range, prefetch_write, prefetch_write_range};
use netless_ring::{Consumer, EnqueueError, WaitPolicy};
use netless_shm::{recv_frame, send_frame};

use crate::blocks::BlockLease;
use crate::call::{CallOptions, Reply};
use crate::config::{resolve_socket, ClientConfig};
use crate::handshake::{Frame, PROTOCOL_VERSION};
use crate::layout::{
    kind, provisioning, wire_flags, ResponseHeader, ShortHeader, WireHeader, HEADER_LEN,
    RESPONSE_HEADER_LEN, SHORT_HEADER_LEN,
};
use crate::metadata::Metadata;
use crate::segments::{ConnSegment, ReplicaSegment};
use crate::spin_lock::SpinLock;
use crate::status::{Code, ReplyCode, Status};
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Longest a waiter sleeps before re-checking for death or a deadline, whatever a peer did.
const MAX_SLEEP: Duration = Duration::from_millis(50);
/// How long sending the later fragments of a large request may wait for buffer space.
const FRAGMENT_SPACE_WAIT: Duration = Duration::from_secs(2);

/// A slot word: `generation << 32 | state`.
fn pack(generation: u32, state: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(state)
}
fn state_of(word: u64) -> u32 {
    word as u32
}
fn generation_of(word: u64) -> u32 {
    (word >> 32) as u32
}

const IDLE: u32 = 0;
const WAITING: u32 = 1;
const DELIVERING: u32 = 2;
const DONE: u32 = 3;

/// A connection to one service. Cheap to clone; clones share the connection.
///
/// ```no_run
/// use netless::{CallOptions, Client};
/// let client = Client::connect("demo.Echo")?;
/// let reply = client.call("Echo", b"hello", &CallOptions::new())?;
/// assert_eq!(reply.payload, b"hello");
/// # Ok::<(), netless::Status>(())
/// ```
#[derive(Clone)]
pub struct Client {
    handle: Arc<Handle>,
}

struct Handle {
    shared: Arc<Shared>,
    monitor: Mutex<Option<JoinHandle<()>>>,
    reaper: Mutex<Option<JoinHandle<()>>>,
    stop: OwnedFd,
}

struct CallSlot {
    /// `generation << 32 | state` in one word, so every transition names the call it is
    /// for: a reply for an abandoned call can never land in the slot's next call.
    state: AtomicU64,
    outcome: Mutex<Option<Result<Reply, Status>>>,
    partial: Mutex<(Vec<u8>, usize)>,
    waker: Mutex<Option<Waker>>,
    thread: Mutex<Option<Thread>>,
    /// Set while `thread` holds a registration, so freeing the slot only locks when needed.
    has_thread: AtomicBool,
    is_async: AtomicBool,
    deadline: Mutex<Option<Instant>>,
}

impl CallSlot {
    fn new() -> CallSlot {
        CallSlot {
            state: AtomicU64::new(u64::from(IDLE)),
            outcome: Mutex::new(None),
            partial: Mutex::new((Vec::new(), 0)),
            waker: Mutex::new(None),
            thread: Mutex::new(None),
            has_thread: AtomicBool::new(false),
            is_async: AtomicBool::new(false),
            deadline: Mutex::new(None),
        }
    }
}

/// A Ref made for a request that may not be sent: revoked on drop unless disarmed.
struct RevokeUnsent<'a>(Option<(&'a netless_pool::Domain, netless_pool::Ref)>);

impl Drop for RevokeUnsent<'_> {
    fn drop(&mut self) {
        if let Some((pool, r)) = self.0.take() {
            let _ = pool.revoke(&r);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) struct Shared {
    /// The page-pool domain shared with the server, if any: large payloads go as Refs.
    pool: Option<netless_pool::Domain>,
    pub(crate) service: String,
    dir: PathBuf,
    pub(crate) config: ClientConfig,
    pub(crate) replica: ReplicaSegment,
    pub(crate) conn: ConnSegment,
    pub(crate) conn_index: u32,
    pub(crate) token: u64,
    pub(crate) server_max_message: usize,
    pub(crate) fragment_body: usize,
    pub(crate) lease: BlockLease,
    slots: Box<[CallSlot]>,
    free: Box<[AtomicU64]>,
    pub(crate) consumer: SpinLock<Consumer<'static>>,
    pub(crate) dead: AtomicBool,
    death: Mutex<Option<Status>>,
    parked: AtomicU32,
    async_waiters: AtomicU32,
    /// Async calls in their spin phase: they poll the ring themselves, so the reaper keeps
    /// off the ring (and the CPU) meanwhile.
    spinning: AtomicU32,
    /// The spinner's role is held for the next call to adopt (its last holder got its reply
    /// while other calls were outstanding): the reaper keeps off meanwhile.
    role_vacant: AtomicBool,
    /// Replies delivered so far: a spinner keeps spinning while replies keep coming.
    delivered: AtomicU64,
    /// Calls given up on whose replies have not arrived yet: the reaper drains the ring for
    /// them, so late replies never fill it up while nobody else is waiting.
    abandoned: AtomicU32,
    stopping: AtomicBool,
    reaper_thread: Mutex<Option<Thread>>,
    socket: UnixStream,
}

/// Why a caller holding the ring stopped waiting on it.
enum Ended {
    /// Its own reply arrived and was decoded.
    Mine(Result<Metadata, Status>),
    /// The ring holds garbage: the connection must close.
    Corrupt(Status),
    /// The call completed by another path, or the connection died.
    Elsewhere,
    /// The deadline passed.
    TimedOut,
}

/// The outcome of draining the ring for one's own call.
enum Mine {
    NotYet,
    Done(Result<Metadata, Status>),
}

impl Client {
    /// Connects to `service` in the default socket directory with the default configuration.
    pub fn connect(service: &str) -> Result<Client, Status> {
        Client::connect_with(service, ClientConfig::default())
    }

    /// Connects to `service` with `config`.
    pub fn connect_with(service: &str, config: ClientConfig) -> Result<Client, Status> {
        config.validate()?;
        let (dir, path) = resolve_socket(config.dir.as_deref(), service)?;
        Client::connect_at(service, dir, &path, config)
    }

    /// Connects to replica `replica` of `service` (the server bound with
    /// `ServerConfig::replica = Some(replica)`, socket `SERVICE#N.sock`).
    pub fn connect_replica(
        service: &str,
        replica: u32,
        config: ClientConfig,
    ) -> Result<Client, Status> {
        config.validate()?;
        let (dir, _) = resolve_socket(config.dir.as_deref(), service)?;
        let path = crate::config::replica_socket(&dir, service, replica)?;
        Client::connect_at(&format!("{service}#{replica}"), dir, &path, config)
    }

    /// Connects to the server listening at `path` (a replica's socket in `dir`).
    pub(crate) fn connect_at(
        service: &str,
        dir: PathBuf,
        path: &std::path::Path,
        config: ClientConfig,
    ) -> Result<Client, Status> {
        let not_found = || {
            Status::unavailable(format!(
                "service `{service}` not found in {}: is its server running? (set NETLESS_DIR if it uses another directory)",
                dir.display()
            ))
        };
        let socket = match UnixStream::connect(path) {
            Ok(s) => s,
            Err(e) if netless_shm::nobody_listens(&e) => return Err(not_found()),
            Err(e) => {
                return Err(Status::unavailable(format!(
                    "cannot connect to service `{service}` at {}: {e}",
                    path.display()
                )))
            }
        };
        let timeout = Some(config.connect_timeout);
        let io = |e: std::io::Error| Status::unavailable(format!("connecting to `{service}`: {e}"));
        socket.set_read_timeout(timeout).map_err(io)?;
        socket.set_write_timeout(timeout).map_err(io)?;
        let (conn, consumer) = ConnSegment::create(config.ring_bytes)?;
        let hs = |e: netless_shm::Error| {
            Status::unavailable(format!(
                "handshake with service `{service}` failed: {e} (refused by the server's ACL, or it is shutting down)"
            ))
        };
        // The server speaks first: a greeting once our credentials passed its ACL, or the
        // reason it refuses us. Only then does our segment's fd cross.
        let (bytes, _) = recv_frame(&socket, 0).map_err(hs)?;
        match Frame::decode(&bytes) {
            Some(Frame::Greeting { .. }) => {}
            Some(Frame::Reject(status)) => return Err(status),
            _ => {
                return Err(Status::unavailable(format!(
                    "service `{service}` sent a malformed greeting"
                )))
            }
        }
        send_frame(
            &socket,
            &Frame::Hello {
                version: PROTOCOL_VERSION,
                max_message: u32::try_from(config.max_message).unwrap_or(u32::MAX),
                domain: config.domain.as_ref().map_or(0, |d| d.id()),
            }
            .encode(),
            &[conn.segment().fd()],
        )
        .map_err(hs)?;
        let (bytes, mut fds) = recv_frame(&socket, 1).map_err(hs)?;
        let (conn_index, tag, token, server_domain) = match Frame::decode(&bytes) {
            Some(Frame::Welcome { version, conn_index, tag, token, domain }) if version == PROTOCOL_VERSION => {
                (conn_index, tag, token, domain)
            }
            Some(Frame::Welcome { version, .. }) => {
                return Err(Status::unavailable(format!(
                    "service `{service}` speaks netless protocol {version}, this client {PROTOCOL_VERSION}"
                )))
            }
            Some(Frame::Reject(status)) => return Err(status),
            _ => return Err(Status::unavailable(format!("service `{service}` sent a malformed handshake"))),
        };
        let fd = fds
            .pop()
            .ok_or_else(|| Status::unavailable("the server sent no replica segment"))?;
        let replica = ReplicaSegment::attach(fd)?;
        socket.set_read_timeout(None).map_err(io)?;
        socket.set_write_timeout(None).map_err(io)?;

        let g = *replica.geometry();
        let block = g.block_size as usize;
        // Fragments of up to 64 KiB or 64 blocks, whichever is more (a server with large
        // blocks takes large requests whole), and at most a quarter of the partition each.
        // At least one byte of body per fragment, even with 64-byte blocks.
        let min_run = (HEADER_LEN / block + 1) as u32;
        let max_run = (g.part_blocks / 4)
            .clamp(min_run, (65536 / g.block_size).max(64).max(min_run))
            .min(g.part_blocks) as usize;
        if max_run * block <= HEADER_LEN {
            return Err(Status::unavailable(format!(
                "service `{service}`'s receive buffer is too small to hold a request"
            )));
        }
        let fragment_body = max_run * block - HEADER_LEN;
        let n = config.max_in_flight as usize;
        let words = n.div_ceil(64);
        let free: Box<[AtomicU64]> = (0..words)
            .map(|w| {
                let bits = (n - w * 64).min(64);
                AtomicU64::new(if bits == 64 {
                    u64::MAX
                } else {
                    (1u64 << bits) - 1
                })
            })
            .collect();
        // Pass by reference only when both sides map the same pool.
        let pool = config
            .domain
            .clone()
            .filter(|d| server_domain != 0 && d.id() == server_domain);
        let shared = Arc::new(Shared {
            pool,
            service: service.to_string(),
            dir,
            lease: BlockLease::new(tag, replica.partition_for(conn_index), block),
            consumer: SpinLock::new(consumer),
            server_max_message: g.max_message as usize,
            fragment_body,
            slots: (0..n).map(|_| CallSlot::new()).collect(),
            free,
            dead: AtomicBool::new(false),
            death: Mutex::new(None),
            parked: AtomicU32::new(0),
            async_waiters: AtomicU32::new(0),
            spinning: AtomicU32::new(0),
            role_vacant: AtomicBool::new(false),
            delivered: AtomicU64::new(0),
            abandoned: AtomicU32::new(0),
            stopping: AtomicBool::new(false),
            reaper_thread: Mutex::new(None),
            config,
            replica,
            conn,
            conn_index,
            token,
            socket,
        });
        let stop = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
            .map_err(|e| Status::resource_exhausted(format!("eventfd: {e}")))?;
        let monitor = {
            let shared = shared.clone();
            let stop = stop
                .try_clone()
                .map_err(|e| Status::resource_exhausted(format!("dup: {e}")))?;
            thread::Builder::new()
                .name("netless-monitor".into())
                .spawn(move || shared.monitor(stop))
                .map_err(|e| {
                    Status::resource_exhausted(format!("cannot spawn monitor thread: {e}"))
                })?
        };
        Ok(Client {
            handle: Arc::new(Handle {
                shared,
                monitor: Mutex::new(Some(monitor)),
                reaper: Mutex::new(None),
                stop,
            }),
        })
    }

    /// The service this client is connected to.
    pub fn service(&self) -> &str {
        &self.handle.shared.service
    }

    /// True once the connection is gone (server died, or a protocol violation closed it).
    /// A flag, as cheap as a load: a background thread sets it when the server hangs up,
    /// which on a busy machine can be a while after the server died. See
    /// [`Client::check_closed`] for an answer as of now.
    pub fn is_closed(&self) -> bool {
        self.handle.shared.dead.load(Ordering::Acquire)
    }

    /// Like [`Client::is_closed`], but first checks the socket itself (one `poll` system
    /// call): a server that has exited is seen at once, without waiting for the background
    /// thread. For rescans of a set of connections, not for every call.
    pub fn check_closed(&self) -> bool {
        self.handle.shared.check_hang_up()
    }

    /// The server's live counters and registers, read from the replica segment this client
    /// maps (no message is sent).
    pub fn replica_stats(&self) -> crate::control::ReplicaStats {
        crate::control::snapshot(&self.handle.shared.replica)
    }

    /// Requests queued at the server ahead of a new call from this connection, as the
    /// server last published it in shared memory (a hint, for load balancing).
    pub fn queue_depth(&self) -> u64 {
        self.handle.shared.queue_depth()
    }

    /// Calls `method` with `payload` and waits for the reply.
    pub fn call(
        &self,
        method: &str,
        payload: &[u8],
        options: &CallOptions,
    ) -> Result<Reply, Status> {
        let mut out = Vec::new();
        let metadata = self.call_into(method, payload, options, &mut out)?;
        Ok(Reply {
            metadata,
            payload: out,
        })
    }

    /// Like [`Client::call`], but writes the reply payload into `out` (cleared first) so a
    /// loop of calls can reuse one buffer; returns the reply metadata.
    pub fn call_into(
        &self,
        method: &str,
        payload: &[u8],
        options: &CallOptions,
        out: &mut Vec<u8>,
    ) -> Result<Metadata, Status> {
        let shared = &self.handle.shared;
        let deadline = shared.deadline_for(options);
        let mut retry = 0;
        // A NACK, from this client before sending or from a worker that found the request
        // queued too long to meet the SLO, means the call did not run: the policy may retry it.
        let backoff = |retry: u32, nack: Status| -> Result<(), Status> {
            if retry >= shared.config.retry.attempts() {
                return Err(nack);
            }
            let seed = shared.token ^ netless_shm::monotonic_ns();
            let pause = shared.config.retry.backoff(retry, seed);
            if pause.is_zero() || deadline.is_some_and(|d| Instant::now() + pause >= d) {
                return Err(nack);
            }
            thread::sleep(pause);
            Ok(())
        };
        let result = loop {
            out.clear();
            let (index, call_id) =
                match shared.submit(method, options.request_metadata(), payload, deadline, false) {
                    Ok(sent) => sent,
                    Err(s) if s.is_nack() => {
                        backoff(retry, s)?;
                        retry += 1;
                        continue;
                    }
                    Err(s) => return Err(s),
                };
            match shared.wait_blocking(index, call_id, deadline, out) {
                Err(s) if s.is_nack() => {
                    if let Err(s) = backoff(retry, s) {
                        break Err(s);
                    }
                    retry += 1;
                }
                result => break result,
            }
        };
        if let Some(pool) = shared
            .pool
            .as_ref()
            .filter(|_| shared.by_ref(payload.len()))
        {
            // The server has mapped (or refused) the request's Ref: end our hold on its
            // pages now rather than at our next pool operation.
            pool.collect();
        }
        if shared.abandoned.load(Ordering::Relaxed) > 0 {
            // Someone gave up on a call: make sure its late reply gets drained.
            self.ensure_reaper();
        }
        result
    }

    /// Calls `method` asynchronously. The future never blocks the executor thread: responses
    /// are collected by a reaper thread and the task is woken. Dropping the future abandons the
    /// call (a late reply is discarded).
    pub fn call_async(
        &self,
        method: &str,
        payload: &[u8],
        options: &CallOptions,
    ) -> impl Future<Output = Result<Reply, Status>> + Send + 'static {
        let shared = &self.handle.shared;
        let deadline = shared.deadline_for(options);
        // A payload that goes by reference leaves only its 32-byte Ref in the body.
        let sent = if shared.by_ref(payload.len()) {
            netless_pool::Ref::LEN
        } else {
            payload.len()
        };
        let body = method.len() + options.request_metadata().encoded_len() + sent;
        let state = if body > shared.fragment_body {
            // Sending fragments may wait for buffer space: do it on a helper thread.
            let client = self.clone();
            let (method, payload, options) =
                (method.to_string(), payload.to_vec(), options.clone());
            let cell = Arc::new(Oneshot::default());
            let tx = cell.clone();
            let spawned = thread::Builder::new()
                .name("netless-large-call".into())
                .spawn(move || {
                    tx.complete(client.call(&method, &payload, &options));
                });
            match spawned {
                Ok(_) => AsyncState::Thread(cell),
                Err(e) => AsyncState::Failed(Some(Status::resource_exhausted(format!(
                    "cannot spawn thread: {e}"
                )))),
            }
        } else {
            match shared.submit(method, options.request_metadata(), payload, deadline, true) {
                Ok((index, _call_id)) => {
                    // The reaper only parks for long when no async call is outstanding: wake
                    // it (a system call) only for the first one, not for every call, and not
                    // even then if this call will poll the ring itself (it spins first, and
                    // hands over to the reaper, waking it, if its spin runs out).
                    let first = shared.async_waiters.fetch_add(1, Ordering::AcqRel) == 0;
                    if lock(&self.handle.reaper).is_none() || (first && !self.may_spin()) {
                        self.ensure_reaper();
                    }
                    AsyncState::Ring { index }
                }
                Err(status) => AsyncState::Failed(Some(status)),
            }
        };
        let may_spin = matches!(state, AsyncState::Ring { .. }) && self.may_spin();
        CallFuture {
            client: self.clone(),
            state,
            deadline,
            may_spin,
            spin_until: None,
            progress: 0,
        }
    }

    /// Whether this client's async calls spin in their executor before leaving the ring to
    /// the reaper.
    fn may_spin(&self) -> bool {
        let wait = &self.handle.shared.config.wait;
        wait.mode != netless_ring::WaitMode::Futex && !wait.spin.is_zero()
    }

    fn ensure_reaper(&self) {
        let mut reaper = lock(&self.handle.reaper);
        if reaper.is_none() {
            let shared = self.handle.shared.clone();
            match thread::Builder::new()
                .name("netless-reaper".into())
                .spawn(move || shared.reap())
            {
                Ok(h) => {
                    *lock(&self.handle.shared.reaper_thread) = Some(h.thread().clone());
                    *reaper = Some(h);
                }
                Err(e) => self.handle.shared.fail(Status::resource_exhausted(format!(
                    "cannot spawn the reaper thread: {e}"
                ))),
            }
        } else if let Some(t) = lock(&self.handle.shared.reaper_thread).as_ref() {
            t.unpark();
        }
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.handle.shared
    }

    /// The doorbell this connection's replies ring, for a server worker to sleep on
    /// ([`Handler::wake_sources`](crate::Handler::wake_sources)).
    pub fn wake_source(&self) -> crate::WakeSource {
        crate::WakeSource::new(self.handle.shared.clone())
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("service", &self.handle.shared.service)
            .field("conn_index", &self.handle.shared.conn_index)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let shared = &self.shared;
        shared.stopping.store(true, Ordering::Release);
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        if let Some(t) = lock(&shared.reaper_thread).as_ref() {
            t.unpark();
        }
        if let Some(h) = lock(&self.reaper).take() {
            let _ = h.join();
        }
        if let Some(h) = lock(&self.monitor).take() {
            let _ = h.join();
        }
        shared.lease.release_all(shared.replica.table());
        let _ = shared.socket.shutdown(std::net::Shutdown::Both);
    }
}

impl Shared {
    /// Whether a payload of `len` bytes travels by reference on this connection.
    fn by_ref(&self, len: usize) -> bool {
        self.pool.is_some() && len >= self.config.ref_threshold.max(1)
    }

    /// The call's deadline, or the client's default timeout from now.
    fn deadline_for(&self, options: &CallOptions) -> Option<Instant> {
        options.deadline().or_else(|| {
            self.config
                .default_timeout
                .and_then(|t| Instant::now().checked_add(t))
        })
    }

    pub(crate) fn death_status(&self) -> Status {
        lock(&self.death).clone().unwrap_or_else(|| {
            Status::unavailable(format!(
                "connection to service `{}` is closed",
                self.service
            ))
        })
    }

    /// Marks the connection dead with `status` and wakes every waiter.
    pub(crate) fn fail(&self, status: Status) {
        {
            let mut death = lock(&self.death);
            if death.is_none() {
                *death = Some(status);
            }
        }
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
        netless_ring::ring_all(self.conn.doorbell());
        self.wake_everyone();
    }

    fn wake_everyone(&self) {
        self.wake_callers();
        if let Some(t) = lock(&self.reaper_thread).as_ref() {
            t.unpark();
        }
    }

    /// Wakes the task of one waiting async call (leaving its waker registered).
    fn nudge_one_async(&self) {
        for slot in self.slots.iter() {
            if state_of(slot.state.load(Ordering::Acquire)) == WAITING
                && slot.is_async.load(Ordering::Relaxed)
            {
                if let Some(w) = lock(&slot.waker).as_ref() {
                    w.wake_by_ref();
                    return;
                }
            }
        }
    }

    /// Wakes every caller waiting on a call (blocked threads and async tasks).
    fn wake_callers(&self) {
        for slot in self.slots.iter() {
            if state_of(slot.state.load(Ordering::Acquire)) != IDLE {
                if let Some(t) = lock(&slot.thread).as_ref() {
                    t.unpark();
                }
                if let Some(w) = lock(&slot.waker).take() {
                    w.wake();
                }
            }
        }
    }

    /// Why calls fail once the server's end of the socket is gone.
    fn hung_up_status(&self) -> Status {
        Status::unavailable(format!(
            "service `{}` closed the connection: its server process exited or was killed (socket dir {}); retry when it is back",
            self.service,
            self.dir.display()
        ))
    }

    /// Checks the socket now instead of waiting for the monitor thread, which a busy machine
    /// may not have run since the server died: a hung-up socket fails the connection at once.
    /// True if the connection is gone.
    pub(crate) fn check_hang_up(&self) -> bool {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        if self.dead.load(Ordering::Acquire) {
            return true;
        }
        let mut fds = [PollFd::new(&self.socket, PollFlags::IN)];
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // Only a hang-up with nothing left to read: a frame still there (a Goodbye, which
        // says why) is the monitor's to read.
        let mut byte = [0u8; 1];
        if poll(&mut fds, Some(&now)).is_ok_and(|n| n > 0)
            && fds[0].revents().intersects(PollFlags::HUP | PollFlags::ERR)
            && !rustix::net::recv(
                &self.socket,
                &mut byte,
                rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
            )
            .is_ok_and(|(n, _)| n > 0)
        {
            self.fail(self.hung_up_status());
        }
        self.dead.load(Ordering::Acquire)
    }

    fn monitor(&self, stop: OwnedFd) {
        use rustix::event::{poll, PollFd, PollFlags};
        loop {
            let mut fds = [
                PollFd::new(&self.socket, PollFlags::IN),
                PollFd::new(&stop, PollFlags::IN),
            ];
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    self.fail(Status::unavailable(format!(
                        "monitoring the connection failed: {e}"
                    )));
                    return;
                }
            }
            if !fds[1].revents().is_empty() || self.stopping.load(Ordering::Acquire) {
                return;
            }
            if fds[0].revents().is_empty() {
                continue;
            }
            let status = match recv_frame(&self.socket, 0) {
                Ok((bytes, _)) => match Frame::decode(&bytes) {
                    Some(Frame::Goodbye(status)) => status,
                    _ => Status::internal(format!(
                        "service `{}` sent an unexpected frame; connection closed",
                        self.service
                    )),
                },
                Err(_) if self.dead.load(Ordering::Acquire) => return,
                Err(_) => self.hung_up_status(),
            };
            self.fail(status);
            return;
        }
    }

    fn alloc_slot(&self) -> Option<usize> {
        for (w, word) in self.free.iter().enumerate() {
            let mut bits = word.load(Ordering::Relaxed);
            while bits != 0 {
                let bit = bits.trailing_zeros();
                match word.compare_exchange_weak(
                    bits,
                    bits & !(1 << bit),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Some(w * 64 + bit as usize),
                    Err(now) => bits = now,
                }
            }
        }
        None
    }

    fn free_slot(&self, index: usize) {
        // Every path that completes a call takes its outcome first, so there is nothing to
        // clear here (and no lock on the hot path).
        let slot = &self.slots[index];
        // Only the slot's owner registers a thread, and the owner frees it: a plain load
        // keeps the common case free of locked instructions.
        if slot.has_thread.load(Ordering::Relaxed) && slot.has_thread.swap(false, Ordering::AcqRel)
        {
            *lock(&slot.thread) = None;
        }
        slot.is_async.store(false, Ordering::Relaxed);
        let generation = generation_of(slot.state.load(Ordering::Relaxed));
        slot.state.store(pack(generation, IDLE), Ordering::Release);
        self.free[index / 64].fetch_or(1 << (index % 64), Ordering::Release);
    }

    /// Sends a request; returns its slot index and call id.
    fn submit(
        &self,
        method: &str,
        metadata: &Metadata,
        payload: &[u8],
        deadline: Option<Instant>,
        is_async: bool,
    ) -> Result<(usize, u64), Status> {
        if self.dead.load(Ordering::Acquire) {
            return Err(self.death_status());
        }
        let md_len = metadata.encoded_len();
        let body_len = method.len() + md_len + payload.len();
        if body_len > self.server_max_message {
            return Err(Status::resource_exhausted(format!(
                "request of {body_len} bytes exceeds service `{}`'s maximum message size of {} bytes",
                self.service, self.server_max_message
            )));
        }
        // A large payload is written once into pool pages and travels as a 32-byte Ref; the
        // server maps it and its handler reads the pages in place.
        let ref_bytes;
        // Revokes the Ref if the request is not sent (its pages go back at once).
        let mut unsent = RevokeUnsent(None);
        let (payload, flags) = match &self.pool {
            Some(pool) if self.by_ref(payload.len()) => {
                let r = pool
                    .alloc_from(payload)
                    .and_then(|buf| buf.share())
                    .map_err(crate::status::from_pool)?;
                ref_bytes = r.to_bytes();
                unsent.0 = Some((pool, r));
                (&ref_bytes[..], wire_flags::PAYLOAD_REF)
            }
            _ => (payload, 0),
        };
        let body_len = method.len() + md_len + payload.len();
        if let Some(d) = deadline {
            if d <= Instant::now() {
                return Err(Status::deadline_exceeded(
                    "deadline expired before the call was sent",
                ));
            }
        }
        let index = self.alloc_slot().ok_or_else(|| {
            Status::resource_exhausted(format!(
                "{} calls already in flight on this connection to `{}`: raise ClientConfig::max_in_flight or use more connections",
                self.slots.len(),
                self.service
            ))
        })?;
        let slot = &self.slots[index];
        // The slot is ours alone until it is freed, so a plain load and store suffice.
        let generation = generation_of(slot.state.load(Ordering::Relaxed)).wrapping_add(1);
        let call_id = (u64::from(generation) << 32) | index as u64;
        slot.is_async.store(is_async, Ordering::Relaxed);
        if is_async {
            // Only the reaper reads deadlines (blocking callers keep theirs on the stack).
            *lock(&slot.deadline) = deadline;
        }
        slot.state
            .store(pack(generation, WAITING), Ordering::Release);

        let md_bytes;
        let md_slice: &[u8] = if md_len == 0 {
            &[]
        } else {
            let mut v = Vec::with_capacity(md_len);
            metadata.encode_into(&mut v);
            md_bytes = v;
            &md_bytes
        };
        let pieces = [method.as_bytes(), md_slice, payload];
        let deadline_ns = deadline.map_or(0, |d| netless_shm::instant_to_monotonic_ns(d).max(1));
        let mut header = WireHeader {
            token: self.token,
            call_id,
            deadline_ns,
            conn_index: self.conn_index,
            kind: kind::REQUEST,
            status: 0,
            body_len: body_len as u32,
            method_len: method.len() as u32,
            metadata_len: md_len as u32,
            reserved: [flags, 0],
            ..WireHeader::default()
        };
        let mut offset = 0usize;
        let mut first = true;
        let mut space_deadline = None;
        loop {
            let frag_len = (body_len - offset).min(self.fragment_body);
            header.frag_offset = offset as u32;
            header.frag_len = frag_len as u32;
            if let Err(status) =
                self.send_fragment(&mut header, &pieces, first, deadline, &mut space_deadline)
            {
                // Nothing was sent for a NACKed first fragment, so the slot can be reused; a
                // partly sent request is abandoned (the server discards its fragments).
                self.free_slot(index);
                return Err(status);
            }
            first = false;
            offset += frag_len;
            if offset >= body_len {
                unsent.0 = None;
                return Ok((index, call_id));
            }
        }
    }

    fn send_fragment(
        &self,
        header: &mut WireHeader,
        pieces: &[&[u8]; 3],
        first: bool,
        deadline: Option<Instant>,
        space_deadline: &mut Option<Instant>,
    ) -> Result<(), Status> {
        let block = self.replica.block_size();
        let frag_len = header.frag_len as usize;
        // Every fragment carries the time it is enqueued: a worker judges the wait of the one
        // that completes the request, not the time the sender spent on the whole body.
        header.reserved[1] = crate::admission::stamp_for(self.replica.server_control());
        // A request that needs no more takes the 32-byte header, and perhaps a block less.
        header.nblocks = (SHORT_HEADER_LEN + frag_len).div_ceil(block) as u32;
        let short = ShortHeader::of(header);
        let header_len = if short.is_some() {
            SHORT_HEADER_LEN
        } else {
            HEADER_LEN
        };
        let count = (header_len + frag_len).div_ceil(block) as u32;
        header.nblocks = count;
        let table = self.replica.table();
        // Start moving every line this send will write to our core at once (block-table word,
        // the message's first lines, the queue cell), instead of one after another.
        if let Some(start) = self.lease.likely_next(count) {
            if let (Some(dst), Some(word)) = (
                self.replica.block_run(start, count),
                table.get(start as usize),
            ) {
                prefetch_write((word as *const AtomicU32).cast());
                prefetch_write_range(dst, header_len + frag_len, 4);
            }
        }
        let queue = self.replica.queue_for(self.conn_index);
        if first {
            self.check_depth(0)?;
        }
        let mut spins = 0u32;
        loop {
            if self.dead.load(Ordering::Acquire) {
                return Err(self.death_status());
            }
            let claimed = self.lease.claim(table, self.shared_head(), count);
            let start = match claimed {
                Some(start) => start,
                None if first => {
                    let part = self.replica.geometry().part_blocks;
                    return Err(self.nack(format!(
                        "receive buffer of service `{}` is full (a run of {count} free blocks of {block} bytes needed, none among the {part} this connection may use): retry with backoff, or run more replicas",
                        self.service,
                    )));
                }
                None => {
                    self.backoff_for_space(&mut spins, deadline, space_deadline)?;
                    continue;
                }
            };
            let dst = self
                .replica
                .block_run(start, count)
                .ok_or_else(|| Status::internal("block run outside the buffer"))?;
            // SAFETY: `dst` points at `count` blocks we just claimed (OWNED by us), which hold
            // header_len + frag_len bytes; no one else writes them while we own them.
            unsafe {
                let bytes: &[u8] = match &short {
                    Some(short) => short.as_bytes(),
                    None => header.as_bytes(),
                };
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, header_len);
                copy_body_range(
                    pieces,
                    header.frag_offset as usize,
                    frag_len,
                    dst.add(header_len),
                );
            }
            match queue.queue.try_enqueue(start) {
                Ok(()) => {
                    netless_ring::ring(queue.doorbell);
                    return Ok(());
                }
                Err(e) => {
                    self.lease.unclaim(table, start, count);
                    if first {
                        let why = match e {
                            EnqueueError::Full => "receive queue is full",
                            _ => "receive queue is contended or damaged",
                        };
                        return Err(self.nack(format!(
                            "service `{}`: {why}; retry with backoff",
                            self.service
                        )));
                    }
                    self.backoff_for_space(&mut spins, deadline, space_deadline)?;
                }
            }
        }
    }

    /// How many connections allocate in this connection's partition of the buffer.
    pub(crate) fn sharers(&self) -> u32 {
        let g = self.replica.geometry();
        match g.provisioning {
            provisioning::PER_CONNECTION => 1,
            _ => {
                let conns = self
                    .replica
                    .server_control()
                    .connections
                    .load(Ordering::Relaxed);
                conns.div_ceil(g.nparts.max(1)).max(1)
            }
        }
    }

    /// The buffer's shared allocation head, if connections share the partition's head.
    pub(crate) fn shared_head(&self) -> Option<&AtomicU32> {
        (self.replica.geometry().provisioning == provisioning::SHARED)
            .then(|| &self.replica.client_control().alloc_head)
    }

    /// Fails fast, before anything is written, if more requests are queued ahead than the
    /// server's SLO allows (NEBULA's NACK: such a request would miss its SLO anyway).
    /// `unpublished`: requests of ours that will enter the queue ahead of this one (a
    /// pipeline's open batch).
    #[inline]
    pub(crate) fn check_depth(&self, unpublished: u64) -> Result<(), Status> {
        // Inline up to here: without an SLO (no limit) a pipelined submit pays one load.
        let limit = self
            .replica
            .server_control()
            .depth_limit
            .load(Ordering::Relaxed);
        if limit == 0 {
            return Ok(());
        }
        self.check_depth_against(unpublished, limit)
    }

    /// [`Shared::check_depth`] under an SLO's `limit` (out of line: most clients have none).
    #[inline(never)]
    fn check_depth_against(&self, unpublished: u64, limit: u32) -> Result<(), Status> {
        let ctrl = self.replica.server_control();
        let queue = self.replica.queue_for(self.conn_index);
        // The queue holds entries, the limit counts requests: scale by the requests per
        // entry the server has seen lately (batches hold several).
        let per_entry = u64::from(
            ctrl.requests_per_entry_x16
                .load(Ordering::Relaxed)
                .clamp(16, 16 * 256),
        );
        let depth = queue.depth() * per_entry / 16 + unpublished;
        if depth < u64::from(limit) {
            return Ok(());
        }
        Err(self.nack(format!(
            "service `{}` has about {depth} requests queued, more than the {limit} its latency SLO allows: the call would miss it; retry with backoff or on another replica",
            self.service
        )))
    }

    /// A NACK: counted in the replica's shared stats, returned as `RESOURCE_EXHAUSTED`.
    pub(crate) fn nack(&self, message: String) -> Status {
        self.replica
            .client_control()
            .nacks
            .fetch_add(1, Ordering::Relaxed);
        Status::nack(message)
    }

    /// Requests queued at the server ahead of a new one from this connection, as the server
    /// last published it (a hint).
    pub(crate) fn queue_depth(&self) -> u64 {
        self.replica.queue_for(self.conn_index).depth()
    }

    fn backoff_for_space(
        &self,
        spins: &mut u32,
        deadline: Option<Instant>,
        space_deadline: &mut Option<Instant>,
    ) -> Result<(), Status> {
        let now = Instant::now();
        let space_deadline = *space_deadline.get_or_insert(now + FRAGMENT_SPACE_WAIT);
        if deadline.is_some_and(|d| now >= d) {
            return Err(Status::deadline_exceeded(
                "deadline expired while sending a large request",
            ));
        }
        if now >= space_deadline {
            return Err(Status::resource_exhausted(format!(
                "receive buffer of service `{}` stayed full for {:?} while sending a large request",
                self.service, FRAGMENT_SPACE_WAIT
            )));
        }
        *spins += 1;
        if *spins < 64 {
            thread::yield_now();
        } else {
            thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    fn wait_blocking(
        &self,
        index: usize,
        call_id: u64,
        deadline: Option<Instant>,
        out: &mut Vec<u8>,
    ) -> Result<Metadata, Status> {
        let slot = &self.slots[index];
        let mut registered = false;
        let result = loop {
            if state_of(slot.state.load(Ordering::Acquire)) == DONE {
                break self.take_outcome(index, out);
            }
            if self.dead.load(Ordering::Acquire) {
                break self
                    .abandon(index, out)
                    .unwrap_or_else(|| Err(self.death_status()));
            }
            if let Some(mut consumer) = self.consumer.try_lock() {
                // We hold the ring: drain it, and wait on it, until our reply is in (or
                // something else ends the call); the lock is kept across the wait so the reply
                // is decoded the moment it lands.
                let ended = loop {
                    match self.drain(&mut consumer, Some((call_id, &mut *out))) {
                        Ok(Mine::Done(result)) => break Ended::Mine(result),
                        Ok(Mine::NotYet) => {}
                        Err(status) => break Ended::Corrupt(status),
                    }
                    if state_of(slot.state.load(Ordering::Acquire)) == DONE
                        || self.dead.load(Ordering::Acquire)
                    {
                        break Ended::Elsewhere;
                    }
                    // Use the wait to get the next call's blocks ready.
                    let sharers = self.sharers();
                    if let Some((start, count)) =
                        self.lease
                            .prepare_spare(self.replica.table(), self.shared_head(), sharers)
                    {
                        if let Some(dst) = self.replica.block_run(start, count) {
                            let bytes = count as usize * self.replica.block_size();
                            prefetch_write_range(dst, bytes, 64);
                        }
                    }
                    let waited = netless_ring::wait(
                        self.conn.doorbell(),
                        &self.config.wait,
                        deadline,
                        MAX_SLEEP,
                        || {
                            (consumer.has_next()
                                || self.dead.load(Ordering::Acquire)
                                || state_of(slot.state.load(Ordering::Acquire)) == DONE)
                                .then_some(())
                        },
                    );
                    if waited.is_err() {
                        break Ended::TimedOut;
                    }
                };
                drop(consumer);
                self.after_consumer_release();
                match ended {
                    Ended::Mine(result) => {
                        self.free_slot(index);
                        break result;
                    }
                    Ended::Corrupt(status) => self.fail(status),
                    Ended::Elsewhere => {}
                    Ended::TimedOut => {
                        break self
                            .abandon(index, out)
                            .unwrap_or_else(|| Err(deadline_status()));
                    }
                }
            } else {
                if !registered {
                    *lock(&slot.thread) = Some(thread::current());
                    slot.has_thread.store(true, Ordering::Release);
                    self.parked.fetch_add(1, Ordering::AcqRel);
                    registered = true;
                }
                // Re-check after registering so a delivery in between is not missed.
                if state_of(slot.state.load(Ordering::Acquire)) == DONE {
                    continue;
                }
                let mut nap = Duration::from_millis(1);
                if let Some(d) = deadline {
                    let now = Instant::now();
                    if now >= d {
                        break self
                            .abandon(index, out)
                            .unwrap_or_else(|| Err(deadline_status()));
                    }
                    nap = nap.min(d - now);
                }
                thread::park_timeout(nap);
            }
        };
        // The slot (and its thread registration) was cleared when it was freed, before
        // anyone else could allocate it.
        if registered {
            self.parked.fetch_sub(1, Ordering::AcqRel);
        }
        result
    }

    /// Called after dropping the consumer lock: let a parked waiter or the reaper take over.
    fn after_consumer_release(&self) {
        if self.parked.load(Ordering::Acquire) > 0 {
            for slot in self.slots.iter() {
                if state_of(slot.state.load(Ordering::Acquire)) == WAITING {
                    if let Some(t) = lock(&slot.thread).as_ref() {
                        t.unpark();
                    }
                }
            }
        }
        // With a spinner, the reaper keeps off the ring anyway: waking it (a system call and
        // a context switch) after every poll would cost more than the call.
        if self.async_waiters.load(Ordering::Acquire) > 0
            && self.spinning.load(Ordering::Acquire) == 0
        {
            if let Some(t) = lock(&self.reaper_thread).as_ref() {
                t.unpark();
            }
        }
    }

    /// Gives up on a call. If its outcome is being delivered right now, returns it instead.
    fn abandon(&self, index: usize, out: &mut Vec<u8>) -> Option<Result<Metadata, Status>> {
        let slot = &self.slots[index];
        // Only the call's owner abandons it, so the generation in the word is its own.
        let word = slot.state.load(Ordering::Acquire);
        let generation = generation_of(word);
        if state_of(word) == WAITING
            && slot
                .state
                .compare_exchange(
                    word,
                    pack(generation, IDLE),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
        {
            lock(&slot.partial).0 = Vec::new();
            self.free_slot(index);
            self.abandoned.fetch_add(1, Ordering::AcqRel);
            return None;
        }
        while state_of(slot.state.load(Ordering::Acquire)) == DELIVERING {
            std::hint::spin_loop();
        }
        Some(self.take_outcome(index, out))
    }

    fn take_outcome(&self, index: usize, out: &mut Vec<u8>) -> Result<Metadata, Status> {
        let outcome = lock(&self.slots[index].outcome).take();
        self.free_slot(index);
        match outcome {
            Some(Ok(reply)) => {
                out.extend_from_slice(&reply.payload);
                Ok(reply.metadata)
            }
            Some(Err(status)) => Err(status),
            None => Err(Status::internal("call completed without an outcome")),
        }
    }

    fn take_reply(&self, index: usize) -> Result<Reply, Status> {
        let outcome = lock(&self.slots[index].outcome).take();
        self.free_slot(index);
        outcome.unwrap_or_else(|| Err(Status::internal("call completed without an outcome")))
    }

    fn deliver(&self, index: usize, generation: u32, outcome: Result<Reply, Status>) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
        let slot = &self.slots[index];
        if slot
            .state
            .compare_exchange(
                pack(generation, WAITING),
                pack(generation, DELIVERING),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return; // abandoned meanwhile (and perhaps reused by a newer call)
        }
        *lock(&slot.outcome) = Some(outcome);
        slot.state.store(pack(generation, DONE), Ordering::Release);
        if let Some(t) = lock(&slot.thread).as_ref() {
            t.unpark();
        }
        if let Some(w) = lock(&slot.waker).take() {
            w.wake();
        }
    }

    /// Drains every available response, delivering each to its caller. If `mine` is given and
    /// its response arrives whole, decodes it straight into the caller's buffer and stops.
    fn drain(
        &self,
        consumer: &mut Consumer<'static>,
        mut mine: Option<(u64, &mut Vec<u8>)>,
    ) -> Result<Mine, Status> {
        let corrupt = |what: &str| {
            Status::internal(format!(
                "service `{}` wrote a malformed response ({what}); the connection was closed",
                self.service
            ))
        };
        loop {
            let record = match consumer.peek() {
                Ok(Some(record)) => record,
                Ok(None) => return Ok(Mine::NotYet),
                Err(e) => return Err(corrupt(&e.to_string())),
            };
            let body = record.body();
            // Ask for every line of the record at once (up to 4 KiB) rather than one miss at a
            // time as the copy below walks it.
            prefetch_read_range(body.as_ptr(), body.len(), 64);
            let (h, code, fragment) =
                parse_response(body, self.config.max_message).map_err(corrupt)?;
            let index = (h.call_id & 0xffff_ffff) as usize;
            let generation = (h.call_id >> 32) as u32;
            let live = self
                .slots
                .get(index)
                .is_some_and(|s| s.state.load(Ordering::Acquire) == pack(generation, WAITING));
            if !live {
                // A reply to an abandoned call: once its last fragment is in, one fewer to
                // wait for.
                let last =
                    u64::from(h.frag_offset) + u64::from(h.frag_len) >= u64::from(h.body_len);
                record.release();
                if last {
                    let _ = self
                        .abandoned
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
                }
                continue;
            }
            let whole = h.frag_len == h.body_len;
            if whole {
                if let Some((id, ref mut out)) = mine {
                    if id == h.call_id {
                        let result = decode_body(&h, code, fragment, out);
                        record.release();
                        return Ok(Mine::Done(result));
                    }
                }
                let mut payload = Vec::new();
                let result = decode_body(&h, code, fragment, &mut payload)
                    .map(|metadata| Reply { metadata, payload });
                record.release();
                self.deliver(index, generation, result);
                continue;
            }
            // A fragment: collect it; decode once the body is complete.
            let complete = {
                let mut partial = lock(&self.slots[index].partial);
                if h.frag_offset == 0 || partial.0.len() != h.body_len as usize {
                    *partial = (vec![0; h.body_len as usize], 0);
                }
                let off = h.frag_offset as usize;
                netless_shm::copy::copy_slice(&mut partial.0[off..off + fragment.len()], fragment);
                partial.1 += fragment.len();
                (partial.1 >= partial.0.len()).then(|| std::mem::take(&mut partial.0))
            };
            record.release();
            if let Some(body) = complete {
                lock(&self.slots[index].partial).1 = 0;
                let mut payload = Vec::new();
                let result = decode_body(&h, code, &body, &mut payload);
                if let Some((id, ref mut out)) = mine {
                    if id == h.call_id {
                        netless_shm::copy::extend(out, &payload);
                        return Ok(Mine::Done(result));
                    }
                }
                self.deliver(
                    index,
                    generation,
                    result.map(|metadata| Reply { metadata, payload }),
                );
            }
        }
    }

    /// The reaper: collects responses for async calls.
    fn reap(self: Arc<Self>) {
        let policy = WaitPolicy {
            spin: self.config.wait.spin.min(Duration::from_micros(20)),
            ..self.config.wait
        };
        let mut vacant_seen = false;
        while !self.stopping.load(Ordering::Acquire) {
            if self.async_waiters.load(Ordering::Acquire) == 0
                && self.abandoned.load(Ordering::Acquire) == 0
            {
                thread::park_timeout(Duration::from_millis(100));
                continue;
            }
            if self.spinning.load(Ordering::Acquire) > 0 {
                // Spinning calls poll the ring themselves; stay off it and off the CPU. A
                // role left vacant for a whole check (nobody adopted it) is taken back.
                if self.role_vacant.load(Ordering::Acquire) {
                    if vacant_seen
                        && self
                            .role_vacant
                            .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
                            .is_ok()
                    {
                        self.spinning.store(0, Ordering::Release);
                        vacant_seen = false;
                        continue;
                    }
                    vacant_seen = true;
                } else {
                    vacant_seen = false;
                }
                self.expire_async();
                thread::park_timeout(SPINNER_CHECK);
                continue;
            }
            vacant_seen = false;
            let Some(mut consumer) = self.consumer.try_lock() else {
                // A blocking caller holds the ring (and may for long): async deadlines are
                // still ours to enforce. It unparks us when it lets go.
                self.expire_async();
                thread::park_timeout(Duration::from_millis(1));
                continue;
            };
            if let Err(status) = self.drain(&mut consumer, None) {
                drop(consumer);
                self.fail(status);
                continue;
            }
            self.expire_async();
            if self.dead.load(Ordering::Acquire) {
                drop(consumer);
                // No reply will ever come: nothing abandoned is left to drain. (Not
                // `wake_everyone`: unparking itself would turn this park into a busy loop.)
                self.abandoned.store(0, Ordering::Release);
                self.wake_callers();
                thread::park_timeout(Duration::from_millis(10));
                continue;
            }
            let _ = netless_ring::wait(
                self.conn.doorbell(),
                &policy,
                Some(Instant::now() + Duration::from_millis(5)),
                MAX_SLEEP,
                || {
                    (consumer.has_next()
                        || self.spinning.load(Ordering::Acquire) > 0
                        || self.dead.load(Ordering::Acquire)
                        || self.stopping.load(Ordering::Acquire)
                        || (self.async_waiters.load(Ordering::Acquire) == 0
                            && self.abandoned.load(Ordering::Acquire) == 0))
                        .then_some(())
                },
            );
            drop(consumer);
            self.after_consumer_release();
        }
    }

    fn expire_async(&self) {
        let now = Instant::now();
        for (index, slot) in self.slots.iter().enumerate() {
            let word = slot.state.load(Ordering::Acquire);
            if state_of(word) == WAITING
                && slot.is_async.load(Ordering::Relaxed)
                && lock(&slot.deadline).is_some_and(|d| d <= now)
            {
                self.deliver(index, generation_of(word), Err(deadline_status()));
            }
        }
    }
}

/// How often the reaper checks whether a spinning async call still holds the role.
const SPINNER_CHECK: Duration = Duration::from_millis(1);

fn deadline_status() -> Status {
    Status::deadline_exceeded("deadline expired before the server replied")
}

/// Decodes a whole response body: metadata, then payload (or the status message).
/// Validates a response record from the ring (memory the server writes): its header, shape
/// and status code. Returns the header, the code and the fragment of body it carries.
pub(crate) fn parse_response(
    body: &[u8],
    max_message: usize,
) -> Result<(ResponseHeader, ReplyCode, &[u8]), &'static str> {
    if body.len() < RESPONSE_HEADER_LEN {
        return Err("record shorter than a header");
    }
    // SAFETY: body has at least RESPONSE_HEADER_LEN bytes.
    let h = unsafe { ResponseHeader::read_from(body.as_ptr()) };
    if h.kind != kind::RESPONSE {
        return Err("not a response");
    }
    h.validate_shape(max_message, body.len() - RESPONSE_HEADER_LEN)?;
    let code = ReplyCode::from_wire(h.status).ok_or("unknown status code")?;
    let fragment = &body[RESPONSE_HEADER_LEN..RESPONSE_HEADER_LEN + h.frag_len as usize];
    Ok((h, code, fragment))
}

fn decode_body(
    h: &ResponseHeader,
    code: ReplyCode,
    body: &[u8],
    out: &mut Vec<u8>,
) -> Result<Metadata, Status> {
    let md_end = h.metadata_len as usize;
    let metadata = Metadata::decode(&body[..md_end])?;
    let rest = &body[md_end..];
    if code.code == Code::Ok {
        netless_shm::copy::extend(out, rest);
        Ok(metadata)
    } else {
        Err(code.status(rest))
    }
}

/// Copies bytes `[offset, offset + len)` of the concatenation of `pieces` to `dst`.
///
/// # Safety
/// `dst` must be valid for `len` bytes of writes.
pub(crate) unsafe fn copy_body_range(
    pieces: &[&[u8]],
    mut offset: usize,
    mut len: usize,
    mut dst: *mut u8,
) {
    for piece in pieces {
        if len == 0 {
            break;
        }
        if offset >= piece.len() {
            offset -= piece.len();
            continue;
        }
        let n = (piece.len() - offset).min(len);
        // SAFETY: n bytes are readable from piece[offset..] and writable at dst (the caller
        // guarantees len bytes, and n <= len).
        unsafe {
            netless_shm::copy::copy_bytes(piece.as_ptr().add(offset), dst, n);
            dst = dst.add(n);
        }
        len -= n;
        offset = 0;
    }
}

enum AsyncState {
    Ring { index: usize },
    Thread(Arc<Oneshot>),
    Failed(Option<Status>),
    Finished,
}

/// The result of a call run on a helper thread, and the waker of the task awaiting it.
type OneshotState = (Option<Result<Reply, Status>>, Option<Waker>);

#[derive(Default)]
struct Oneshot {
    value: Mutex<OneshotState>,
}

impl Oneshot {
    fn complete(&self, value: Result<Reply, Status>) {
        let waker = {
            let mut v = lock(&self.value);
            v.0 = Some(value);
            v.1.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// How long an async call that is its connection's spinner polls the response ring within
/// one `poll` of its future before returning `Pending` (and asking to be polled again).
const IN_POLL_SPIN: Duration = Duration::from_micros(4);

struct CallFuture {
    client: Client,
    state: AsyncState,
    deadline: Option<Instant>,
    /// Whether this call may still take the spinner's role.
    may_spin: bool,
    /// Set while this call is the connection's spinner: until then, a pending poll asks to be
    /// polled again at once instead of waiting for the reaper's wake-up (the async form of
    /// the wait policy's spin phase). The task yields to every other ready task in between,
    /// so it never blocks the executor, and each poll drains the ring for every call, waking
    /// the others on the same executor without a thread hand-off. At most one call spins per
    /// connection; the reaper keeps off the ring meanwhile.
    spin_until: Option<Instant>,
    /// `delivered` when the spin budget was last renewed.
    progress: u64,
}

impl Future for CallFuture {
    type Output = Result<Reply, Status>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let shared = this.client.handle.shared.clone();
        match &mut this.state {
            AsyncState::Finished => {
                Poll::Ready(Err(Status::internal("future polled after completion")))
            }
            AsyncState::Failed(status) => {
                let status = status
                    .take()
                    .unwrap_or_else(|| Status::internal("no status"));
                this.state = AsyncState::Finished;
                Poll::Ready(Err(status))
            }
            AsyncState::Thread(cell) => {
                let mut v = lock(&cell.value);
                match v.0.take() {
                    Some(result) => {
                        drop(v);
                        this.state = AsyncState::Finished;
                        Poll::Ready(result)
                    }
                    None => {
                        v.1 = Some(cx.waker().clone());
                        Poll::Pending
                    }
                }
            }
            AsyncState::Ring { index, .. } => {
                let index = *index;
                let slot = &shared.slots[index];
                let finish = |this: &mut CallFuture, result| {
                    shared.async_waiters.fetch_sub(1, Ordering::AcqRel);
                    this.stop_spinning(false);
                    this.state = AsyncState::Finished;
                    Poll::Ready(result)
                };
                if state_of(slot.state.load(Ordering::Acquire)) == DONE {
                    return finish(this, shared.take_reply(index));
                }
                // The spinner's role first, so that the drain below, seeing a spinner, leaves
                // the reaper asleep instead of waking it (a system call, and a thread on this
                // core) for a call this task polls itself.
                if this.spin_until.is_none() {
                    // Adopt a vacant role (held for us, the reaper is off the ring), or take a
                    // free one.
                    let adopted = shared
                        .role_vacant
                        .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok();
                    let claimed = !adopted
                        && this.may_spin
                        && shared
                            .spinning
                            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
                            .is_ok();
                    if adopted || claimed {
                        this.spin_until = Instant::now().checked_add(shared.config.wait.spin);
                        this.progress = shared.delivered.load(Ordering::Relaxed);
                    }
                    if claimed {
                        // Get the reaper out of its wait (where it holds the ring).
                        netless_ring::ring(shared.conn.doorbell());
                    }
                }
                // The spinner polls the ring in place for a moment before handing the task
                // back to the executor: a round trip through the executor costs more than
                // the cache-line transfer that brings the reply (from `block_on`, a wake is
                // an eventfd write and the executor's next turn an `epoll_wait`). It stops as
                // soon as any reply is delivered (other calls' tasks may now be ready) and
                // after IN_POLL_SPIN at most, so the executor is never held longer.
                let spin_from = this.spin_until.map(|_| Instant::now());
                let mut polls = 0u32;
                loop {
                    let before = shared.delivered.load(Ordering::Relaxed);
                    if let Some(mut consumer) = shared.consumer.try_lock() {
                        let drained = shared.drain(&mut consumer, None);
                        drop(consumer);
                        shared.after_consumer_release();
                        if let Err(status) = drained {
                            shared.fail(status);
                            break;
                        }
                    }
                    let Some(since) = spin_from else { break };
                    polls += 1;
                    if shared.delivered.load(Ordering::Relaxed) != before
                        || shared.dead.load(Ordering::Relaxed)
                        || (polls.is_multiple_of(32) && since.elapsed() >= IN_POLL_SPIN)
                    {
                        break;
                    }
                    std::hint::spin_loop();
                }
                {
                    let mut waker = lock(&slot.waker);
                    if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        *waker = Some(cx.waker().clone());
                    }
                }
                if state_of(slot.state.load(Ordering::Acquire)) == DONE {
                    return finish(this, shared.take_reply(index));
                }
                let expired = this.deadline.is_some_and(|d| Instant::now() >= d);
                if shared.dead.load(Ordering::Acquire) || expired {
                    let mut out = Vec::new();
                    let result = match shared.abandon(index, &mut out) {
                        Some(r) => r.map(|metadata| Reply {
                            metadata,
                            payload: out,
                        }),
                        None if expired => Err(deadline_status()),
                        None => Err(shared.death_status()),
                    };
                    return finish(this, result);
                }
                if this.spin_until.is_some() {
                    // Replies are flowing (calls ahead of this one in the server's queue):
                    // spinning still pays, so the budget runs from the latest reply.
                    let delivered = shared.delivered.load(Ordering::Relaxed);
                    if delivered != this.progress {
                        this.progress = delivered;
                        this.spin_until = Instant::now().checked_add(shared.config.wait.spin);
                    }
                }
                if this.spin_until.is_some_and(|t| Instant::now() < t) {
                    cx.waker().wake_by_ref();
                } else if this.spin_until.is_some() {
                    // Spun out: the reaper takes over, and this call waits to be woken.
                    this.may_spin = false;
                    this.stop_spinning(true);
                }
                Poll::Pending
            }
        }
    }
}

impl CallFuture {
    /// Gives up the spinner's role. `hand_to_reaper` when calls may be left waiting with
    /// nobody polling (the spin ran out, or the call was dropped); after a reply, the next
    /// call on this executor usually takes the role at once, and the reaper checks back
    /// within [`SPINNER_CHECK`] anyway, so it is not woken (a wake-up per call would cost a
    /// context switch per call).
    fn stop_spinning(&mut self, hand_to_reaper: bool) {
        if self.spin_until.take().is_some() {
            let shared = &self.client.handle.shared;
            if !hand_to_reaper && shared.async_waiters.load(Ordering::Acquire) > 0 {
                // Pass the role on without letting go of it (the reaper would otherwise
                // take the ring in the gap): a waiting call's task adopts it when polled.
                shared.role_vacant.store(true, Ordering::Release);
                shared.nudge_one_async();
                return;
            }
            shared.spinning.store(0, Ordering::Release);
            if hand_to_reaper {
                if let Some(t) = lock(&shared.reaper_thread).as_ref() {
                    t.unpark();
                }
            }
        }
    }
}

impl Drop for CallFuture {
    fn drop(&mut self) {
        self.stop_spinning(true);
        if let AsyncState::Ring { index, .. } = self.state {
            let shared = &self.client.handle.shared;
            *lock(&shared.slots[index].waker) = None;
            let mut out = Vec::new();
            let _ = shared.abandon(index, &mut out);
            shared.async_waiters.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Shared {
    /// Bytes of this connection's segment handle (for fault injection in tests).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn replica(&self) -> &ReplicaSegment {
        &self.replica
    }
    #[cfg(feature = "fault-injection")]
    pub(crate) fn conn_identity(&self) -> (u32, u64) {
        (self.conn_index, self.token)
    }
    #[cfg(feature = "fault-injection")]
    pub(crate) fn claim_for_fault(&self, count: u32) -> Option<u32> {
        self.lease
            .claim(self.replica.table(), self.shared_head(), count)
    }
}
