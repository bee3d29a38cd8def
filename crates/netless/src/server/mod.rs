//! The server: binds a service's socket and serves it with a handler on worker threads that
//! pull requests from each trust group's one shared receive queue (single-queue dispatch;
//! with `Dispatch::Partitioned`, each worker from a queue of its own in every group).
//!
//! - [`handler`]: what a service implements ([`Handler`]) and sees ([`Request`],
//!   [`ResponseBuilder`]);
//! - `accept`: the acceptor thread: accepting, hang-ups and the reclaiming of a dead
//!   client's blocks; `audit`: its rounds over the block tables (orphaned blocks, quotas);
//!   `handshake`: admitting one client (`SO_PEERCRED` against the ACL, the
//!   frames), on a thread of its own with one deadline;
//! - `conn`: the server's side of a connection and the connection table; `group`: the trust
//!   groups (a replica segment per client uid);
//! - `worker`: a worker thread's loop over the queue, `lone`: its runs of lone requests;
//! - `serve`: validating a queue entry's run and serving the request, fragment or batch in
//!   it; `dispatch`: one request to the handler;
//! - `reply`: the reply path into the client's response ring; `backlog`: replies waiting for
//!   room in a slow client's ring; `notify`: one notification per batch of replies;
//!   `deferred`: replies sent later, from any thread;
//! - `state`: what all of a server's threads share.
//!
//! Workers validate every request against the connection table (index, secret token, block
//! ownership, lengths) before reading it. A connection whose requests fail validation is
//! closed with a `Goodbye`; unattributable garbage is counted and dropped. No byte a client
//! wrote can make a worker panic, read out of bounds or wait forever.
#![deny(unsafe_code)]

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use netless_shm::SocketClaim;

use crate::config::{socket_dir, socket_name, Provisioning, ServerConfig};
use crate::segment::layout::provisioning;
use crate::segment::{ControlSegment, Place, ReplicaSpec};
use crate::status::{Code, Status};
use crate::sync::{AtomicBool, AtomicU64, Ordering};

mod accept;
mod audit;
mod backlog;
mod conn;
mod deferred;
mod dispatch;
mod fabric;
mod group;
pub(crate) mod handler;
mod handshake;
mod lone;
mod notify;
mod polled;
mod reply;
pub(crate) mod serve;
mod state;
mod worker;

pub use backlog::MAX_BACKLOG_BYTES;
pub use deferred::{ConnectionWatch, DeferredReply};
pub use handler::{Handler, Request, ResponseBuilder};

use conn::ConnTable;
use state::ServerState;
use worker::WorkerSlot;

/// Counters describing a running server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections currently open.
    pub connections: u32,
    /// Requests answered.
    pub requests: u64,
    /// Requests whose handler returned an error status.
    pub errors: u64,
    /// Queue entries or requests dropped as corrupt or unattributable, and blocks freed for
    /// carrying a tag no connection owns.
    pub dropped: u64,
    /// Connections closed for violating the protocol.
    pub protocol_violations: u64,
    /// Blocks of the receive buffers that are free (not holding a request).
    pub free_blocks: u32,
    /// Blocks in the receive buffers (all partitions of every trust group's).
    pub total_blocks: u32,
    /// Bytes of receive buffer provisioned for the current connections: the whole buffer of
    /// each trust group in [`Provisioning::Shared`] and [`Provisioning::PerWorker`], one
    /// partition per live connection in [`Provisioning::PerConnection`].
    pub receive_buffer_bytes: u64,
    /// Requests clients refused to send (buffer full or queue deeper than the SLO allows),
    /// as counted by the clients in their groups' segments (a hint: clients write it).
    pub nacks: u64,
    /// Requests the workers refused without running them: they had waited too long in the
    /// queue to finish within the SLO (`crate::slo::admission`). Also NACKs to the caller, and
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
    state: Arc<ServerState>,
    threads: Vec<JoinHandle<()>>,
    stop: OwnedFd,
    /// The service's name in the socket directory: its lock and socket, released (the
    /// socket removed if still ours) when the server stops.
    claim: Option<SocketClaim>,
    /// Its entry in a fabric, when it serves in one: withdrawn when the server stops.
    published: Option<fabric::Published>,
    /// The acceptor's inbox, until a fabric's admissions take it.
    inbox: Option<Arc<handshake::Inbox>>,
}

