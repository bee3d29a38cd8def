//! One client connection's state, shared by every clone of its `Client`, its background
//! threads and its `Pipeline`: the two segments, the block lease, the call slots, the
//! response ring's consumer end, and how the connection ends (the server's hang-up, a
//! `Goodbye`, or a malformed reply).
//!
//! Also the admission checks a client makes before it writes anything: the queue depth the
//! server's SLO allows, and the NACK that refuses a call it would exceed.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::Thread;
use std::time::Instant;

use netless_ring::{Consumer, DoorbellWords};
use netless_shm::recv_frame_by;

use super::call::CallOptions;
use super::slots::{lock, CallSlots};
use crate::config::ClientConfig;
use crate::segment::{BlockLease, ConnSegment, ReplicaSegment};
use crate::spin_lock::SpinLock;
use crate::status::Status;
use crate::sync::{AtomicBool, AtomicU32, Ordering};
use crate::wire::handshake::Frame;

/// How long the server may take to send a whole `Goodbye` once it started.
const GOODBYE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);
/// Longest `Goodbye` read (a status and its message).
const MAX_GOODBYE_LEN: usize = 64 * 1024;

/// A client connection's state (see the module docs).
pub(crate) struct Connection {
    /// The page-pool domain shared with the server, if any: large payloads go as Refs.
    pub(super) pool: Option<netless_pool::Domain>,
    pub(crate) service: String,
    pub(super) dir: PathBuf,
    pub(crate) config: ClientConfig,
    pub(crate) replica: ReplicaSegment,
    /// Our segment: the response ring and our doorbell (kept mapped by `WakeSource`s too).
    pub(super) segment: Arc<ConnSegment>,
    pub(crate) conn_index: u32,
    pub(crate) token: u64,
    pub(crate) server_max_message: usize,
    /// The most body bytes one fragment of a request carries.
    pub(crate) fragment_body: usize,
    pub(crate) lease: BlockLease,
    pub(super) slots: CallSlots,
    pub(crate) consumer: SpinLock<Consumer<'static>>,
    pub(crate) dead: AtomicBool,
    death: Mutex<Option<Status>>,
    /// Async calls waiting for their replies.
    pub(super) async_waiters: AtomicU32,
    /// Async calls in their spin phase: they poll the ring themselves, so the reaper keeps
    /// off the ring (and the CPU) meanwhile.
    pub(super) spinning: AtomicU32,
    /// The spinner's role is held for the next call to adopt (its last holder got its reply
    /// while other calls were outstanding): the reaper keeps off meanwhile.
    pub(super) role_vacant: AtomicBool,
    pub(super) stopping: AtomicBool,
    pub(super) reaper_thread: Mutex<Option<Thread>>,
    pub(super) socket: UnixStream,
    /// Its polled rings, in a software-coherent fabric: calls go through them.
    pub(crate) polled: Option<super::polled::PolledClient>,
    /// Longest sleep of a waiting call: short when the server is on another kernel, whose
    /// futex wake-ups never reach us, so waiting is polling.
    pub(crate) max_sleep: std::time::Duration,
}

/// What the handshake gave a new connection.
pub(super) struct Handshaken {
    pub(super) service: String,
    pub(super) dir: PathBuf,
    pub(super) config: ClientConfig,
    pub(super) pool: Option<netless_pool::Domain>,
    pub(super) replica: ReplicaSegment,
    pub(super) segment: ConnSegment,
    pub(super) consumer: Consumer<'static>,
    pub(super) conn_index: u32,
    pub(super) tag: u32,
    pub(super) token: u64,
    pub(super) fragment_body: usize,
    pub(super) socket: UnixStream,
    pub(super) polled: Option<super::polled::PolledClient>,
    /// See [`Connection::max_sleep`].
    pub(super) max_sleep: std::time::Duration,
}

