//! The server: binds a service's socket, admits connections, and runs worker threads that
//! pull requests from the replica's one shared receive queue (single-queue dispatch).
//!
//! The acceptor thread owns the connection table: it checks `SO_PEERCRED` against the ACL
//! before any fd is passed, performs the handshake, and watches every connection's socket. A
//! hang-up is the kernel's notice that the client died: the connection is retired and, once
//! no worker can still be touching its requests, every block carrying its tag is freed.
//!
//! Workers validate every request against the connection table (index, secret token, block
//! ownership, lengths) before reading it. A connection whose requests fail validation is
//! closed with a `Goodbye`; unattributable garbage is counted and dropped. No byte a client
//! wrote can make a worker panic, read out of bounds or wait forever.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use netless_ring::prefetch::{prefetch_read, prefetch_read_range, prefetch_write_range};
use netless_ring::{ConsumerHead, Dequeue, Producer, PushError};
use netless_shm::{peer_cred, recv_frame, send_frame};

use crate::call::{Request, ResponseBuilder};
use crate::config::{replica_socket, resolve_socket, Dispatch, Provisioning, ServerConfig, Slo};
use crate::handshake::{Frame, PROTOCOL_VERSION};
use crate::layout::{
    align8, batch_bucket, block_state, bump, compact_flags, conn_tag, kind, latency_bucket,
    provisioning, read_request_header, wire_flags, CompactHeader, CompactReply, ResponseHeader,
    ShortHeader, WireHeader, COMPACT_HEADER_LEN, COMPACT_REPLY_LEN, RESPONSE_HEADER_LEN,
    SHORT_HEADER_LEN,
};
use crate::metadata::Metadata;
use crate::segments::{ConnSegment, ReplicaSegment, ReplicaSpec};
use crate::spin_lock::SpinLock;
use crate::status::{Code, ReplyCode, Status};
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use crate::wake::WakeSource;

/// Serves one method table. Implemented for closures.
///
/// ```
/// use netless::{Handler, Request, ResponseBuilder, Status};
/// let echo = |req: &Request<'_>, resp: &mut ResponseBuilder| -> Result<(), Status> {
///     resp.payload.extend_from_slice(req.payload);
///     Ok(())
/// };
/// fn is_handler(_: &impl Handler) {}
/// is_handler(&echo);
/// ```
pub trait Handler: Send + Sync + 'static {
    /// Handles one request, writing the response into `response`; an `Err` becomes the call's
    /// status.
    fn call<'a>(
        &self,
        request: &Request<'a>,
        response: &mut ResponseBuilder<'a>,
    ) -> Result<(), Status>;

    /// Runs work of the handler's own on worker `worker`'s thread, such as collecting the
    /// replies of calls it made on a [`Pipeline`](crate::Pipeline) and sending the
    /// [`DeferredReply`]s waiting for them. Returns whether it did anything.
    ///
    /// A worker calls it after every queue entry it serves and whenever its queue is empty
    /// (while it spins, and before it sleeps: a `true` keeps it awake). Replies sent from
    /// here ring each client's doorbell once, when `poll` returns. The default does nothing.
    fn poll(&self, worker: usize) -> bool {
        let _ = worker;
        false
    }

    /// What else should wake worker `worker` when it sleeps: the doorbells of the
    /// connections whose replies [`Handler::poll`] collects ([`Pipeline::wake_source`],
    /// [`Client::wake_source`]). Asked once, when the worker starts; at most
    /// [`WAIT_ANY_MAX`](netless_ring::WAIT_ANY_MAX) − 1 are slept on, and a worker polls
    /// at least every 100 ms anyway. The default is none.
    ///
    /// [`Pipeline::wake_source`]: crate::Pipeline::wake_source
    /// [`Client::wake_source`]: crate::Client::wake_source
    fn wake_sources(&self, worker: usize) -> Vec<WakeSource> {
        let _ = worker;
        Vec::new()
    }

    /// Whether [`Handler::poll`] may do anything: `false` for a closure, which cannot have
    /// a `poll` of its own, so its workers skip the call (and the ring section around it)
    /// after every entry.
    #[doc(hidden)]
    fn polls(&self) -> bool {
        true
    }
}

impl<F> Handler for F
where
    F: for<'a> Fn(&Request<'a>, &mut ResponseBuilder<'a>) -> Result<(), Status>
        + Send
        + Sync
        + 'static,
{
    fn call<'a>(
        &self,
        request: &Request<'a>,
        response: &mut ResponseBuilder<'a>,
    ) -> Result<(), Status> {
        self(request, response)
    }

    fn polls(&self) -> bool {
        false
    }
}

/// Counters describing a running server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections currently open.
    pub connections: u32,
    /// Requests answered.
    pub requests: u64,
    /// Requests whose handler returned an error status.
    pub errors: u64,
    /// Queue entries or requests dropped as corrupt or unattributable.
    pub dropped: u64,
    /// Connections closed for violating the protocol.
    pub protocol_violations: u64,
    /// Blocks of the receive buffer that are free (not holding a request).
    pub free_blocks: u32,
    /// Blocks in the receive buffer (all partitions).
    pub total_blocks: u32,
    /// Bytes of receive buffer provisioned for the current connections: the whole buffer in
    /// [`Provisioning::Shared`] and [`Provisioning::PerWorker`], one partition per live
    /// connection in [`Provisioning::PerConnection`].
    pub receive_buffer_bytes: u64,
    /// Requests clients refused to send (buffer full or queue deeper than the SLO allows),
    /// as counted by the clients in shared memory (a hint: clients write it).
    pub nacks: u64,
    /// Requests the workers refused without running them: they had waited too long in the
    /// queue to finish within the SLO (`crate::admission`). Also NACKs to the caller, and
    /// counted in `errors` (`RESOURCE_EXHAUSTED`).
    pub shed: u64,
    /// The queue-depth limit in force (0: none).
    pub depth_limit: u32,
    /// Mean handler time measured so far (with an SLO whose service time is not declared).
    pub measured_service: Option<Duration>,
}

/// A running netless server for one service. Stops (and removes its socket) when dropped or
/// on [`Server::shutdown`].
///
/// ```no_run
/// use netless::{Server, ServerConfig, Request, ResponseBuilder, Status};
/// let server = Server::bind("demo.Echo", ServerConfig::default(),
///     |req: &Request<'_>, resp: &mut ResponseBuilder| -> Result<(), Status> {
///         resp.payload.extend_from_slice(req.payload);
///         Ok(())
///     })?;
/// server.wait();
/// # Ok::<(), netless::Status>(())
/// ```
pub struct Server {
    shared: Arc<ServerShared>,
    threads: Vec<JoinHandle<()>>,
    stop: OwnedFd,
}

struct ServerShared {
    /// This server, for handles that outlive a handler call ([`DeferredReply`]).
    this: std::sync::Weak<ServerShared>,
    /// Set (by a worker, before the first [`DeferredReply`] exists) once any handler deferred
    /// a reply: from then on replies may come from other threads, so even a single worker
    /// locks the producer.
    deferring: AtomicBool,
    service: String,
    socket_path: PathBuf,
    config: ServerConfig,
    replica: ReplicaSegment,
    /// Consumer position of each receive queue.
    heads: Box<[ConsumerHead]>,
    slots: Box<[ConnSlot]>,
    handler: Box<dyn Handler>,
    stopping: AtomicBool,
    workers: Box<[WorkerSlot]>,
    dropped: AtomicU64,
    violations: AtomicU64,
    /// See [`ServerStats::shed`].
    shed: AtomicU64,
    connections: AtomicU32,
    #[cfg(feature = "fault-injection")]
    corrupt_responses: AtomicU32,
}

/// What one worker is doing, and its counters: written only by that worker (plain stores,
/// no locked instructions on the hot path), read by the acceptor and `stats`. Padded to its
/// own cache line.
#[repr(align(64))]
#[derive(Default)]
struct WorkerSlot {
    /// `IDLE`, `BUSY` (between taking a queue entry and knowing its connection), or the tag
    /// of the connection whose request it is serving.
    serving: AtomicU32,
    /// This worker's number (its `WorkerStats` in the replica segment).
    index: usize,
    /// `BUSY` while the worker holds a second, prefetched queue entry (`Dispatch::Jbsq2`).
    held: AtomicU32,
    /// Requests measured into `busy_ns`.
    measured: AtomicU64,
    /// Nanoseconds spent serving requests (measured only for an SLO without a declared
    /// service time).
    busy_ns: AtomicU64,
}

const IDLE: u32 = 0;
const BUSY: u32 = u32::MAX;

struct ConnSlot {
    /// The live connection's tag, or 0.
    tag: AtomicU32,
    conn: RwLock<Option<Arc<Conn>>>,
}

struct Conn {
    index: u32,
    tag: u32,
    token: u64,
    segment: ConnSegment,
    producer: SpinLock<Producer<'static>>,
    /// Where the next response record goes (a prefetch hint, updated after each push).
    next_record: AtomicUsize,
    socket: UnixStream,
    dead: AtomicBool,
    partials: Mutex<HashMap<u64, Partial>>,
    /// The largest response body this client accepts (from its `Hello`).
    client_max: usize,
    /// The longest record its response ring takes.
    record_limit: usize,
    /// It sent a compact batch, so it reads `RESPONSE_BATCH` records (it is a `Pipeline`).
    pipelined: AtomicBool,
    /// The client shares our page-pool domain: its payloads may arrive as Refs.
    by_ref: bool,
    /// The client's pid (`SO_PEERCRED`): it may send only Refs it created.
    peer_pid: u32,
}

/// A worker's running estimate of requests per queue entry (batches hold several), which
/// it publishes in `ServerControl::requests_per_entry_x16` for clients to scale the queue's
/// depth by: an exponential average over the last few dozen entries, stored only when it
/// moved by an eighth of a request or more, so the line clients read stays put.
struct PerEntry {
    /// The average, in 1024ths of a request (fine enough that the integer average converges).
    x1024: i64,
    /// What this worker last published, in sixteenths.
    published: u32,
}

impl Default for PerEntry {
    fn default() -> Self {
        PerEntry {
            x1024: 1024,
            published: 0,
        }
    }
}

impl PerEntry {
    #[inline(always)]
    fn observe(&mut self, requests: u32, shared: &AtomicU32) {
        let sample = i64::from(requests.clamp(1, 256)) * 1024;
        if sample == self.x1024 && self.published != 0 {
            // Steady (lone requests at B=1): nothing moves.
            return;
        }
        // x += (sample - x) / 16: a mean over the last few dozen entries.
        self.x1024 += (sample - self.x1024) / 16;
        let x16 = ((self.x1024 + 32) / 64).clamp(16, 16 * 256) as u32;
        if x16.abs_diff(self.published) >= 2 {
            self.published = x16;
            shared.store(x16, Ordering::Relaxed);
        }
    }
}

/// A worker's reusable response buffers, so a steady stream of calls allocates nothing.
#[derive(Default)]
struct Scratch {
    metadata: Metadata,
    payload: Vec<u8>,
    /// The method of the last request served (a private, validated copy).
    method: String,
    /// Whether `method` is one of the runtime's own (`netless.ctl/`), kept with it.
    method_is_control: bool,
    /// Requests in the queue entry just served (a batch holds several).
    batch: u32,
    /// How long it had waited when the worker started it, µs, if too long to finish within
    /// the SLO: its requests are refused without running ([`crate::admission::waited_too_long`]).
    shed: Option<u32>,
    /// The SLO (µs) for which `shed_after_us` was computed (`None`: compute it again).
    shed_slo_us: Option<u32>,
    /// [`crate::admission::shed_after_us`] for that SLO and the current mean service time.
    shed_after_us: u32,
    /// While a compact batch is served: its replies, gathered into one ring record
    /// (`CompactReply` entries) that goes out when the batch ends.
    collecting: bool,
    replies: ReplyBatch,
    /// The worker's index into the replica's stats.
    worker: usize,
    /// OK calls not yet added to the worker's stats ([`ServerShared::flush_tally`]).
    tally: Tally,
}

