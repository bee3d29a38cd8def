//! The gateway's connections to its backends: per service, a pool of up to
//! [`LinkSpec::max_links`] netless connections (links), opened on demand and chosen
//! least-loaded per call.
//!
//! A connect (the service's Unix socket, then a handshake that a hung backend can stretch to
//! the connect timeout) runs on a blocking thread, one at a time per service, never under a
//! lock and never on an async thread; callers wait for its outcome asynchronously, no longer
//! than the connect timeout or their deadline. So a backend that hangs delays only the calls
//! to it. This module never forwards a call itself and never decides who may call what.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use netless::{Client, ClientConfig, ReplicaStats};
use tokio::sync::watch;

/// Extra time a caller gives a connect beyond the connect timeout (the handshake's own
/// deadline), for the blocking thread to report back.
const SLACK: Duration = Duration::from_millis(250);

/// Pools kept at most before those not in use are dropped (names of services that do not
/// exist must not pile up).
const MAX_IDLE_POOLS: usize = 256;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a call found no link to its service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NoLink {
    /// No netless service of that name here: no socket.
    Unknown,
    /// The backend did not complete a connection in time, or refused it.
    Unavailable,
    /// The call's deadline passed while a connection was being made.
    Deadline,
    /// Every link carries its most calls and the pool is full.
    Busy,
}

type Outcome = Result<(), NoLink>;

/// How backends are reached; the same for every service.
#[derive(Debug)]
pub(crate) struct LinkSpec {
    /// The netless client configuration of each link (its `connect_timeout` bounds a
    /// connect; `dir` is resolved).
    pub(crate) config: ClientConfig,
    /// Links per service at most.
    pub(crate) max_links: usize,
    /// Calls one link carries at most: half its call slots, less a margin, since a stream
    /// may hold two at once (a `recv` waiting and a `send`) and a dropped one sends `cancel`.
    pub(crate) per_link: usize,
}

impl LinkSpec {
    /// Calls a link of `config` carries at most.
    pub(crate) fn calls_per_link(config: &ClientConfig) -> usize {
        (config.max_in_flight as usize / 2).saturating_sub(8).max(1)
    }
}

/// Every service's pool.
pub(crate) struct Backends {
    spec: Arc<LinkSpec>,
    services: Mutex<HashMap<String, Arc<Backend>>>,
}

impl Backends {
    pub(crate) fn new(spec: LinkSpec) -> Backends {
        Backends {
            spec: Arc::new(spec),
            services: Mutex::default(),
        }
    }

    pub(crate) fn spec(&self) -> &Arc<LinkSpec> {
        &self.spec
    }

    /// The pool of `service`, made (empty: nothing connects here) on first use.
    pub(crate) fn get(&self, service: &str) -> Arc<Backend> {
        let mut services = lock(&self.services);
        if let Some(backend) = services.get(service) {
            return backend.clone();
        }
        if services.len() >= MAX_IDLE_POOLS {
            services.retain(|_, b| b.in_use());
        }
        let backend = Arc::new(Backend {
            service: service.to_string(),
            pool: Mutex::default(),
            shared: AtomicUsize::new(0),
            reserved: AtomicUsize::new(0),
        });
        services.insert(service.to_string(), backend.clone());
        backend
    }
}

impl Backends {
    /// The counters of the server of each service this gateway has a live link to, read
    /// from that link's shared memory (every link of a service goes to the one server that
    /// holds its name), sorted by service.
    pub(crate) fn replica_stats(&self) -> Vec<(String, ReplicaStats)> {
        let backends: Vec<Arc<Backend>> = lock(&self.services).values().cloned().collect();
        let mut stats: Vec<(String, ReplicaStats)> = backends
            .iter()
            .filter_map(|backend| {
                let pool = lock(&backend.pool);
                let link = pool.links.iter().find(|l| !l.client.is_closed())?;
                Some((backend.service.clone(), link.client.replica_stats()))
            })
            .collect();
        stats.sort_by(|a, b| a.0.cmp(&b.0));
        stats
    }
}

