//! Configuration of servers and clients, with the defaults a user gets without asking.
//!
//! This module owns the knobs and their validation; it never touches shared memory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use netless_ring::WaitPolicy;
use netless_shm::{Acl, SocketDir};

use crate::slo::Slo;
use crate::status::{Code, Status};

/// Default largest message, either direction: 4 MiB, as gRPC.
pub const DEFAULT_MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// Default size from which a payload travels as a Ref through the domain's page pool when
/// client and server share one: the crossover `netless bench dmrpc` measured on 2-core VMs
/// (2026-11-25, AMD EPYC, three runs: by value faster at 8 KiB (0.94–0.98×), by reference
/// at 16 KiB (1.08–1.21×) and above; 2026-11-24, Intel Xeon: even at 16 KiB (1.03×), by
/// reference 1.09× faster at 32 KiB).
pub const DEFAULT_REF_THRESHOLD: usize = 16 * 1024;

/// Default receive buffer of a server with no SLO: 1 MiB (shared, or per worker).
pub const DEFAULT_BUFFER_BYTES: usize = 1 << 20;

/// Default receive buffer of each connection in [`Provisioning::PerConnection`]: 64 KiB,
/// HTTP/2's initial flow-control window.
pub const DEFAULT_CONNECTION_BUFFER_BYTES: usize = 64 * 1024;

/// How a server's receive buffer is provisioned (NEBULA §V-B).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Provisioning {
    /// One buffer every connection allocates from: memory depends on the load (or SLO), not
    /// on the number of clients.
    #[default]
    Shared,
    /// One buffer per worker; a connection writes into worker `index % workers`'s.
    PerWorker,
    /// One fixed buffer per connection slot, as most RPC stacks do: memory grows with the
    /// number of connections.
    PerConnection,
}

/// How workers share incoming requests (NEBULA §V-E).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Dispatch {
    /// One queue; an idle worker takes the oldest request.
    #[default]
    SingleQueue,
    /// One queue; a worker holds up to two requests and prefetches the second one's payload
    /// while it runs the first (join-bounded-shortest-queue with a bound of 2).
    Jbsq2,
    /// One queue per worker; each connection is bound to worker `index % workers` (RSS-like).
    Partitioned,
    /// One queue per worker; each connection is bound to a worker that `pin_cpus` puts on
    /// the CPU its client's calls come from (`ClientConfig::cpu`, else the CPU the
    /// connecting thread is pinned to), else as `Partitioned`. A client thread and the
    /// worker serving it then share one core and its caches: the dispatch for client
    /// threads and workers sharing the cores, where one queue would move every request
    /// between them. It needs `ServerConfig::pin_cpus` and pinned client threads; clients
    /// that name no CPU are placed as `Partitioned` places them.
    ///
    /// ```
    /// use netless::{Dispatch, ServerConfig};
    /// // Worker i on CPU i; a client thread pinned to CPU 1 is served by worker 1.
    /// let config = ServerConfig {
    ///     workers: 2,
    ///     pin_cpus: vec![0, 1],
    ///     dispatch: Dispatch::CpuLocal,
    ///     ..Default::default()
    /// };
    /// # let _ = config;
    /// ```
    CpuLocal,
}

