//! What every thread of a server shares: the [`ServerState`] of one replica (its segment,
//! configuration, handler, connection table and workers' slots) and the answers it gives
//! about itself (counters, the mean service time, the queue-depth limit it publishes).
//!
//! The threads own their own state ([`Acceptor`](super::accept::Acceptor),
//! [`Worker`](super::worker::Worker)); this holds only what they must all see.

use std::path::PathBuf;
use std::sync::Weak;
use std::time::Duration;

use netless_ring::ConsumerHead;

use super::conn::{Conn, ConnTable};
use super::handler::{Handler, ResponseBuilder};
use super::worker::WorkerSlot;
use super::ServerStats;
use crate::config::{Provisioning, ServerConfig};
use crate::segment::layout::{block_state, latency_bucket_floor, provisioning};
use crate::segment::ReplicaSegment;
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
    pub(super) replica: ReplicaSegment,
    /// Consumer position of each receive queue.
    pub(super) heads: Box<[ConsumerHead]>,
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

    /// Adds `delta` to the live connection count, here and in the shared control block.
    pub(super) fn count_connection(&self, delta: i32) {
        let n = self.conns.count(delta);
        self.replica
            .server_control()
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
                self.replica
                    .server_control()
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
        let stats = crate::control::snapshot(&self.replica);
        let n: u64 = stats.latency.iter().sum();
        (n >= 64).then(|| {
            let sum: u64 = stats
                .latency
                .iter()
                .enumerate()
                .map(|(b, c)| c.saturating_mul(latency_bucket_floor(b)))
                .sum();
            Duration::from_nanos(sum / n)
        })
    }

    /// Answers the runtime's own `netless.ctl/` methods (soft registers).
    pub(super) fn control_call(
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

    /// Maps a request payload that came as a Ref.
    pub(super) fn map_payload(
        &self,
        conn: &Conn,
        bytes: &[u8],
    ) -> Result<netless_pool::SharedBuf, Status> {
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

    /// Bytes of receive buffer provisioned for the current connections (see
    /// [`ServerStats::receive_buffer_bytes`]).
    pub(super) fn receive_buffer_bytes(&self) -> u64 {
        let g = self.replica.geometry();
        let part = u64::from(g.part_blocks) * u64::from(g.block_size);
        match g.provisioning {
            provisioning::PER_CONNECTION => part * u64::from(self.conns.live()),
            _ => part * u64::from(g.nparts),
        }
    }

    /// A snapshot of the counters.
    pub(super) fn stats(&self) -> ServerStats {
        let table = self.replica.table();
        let workers = self.replica.stats();
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
            free_blocks: table
                .iter()
                .filter(|w| w.load(Ordering::Relaxed) == block_state::FREE)
                .count() as u32,
            total_blocks: table.len() as u32,
            receive_buffer_bytes: self.receive_buffer_bytes(),
            nacks: self.replica.client_control().nacks.load(Ordering::Relaxed),
            shed: self.shed.load(Ordering::Relaxed),
            depth_limit: self
                .replica
                .server_control()
                .depth_limit
                .load(Ordering::Relaxed),
            measured_service: self.measured_service(),
        }
    }

    /// The block-table words connection `index` may have claimed: its partition (a faulty
    /// client's writes elsewhere are caught by the tag check of whoever reads those words).
    pub(super) fn words_of(&self, index: u32) -> &[AtomicU32] {
        let table = self.replica.table();
        match self.config.provisioning {
            Provisioning::Shared => table,
            _ => {
                let part = self.replica.partition_for(index);
                &table[part.start as usize..part.end as usize]
            }
        }
    }
}
