//! `netless bench dmrpc`: DmRPC (§VI-B..D, Figures 5–7) on one host, with the domain page
//! pool (`netless-pool`) as the disaggregated memory and netless as the RPC layer.
//!
//! Every tier is its own process (`netless bench-peer dmrpc-tier`), and every process (this
//! one included) joins one domain, named and placed in a socket directory of this run alone.
//! A tier serves one netless service; a call `value/N` or `ref/N` with N > 1 is forwarded to
//! its `--next` service (round robin when there are several) as `value/N-1` / `ref/N-1`,
//! asynchronously: the handler defers its reply, submits the next call with `call_async`
//! and a forwarding thread (a tokio runtime) sends the deferred reply when the next tier
//! answers, so calls in flight pipeline through a tier served by one worker thread. With
//! N = 1 the tier is the last one: it sums the array (little-endian u32 words, as u64) and
//! returns the sum, which the client checks on every call.
//!
//! - **(a) nested chain** (Fig. 5): tiers `tier1` → … → `tier7`; the client calls `tier1`
//!   with N = hops. By value the array is the netless payload and each tier re-sends the
//!   bytes it received; by reference the client wrote the array into a `SharedBuf` once and
//!   sends a fresh 32-byte Ref (`share()`) per call, the tiers forward those 32 bytes, and the
//!   last maps the Ref and sums the pages in place.
//! - **(b) copy-on-write vs copy** (Figs. 7, 8): per operation the client `share()`s a 32 KiB
//!   or 1 MiB buffer and a callee process maps it and writes 0%, 25% or 100% of it (`cow`);
//!   or maps it, copies it into a private buffer first and then writes (`copy`, the
//!   unconditional copy of DmRPC's `-copy` variants). One operation at a time, as in the
//!   paper. The callee times its map, copy and write; the client times `share()`.
//! - **(c) forwarding load balancer** (Fig. 6): the client calls `lb`, which forwards each
//!   request round robin to `w0` and `w1`; the workers sum the payload (or the mapped Ref).
//!
//! Bytes copied are counted, never assumed: every process counts the payload bytes it puts
//! into netless messages (a netless call copies its payload into the callee's shared receive
//! buffer) and the Ref bytes it sends ("handle bytes"), and reports its pool counters
//! (`PoolStats::bytes_copied`, `pages_copied`) through a `stats` call before and after each
//! measured window. The variants of a point alternate in interleaved rounds (by value, by
//! reference, then the other way round) so drifts of the shared host hit both alike; the
//! tables give the median of the rounds' ratios, the JSON also the ratio of the totals.
//! Warm-ups make at least 64 calls, so every tier's receive buffer has been used (and its
//! pages faulted in) before measuring; the cow callee touches every free pool page once at
//! start-up (`--prefault`), so that its copies do not pay first-touch page faults.
//!
//! The machine has two cores and up to nine processes: the servers' workers and this
//! process's calls spin for `--spin-us` (5 µs) and then sleep on their futex; a tier's calls
//! to the next tier sleep at once. This process is pinned to the first allowed CPU; by
//! default (`--pin reader`) the tier that reads the array (for each hop count, the chain's
//! last) runs alone on the second and the forwarding tiers share the first, which is as
//! close as two CPUs come to the paper's machine per tier (`--pin client`, `alternate` and
//! `none` place them otherwise).
//! `--forward blocking` makes each tier forward with blocking calls from as many worker
//! threads as there are calls in flight instead.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use hdrhistogram::Histogram;
use netless::{
    CallOptions, Client, ClientConfig, Code, DeferredReply, Handler, Pipeline, Request,
    ResponseBuilder, Server, ServerConfig, Status, WaitMode, WaitPolicy,
};
use netless_pool::{Domain, DomainConfig, PoolError, Ref, SharedBuf};
use serde::Serialize;

use super::peer::{cpu_time, Peer, Stop};
use super::{report, transfer, CommonArgs, RunDir};

/// Array sizes of the nested chain.
const CHAIN_SIZES: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];
/// Longest chain (tiers spawned).
const MAX_HOPS: u32 = 7;
/// Buffer sizes of the copy-on-write experiment.
const COW_SIZES: [usize; 2] = [32 << 10, 1 << 20];
/// Parts of the buffer the callee writes, in thousandths.
const WRITE_PERMILLE: [usize; 3] = [0, 250, 1000];
/// Payload sizes of the load balancer.
const LB_SIZES: [usize; 4] = [4 << 10, 8 << 10, 16 << 10, 32 << 10];
/// Receive-buffer blocks of the tiers: 32 KiB, so a 1 MiB request goes in one run of blocks
/// (no fragments: fragmented requests would make `call_async` send on a helper thread).
const TIER_BLOCK: u32 = 32 << 10;
/// Receive buffer of each tier: room for many 1 MiB requests in flight.
const TIER_BUFFER: usize = 64 << 20;
/// Calls a warm-up makes at least (so that every tier's receive buffer has been used, and
/// its pages faulted in, before anything is measured), unless it takes over a second
/// (`--quick`: 8 calls or 100 ms).
const WARMUP_CALLS: u64 = 64;
/// The domain's name (unique per run because its socket directory is).
const DOMAIN: &str = "dmrpc";

#[derive(clap::Args, Debug)]
#[command(
    mut_arg("json", |a| a.help(
        "Write the rows (and the acceptance figures) as JSON to this file"
    )),
    mut_arg("plot", |a| a.help(
        "Draw the nested-chain curves (throughput against hops, by value and by reference, \
         per array size) to this SVG file"
    )),
    mut_arg("quick", |a| a.help(
        "A few seconds instead of about a minute: short windows, one round (for tests)"
    )),
)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Calls kept in flight by the closed-loop client (nested chain and load balancer); fewer
    /// for large arrays: as many as fit a tier's 64 MiB receive buffer by value.
    #[arg(long, default_value_t = 1024)]
    pub in_flight: usize,
    /// Measured time per variant, point and round, in ms [default: 150, or 20 with --quick].
    #[arg(long)]
    pub window_ms: Option<u64>,
    /// Interleaved rounds per point [default: 6, or 1 with --quick].
    #[arg(long)]
    pub rounds: Option<u32>,
    /// How long every waiter polls before it sleeps on its futex, in µs (0: sleep at once).
    #[arg(long, default_value_t = 5)]
    pub spin_us: u64,
    /// How waiters poll before they sleep: `adaptive` (spinning) or `yield` (giving the CPU
    /// to other runnable processes between polls).
    #[arg(long, default_value = "adaptive")]
    pub wait: WaitMode,
    /// Where the processes run: `reader` (the tier that reads the array on the second CPU,
    /// this process and the forwarding tiers on the first), `client` (this process on the
    /// first CPU, the tiers on the first two wherever the kernel balances them), `alternate`
    /// (this process on the first CPU, each tier pinned, alternating between the first two)
    /// or `none`.
    #[arg(long, default_value = "reader")]
    pub pin: Placement,
    /// How a tier forwards: `pipelined` (one worker thread: deferred reply, the next call
    /// submitted on a `Pipeline`, its reply collected by the worker), `async` (deferred reply +
    /// `call_async`, replies sent from a tokio thread) or `blocking` (as many worker threads as
    /// calls in flight, each forwarding with `call`).
    #[arg(long, default_value = "pipelined")]
    pub forward: Forward,
    /// Run only these experiments (repeat or separate with commas) [default: all three].
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<Experiment>,
    /// Largest request batch a tier's callers publish at once (its `batch` soft register).
    #[arg(long, default_value_t = 256)]
    pub batch: u32,
    /// Nested chain: only these array sizes, in bytes [default: 4 KiB, 64 KiB, 1 MiB].
    #[arg(long, value_delimiter = ',')]
    pub chain_sizes: Vec<usize>,
    /// Nested chain: only these hop counts, 1 to 7 [default: all].
    #[arg(long, value_delimiter = ',')]
    pub hops: Vec<u32>,
}

/// The three experiments.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Experiment {
    /// (a) the nested chain.
    Chain,
    /// (b) copy-on-write vs copy.
    Cow,
    /// (c) the forwarding load balancer.
    Lb,
    /// (d) the by-value / by-reference crossover of automatic transfer.
    Transfer,
}

/// Where the benchmark's processes run.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// This process (the load generator) on the first CPU; the tiers may use the first two,
    /// and the kernel balances them.
    Client,
    /// This process on the first CPU; each tier pinned to one of the first two, alternating.
    Alternate,
    /// The tiers that read the array (the chain's last tier for each hop count, the
    /// copy-on-write callee, the load balancer's workers) pinned to the second CPU; this
    /// process and the forwarding tiers share the first. In the paper every tier has a
    /// machine of its own, so throughput is that of the slowest tier; on two CPUs this is
    /// the placement that comes closest: the reader, the slowest tier by reference, gets a
    /// core, and the forwarders share what the load generator leaves.
    Reader,
    /// Nothing pinned.
    None,
}