/// How a server is set up. Start from `ServerConfig::default()` and change what you need.
///
/// ```
/// let config = netless::ServerConfig { workers: 2, ..Default::default() };
/// assert_eq!(config.block_size, 64);
/// assert_eq!(config.buffer_bytes, None); // 1 MiB, or sized from `slo`
/// ```
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Worker threads pulling requests from the replica's one receive queue.
    pub workers: usize,
    /// How idle workers wait for requests.
    pub wait: WaitPolicy,
    /// Bytes per slot (block) of the receive buffer (power of two, 64..=65536); a request
    /// takes ⌈(header + body) / block_size⌉ contiguous slots (a 32-byte header for a whole
    /// request without metadata, deadline or SLO, else 64 bytes: `layout::ShortHeader`).
    pub block_size: u32,
    /// Bytes of receive buffer clients write requests into: the whole shared buffer, or each
    /// worker's or connection's (see `provisioning`). `None`: sized from `slo` if set
    /// (10 × E\[Nq\] × mean request, NEBULA §V-C), else [`DEFAULT_BUFFER_BYTES`] (or
    /// [`DEFAULT_CONNECTION_BUFFER_BYTES`] per connection).
    pub buffer_bytes: Option<usize>,
    /// How the receive buffer is split between connections.
    pub provisioning: Provisioning,
    /// How workers take requests.
    pub dispatch: Dispatch,
    /// This server's replica number, if it is one of several serving the service: replicas
    /// listen on `SERVICE#N.sock` and [`Replicas`](crate::Replicas) spreads calls over them.
    pub replica: Option<u32>,
    /// The latency objective, if any: sizes the buffer and limits the queue depth.
    pub slo: Option<Slo>,
    /// Largest request body accepted; bigger requests fail with `RESOURCE_EXHAUSTED`.
    pub max_message: usize,
    /// Most simultaneous connections.
    pub max_connections: u32,
    /// Most simultaneous connections of any one uid but the server's own; `None`: half of
    /// `max_connections` (at least 1). With an ACL that admits other users, no one of them
    /// can take every slot; the server's own uid is bounded by `max_connections` alone.
    pub max_connections_per_uid: Option<u32>,
    /// Who may connect (checked with `SO_PEERCRED` before any fd is passed).
    pub acl: Acl,
    /// Socket directory; `None` means [`netless_shm::socket_dir`]. Either way it is
    /// checked before use (see [`netless_shm::SocketDir`]): not a symbolic link, owned by
    /// us or by root, and writable by its owner alone.
    pub dir: Option<PathBuf>,
    /// CPUs to pin worker `i` to (`pin_cpus[i % len]`); empty means no pinning.
    pub pin_cpus: Vec<usize>,
    /// How long replies may wait for room in a client's response ring before the server gives
    /// up on that client and closes its connection. Workers never wait for it: a reply that
    /// finds the ring full waits in the connection's backlog (at most
    /// [`MAX_BACKLOG_BYTES`](crate::MAX_BACKLOG_BYTES)) while they serve others.
    pub response_stall_limit: Duration,
    /// The page-pool domain this server belongs to. Clients of the same domain may send
    /// large payloads as Refs (pass by reference); the handler sees the bytes either way.
    pub domain: Option<netless_pool::Domain>,
    /// A memory fabric to serve in instead of the socket directory: the replica's segments
    /// are placed in it and published in its service directory, and clients that share
    /// nothing but the fabric connect through it (see [`crate::fabric`]).
    pub fabric: Option<netless_shm::fabric::Fabric>,
    /// Largest response ring a client may bring (its `ClientConfig::ring_bytes`): the server
    /// maps it and its writes fill its pages, so a client cannot make it pay for more.
    /// Replies larger than a ring travel in fragments, so this bounds no message size.
    pub max_client_ring: usize,
}

/// Default [`ServerConfig::max_client_ring`]: 16 MiB.
pub const DEFAULT_MAX_CLIENT_RING: usize = 16 << 20;

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            workers: 1,
            wait: WaitPolicy::default(),
            block_size: 64,
            buffer_bytes: None,
            provisioning: Provisioning::Shared,
            dispatch: Dispatch::SingleQueue,
            replica: None,
            slo: None,
            max_message: DEFAULT_MAX_MESSAGE,
            max_connections: 1024,
            max_connections_per_uid: None,
            acl: Acl::default(),
            dir: None,
            pin_cpus: Vec::new(),
            response_stall_limit: Duration::from_secs(2),
            domain: None,
            fabric: None,
            max_client_ring: DEFAULT_MAX_CLIENT_RING,
        }
    }
}

