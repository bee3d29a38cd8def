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
//! to the next tier sleep at once. This process is pinned to the first allowed CPU and the
//! peers alternate between the first two (`--no-pin` leaves placement to the kernel).
//! `--forward blocking` makes each tier forward with blocking calls from as many worker
//! threads as there are calls in flight instead.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use hdrhistogram::Histogram;
use netless::{
    CallOptions, Client, ClientConfig, Code, Handler, Request, ResponseBuilder, Server,
    ServerConfig, Status, WaitMode, WaitPolicy,
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
const TIER_BUFFER: usize = 32 << 20;
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
    /// Calls kept in flight by the closed-loop client (nested chain and load balancer).
    #[arg(long, default_value_t = 8)]
    pub in_flight: usize,
    /// Measured time per variant, point and round, in ms [default: 150, or 20 with --quick].
    #[arg(long)]
    pub window_ms: Option<u64>,
    /// Interleaved rounds per point [default: 6, or 1 with --quick].
    #[arg(long)]
    pub rounds: Option<u32>,
    /// How long every waiter spins before it sleeps on its futex, in µs (0: sleep at once).
    #[arg(long, default_value_t = 5)]
    pub spin_us: u64,
    /// Do not pin the processes to CPUs.
    #[arg(long)]
    pub no_pin: bool,
    /// How a tier forwards: `async` (one worker thread, deferred reply + `call_async`) or
    /// `blocking` (as many worker threads as calls in flight, each forwarding with `call`).
    #[arg(long, default_value = "async")]
    pub forward: Forward,
    /// Run only these experiments (repeat or separate with commas) [default: all three].
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<Experiment>,
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

/// How the tiers forward calls.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Forward {
    Async,
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
    /// Pin the whole process to this CPU.
    #[arg(long)]
    pub pin_cpu: Option<usize>,
    /// 0: one worker thread that forwards asynchronously (deferred reply + `call_async`);
    /// N: N worker threads that each forward with a blocking call.
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// Before serving, touch every free page of the pool once, so that measured pool
    /// operations do not pay this process's first-touch page faults.
    #[arg(long)]
    pub prefault: bool,
}

// ----------------------------------------------------------------------------------------
// Shared by the tiers and the client.

fn wait_policy(spin_us: u64) -> WaitPolicy {
    if spin_us == 0 {
        WaitPolicy {
            mode: WaitMode::Futex,
            spin: Duration::ZERO,
        }
    } else {
        WaitPolicy {
            mode: WaitMode::Adaptive,
            spin: Duration::from_micros(spin_us),
        }
    }
}