/// How the tiers forward calls.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Forward {
    /// One worker thread runs everything: the handler defers its reply and submits the next
    /// call to a `Pipeline`; the worker collects the replies (`Handler::poll`), sleeping on
    /// its queue and the pipeline at once.
    Pipelined,
    /// The handler defers and forwards with `call_async`; a tokio thread sends the reply.
    Async,
    /// As many worker threads as calls in flight, each forwarding with a blocking call.
    Blocking,
}

/// `bench-peer dmrpc-tier`: one tier of the DmRPC benchmark.
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
    /// How the server's workers poll before they sleep (see `bench dmrpc --wait`).
    #[arg(long, default_value = "adaptive")]
    pub wait: WaitMode,
    /// Run the whole process on these CPUs only (one to pin it).
    #[arg(long, value_delimiter = ',')]
    pub cpus: Vec<usize>,
    /// How this tier forwards (see `bench dmrpc --forward`).
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

// ----------------------------------------------------------------------------------------
// Shared by the tiers and the client.

/// `mode` for `spin_us` µs, or a plain futex sleep if either says so.
fn wait_policy(mode: WaitMode, spin_us: u64) -> WaitPolicy {
    if spin_us == 0 || mode == WaitMode::Futex {
        WaitPolicy {
            mode: WaitMode::Futex,
            spin: Duration::ZERO,
        }
    } else {
        WaitPolicy {
            mode,
            spin: Duration::from_micros(spin_us),
        }
    }
}

fn client_config(dir: &Path, wait: WaitPolicy) -> ClientConfig {
    ClientConfig {
        wait,
        dir: Some(dir.to_path_buf()),
        default_timeout: Some(Duration::from_secs(60)),
        ..Default::default()
    }
}

fn domain_config(name: &str, dir: &Path) -> DomainConfig {
    let mut config = DomainConfig::new(name);
    config.dir = Some(dir.to_path_buf());
    config
}

/// `len` bytes of little-endian u32 words that do not sum to anything obvious.
fn pattern(len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut i: u32 = 0;
    while v.len() + 4 <= len {
        v.extend_from_slice(&(i.wrapping_mul(2_654_435_761) ^ 0x5a5a_5a5a).to_le_bytes());
        i += 1;
    }
    v.resize(len, 0x5a);
    v
}

/// The sum of the little-endian u32 words of `bytes` (a trailing partial word is ignored).
fn sum_words(bytes: &[u8]) -> u64 {
    bytes
        .chunks_exact(4)
        .map(|w| u64::from(u32::from_le_bytes([w[0], w[1], w[2], w[3]])))
        .sum()
}

/// [`sum_words`] of a pool buffer, read in place (pages are multiples of 4 bytes).
fn sum_buf(buf: &SharedBuf) -> u64 {
    match buf.as_slice() {
        Some(s) => sum_words(s),
        None => buf.chunks().map(sum_words).sum(),
    }
}

/// The first and the last 8 bytes of a pool buffer (of at least 8 bytes), read in place.
fn head_tail(buf: &SharedBuf) -> (u64, u64) {
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    if let Some(s) = buf.as_slice() {
        return (word(&s[..8]), word(&s[s.len() - 8..]));
    }
    let first = buf.chunks().next().expect("a page");
    let last = buf.chunks().last().expect("a page");
    (word(&first[..8]), word(&last[last.len() - 8..]))
}

fn u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        .collect()
}

fn to_bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn pool_status(e: PoolError) -> Status {
    match e {
        PoolError::Exhausted(_) => Status::resource_exhausted(format!("pool: {e}")),
        e => Status::internal(format!("pool: {e}")),
    }
}

/// What one process counted (a `stats` reply, or this process's own figures).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    /// Work calls it handled (not `stats`).
    requests: u64,
    /// Calls it forwarded to a next tier.
    forwarded: u64,
    /// Payload bytes it copied into netless messages it sent (by value).
    payload_bytes: u64,
    /// Ref bytes it sent (by reference).
    handle_bytes: u64,
    /// Refs it mapped.
    maps: u64,
    /// `PoolStats::bytes_copied` of the process.
    pool_bytes: u64,
    /// `PoolStats::pages_copied` of the process.
    pool_pages: u64,
}

impl Counts {
    fn fields(&self) -> [u64; 7] {
        [
            self.requests,
            self.forwarded,
            self.payload_bytes,
            self.handle_bytes,
            self.maps,
            self.pool_bytes,
            self.pool_pages,
        ]
    }

    fn from_fields(f: &[u64]) -> Option<Counts> {
        let &[requests, forwarded, payload_bytes, handle_bytes, maps, pool_bytes, pool_pages] = f
        else {
            return None;
        };
        Some(Counts {
            requests,
            forwarded,
            payload_bytes,
            handle_bytes,
            maps,
            pool_bytes,
            pool_pages,
        })
    }

    fn zip(self, other: Counts, f: impl Fn(u64, u64) -> u64) -> Counts {
        let (a, b) = (self.fields(), other.fields());
        let v: Vec<u64> = a.iter().zip(&b).map(|(&x, &y)| f(x, y)).collect();
        Counts::from_fields(&v).expect("7 fields")
    }
}

// ----------------------------------------------------------------------------------------
// A tier process.

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

/// `bench-peer dmrpc-tier`: serves `--service` until stdin closes.
pub fn serve_tier(args: TierArgs) -> anyhow::Result<()> {
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
    println!("LISTENING {}", args.service);
    std::io::stdout().flush()?;
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    drop(server);
    if let Some((stop, thread)) = driver {
        let _ = stop.send(());
        let _ = thread.join();
    }
    Ok(())
}

// ----------------------------------------------------------------------------------------
// The client: measurement.

/// One result row (JSON and tables). Fields that do not apply to an experiment are `null`.
#[derive(Clone, Debug, Serialize)]
struct Row {
    /// `nested_chain`, `cow` or `load_balancer`.
    experiment: &'static str,
    /// `by_value` / `by_ref` (chain, load balancer) or `cow` / `copy`.
    variant: &'static str,
    /// Array, buffer or payload size.
    size_bytes: usize,
    /// RPC calls in the chain (tiers); 2 for the load balancer (client → lb → worker).
    hops: Option<u32>,
    /// Part of the buffer the callee wrote (cow experiment).
    write_fraction: Option<f64>,
    /// Calls (operations) kept in flight.
    in_flight: usize,
    /// Calls (operations) measured, each verified.
    calls: u64,
    /// Calls per second.
    throughput_per_s: f64,
    /// Mean latency of a call as the client saw it, µs.
    avg_latency_us: f64,
    p50_us: f64,
    p99_us: f64,
    /// Bytes copied per call by all processes involved: payload bytes put into netless
    /// messages plus pool copies.
    bytes_copied_per_call: f64,
    /// Payload bytes copied into netless messages (by-value sends), all processes.
    payload_bytes_copied_per_call: f64,
    /// `PoolStats::bytes_copied`, all processes.
    pool_bytes_copied_per_call: f64,
    /// `PoolStats::pages_copied`, all processes.
    pages_copied_per_call: f64,
    /// Ref bytes sent, all processes.
    handle_bytes_per_call: f64,
    /// Refs mapped, all processes (1 per call by reference: the last tier's).
    maps_per_call: f64,
    /// Load balancer: bytes the forwarder copied (payload + pool).
    forwarder_bytes_copied_per_call: Option<f64>,
    forwarder_payload_bytes_copied_per_call: Option<f64>,
    forwarder_pool_bytes_copied_per_call: Option<f64>,
    forwarder_handle_bytes_per_call: Option<f64>,
    /// Load balancer: CPU time the forwarder process used per request, µs (from
    /// `/proc/PID/stat`, in clock ticks, over all the windows of the row).
    forwarder_cpu_us_per_call: Option<f64>,
    /// Cow experiment: `create_ref` as DmRPC times it, µs: `share()` in the client plus the
    /// callee's `map`, plus (copy variant) the callee's private copy.
    create_ref_us: Option<f64>,
    share_us: Option<f64>,
    map_us: Option<f64>,
    /// The callee's copy of the whole buffer (copy variant; 0 for cow).
    copy_us: Option<f64>,
    write_us: Option<f64>,
    /// The callee's release of the buffer it wrote (its mapping, or its private copy).
    unmap_us: Option<f64>,
    /// Throughput over the same point's baseline row (`by_ref` / `by_value`, `cow` / `copy`),
    /// from the totals; 1 on baseline rows.
    ratio_vs_baseline: Option<f64>,
    /// The same ratio, as the median over the interleaved rounds of the ratio within each
    /// round (robust against a busy host during part of the run).
    ratio_median_of_rounds: Option<f64>,
    /// Throughput of each interleaved round, calls/s.
    round_throughputs_per_s: Vec<f64>,
    /// Every reply was checked (sums; for cow, the callee's view and the client's buffer
    /// afterwards).
    verified: bool,
    /// Calls retried after RESOURCE_EXHAUSTED (a full receive buffer somewhere).
    retries: u64,
}