/// One service's links, and the calls admitted to it.
pub(crate) struct Backend {
    service: String,
    pool: Mutex<Pool>,
    /// Calls admitted from the service's shared capacity (see `admission`). Relaxed, as
    /// `reserved`: counts that bound themselves, ordering no other memory.
    pub(crate) shared: AtomicUsize,
    /// Calls admitted from connections' reserves.
    pub(crate) reserved: AtomicUsize,
}

#[derive(Default)]
struct Pool {
    links: Vec<Arc<Link>>,
    /// The connect under way, if any: its outcome is published there.
    attempt: Option<watch::Receiver<Option<Outcome>>>,
    /// A connect's thread outlived its deadline: no other starts until it returns, so a
    /// backend that never answers holds one thread, not one per call.
    stuck: bool,
}

/// One netless connection to the service.
struct Link {
    client: Client,
    /// Calls on it now (held by [`LinkGuard`]s). Relaxed throughout: a count that picks the
    /// least loaded link (under the pool's lock), ordering no other memory.
    load: AtomicUsize,
}

/// A call's use of a link; dropping it ends the use.
pub(crate) struct LinkGuard(Arc<Link>);

impl LinkGuard {
    pub(crate) fn client(&self) -> &Client {
        &self.0.client
    }
}

impl Drop for LinkGuard {
    fn drop(&mut self) {
        self.0.load.fetch_sub(1, Ordering::Relaxed);
    }
}

enum Pick {
    Link(LinkGuard),
    Wait(watch::Receiver<Option<Outcome>>),
    Fail(NoLink),
}

impl Backend {
    /// Whether anything refers to this pool: links, a connect, admitted calls.
    fn in_use(&self) -> bool {
        let pool = lock(&self.pool);
        !pool.links.is_empty()
            || pool.attempt.is_some()
            || pool.stuck
            || self.shared.load(Ordering::Relaxed) != 0
            || self.reserved.load(Ordering::Relaxed) != 0
    }

    /// A link for one call: the least-loaded one with room, else one connected now (waiting
    /// at most the connect timeout and until `deadline`).
    pub(crate) async fn link(
        self: &Arc<Self>,
        spec: &Arc<LinkSpec>,
        deadline: Option<Instant>,
    ) -> Result<LinkGuard, NoLink> {
        // A link just made may be taken by other waiters first: a few rounds, then busy.
        for _ in 0..4 {
            let mut attempt = match self.pick(spec) {
                Pick::Link(guard) => return Ok(guard),
                Pick::Wait(attempt) => attempt,
                Pick::Fail(why) => return Err(why),
            };
            let patience = Instant::now() + spec.config.connect_timeout + SLACK;
            let (until, why) = match deadline {
                Some(deadline) if deadline < patience => (deadline, NoLink::Deadline),
                _ => (patience, NoLink::Unavailable),
            };
            let outcome =
                tokio::time::timeout_at(until.into(), attempt.wait_for(Option::is_some)).await;
            match outcome {
                Ok(Ok(outcome)) => (*outcome).unwrap_or(Err(NoLink::Unavailable))?,
                Ok(Err(_)) => return Err(NoLink::Unavailable),
                Err(_) => return Err(why),
            }
        }
        Err(NoLink::Busy)
    }