impl ServerConfig {
    pub(crate) fn validate(&self) -> Result<(), Status> {
        let bad = |m: String| Err(Status::invalid_argument(m));
        if self.workers == 0 || self.workers > 1024 {
            return bad(format!("workers must be 1..=1024, got {}", self.workers));
        }
        if !(4096..=1 << 30).contains(&self.max_client_ring) {
            return bad(format!(
                "max_client_ring must be 4096..=1 GiB, got {}",
                self.max_client_ring
            ));
        }
        if self.dispatch == Dispatch::CpuLocal && self.pin_cpus.is_empty() {
            return bad(
                "Dispatch::CpuLocal serves a client on the worker pinned to its CPU: give the \
                 workers their CPUs in pin_cpus, or use Dispatch::Partitioned"
                    .into(),
            );
        }
        if !self.block_size.is_power_of_two() || !(64..=65536).contains(&self.block_size) {
            return bad(format!(
                "block_size must be a power of two in 64..=65536, got {}",
                self.block_size
            ));
        }
        if let Some(slo) = &self.slo {
            if slo.target.is_zero()
                || slo
                    .mean_service
                    .is_some_and(|s| s.is_zero() || s > slo.target)
            {
                return bad(format!(
                    "slo must have a non-zero target no shorter than its mean service time, got {slo:?}"
                ));
            }
        }
        let part = self.partition_bytes();
        let nblocks = part / self.block_size as usize;
        if nblocks < 4 {
            return bad(format!(
                "buffer_bytes must hold at least 4 blocks of {} bytes, got {part} bytes",
                self.block_size
            ));
        }
        if self.max_message == 0 || self.max_message > u32::MAX as usize / 2 {
            return bad(format!("max_message out of range: {}", self.max_message));
        }
        if self.max_connections == 0 || self.max_connections > 0xffff {
            return bad(format!(
                "max_connections must be 1..=65535, got {}",
                self.max_connections
            ));
        }
        if self.max_connections_per_uid == Some(0) {
            return bad("max_connections_per_uid must be at least 1 (None: the default)".into());
        }
        Ok(())
    }
}

impl ServerConfig {
    /// Most connections one uid but the server's own may hold.
    pub(crate) fn per_uid_connections(&self) -> u32 {
        self.max_connections_per_uid
            .unwrap_or((self.max_connections / 2).max(1))
    }

    /// Partitions of the receive buffer: 1, one per worker or one per connection slot.
    pub(crate) fn partitions(&self) -> u32 {
        match self.provisioning {
            Provisioning::Shared => 1,
            Provisioning::PerWorker => self.workers as u32,
            Provisioning::PerConnection => self.max_connections,
        }
    }

    /// Receive queues: one per worker when dispatch is partitioned.
    pub(crate) fn queues(&self) -> u32 {
        match self.dispatch {
            Dispatch::Partitioned | Dispatch::CpuLocal => self.workers as u32,
            _ => 1,
        }
    }

    /// Bytes of each partition of the receive buffer (rounded down to whole blocks).
    pub fn partition_bytes(&self) -> usize {
        let bytes = match (self.buffer_bytes, self.provisioning, &self.slo) {
            (Some(b), _, _) => b,
            (None, Provisioning::PerConnection, _) => DEFAULT_CONNECTION_BUFFER_BYTES,
            (None, _, Some(slo)) => self.slo_sizing(slo).buffer_bytes,
            (None, _, None) => DEFAULT_BUFFER_BYTES,
        };
        bytes / self.block_size as usize * self.block_size as usize
    }

    /// The buffer an SLO calls for: 10 × E\[Nq\] requests of the mean size (plus header,
    /// in whole blocks) at the highest load that still meets the SLO, for the workers that
    /// drain one partition. At least 64 blocks, and at least room for the requests the
    /// queue-depth limit admits (that limit plus two per worker: one in service, one held by
    /// `jbsq2`), so that at the mean size a full buffer never refuses what the SLO allows.
    pub fn slo_sizing(&self, slo: &Slo) -> crate::slo::sizing::Sizing {
        let k = match self.provisioning {
            Provisioning::Shared => self.workers as u32,
            _ => 1,
        };
        let ratio = slo.ratio().unwrap_or(10.0);
        let load = crate::slo::sizing::max_load_for_slo(k, ratio);
        let block = self.block_size as usize;
        let msg =
            (crate::wire::header::HEADER_LEN + slo.mean_request_bytes).div_ceil(block) * block;
        let mut s = crate::slo::sizing::size_buffer(k, load, msg);
        let admitted = crate::slo::sizing::depth_limit(k, ratio) as usize + 2 * k as usize;
        s.buffer_bytes = s
            .buffer_bytes
            .next_multiple_of(block)
            .max(64 * block)
            .max(admitted * msg);
        s.slots = (s.buffer_bytes / crate::slo::sizing::SLOT_BYTES) as u32;
        s
    }