/// Figures gathered over the windows of one (point, variant).
struct Acc {
    calls: u64,
    elapsed: Duration,
    hist: Histogram<u64>,
    retries: u64,
    /// Deltas per process: index 0 is this process, then the peers involved.
    procs: Vec<Counts>,
    share_ns: u64,
    map_ns: u64,
    copy_ns: u64,
    write_ns: u64,
    unmap_ns: u64,
    /// Throughput of each round.
    rounds: Vec<f64>,
    /// CPU time of the watched process (the forwarder) over the windows.
    cpu: Duration,
}

impl Acc {
    fn new() -> Acc {
        Acc {
            calls: 0,
            elapsed: Duration::ZERO,
            hist: report::new_histogram(),
            retries: 0,
            procs: Vec::new(),
            share_ns: 0,
            map_ns: 0,
            copy_ns: 0,
            write_ns: 0,
            unmap_ns: 0,
            rounds: Vec::new(),
            cpu: Duration::ZERO,
        }
    }

    fn add(&mut self, w: &Window, deltas: &[Counts]) {
        self.rounds
            .push(w.calls as f64 / w.elapsed.as_secs_f64().max(1e-9));
        self.calls += w.calls;
        self.elapsed += w.elapsed;
        self.hist.add(&w.hist).ok();
        self.retries += w.retries;
        self.share_ns += w.share_ns;
        self.map_ns += w.map_ns;
        self.copy_ns += w.copy_ns;
        self.write_ns += w.write_ns;
        self.unmap_ns += w.unmap_ns;
        if self.procs.is_empty() {
            self.procs = vec![Counts::default(); deltas.len()];
        }
        for (p, d) in self.procs.iter_mut().zip(deltas) {
            *p = p.zip(*d, u64::wrapping_add);
        }
    }

    fn row(
        &self,
        experiment: &'static str,
        variant: &'static str,
        size_bytes: usize,
        in_flight: usize,
    ) -> Row {
        let n = self.calls.max(1) as f64;
        let total = self
            .procs
            .iter()
            .fold(Counts::default(), |a, b| a.zip(*b, u64::wrapping_add));
        let per = |x: u64| x as f64 / n;
        let q = |p: f64| self.hist.value_at_quantile(p) as f64 / 1000.0;
        Row {
            experiment,
            variant,
            size_bytes,
            hops: None,
            write_fraction: None,
            in_flight,
            calls: self.calls,
            throughput_per_s: self.calls as f64 / self.elapsed.as_secs_f64().max(1e-9),
            avg_latency_us: self.hist.mean() / 1000.0,
            p50_us: q(0.5),
            p99_us: q(0.99),
            bytes_copied_per_call: per(total.payload_bytes + total.pool_bytes),
            payload_bytes_copied_per_call: per(total.payload_bytes),
            pool_bytes_copied_per_call: per(total.pool_bytes),
            pages_copied_per_call: per(total.pool_pages),
            handle_bytes_per_call: per(total.handle_bytes),
            maps_per_call: per(total.maps),
            forwarder_bytes_copied_per_call: None,
            forwarder_payload_bytes_copied_per_call: None,
            forwarder_pool_bytes_copied_per_call: None,
            forwarder_handle_bytes_per_call: None,
            forwarder_cpu_us_per_call: None,
            create_ref_us: None,
            share_us: None,
            map_us: None,
            copy_us: None,
            write_us: None,
            unmap_us: None,
            ratio_vs_baseline: None,
            ratio_median_of_rounds: None,
            round_throughputs_per_s: self.rounds.clone(),
            verified: self.calls > 0,
            retries: self.retries,
        }
    }
}

/// What one measured window gave.
struct Window {
    calls: u64,
    elapsed: Duration,
    hist: Histogram<u64>,
    retries: u64,
    /// This process's payload and Ref bytes sent.
    payload_bytes: u64,
    handle_bytes: u64,
    share_ns: u64,
    map_ns: u64,
    copy_ns: u64,
    write_ns: u64,
    unmap_ns: u64,
}

impl Window {
    fn new() -> Window {
        Window {
            calls: 0,
            elapsed: Duration::ZERO,
            hist: report::new_histogram(),
            retries: 0,
            payload_bytes: 0,
            handle_bytes: 0,
            share_ns: 0,
            map_ns: 0,
            copy_ns: 0,
            write_ns: 0,
            unmap_ns: 0,
        }
    }
}

/// What the client sends: the array itself, or a fresh Ref to its copy in the pool.
#[derive(Clone)]
enum Payload {
    Value(Arc<Vec<u8>>),
    Ref(Arc<SharedBuf>),
}

impl Payload {
    /// The array's size.
    fn len(&self) -> usize {
        match self {
            Payload::Value(data) => data.len(),
            Payload::Ref(buf) => buf.len(),
        }
    }
}

/// Keeps `in_flight` calls of `method` outstanding on `pipe` for `window`, checking every
/// reply against `expect`; calls refused with RESOURCE_EXHAUSTED (a full receive buffer
/// somewhere) are counted as retries and made again once replies come.
fn closed_loop(
    pipe: &mut Pipeline,
    method: &str,
    payload: &Payload,
    expect: u64,
    in_flight: usize,
    window: Duration,
    domain: &Domain,
) -> anyhow::Result<Window> {
    let started = Instant::now();
    let deadline = started + window;
    let mut w = Window::new();
    // By call slot: when it was sent, and its Ref (revoked if the call fails).
    let mut sent: Vec<Option<(Instant, Option<Ref>)>> = Vec::new();
    let mut outstanding = 0usize;
    let mut failure: Option<String> = None;
    loop {
        let now = Instant::now();
        while outstanding < in_flight && now < deadline {
            let (bytes, r) = match payload {
                Payload::Value(_) => (None, None),
                Payload::Ref(buf) => {
                    let r = buf.share()?;
                    (Some(r.to_bytes()), Some(r))
                }
            };
            let body: &[u8] = match (payload, &bytes) {
                (Payload::Value(data), _) => data,
                (_, Some(b)) => b,
                _ => unreachable!("a Ref payload has its bytes"),
            };
            match pipe.submit(method, body) {
                Ok(id) => {
                    let slot = Pipeline::slot(id);
                    if sent.len() <= slot {
                        sent.resize_with(slot + 1, || None);
                    }
                    sent[slot] = Some((Instant::now(), r));
                    outstanding += 1;
                    match payload {
                        Payload::Value(data) => w.payload_bytes += data.len() as u64,
                        Payload::Ref(_) => w.handle_bytes += Ref::LEN as u64,
                    }
                }
                Err(status) if status.code() == Code::ResourceExhausted && outstanding > 0 => {
                    if let Some(r) = r {
                        let _ = domain.revoke(&r);
                    }
                    w.retries += 1;
                    break;
                }
                Err(status) => bail!("`{method}` failed: {status}"),
            }
        }
        if outstanding == 0 {
            break;
        }
        pipe.wait(Some(Duration::from_secs(10)))
            .with_context(|| format!("waiting for `{method}`"))?;
        pipe.poll(|id, reply| {
            let Some((t, r)) = sent.get_mut(Pipeline::slot(id)).and_then(Option::take) else {
                return;
            };
            outstanding -= 1;
            match reply {
                Ok(bytes) if u64s(bytes).as_slice() == [expect] => {
                    w.hist.saturating_record(t.elapsed().as_nanos() as u64);
                    w.calls += 1;
                }
                Ok(bytes) => {
                    failure.get_or_insert(format!(
                        "`{method}` returned {:?}, expected the sum {expect}",
                        u64s(bytes)
                    ));
                }
                Err(status) if status.code() == Code::ResourceExhausted => {
                    if let Some(r) = r {
                        let _ = domain.revoke(&r);
                    }
                    w.retries += 1;
                }
                Err(status) => {
                    failure.get_or_insert(format!("`{method}` failed: {status}"));
                }
            }
        })?;
        if let Some(failure) = failure.take() {
            bail!(failure);
        }
    }
    w.elapsed = started.elapsed();
    Ok(w)
}