    fn pick(self: &Arc<Self>, spec: &Arc<LinkSpec>) -> Pick {
        let mut pool = lock(&self.pool);
        if pool.links.iter().any(|l| l.client.is_closed()) {
            let (dead, live) = std::mem::take(&mut pool.links)
                .into_iter()
                .partition(|l| l.client.is_closed());
            pool.links = live;
            discard(dead);
        }
        let best = pool
            .links
            .iter()
            .min_by_key(|l| l.load.load(Ordering::Relaxed))
            .cloned();
        if let Some(link) = best {
            let load = link.load.load(Ordering::Relaxed);
            if load < spec.per_link {
                // Half full: open the next link now, so it is there when this one is full.
                if load >= spec.per_link / 2
                    && pool.links.len() < spec.max_links
                    && pool.attempt.is_none()
                {
                    self.start(&mut pool, spec);
                }
                link.load.fetch_add(1, Ordering::Relaxed);
                return Pick::Link(LinkGuard(link));
            }
        }
        if pool.links.len() >= spec.max_links {
            return Pick::Fail(NoLink::Busy);
        }
        match pool.attempt.clone() {
            Some(attempt) => Pick::Wait(attempt),
            None => match self.start(&mut pool, spec) {
                Some(attempt) => Pick::Wait(attempt),
                None => Pick::Fail(NoLink::Unavailable),
            },
        }
    }

    /// Starts a connect, unless one is stuck.
    fn start(
        self: &Arc<Self>,
        pool: &mut Pool,
        spec: &Arc<LinkSpec>,
    ) -> Option<watch::Receiver<Option<Outcome>>> {
        if pool.stuck {
            return None;
        }
        let (done, attempt) = watch::channel(None);
        pool.attempt = Some(attempt.clone());
        tokio::spawn(self.clone().connect(spec.clone(), done));
        Some(attempt)
    }

    /// Connects on a blocking thread and publishes the outcome to the waiting callers.
    async fn connect(self: Arc<Self>, spec: Arc<LinkSpec>, done: watch::Sender<Option<Outcome>>) {
        let service = self.service.clone();
        let config = spec.config.clone();
        let mut blocking = tokio::task::spawn_blocking(move || open(&service, config));
        let finished =
            tokio::time::timeout(spec.config.connect_timeout + SLACK, &mut blocking).await;
        let outcome = {
            let mut pool = lock(&self.pool);
            pool.attempt = None;
            match finished {
                Ok(Ok(Ok(client))) => {
                    self.adopt(&mut pool, &spec, client);
                    Ok(())
                }
                Ok(Ok(Err(why))) => Err(why),
                Ok(Err(_)) => Err(NoLink::Unavailable),
                Err(_) => {
                    pool.stuck = true;
                    Err(NoLink::Unavailable)
                }
            }
        };
        done.send_replace(Some(outcome));
        if lock(&self.pool).stuck {
            tracing::warn!(
                "gateway: connecting to `{}` is stuck past the connect timeout; its calls \
                 fail until it returns",
                self.service
            );
            let late = blocking.await;
            let mut pool = lock(&self.pool);
            pool.stuck = false;
            if let Ok(Ok(client)) = late {
                self.adopt(&mut pool, &spec, client);
            }
        }
    }

    fn adopt(&self, pool: &mut Pool, spec: &LinkSpec, client: Client) {
        let link = Arc::new(Link {
            client,
            load: AtomicUsize::new(0),
        });
        if pool.links.len() < spec.max_links {
            pool.links.push(link);
        } else {
            discard(vec![link]);
        }
    }
}

/// Opens a link to `service` (blocking: run off the async threads).
fn open(service: &str, config: ClientConfig) -> Result<Client, NoLink> {
    use std::os::unix::fs::FileTypeExt;
    let socket = config.socket_path(service).map_err(|_| NoLink::Unknown)?;
    match std::fs::symlink_metadata(&socket) {
        Ok(meta) if meta.file_type().is_socket() => {}
        _ => return Err(NoLink::Unknown),
    }
    Client::connect_with(service, config).map_err(|status| {
        tracing::warn!("gateway: connecting to `{service}`: {status}");
        NoLink::Unavailable
    })
}

/// Drops links on a blocking thread: closing a netless connection joins its threads.
fn discard(links: Vec<Arc<Link>>) {
    if !links.is_empty() {
        tokio::task::spawn_blocking(move || drop(links));
    }
}