    /// Most requests a new one may queue behind under the SLO (see
    /// [`crate::slo::sizing::depth_limit`]); `None` without an SLO or a known service time.
    pub(crate) fn depth_limit(&self, measured_service: Option<Duration>) -> Option<u32> {
        let slo = self.slo.as_ref()?;
        self.depth_limit_for(slo.target, slo.mean_service.or(measured_service)?)
    }

    /// The depth limit for an SLO of `target` with mean service time `service`, for the
    /// workers that drain one queue; `None` for a zero service time.
    pub(crate) fn depth_limit_for(&self, target: Duration, service: Duration) -> Option<u32> {
        if service.is_zero() {
            return None;
        }
        let k = match self.dispatch {
            Dispatch::Partitioned | Dispatch::CpuLocal => 1,
            _ => self.workers as u32,
        };
        Some(crate::slo::sizing::depth_limit(
            k,
            target.as_secs_f64() / service.as_secs_f64(),
        ))
    }
}

/// What a client does when a call is NACKed (refused without running: before it was sent,
/// or by a worker that found it queued too long for the SLO; see
/// [`Status::is_nack`](crate::Status::is_nack)). Other failures are never retried, since the
/// server may have run the call. Applies to blocking calls ([`Client::call`](crate::Client::call),
/// [`Replicas::call`](crate::Replicas::call)); an async call returns the NACK at once, for the
/// caller's own retry loop (with [`Replicas::pick`](crate::Replicas::pick) to choose again).
///
/// ```
/// use std::time::Duration;
/// use netless::RetryPolicy;
/// let policy = RetryPolicy::Backoff { attempts: 5, initial: Duration::from_micros(50), max: Duration::from_millis(5) };
/// assert_eq!(policy.attempts(), 5);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RetryPolicy {
    /// Fail at once with the NACK's `RESOURCE_EXHAUSTED`.
    #[default]
    None,
    /// Try again up to `attempts` more times, sleeping `initial`, then twice as long each
    /// time up to `max` (with jitter), within the call's deadline.
    Backoff {
        /// Retries after the first try.
        attempts: u32,
        /// First sleep.
        initial: Duration,
        /// Longest sleep.
        max: Duration,
    },
    /// With [`Replicas`](crate::Replicas): try each other replica of the service once, least
    /// loaded first, then fail. A single-connection [`Client`](crate::Client) fails at once.
    OtherReplica,
}

impl RetryPolicy {
    /// Retries allowed after the first try (for `OtherReplica`: one per other replica).
    pub fn attempts(&self) -> u32 {
        match self {
            RetryPolicy::None => 0,
            RetryPolicy::Backoff { attempts, .. } => *attempts,
            RetryPolicy::OtherReplica => u32::MAX,
        }
    }

    /// The sleep before retry number `retry` (0-based), with ±25% jitter from `seed`.
    pub(crate) fn backoff(&self, retry: u32, seed: u64) -> Duration {
        let RetryPolicy::Backoff { initial, max, .. } = *self else {
            return Duration::ZERO;
        };
        let base = initial
            .saturating_mul(1u32 << retry.min(20))
            .min(max.max(initial));
        // splitmix64 for the jitter: no RNG dependency, different per call.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let factor = 0.75 + (z >> 11) as f64 / (1u64 << 53) as f64 * 0.5;
        base.mul_f64(factor)
    }
}