/// One operation at a time for `window`: `share()` the buffer, the callee maps it and writes
/// (method `cow/‰` or `copy/‰`); checks what the callee saw.
fn sequential_ops(
    client: &Client,
    method: &str,
    buf: &SharedBuf,
    data: &[u8],
    window: Duration,
) -> anyhow::Result<Window> {
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let (head, tail) = (word(&data[..8]), word(&data[data.len() - 8..]));
    let options = CallOptions::new();
    let mut w = Window::new();
    let mut out = Vec::new();
    let started = Instant::now();
    while started.elapsed() < window {
        let t = Instant::now();
        let r = buf.share()?;
        let share_ns = t.elapsed().as_nanos() as u64;
        client
            .call_into(method, &r.to_bytes(), &options, &mut out)
            .with_context(|| format!("`{method}`"))?;
        w.hist.saturating_record(t.elapsed().as_nanos() as u64);
        let &[map_ns, copy_ns, write_ns, unmap_ns, h, tl] = u64s(&out).as_slice() else {
            bail!("`{method}` returned {} bytes", out.len());
        };
        if (h, tl) != (head, tail) {
            bail!("`{method}`: the callee saw {h:#x}..{tl:#x}, not the client's data");
        }
        w.calls += 1;
        w.handle_bytes += Ref::LEN as u64;
        w.share_ns += share_ns;
        w.map_ns += map_ns;
        w.copy_ns += copy_ns;
        w.write_ns += write_ns;
        w.unmap_ns += unmap_ns;
    }
    w.elapsed = started.elapsed();
    Ok(w)
}

/// This process's counters (pool only; its sends are counted per window) and each peer's.
fn snapshot(domain: &Domain, peers: &[&Client]) -> anyhow::Result<Vec<Counts>> {
    let pool = domain.stats();
    let mut all = vec![Counts {
        pool_bytes: pool.bytes_copied,
        pool_pages: pool.pages_copied,
        ..Default::default()
    }];
    for peer in peers {
        let reply = peer
            .call("stats", b"", &CallOptions::new())
            .with_context(|| format!("stats of `{}`", peer.service()))?;
        all.push(
            Counts::from_fields(&u64s(&reply.payload))
                .with_context(|| format!("`{}` sent malformed stats", peer.service()))?,
        );
    }
    Ok(all)
}

/// Per-process deltas, with this process's sends of the window added to its entry.
fn deltas(before: &[Counts], after: &[Counts], w: &Window) -> Vec<Counts> {
    let mut d: Vec<Counts> = after
        .iter()
        .zip(before)
        .map(|(a, b)| a.zip(*b, u64::wrapping_sub))
        .collect();
    d[0].payload_bytes += w.payload_bytes;
    d[0].handle_bytes += w.handle_bytes;
    d
}

/// The order of the two variants in round `round`: alternating which goes first.
fn order(round: u32, n: usize) -> Vec<usize> {
    if round.is_multiple_of(2) {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    }
}

/// What every experiment needs.
struct Ctx {
    exe: PathBuf,
    dir: PathBuf,
    domain: Domain,
    spin_us: u64,
    wait: WaitMode,
    /// (this process's CPU, the other one), unless not pinning.
    cpus: Option<(usize, usize)>,
    placement: Placement,
    forward: Forward,
    in_flight: usize,
    batch: u32,
    chain_sizes: Vec<usize>,
    hops: Vec<u32>,
    window: Duration,
    warmup: Duration,
    /// Calls a warm-up makes at least, unless it takes longer than `warmup_cap`.
    warmup_calls: u64,
    warmup_cap: Duration,
    rounds: u32,
    bar: indicatif::ProgressBar,
}

impl Ctx {
    /// Spawns a tier serving `service`, forwarding to `next`, on this process's CPU
    /// (`same_cpu`) or the other one.
    fn spawn_tier(
        &self,
        service: &str,
        next: &[&str],
        same_cpu: bool,
        prefault: bool,
    ) -> anyhow::Result<Peer> {
        let dir = self.dir.to_str().context("socket directory is not UTF-8")?;
        let spin = self.spin_us.to_string();
        let wait = self.wait.to_string();
        let workers = self.in_flight.to_string();
        let forward = match self.forward {
            Forward::Pipelined => "pipelined",
            Forward::Async => "async",
            Forward::Blocking => "blocking",
        };
        let mut args = vec![
            "bench-peer",
            "dmrpc-tier",
            "--service",
            service,
            "--dir",
            dir,
            "--domain",
            DOMAIN,
            "--spin-us",
            &spin,
            "--wait",
            &wait,
            "--forward",
            forward,
            "--workers",
            &workers,
        ];
        for n in next {
            args.extend(["--next", n]);
        }
        let cpus = self.cpus.map(|(mine, other)| match self.placement {
            Placement::Alternate if same_cpu => mine.to_string(),
            Placement::Alternate => other.to_string(),
            // Placed by `place` before each measurement.
            Placement::Reader => mine.to_string(),
            _ => format!("{mine},{other}"),
        });
        if let Some(cpus) = &cpus {
            args.extend(["--cpus", cpus]);
        }
        if prefault {
            args.push("--prefault");
        }
        let (peer, _) = Peer::spawn(&self.exe, &args, Stop::CloseStdin)?;
        Ok(peer)
    }

    fn wait(&self) -> WaitPolicy {
        wait_policy(self.wait, self.spin_us)
    }

    /// With `Placement::Reader`, pins every thread of the `readers` processes to the second
    /// CPU and of the `forwarders` to the first (this process's); otherwise does nothing.
    fn place(&self, readers: &[u32], forwarders: &[u32]) -> anyhow::Result<()> {
        let (Placement::Reader, Some((mine, other))) = (self.placement, self.cpus) else {
            return Ok(());
        };
        for (pids, cpu) in [(readers, other), (forwarders, mine)] {
            for &pid in pids {
                super::peer::pin_process(pid, cpu)
                    .with_context(|| format!("pinning process {pid} to CPU {cpu}"))?;
            }
        }
        Ok(())
    }

    /// Calls kept in flight with arrays of `size` bytes: `--in-flight`, or as many as fit a
    /// tier's receive buffer by value (so that large arrays are not mostly NACKed).
    fn in_flight_for(&self, size: usize) -> usize {
        self.in_flight.min((TIER_BUFFER / size.max(1)).max(8))
    }

    /// Connects to a tier and sets its `batch` register.
    fn connect(&self, service: &str) -> anyhow::Result<Client> {
        let client = Client::connect_with(service, client_config(&self.dir, self.wait()))
            .with_context(|| format!("connecting to `{service}`"))?;
        let set = format!("batch={}", self.batch);
        client
            .call(netless::control::SET, set.as_bytes(), &CallOptions::new())
            .with_context(|| format!("`netless ctl {service} set {set}`"))?;
        Ok(client)
    }

    /// A pipeline to `service` deep enough for the calls kept in flight.
    fn pipeline(&self, service: &str) -> anyhow::Result<Pipeline> {
        let config = ClientConfig {
            max_in_flight: (self.in_flight as u32).max(1),
            ..client_config(&self.dir, self.wait())
        };
        Pipeline::connect(service, config).with_context(|| format!("connecting to `{service}`"))
    }

    /// Measures the two variants of one point of a closed-loop experiment, interleaved;
    /// `watch` is a process whose CPU time to measure too.
    #[allow(clippy::too_many_arguments)]
    fn closed_loop_point(
        &self,
        pipe: &mut Pipeline,
        peers: &[&Client],
        variants: [(&str, &Payload); 2],
        expect: u64,
        watch: Option<u32>,
        (readers, forwarders): (&[u32], &[u32]),
    ) -> anyhow::Result<[Acc; 2]> {
        let [a, b] = variants.map(|(method, payload)| Variant {
            method,
            payload,
            expect,
            peers: peers.to_vec(),
            in_flight: self.in_flight_for(payload.len()),
            readers: readers.to_vec(),
            forwarders: forwarders.to_vec(),
        });
        let mut acc = self.interleaved(pipe, &[a, b], watch)?.into_iter();
        Ok([
            acc.next().expect("two variants"),
            acc.next().expect("two variants"),
        ])
    }