/// Counts of calls answered OK (and not deferred), added to the shared stats before any reply
/// they count can reach the client: a batch's in one go instead of per call.
#[derive(Default)]
struct Tally {
    calls: u64,
    bytes_in: u64,
    bytes_out: u64,
}

/// Replies gathered for one connection, sent as one `RESPONSE_BATCH` ring record of
/// `CompactReply` entries. Only a connection that sent compact batches (a `Pipeline`,
/// which reads such records) gets one.
#[derive(Default)]
struct ReplyBatch {
    bytes: Vec<u8>,
    count: u32,
}

impl ReplyBatch {
    /// The entry's length, if this reply to `call_id` may go in a batch to `conn`: whole,
    /// fitting a `CompactReply`'s fields (call id under 2^32, body under 64 KiB, metadata
    /// under 256 bytes), within the client's limit, at most half a record.
    fn entry_len(conn: &Conn, call_id: u64, md_len: usize, payload_len: usize) -> Option<usize> {
        let body_len = md_len + payload_len;
        let entry = COMPACT_REPLY_LEN + body_len;
        (call_id <= u64::from(u32::MAX)
            && md_len <= usize::from(u8::MAX)
            && body_len <= usize::from(u16::MAX)
            && body_len <= conn.client_max
            && entry <= (conn.record_limit - RESPONSE_HEADER_LEN) / 2)
            .then_some(entry)
    }

    /// Whether an entry of `entry` bytes still fits this batch's record for `conn`.
    fn fits(&self, conn: &Conn, entry: usize) -> bool {
        align8(self.bytes.len()) + entry <= conn.record_limit - RESPONSE_HEADER_LEN
    }

    /// Appends a reply that `entry_len` admitted (so its fields fit their widths). Inline:
    /// a batch's replies go through here one by one.
    #[inline(always)]
    fn push(&mut self, call_id: u64, code: ReplyCode, metadata: &Metadata, payload: &[u8]) {
        let md_len = metadata.encoded_len();
        let len = self.bytes.len();
        let at = align8(len);
        // One reservation for the padding, header and body: nothing below grows the buffer.
        self.bytes
            .reserve(at - len + COMPACT_REPLY_LEN + md_len + payload.len());
        let header = CompactReply {
            call_id: call_id as u32,
            body_len: (md_len + payload.len()) as u16,
            metadata_len: md_len as u8,
            status: code.wire8(),
        };
        // SAFETY: capacity >= at + COMPACT_REPLY_LEN >= len + 8 (reserved above); eight zero
        // bytes at `len` (the padding) and the header at `at` fill `len..at + 8` first.
        unsafe {
            let base = self.bytes.as_mut_ptr();
            base.add(len).cast::<u64>().write_unaligned(0);
            let header = header.as_bytes();
            std::ptr::copy_nonoverlapping(header.as_ptr(), base.add(at), COMPACT_REPLY_LEN);
            self.bytes.set_len(at + COMPACT_REPLY_LEN);
        }
        if md_len != 0 {
            metadata.encode_into(&mut self.bytes);
        }
        let len = self.bytes.len();
        // SAFETY: the reservation covers the payload after the metadata; the bytes are
        // written before `set_len` exposes them, and `payload` cannot overlap our buffer.
        unsafe {
            let dst = self.bytes.as_mut_ptr().add(len);
            netless_shm::copy::copy_bytes(payload.as_ptr(), dst, payload.len());
            self.bytes.set_len(len + payload.len());
        }
        self.count += 1;
    }
}

/// Deferred replies a worker sent inside a [`RingSection`], per connection, sent as reply
/// batches when the section ends.
struct PendingReplies {
    server: Arc<ServerShared>,
    conn: Arc<Conn>,
    batch: ReplyBatch,
}