/// How a client is set up. Start from `ClientConfig::default()` and change what you need.
///
/// ```
/// let config = netless::ClientConfig::default();
/// assert_eq!(config.max_in_flight, 256);
/// ```
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// How a caller waits for its response.
    pub wait: WaitPolicy,
    /// Bytes of this connection's response ring (rounded to a power of two of 64-byte slots).
    pub ring_bytes: usize,
    /// Most calls in flight on one connection; more fail with `RESOURCE_EXHAUSTED`.
    pub max_in_flight: u32,
    /// Largest response accepted; the server's own limit applies to requests.
    pub max_message: usize,
    /// Socket directory; `None` means [`netless_shm::socket_dir`]. Either way it is
    /// checked before use (see [`netless_shm::SocketDir`]): not a symbolic link, owned by
    /// us, by root or by `expect_server_uid`, and writable by its owner alone.
    pub dir: Option<PathBuf>,
    /// The uid the server must run as, checked (`SO_PEERCRED`) as soon as the socket
    /// connects, before anything is sent; a server of another uid fails the connection with
    /// `PERMISSION_DENIED`. `None`: the socket directory's owner (our own uid, unless the
    /// directory is root's). Set it to reach a server of another user, in a directory that
    /// user owns.
    pub expect_server_uid: Option<u32>,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// Deadline applied to calls that set none; `None` waits as long as the server lives.
    pub default_timeout: Option<Duration>,
    /// The page-pool domain this client belongs to. If the server belongs to the same one,
    /// request payloads of at least `ref_threshold` bytes are written once into pool pages
    /// and travel as a 32-byte Ref, invisibly to both applications.
    pub domain: Option<netless_pool::Domain>,
    /// A memory fabric to find the service in instead of the socket directory (see
    /// [`crate::fabric`]): its connection segment is placed there, and the server's liveness
    /// is its lease.
    pub fabric: Option<netless_shm::fabric::Fabric>,
    /// Payload size from which requests travel by reference (see `domain`).
    pub ref_threshold: usize,
    /// What to do when a call is NACKed.
    pub retry: RetryPolicy,
    /// The CPU this connection's calls will come from, told to the server: one with
    /// [`Dispatch::CpuLocal`] serves the connection on a worker pinned there. `None`: the
    /// CPU the connecting thread is pinned to, if it may run on one alone, else none (the
    /// server then places the connection by its index). Set it when one thread connects
    /// for others.
    pub cpu: Option<usize>,
}

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            wait: WaitPolicy::default(),
            ring_bytes: 256 * 1024,
            max_in_flight: 256,
            max_message: DEFAULT_MAX_MESSAGE,
            dir: None,
            expect_server_uid: None,
            connect_timeout: Duration::from_secs(5),
            default_timeout: None,
            domain: None,
            fabric: None,
            ref_threshold: DEFAULT_REF_THRESHOLD,
            retry: RetryPolicy::None,
            cpu: None,
        }
    }
}

impl ClientConfig {
    pub(crate) fn validate(&self) -> Result<(), Status> {
        let bad = |m: String| Err(Status::invalid_argument(m));
        if !(4096..=1 << 30).contains(&self.ring_bytes) {
            return bad(format!(
                "ring_bytes must be 4096..=1 GiB, got {}",
                self.ring_bytes
            ));
        }
        if self.max_in_flight == 0 || self.max_in_flight > 65536 {
            return bad(format!(
                "max_in_flight must be 1..=65536, got {}",
                self.max_in_flight
            ));
        }
        if self.max_message == 0 || self.max_message > u32::MAX as usize / 2 {
            return bad(format!("max_message out of range: {}", self.max_message));
        }
        Ok(())
    }
}

impl ClientConfig {
    /// Where `service`'s socket is (or would be) under this configuration: a missing file
    /// means no server serves that name.
    pub fn socket_path(&self, service: &str) -> Result<PathBuf, Status> {
        let dir = self.socket_dir()?;
        Ok(dir.path().join(socket_name(dir.path(), service, None)?))
    }

    /// The socket directory, opened and checked, trusting a directory of the expected
    /// server's uid.
    pub(crate) fn socket_dir(&self) -> Result<SocketDir, Status> {
        let trusted: &[u32] = match &self.expect_server_uid {
            Some(uid) => std::slice::from_ref(uid),
            None => &[],
        };
        socket_dir(self.dir.as_deref(), trusted)
    }
}

/// The socket file name of `service`, or of its replica `n` (`SERVICE#N.sock`), in `dir`,
/// validated like the service's name and checked to fit in a socket address.
pub(crate) fn socket_name(
    dir: &Path,
    service: &str,
    replica: Option<u32>,
) -> Result<String, Status> {
    let plain = netless_shm::service_socket_path(dir, service)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    let Some(n) = replica else {
        return Ok(format!("{service}.sock"));
    };
    let name = format!("{service}#{n}.sock");
    let path = dir.join(&name);
    // 107: a Unix socket path's limit (sun_path less its NUL).
    if plain.as_os_str().len() > 107 || path.as_os_str().len() > 107 {
        return Err(Status::invalid_argument(format!(
            "replica socket path {} is too long for a Unix socket",
            path.display()
        )));
    }
    Ok(name)
}