    /// Measures `variants` in interleaved rounds (each round in the opposite order of the
    /// last), after warming each up, so that a drift of the shared host hits them alike and
    /// round-by-round ratios compare like with like.
    fn interleaved(
        &self,
        pipe: &mut Pipeline,
        variants: &[Variant<'_>],
        watch: Option<u32>,
    ) -> anyhow::Result<Vec<Acc>> {
        for v in variants {
            self.place(&v.readers, &v.forwarders)?;
            let started = Instant::now();
            let mut calls = 0;
            while calls < self.warmup_calls && started.elapsed() < self.warmup_cap {
                calls += closed_loop(
                    pipe,
                    v.method,
                    v.payload,
                    v.expect,
                    v.in_flight,
                    self.warmup,
                    &self.domain,
                )?
                .calls;
            }
            self.bar.inc(1);
        }
        let mut acc: Vec<Acc> = variants.iter().map(|_| Acc::new()).collect();
        for round in 0..self.rounds {
            for k in order(round, variants.len()) {
                let v = &variants[k];
                self.place(&v.readers, &v.forwarders)?;
                let before = snapshot(&self.domain, &v.peers)?;
                let cpu_before = watch.map(cpu_time);
                let w = closed_loop(
                    pipe,
                    v.method,
                    v.payload,
                    v.expect,
                    v.in_flight,
                    self.window,
                    &self.domain,
                )?;
                if let (Some(pid), Some(before)) = (watch, cpu_before) {
                    acc[k].cpu += cpu_time(pid).saturating_sub(before);
                }
                let after = snapshot(&self.domain, &v.peers)?;
                acc[k].add(&w, &deltas(&before, &after, &w));
                self.bar.inc(1);
            }
        }
        Ok(acc)
    }
}

/// One variant of an interleaved measurement: the call, what it should return, and the
/// processes whose counters it involves.
struct Variant<'a> {
    method: &'a str,
    payload: &'a Payload,
    expect: u64,
    peers: Vec<&'a Client>,
    in_flight: usize,
    /// With `Placement::Reader`: the processes that read the array, and the rest.
    readers: Vec<u32>,
    forwarders: Vec<u32>,
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

/// The two rows of an interleaved comparison, each with its throughput ratio over
/// `variants[base]` (from the totals and as the median of the rounds' ratios).
fn compared(
    acc: &[Acc; 2],
    experiment: &'static str,
    variants: [&'static str; 2],
    size: usize,
    in_flight: usize,
    base: usize,
) -> [Row; 2] {
    let mut pair = [0, 1].map(|k| acc[k].row(experiment, variants[k], size, in_flight));
    let base_throughput = pair[base].throughput_per_s;
    for (row, a) in pair.iter_mut().zip(acc) {
        row.ratio_vs_baseline = ratio(row.throughput_per_s, base_throughput);
        row.ratio_median_of_rounds = median_ratio(a, &acc[base]);
    }
    pair
}

/// The median of the round-by-round ratios of `acc` over `base`.
fn median_ratio(acc: &Acc, base: &Acc) -> Option<f64> {
    median_of_ratios(&acc.rounds, &base.rounds)
}

/// The median of `a[i] / b[i]` over the rounds both have.
fn median_of_ratios(a: &[f64], b: &[f64]) -> Option<f64> {
    let mut r: Vec<f64> = a.iter().zip(b).filter_map(|(&a, &b)| ratio(a, b)).collect();
    if r.is_empty() {
        return None;
    }
    r.sort_by(f64::total_cmp);
    let n = r.len();
    Some(if n % 2 == 1 {
        r[n / 2]
    } else {
        (r[n / 2 - 1] + r[n / 2]) / 2.0
    })
}

/// (a) The nested chain.
fn nested_chain(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    let names: Vec<String> = (1..=MAX_HOPS).map(|i| format!("tier{i}")).collect();
    // The last first, so that each tier finds its next one serving.
    let mut peers = Vec::new();
    for i in (0..names.len()).rev() {
        let next: Vec<&str> = names.get(i + 1).map(|s| s.as_str()).into_iter().collect();
        // tier1 on the other CPU than the client, tier2 on the client's, and so on.
        peers.push(ctx.spawn_tier(&names[i], &next, i % 2 == 1, false)?);
    }
    // Process ids in tier order (they were spawned last first).
    let pids: Vec<u32> = peers.iter().rev().map(Peer::id).collect();
    let tiers: Vec<Client> = names
        .iter()
        .map(|n| ctx.connect(n))
        .collect::<anyhow::Result<_>>()?;
    let mut pipe = ctx.pipeline(&names[0])?;
    let mut rows = Vec::new();
    for &size in &ctx.chain_sizes {
        let data = Arc::new(pattern(size));
        let expect = sum_words(&data);
        let value = Payload::Value(data.clone());
        // Written into the pool once; every call shares it afresh.
        let pooled = Payload::Ref(Arc::new(ctx.domain.alloc_from(&data)?));
        // Every hop count and both variants in each round: the 7-hop / 1-hop ratios compare
        // windows measured side by side, as the by-ref / by-value ratios do.
        let methods: Vec<[String; 2]> = ctx
            .hops
            .iter()
            .map(|h| [format!("value/{h}"), format!("ref/{h}")])
            .collect();
        let mut variants = Vec::new();
        for (&hops, [mv, mr]) in ctx.hops.iter().zip(&methods) {
            let involved: Vec<&Client> = tiers[..hops as usize].iter().collect();
            // The last tier of the chain reads the array; the others only forward.
            let reader = pids[hops as usize - 1];
            let forwarders: Vec<u32> = pids.iter().copied().filter(|&p| p != reader).collect();
            for (method, payload) in [(mv, &value), (mr, &pooled)] {
                variants.push(Variant {
                    method,
                    payload,
                    expect,
                    peers: involved.clone(),
                    in_flight: ctx.in_flight_for(size),
                    readers: vec![reader],
                    forwarders: forwarders.clone(),
                });
            }
        }
        let mut accs = ctx.interleaved(&mut pipe, &variants, None)?.into_iter();
        for &hops in &ctx.hops {
            let (Some(v), Some(r)) = (accs.next(), accs.next()) else {
                break;
            };
            let mut pair = compared(
                &[v, r],
                "nested_chain",
                ["by_value", "by_ref"],
                size,
                ctx.in_flight_for(size),
                0,
            );
            for row in &mut pair {
                row.hops = Some(hops);
            }
            rows.extend(pair);
        }
    }
    drop(tiers);
    drop(peers);
    Ok(rows)
}

/// (b) Copy-on-write against an unconditional copy.
fn copy_on_write(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    let callee = ctx.spawn_tier("callee", &[], false, true)?;
    ctx.place(&[callee.id()], &[])?;
    let client = ctx.connect("callee")?;
    let mut rows = Vec::new();
    for &size in &COW_SIZES {
        let data = pattern(size);
        let expect = sum_words(&data);
        let buf = ctx.domain.alloc_from(&data)?;
        for &permille in &WRITE_PERMILLE {
            let methods = [format!("cow/{permille}"), format!("copy/{permille}")];
            for m in &methods {
                let started = Instant::now();
                let mut calls = 0;
                while calls < ctx.warmup_calls && started.elapsed() < ctx.warmup_cap {
                    calls += sequential_ops(&client, m, &buf, &data, ctx.warmup)?.calls;
                }
                ctx.bar.inc(1);
            }
            let mut acc = [Acc::new(), Acc::new()];
            for round in 0..ctx.rounds {
                for k in order(round, 2) {
                    let before = snapshot(&ctx.domain, &[&client])?;
                    let w = sequential_ops(&client, &methods[k], &buf, &data, ctx.window)?;
                    let after = snapshot(&ctx.domain, &[&client])?;
                    acc[k].add(&w, &deltas(&before, &after, &w));
                    ctx.bar.inc(1);
                }
            }
            // Whatever the callee wrote, the client's buffer must not have changed.
            let intact = sum_buf(&buf) == expect;
            if !intact {
                bail!("the client's {size}-byte buffer changed under copy-on-write");
            }
            let mut pair = compared(&acc, "cow", ["cow", "copy"], size, 1, 1);
            for (row, a) in pair.iter_mut().zip(&acc) {
                let n = a.calls.max(1) as f64;
                let us = |ns: u64| ns as f64 / n / 1000.0;
                row.write_fraction = Some(permille as f64 / 1000.0);
                row.share_us = Some(us(a.share_ns));
                row.map_us = Some(us(a.map_ns));
                row.copy_us = Some(us(a.copy_ns));
                row.write_us = Some(us(a.write_ns));
                row.unmap_us = Some(us(a.unmap_ns));
                row.create_ref_us = Some(us(a.share_ns + a.map_ns + a.copy_ns));
                row.verified &= intact;
            }
            rows.extend(pair);
        }
    }
    drop(client);
    drop(callee);
    Ok(rows)
}

/// (c) The forwarding load balancer.
fn load_balancer(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    // The forwarder gets the other CPU to itself; the workers share the client's.
    let w0 = ctx.spawn_tier("w0", &[], true, false)?;
    let w1 = ctx.spawn_tier("w1", &[], true, false)?;
    let lb = ctx.spawn_tier("lb", &["w0", "w1"], false, false)?;
    let clients = [ctx.connect("lb")?, ctx.connect("w0")?, ctx.connect("w1")?];
    let peers: Vec<&Client> = clients.iter().collect();
    let mut pipe = ctx.pipeline("lb")?;
    let mut rows = Vec::new();
    for &size in &LB_SIZES {
        let data = Arc::new(pattern(size));
        let expect = sum_words(&data);
        let value = Payload::Value(data.clone());
        let pooled = Payload::Ref(Arc::new(ctx.domain.alloc_from(&data)?));
        let acc = ctx.closed_loop_point(
            &mut pipe,
            &peers,
            [("value/2", &value), ("ref/2", &pooled)],
            expect,
            Some(lb.id()),
            (&[w0.id(), w1.id()], &[lb.id()]),
        )?;
        let mut pair = compared(
            &acc,
            "load_balancer",
            ["by_value", "by_ref"],
            size,
            ctx.in_flight_for(size),
            0,
        );
        for (row, a) in pair.iter_mut().zip(&acc) {
            // procs[1] is the forwarder.
            let f = a.procs.get(1).copied().unwrap_or_default();
            let n = a.calls.max(1) as f64;
            row.hops = Some(2);
            row.forwarder_bytes_copied_per_call = Some((f.payload_bytes + f.pool_bytes) as f64 / n);
            row.forwarder_payload_bytes_copied_per_call = Some(f.payload_bytes as f64 / n);
            row.forwarder_pool_bytes_copied_per_call = Some(f.pool_bytes as f64 / n);
            row.forwarder_handle_bytes_per_call = Some(f.handle_bytes as f64 / n);
            row.forwarder_cpu_us_per_call = Some(a.cpu.as_secs_f64() * 1e6 / n);
        }
        rows.extend(pair);
    }
    drop(clients);
    drop((lb, w0, w1));
    Ok(rows)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.in_flight == 0 || args.window_ms == Some(0) || args.rounds == Some(0) {
        bail!("--in-flight, --window-ms and --rounds must be positive");
    }
    let quick = args.common.quick;
    let window = Duration::from_millis(args.window_ms.unwrap_or(if quick { 20 } else { 150 }));
    let rounds = args.rounds.unwrap_or(if quick { 1 } else { 6 });
    let run_dir = RunDir::create("dmrpc")?;
    let cpus = match netless_shm::allowed_cpus().as_slice() {
        [a, b, ..] if args.pin != Placement::None => Some((*a, *b)),
        _ => None,
    };
    if let Some((mine, _)) = cpus {
        // The peers pin themselves; this thread (and the domain's coordinator thread that
        // joining starts) stays on the first CPU.
        netless_shm::pin_current_thread(mine)?;
    }
    // This process founds the domain; the tiers join it.
    let domain = Domain::join(&domain_config(DOMAIN, &run_dir.path))?;
    let runs = |e: Experiment| args.only.is_empty() || args.only.contains(&e);
    let chain_sizes = if args.chain_sizes.is_empty() {
        CHAIN_SIZES.to_vec()
    } else {
        args.chain_sizes.clone()
    };
    let hops = if args.hops.is_empty() {
        (1..=MAX_HOPS).collect()
    } else {
        args.hops.clone()
    };
    if let Some(bad) = hops.iter().find(|&&h| h == 0 || h > MAX_HOPS) {
        bail!("--hops takes 1 to {MAX_HOPS}, not {bad}");
    }
    if chain_sizes.iter().any(|&s| s < 4 || s % 4 != 0) {
        bail!("--chain-sizes takes multiples of 4 bytes");
    }
    let points = usize::from(runs(Experiment::Chain)) * chain_sizes.len() * hops.len()
        + usize::from(runs(Experiment::Cow)) * COW_SIZES.len() * WRITE_PERMILLE.len()
        + usize::from(runs(Experiment::Lb)) * LB_SIZES.len();
    let bar = indicatif::ProgressBar::new((points * 2 * (rounds as usize + 1)) as u64)
        .with_message("bench dmrpc");
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} windows, {eta} left")
            .expect("valid template"),
    );
    let ctx = Ctx {
        exe: crate::self_exe()?,
        dir: run_dir.path.clone(),
        domain,
        spin_us: args.spin_us,
        wait: args.wait,
        cpus,
        placement: args.pin,
        forward: args.forward,
        in_flight: args.in_flight,
        batch: args.batch,
        chain_sizes,
        hops,
        window,
        warmup: (window / 5).max(Duration::from_millis(4)),
        warmup_calls: if quick { 8 } else { WARMUP_CALLS },
        warmup_cap: Duration::from_millis(if quick { 100 } else { 1000 }),
        rounds,
        bar,
    };
    let mut rows = Vec::new();
    if runs(Experiment::Chain) {
        rows.extend(nested_chain(&ctx)?);
    }
    if runs(Experiment::Cow) {
        rows.extend(copy_on_write(&ctx)?);
    }
    if runs(Experiment::Lb) {
        rows.extend(load_balancer(&ctx)?);
    }
    let transfer = if runs(Experiment::Transfer) {
        let sizes: &[usize] = if quick {
            &[4 << 10, 64 << 10]
        } else {
            &[
                1 << 10,
                4 << 10,
                8 << 10,
                16 << 10,
                32 << 10,
                64 << 10,
                256 << 10,
                1 << 20,
            ]
        };
        let calls = if quick { 100 } else { 2000 };
        ctx.bar.inc_length(sizes.len() as u64 * calls);
        transfer::measure(
            &ctx.exe,
            (&ctx.dir, DOMAIN, &ctx.domain),
            sizes,
            calls,
            cpus.map(|c| c.1),
            &ctx.bar,
        )?
    } else {
        Vec::new()
    };
    ctx.bar.finish_and_clear();