thread_local! {
    /// How many [`RingSection`]s this thread is in.
    static SECTIONS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// Clients owed a ring at the end of the outermost section.
    static OWED: std::cell::RefCell<Vec<Arc<Conn>>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Whether `OWED` holds anything (so that a section that sent nothing costs two `Cell`
    /// updates: workers enter one on every idle poll).
    static ANY_OWED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Deferred replies sent in the section, to go out as reply batches when it ends.
    static PENDING: std::cell::RefCell<Vec<PendingReplies>> = const { std::cell::RefCell::new(Vec::new()) };
    static ANY_PENDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While a worker serves a batch, or runs its handler's [`Handler::poll`], the replies it
/// sends do not ring their clients' doorbells one by one: each client owed a ring is rung
/// once when the section ends (a ring costs a fence, and a system call while the client
/// sleeps, which every later ring would repeat until it woke).
struct RingSection;

impl RingSection {
    fn enter() -> RingSection {
        SECTIONS.set(SECTIONS.get() + 1);
        RingSection
    }
}

impl Drop for RingSection {
    fn drop(&mut self) {
        let depth = SECTIONS.get() - 1;
        if depth == 0 && ANY_PENDING.replace(false) {
            // Still inside the section, so these record their rings in OWED.
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
            // Taken out before ringing, so no borrow is held while the `Arc`s drop.
            let owed = OWED.with_borrow_mut(std::mem::take);
            for conn in &owed {
                netless_ring::ring(conn.segment.doorbell());
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

/// Rings `conn`'s doorbell now, or at the end of the thread's [`RingSection`].
fn ring_client(conn: &Arc<Conn>) {
    if SECTIONS.get() == 0 {
        netless_ring::ring(conn.segment.doorbell());
        return;
    }
    OWED.with_borrow_mut(|owed| {
        if !owed.iter().any(|c| Arc::ptr_eq(c, conn)) {
            owed.push(conn.clone());
        }
    });
    ANY_OWED.set(true);
}

/// Gives a request's blocks back to their client (a plain Release store each: see
/// `serve_conn`).
#[inline(always)]
fn free_blocks(words: &[AtomicU32]) {
    for w in words {
        w.store(block_state::FREE, Ordering::Release);
    }
}

/// A fragmented request being reassembled.
struct Partial {
    body: Vec<u8>,
    received: usize,
    /// When the first fragment arrived: a request left half-sent (its client gave up) is
    /// dropped after `PARTIAL_TTL`.
    started: Instant,
}

/// How long a half-received fragmented request is kept.
const PARTIAL_TTL: Duration = Duration::from_secs(10);

/// Most fragmented requests one connection may have half-sent at once.
const MAX_PARTIALS: usize = 16;
/// Most queue entries a worker serves in one [`ServerShared::serve_lone_run`]: between runs
/// it goes idle for a moment, which is when retired connections' blocks can be reclaimed.
const LONE_RUN: u32 = 64;
/// How long a retired connection waits before its blocks are freed, so that a worker which
/// has just dequeued one of its requests has finished looking at it.
const RECLAIM_GRACE: Duration = Duration::from_millis(20);
/// Handshake time limit per connection.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(500);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Conn {
    /// Starts owning the response ring's lines a reply with a `body_len`-byte body would
    /// take now (a guess made before the handler runs: a reply about as long as the request).
    #[inline(always)]
    fn prefetch_reply(&self, body_len: usize) {
        let next = self.next_record.load(Ordering::Relaxed) as *const u8;
        prefetch_write_range(next, 8 + RESPONSE_HEADER_LEN + body_len, 64);
    }

    /// After a reply with a `body_len`-byte body: starts owning the lines a reply like it
    /// will take next time, but not the first (the client polls its record word, and
    /// stealing it would only bounce).
    #[inline(always)]
    fn prefetch_next_reply(&self, body_len: usize) {
        let next = self.next_record.load(Ordering::Relaxed) as *const u8;
        let reply_len = 8 + RESPONSE_HEADER_LEN + body_len;
        prefetch_write_range(next.wrapping_add(64), reply_len.saturating_sub(64), 64);
    }

    /// Closes the connection, telling the client why.
    fn close(&self, status: Status) {
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self
            .socket
            .set_write_timeout(Some(Duration::from_millis(10)));
        let _ = send_frame(&self.socket, &Frame::Goodbye(status).encode(), &[]);
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }
}

impl Server {
    /// Binds `service` and starts serving it with `handler`.
    ///
    /// Fails with `ALREADY_EXISTS` if a live server already serves that name in the socket
    /// directory (a stale socket from a dead server is replaced).
    pub fn bind(
        service: &str,
        config: ServerConfig,
        handler: impl Handler,
    ) -> Result<Server, Status> {
        config.validate()?;
        let (dir, mut socket_path) = resolve_socket(config.dir.as_deref(), service)?;
        if let Some(n) = config.replica {
            socket_path = replica_socket(&dir, service, n)?;
        }
        if socket_path.exists() {
            if UnixStream::connect(&socket_path).is_ok() {
                return Err(Status::new(
                    Code::AlreadyExists,
                    format!(
                        "service `{service}` is already served at {}: stop that server or pick another name",
                        socket_path.display()
                    ),
                ));
            }
            let _ = std::fs::remove_file(&socket_path);
        }
        let part_blocks = (config.partition_bytes() / config.block_size as usize) as u32;
        let replica = ReplicaSegment::create(
            service,
            ReplicaSpec {
                block_size: config.block_size,
                provisioning: match config.provisioning {
                    Provisioning::Shared => provisioning::SHARED,
                    Provisioning::PerWorker => provisioning::PER_WORKER,
                    Provisioning::PerConnection => provisioning::PER_CONNECTION,
                },
                nparts: config.partitions(),
                part_blocks,
                nqueues: config.queues(),
                workers: config.workers as u32,
                max_message: config.max_message as u32,
                max_connections: config.max_connections,
            },
        )?;
        if let Some(limit) = config.depth_limit(None) {
            replica
                .server_control()
                .depth_limit
                .store(limit, Ordering::Relaxed);
        }
        crate::control::init(replica.server_control(), &config);
        let listener = UnixListener::bind(&socket_path).map_err(|e| {
            Status::unavailable(format!("cannot bind {}: {e}", socket_path.display()))
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Status::internal(format!("listener: {e}")))?;
        let shared = Arc::new_cyclic(|this| ServerShared {
            this: this.clone(),
            deferring: AtomicBool::new(false),
            service: service.to_string(),
            socket_path,
            heads: (0..config.queues()).map(|_| ConsumerHead::new()).collect(),
            slots: (0..config.max_connections)
                .map(|_| ConnSlot {
                    tag: AtomicU32::new(0),
                    conn: RwLock::new(None),
                })
                .collect(),
            handler: Box::new(handler),
            stopping: AtomicBool::new(false),
            workers: (0..config.workers)
                .map(|index| WorkerSlot {
                    index,
                    ..WorkerSlot::default()
                })
                .collect(),
            dropped: AtomicU64::new(0),
            violations: AtomicU64::new(0),
            shed: AtomicU64::new(0),
            connections: AtomicU32::new(0),
            #[cfg(feature = "fault-injection")]
            corrupt_responses: AtomicU32::new(0),
            replica,
            config,
        });
        let stop = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
            .map_err(|e| Status::resource_exhausted(format!("eventfd: {e}")))?;
        // Built before the threads, so that if a spawn fails, dropping it stops and joins the
        // threads already running and removes the socket.
        let mut server = Server {
            shared,
            threads: Vec::new(),
            stop,
        };
        for worker in 0..server.shared.config.workers {
            let shared = server.shared.clone();
            let spawned = thread::Builder::new()
                .name(format!("netless-worker-{worker}"))
                .spawn(move || shared.work(worker));
            server.threads.push(
                spawned.map_err(|e| Status::resource_exhausted(format!("spawn worker: {e}")))?,
            );
        }
        {
            let shared = server.shared.clone();
            let stop = server
                .stop
                .try_clone()
                .map_err(|e| Status::resource_exhausted(format!("dup: {e}")))?;
            let spawned = thread::Builder::new()
                .name("netless-acceptor".into())
                .spawn(move || shared.accept_loop(listener, stop));
            server.threads.push(
                spawned.map_err(|e| Status::resource_exhausted(format!("spawn acceptor: {e}")))?,
            );
        }
        Ok(server)
    }

    /// The service name.
    pub fn service(&self) -> &str {
        &self.shared.service
    }

    /// The Unix socket clients connect to.
    pub fn socket_path(&self) -> &Path {
        &self.shared.socket_path
    }

    /// A snapshot of the server's counters.
    pub fn stats(&self) -> ServerStats {
        let table = self.shared.replica.table();
        ServerStats {
            connections: self.shared.connections.load(Ordering::Relaxed),
            requests: self
                .shared
                .replica
                .stats()
                .iter()
                .map(|w| w.calls.load(Ordering::Relaxed))
                .sum(),
            errors: self
                .shared
                .replica
                .stats()
                .iter()
                .map(|w| w.errors.load(Ordering::Relaxed))
                .sum(),
            dropped: self.shared.dropped.load(Ordering::Relaxed),
            protocol_violations: self.shared.violations.load(Ordering::Relaxed),
            free_blocks: table
                .iter()
                .filter(|w| w.load(Ordering::Relaxed) == block_state::FREE)
                .count() as u32,
            total_blocks: table.len() as u32,
            receive_buffer_bytes: self.receive_buffer_bytes(),
            nacks: self
                .shared
                .replica
                .client_control()
                .nacks
                .load(Ordering::Relaxed),
            shed: self.shared.shed.load(Ordering::Relaxed),
            depth_limit: self
                .shared
                .replica
                .server_control()
                .depth_limit
                .load(Ordering::Relaxed),
            measured_service: self.shared.measured_service(),
        }
    }

    /// Bytes of receive buffer provisioned for the current connections (see
    /// [`ServerStats::receive_buffer_bytes`]).
    pub fn receive_buffer_bytes(&self) -> u64 {
        let g = self.shared.replica.geometry();
        let part = u64::from(g.part_blocks) * u64::from(g.block_size);
        match g.provisioning {
            provisioning::PER_CONNECTION => {
                part * u64::from(self.shared.connections.load(Ordering::Relaxed))
            }
            _ => part * u64::from(g.nparts),
        }
    }

    /// Test-only: answer every call with garbage instead (1: a malformed response header,
    /// 2: scribble over the whole response ring).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn fault_corrupt_responses(&self, mode: u32) {
        self.shared.corrupt_responses.store(mode, Ordering::Relaxed);
    }

    /// Blocks the calling thread until the server stops (it only stops when dropped or shut
    /// down from another thread, so this is for `main` of a server process).
    pub fn wait(&self) {
        while !self.shared.stopping.load(Ordering::Acquire) {
            thread::park_timeout(Duration::from_millis(200));
        }
    }

    /// Stops accepting, closes every connection (their clients' calls fail with
    /// `UNAVAILABLE`), joins the threads and removes the socket.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if self.shared.stopping.swap(true, Ordering::AcqRel) && self.threads.is_empty() {
            return;
        }
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        for q in self.shared.replica.queues() {
            netless_ring::ring_all(q.doorbell);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for slot in self.shared.slots.iter() {
            if let Some(conn) = slot.conn.write().unwrap_or_else(|e| e.into_inner()).take() {
                conn.close(Status::unavailable(format!(
                    "service `{}` is shutting down",
                    self.shared.service
                )));
            }
        }
        let _ = std::fs::remove_file(&self.shared.socket_path);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_now();
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("service", &self.shared.service)
            .field("socket", &self.shared.socket_path)
            .finish()
    }
}

/// A retired connection waiting for its blocks to be freed.
struct Dying {
    conn: Arc<Conn>,
    tail_at_death: u64,
    since: Instant,
}

impl ServerShared {
    fn accept_loop(&self, listener: UnixListener, stop: OwnedFd) {
        use rustix::event::{poll, PollFd, PollFlags};
        let mut live: HashMap<RawFd, Arc<Conn>> = HashMap::new();
        let mut dying: Vec<Dying> = Vec::new();
        let mut generation = 0u32;
        while !self.stopping.load(Ordering::Acquire) {
            let conns: Vec<Arc<Conn>> = live.values().cloned().collect();
            let mut fds = Vec::with_capacity(conns.len() + 2);
            fds.push(PollFd::new(&stop, PollFlags::IN));
            fds.push(PollFd::new(&listener, PollFlags::IN));
            for c in &conns {
                fds.push(PollFd::new(&c.socket, PollFlags::IN));
            }
            let timeout = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: if dying.is_empty() {
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
                .filter(|(fd, c)| !fd.revents().is_empty() || c.dead.load(Ordering::Acquire))
                .map(|(_, c)| c.clone())
                .collect();
            drop(fds);
            for conn in hung {
                // Any byte or hang-up on a connection's socket ends it: clients send nothing
                // after the handshake.
                let mut probe = [0u8; 1];
                let _ = conn.socket.set_nonblocking(true);
                let peer_gone = !matches!((&conn.socket).read(&mut probe), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock);
                if !peer_gone && !conn.dead.load(Ordering::Acquire) {
                    continue;
                }
                live.remove(&conn.socket.as_raw_fd());
                self.retire(&conn);
                // The tail is written by clients: never believe it more than a lap ahead.
                let q = conn.index as usize % self.heads.len();
                let head = self.heads[q].position();
                let queue = &self.replica.queues()[q].queue;
                let lap = u64::from(queue.capacity());
                let tail = queue.tail_hint();
                let tail_at_death = if tail.wrapping_sub(head) <= lap {
                    tail
                } else {
                    head + lap
                };
                dying.push(Dying {
                    tail_at_death,
                    since: Instant::now(),
                    conn,
                });
            }
            if accept_ready {
                while let Ok((socket, _)) = listener.accept() {
                    generation = generation.wrapping_add(1);
                    if let Some(conn) = self.admit(socket, generation) {
                        live.insert(conn.socket.as_raw_fd(), conn);
                    }
                }
            }
            dying.retain(|d| !self.try_reclaim(d));
            self.update_depth_limit();
        }
        for conn in live.values() {
            conn.close(Status::unavailable(format!(
                "service `{}` is shutting down",
                self.service
            )));
        }
    }

    /// Handshake with a new client; `None` if it was refused or failed.
    /// Our page-pool domain's id, or 0.
    fn domain_id(&self) -> u64 {
        self.config.domain.as_ref().map_or(0, |d| d.id())
    }

    fn admit(&self, socket: UnixStream, generation: u32) -> Option<Arc<Conn>> {
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
        let peer_pid = match peer_cred(&socket) {
            Ok(cred) if self.config.acl.allows(&cred) => cred.pid.max(0) as u32,
            Ok(cred) => {
                return reject(Status::new(
                    Code::PermissionDenied,
                    format!(
                        "uid {} gid {} is not allowed to use service `{}` (its ACL admits uids {:?}, gids {:?})",
                        cred.uid,
                        cred.gid,
                        self.service,
                        self.config.acl.uids(),
                        self.config.acl.gids()
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
        let limit = self
            .replica
            .server_control()
            .max_connections
            .load(Ordering::Relaxed);
        if self.connections.load(Ordering::Relaxed) >= limit {
            return reject(Status::resource_exhausted(format!(
                "service `{}` admits at most {limit} connections now (its max_connections register)",
                self.service
            )));
        }
        let Some(index) = self.slots.iter().position(|s| {
            s.tag.load(Ordering::Acquire) == 0
                && s.conn.read().map(|c| c.is_none()).unwrap_or(false)
        }) else {
            return reject(Status::resource_exhausted(format!(
                "service `{}` has its maximum of {} connections",
                self.service, self.config.max_connections
            )));
        };
        let tag = conn_tag(index as u32, generation);
        let token = random_token();
        let conn = Arc::new(Conn {
            index: index as u32,
            tag,
            token,
            next_record: AtomicUsize::new(producer.next_record_ptr() as usize),
            record_limit: producer.max_record_len(),
            pipelined: AtomicBool::new(false),
            producer: SpinLock::new(producer),
            segment,
            socket,
            dead: AtomicBool::new(false),
            partials: Mutex::new(HashMap::new()),
            client_max,
            // Refs only from a process the domain itself admitted (checked against the
            // domain's member table, not the id the client claims), and only its own.
            by_ref: client_domain != 0
                && client_domain == self.domain_id()
                && self
                    .config
                    .domain
                    .as_ref()
                    .is_some_and(|d| d.has_member(peer_pid)),
            peer_pid,
        });
        *self.slots[index]
            .conn
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
        self.slots[index].tag.store(tag, Ordering::Release);
        // Counted before the client hears it is connected, so stats read after its
        // `connect` returns include it.
        self.count_connection(1);
        let welcome = Frame::Welcome {
            version: PROTOCOL_VERSION,
            conn_index: index as u32,
            tag,
            token,
            domain: self.domain_id(),
        };
        if send_frame(
            &conn.socket,
            &welcome.encode(),
            &[self.replica.segment().fd()],
        )
        .is_err()
        {
            self.slots[index].tag.store(0, Ordering::Release);
            *self.slots[index]
                .conn
                .write()
                .unwrap_or_else(|e| e.into_inner()) = None;
            self.count_connection(-1);
            return None;
        }
        let _ = conn.socket.set_read_timeout(None);
        let _ = conn.socket.set_write_timeout(None);
        Some(conn)
    }

    /// Adds `delta` to the live connection count, here and in the shared control block.
    fn count_connection(&self, delta: i32) {
        let n = self
            .connections
            .fetch_add(delta as u32, Ordering::Relaxed)
            .wrapping_add(delta as u32);
        self.replica
            .server_control()
            .connections
            .store(n, Ordering::Relaxed);
    }

    /// Marks a connection dead so no worker serves it again.
    fn retire(&self, conn: &Conn) {
        conn.dead.store(true, Ordering::Release);
        self.slots[conn.index as usize]
            .tag
            .store(0, Ordering::Release);
        let _ = conn.socket.shutdown(std::net::Shutdown::Both);
    }

    /// Frees a retired connection's blocks once no worker can be touching its requests.
    fn try_reclaim(&self, d: &Dying) -> bool {
        let q = d.conn.index as usize % self.heads.len();
        let drained = self.heads[q].position().wrapping_sub(d.tail_at_death) as i64 >= 0;
        // Pairs with the workers' Release stores of the head: what they did before moving it
        // (marking themselves BUSY) is visible to the checks below.
        std::sync::atomic::fence(Ordering::Acquire);
        if !(drained
            && self.workers.iter().all(|w| {
                let serving = w.serving.load(Ordering::Acquire);
                serving != BUSY && serving != d.conn.tag && w.held.load(Ordering::Acquire) != BUSY
            })
            && d.since.elapsed() >= RECLAIM_GRACE)
        {
            return false;
        }
        let tag = d.conn.tag;
        let table = self.replica.table();
        // Where this connection could have allocated: its partition (a faulty client's
        // writes elsewhere are caught by the tag check of whoever reads those words).
        let words = match self.config.provisioning {
            Provisioning::Shared => table,
            _ => {
                let part = self.replica.partition_for(d.conn.index);
                &table[part.start as usize..part.end as usize]
            }
        };
        for word in words {
            let _ = word.compare_exchange(
                block_state::owned(tag),
                block_state::FREE,
                Ordering::Release,
                Ordering::Relaxed,
            );
        }
        *self.slots[d.conn.index as usize]
            .conn
            .write()
            .unwrap_or_else(|e| e.into_inner()) = None;
        self.count_connection(-1);
        true
    }

    /// With an SLO whose service time is not declared: once the workers have served
    /// `Slo::WARMUP` requests, publishes the queue-depth limit for the measured mean.
    fn update_depth_limit(&self) {
        let Some(slo) = &self.config.slo else { return };
        if slo.mean_service.is_some() {
            return;
        }
        if let Some(mean) = self.measured_service() {
            if let Some(limit) = self.config.depth_limit(Some(mean)) {
                self.replica
                    .server_control()
                    .depth_limit
                    .store(limit, Ordering::Relaxed);
            }
        }
    }

    /// Mean time a worker spends on a request, once `Slo::WARMUP` have been measured.
    fn measured_service(&self) -> Option<Duration> {
        let slo = self.config.slo.as_ref()?;
        if slo.mean_service.is_some() {
            return None;
        }
        let (n, ns) = self.workers.iter().fold((0u64, 0u64), |(n, ns), w| {
            (
                n + w.measured.load(Ordering::Relaxed),
                ns + w.busy_ns.load(Ordering::Relaxed),
            )
        });
        (n >= Slo::WARMUP).then(|| Duration::from_nanos(ns / n))
    }

    fn work(&self, worker: usize) {
        if !self.config.pin_cpus.is_empty() {
            let cpu = self.config.pin_cpus[worker % self.config.pin_cpus.len()];
            if let Err(e) = netless_shm::pin_current_thread(cpu) {
                tracing::warn!("cannot pin worker {worker} to cpu {cpu}: {e}");
            }
        }
        let mut cache: Vec<Option<Arc<Conn>>> = vec![None; self.slots.len()];
        let mut response = Scratch {
            worker,
            ..Scratch::default()
        };
        // Partitioned dispatch: worker w alone drains queue w; otherwise all share queue 0.
        let q = worker % self.heads.len();
        let view = &self.replica.queues()[q];
        let (queue, head) = (&view.queue, &self.heads[q]);
        let me = &self.workers[worker];
        let single = self.workers.len() / self.heads.len() == 1;
        let jbsq2 = self.config.dispatch == Dispatch::Jbsq2;
        let measure = self.config.slo.is_some_and(|s| s.mean_service.is_none());
        let stats = &self.replica.stats()[worker];
        let control = self.replica.server_control();
        let mut sleeps = 0u64;
        let mut served = 0u64;
        let mut per_entry = PerEntry::default();
        let mut polls = 0u32;
        // Whether the last turn of the loop served an entry.
        let mut busy = false;
        // The queue's doorbell, then the handler's own sources.
        let sources = self.handler.wake_sources(worker);
        if sources.len() >= netless_ring::WAIT_ANY_MAX {
            tracing::warn!(
                "worker {worker}: the handler gave {} wake sources; only the first {} wake it",
                sources.len(),
                netless_ring::WAIT_ANY_MAX - 1
            );
        }
        let doorbells: Vec<&netless_ring::DoorbellWords> = std::iter::once(view.doorbell)
            .chain(sources.iter().map(WakeSource::doorbell))
            .collect();
        let handler_polls = self.handler.polls();
        // Runs of lone requests served in one go (`serve_lone_run`): with one consumer per
        // queue and no second entry held, and unless every request's time is measured.
        let lone_runs = single && !jbsq2 && !measure;
        let handler_poll = || {
            if !handler_polls {
                return false;
            }
            let _ring = RingSection::enter();
            self.handler.poll(worker)
        };
        // Jbsq2: a second entry taken (and its payload prefetched) while serving the first.
        let mut next: Option<u32> = None;
        // Takes the next entry, if any; `hold` marks the worker so reclamation waits for it.
        let take = |full_check: bool, hold: bool| -> Option<Option<u32>> {
            // Before the entry is taken: say so (reclamation waits for BUSY workers), and
            // start fetching the request while the claim waits for the cell.
            let on_full = |block: u32| {
                if hold {
                    me.held.store(BUSY, Ordering::Relaxed);
                } else {
                    me.serving.store(BUSY, Ordering::Relaxed);
                }
                if let Some(first) = self.replica.block_run(block, 1) {
                    prefetch_read_range(first, 2 * 64, 2);
                }
                // For reading only: the worker validates it, and its store of FREE (if the
                // client does not keep the run) waits in the store buffer, stalling nothing;
                // taking the line exclusive would rob a client checking its kept runs.
                if let Some(word) = self.replica.table().get(block as usize) {
                    prefetch_read((word as *const AtomicU32).cast());
                }
            };
            let dequeued = if single {
                queue.try_dequeue_single_consumer(head, full_check, on_full)
            } else {
                queue.try_dequeue_with(head, full_check, on_full)
            };
            let idle = if hold { &me.held } else { &me.serving };
            // The head is published for clients' queue-depth checks (SLO NACKs, replica
            // choice). With several workers a preempted one can publish an older head after
            // a newer one; an idle worker republishes it, or clients refused on a stale depth
            // would never enqueue (nor ring) again and the server would sit idle for good.
            let publish = || {
                let now = head.position();
                if view.head.position.load(Ordering::Relaxed) != now {
                    view.head.position.store(now, Ordering::Relaxed);
                }
            };
            match dequeued {
                Dequeue::Item(block) => {
                    view.head.position.store(head.position(), Ordering::Relaxed);
                    Some(Some(block))
                }
                Dequeue::Skipped => {
                    publish();
                    idle.store(IDLE, Ordering::Release);
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                    None
                }
                Dequeue::Empty => {
                    publish();
                    // on_full may have run for an entry another worker won.
                    if !single {
                        idle.store(IDLE, Ordering::Release);
                    }
                    None
                }
            }
        };
        while !self.stopping.load(Ordering::Acquire) {
            let block = match next.take() {
                Some(block) => {
                    me.serving.store(BUSY, Ordering::Relaxed);
                    me.held.store(IDLE, Ordering::Release);
                    Some(block)
                }
                // While entries keep coming, the next one is taken straight away: the wait
                // (its soft registers and bookkeeping) is for a queue that ran dry.
                None if busy && let Some(Some(block)) = take(false, false) => Some(block),
                None => {
                    // The soft registers, read on every wait: `netless ctl` changes apply at
                    // once.
                    let wait = crate::control::wait_policy(control);
                    let futex_only = wait.mode == netless_ring::WaitMode::Futex;
                    let before = sleeps;
                    let item = netless_ring::wait_any_counted(
                        &doorbells,
                        &wait,
                        None,
                        Duration::from_millis(100),
                        &mut sleeps,
                        || {
                            polls = polls.wrapping_add(1);
                            if self.stopping.load(Ordering::Acquire) {
                                return Some(None);
                            }
                            // Most polls read only the next cell; every 256th also checks
                            // for holes, which reads the tail clients write. (In futex mode
                            // a worker polls once per wake-up, so it checks every time.)
                            let taken = take(futex_only || polls.is_multiple_of(256), false);
                            // The handler's own work counts as something done: no sleep.
                            if taken.is_none() && handler_poll() {
                                return Some(None);
                            }
                            taken
                        },
                    );
                    if sleeps != before {
                        bump(&stats.sleeps, sleeps - before);
                    }
                    item.ok().flatten()
                }
            };
            busy = block.is_some();
            let Some(mut block) = block else { continue };
            let lone = if lone_runs {
                self.lone_header(block)
            } else {
                None
            };
            if let Some(first) = lone {
                let take_next = || take(false, false).flatten();
                let (rest, n) = self.serve_lone_run(
                    block,
                    first,
                    me,
                    &mut cache,
                    &mut response,
                    &mut served,
                    &take_next,
                    &handler_poll,
                );
                if n != 0 {
                    bump(&stats.batch[batch_bucket(1)], u64::from(n));
                    per_entry.observe(1, &control.requests_per_entry_x16);
                }
                match rest {
                    Some(other) => block = other,
                    None => {
                        me.serving.store(IDLE, Ordering::Release);
                        continue;
                    }
                }
            }
            if jbsq2 {
                next = take(true, true).flatten();
                if let Some(b) = next {
                    // The second request's payload, while the first runs.
                    if let Some(run) = self.replica.block_run(b, 1) {
                        prefetch_read_range(run, self.replica.block_size().max(256), 4);
                    }
                }
            }
            bump(&stats.entries, 1);
            // Latency is sampled (every 16th request) unless the SLO needs every one.
            served += 1;
            let started = (measure || served.is_multiple_of(16)).then(Instant::now);
            response.batch = 1;
            if served.is_multiple_of(1024) {
                // The measured service time moves: recompute the bound of a request's wait.
                response.shed_slo_us = None;
            }
            let behind = || next.is_some() || queue.len_hint(head) > 0;
            self.serve(block, me, &mut cache, &mut response, &behind);
            bump(&stats.batch[batch_bucket(response.batch)], 1);
            per_entry.observe(
                response.batch,
                &self.replica.server_control().requests_per_entry_x16,
            );
            if let Some(t) = started {
                let ns = t.elapsed().as_nanos() as u64;
                bump(&stats.latency[latency_bucket(ns)], 1);
                if measure && response.shed.is_none() {
                    // Per request: an entry may be a batch of several. (Refused entries,
                    // which ran nothing, would make the service look faster than it is.)
                    bump(&me.busy_ns, ns);
                    bump(&me.measured, u64::from(response.batch.max(1)));
                }
            }
            me.serving.store(IDLE, Ordering::Release);
            // A busy queue must not starve the handler's own work.
            handler_poll();
        }
        if next.is_some() {
            me.held.store(IDLE, Ordering::Release);
        }
    }

    /// The live connection at `index`, from the worker's cache (refreshed when the slot's
    /// tag changed). Borrowed, so the hot path clones no `Arc`.
    fn lookup<'c>(&self, index: u32, cache: &'c mut [Option<Arc<Conn>>]) -> Option<&'c Arc<Conn>> {
        let slot = self.slots.get(index as usize)?;
        let tag = slot.tag.load(Ordering::Acquire);
        if tag == 0 {
            return None;
        }
        let cached = &mut cache[index as usize];
        if cached.as_ref().is_none_or(|c| c.tag != tag) {
            *cached = slot.conn.read().ok()?.clone();
        }
        cached.as_ref().filter(|c| c.tag == tag)
    }

    /// Validates and serves the request whose run starts at `block`.
    /// `behind`: whether other entries wait behind this one (read only if it is late).
    fn serve(
        &self,
        block: u32,
        me: &WorkerSlot,
        cache: &mut [Option<Arc<Conn>>],
        response: &mut Scratch,
        behind: &dyn Fn() -> bool,
    ) {
        let replica = &self.replica;
        let Some(first) = replica.block_run(block, 1) else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        // SAFETY: `first` points at a whole block (>= 64 bytes) inside the mapping.
        let (h, header_len) = unsafe { read_request_header(first) };
        // Under an SLO, entries carry the time they were enqueued (`crate::admission`).
        let stamp = h.reserved[1];
        response.shed = None;
        if stamp != 0 {
            response.shed = self.waited_too_long(stamp, response).filter(|_| behind());
        }
        let Some(conn) = self.lookup(h.conn_index, cache) else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        // From here until the worker goes IDLE, the connection's blocks are not reclaimed.
        me.serving.store(conn.tag, Ordering::Relaxed);
        if h.token != conn.token || conn.dead.load(Ordering::Acquire) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let outcome = self.serve_conn(conn, block, &h, header_len, me, response);
        if let Err(why) = outcome {
            self.violated(conn, why);
        }
    }

    /// The run of `nblocks` blocks at `block` and their block-table words, if the run lies in
    /// the buffer (and in `conn`'s partition) and every block of it is leased to `conn`.
    #[inline(always)]
    fn leased_run(
        &self,
        conn: &Conn,
        block: u32,
        nblocks: u32,
    ) -> Result<(*mut u8, &[AtomicU32]), &'static str> {
        let replica = &self.replica;
        let run = replica
            .block_run(block, nblocks)
            .ok_or("block run outside the buffer")?;
        if self.config.provisioning != Provisioning::Shared {
            let part = replica.partition_for(conn.index);
            if block < part.start || u64::from(block) + u64::from(nblocks) > u64::from(part.end) {
                return Err("request blocks outside the connection's partition");
            }
        }
        let owned = block_state::owned(conn.tag);
        // In bounds: block_run checked block + nblocks <= nblocks of the buffer.
        let words = &replica.table()[block as usize..(block + nblocks) as usize];
        if words.iter().any(|w| w.load(Ordering::Acquire) != owned) {
            return Err("request blocks not leased to this connection");
        }
        Ok((run, words))
    }

    /// Closes `conn` for breaking the protocol (`why`).
    #[cold]
    fn violated(&self, conn: &Conn, why: &str) {
        self.violations.fetch_add(1, Ordering::Relaxed);
        conn.close(Status::internal(format!(
            "connection closed by service `{}`: the client violated the protocol ({why})",
            self.service
        )));
    }

    /// How long an entry stamped `stamp` waited, if too long to finish within the SLO (the
    /// SLO less twice the mean service time: recomputed when the SLO changes, and every
    /// 1024 entries as the measured service time moves). The caller refuses
    /// it only if others wait behind it: refusing the last one would gain no one anything
    /// (and a worker woken from sleep by a lone request may well be late for it).
    fn waited_too_long(&self, stamp: u32, response: &mut Scratch) -> Option<u32> {
        let ctrl = self.replica.server_control();
        let slo_us = (ctrl.slo_ns.load(Ordering::Relaxed) / 1000) as u32;
        if response.shed_slo_us != Some(slo_us) {
            // Declared, measured, or (an SLO set with `netless ctl`) estimated from the stats.
            let service = if slo_us == 0 {
                None
            } else {
                self.service_time()
            };
            response.shed_slo_us = Some(slo_us);
            response.shed_after_us = crate::admission::shed_after_us(slo_us, service);
        }
        let now = crate::admission::now_us();
        crate::admission::waited_too_long(stamp, now, response.shed_after_us)
    }

    /// Serves the request (or batch) in the run at `block`, whose header `h` takes
    /// `header_len` bytes (a `WireHeader` or a `ShortHeader`).
    fn serve_conn(
        &self,
        conn: &Arc<Conn>,
        block: u32,
        h: &WireHeader,
        header_len: usize,
        me: &WorkerSlot,
        response: &mut Scratch,
    ) -> Result<(), &'static str> {
        let replica = &self.replica;
        if h.kind != kind::REQUEST {
            return Err("queue entry is not a request");
        }
        let (run, words) = self.leased_run(conn, block, h.nblocks)?;
        // nblocks >= 1 (block_run refuses 0) and a block holds either header.
        let capacity = h.nblocks as usize * replica.block_size() - header_len;
        h.validate_shape(self.config.max_message, capacity)?;
        let (start, len) = (run.wrapping_add(header_len), h.frag_len as usize);
        // SAFETY: the run [block, block + nblocks) is inside the mapping (block_run checked it)
        // and frag_len <= capacity, so the fragment lies within the run.
        let fragment = unsafe { std::slice::from_raw_parts(start, len) };
        prefetch_read_range(fragment.as_ptr(), fragment.len(), 64);
        // A plain Release store, not a CAS: the words were validated as OWNED by this
        // connection above, only their owner may change them meanwhile (an honest one does
        // not), and a store does not stall this worker until the line is back from the
        // client's core. The store is ordered before the response (TSO and Release), so the
        // client sees its blocks FREE by the time it sees the reply.
        // A run the client keeps (`KEEP_BLOCKS`, whole requests only) stays OWNED by it.
        let keep = h.reserved[0] & wire_flags::KEEP_BLOCKS != 0 && h.frag_len == h.body_len;
        let release = || {
            if !keep {
                free_blocks(words);
            }
        };
        if h.reserved[0] & wire_flags::BATCH_MORE != 0 {
            let run_len = h.nblocks as usize * replica.block_size();
            let served = self.serve_batch(conn, run, run_len, *h, header_len, me, response);
            release();
            return served;
        }
        if h.frag_len == h.body_len {
            return self.dispatch(conn, h, fragment, false, me, response, release);
        }
        // A fragment: copy it out, free its blocks at once, dispatch when complete.
        let complete = {
            let mut partials = lock(&conn.partials);
            if !partials.contains_key(&h.call_id) {
                partials.retain(|_, p| p.started.elapsed() < PARTIAL_TTL);
                if partials.len() >= MAX_PARTIALS {
                    // A NACK for this call, not a protocol violation: an honest client with
                    // many threads can get here.
                    drop(partials);
                    release();
                    return self
                        .respond(
                            conn,
                            h.call_id,
                            Code::ResourceExhausted.into(),
                            &Metadata::new(),
                            format!(
                                "more than {MAX_PARTIALS} large requests in progress on this connection: retry, or use more connections"
                            )
                            .as_bytes(),
                        );
                }
            }
            let p = partials.entry(h.call_id).or_insert_with(|| Partial {
                body: vec![0; h.body_len as usize],
                received: 0,
                started: Instant::now(),
            });
            if p.body.len() != h.body_len as usize {
                release();
                return Err("fragments disagree on the body length");
            }
            let off = h.frag_offset as usize;
            netless_shm::copy::copy_slice(&mut p.body[off..off + fragment.len()], fragment);
            p.received += fragment.len();
            if p.received >= p.body.len() {
                partials.remove(&h.call_id).map(|p| p.body)
            } else {
                None
            }
        };
        release();
        match complete {
            Some(body) => self.dispatch(conn, h, &body, false, me, response, || {}),
            None => Ok(()),
        }
    }

    /// Serves a batch: requests back to back in one run, the first with `BATCH_MORE` and
    /// `BATCH_COMPACT`, each after it behind a `CompactHeader` at the 8-byte boundary after
    /// the previous body (`compact_flags::MORE` on all but the last), each whole and from
    /// this connection. The caller frees the run afterwards.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn serve_batch(
        &self,
        conn: &Arc<Conn>,
        run: *mut u8,
        run_len: usize,
        first: WireHeader,
        first_len: usize,
        me: &WorkerSlot,
        response: &mut Scratch,
    ) -> Result<(), &'static str> {
        if first.reserved[0] & wire_flags::BATCH_COMPACT == 0 {
            // A batch of full headers: no client has sent one since compact batches came
            // in protocol 4, and since protocol 9 the server refuses them.
            return Err("a batch without compact headers");
        }
        // A compact batch's replies go out together in one record (or a few, if they do not
        // fit one), sent when the batch ends, whether it ended well or not.
        conn.pipelined.store(true, Ordering::Relaxed);
        response.collecting = true;
        let served = self.serve_requests(conn, run, run_len, first, first_len, me, response);
        response.collecting = false;
        self.flush_tally(response);
        let flushed = self.send_batch(conn, &mut response.replies);
        served.and(flushed)
    }

    /// The requests of a batch, each dispatched in turn (see `serve_batch`); the first
    /// one's header takes `first_len` bytes.
    #[allow(clippy::too_many_arguments)]
    fn serve_requests(
        &self,
        conn: &Arc<Conn>,
        run: *mut u8,
        run_len: usize,
        first: WireHeader,
        first_len: usize,
        me: &WorkerSlot,
        response: &mut Scratch,
    ) -> Result<(), &'static str> {
        let mut h = first;
        // Where the current request's body starts (the requests after the first carry a
        // CompactHeader).
        let mut body_at = first_len;
        let mut more = first.reserved[0] & wire_flags::BATCH_MORE != 0;
        // The current request calls the method of the one before it (only a compact
        // request after the first may say so: the first always names its method).
        let mut same_method = false;
        let mut count = 0u32;
        // Replies inside the batch do not ring the client's doorbell; this rings once after
        // the last (or on an early return).
        let _ring = RingSection::enter();
        // Checked once: every later request's header is expanded from this one
        // (`CompactHeader::expand`), so it has its connection and kind, and is whole.
        if first.kind != kind::REQUEST
            || first.token != conn.token
            || first.conn_index != conn.index
        {
            return Err("a batched request is not this connection's");
        }
        if first.frag_len != first.body_len || first.frag_offset != 0 {
            return Err("a batched request is a fragment");
        }
        h.validate_shape(self.config.max_message, run_len - body_at)?;
        loop {
            // SAFETY: body_at + frag_len <= run_len (the first request's validate_shape, or
            // the compact header's, against the room left), and the run lies inside the
            // mapping.
            let fragment =
                unsafe { std::slice::from_raw_parts(run.add(body_at), h.frag_len as usize) };
            self.dispatch(conn, &h, fragment, same_method, me, response, || {})?;
            count += 1;
            if !more {
                break;
            }
            let (mut c, mut at) = self.next_compact(run, run_len, body_at + fragment.len())?;
            // The method just served, called again: the lean path, unless these requests
            // are refused unrun or go to the runtime's own methods.
            if c.flags & compact_flags::SAME_METHOD != 0
                && response.shed.is_none()
                && !response.method_is_control
            {
                match self.serve_same_method(
                    conn,
                    run,
                    run_len,
                    (c, at),
                    me,
                    response,
                    &mut count,
                )? {
                    Some(next) => (c, at) = next,
                    None => break,
                }
            }
            more = c.flags & compact_flags::MORE != 0;
            same_method = c.flags & compact_flags::SAME_METHOD != 0;
            body_at = at;
            h = c.expand(&first);
        }
        response.batch = count;
        Ok(())
    }

    /// The compact request after a body that ends at `end` in a batch's run of `run_len`
    /// bytes: its header, checked as `validate_shape` would check its expansion, and where
    /// its body starts (which, with its length, then lies inside the run).
    #[inline(always)]
    fn next_compact(
        &self,
        run: *mut u8,
        run_len: usize,
        end: usize,
    ) -> Result<(CompactHeader, usize), &'static str> {
        let offset = align8(end);
        if offset + COMPACT_HEADER_LEN > run_len {
            return Err("a batch runs past its blocks");
        }
        // SAFETY: offset + COMPACT_HEADER_LEN <= run_len: a whole header in the run.
        let c = unsafe { CompactHeader::read_from(run.add(offset)) };
        if c.flags & compact_flags::SAME_METHOD != 0 && c.method_len != 0 {
            return Err("a request repeating the method before it names one too");
        }
        let body_at = offset + COMPACT_HEADER_LEN;
        c.validate_shape(self.config.max_message, run_len - body_at)?;
        prefetch_read_range(run.wrapping_add(offset), 2 * 64, 2);
        Ok((c, body_at))
    }

    /// Serves the batch's requests from `next` on while each calls the method of the one
    /// before it, which the worker just served: one builder and one `Request` for all of
    /// them, and none of `dispatch`'s checks that a compact request cannot need (it carries
    /// no method name, metadata, deadline or payload by reference). The caller has ruled
    /// out refusals and control methods. Returns the first request that names its method,
    /// for `dispatch`, or `None` at the batch's end; `count` counts the requests served.
    #[allow(clippy::too_many_arguments)]
    fn serve_same_method(
        &self,
        conn: &Arc<Conn>,
        run: *mut u8,
        run_len: usize,
        next: (CompactHeader, usize),
        me: &WorkerSlot,
        response: &mut Scratch,
        count: &mut u32,
    ) -> Result<Option<(CompactHeader, usize)>, &'static str> {
        let (mut c, mut body_at) = next;
        self.with_builder(conn, response, |request, builder, response| loop {
            // SAFETY: body_at + body_len <= run_len (next_compact), inside the mapping.
            let body =
                unsafe { std::slice::from_raw_parts(run.add(body_at), usize::from(c.body_len)) };
            let call_id = u64::from(c.call_id);
            builder.reset(call_id);
            request.payload = body;
            let result = self.call_handler(request, builder);
            let sent = self.finish_call(
                conn,
                call_id,
                c.body_len.into(),
                result,
                builder,
                false,
                me,
                response,
            );
            if let Err(why) = sent {
                break Err(why);
            }
            *count += 1;
            if c.flags & compact_flags::MORE == 0 {
                break Ok(None);
            }
            match self.next_compact(run, run_len, body_at + body.len()) {
                Ok((n, at)) if n.flags & compact_flags::SAME_METHOD != 0 => (c, body_at) = (n, at),
                Ok(other) => break Ok(Some(other)),
                Err(why) => break Err(why),
            }
        })
    }

    /// A lone request at `block` that [`ServerShared::serve_lone_run`] may serve: a whole
    /// `ShortHeader` request, its blocks kept or not, from a pipeline (`BATCH_COMPACT`, which
    /// alone means a batch of one) or not, and no other flag (not a batch of several, no
    /// payload by reference). The rest of its checks come later; `None` sends it the
    /// general way.
    #[inline(always)]
    fn lone_header(&self, block: u32) -> Option<ShortHeader> {
        const LONE_FLAGS: u16 = (wire_flags::KEEP_BLOCKS | wire_flags::BATCH_COMPACT) as u16;
        let first = self.replica.block_run(block, 1)?;
        // SAFETY: `first` points at a whole block (>= 64 bytes) inside the mapping.
        let h = unsafe { ShortHeader::read_from(first) };
        (h.kind == kind::REQUEST_SHORT && h.flags & !LONE_FLAGS == 0).then_some(h)
    }

    /// Serves lone requests from the queue entry `block` on, the steady state at B = 1,
    /// while each is a [`ServerShared::lone_header`] from `conn_index`'s connection, passes
    /// every check `serve` would make, and calls the method this worker served last: as
    /// `serve_same_method` does within a batch, with one handler builder and one `Request`
    /// for all of them and none of `serve_conn`'s and `dispatch`'s checks that such a
    /// request cannot need (it carries no stamp, metadata, deadline, fragment or
    /// reference). Takes each next entry itself (`take`), up to [`LONE_RUN`] of them, and
    /// polls the handler after each as the worker's loop does. Returns the first entry it
    /// took and did not serve, for `serve` (which serves, refuses or reports it), and the
    /// number it served (counted in the stats' entries; the caller adds them to the batch
    /// sizes).
    #[allow(clippy::too_many_arguments)]
    fn serve_lone_run(
        &self,
        block: u32,
        first: ShortHeader,
        me: &WorkerSlot,
        cache: &mut [Option<Arc<Conn>>],
        response: &mut Scratch,
        served: &mut u64,
        take: &dyn Fn() -> Option<u32>,
        poll: &dyn Fn() -> bool,
    ) -> (Option<u32>, u32) {
        let Some(conn) = self.lookup(first.conn_index, cache) else {
            return (Some(block), 0);
        };
        let slot_tag = &self.slots[conn.index as usize].tag;
        let stats = &self.replica.stats()[me.index];
        let block_size = self.replica.block_size();
        response.shed = None;
        self.with_builder(conn, response, |request, builder, response| {
            let (mut block, mut h, mut count) = (block, first, 0u32);
            let rest = loop {
                me.serving.store(conn.tag, Ordering::Relaxed);
                // What `serve` and `serve_conn` check, in their order: anything off goes to them.
                if h.token != conn.token || conn.dead.load(Ordering::Acquire) {
                    break Some(block);
                }
                let Ok((run, words)) = self.leased_run(conn, block, u32::from(h.nblocks)) else {
                    break Some(block);
                };
                // nblocks >= 1 (block_run refuses 0) and a block holds the header.
                let capacity = usize::from(h.nblocks) * block_size - SHORT_HEADER_LEN;
                if h.expand()
                    .validate_shape(self.config.max_message, capacity)
                    .is_err()
                {
                    break Some(block);
                }
                // body_len <= capacity (validate_shape): the bytes after the header in the run,
                // which block_run checked lies inside the mapping.
                // SAFETY: so the body is in bounds, as just said.
                let body = unsafe {
                    std::slice::from_raw_parts(run.add(SHORT_HEADER_LEN), h.body_len as usize)
                };
                let method_len = usize::from(h.method_len);
                if response.method_is_control
                    || !crate::bytes::same_bytes(request.method.as_bytes(), &body[..method_len])
                {
                    break Some(block);
                }
                *served += 1;
                if served.is_multiple_of(1024) {
                    response.shed_slo_us = None;
                }
                let started = served.is_multiple_of(16).then(Instant::now);
                // The response ring's next lines while the handler runs.
                conn.prefetch_reply(body.len());
                // Counted before its reply can go out, as the worker's loop counts an entry.
                bump(&stats.entries, 1);
                builder.reset(h.call_id);
                request.payload = &body[method_len..];
                let result = self.call_handler(request, builder);
                let sent = self.finish_call(
                    conn, h.call_id, h.body_len, result, builder, false, me, response,
                );
                // Only now, as in `dispatch`: the reply may have borrowed the blocks.
                if h.flags & wire_flags::KEEP_BLOCKS as u16 == 0 {
                    free_blocks(words);
                }
                conn.prefetch_next_reply(builder.body().len());
                if let Some(t) = started {
                    bump(
                        &stats.latency[latency_bucket(t.elapsed().as_nanos() as u64)],
                        1,
                    );
                }
                count += 1;
                if let Err(why) = sent {
                    self.violated(conn, why);
                    break None;
                }
                poll();
                if count == LONE_RUN {
                    break None;
                }
                let Some(next) = take() else { break None };
                block = next;
                match self.lone_header(block) {
                    Some(next)
                        if next.conn_index == conn.index
                            && slot_tag.load(Ordering::Acquire) == conn.tag =>
                    {
                        h = next
                    }
                    _ => break Some(block),
                }
            };
            (rest, count)
        })
    }

    /// Runs `f` with one handler builder and one `Request` (the method served last, no
    /// metadata or deadline, its payload for `f` to set) for a run of calls on `conn`,
    /// made from `response`'s recycled parts and given back to it afterwards.
    #[inline(always)]
    fn with_builder<R>(
        &self,
        conn: &Arc<Conn>,
        response: &mut Scratch,
        f: impl for<'a> FnOnce(&mut Request<'a>, &mut ResponseBuilder<'a>, &mut Scratch) -> R,
    ) -> R {
        let method = std::mem::take(&mut response.method);
        let mut builder = ResponseBuilder::recycle(
            std::mem::take(&mut response.metadata),
            std::mem::take(&mut response.payload),
        );
        let defer = |call_id| self.defer(conn, call_id);
        builder.set_defer_hook(&defer, 0);
        let mut request = Request {
            method: &method,
            metadata: Metadata::new(),
            payload: &[],
            deadline: None,
        };
        let outcome = f(&mut request, &mut builder, response);
        drop(request);
        let (metadata, payload) = builder.into_parts();
        response.metadata = metadata;
        response.payload = payload;
        response.method = method;
        outcome
    }

    /// After the handler: counts the call (an OK one in the tally, the rest at once) and
    /// sends its reply, unless the handler deferred it (the handle sends it then).
    /// `refused`: the call was refused without running, which its status code says.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn finish_call(
        &self,
        conn: &Arc<Conn>,
        call_id: u64,
        body_len: u32,
        result: Result<(), Status>,
        builder: &ResponseBuilder<'_>,
        refused: bool,
        me: &WorkerSlot,
        response: &mut Scratch,
    ) -> Result<(), &'static str> {
        let stats = || &self.replica.stats()[me.index];
        let deferred = builder.is_deferred();
        if result.is_ok() && !deferred {
            // Tallied, and added to the stats before the reply can go out: at once for a
            // lone request, when the batch's replies go out for a batched one.
            let tally = &mut response.tally;
            tally.calls += 1;
            tally.bytes_in += u64::from(body_len);
            tally.bytes_out += builder.body().len() as u64;
            if !response.collecting {
                self.flush_tally(response);
            }
        } else {
            // An error, or a deferred reply (sent by whoever holds it): counted now.
            let stats = stats();
            bump(&stats.calls, 1);
            bump(&stats.bytes_in, u64::from(body_len));
            let code = match &result {
                Ok(()) => Code::Ok,
                Err(status) => status.code(),
            };
            bump(&stats.by_code[code as usize % 17], 1);
        }
        let sent = match result {
            // The handle sends the reply (or its drop sends an error).
            _ if deferred => Ok(()),
            Ok(()) => {
                let (metadata, body) = (&builder.metadata, builder.body());
                self.reply(conn, call_id, Code::Ok.into(), metadata, body, response)
            }
            Err(status) => {
                bump(&stats().errors, 1);
                let message = status.message().as_bytes();
                // Only a refusal says "not run": a handler's error (even a NACK it got from
                // a call of its own) comes from a call that ran.
                let code = if refused {
                    ReplyCode::of(&status)
                } else {
                    status.code().into()
                };
                self.reply_error(conn, call_id, code, message, response)
            }
        };
        sent.inspect_err(|why| {
            tracing::debug!("dropping connection {}: {why}", conn.index);
        })
    }

    /// Runs the handler; a panic fails the call, not the worker (which would otherwise die
    /// holding its connection's `serving` mark).
    #[inline(always)]
    fn call_handler<'a>(
        &self,
        request: &Request<'a>,
        builder: &mut ResponseBuilder<'a>,
    ) -> Result<(), Status> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.handler.call(request, builder)
        }))
        .unwrap_or_else(|_| {
            Err(Status::internal(format!(
                "the handler of `{}` panicked; see the server's log",
                request.method
            )))
        })
    }

    /// Runs the handler on a whole request body, calls `done_with_body` once nothing reads the
    /// body any more, and sends the response. `same_method`: the body names no method, the
    /// request calls the one this worker served last (the previous request of its batch).
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        conn: &Arc<Conn>,
        h: &WireHeader,
        body: &[u8],
        same_method: bool,
        me: &WorkerSlot,
        response: &mut Scratch,
        done_with_body: impl FnOnce(),
    ) -> Result<(), &'static str> {
        let method_end = h.method_len as usize;
        let md_end = method_end + h.metadata_len as usize;
        // The handler sees a private copy of the method name, validated, so the `&str` cannot
        // change under it. Calls mostly repeat the last method: then the copy we hold is
        // already the one (compared against the shared bytes, never taken from them).
        let mut method = std::mem::take(&mut response.method);
        if !same_method && !crate::bytes::same_bytes(method.as_bytes(), &body[..method_end]) {
            let mut bytes = method.into_bytes();
            bytes.clear();
            bytes.extend_from_slice(&body[..method_end]);
            method = match String::from_utf8(bytes) {
                Ok(method) => method,
                Err(_) => {
                    // The cached name is gone (empty now): so is what it was.
                    response.method_is_control = false;
                    done_with_body();
                    return Err("method name is not UTF-8");
                }
            };
            response.method_is_control = method.starts_with(crate::control::PREFIX);
        }
        let is_control = response.method_is_control;
        let metadata = if md_end == method_end {
            Metadata::new()
        } else {
            let Ok(metadata) = Metadata::decode(&body[method_end..md_end]) else {
                response.method = method;
                done_with_body();
                return Err("malformed request metadata");
            };
            metadata
        };
        // The clock is read only for calls that carry a deadline.
        let (deadline, expired) = if h.deadline_ns == 0 {
            (None, false)
        } else {
            let now_ns = netless_shm::monotonic_ns();
            let deadline = netless_shm::monotonic_ns_to_instant(h.deadline_ns);
            (Some(deadline), h.deadline_ns <= now_ns)
        };
        let mut builder = ResponseBuilder::recycle(
            std::mem::take(&mut response.metadata),
            std::mem::take(&mut response.payload),
        );
        // A payload passed by reference: map the client's pages (declared before the builder,
        // so a reply borrowing them with `reply_with` is sent before they are released).
        let mapped;
        let copied;
        let mut payload = &body[md_end..];
        let mut pool_error = None;
        // A request about to be refused for its wait maps nothing (control calls, never
        // refused, carry no Ref).
        let refused = response.shed.filter(|_| !is_control);
        if h.reserved[0] & wire_flags::PAYLOAD_REF != 0 && refused.is_none() {
            match self.map_payload(conn, payload) {
                Ok(buf) => {
                    mapped = buf;
                    payload = match mapped.as_slice() {
                        Some(slice) => slice,
                        None => {
                            copied = mapped.to_vec();
                            &copied
                        }
                    };
                }
                Err(status) => pool_error = Some(status),
            }
        }
        // Built only if the handler asks for it, so a plain call clones no `Arc`.
        let defer = |call_id| self.defer(conn, call_id);
        builder.set_defer_hook(&defer, h.call_id);
        let result = if let Some(status) = pool_error {
            Err(status)
        } else if expired {
            Err(Status::deadline_exceeded(
                "deadline expired before the server started the call",
            ))
        } else if let Some(op) = is_control
            .then(|| method.strip_prefix(crate::control::PREFIX))
            .flatten()
        {
            self.control_call(op, payload, &mut builder)
        } else if let Some(waited) = refused {
            self.shed.fetch_add(1, Ordering::Relaxed);
            Err(Status::nack(format!(
                "service `{}` refused the request without running it: it waited {waited} µs \
                 in the queue, too long to finish within the SLO of {} µs; retry later or on \
                 another replica",
                self.service,
                response.shed_slo_us.unwrap_or(0)
            )))
        } else {
            // Take the response ring's next lines while the handler runs (a guess: a reply
            // about as long as the request). Not for a batch's requests: their replies are
            // gathered privately and go into the ring when the batch ends.
            if !response.collecting {
                conn.prefetch_reply(body.len());
            }
            let request = Request {
                method: &method,
                metadata,
                payload,
                deadline,
            };
            self.call_handler(&request, &mut builder)
        };
        let sent = self.finish_call(
            conn,
            h.call_id,
            h.body_len,
            result,
            &builder,
            refused.is_some(),
            me,
            response,
        );
        // The blocks go back to the client only now: a reply may borrow them, and the store
        // into the block table (whose line the client writes too) must not hold up the
        // reply's stores, which the CPU commits in order. The client claims its next call's
        // blocks while it waits for this reply, so it is not waiting for these.
        done_with_body();
        // While idle, start owning the lines a reply like this one will use next time.
        if !response.collecting {
            conn.prefetch_next_reply(builder.body().len());
        }
        let (metadata, payload) = builder.into_parts();
        response.metadata = metadata;
        response.payload = payload;
        response.method = method;
        sent
    }

    /// Answers the runtime's own `netless.ctl/` methods (soft registers).
    fn control_call(
        &self,
        op: &str,
        payload: &[u8],
        builder: &mut ResponseBuilder<'_>,
    ) -> Result<(), Status> {
        let ctrl = self.replica.server_control();
        let answer = match op {
            "Get" => crate::control::get(ctrl),
            "Set" => crate::control::set(ctrl, &self.config, payload, self.service_time())?,
            _ => {
                return Err(Status::unimplemented(format!(
                    "no control method `{op}`: use Get or Set"
                )))
            }
        };
        builder.payload.extend_from_slice(answer.as_bytes());
        Ok(())
    }

    /// The mean service time: declared in the SLO, else measured, else estimated from the
    /// sampled latency histogram (at least 64 samples).
    fn service_time(&self) -> Option<Duration> {
        if let Some(s) = self.config.slo.and_then(|s| s.mean_service) {
            return Some(s);
        }
        if let Some(s) = self.measured_service() {
            return Some(s);
        }
        let stats = crate::control::snapshot(&self.replica);
        let n: u64 = stats.latency.iter().sum();
        (n >= 64).then(|| {
            let sum: u64 = stats
                .latency
                .iter()
                .enumerate()
                .map(|(b, c)| c.saturating_mul(crate::layout::latency_bucket_floor(b)))
                .sum();
            Duration::from_nanos(sum / n)
        })
    }

    /// A handle to reply later to call `call_id` on `conn`.
    /// Maps a request payload that came as a Ref.
    fn map_payload(&self, conn: &Conn, bytes: &[u8]) -> Result<netless_pool::SharedBuf, Status> {
        let domain = match &self.config.domain {
            Some(d) if conn.by_ref => d,
            _ => {
                return Err(Status::invalid_argument(
                    "the request's payload is a Ref, but this connection shares no page-pool \
                     domain with the server",
                ))
            }
        };
        let r = netless_pool::Ref::from_bytes(bytes)?;
        if r.len() > self.config.max_message {
            return Err(Status::resource_exhausted(format!(
                "request of {} bytes exceeds this service's maximum message size of {} bytes",
                r.len(),
                self.config.max_message
            )));
        }
        Ok(domain.map_from(&r, conn.peer_pid)?)
    }

    fn defer(&self, conn: &Arc<Conn>, call_id: u64) -> Result<DeferredReply, Status> {
        let server = self
            .this
            .upgrade()
            .ok_or_else(|| Status::unavailable("the server is shutting down"))?;
        if conn.dead.load(Ordering::Acquire) {
            return Err(Status::unavailable("the client's connection is closed"));
        }
        let conn = conn.clone();
        self.deferring.store(true, Ordering::Relaxed);
        Ok(DeferredReply {
            server,
            conn,
            call_id,
            sent: false,
        })
    }

    /// Sends the reply to `call_id`: into the compact batch's record being gathered, if one
    /// is and the reply is whole and short-metadata, else as a record of its own (in
    /// fragments if needed). Inline: on a batch's path it is a few comparisons and a copy,
    /// which a call would double.
    #[inline(always)]
    fn reply(
        &self,
        conn: &Arc<Conn>,
        call_id: u64,
        code: ReplyCode,
        metadata: &Metadata,
        payload: &[u8],
        acc: &mut Scratch,
    ) -> Result<(), &'static str> {
        if acc.collecting {
            let md_len = metadata.encoded_len();
            if let Some(entry) = ReplyBatch::entry_len(conn, call_id, md_len, payload.len()) {
                if !acc.replies.fits(conn, entry) {
                    self.flush_tally(acc);
                    self.send_batch(conn, &mut acc.replies)?;
                }
                acc.replies.push(call_id, code, metadata, payload);
                return Ok(());
            }
        }
        self.flush_tally(acc);
        self.respond(conn, call_id, code, metadata, payload)
    }

    /// [`ServerShared::reply`] with an error's message: out of line, so the OK path's copy
    /// stays the only one inlined.
    #[inline(never)]
    fn reply_error(
        &self,
        conn: &Arc<Conn>,
        call_id: u64,
        code: ReplyCode,
        message: &[u8],
        acc: &mut Scratch,
    ) -> Result<(), &'static str> {
        self.reply(conn, call_id, code, &Metadata::new(), message, acc)
    }

    /// Adds the calls tallied in `acc` to the worker's stats; called before any reply they
    /// count is sent, so a client that has its replies finds them counted.
    fn flush_tally(&self, acc: &mut Scratch) {
        if acc.tally.calls == 0 {
            return;
        }
        let tally = std::mem::take(&mut acc.tally);
        let stats = &self.replica.stats()[acc.worker];
        bump(&stats.calls, tally.calls);
        bump(&stats.by_code[Code::Ok as usize], tally.calls);
        bump(&stats.bytes_in, tally.bytes_in);
        bump(&stats.bytes_out, tally.bytes_out);
    }

    /// Sends `batch` (if it holds anything) as one `RESPONSE_BATCH` record and empties it.
    fn send_batch(&self, conn: &Arc<Conn>, batch: &mut ReplyBatch) -> Result<(), &'static str> {
        if batch.count == 0 {
            return Ok(());
        }
        let header = ResponseHeader {
            kind: kind::RESPONSE_BATCH,
            body_len: batch.bytes.len() as u32,
            frag_len: batch.bytes.len() as u32,
            reserved: batch.count,
            ..ResponseHeader::default()
        };
        let pushed = self.push_record(conn, &[header.as_bytes(), &batch.bytes]);
        batch.bytes.clear();
        batch.count = 0;
        if pushed.is_ok() {
            ring_client(conn);
        }
        pushed
    }

    /// [`ServerShared::send_batch`] for deferred replies: a failure closes the connection,
    /// as a failed `DeferredReply::send` does.
    fn send_deferred_batch(&self, conn: &Arc<Conn>, batch: &mut ReplyBatch) {
        if let Err(why) = self.send_batch(conn, batch) {
            self.violated(conn, why);
        }
    }

    /// The connection's response-ring producer: unlocked when only this (single) worker can
    /// reply, else under its lock.
    #[inline(always)]
    fn with_producer<T>(&self, conn: &Conn, f: impl FnOnce(&mut Producer<'static>) -> T) -> T {
        let mut guard = None;
        let producer = if self.workers.len() == 1 && !self.deferring.load(Ordering::Relaxed) {
            // No lock, so no locked instruction stalling on this core's pending stores. The
            // worker itself sets `deferring` before the first DeferredReply exists, so once
            // another thread may reply, this worker sees the flag and locks too.
            // One worker and no deferred replies: no other thread ever touches a
            // connection's producer (the acceptor and shutdown never do).
            // SAFETY: so this access is exclusive, as just said.
            unsafe { conn.producer.get_unsynchronized() }
        } else {
            &mut **guard.insert(conn.producer.lock())
        };
        // One call site, so `f` is inlined here.
        f(producer)
    }

    /// Pushes one record made of `parts` into the connection's response ring, waiting (and
    /// ringing the client) while the ring is full, up to `response_stall_limit`. `Ok` also
    /// when the client died or the server is stopping meanwhile (nothing to send to).
    fn push_record(&self, conn: &Conn, parts: &[&[u8]]) -> Result<(), &'static str> {
        self.push_with(conn, |producer| producer.try_push(parts))
    }

    /// [`ServerShared::push_record`] of whatever `push` pushes (retried while the ring is
    /// full).
    #[inline(always)]
    fn push_with(
        &self,
        conn: &Conn,
        push: impl Fn(&mut Producer<'static>) -> Result<(), PushError>,
    ) -> Result<(), &'static str> {
        match self.push_once(conn, &push) {
            Ok(()) => Ok(()),
            Err(PushError::Full) => self.push_stalled(conn, &push),
            Err(PushError::TooLarge) => Err("response fragment larger than the ring"),
            Err(_) => Err("the response ring's head is corrupt"),
        }
    }

    /// One try of `push`; after a record went in, notes where the next one will go (for
    /// the prefetches that take its lines ahead).
    #[inline(always)]
    fn push_once(
        &self,
        conn: &Conn,
        push: &impl Fn(&mut Producer<'static>) -> Result<(), PushError>,
    ) -> Result<(), PushError> {
        self.with_producer(conn, |producer| {
            let pushed = push(producer);
            if pushed.is_ok() {
                conn.next_record
                    .store(producer.next_record_ptr() as usize, Ordering::Relaxed);
            }
            pushed
        })
    }

    /// `push_with` once the ring was full: retries, ringing the client, until it has room,
    /// the client or the server goes, or `response_stall_limit` passes.
    #[inline(never)]
    fn push_stalled(
        &self,
        conn: &Conn,
        push: &impl Fn(&mut Producer<'static>) -> Result<(), PushError>,
    ) -> Result<(), &'static str> {
        let since = Instant::now();
        loop {
            if conn.dead.load(Ordering::Acquire) || self.stopping.load(Ordering::Acquire) {
                return Ok(());
            }
            if since.elapsed() > self.config.response_stall_limit {
                return Err("the client stopped draining its response ring");
            }
            netless_ring::ring(conn.segment.doorbell());
            thread::yield_now();
            match self.push_once(conn, push) {
                Ok(()) => return Ok(()),
                Err(PushError::Full) => {}
                Err(PushError::TooLarge) => return Err("response fragment larger than the ring"),
                Err(_) => return Err("the response ring's head is corrupt"),
            }
        }
    }

    /// Sends a reply to `call_id` (in fragments if it is longer than a record) and rings
    /// the client (at the end of the `RingSection`, inside one). The common reply, without
    /// metadata and in one record, inline; the rest out of line.
    #[inline(always)]
    fn respond(
        &self,
        conn: &Arc<Conn>,
        call_id: u64,
        code: ReplyCode,
        metadata: &Metadata,
        payload: &[u8],
    ) -> Result<(), &'static str> {
        #[cfg(feature = "fault-injection")]
        let faulty = self.corrupt_responses.load(Ordering::Relaxed) != 0;
        #[cfg(not(feature = "fault-injection"))]
        let faulty = false;
        // The common reply: no metadata, one record.
        if metadata.is_empty()
            && payload.len() <= conn.client_max
            && payload.len() <= conn.record_limit.saturating_sub(RESPONSE_HEADER_LEN)
            && !faulty
        {
            let header = ResponseHeader {
                call_id,
                kind: kind::RESPONSE,
                status: code.wire(),
                body_len: payload.len() as u32,
                frag_len: payload.len() as u32,
                ..ResponseHeader::default()
            };
            self.push_with(conn, |p| p.try_push_header(header.as_bytes(), payload))?;
            ring_client(conn);
            return Ok(());
        }
        self.respond_any(conn, call_id, code, metadata, payload)
    }

    /// `respond` for any reply: with metadata, in fragments, or a fault injected.
    #[inline(never)]
    fn respond_any(
        &self,
        conn: &Arc<Conn>,
        call_id: u64,
        code: ReplyCode,
        metadata: &Metadata,
        payload: &[u8],
    ) -> Result<(), &'static str> {
        let md_len = metadata.encoded_len();
        if md_len + payload.len() > conn.client_max {
            // The client would refuse it as malformed (and drop the connection): fail this
            // call instead, saying why.
            let mut message = format!(
                "the reply of {} bytes exceeds this client's limit of {} bytes: raise ClientConfig::max_message",
                md_len + payload.len(),
                conn.client_max
            );
            // ASCII, so any cut is at a character boundary; short enough not to recurse.
            message.truncate(conn.client_max);
            return self.respond_any(
                conn,
                call_id,
                Code::ResourceExhausted.into(),
                &Metadata::new(),
                message.as_bytes(),
            );
        }
        let md_bytes;
        let md_slice: &[u8] = if md_len == 0 {
            &[]
        } else {
            let mut v = Vec::with_capacity(md_len);
            metadata.encode_into(&mut v);
            md_bytes = v;
            &md_bytes
        };
        let body_len = md_len + payload.len();
        #[cfg(feature = "fault-injection")]
        match self.corrupt_responses.load(Ordering::Relaxed) {
            1 => {
                let garbage = ResponseHeader {
                    call_id,
                    kind: kind::RESPONSE,
                    body_len: 10,
                    frag_len: 5000,
                    ..ResponseHeader::default()
                };
                self.with_producer(conn, |p| p.try_push(&[garbage.as_bytes()]).ok());
                netless_ring::ring(conn.segment.doorbell());
                return Ok(());
            }
            2 => {
                let seg = conn.segment.segment();
                // SAFETY: deliberate garbage for tests: every byte after the doorbell line lies
                // inside the connection segment's mapping.
                unsafe { std::ptr::write_bytes(seg.as_ptr().add(192), 0xa5, seg.len() - 192) };
                netless_ring::ring(conn.segment.doorbell());
                return Ok(());
            }
            _ => {}
        }
        let max_fragment = conn.record_limit.saturating_sub(RESPONSE_HEADER_LEN).max(1);
        let mut header = ResponseHeader {
            call_id,
            kind: kind::RESPONSE,
            status: code.wire(),
            body_len: body_len as u32,
            metadata_len: md_len as u32,
            ..ResponseHeader::default()
        };
        let mut offset = 0;
        loop {
            let frag_len = (body_len - offset).min(max_fragment);
            header.frag_offset = offset as u32;
            header.frag_len = frag_len as u32;
            let (a, b) = split_range(md_slice, payload, offset, frag_len);
            // Mostly there is no metadata: two parts, one copy fewer.
            if a.is_empty() {
                self.push_record(conn, &[header.as_bytes(), b])?;
            } else {
                self.push_record(conn, &[header.as_bytes(), a, b])?;
            }
            offset += frag_len;
            if offset >= body_len {
                // Inside a batch (or a handler's poll), once at its end.
                ring_client(conn);
                return Ok(());
            }
            netless_ring::ring(conn.segment.doorbell());
        }
    }
}

