//! The client: connects to a service and calls it. Requests go into the replica's shared
//! receive buffer and queue; replies come back through the client's own response ring.
//!
//! A [`Client`] is one connection. It is `Send + Sync + Clone`: clones share the connection
//! and any number of threads (and async tasks) may have calls in flight at once. Whichever
//! waiting thread holds the ring's consumer drains replies and hands each to its caller;
//! other waiters park until theirs arrives. Async calls are completed by a reaper thread
//! started on first use, so a tokio worker never blocks. A monitor thread watches the Unix
//! socket: its hang-up (the server died) fails every waiting call with `UNAVAILABLE` at once.
//!
//! - `connect`: the handshake; `connection`: the connection's state and its NACKs;
//! - `slots`: calls in flight, and the ring drained into them; `send`: writing requests;
//! - `wait`: blocking waits; `future` and `reaper`: async calls;
//! - [`call`](CallOptions): what a call takes and returns; `replicas`: [`Replicas`].
//!
//! Every byte read from the response ring is validated; a malformed reply closes the
//! connection with `INTERNAL` instead of being trusted.
#![deny(unsafe_code)]

use std::future::Future;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use netless_shm::SocketDir;

use crate::config::{socket_name, ClientConfig};
use crate::segment::WakeSource;
use crate::status::Status;
use crate::sync::Ordering;
use crate::wire::metadata::Metadata;

pub(crate) mod call;
mod connect;
pub(crate) mod connection;
mod fabric;
mod future;
mod polled;
mod reaper;
pub(crate) mod replicas;
mod send;
mod slots;
mod wait;

pub use call::{CallOptions, Reply};
pub(crate) use connection::Connection;
pub use replicas::Replicas;

use future::{AsyncState, CallFuture, Oneshot};
use slots::lock;

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
    handle: Arc<ConnectionHandle>,
}

/// A connection and the threads that serve it; the last clone of its `Client` drops it,
/// which stops them and gives the connection's spare blocks back.
struct ConnectionHandle {
    conn: Arc<Connection>,
    monitor: Mutex<Option<JoinHandle<()>>>,
    reaper: Mutex<Option<JoinHandle<()>>>,
    /// Readable once the handle is dropped (ends the monitor's wait).
    stop: OwnedFd,
}

impl Client {
    /// Connects to `service` in the default socket directory with the default configuration.
    pub fn connect(service: &str) -> Result<Client, Status> {
        Client::connect_with(service, ClientConfig::default())
    }

    /// Connects to `service` with `config`.
    ///
    /// The socket directory is checked first ([`ClientConfig::dir`]), and the server's uid
    /// as soon as the socket connects ([`ClientConfig::expect_server_uid`]): a server of
    /// another user fails with `PERMISSION_DENIED` before anything is sent.
    pub fn connect_with(service: &str, config: ClientConfig) -> Result<Client, Status> {
        config.validate()?;
        if let Some(fabric) = config.fabric.clone() {
            return Client::connect_in_fabric(service, None, &fabric, config);
        }
        let dir = config.socket_dir()?;
        let name = socket_name(dir.path(), service, None)?;
        Client::connect_at(service, &dir, &name, config)
    }

    /// Connects to replica `replica` of `service` (the server bound with
    /// `ServerConfig::replica = Some(replica)`, socket `SERVICE#N.sock`).
    pub fn connect_replica(
        service: &str,
        replica: u32,
        config: ClientConfig,
    ) -> Result<Client, Status> {
        config.validate()?;
        if let Some(fabric) = config.fabric.clone() {
            return Client::connect_in_fabric(service, Some(replica), &fabric, config);
        }
        let dir = config.socket_dir()?;
        let name = socket_name(dir.path(), service, Some(replica))?;
        Client::connect_at(&format!("{service}#{replica}"), &dir, &name, config)
    }

    /// Connects to the server listening on socket `name` (a replica's) in `dir`.
    pub(crate) fn connect_at(
        service: &str,
        dir: &SocketDir,
        name: &str,
        config: ClientConfig,
    ) -> Result<Client, Status> {
        Client::start(connect::handshake(service, dir, name, config)?)
    }

    /// Connects to `service` (replica `replica`) through the memory fabric in `config`.
    fn connect_in_fabric(
        service: &str,
        replica: Option<u32>,
        fabric: &netless_shm::fabric::Fabric,
        config: ClientConfig,
    ) -> Result<Client, Status> {
        Client::start(fabric::handshake(service, replica, fabric, config)?)
    }