impl Connection {
    pub(super) fn new(h: Handshaken) -> Connection {
        let g = *h.replica.geometry();
        let segment = Arc::new(h.segment);
        Connection {
            pool: h.pool,
            service: h.service,
            dir: h.dir,
            lease: BlockLease::new(
                h.tag,
                h.replica.partition_for(h.conn_index),
                g.block_size as usize,
                g.quota_blocks,
            ),
            consumer: SpinLock::new(h.consumer),
            server_max_message: g.max_message as usize,
            fragment_body: h.fragment_body,
            slots: CallSlots::new(h.config.max_in_flight as usize),
            dead: AtomicBool::new(false),
            death: Mutex::new(None),
            async_waiters: AtomicU32::new(0),
            spinning: AtomicU32::new(0),
            role_vacant: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            reaper_thread: Mutex::new(None),
            config: h.config,
            replica: h.replica,
            segment,
            conn_index: h.conn_index,
            token: h.token,
            socket: h.socket,
            polled: h.polled,
            max_sleep: h.max_sleep,
        }
    }

    /// Our connection segment (test-only access, for fault injection).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn conn_segment(&self) -> &ConnSegment {
        &self.segment
    }

    /// Our doorbell, where the server notifies us.
    #[inline(always)]
    pub(crate) fn doorbell(&self) -> &DoorbellWords {
        self.segment.doorbell()
    }

    /// Whether the connection is gone.
    #[inline(always)]
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Whether a payload of `len` bytes travels by reference on this connection.
    pub(super) fn by_ref(&self, len: usize) -> bool {
        self.pool.is_some() && len >= self.config.ref_threshold.max(1)
    }

    /// The call's deadline, or the client's default timeout from now.
    pub(super) fn deadline_for(&self, options: &CallOptions) -> Option<Instant> {
        options.deadline().or_else(|| {
            self.config
                .default_timeout
                .and_then(|t| Instant::now().checked_add(t))
        })
    }

    /// Why the calls on this connection fail now that it is gone.
    pub(crate) fn death_status(&self) -> Status {
        lock(&self.death).clone().unwrap_or_else(|| {
            Status::unavailable(format!(
                "connection to service `{}` is closed",
                self.service
            ))
        })
    }

    /// The status for a malformed reply (`what` was wrong), which closes the connection.
    pub(crate) fn corrupt(&self, what: &str) -> Status {
        Status::internal(format!(
            "service `{}` wrote a malformed response ({what}); the connection was closed",
            self.service
        ))
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
        netless_ring::notify_all(self.doorbell());
        self.slots.wake_callers();
        self.unpark_reaper();
    }

    /// Wakes the reaper thread, if there is one.
    pub(super) fn unpark_reaper(&self) {
        if let Some(t) = lock(&self.reaper_thread).as_ref() {
            t.unpark();
        }
    }

    /// Why calls fail once the server's end of the socket is gone.
    fn hung_up_status(&self) -> Status {
        Status::unavailable(format!(
            "service `{}` closed the connection: its server process exited or was killed (at {}); retry when it is back",
            self.service,
            self.dir.display()
        ))
    }

    /// Checks the socket now instead of waiting for the monitor thread, which a busy machine
    /// may not have run since the server died: a hung-up socket fails the connection at once.
    /// True if the connection is gone.
    pub(crate) fn check_hang_up(&self) -> bool {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        if self.is_dead() {
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
        self.is_dead()
    }

    /// The monitor thread: waits for the server's hang-up (or `Goodbye`) on the socket and
    /// fails the connection with it; ends when `stop` is readable.
    pub(super) fn monitor(&self, stop: OwnedFd) {
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
            // A `Goodbye` is one small frame: a server that sends it slowly (or sends bytes
            // that never make a frame) cannot hold this thread, nor a drop that joins it.
            let deadline = std::time::Instant::now() + GOODBYE_TIMEOUT;
            let status = match recv_frame_by(&self.socket, 0, MAX_GOODBYE_LEN, deadline) {
                Ok((bytes, _)) => match Frame::decode(&bytes) {
                    Some(Frame::Goodbye(status)) => status,
                    _ => Status::internal(format!(
                        "service `{}` sent an unexpected frame; connection closed",
                        self.service
                    )),
                },
                Err(_) if self.is_dead() => return,
                Err(_) => self.hung_up_status(),
            };
            self.fail(status);
            return;
        }
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

    /// [`Connection::check_depth`] under an SLO's `limit` (out of line: most clients have
    /// none).
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
}