/// The reply to a call, sent later and from any thread: what
/// [`ResponseBuilder::defer`](crate::ResponseBuilder::defer) returns.
///
/// The handler returns at once and the worker serves other calls; whoever holds the handle
/// replies when the answer is ready (long polls, replies that wait for another event).
/// Dropping it unsent fails the call with `INTERNAL`, so a client never waits for a reply
/// nobody will send.
///
/// ```no_run
/// use netless::{Request, ResponseBuilder, Server, ServerConfig, Status, Metadata};
/// let server = Server::bind("demo.Later", ServerConfig::default(),
///     |_req: &Request<'_>, resp: &mut ResponseBuilder<'_>| -> Result<(), Status> {
///         let reply = resp.defer()?;
///         std::thread::spawn(move || {
///             std::thread::sleep(std::time::Duration::from_millis(10));
///             let _ = reply.send(&Metadata::new(), b"later");
///         });
///         Ok(())
///     })?;
/// # Ok::<(), netless::Status>(())
/// ```
pub struct DeferredReply {
    server: Arc<ServerShared>,
    conn: Arc<Conn>,
    call_id: u64,
    sent: bool,
}

impl DeferredReply {
    /// Sends a successful reply. Fails with `UNAVAILABLE` if the client is gone (nothing
    /// was sent) or broke the protocol while the reply was written (its connection is closed).
    pub fn send(mut self, metadata: &Metadata, payload: &[u8]) -> Result<(), Status> {
        self.sent = true;
        self.write(Code::Ok.into(), metadata, payload)
    }