fn client_config(dir: &Path, spin_us: u64) -> ClientConfig {
    ClientConfig {
        wait: wait_policy(spin_us),
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
    nexts: Vec<Client>,
    rr: AtomicUsize,
    runtime: tokio::runtime::Handle,
    requests: AtomicU64,
    forwarded: AtomicU64,
    payload_bytes: AtomicU64,
    handle_bytes: AtomicU64,
    maps: AtomicU64,
    /// What the copy-on-write callee writes (never the original pattern).
    scribble: Vec<u8>,
    /// Forward with a blocking call (several workers) instead of deferring.
    blocking: bool,
}

struct TierHandler(Arc<Tier>);

impl Handler for TierHandler {
    fn call<'a>(
        &self,
        request: &Request<'a>,
        response: &mut ResponseBuilder<'a>,
    ) -> Result<(), Status> {
        self.0.handle(request, response)
    }
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
            "value" | "ref" if arg > 1 => self.forward(kind, arg - 1, req.payload, resp),
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

    /// Sends `payload` on to the next tier as `kind/remaining` and answers when it answers.
    fn forward<'a>(
        self: &Arc<Self>,
        kind: &str,
        remaining: usize,
        payload: &[u8],
        resp: &mut ResponseBuilder<'a>,
    ) -> Result<(), Status> {
        if self.nexts.is_empty() {
            return Err(Status::new(
                Code::FailedPrecondition,
                "this tier is the last one",
            ));
        }
        let next = &self.nexts[self.rr.fetch_add(1, Ordering::Relaxed) % self.nexts.len()];
        let method = format!("{kind}/{remaining}");
        let (by_value, len) = (kind == "value", payload.len() as u64);
        if self.blocking {
            let answer = next.call(&method, payload, &CallOptions::new())?;
            self.count_forward(by_value, len);
            resp.metadata = answer.metadata;
            resp.payload = answer.payload;
            return Ok(());
        }
        let reply = resp.defer()?;
        // The payload is copied into the next tier's receive buffer here, before the handler
        // returns (and its request blocks go back to the caller).
        let call = next.call_async(&method, payload, &CallOptions::new());
        let tier = self.clone();
        self.runtime.spawn(async move {
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
    if let Some(cpu) = args.pin_cpu {
        // Before any thread starts, so every thread of the process inherits it.
        netless_shm::pin_current_thread(cpu)?;
    }
    let domain = Domain::join(&domain_config(&args.domain, &args.dir))
        .with_context(|| format!("joining domain `{}`", args.domain))?;
    // The next tier's reply takes at least one more hop: its waiter sleeps at once rather
    // than spin on a core the tiers behind it need.
    let nexts = args
        .next
        .iter()
        .map(|s| Client::connect_with(s, client_config(&args.dir, 0)))
        .collect::<Result<Vec<_>, _>>()?;
    if args.prefault {
        prefault(&domain)?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let handle = runtime.handle().clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let driver = std::thread::Builder::new()
        .name("dmrpc-forward".into())
        .spawn(move || {
            runtime.block_on(async {
                let _ = stop_rx.await;
            })
        })?;
    let tier = Arc::new(Tier {
        domain,
        nexts,
        rr: AtomicUsize::new(0),
        runtime: handle,
        requests: AtomicU64::new(0),
        forwarded: AtomicU64::new(0),
        payload_bytes: AtomicU64::new(0),
        handle_bytes: AtomicU64::new(0),
        maps: AtomicU64::new(0),
        scribble: vec![0xee; *COW_SIZES.iter().max().expect("sizes")],
        blocking: args.workers > 0,
    });
    let config = ServerConfig {
        workers: args.workers.max(1),
        wait: wait_policy(args.spin_us),
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
    let _ = stop_tx.send(());
    let _ = driver.join();
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

    fn merge(&mut self, o: Window) {
        self.calls += o.calls;
        self.hist.add(&o.hist).ok();
        self.retries += o.retries;
        self.payload_bytes += o.payload_bytes;
        self.handle_bytes += o.handle_bytes;
    }
}

/// What the client sends: the array itself, or a fresh Ref to its copy in the pool.
#[derive(Clone)]
enum Payload {
    Value(Arc<Vec<u8>>),
    Ref(Arc<SharedBuf>),
}

/// Keeps `in_flight` calls of `method` outstanding against `client` for `window`, checking
/// every reply against `expect`.
async fn closed_loop(
    client: &Client,
    method: &str,
    payload: &Payload,
    expect: u64,
    in_flight: usize,
    window: Duration,
    domain: &Domain,
) -> anyhow::Result<Window> {
    let started = Instant::now();
    let deadline = started + window;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..in_flight {
        let (client, method, payload, domain) = (
            client.clone(),
            method.to_string(),
            payload.clone(),
            domain.clone(),
        );
        tasks.spawn(async move {
            let mut w = Window::new();
            let options = CallOptions::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                let (result, sent) = match &payload {
                    Payload::Value(data) => {
                        (client.call_async(&method, data, &options).await, None)
                    }
                    Payload::Ref(buf) => {
                        let r = buf.share()?;
                        let bytes = r.to_bytes();
                        (client.call_async(&method, &bytes, &options).await, Some(r))
                    }
                };
                match result {
                    Ok(reply) => {
                        let got = u64s(&reply.payload);
                        if got.as_slice() != [expect] {
                            bail!("`{method}` returned {got:?}, expected the sum {expect}");
                        }
                        w.hist.saturating_record(t.elapsed().as_nanos() as u64);
                        w.calls += 1;
                        match &payload {
                            Payload::Value(data) => w.payload_bytes += data.len() as u64,
                            Payload::Ref(_) => w.handle_bytes += Ref::LEN as u64,
                        }
                    }
                    Err(status) if status.code() == Code::ResourceExhausted => {
                        if let Some(r) = sent {
                            let _ = domain.revoke(&r);
                        }
                        w.retries += 1;
                        tokio::time::sleep(Duration::from_micros(200)).await;
                    }
                    Err(status) => bail!("`{method}` failed: {status}"),
                }
            }
            Ok(w)
        });
    }
    let mut total = Window::new();
    while let Some(done) = tasks.join_next().await {
        total.merge(done??);
    }
    total.elapsed = started.elapsed();
    Ok(total)
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
fn order(round: u32) -> [usize; 2] {
    if round.is_multiple_of(2) {
        [0, 1]
    } else {
        [1, 0]
    }
}

/// What every experiment needs.
struct Ctx {
    exe: PathBuf,
    dir: PathBuf,
    domain: Domain,
    spin_us: u64,
    /// (this process's CPU, the other one), unless not pinning.
    cpus: Option<(usize, usize)>,
    forward: Forward,
    in_flight: usize,
    window: Duration,
    warmup: Duration,
    /// Calls a warm-up makes at least, unless it takes longer than `warmup_cap`.
    warmup_calls: u64,
    warmup_cap: Duration,
    rounds: u32,
    runtime: tokio::runtime::Runtime,
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
        let workers = match self.forward {
            Forward::Async => "0".to_string(),
            Forward::Blocking => self.in_flight.to_string(),
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
            "--workers",
            &workers,
        ];
        for n in next {
            args.extend(["--next", n]);
        }
        let cpu = self
            .cpus
            .map(|(mine, other)| if same_cpu { mine } else { other }.to_string());
        if let Some(cpu) = &cpu {
            args.extend(["--pin-cpu", cpu]);
        }
        if prefault {
            args.push("--prefault");
        }
        let (peer, _) = Peer::spawn(&self.exe, &args, Stop::CloseStdin)?;
        Ok(peer)
    }

    fn connect(&self, service: &str) -> anyhow::Result<Client> {
        Client::connect_with(service, client_config(&self.dir, self.spin_us))
            .with_context(|| format!("connecting to `{service}`"))
    }

    /// Measures the two variants of one point of a closed-loop experiment, interleaved;
    /// `watch` is a process whose CPU time to measure too.
    fn closed_loop_point(
        &self,
        client: &Client,
        peers: &[&Client],
        variants: [(&str, &Payload); 2],
        expect: u64,
        watch: Option<u32>,
    ) -> anyhow::Result<[Acc; 2]> {
        for (method, payload) in variants {
            let started = Instant::now();
            let mut calls = 0;
            while calls < self.warmup_calls && started.elapsed() < self.warmup_cap {
                calls += self
                    .runtime
                    .block_on(closed_loop(
                        client,
                        method,
                        payload,
                        expect,
                        self.in_flight,
                        self.warmup,
                        &self.domain,
                    ))?
                    .calls;
            }
            self.bar.inc(1);
        }
        let mut acc = [Acc::new(), Acc::new()];
        for round in 0..self.rounds {
            for k in order(round) {
                let (method, payload) = variants[k];
                let before = snapshot(&self.domain, peers)?;
                let cpu_before = watch.map(cpu_time);
                let w = self.runtime.block_on(closed_loop(
                    client,
                    method,
                    payload,
                    expect,
                    self.in_flight,
                    self.window,
                    &self.domain,
                ))?;
                if let (Some(pid), Some(before)) = (watch, cpu_before) {
                    acc[k].cpu += cpu_time(pid).saturating_sub(before);
                }
                let after = snapshot(&self.domain, peers)?;
                acc[k].add(&w, &deltas(&before, &after, &w));
                self.bar.inc(1);
            }
        }
        Ok(acc)
    }
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
    let mut r: Vec<f64> = acc
        .rounds
        .iter()
        .zip(&base.rounds)
        .filter_map(|(&a, &b)| ratio(a, b))
        .collect();
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
    let tiers: Vec<Client> = names
        .iter()
        .map(|n| ctx.connect(n))
        .collect::<anyhow::Result<_>>()?;
    let mut rows = Vec::new();
    for &size in &CHAIN_SIZES {
        let data = Arc::new(pattern(size));
        let expect = sum_words(&data);
        let value = Payload::Value(data.clone());
        // Written into the pool once; every call shares it afresh.
        let pooled = Payload::Ref(Arc::new(ctx.domain.alloc_from(&data)?));
        for hops in 1..=MAX_HOPS {
            let (mv, mr) = (format!("value/{hops}"), format!("ref/{hops}"));
            let involved: Vec<&Client> = tiers[..hops as usize].iter().collect();
            let acc = ctx.closed_loop_point(
                &tiers[0],
                &involved,
                [(&mv, &value), (&mr, &pooled)],
                expect,
                None,
            )?;
            let mut pair = compared(
                &acc,
                "nested_chain",
                ["by_value", "by_ref"],
                size,
                ctx.in_flight,
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
                for k in order(round) {
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
    let mut rows = Vec::new();
    for &size in &LB_SIZES {
        let data = Arc::new(pattern(size));
        let expect = sum_words(&data);
        let value = Payload::Value(data.clone());
        let pooled = Payload::Ref(Arc::new(ctx.domain.alloc_from(&data)?));
        let acc = ctx.closed_loop_point(
            &clients[0],
            &peers,
            [("value/2", &value), ("ref/2", &pooled)],
            expect,
            Some(lb.id()),
        )?;
        let mut pair = compared(
            &acc,
            "load_balancer",
            ["by_value", "by_ref"],
            size,
            ctx.in_flight,
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
        [a, b, ..] if !args.no_pin => Some((*a, *b)),
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
    let points = usize::from(runs(Experiment::Chain)) * CHAIN_SIZES.len() * MAX_HOPS as usize
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
        cpus,
        forward: args.forward,
        in_flight: args.in_flight,
        window,
        warmup: (window / 5).max(Duration::from_millis(4)),
        warmup_calls: if quick { 8 } else { WARMUP_CALLS },
        warmup_cap: Duration::from_millis(if quick { 100 } else { 1000 }),
        rounds,
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
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
                pinned: cpus.is_some(),
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
    pinned: bool,
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
        let hop_ratio = |v: &str| -> Vec<SizeRatio> {
            CHAIN_SIZES
                .iter()
                .filter_map(|&s| {
                    let value = ratio(tput(chain(v, s, MAX_HOPS))?, tput(chain(v, s, 1))?)?;
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
        if ctx.cpus.is_some() {
            "; pinned, tiers alternate between two CPUs"
        } else {
            ""
        },
        match ctx.forward {
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
            ctx.in_flight
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
            ctx.in_flight
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
        assert_eq!(order(0), [0, 1]);
        assert_eq!(order(1), [1, 0]);
    }
}
