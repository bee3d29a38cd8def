//! A tier of `pass_by_reference`, the `dmrpc-tier` peer role: a process in the run's domain
//! serving one netless service. A call `value/N` or `ref/N` with N > 1 goes on to its next
//! tier (round robin) as `value/N-1` / `ref/N-1`, pipelined, asynchronously or blocking
//! (`--forward`); with N = 1 the tier sums the array, in place in its receive buffer (by
//! value) or in the mapped pages (by reference). `cow/‰` and `copy/‰` map a shared buffer
//! and write part of it; `stats` answers the tier's counters. It never measures: the client
//! times the calls and reads the counters.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context as _;
use netless::{
    CallOptions, Client, ClientConfig, Code, DeferredReply, Handler, Pipeline, Request,
    ResponseBuilder, Server, ServerConfig, Status, WaitMode,
};
use netless_pool::{Domain, PoolError, Ref, SharedBuf};

use super::data::{head_tail, pool_status, sum_buf, sum_words, to_bytes, Counts};
use super::{
    client_config, domain_config, wait_policy, Forward, COW_SIZES, MAX_HOPS, TIER_BLOCK,
    TIER_BUFFER,
};
use crate::harness::peer;

/// The `dmrpc-tier` peer role: one tier of the DmRPC benchmark.
#[derive(clap::Args, Debug)]
pub struct TierArgs {
    /// The netless service this tier serves.
    #[arg(long)]
    pub service: String,
    /// Where to forward calls that go further (round robin when repeated).
    #[arg(long)]
    pub next: Vec<String>,
    /// The run's socket directory (services and the domain).
    #[arg(long)]
    pub dir: PathBuf,
    /// The domain to join.
    #[arg(long)]
    pub domain: String,
    /// Spin budget of the server's workers before they sleep, in µs (the connections to the
    /// next tiers never spin: their replies take at least one more hop).
    #[arg(long, default_value_t = 5)]
    pub spin_us: u64,
    /// How the server's workers poll before they sleep (see `pass_by_reference --wait`).
    #[arg(long, default_value = "adaptive")]
    pub wait: WaitMode,
    /// Run the whole process on these CPUs only (one to pin it).
    #[arg(long, value_delimiter = ',')]
    pub cpus: Vec<usize>,
    /// How this tier forwards (see `pass_by_reference --forward`).
    #[arg(long, default_value = "pipelined")]
    pub forward: Forward,
    /// Worker threads with `--forward blocking` (one per call in flight).
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Before serving, touch every free page of the pool once, so that measured pool
    /// operations do not pay this process's first-touch page faults.
    #[arg(long)]
    pub prefault: bool,
}

struct Tier {
    domain: Domain,
    /// The next tiers (round robin), by how this tier forwards.
    nexts: Nexts,
    rr: AtomicUsize,
    requests: AtomicU64,
    forwarded: AtomicU64,
    payload_bytes: AtomicU64,
    handle_bytes: AtomicU64,
    maps: AtomicU64,
    /// What the copy-on-write callee writes (never the original pattern).
    scribble: Vec<u8>,
    /// `kind/n` method names, built once: `methods[0][n]` is `value/n`, `methods[1][n]`
    /// `ref/n`.
    methods: [Vec<String>; 2],
}

/// A tier's connections to its next tiers.
enum Nexts {
    /// Pipelines whose replies the worker collects in [`Handler::poll`].
    Pipelined(Vec<Mutex<Downstream>>),
    /// Clients whose async calls a tokio thread completes.
    Async(Vec<Client>, tokio::runtime::Handle),
    /// Clients called with blocking calls from many workers.
    Blocking(Vec<Client>),
}

impl Nexts {
    fn len(&self) -> usize {
        match self {
            Nexts::Pipelined(v) => v.len(),
            Nexts::Async(v, _) | Nexts::Blocking(v) => v.len(),
        }
    }
}

/// A pipeline to a next tier and the calls in flight on it, by call slot: the deferred
/// reply each answers, and what to count once it did.
struct Downstream {
    pipe: Pipeline,
    waiting: Vec<Option<Forwarded>>,
}

