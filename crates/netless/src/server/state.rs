//! What every thread of a server shares: the [`ServerState`] of one replica (its control
//! segment and trust groups, configuration, handler, connection table and workers' slots)
//! and the answers it gives about itself (counters, the mean service time, the queue-depth
//! limit it publishes).
//!
//! The threads own their own state ([`Acceptor`](super::accept::Acceptor),
//! [`Worker`](super::worker::Worker)); this holds only what they must all see.

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::conn::{Conn, ConnTable};
use super::group::{Group, Groups};
use super::handler::{Handler, ResponseBuilder};
use super::worker::WorkerSlot;
use super::ServerStats;
use crate::config::{Provisioning, ServerConfig};
use crate::segment::layout::{block_state, latency_bucket_floor, provisioning, ServerControl};
use crate::segment::{ControlSegment, Place, ReplicaSpec};
use crate::slo::Slo;
use crate::status::Status;
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// The state a replica's acceptor, workers and reply handles share.
pub(super) struct ServerState {
    /// This server, for handles that outlive a handler call
    /// ([`DeferredReply`](super::DeferredReply)).
    pub(super) this: Weak<ServerState>,
    /// Set (by a worker, before the first `DeferredReply` exists) once any handler deferred
    /// a reply: from then on replies may come from other threads, so even a single worker
    /// locks the producer.
    pub(super) deferring: AtomicBool,
    pub(super) service: String,
    pub(super) socket_path: PathBuf,
    pub(super) config: ServerConfig,
    /// Registers and worker stats, read-only to clients.
    pub(super) control: Arc<ControlSegment>,
    /// The replica segments, one per trust group.
    pub(super) groups: Groups,
    /// The shape of each group's replica segment.
    pub(super) spec: ReplicaSpec,
    /// The server's own uid: its group comes first, and only it (or root) sets registers.
    pub(super) owner_uid: u32,
    pub(super) conns: ConnTable,
    /// Held while a handshake takes a slot of the table (the count, the vacant slot and the
    /// install must agree).
    pub(super) admitting: std::sync::Mutex<()>,
    /// Connections with replies waiting for room in their ring.
    pub(super) backlogs: super::backlog::Backlogs,
    pub(super) handler: Box<dyn Handler>,
    pub(super) stopping: AtomicBool,
    pub(super) workers: Box<[WorkerSlot]>,
    /// Queue entries or requests dropped as corrupt or unattributable.
    pub(super) dropped: AtomicU64,
    /// Connections closed for breaking the protocol.
    pub(super) violations: AtomicU64,
    /// See [`ServerStats::shed`].
    pub(super) shed: AtomicU64,
    /// A client on another kernel is (or was) connected through a fabric: see `max_sleep`.
    pub(super) remote_clients: AtomicBool,
    /// Test-only: answer every call with garbage (`Server::fault_corrupt_responses`).
    #[cfg(feature = "fault-injection")]
    pub(super) corrupt_responses: AtomicU32,
}

impl ServerState {
    /// Whether the server is stopping.
    #[inline(always)]
    pub(super) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Our page-pool domain's id, or 0.
    pub(super) fn domain_id(&self) -> u64 {
        self.config.domain.as_ref().map_or(0, |d| d.id())
    }

    /// The registers and live values clients read.
    #[inline(always)]
    pub(super) fn server_control(&self) -> &ServerControl {
        self.control.server_control()
    }

    /// An idle worker's longest sleep: short once a client on another kernel joined.
    pub(super) fn max_sleep(&self) -> std::time::Duration {
        if self.remote_clients.load(Ordering::Relaxed) {
            std::time::Duration::from_micros(100)
        } else {
            std::time::Duration::from_millis(100)
        }
    }

    /// The trust group of `uid`, made now if it has none (the caller holds `admitting`).
    pub(super) fn group_of(&self, uid: u32) -> Result<&Group, Status> {
        self.groups.of_uid(uid, |index| {
            let place = self
                .config
                .fabric
                .as_ref()
                .map_or(Place::Memfd, Place::Fabric);
            Group::create(
                &self.service,
                index,
                uid,
                self.spec,
                self.control.clone(),
                place,
            )
        })
    }

    /// The group a connection belongs to.
    #[inline(always)]
    pub(super) fn group(&self, conn: &Conn) -> Option<&Group> {
        self.groups.get(conn.group as usize)
    }

    /// Adds `delta` to the live connection count, here and in the shared control block.
    pub(super) fn count_connection(&self, delta: i32) {
        let n = self.conns.count(delta);
        self.server_control()
            .connections
            .store(n, Ordering::Relaxed);
    }

    /// Closes `conn` for breaking the protocol (`why`).
    #[cold]
    pub(super) fn violated(&self, conn: &Conn, why: &str) {
        self.violations.fetch_add(1, Ordering::Relaxed);
        conn.close(Status::internal(format!(
            "connection closed by service `{}`: the client violated the protocol ({why})",
            self.service
        )));
    }