/// Which server of `service` a socket file name in the socket directory belongs to.
///
/// A server bound as `service` listens on `SERVICE.sock`, and replica `N` (bound with
/// [`ServerConfig::replica`] `= Some(N)`) on `SERVICE#N.sock`. This returns `Some(None)` for
/// the first, `Some(Some(N))` for the second, and `None` for any other name: another
/// service's socket (`SERVICE2.sock` is not `SERVICE`'s), a replica suffix that is not a
/// decimal `u32`, or a file that is not a socket name. [`Replicas`](crate::Replicas) finds
/// a service's replicas this way. `service` itself is not validated: pass a valid service
/// name.
///
/// ```
/// use netless::replica_of;
///
/// assert_eq!(replica_of("kv.Store.sock", "kv.Store"), Some(None));
/// assert_eq!(replica_of("kv.Store#7.sock", "kv.Store"), Some(Some(7)));
/// assert_eq!(replica_of("kv.Store2.sock", "kv.Store"), None);
/// assert_eq!(replica_of("kv.Store#x.sock", "kv.Store"), None);
/// assert_eq!(replica_of("kv.Store#7", "kv.Store"), None);
/// ```
pub fn replica_of(file_name: &str, service: &str) -> Option<Option<u32>> {
    let rest = file_name.strip_prefix(service)?.strip_suffix(".sock")?;
    if rest.is_empty() {
        return Some(None);
    }
    let n = rest.strip_prefix('#')?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .then(|| n.parse().ok().map(Some))
        .flatten()
}

/// The socket directory `dir` names (or the default one), opened and checked, trusting a
/// directory owned by one of `trusted` besides ours and root's.
pub(crate) fn socket_dir(dir: Option<&Path>, trusted: &[u32]) -> Result<SocketDir, Status> {
    SocketDir::resolve(dir, trusted).map_err(|e| match e {
        // Refused as untrustworthy: nothing to retry until someone fixes the directory.
        netless_shm::Error::SocketDir { .. } => {
            Status::new(Code::FailedPrecondition, format!("socket directory: {e}"))
        }
        e => Status::unavailable(format!("socket directory: {e}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_socket_names() {
        assert_eq!(replica_of("kv.Store.sock", "kv.Store"), Some(None));
        assert_eq!(replica_of("kv.Store#7.sock", "kv.Store"), Some(Some(7)));
        assert_eq!(replica_of("kv.Store2.sock", "kv.Store"), None);
        assert_eq!(replica_of("kv.Store#.sock", "kv.Store"), None);
        assert_eq!(replica_of("kv.Store#1x.sock", "kv.Store"), None);
        assert_eq!(replica_of("kv.Store#99999999999.sock", "kv.Store"), None);
    }

    #[test]
    fn backoff_grows_to_its_max_with_jitter() {
        let p = RetryPolicy::Backoff {
            attempts: 10,
            initial: Duration::from_millis(1),
            max: Duration::from_millis(8),
        };
        for retry in 0..10 {
            let base = Duration::from_millis(1 << retry.min(3));
            let d = p.backoff(retry, retry as u64 * 7919);
            assert!(
                d >= base.mul_f64(0.75) && d <= base.mul_f64(1.25),
                "{retry}: {d:?}"
            );
        }
        assert_eq!(RetryPolicy::None.backoff(0, 1), Duration::ZERO);
    }

    #[test]
    fn slo_sizing_is_small_and_whole_blocks() {
        let config = ServerConfig {
            workers: 4,
            slo: Some(Slo::new(Duration::from_micros(100)).mean_service(Duration::from_micros(10))),
            ..ServerConfig::default()
        };
        let bytes = config.partition_bytes();
        assert_eq!(bytes % 64, 0);
        assert!((4096..1 << 20).contains(&bytes), "{bytes}");
        assert_eq!(config.depth_limit(None), Some(35));
        assert!(config.validate().is_ok());
        let bad = ServerConfig {
            slo: Some(Slo::new(Duration::from_micros(1)).mean_service(Duration::from_micros(10))),
            ..ServerConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
