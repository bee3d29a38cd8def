//! Configuration of servers and clients, with the defaults a user gets without asking.
//!
//! This module owns the knobs and their validation; it never touches shared memory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use netless_ring::WaitPolicy;
use netless_shm::Acl;

use crate::status::Status;

/// Default largest message, either direction: 4 MiB, as gRPC.
pub const DEFAULT_MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// Default size from which a payload travels as a Ref through the domain's page pool when
/// client and server share one: the crossover `netless bench dmrpc --only transfer` measured
/// on a 2-core VM (by value faster up to 32 KiB, by reference from 64 KiB).
pub const DEFAULT_REF_THRESHOLD: usize = 64 * 1024;

/// How a server is set up. Start from `ServerConfig::default()` and change what you need.
///
/// ```
/// let config = netless::ServerConfig { workers: 2, ..Default::default() };
/// assert_eq!(config.buffer_bytes, 1 << 20);
/// ```
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Worker threads pulling requests from the replica's one receive queue.
    pub workers: usize,
    /// How idle workers wait for requests.
    pub wait: WaitPolicy,
    /// Bytes per block of the shared receive buffer (power of two, 256..=65536).
    pub block_size: u32,
    /// Bytes of the shared receive buffer all clients of this replica write requests into.
    pub buffer_bytes: usize,
    /// Largest request body accepted; bigger requests fail with `RESOURCE_EXHAUSTED`.
    pub max_message: usize,
    /// Most simultaneous connections.
    pub max_connections: u32,
    /// Who may connect (checked with `SO_PEERCRED` before any fd is passed).
    pub acl: Acl,
    /// Socket directory; `None` means [`netless_shm::socket_dir`].
    pub dir: Option<PathBuf>,
    /// CPUs to pin worker `i` to (`pin_cpus[i % len]`); empty means no pinning.
    pub pin_cpus: Vec<usize>,
    /// How long a worker waits for room in a client's response ring before it gives up on
    /// that client and closes its connection.
    pub response_stall_limit: Duration,
    /// The page-pool domain this server belongs to. Clients of the same domain may send
    /// large payloads as Refs (pass by reference); the handler sees the bytes either way.
    pub domain: Option<netless_pool::Domain>,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            workers: 1,
            wait: WaitPolicy::default(),
            block_size: 1024,
            buffer_bytes: 1 << 20,
            max_message: DEFAULT_MAX_MESSAGE,
            max_connections: 1024,
            acl: Acl::default(),
            dir: None,
            pin_cpus: Vec::new(),
            response_stall_limit: Duration::from_secs(2),
            domain: None,
        }
    }
}

impl ServerConfig {
    pub(crate) fn validate(&self) -> Result<(), Status> {
        let bad = |m: String| Err(Status::invalid_argument(m));
        if self.workers == 0 || self.workers > 1024 {
            return bad(format!("workers must be 1..=1024, got {}", self.workers));
        }
        if !self.block_size.is_power_of_two() || !(256..=65536).contains(&self.block_size) {
            return bad(format!(
                "block_size must be a power of two in 256..=65536, got {}",
                self.block_size
            ));
        }
        let nblocks = self.buffer_bytes / self.block_size as usize;
        if !(4..=1 << 20).contains(&nblocks) {
            return bad(format!(
                "buffer_bytes must hold 4..=1048576 blocks of {} bytes, got {} bytes",
                self.block_size, self.buffer_bytes
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
        Ok(())
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
    /// Socket directory; `None` means [`netless_shm::socket_dir`].
    pub dir: Option<PathBuf>,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// Deadline applied to calls that set none; `None` waits as long as the server lives.
    pub default_timeout: Option<Duration>,
    /// Receive-buffer blocks a connection keeps leased between calls, for reuse.
    pub block_cache: usize,
    /// The page-pool domain this client belongs to. If the server belongs to the same one,
    /// request payloads of at least `ref_threshold` bytes are written once into pool pages
    /// and travel as a 32-byte Ref, invisibly to both applications.
    pub domain: Option<netless_pool::Domain>,
    /// Payload size from which requests travel by reference (see `domain`).
    pub ref_threshold: usize,
}

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            wait: WaitPolicy::default(),
            ring_bytes: 256 * 1024,
            max_in_flight: 256,
            max_message: DEFAULT_MAX_MESSAGE,
            dir: None,
            connect_timeout: Duration::from_secs(5),
            default_timeout: None,
            block_cache: 8,
            domain: None,
            ref_threshold: DEFAULT_REF_THRESHOLD,
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
        Ok(resolve_socket(self.dir.as_deref(), service)?.1)
    }
}

/// The socket directory (`dir`, or the default one) and the path of `service`'s socket in it.
pub(crate) fn resolve_socket(
    dir: Option<&Path>,
    service: &str,
) -> Result<(PathBuf, PathBuf), Status> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => netless_shm::socket_dir()
            .map_err(|e| Status::unavailable(format!("socket directory: {e}")))?,
    };
    let path = netless_shm::service_socket_path(&dir, service)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok((dir, path))
}