    let summary = Summary::of(&rows);
    print_tables(&rows, &ctx);
    if !transfer.is_empty() {
        transfer::print(&transfer);
    }
    print_summary(&summary);
    if let Some(path) = &args.common.json {
        let doc = Doc {
            experiment: "dmrpc",
            machine: report::Machine::current(),
            config: Config {
                in_flight: ctx.in_flight,
                window_ms: window.as_millis() as u64,
                rounds,
                spin_us: ctx.spin_us,
                placement: if cpus.is_some() {
                    args.pin
                } else {
                    Placement::None
                },
                forward: args.forward,
                quick,
            },
            rows: &rows,
            summary: &summary,
            transfer: &transfer,
            crossover_bytes: transfer::crossover(&transfer),
        };
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.common.plot {
        plot(&rows, path)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

// ----------------------------------------------------------------------------------------
// Reporting.

/// The JSON document: `{"experiment":"dmrpc","machine":{…},"config":{…},"rows":[Row, …],
/// "summary":{…}}`.
#[derive(Serialize)]
struct Doc<'a> {
    experiment: &'static str,
    machine: report::Machine,
    config: Config,
    rows: &'a [Row],
    summary: &'a Summary,
    /// (d): sequential call latency by value and by reference per payload size.
    transfer: &'a [transfer::TransferRow],
    /// The smallest measured size from which by reference was faster at every size.
    crossover_bytes: Option<usize>,
}

/// How the run was made.
#[derive(Serialize)]
struct Config {
    in_flight: usize,
    window_ms: u64,
    rounds: u32,
    spin_us: u64,
    placement: Placement,
    forward: Forward,
    quick: bool,
}

/// The figures the acceptance criteria name.
#[derive(Debug, Default, Serialize)]
struct Summary {
    /// Nested chain, 7 hops, 64 KiB: by-ref throughput / by-value throughput (median of the
    /// interleaved rounds' ratios).
    chain_7hop_64k_ref_over_value: Option<f64>,
    /// The same from the totals.
    chain_7hop_64k_ref_over_value_totals: Option<f64>,
    /// By reference, per size: 7-hop throughput / 1-hop throughput.
    chain_ref_7hop_over_1hop: Vec<SizeRatio>,
    /// By value, per size: 7-hop throughput / 1-hop throughput.
    chain_value_7hop_over_1hop: Vec<SizeRatio>,
    /// 1 MiB, 0% written: cow throughput / copy throughput (whole operations).
    cow_1m_0pct_ops_ratio: Option<f64>,
    /// The same from the totals.
    cow_1m_0pct_ops_ratio_totals: Option<f64>,
    /// 1 MiB: cow create_ref (share + map), µs.
    cow_1m_create_ref_us: Option<f64>,
    /// 1 MiB: the copy variant's create_ref (share + map + copy), µs.
    copy_1m_create_ref_us: Option<f64>,
    /// 1 MiB: the callee's copy of the buffer alone, µs.
    copy_1m_copy_us: Option<f64>,
    /// copy create_ref / cow create_ref at 1 MiB, 0% written.
    create_ref_speedup_1m: Option<f64>,
    /// Per payload size, by reference: bytes the forwarder copied per request.
    lb_ref_forwarder_bytes_copied_per_call: Vec<SizeRatio>,
    /// Per payload size, by reference: Ref bytes the forwarder sent per request.
    lb_ref_forwarder_handle_bytes_per_call: Vec<SizeRatio>,
    /// Per payload size, by value: bytes the forwarder copied per request.
    lb_value_forwarder_bytes_copied_per_call: Vec<SizeRatio>,
}

#[derive(Debug, Serialize)]
struct SizeRatio {
    size_bytes: usize,
    value: f64,
}

fn find<'a>(
    rows: &'a [Row],
    experiment: &str,
    variant: &str,
    size: usize,
    hops: Option<u32>,
    fraction: Option<f64>,
) -> Option<&'a Row> {
    rows.iter().find(|r| {
        r.experiment == experiment
            && r.variant == variant
            && r.size_bytes == size
            && (hops.is_none() || r.hops == hops)
            && (fraction.is_none() || r.write_fraction == fraction)
    })
}