impl Server {
    /// Binds `service` and starts serving it with `handler`.
    ///
    /// Fails with `ALREADY_EXISTS` if a live server already serves that name in the socket
    /// directory (a stale socket from a dead server is replaced): the name is held by an
    /// exclusive lock on `NAME.sock.lock` for as long as the server runs, so two servers
    /// starting together cannot both take it. `FAILED_PRECONDITION` if the socket directory
    /// is not to be trusted (see [`ServerConfig::dir`]).
    pub fn bind(
        service: &str,
        config: ServerConfig,
        handler: impl Handler,
    ) -> Result<Server, Status> {
        config.validate()?;
        if let Some(fabric) = config.fabric.clone() {
            return Server::bind_in_fabric(service, config, handler, &fabric);
        }
        let dir = socket_dir(config.dir.as_deref(), &[])?;
        let name = socket_name(dir.path(), service, config.replica)?;
        // The name first: a second server of it fails before it builds anything.
        let (claim, listener) = SocketClaim::bind(&dir, &name).map_err(|e| match e {
            netless_shm::Error::AlreadyServed { path } => Status::new(
                Code::AlreadyExists,
                format!(
                    "service `{service}` is already served at {}: stop that server or pick another name",
                    path.display()
                ),
            ),
            e => Status::unavailable(format!(
                "cannot bind {}: {e}",
                dir.path().join(&name).display()
            )),
        })?;
        let socket_path = claim.socket_path();
        // An ACL that admits other users needs a socket they can connect to; the ACL, checked
        // on every connection, is what keeps everyone else out.
        let me = rustix::process::geteuid().as_raw();
        if config.acl.uids().iter().any(|&u| u != me) || !config.acl.gids().is_empty() {
            claim.set_socket_mode(0o666).map_err(|e| {
                Status::unavailable(format!(
                    "cannot open {} to the other users the ACL admits: {e}",
                    socket_path.display()
                ))
            })?;
        }
        listener
            .set_nonblocking(true)
            .map_err(|e| Status::internal(format!("listener: {e}")))?;
        Server::build(
            service,
            config,
            handler,
            Place::Memfd,
            socket_path,
            Some((claim, listener)),
        )
    }

    /// Binds `service` in the fabric `config.fabric` names.
    fn bind_in_fabric(
        service: &str,
        config: ServerConfig,
        handler: impl Handler,
        fabric: &netless_shm::fabric::Fabric,
    ) -> Result<Server, Status> {
        netless_shm::service_socket_path(Path::new("/"), service)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        if !fabric.lookup(service, config.replica).is_empty() {
            return Err(Status::new(
                Code::AlreadyExists,
                format!(
                    "service `{service}` is already served in the fabric by a live member: stop                      that server or pick another name"
                ),
            ));
        }
        let mut server = Server::build(
            service,
            config,
            handler,
            Place::Fabric(fabric),
            fabric.path().to_owned(),
            None,
        )?;
        let inbox = server.inbox.take().expect("a fresh server's inbox");
        let polled = (fabric.coherence() == netless_shm::coherence::Coherence::Software)
            .then(|| Arc::new(polled::PolledConns::default()));
        if let (Some(conns), Some(domain)) = (&polled, &server.state.config.domain) {
            let view = domain
                .pages_view(fabric.coherence(), fabric.emulation())
                .map_err(|e| Status::internal(e.to_string()))?;
            *conn::lock(&conns.pages) = Some(view);
        }
        if let Some(conns) = &polled {
            let n = server.state.config.workers;
            for i in 0..n {
                let (state, conns) = (server.state.clone(), conns.clone());
                let spawned = thread::Builder::new()
                    .name(format!("netless-poller-{i}"))
                    .spawn(move || conns.run(&state, i, n));
                server.threads.push(
                    spawned
                        .map_err(|e| Status::resource_exhausted(format!("spawn poller: {e}")))?,
                );
            }
        }
        server.published = Some(fabric::publish(&server.state, fabric, inbox, polled)?);
        Ok(server)
    }