    /// Starts the threads of a connection the handshake made.
    fn start(handshaken: connection::Handshaken) -> Result<Client, Status> {
        let shared = Arc::new(Connection::new(handshaken));
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
            handle: Arc::new(ConnectionHandle {
                conn: shared,
                monitor: Mutex::new(Some(monitor)),
                reaper: Mutex::new(None),
                stop,
            }),
        })
    }

    /// The service this client is connected to.
    pub fn service(&self) -> &str {
        &self.handle.conn.service
    }

    /// True once the connection is gone (server died, or a protocol violation closed it).
    /// A flag, as cheap as a load: a background thread sets it when the server hangs up,
    /// which on a busy machine can be a while after the server died. See
    /// [`Client::check_closed`] for an answer as of now.
    pub fn is_closed(&self) -> bool {
        self.handle.conn.dead.load(Ordering::Acquire)
    }

    /// Like [`Client::is_closed`], but first checks the socket itself (one `poll` system
    /// call): a server that has exited is seen at once, without waiting for the background
    /// thread. For rescans of a set of connections, not for every call.
    pub fn check_closed(&self) -> bool {
        self.handle.conn.check_hang_up()
    }

    /// The server's live counters and registers, read from the replica segment this client
    /// maps (no message is sent).
    pub fn replica_stats(&self) -> crate::control::ReplicaStats {
        crate::control::snapshot(&self.handle.conn.replica)
    }

    /// Requests queued at the server ahead of a new call from this connection, as the
    /// server last published it in shared memory (a hint, for load balancing).
    pub fn queue_depth(&self) -> u64 {
        let conn = &self.handle.conn;
        conn.replica.queue_for(conn.conn_index).depth()
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
        let shared = &self.handle.conn;
        let deadline = shared.deadline_for(options);
        if let Some(polled) = &shared.polled {
            let metadata = options.request_metadata();
            return polled.call(shared, method, metadata, payload, deadline, out);
        }
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
        if shared.slots.abandoned.load(Ordering::Relaxed) > 0 {
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
        let shared = &self.handle.conn;
        let deadline = shared.deadline_for(options);
        // A payload that goes by reference leaves only its 32-byte Ref in the body.
        let sent = if shared.by_ref(payload.len()) {
            netless_pool::Ref::LEN
        } else {
            payload.len()
        };
        let body = method.len() + options.request_metadata().encoded_len() + sent;
        // A call over polled rings, or one sent in fragments, may wait for room: do it on a
        // helper thread.
        let state = if body > shared.fragment_body || shared.polled.is_some() {
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
        let wait = &self.handle.conn.config.wait;
        wait.mode != netless_ring::WaitMode::Futex && !wait.spin.is_zero()
    }

    fn ensure_reaper(&self) {
        let mut reaper = lock(&self.handle.reaper);
        if reaper.is_none() {
            let shared = self.handle.conn.clone();
            match thread::Builder::new()
                .name("netless-reaper".into())
                .spawn(move || reaper::Reaper { conn: shared }.run())
            {
                Ok(h) => {
                    *lock(&self.handle.conn.reaper_thread) = Some(h.thread().clone());
                    *reaper = Some(h);
                }
                Err(e) => self.handle.conn.fail(Status::resource_exhausted(format!(
                    "cannot spawn the reaper thread: {e}"
                ))),
            }
        } else if let Some(t) = lock(&self.handle.conn.reaper_thread).as_ref() {
            t.unpark();
        }
    }

    /// The connection's state, for a `Pipeline` on it.
    pub(crate) fn connection(&self) -> &Connection {
        &self.handle.conn
    }

    /// The doorbell this connection's replies notify, for a server worker to sleep on
    /// ([`Handler::wake_sources`](crate::Handler::wake_sources)).
    pub fn wake_source(&self) -> WakeSource {
        let conn = &self.handle.conn;
        WakeSource::new(conn.segment.clone(), &conn.service)
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("service", &self.handle.conn.service)
            .field("conn_index", &self.handle.conn.conn_index)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Drop for ConnectionHandle {
    fn drop(&mut self) {
        let shared = &self.conn;
        shared.stopping.store(true, Ordering::Release);
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        shared.unpark_reaper();
        if let Some(h) = lock(&self.reaper).take() {
            let _ = h.join();
        }
        // Shut down first: a monitor reading a frame the server is slow to finish returns
        // at once.
        let _ = shared.socket.shutdown(std::net::Shutdown::Both);
        if let Some(h) = lock(&self.monitor).take() {
            let _ = h.join();
        }
        shared.lease.release_all(shared.replica.table());
    }
}

/// Test-only access for fault injection (`crate::fault`).
#[cfg(feature = "fault-injection")]
impl Connection {
    pub(crate) fn conn_identity(&self) -> (u32, u64) {
        (self.conn_index, self.token)
    }
    /// Our block tag, and the quota the lease keeps to.
    pub(crate) fn lease_identity(&self) -> (u32, u32) {
        self.lease.identity()
    }
    pub(crate) fn claim_for_fault(&self, count: u32) -> Option<u32> {
        self.lease
            .claim(self.replica.table(), self.replica.shared_head(), count)
    }
}