impl Summary {
    fn of(rows: &[Row]) -> Summary {
        let chain = |v: &str, size, hops| find(rows, "nested_chain", v, size, Some(hops), None);
        let tput = |r: Option<&Row>| r.map(|r| r.throughput_per_s);
        // Hop counts are interleaved round by round: the median of the rounds' ratios.
        let hop_ratio = |v: &str| -> Vec<SizeRatio> {
            CHAIN_SIZES
                .iter()
                .filter_map(|&s| {
                    let (far, near) = (chain(v, s, MAX_HOPS)?, chain(v, s, 1)?);
                    let value = median_of_ratios(
                        &far.round_throughputs_per_s,
                        &near.round_throughputs_per_s,
                    )
                    .or_else(|| ratio(tput(Some(far))?, tput(Some(near))?))?;
                    Some(SizeRatio {
                        size_bytes: s,
                        value,
                    })
                })
                .collect()
        };
        let cow = find(rows, "cow", "cow", 1 << 20, None, Some(0.0));
        let copy = find(rows, "cow", "copy", 1 << 20, None, Some(0.0));
        let lb = |v: &str, f: fn(&Row) -> Option<f64>| -> Vec<SizeRatio> {
            LB_SIZES
                .iter()
                .filter_map(|&s| {
                    let value = f(find(rows, "load_balancer", v, s, None, None)?)?;
                    Some(SizeRatio {
                        size_bytes: s,
                        value,
                    })
                })
                .collect()
        };
        Summary {
            chain_7hop_64k_ref_over_value: chain("by_ref", 64 << 10, MAX_HOPS)
                .and_then(|r| r.ratio_median_of_rounds),
            chain_7hop_64k_ref_over_value_totals: chain("by_ref", 64 << 10, MAX_HOPS)
                .and_then(|r| r.ratio_vs_baseline),
            chain_ref_7hop_over_1hop: hop_ratio("by_ref"),
            chain_value_7hop_over_1hop: hop_ratio("by_value"),
            cow_1m_0pct_ops_ratio: cow.and_then(|r| r.ratio_median_of_rounds),
            cow_1m_0pct_ops_ratio_totals: cow.and_then(|r| r.ratio_vs_baseline),
            cow_1m_create_ref_us: cow.and_then(|r| r.create_ref_us),
            copy_1m_create_ref_us: copy.and_then(|r| r.create_ref_us),
            copy_1m_copy_us: copy.and_then(|r| r.copy_us),
            create_ref_speedup_1m: copy
                .and_then(|r| r.create_ref_us)
                .zip(cow.and_then(|r| r.create_ref_us))
                .and_then(|(a, b)| ratio(a, b)),
            lb_ref_forwarder_bytes_copied_per_call: lb("by_ref", |r| {
                r.forwarder_bytes_copied_per_call
            }),
            lb_ref_forwarder_handle_bytes_per_call: lb("by_ref", |r| {
                r.forwarder_handle_bytes_per_call
            }),
            lb_value_forwarder_bytes_copied_per_call: lb("by_value", |r| {
                r.forwarder_bytes_copied_per_call
            }),
        }
    }
}

/// "1024", or "1024 (64 with 1 MiB)" when large arrays keep fewer in flight.
fn in_flight_note(ctx: &Ctx, sizes: &[usize]) -> String {
    let capped: Vec<String> = sizes
        .iter()
        .filter(|&&s| ctx.in_flight_for(s) < ctx.in_flight)
        .map(|&s| format!("{} with {}", ctx.in_flight_for(s), report::fmt_bytes(s)))
        .collect();
    if capped.is_empty() {
        ctx.in_flight.to_string()
    } else {
        format!("{} ({})", ctx.in_flight, capped.join(", "))
    }
}

/// An aligned table: the first column left-aligned, the others right-aligned.
fn render(header: &[&str], body: &[Vec<String>]) -> String {
    let width = |s: &str| s.chars().count();
    let mut widths: Vec<usize> = header.iter().map(|h| width(h)).collect();
    for line in body {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(width(cell));
        }
    }
    let line = |cells: &[String]| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            let pad = " ".repeat(w - width(cell));
            if i > 0 {
                out.push_str("  ");
                out.push_str(&pad);
                out.push_str(cell);
            } else {
                out.push_str(cell);
                out.push_str(&pad);
            }
        }
        out.trim_end().to_string()
    };
    let head: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let mut out = line(&head);
    out.push('\n');
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
    for cells in body {
        out.push('\n');
        out.push_str(&line(cells));
    }
    out
}

fn bytes(x: f64) -> String {
    report::fmt_bytes(x.round() as usize)
}

fn times(x: Option<f64>) -> String {
    match x {
        Some(x) if x < 10.0 => format!("{x:.2}×"),
        Some(x) => format!("{x:.1}×"),
        None => "-".into(),
    }
}

/// Prints `title` and the table, unless `body` is empty (an experiment left out with --only).
fn section(title: &str, header: &[&str], body: &[Vec<String>]) {
    if !body.is_empty() {
        println!();
        println!("{title}");
        println!("{}", render(header, body));
    }
}