    /// Fails the call with `status`.
    pub fn fail(mut self, status: &Status) -> Result<(), Status> {
        self.sent = true;
        // The handler ran this call: its error never says "not run".
        self.write(
            status.code().into(),
            &Metadata::new(),
            status.message().as_bytes(),
        )
    }

    /// Whether the client's connection is gone (or the server is stopping): a reply would
    /// reach no one, and work for it can stop.
    pub fn is_closed(&self) -> bool {
        self.conn.dead.load(Ordering::Acquire) || self.server.stopping.load(Ordering::Acquire)
    }

    /// A handle that tells, later, whether this call's client is still connected (for work
    /// that outlives the reply, such as a stream the client keeps polling).
    pub fn watch(&self) -> ConnectionWatch {
        ConnectionWatch {
            server: self.server.clone(),
            conn: self.conn.clone(),
        }
    }

    fn write(&self, code: ReplyCode, metadata: &Metadata, payload: &[u8]) -> Result<(), Status> {
        if self.is_closed() {
            return Err(Status::unavailable(
                "the client's connection is closed; the reply was not sent",
            ));
        }
        if SECTIONS.get() > 0 && self.conn.pipelined.load(Ordering::Relaxed) {
            // On a worker, inside a batch or its handler's poll: gathered per connection and
            // sent as reply batches when the section ends.
            let md_len = metadata.encoded_len();
            let entry = ReplyBatch::entry_len(&self.conn, self.call_id, md_len, payload.len());
            if let Some(entry) = entry {
                self.gather(entry, code, metadata, payload);
                return Ok(());
            }
        }
        self.server
            .respond(&self.conn, self.call_id, code, metadata, payload)
            .map_err(|why| {
                self.server.violated(&self.conn, why);
                Status::unavailable(format!("the client's connection was closed: {why}"))
            })
    }
}