struct Forwarded {
    reply: DeferredReply,
    by_value: bool,
    len: u64,
}

/// Calls a tier keeps in flight on each pipeline at most (more than any client sends).
const TIER_PIPELINE_DEPTH: u32 = 4096;

struct TierHandler(Arc<Tier>);

impl Handler for TierHandler {
    fn call<'a>(
        &self,
        request: &Request<'a>,
        response: &mut ResponseBuilder<'a>,
    ) -> Result<(), Status> {
        self.0.handle(request, response)
    }

    fn poll(&self, _worker: usize) -> bool {
        self.0.collect()
    }

    fn wake_sources(&self, _worker: usize) -> Vec<netless::WakeSource> {
        match &self.0.nexts {
            Nexts::Pipelined(downs) => downs.iter().map(|d| lock(d).pipe.wake_source()).collect(),
            _ => Vec::new(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Tier {
    fn counts(&self) -> Counts {
        let pool = self.domain.stats();
        Counts {
            requests: self.requests.load(Ordering::Relaxed),
            forwarded: self.forwarded.load(Ordering::Relaxed),
            payload_bytes: self.payload_bytes.load(Ordering::Relaxed),
            handle_bytes: self.handle_bytes.load(Ordering::Relaxed),
            maps: self.maps.load(Ordering::Relaxed),
            pool_bytes: pool.bytes_copied,
            pool_pages: pool.pages_copied,
        }
    }

    fn handle<'a>(
        self: &Arc<Self>,
        req: &Request<'a>,
        resp: &mut ResponseBuilder<'a>,
    ) -> Result<(), Status> {
        let (kind, arg) = req.method.split_once('/').unwrap_or((req.method, ""));
        if kind == "stats" {
            resp.payload = to_bytes(&self.counts().fields());
            return Ok(());
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        let arg: usize = arg
            .parse()
            .map_err(|_| Status::invalid_argument(format!("bad method `{}`", req.method)))?;
        match kind {
            "value" | "ref" if arg > 1 => self.forward(kind == "value", arg - 1, req.payload, resp),
            "value" | "ref" => {
                let sum = if kind == "value" {
                    // Read in place, in the receive buffer.
                    sum_words(req.payload)
                } else {
                    let r = Ref::from_bytes(req.payload).map_err(pool_status)?;
                    let buf = self.domain.map(&r).map_err(pool_status)?;
                    self.maps.fetch_add(1, Ordering::Relaxed);
                    sum_buf(&buf)
                };
                resp.payload.extend_from_slice(&sum.to_le_bytes());
                Ok(())
            }
            "cow" | "copy" => {
                let r = Ref::from_bytes(req.payload).map_err(pool_status)?;
                let started = Instant::now();
                let mapped = self.domain.map(&r).map_err(pool_status)?;
                let map_ns = started.elapsed().as_nanos() as u64;
                self.maps.fetch_add(1, Ordering::Relaxed);
                let len = mapped.len();
                if len < 8 || len > self.scribble.len() {
                    return Err(Status::invalid_argument(format!("{len} bytes")));
                }
                let (head, tail) = head_tail(&mapped);
                let started = Instant::now();
                let (mut target, copy_ns) = if kind == "copy" {
                    let copy = private_copy(&self.domain, &mapped).map_err(pool_status)?;
                    let ns = started.elapsed().as_nanos() as u64;
                    drop(mapped);
                    (copy, ns)
                } else {
                    (mapped, 0)
                };
                let n = len * arg.min(1000) / 1000;
                let started = Instant::now();
                if n > 0 {
                    target.write(0, &self.scribble[..n]).map_err(pool_status)?;
                }
                let write_ns = started.elapsed().as_nanos() as u64;
                let started = Instant::now();
                drop(target);
                let unmap_ns = started.elapsed().as_nanos() as u64;
                resp.payload = to_bytes(&[map_ns, copy_ns, write_ns, unmap_ns, head, tail]);
                Ok(())
            }
            _ => Err(Status::new(
                Code::Unimplemented,
                format!("no method `{}`", req.method),
            )),
        }
    }

    /// Sends `payload` on to the next tier as `value/remaining` or `ref/remaining`, and
    /// answers when it answers.
    fn forward<'a>(
        self: &Arc<Self>,
        by_value: bool,
        remaining: usize,
        payload: &[u8],
        resp: &mut ResponseBuilder<'a>,
    ) -> Result<(), Status> {
        let n = self.nexts.len();
        if n == 0 {
            return Err(Status::new(
                Code::FailedPrecondition,
                "this tier is the last one",
            ));
        }
        let next = self.rr.fetch_add(1, Ordering::Relaxed) % n;
        let method = self.methods[usize::from(!by_value)]
            .get(remaining)
            .ok_or_else(|| Status::invalid_argument(format!("{remaining} hops is too many")))?;
        let len = payload.len() as u64;
        match &self.nexts {
            Nexts::Blocking(clients) => {
                let answer = clients[next].call(method, payload, &CallOptions::new())?;
                self.count_forward(by_value, len);
                resp.metadata = answer.metadata;
                resp.payload = answer.payload;
                Ok(())
            }
            Nexts::Async(clients, runtime) => {
                let reply = resp.defer()?;
                // The payload is copied into the next tier's receive buffer here, before the
                // handler returns (and its request blocks go back to the caller).
                let call = clients[next].call_async(method, payload, &CallOptions::new());
                let tier = self.clone();
                runtime.spawn(async move {
                    let _ = match call.await {
                        Ok(answer) => {
                            tier.count_forward(by_value, len);
                            reply.send(&answer.metadata, &answer.payload)
                        }
                        Err(status) => reply.fail(&status),
                    };
                });
                Ok(())
            }
            Nexts::Pipelined(downs) => {
                let reply = resp.defer()?;
                let mut down = lock(&downs[next]);
                // Copied into the next tier's receive buffer here (by value), or the 32-byte
                // Ref; published with the batch it joins.
                match down.pipe.submit(method, payload) {
                    Ok(id) => {
                        down.waiting[Pipeline::slot(id)] = Some(Forwarded {
                            reply,
                            by_value,
                            len,
                        });
                    }
                    Err(status) => {
                        let _ = reply.fail(&status);
                    }
                }
                Ok(())
            }
        }
    }

    /// Sends the replies of the pipelined calls that were answered; whether there were any.
    fn collect(&self) -> bool {
        let Nexts::Pipelined(downs) = &self.nexts else {
            return false;
        };
        let mut any = false;
        for down in downs {
            let mut down = lock(down);
            let Downstream { pipe, waiting } = &mut *down;
            let polled = pipe.poll(|id, reply| {
                let Some(f) = waiting.get_mut(Pipeline::slot(id)).and_then(Option::take) else {
                    return;
                };
                let _ = match reply {
                    Ok(bytes) => {
                        self.count_forward(f.by_value, f.len);
                        f.reply.send(&netless::Metadata::new(), bytes)
                    }
                    Err(status) => f.reply.fail(&status),
                };
            });
            match polled {
                Ok(n) => any |= n > 0,
                Err(status) => {
                    // The next tier is gone: fail everything waiting on it.
                    for f in waiting.iter_mut().filter_map(Option::take) {
                        let _ = f.reply.fail(&status);
                        any = true;
                    }
                }
            }
        }
        any
    }

    /// Counts a forwarded call of `len` payload bytes, once it succeeded (so the copy surely
    /// happened) and before the reply releases the client (whose next `stats` must see it).
    fn count_forward(&self, by_value: bool, len: u64) {
        self.forwarded.fetch_add(1, Ordering::Relaxed);
        let counter = if by_value {
            &self.payload_bytes
        } else {
            &self.handle_bytes
        };
        counter.fetch_add(len, Ordering::Relaxed);
    }
}

/// A private copy of `src` in the pool (the `copy` variant's unconditional copy).
fn private_copy(domain: &Domain, src: &SharedBuf) -> Result<SharedBuf, PoolError> {
    if let Some(s) = src.as_slice() {
        return domain.alloc_from(s);
    }
    let mut dst = domain.alloc(src.len())?;
    let mut at = 0;
    for chunk in src.chunks() {
        dst.write(at, chunk)?;
        at += chunk.len();
    }
    Ok(dst)
}

/// Allocates and writes all the free pages of the pool (1 MiB at a time), then frees them:
/// the pool's pages are mapped into this process and exist in the memfd from then on.
fn prefault(domain: &Domain) -> anyhow::Result<()> {
    let zeros = vec![0u8; 1 << 20];
    let mut held = Vec::new();
    loop {
        match domain.alloc(zeros.len()) {
            Ok(mut buf) => {
                buf.write(0, &zeros)?;
                held.push(buf);
            }
            Err(PoolError::Exhausted(_)) => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The `dmrpc-tier` peer role: serves `--service` until stdin closes.
pub(super) fn serve_tier(args: TierArgs) -> anyhow::Result<()> {
    if !args.cpus.is_empty() {
        // Before any thread starts, so every thread of the process inherits it.
        netless_shm::pin_current_thread_to(&args.cpus)?;
    }
    let domain = Domain::join(&domain_config(&args.domain, &args.dir))
        .with_context(|| format!("joining domain `{}`", args.domain))?;
    if args.prefault {
        prefault(&domain)?;
    }
    // The next tier's reply takes at least one more hop: its waiter sleeps at once rather
    // than spin on a core the tiers behind it need. (A pipelined tier's worker waits on its
    // queue and its pipelines together, with the server's policy.)
    let next_config = || client_config(&args.dir, wait_policy(WaitMode::Futex, 0));
    let mut driver = None;
    let nexts = match args.forward {
        Forward::Pipelined => Nexts::Pipelined(
            args.next
                .iter()
                .map(|s| {
                    let config = ClientConfig {
                        max_in_flight: TIER_PIPELINE_DEPTH,
                        ..next_config()
                    };
                    Ok(Mutex::new(Downstream {
                        pipe: Pipeline::connect(s, config)?,
                        waiting: (0..TIER_PIPELINE_DEPTH).map(|_| None).collect(),
                    }))
                })
                .collect::<Result<_, Status>>()?,
        ),
        Forward::Async => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = runtime.handle().clone();
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let thread = std::thread::Builder::new()
                .name("dmrpc-forward".into())
                .spawn(move || {
                    runtime.block_on(async {
                        let _ = stop_rx.await;
                    })
                })?;
            driver = Some((stop_tx, thread));
            Nexts::Async(
                args.next
                    .iter()
                    .map(|s| Client::connect_with(s, next_config()))
                    .collect::<Result<_, _>>()?,
                handle,
            )
        }
        Forward::Blocking => Nexts::Blocking(
            args.next
                .iter()
                .map(|s| Client::connect_with(s, next_config()))
                .collect::<Result<_, _>>()?,
        ),
    };
    let methods = ["value", "ref"].map(|kind| {
        (0..=MAX_HOPS as usize)
            .map(|n| format!("{kind}/{n}"))
            .collect()
    });
    let tier = Arc::new(Tier {
        domain,
        nexts,
        rr: AtomicUsize::new(0),
        requests: AtomicU64::new(0),
        forwarded: AtomicU64::new(0),
        payload_bytes: AtomicU64::new(0),
        handle_bytes: AtomicU64::new(0),
        maps: AtomicU64::new(0),
        scribble: vec![0xee; *COW_SIZES.iter().max().expect("sizes")],
        methods,
    });
    let workers = match args.forward {
        Forward::Blocking => args.workers.max(1),
        _ => 1,
    };
    let config = ServerConfig {
        workers,
        wait: wait_policy(args.wait, args.spin_us),
        block_size: TIER_BLOCK,
        buffer_bytes: Some(TIER_BUFFER),
        dir: Some(args.dir.clone()),
        ..Default::default()
    };
    let server = Server::bind(&args.service, config, TierHandler(tier))?;
    peer::listening(&args.service)?;
    peer::until_stdin_closes();
    drop(server);
    if let Some((stop, thread)) = driver {
        let _ = stop.send(());
        let _ = thread.join();
    }
    Ok(())
}