    /// With an SLO whose service time is not declared: once the workers have served
    /// `Slo::WARMUP` requests, publishes the queue-depth limit for the measured mean.
    pub(super) fn update_depth_limit(&self) {
        let Some(slo) = &self.config.slo else { return };
        if slo.mean_service.is_some() {
            return;
        }
        if let Some(mean) = self.measured_service() {
            if let Some(limit) = self.config.depth_limit(Some(mean)) {
                self.server_control()
                    .depth_limit
                    .store(limit, Ordering::Relaxed);
            }
        }
    }

    /// Mean time a worker spends on a request, once `Slo::WARMUP` have been measured.
    pub(super) fn measured_service(&self) -> Option<Duration> {
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

    /// The mean service time: declared in the SLO, else measured, else estimated from the
    /// sampled latency histogram (at least 64 samples).
    pub(super) fn service_time(&self) -> Option<Duration> {
        if let Some(s) = self.config.slo.and_then(|s| s.mean_service) {
            return Some(s);
        }
        if let Some(s) = self.measured_service() {
            return Some(s);
        }
        let latency = crate::control::latency_histogram(self.control.stats());
        let n = latency.iter().fold(0u64, |a, c| a.saturating_add(*c));
        (n >= 64).then(|| {
            let sum = latency
                .iter()
                .enumerate()
                .map(|(b, c)| c.saturating_mul(latency_bucket_floor(b)))
                .fold(0u64, u64::saturating_add);
            Duration::from_nanos(sum / n)
        })
    }

    /// Answers the runtime's own `netless.ctl/` methods (soft registers) for a client of
    /// `uid`: anyone admitted may read them, only the server's own uid (or root) set them.
    pub(super) fn control_call(
        &self,
        uid: u32,
        op: &str,
        payload: &[u8],
        builder: &mut ResponseBuilder<'_>,
    ) -> Result<(), Status> {
        let ctrl = self.server_control();
        let answer = match op {
            "Get" => crate::control::get(ctrl),
            "Set" if uid != self.owner_uid && uid != 0 => {
                return Err(Status::new(
                    crate::status::Code::PermissionDenied,
                    format!(
                        "only the uid that runs service `{}` (or root) may set its registers",
                        self.service
                    ),
                ))
            }
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

    /// Maps a request payload that came as a Ref.
    pub(super) fn map_payload(
        &self,
        conn: &Conn,
        bytes: &[u8],
    ) -> Result<netless_pool::SharedBuf, Status> {
        let (domain, peer) = match (&self.config.domain, &conn.peer_member) {
            (Some(d), Some(peer)) => (d, peer),
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
        Ok(domain.map_from_member(&r, peer)?)
    }

    /// Bytes of receive buffer provisioned for the current connections (see
    /// [`ServerStats::receive_buffer_bytes`]): each trust group's.
    pub(super) fn receive_buffer_bytes(&self) -> u64 {
        let spec = &self.spec;
        let part = u64::from(spec.part_blocks) * u64::from(spec.block_size);
        match spec.provisioning {
            provisioning::PER_CONNECTION => part * u64::from(self.conns.live()),
            _ => part * u64::from(spec.nparts) * self.groups.count() as u64,
        }
    }

    /// A snapshot of the counters.
    pub(super) fn stats(&self) -> ServerStats {
        let workers = self.control.stats();
        let words = || self.groups.iter().flat_map(|g| g.replica.table());
        ServerStats {
            connections: self.conns.live(),
            requests: workers
                .iter()
                .map(|w| w.calls.load(Ordering::Relaxed))
                .sum(),
            errors: workers
                .iter()
                .map(|w| w.errors.load(Ordering::Relaxed))
                .sum(),
            dropped: self.dropped.load(Ordering::Relaxed),
            protocol_violations: self.violations.load(Ordering::Relaxed),
            free_blocks: words()
                .filter(|w| w.load(Ordering::Relaxed) == block_state::FREE)
                .count() as u32,
            total_blocks: words().count() as u32,
            receive_buffer_bytes: self.receive_buffer_bytes(),
            nacks: self
                .groups
                .iter()
                .map(|g| g.replica.client_control().nacks.load(Ordering::Relaxed))
                .fold(0, u64::wrapping_add),
            shed: self.shed.load(Ordering::Relaxed),
            depth_limit: self.server_control().depth_limit.load(Ordering::Relaxed),
            measured_service: self.measured_service(),
        }
    }

    /// The block-table words `conn` may have claimed: its partition of its group's buffer (a
    /// faulty client's writes elsewhere are caught by the tag check of whoever reads those
    /// words).
    pub(super) fn words_of<'s>(&'s self, conn: &Conn) -> &'s [AtomicU32] {
        let Some(group) = self.group(conn) else {
            return &[];
        };
        let table = group.replica.table();
        match self.config.provisioning {
            Provisioning::Shared => table,
            _ => {
                let part = group.replica.partition_for(conn.index);
                &table[part.start as usize..part.end as usize]
            }
        }
    }
}