impl DeferredReply {
    /// Adds this reply to the thread's pending batch for its connection (sending that batch
    /// first if the reply would not fit it).
    fn gather(&self, entry: usize, code: ReplyCode, metadata: &Metadata, payload: &[u8]) {
        PENDING.with_borrow_mut(|pending| {
            let at = match pending
                .iter()
                .position(|p| Arc::ptr_eq(&p.conn, &self.conn))
            {
                Some(at) => at,
                None => {
                    pending.push(PendingReplies {
                        server: self.server.clone(),
                        conn: self.conn.clone(),
                        batch: ReplyBatch::default(),
                    });
                    pending.len() - 1
                }
            };
            let p = &mut pending[at];
            if !p.batch.fits(&p.conn, entry) {
                p.server.send_deferred_batch(&p.conn, &mut p.batch);
            }
            p.batch.push(self.call_id, code, metadata, payload);
        });
        ANY_PENDING.set(true);
    }
}

/// Whether a client is still connected: see [`DeferredReply::watch`].
#[derive(Clone)]
pub struct ConnectionWatch {
    server: Arc<ServerShared>,
    conn: Arc<Conn>,
}

impl ConnectionWatch {
    /// Whether the client's connection is gone (it hung up, died or was closed for breaking
    /// the protocol) or the server is stopping.
    pub fn is_closed(&self) -> bool {
        self.conn.dead.load(Ordering::Acquire) || self.server.stopping.load(Ordering::Acquire)
    }

