//! Client-side load balancing over the replicas of one service (NotNets §4.1): no proxy in
//! between, each call goes straight to the replica whose published queue is shorter of two
//! picked at random (power of two choices), and a NACKed call is retried as the client's
//! [`RetryPolicy`] says.
//!
//! Replicas are servers bound with [`ServerConfig::replica`](crate::ServerConfig::replica)
//! (`SERVICE#N.sock`) or plainly (`SERVICE.sock`) in one socket directory. Each publishes its
//! queue depth in its replica segment, which every client already maps, so choosing costs two
//! cache-line reads and no message.
//!
//! ```no_run
//! use netless::{CallOptions, ClientConfig, Replicas, RetryPolicy};
//! let config = ClientConfig { retry: RetryPolicy::OtherReplica, ..Default::default() };
//! let replicas = Replicas::connect("kv.Store", config)?;
//! let reply = replicas.call("Get", b"key", &CallOptions::new())?;
//! # Ok::<(), netless::Status>(())
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::thread;
use std::time::Instant;

use super::call::{CallOptions, Reply};
use super::Client;
use crate::config::{replica_of, socket_name, ClientConfig, RetryPolicy};
use crate::status::Status;

/// Connections to every replica of a service, with power-of-two-choices selection.
pub struct Replicas {
    service: String,
    config: ClientConfig,
    members: RwLock<Vec<Member>>,
    /// State of the xorshift generator behind the random choices.
    rng: AtomicU64,
    retries: AtomicU64,
}

struct Member {
    replica: Option<u32>,
    client: Client,
}

impl Replicas {
    /// Finds the replicas of `service` in the socket directory and connects to each;
    /// `UNAVAILABLE` if none answers.
    pub fn connect(service: &str, config: ClientConfig) -> Result<Replicas, Status> {
        let replicas = Replicas {
            service: service.to_string(),
            config,
            members: RwLock::new(Vec::new()),
            rng: AtomicU64::new(netless_shm::monotonic_ns() | 1),
            retries: AtomicU64::new(0),
        };
        replicas.refresh()?;
        Ok(replicas)
    }

    /// Re-reads the socket directory: connects to new replicas, drops closed connections.
    /// Returns how many replicas are connected; `UNAVAILABLE` if none.
    pub fn refresh(&self) -> Result<usize, Status> {
        let dir = self.config.socket_dir()?;
        let mut found: Vec<Option<u32>> = dir
            .sockets()
            .map_err(|e| Status::unavailable(format!("cannot list {}: {e}", dir.path().display())))?
            .iter()
            .filter_map(|name| replica_of(name, &self.service))
            .collect();
        found.sort();
        let mut members = self.members.write().unwrap_or_else(|e| e.into_inner());
        members.retain(|m| !m.client.check_closed());
        let mut last_error = None;
        for replica in found {
            if members.iter().any(|m| m.replica == replica) {
                continue;
            }
            let name = socket_name(dir.path(), &self.service, replica)?;
            match Client::connect_at(&self.service, &dir, &name, self.config.clone()) {
                Ok(client) => members.push(Member { replica, client }),
                // A stale socket of a dead replica: skip it.
                Err(e) => last_error = Some(e),
            }
        }
        if members.is_empty() {
            return Err(last_error.unwrap_or_else(|| {
                Status::unavailable(format!(
                    "no replica of service `{}` found in {}: is a server running? (set NETLESS_DIR if it uses another directory)",
                    self.service,
                    dir.path().display()
                ))
            }));
        }
        Ok(members.len())
    }

    /// Number of connected replicas.
    pub fn len(&self) -> usize {
        self.members.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no replica is connected (never true after a successful `connect`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls NACKed and tried again so far.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// The connection to use for the next call: the one with the shorter published queue
    /// of two live replicas picked at random. Use it for `call_async`.
    pub fn pick(&self) -> Result<Client, Status> {
        self.choose(&[]).map(|(_, c)| c)
    }

    /// Calls `method` on the least loaded of two random replicas; a NACKed call is retried
    /// per the configured [`RetryPolicy`] (`OtherReplica`: each other replica once, least
    /// loaded first; `Backoff`: after a pause, on a fresh choice).
    pub fn call(
        &self,
        method: &str,
        payload: &[u8],
        options: &CallOptions,
    ) -> Result<Reply, Status> {
        let policy = self.config.retry;
        let deadline = options.deadline().or_else(|| {
            self.config
                .default_timeout
                .and_then(|t| Instant::now().checked_add(t))
        });
        let mut tried: Vec<usize> = Vec::new();
        let mut retry = 0u32;
        loop {
            let exclude = if policy == RetryPolicy::OtherReplica {
                &tried[..]
            } else {
                &[]
            };
            let (index, client) = self.choose(exclude)?;
            let err = match client.call(method, payload, options) {
                Err(s) if s.is_nack() => s,
                other => return other,
            };
            tried.push(index);
            let again = match policy {
                RetryPolicy::None => false,
                RetryPolicy::OtherReplica => tried.len() < self.len(),
                RetryPolicy::Backoff { attempts, .. } => {
                    let pause = policy.backoff(retry, self.next_random());
                    let fits = deadline.is_none_or(|d| Instant::now() + pause < d);
                    if retry < attempts && fits {
                        thread::sleep(pause);
                    }
                    retry < attempts && fits
                }
            };
            if !again {
                return Err(err);
            }
            retry += 1;
            self.retries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Power of two choices among live members not in `exclude`: (index, connection).
    fn choose(&self, exclude: &[usize]) -> Result<(usize, Client), Status> {
        let members = self.members.read().unwrap_or_else(|e| e.into_inner());
        let live: Vec<usize> = (0..members.len())
            .filter(|i| !exclude.contains(i) && !members[*i].client.is_closed())
            .collect();
        let pick = match live.len() {
            0 => {
                return Err(Status::unavailable(format!(
                    "no live replica of service `{}` left to call: restart one, or call Replicas::refresh",
                    self.service
                )))
            }
            1 => live[0],
            n => {
                let r = self.next_random();
                let a = live[(r % n as u64) as usize];
                let mut b = live[((r >> 32) % (n as u64 - 1)) as usize];
                if b == a {
                    b = live[n - 1];
                }
                let depth = |i: usize| members[i].client.queue_depth();
                if depth(b) < depth(a) {
                    b
                } else {
                    a
                }
            }
        };
        Ok((pick, members[pick].client.clone()))
    }

    fn next_random(&self) -> u64 {
        // xorshift64*, advanced with a CAS-free fetch_update (contention only costs retries).
        let mut x = self.rng.load(Ordering::Relaxed);
        loop {
            let mut y = x;
            y ^= y >> 12;
            y ^= y << 25;
            y ^= y >> 27;
            match self
                .rng
                .compare_exchange_weak(x, y, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return y.wrapping_mul(0x2545_f491_4f6c_dd1d),
                Err(now) => x = now,
            }
        }
    }
}

impl std::fmt::Debug for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicas")
            .field("service", &self.service)
            .field("replicas", &self.len())
            .finish()
    }
}