fn print_tables(rows: &[Row], ctx: &Ctx) {
    let pair = |experiment: &str, a: &str, b: &str| -> Vec<(&Row, &Row)> {
        rows.iter()
            .filter(|r| r.experiment == experiment && r.variant == a)
            .filter_map(|x| {
                let y = find(rows, experiment, b, x.size_bytes, x.hops, x.write_fraction)?;
                Some((x, y))
            })
            .collect()
    };
    println!(
        "netless bench dmrpc: DmRPC §VI on one host; every tier a process in one domain; \
         {} ms windows × {} interleaved rounds; waiters spin {} µs then sleep{}; {} forwarding",
        ctx.window.as_millis(),
        ctx.rounds,
        ctx.spin_us,
        match (ctx.cpus, ctx.placement) {
            (None, _) | (_, Placement::None) => "",
            (_, Placement::Alternate) => "; pinned, tiers alternate between two CPUs",
            (_, Placement::Reader) => {
                "; pinned, the tier that reads the array on the second CPU, the client and forwarders on the first"
            }
            (_, Placement::Client) => "; client pinned, tiers on two CPUs as the kernel balances",
        },
        match ctx.forward {
            Forward::Pipelined => "pipelined",
            Forward::Async => "asynchronous",
            Forward::Blocking => "blocking",
        }
    );
    let body: Vec<Vec<String>> = pair("nested_chain", "by_value", "by_ref")
        .into_iter()
        .map(|(v, r)| {
            vec![
                report::fmt_bytes(v.size_bytes),
                v.hops.unwrap_or(0).to_string(),
                format!("{:.0}", v.throughput_per_s),
                format!("{:.0}", r.throughput_per_s),
                times(r.ratio_median_of_rounds),
                report::fmt_us(v.avg_latency_us),
                report::fmt_us(r.avg_latency_us),
                bytes(v.bytes_copied_per_call),
                bytes(r.bytes_copied_per_call),
                bytes(r.handle_bytes_per_call),
            ]
        })
        .collect();
    section(
        &format!(
            "(a) nested chain (Fig. 5): {} calls in flight; the last tier sums the array; \
             copied = payload + pool bytes per call, all processes",
            in_flight_note(ctx, &ctx.chain_sizes)
        ),
        &[
            "array",
            "hops",
            "value calls/s",
            "ref calls/s",
            "ref/value",
            "value avg µs",
            "ref avg µs",
            "value copied",
            "ref copied",
            "ref handles",
        ],
        &body,
    );
    let body: Vec<Vec<String>> = pair("cow", "cow", "copy")
        .into_iter()
        .map(|(c, p)| {
            let us = |x: Option<f64>| report::fmt_us(x.unwrap_or(0.0));
            vec![
                report::fmt_bytes(c.size_bytes),
                format!("{:.0}%", c.write_fraction.unwrap_or(0.0) * 100.0),
                format!("{:.0}", c.throughput_per_s),
                format!("{:.0}", p.throughput_per_s),
                times(c.ratio_median_of_rounds),
                report::fmt_us(c.avg_latency_us),
                report::fmt_us(p.avg_latency_us),
                us(c.create_ref_us),
                us(p.create_ref_us),
                us(p.copy_us),
                bytes(c.bytes_copied_per_call),
                bytes(p.bytes_copied_per_call),
                format!("{:.1}", c.pages_copied_per_call),
                format!("{:.1}", p.pages_copied_per_call),
            ]
        })
        .collect();
    section(
        "(b) copy-on-write vs copy (Figs. 7, 8): one operation at a time; create_ref = share() \
         + the callee's map (+ its copy, for copy); copied/pages = pool counters per op",
        &[
            "buffer",
            "written",
            "cow ops/s",
            "copy ops/s",
            "cow/copy",
            "cow avg µs",
            "copy avg µs",
            "cow create_ref µs",
            "copy create_ref µs",
            "of which copy µs",
            "cow copied",
            "copy copied",
            "cow pages",
            "copy pages",
        ],
        &body,
    );
    let body: Vec<Vec<String>> = pair("load_balancer", "by_value", "by_ref")
        .into_iter()
        .map(|(v, r)| {
            let b = |x: Option<f64>| bytes(x.unwrap_or(0.0));
            vec![
                report::fmt_bytes(v.size_bytes),
                format!("{:.0}", v.throughput_per_s),
                format!("{:.0}", r.throughput_per_s),
                times(r.ratio_median_of_rounds),
                report::fmt_us(v.avg_latency_us),
                report::fmt_us(r.avg_latency_us),
                b(v.forwarder_bytes_copied_per_call),
                b(r.forwarder_bytes_copied_per_call),
                b(r.forwarder_pool_bytes_copied_per_call),
                b(r.forwarder_handle_bytes_per_call),
                format!("{:.1}", v.forwarder_cpu_us_per_call.unwrap_or(0.0)),
                format!("{:.1}", r.forwarder_cpu_us_per_call.unwrap_or(0.0)),
            ]
        })
        .collect();
    section(
        &format!(
            "(c) load balancer (Fig. 6): client → lb → w0/w1 round robin, {} calls in flight; \
             copied/handles/cpu = per request inside the forwarder",
            in_flight_note(ctx, &LB_SIZES)
        ),
        &[
            "payload",
            "value req/s",
            "ref req/s",
            "ref/value",
            "value avg µs",
            "ref avg µs",
            "value copied",
            "ref copied",
            "ref pool copied",
            "ref handles",
            "value lb cpu µs",
            "ref lb cpu µs",
        ],
        &body,
    );
    let retries: u64 = rows.iter().map(|r| r.retries).sum();
    if retries > 0 {
        println!(
            "\n{retries} calls were retried after RESOURCE_EXHAUSTED (see `retries` in the JSON)"
        );
    }
}

fn print_summary(s: &Summary) {
    let list = |v: &[SizeRatio], f: &dyn Fn(f64) -> String| -> String {
        v.iter()
            .map(|x| format!("{} {}", report::fmt_bytes(x.size_bytes), f(x.value)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let x = |v: f64| times(Some(v));
    let b = |v: f64| bytes(v);
    let us = |v: Option<f64>| v.map_or("-".into(), report::fmt_us);
    println!();
    println!(
        "Acceptance figures (ratios: median of the interleaved rounds; from totals in brackets)"
    );
    println!(
        "  nested chain, 7 hops, 64 KiB, by-ref / by-value throughput: {} ({})",
        times(s.chain_7hop_64k_ref_over_value),
        times(s.chain_7hop_64k_ref_over_value_totals)
    );
    println!(
        "  nested chain, 7-hop / 1-hop throughput, by ref: {}",
        list(&s.chain_ref_7hop_over_1hop, &x)
    );
    println!(
        "  nested chain, 7-hop / 1-hop throughput, by value: {}",
        list(&s.chain_value_7hop_over_1hop, &x)
    );
    println!(
        "  1 MiB, 0% written, cow / copy operations per second: {} ({})",
        times(s.cow_1m_0pct_ops_ratio),
        times(s.cow_1m_0pct_ops_ratio_totals)
    );
    println!(
        "  1 MiB create_ref: cow {} µs (share + map) vs copy {} µs (share + map + a {} µs \
         copy): {} faster",
        us(s.cow_1m_create_ref_us),
        us(s.copy_1m_create_ref_us),
        us(s.copy_1m_copy_us),
        times(s.create_ref_speedup_1m)
    );
    println!(
        "  load balancer, bytes the forwarder copies per request, by ref: {}",
        list(&s.lb_ref_forwarder_bytes_copied_per_call, &b)
    );
    println!(
        "  load balancer, Ref bytes the forwarder sends per request, by ref: {}",
        list(&s.lb_ref_forwarder_handle_bytes_per_call, &b)
    );
    println!(
        "  load balancer, bytes the forwarder copies per request, by value: {}",
        list(&s.lb_value_forwarder_bytes_copied_per_call, &b)
    );
}

fn plot(rows: &[Row], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1200, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((1, CHAIN_SIZES.len()));
    for (panel, &size) in panels.iter().zip(&CHAIN_SIZES) {
        let mine: Vec<&Row> = rows
            .iter()
            .filter(|r| r.experiment == "nested_chain" && r.size_bytes == size)
            .collect();
        // Log scale: one hop is an order of magnitude above seven for small arrays.
        let top = mine.iter().map(|r| r.throughput_per_s).fold(1.0, f64::max) * 1.5;
        let bottom = mine
            .iter()
            .map(|r| r.throughput_per_s)
            .fold(top, f64::min)
            .max(1.0)
            / 1.5;
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("nested chain, {} array", report::fmt_bytes(size)),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(0.5f64..(MAX_HOPS as f64 + 0.5), (bottom..top).log_scale())?;
        chart
            .configure_mesh()
            .x_labels(MAX_HOPS as usize)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .x_desc("nested RPC calls (hops)")
            .y_desc("calls/s (log scale)")
            .draw()?;
        for (variant, label, color) in [("by_value", "by value", RED), ("by_ref", "by ref", BLUE)] {
            let series: Vec<(f64, f64)> = mine
                .iter()
                .filter(|r| r.variant == variant)
                .map(|r| (f64::from(r.hops.unwrap_or(0)), r.throughput_per_s))
                .collect();
            chart
                .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
            chart.draw_series(
                series
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_sums_and_counts_round_trip() {
        let data = pattern(4096);
        assert_eq!(data.len(), 4096);
        let expect: u64 = (0..1024u32)
            .map(|i| u64::from(i.wrapping_mul(2_654_435_761) ^ 0x5a5a_5a5a))
            .sum();
        assert_eq!(sum_words(&data), expect);
        let domain = Domain::private(Default::default()).unwrap();
        let buf = domain.alloc_from(&pattern(3 * 4096)).unwrap();
        assert_eq!(sum_buf(&buf), sum_words(&pattern(3 * 4096)));
        let c = Counts {
            requests: 1,
            forwarded: 2,
            payload_bytes: 3,
            handle_bytes: 4,
            maps: 5,
            pool_bytes: 6,
            pool_pages: 7,
        };
        assert_eq!(Counts::from_fields(&u64s(&to_bytes(&c.fields()))), Some(c));
        assert_eq!(order(0, 2), [0, 1]);
        assert_eq!(order(1, 2), [1, 0]);
        assert_eq!(order(3, 3), [2, 1, 0]);
    }
}