    /// Whether `reply` answers a call from the same connection as this watch.
    pub fn same_connection(&self, reply: &DeferredReply) -> bool {
        Arc::ptr_eq(&self.conn, &reply.conn)
    }
}

impl std::fmt::Debug for ConnectionWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionWatch")
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Drop for DeferredReply {
    fn drop(&mut self) {
        if !self.sent {
            let _ = self.write(
                Code::Internal.into(),
                &Metadata::new(),
                b"the server dropped this call without replying",
            );
        }
    }
}

impl std::fmt::Debug for DeferredReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredReply")
            .field("service", &self.server.service)
            .field("call_id", &self.call_id)
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// Splits `[offset, offset + len)` of `a ++ b` into the parts from each.
fn split_range<'a>(a: &'a [u8], b: &'a [u8], offset: usize, len: usize) -> (&'a [u8], &'a [u8]) {
    let end = offset + len;
    let a_part = &a[offset.min(a.len())..end.min(a.len())];
    let b_part = &b[offset.saturating_sub(a.len())..end.saturating_sub(a.len())];
    (a_part, b_part)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_per_entry_follow_the_batches_and_publish_only_changes() {
        let shared = AtomicU32::new(0);
        let mut estimate = PerEntry::default();
        estimate.observe(1, &shared);
        assert_eq!(shared.load(Ordering::Relaxed), 16, "one request per entry");
        for _ in 0..200 {
            estimate.observe(4, &shared);
        }
        let four = shared.load(Ordering::Relaxed);
        assert!((60..=64).contains(&four), "batches of 4: {four}");
        // Steady batches leave the published value alone.
        shared.store(12345, Ordering::Relaxed);
        for _ in 0..50 {
            estimate.observe(4, &shared);
        }
        assert_eq!(shared.load(Ordering::Relaxed), 12345);
        for _ in 0..200 {
            estimate.observe(1, &shared);
        }
        let one = shared.load(Ordering::Relaxed);
        assert!((16..=17).contains(&one), "back to single requests: {one}");
    }

    #[test]
    fn only_handlers_with_a_poll_of_their_own_are_polled() {
        fn echo<'a>(req: &Request<'a>, resp: &mut ResponseBuilder<'a>) -> Result<(), Status> {
            resp.payload.extend_from_slice(req.payload);
            Ok(())
        }
        struct Polling;
        impl Handler for Polling {
            fn call<'a>(&self, _: &Request<'a>, _: &mut ResponseBuilder<'a>) -> Result<(), Status> {
                Ok(())
            }
            fn poll(&self, _: usize) -> bool {
                true
            }
        }
        assert!(!echo.polls());
        assert!(Polling.polls());
    }

    #[test]
    fn split_range_parts() {
        let (a, b) = split_range(b"abc", b"defg", 1, 4);
        assert_eq!((a, b), (&b"bc"[..], &b"de"[..]));
        let (a, b) = split_range(b"abc", b"defg", 4, 3);
        assert_eq!((a, b), (&b""[..], &b"efg"[..]));
    }
}