    /// Builds the server's segments and state and starts its threads: with a socket to
    /// listen on, or (in a fabric) none.
    fn build(
        service: &str,
        config: ServerConfig,
        handler: impl Handler,
        place: Place<'_>,
        socket_path: std::path::PathBuf,
        socket: Option<(SocketClaim, std::os::unix::net::UnixListener)>,
    ) -> Result<Server, Status> {
        let (claim, listener) = socket.unzip();
        let part_blocks = (config.partition_bytes() / config.block_size as usize) as u32;
        let spec = ReplicaSpec {
            block_size: config.block_size,
            provisioning: match config.provisioning {
                Provisioning::Shared => provisioning::SHARED,
                Provisioning::PerWorker => provisioning::PER_WORKER,
                Provisioning::PerConnection => provisioning::PER_CONNECTION,
            },
            nparts: config.partitions(),
            part_blocks,
            nqueues: config.queues(),
            quota_blocks: match config.provisioning {
                // A partition of its own: all of it.
                Provisioning::PerConnection => part_blocks,
                // Shared: a connection may not take every block from the others.
                _ => part_blocks - part_blocks / 4,
            },
            max_message: config.max_message as u32,
            max_connections: config.max_connections,
        };
        let control = Arc::new(ControlSegment::create_in(
            service,
            config.workers as u32,
            place,
        )?);
        let owner_uid = rustix::process::geteuid().as_raw();
        // The owner's group first; other uids' when their first client arrives.
        let first = group::Group::create(service, 0, owner_uid, spec, control.clone(), place)?;
        if let Some(limit) = config.depth_limit(None) {
            control
                .server_control()
                .depth_limit
                .store(limit, Ordering::Relaxed);
        }
        crate::control::init(control.server_control(), &config);
        let state = Arc::new_cyclic(|this| ServerState {
            this: this.clone(),
            deferring: AtomicBool::new(false),
            service: service.to_string(),
            socket_path,
            control,
            groups: group::Groups::new(first),
            spec,
            owner_uid,
            conns: ConnTable::new(config.max_connections),
            admitting: std::sync::Mutex::new(()),
            backlogs: backlog::Backlogs::new(),
            handler: Box::new(handler),
            stopping: AtomicBool::new(false),
            workers: (0..config.workers).map(|_| WorkerSlot::default()).collect(),
            dropped: AtomicU64::new(0),
            violations: AtomicU64::new(0),
            shed: AtomicU64::new(0),
            remote_clients: AtomicBool::new(false),
            #[cfg(feature = "fault-injection")]
            corrupt_responses: crate::sync::AtomicU32::new(0),
            config,
        });
        let stop = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
            .map_err(|e| Status::resource_exhausted(format!("eventfd: {e}")))?;
        // Built before the threads, so that if a spawn fails, dropping it stops and joins the
        // threads already running and removes the socket.
        let mut server = Server {
            state,
            threads: Vec::new(),
            stop,
            claim,
            published: None,
            inbox: None,
        };
        for worker in 0..server.state.config.workers {
            let state = server.state.clone();
            let spawned = thread::Builder::new()
                .name(format!("netless-worker-{worker}"))
                .spawn(move || worker::run(state, worker));
            server.threads.push(
                spawned.map_err(|e| Status::resource_exhausted(format!("spawn worker: {e}")))?,
            );
        }
        {
            let acceptor = accept::Acceptor::new(
                server.state.clone(),
                listener,
                server
                    .stop
                    .try_clone()
                    .map_err(|e| Status::resource_exhausted(format!("dup: {e}")))?,
            )?;
            server.inbox = Some(acceptor.inbox());
            let spawned = thread::Builder::new()
                .name("netless-acceptor".into())
                .spawn(move || acceptor.run());
            server.threads.push(
                spawned.map_err(|e| Status::resource_exhausted(format!("spawn acceptor: {e}")))?,
            );
        }
        Ok(server)
    }

    /// The service name.
    pub fn service(&self) -> &str {
        &self.state.service
    }

    /// The Unix socket clients connect to.
    pub fn socket_path(&self) -> &Path {
        &self.state.socket_path
    }

    /// A snapshot of the server's counters.
    pub fn stats(&self) -> ServerStats {
        self.state.stats()
    }

    /// Bytes of receive buffer provisioned for the current connections (see
    /// [`ServerStats::receive_buffer_bytes`]).
    pub fn receive_buffer_bytes(&self) -> u64 {
        self.state.receive_buffer_bytes()
    }

    /// Test-only: answer every call with garbage instead (1: a malformed response header,
    /// 2: scribble over the whole response ring).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn fault_corrupt_responses(&self, mode: u32) {
        self.state.corrupt_responses.store(mode, Ordering::Relaxed);
    }

    /// Test-only: starts a frame on every connection's socket and never finishes it (a
    /// server that hangs halfway through a `Goodbye`).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn fault_partial_frame(&self) {
        use std::io::Write;
        for i in 0..self.state.conns.len() as u32 {
            if let Some(conn) = self.state.conns.get(i) {
                let _ = (&conn.socket).write_all(&[100, 0, 0, 0, 4]);
            }
        }
    }

    /// Blocks the calling thread until the server stops (it only stops when dropped or shut
    /// down from another thread, so this is for `main` of a server process).
    pub fn wait(&self) {
        while !self.state.stopping.load(Ordering::Acquire) {
            thread::park_timeout(Duration::from_millis(200));
        }
    }

    /// Stops accepting, closes every connection (their clients' calls fail with
    /// `UNAVAILABLE`), joins the threads and removes the socket.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if self.state.stopping.swap(true, Ordering::AcqRel) && self.threads.is_empty() {
            return;
        }
        // No new client finds it in a fabric.
        drop(self.published.take());
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        for group in self.state.groups.iter() {
            for q in group.replica.queues() {
                netless_ring::notify_all(q.doorbell());
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for conn in self.state.conns.drain() {
            conn.close(Status::unavailable(format!(
                "service `{}` is shutting down",
                self.state.service
            )));
        }
        drop(self.claim.take());
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
            .field("service", &self.state.service)
            .field("socket", &self.state.socket_path)
            .finish()
    }
}
