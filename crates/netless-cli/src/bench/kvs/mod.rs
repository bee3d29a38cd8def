//! `netless bench kvs`: NEBULA §V-B, §VI–VII on one host. A MICA-like key-value service under
//! open-loop Poisson load over 16, 128 and 1024 connections: p99 latency against offered load,
//! throughput within the SLO, NACK rate and receive-buffer memory, for each receive-buffer
//! provisioning and dispatch mode.
//!
//! **Processes.** The server (`bench-peer kvs server`, [`store`]) preloads the store (1 Mi keys
//! of 16 B with 512 B values, 64 Ki with `--quick`) and serves `Get`/`Set` with one worker
//! pinned to the second CPU. The load generator (`bench-peer kvs load`, [`load`]) opens the
//! connections and runs the arrival process from one thread pinned to the first CPU: 50/50
//! `Get`/`Set`, uniform keys, uniform connections. This process drives both through their
//! stdin and stdout, sleeping meanwhile on the first CPU. Every configuration gets a fresh
//! server and generator; the peers die with this process (`PR_SET_PDEATHSIG`) and are stopped
//! (stdin closed, then killed) when its sweep ends or fails. The configurations the
//! acceptance compares (`shared`, `shared-slo` and `per-connection` at one connection count)
//! are swept together, their servers and generators all started: at each load point each is
//! measured in turn, in an order that alternates from point to point, so that the shared
//! host's drifts hit them alike.
//!
//! **Service time.** On two cores, one core of load generator must offer twice what one core
//! of server serves. The server's cost per request is mostly transport, not the key-value
//! operation (about 0.8 µs with 1 Mi keys, measured in-process and printed), and the
//! generator's cost per call grows with the connections (a submit on a connection that was
//! idle touches its cold state: about 1 µs each with 1024 connections). So each request also
//! busy-waits `--work-us` (2 µs by default) after its key-value operation, standing in for the
//! rest of a service: the server then serves about 300 000 calls/s, which the generator can
//! offer 2.5 times over with every connection count. Use `--work-us 0` for the bare store.
//!
//! **Latency and SLO.** As in NEBULA (§VI), latency is measured at the server: each request
//! carries its send time (`CLOCK_MONOTONIC`), and the handler records the time from send to
//! the end of its work, so queueing in the receive queue and the service are in it but not
//! the reply's trip back nor the generator's polling of 1024 connections (that end-to-end
//! client-side latency, from the scheduled send time, is reported too). The SLO is 10× the
//! mean zero-load service time: the mean server-side latency of 5000 calls made one at a
//! time. A load point meets the SLO when the 99th percentile over *all* calls sent, NACKed
//! and failed ones counted as infinitely late (NEBULA §VI), is within it; the throughput
//! within the SLO is the highest accepted throughput among the points that do.
//!
//! **Load.** The server's capacity is measured first: the accepted throughput of the
//! reference server (shared buffer, no SLO) under a load it cannot serve. Each configuration
//! is then swept from 0.1× to 2.5× that capacity (0.3× to 2.5× with `--quick`), one window per
//! point after a warm-up. The offered load reported is what the generator actually sent.
//!
//! **Configurations.** Every server with an SLO declares it with the measured service time,
//! so the runtime publishes its queue-depth limit (8 requests for one worker) and NACKs calls
//! that would queue deeper. Receive buffers:
//! - `shared`: one buffer for every connection, sized for that depth limit: (limit + workers)
//!   requests of the largest size (640 B with header), doubled because a request needs
//!   contiguous blocks in a ring that fragments; rounded up to a power of two (16 KiB).
//! - `shared-slo`: one buffer sized by the runtime from the SLO (10 × E\[Nq\] mean requests,
//!   NEBULA §IV-C, at least 64 blocks: 4 KiB), to show what that sizing does here.
//! - `per-connection`: 64 KiB per connection, HTTP/2's initial window, as most stacks do.
//! - `per-connection-noslo`: the same without SLO, so without queue limit (128 connections).
//! - `per-worker`: one depth-sized buffer per worker (in the dispatch part).
//!
//! Dispatch (`single`, `jbsq2`, `partitioned`) only differs with several workers. This
//! machine has two cores, one for the load, so the dispatch part runs two workers that share
//! the server's core (each sleeps as soon as it is idle, so that an idle worker does not
//! spin on the core the busy one needs): it shows how each mode copes with a worker that is
//! descheduled with requests of its own (a partitioned queue waits for its worker, a single
//! queue does not), not how they scale over cores.
//!
//! **Noise.** The machine is shared. Each point records the involuntary context switches of
//! the server and the generator during its window and the time the generator's schedule was
//! shifted because it was held up; a point whose figures look wrong can be told apart.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde::Serialize;

pub mod load;
pub mod render;
pub mod store;

use load::{Latency, Window, ZeroLoad};
use store::{Calibration, ServerWindow, Stats};

use super::{CommonArgs, RunDir};

/// Connection counts of the provisioning sweep.
pub const CONNECTIONS: [usize; 3] = [16, 128, 1024];
/// Connections of the dispatch part and of the no-SLO baseline.
const DISPATCH_CONNECTIONS: usize = 128;
/// Load points, as fractions of the measured capacity.
const FRACTIONS: [f64; 10] = [0.1, 0.3, 0.5, 0.65, 0.8, 0.9, 1.0, 1.25, 1.75, 2.5];
/// Load points with `--quick`.
const QUICK_FRACTIONS: [f64; 4] = [0.3, 0.8, 1.2, 2.5];
/// The SLO, in mean zero-load service times (NEBULA §VI).
pub const SLO_RATIO: f64 = 10.0;
/// Per-connection receive buffer: HTTP/2's initial flow-control window.
const CONNECTION_BUFFER: usize = 64 * 1024;
/// Bytes of the runtime's request header (a request takes header + method + payload,
/// rounded up to 64-byte blocks).
const REQUEST_HEADER: usize = 64;
/// Mean request size, method and payload: half `Get` (3 + 16 + 9 B), half `Set` (3 + 528 +
/// 9 B).
const MEAN_REQUEST: usize = (3
    + store::KEY_BYTES
    + store::STAMP_BYTES
    + 3
    + store::KEY_BYTES
    + store::VALUE_BYTES
    + store::STAMP_BYTES)
    / 2;
/// Largest request with its header, in whole blocks: a `Set`.
const LARGEST_REQUEST: usize =
    (REQUEST_HEADER + 3 + store::KEY_BYTES + store::VALUE_BYTES + store::STAMP_BYTES)
        .next_multiple_of(64);
/// How long a lone worker spins for requests before it sleeps, µs.
const WORKER_SPIN_US: u64 = 10_000;
/// How long a peer may take to start or to answer a command.
const PEER_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(clap::Args, Debug)]
#[command(
    mut_arg("json", |a| a.help(
        "Write every load point, the summaries and the acceptance figures as JSON to this file"
    )),
    mut_arg("plot", |a| a.help("Draw p99 latency against offered load to this SVG file")),
    mut_arg("quick", |a| a.help(
        "About half a minute instead of about five: 64 Ki keys, four load points of short \
         windows, shared and per-connection buffers only (for tests)"
    )),
)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Computation each request adds to its key-value operation, µs (see the module docs).
    #[arg(long, default_value_t = 3.0)]
    pub work_us: f64,
    /// Keys in the store [default: 1048576, or 65536 with --quick].
    #[arg(long)]
    pub keys: Option<u32>,
    /// Recorded time per window, ms [default: 250, or 120 with --quick].
    #[arg(long)]
    pub window_ms: Option<u64>,
    /// Windows a load point may take to meet the SLO [default: 4, or 1 with --quick].
    #[arg(long)]
    pub repeats: Option<u32>,
}

/// Receive-buffer provisioning (NEBULA §V-B), as named on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Provisioning {
    /// One buffer for every connection.
    Shared,
    /// One buffer per worker.
    PerWorker,
    /// One buffer per connection.
    PerConnection,
}

impl From<Provisioning> for netless::Provisioning {
    fn from(p: Provisioning) -> netless::Provisioning {
        match p {
            Provisioning::Shared => netless::Provisioning::Shared,
            Provisioning::PerWorker => netless::Provisioning::PerWorker,
            Provisioning::PerConnection => netless::Provisioning::PerConnection,
        }
    }
}

/// Dispatch of requests to workers (NEBULA §V-E), as named on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dispatch {
    /// One queue; an idle worker takes the oldest request.
    Single,
    /// One queue; a worker holds up to two requests.
    Jbsq2,
    /// One queue per worker.
    Partitioned,
}

impl From<Dispatch> for netless::Dispatch {
    fn from(d: Dispatch) -> netless::Dispatch {
        match d {
            Dispatch::Single => netless::Dispatch::SingleQueue,
            Dispatch::Jbsq2 => netless::Dispatch::Jbsq2,
            Dispatch::Partitioned => netless::Dispatch::Partitioned,
        }
    }
}

/// `bench-peer kvs`: a process of the key-value benchmark.
#[derive(clap::Args, Debug)]
pub struct PeerArgs {
    #[command(subcommand)]
    pub role: Role,
}

/// The two kinds of peer process.
#[derive(clap::Subcommand, Debug)]
pub enum Role {
    /// The key-value server.
    Server(store::ServerArgs),
    /// The load generator.
    Load(load::LoadArgs),
}

/// Runs a peer process.
pub fn peer(args: PeerArgs) -> anyhow::Result<()> {
    // Die with the benchmark, even if it is killed.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    match args.role {
        Role::Server(a) => store::serve(a),
        Role::Load(a) => load::generate(a),
    }
}

/// How a configuration's receive buffer is provisioned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Buffer {
    /// Sized for the SLO's queue-depth limit (see the module docs).
    DepthSized,
    /// Sized by the runtime from the SLO.
    RuntimeSlo,
    /// 64 KiB per connection.
    Window64K,
    /// The runtime's default with no SLO (1 MiB).
    Default,
}

/// One server setup and the connections it is loaded through.
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    /// Short name: provisioning variant, dispatch, workers.
    pub mode: String,
    pub provisioning: Provisioning,
    pub dispatch: Dispatch,
    pub workers: usize,
    pub connections: usize,
    pub buffer: Buffer,
    /// Whether the server has the SLO (and so a queue-depth limit).
    pub slo: bool,
}

impl Config {
    fn new(
        mode: &str,
        provisioning: Provisioning,
        dispatch: Dispatch,
        workers: usize,
        connections: usize,
        buffer: Buffer,
    ) -> Config {
        Config {
            mode: mode.to_string(),
            provisioning,
            dispatch,
            workers,
            connections,
            buffer,
            slo: buffer != Buffer::Default
                && !(buffer == Buffer::Window64K && mode.ends_with("noslo")),
        }
    }

    /// The configurations of a run, in the order they run.
    fn plan(quick: bool) -> Vec<Config> {
        use Buffer::*;
        use Dispatch::*;
        use Provisioning::*;
        let mut plan = Vec::new();
        for &c in &CONNECTIONS {
            plan.push(Config::new("shared", Shared, Single, 1, c, DepthSized));
            if !quick {
                plan.push(Config::new("shared-slo", Shared, Single, 1, c, RuntimeSlo));
            }
            plan.push(Config::new(
                "per-connection",
                PerConnection,
                Single,
                1,
                c,
                Window64K,
            ));
        }
        if !quick {
            let c = DISPATCH_CONNECTIONS;
            plan.push(Config::new(
                "per-connection-noslo",
                PerConnection,
                Single,
                1,
                c,
                Window64K,
            ));
            for (mode, p, d) in [
                ("shared/single/2w", Shared, Single),
                ("shared/jbsq2/2w", Shared, Jbsq2),
                ("shared/partitioned/2w", Shared, Partitioned),
                ("per-worker/partitioned/2w", PerWorker, Partitioned),
            ] {
                plan.push(Config::new(mode, p, d, 2, c, DepthSized));
            }
        }
        plan
    }

    /// Requests one queue may hold under the SLO, for each of the workers draining it.
    fn depth_limit(&self) -> u32 {
        let k = match self.dispatch {
            Dispatch::Partitioned => 1,
            _ => self.workers as u32,
        };
        netless::sizing::depth_limit(k, SLO_RATIO)
    }

    /// The receive buffer to ask for (whole, per worker or per connection), if not the
    /// runtime's choice.
    fn buffer_bytes(&self) -> Option<usize> {
        match self.buffer {
            Buffer::DepthSized => {
                let queues = match (self.provisioning, self.dispatch) {
                    (Provisioning::PerWorker, _) => 1,
                    (_, Dispatch::Partitioned) => self.workers,
                    _ => 1,
                };
                let drainers = match (self.provisioning, self.dispatch) {
                    (_, Dispatch::Partitioned) | (Provisioning::PerWorker, _) => 1,
                    _ => self.workers,
                };
                let requests = (self.depth_limit() as usize + drainers) * queues;
                Some((requests * LARGEST_REQUEST * 2).next_power_of_two())
            }
            Buffer::Window64K => Some(CONNECTION_BUFFER),
            Buffer::RuntimeSlo | Buffer::Default => None,
        }
    }
}

/// A peer process driven by one-line commands; stopped (stdin closed, then killed) on drop.
struct PeerProcess {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl PeerProcess {
    /// Starts `exe args…` and waits for its first line, which must start with `ready`.
    fn start(exe: &Path, args: &[String], ready: &str) -> anyhow::Result<PeerProcess> {
        let what = format!("netless {}", args.join(" "));
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawning `{what}`"))?;
        let stdout = child.stdout.take().context("peer stdout")?;
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut peer = PeerProcess {
            what,
            child,
            stdin,
            lines,
        };
        let first = peer.line()?;
        if !first.starts_with(ready) {
            bail!("`{}` did not start: {first:?}", peer.what);
        }
        Ok(peer)
    }

    fn id(&self) -> u32 {
        self.child.id()
    }

    fn line(&mut self) -> anyhow::Result<String> {
        match self.lines.recv_timeout(PEER_TIMEOUT) {
            Ok(line) => Ok(line),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                bail!("`{}` did not answer within {PEER_TIMEOUT:?}", self.what)
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.child.wait()?;
                bail!("`{}` exited ({status})", self.what)
            }
        }
    }

    /// Sends `command` and parses the one-line JSON answer.
    fn ask<T: serde::de::DeserializeOwned>(&mut self, command: &str) -> anyhow::Result<T> {
        let stdin = self.stdin.as_mut().context("peer stdin closed")?;
        writeln!(stdin, "{command}")?;
        stdin.flush()?;
        let line = self.line()?;
        serde_json::from_str(&line)
            .with_context(|| format!("`{}` answered {command:?} with {line:?}", self.what))
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        drop(self.stdin.take());
        super::peer::reap(&mut self.child, Duration::from_secs(5));
    }
}

/// Involuntary context switches so far of the threads of process `pid` whose name starts
/// with `prefix` (0 if unknown): how often something else took a core from them.
fn preemptions(pid: u32, prefix: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}

/// Time the hypervisor gave CPU `cpu` to other guests so far, ms (0 if `/proc/stat` cannot
/// say, as on bare metal).
fn steal_ms(cpu: usize) -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return 0.0;
    };
    let name = format!("cpu{cpu} ");
    let ticks: u64 = stat
        .lines()
        .find(|l| l.starts_with(&name))
        .and_then(|l| l.split_whitespace().nth(8))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    ticks as f64 * 1000.0 / rustix::param::clock_ticks_per_second().max(1) as f64
}

/// What was measured before the sweep, and the settings derived from it.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Baseline {
    /// Keys in the store.
    pub keys: u32,
    /// Computation added to each request, µs.
    pub work_us: f64,
    /// The key-value operation alone, timed in the server process.
    pub handler: Calibration,
    /// Zero-load latency at the server (send to end of handler): the service time.
    pub zero_load_server: Latency,
    /// Zero-load latency at the client (round trip).
    pub zero_load_client: Latency,
    /// The SLO on server-side p99 latency, µs: 10× the mean zero-load service time.
    pub slo_us: f64,
    /// The reference server's capacity: its accepted calls/s under a load it cannot serve.
    pub capacity_per_s: f64,
    /// Load the generator offered while measuring the capacity, calls/s.
    pub capacity_offered_per_s: f64,
}

/// One load point of one configuration.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub config: Config,
    /// Receive-buffer bytes the server provisioned with all connections open.
    pub receive_buffer_bytes: u64,
    /// The server's queue-depth limit (0: none).
    pub depth_limit: u32,
    /// Planned load, as a fraction of the capacity.
    pub load_fraction: f64,
    /// Planned load, calls/s.
    pub planned_per_s: f64,
    /// Load the generator sent, calls/s.
    pub offered_per_s: f64,
    /// Offered load as a multiple of the capacity.
    pub offered_x_capacity: f64,
    /// Answered calls/s.
    pub throughput_per_s: f64,
    /// NACKed calls / sent calls.
    pub nack_rate: f64,
    /// Of the NACKs, the share for a queue deeper than the SLO allows (the rest: no room in
    /// the receive buffer).
    pub nack_depth_share: f64,
    /// The generator's window.
    pub client: Window,
    /// Server-side latency of the answered calls.
    pub server: Latency,
    /// Server-side p99 over all calls sent, NACKed and failed ones as infinitely late (µs;
    /// `None`: infinite, more than 1% unanswered).
    pub p99_all_us: Option<f64>,
    /// Whether this point meets the SLO.
    pub within_slo: bool,
    /// Requests the server answered in the window (its own count).
    pub server_requests: u64,
    /// What else took the cores during the window.
    pub noise: Noise,
    /// Which of the point's windows was kept (1-based): the first that met the SLO, else
    /// the best (see the module docs).
    pub window_kept: u32,
}

/// A configuration's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    #[serde(flatten)]
    pub config: Config,
    pub receive_buffer_bytes: u64,
    pub depth_limit: u32,
    /// Highest accepted throughput of the sweep, calls/s.
    pub max_throughput_per_s: f64,
    /// Highest accepted throughput among the points within the SLO (0: none).
    pub throughput_within_slo_per_s: f64,
    /// The highest load point (≥ 2× capacity): offered multiple, NACK rate, server p99 of
    /// accepted calls, client p99.
    pub overload_x_capacity: f64,
    pub overload_nack_rate: f64,
    /// Of the NACKs at overload, the share a worker sent for a request that had waited too
    /// long (the rest: refused by the client before sending).
    pub overload_nack_late_share: f64,
    /// Client-side p99 time from a NACKed call's scheduled send to its NACK, µs.
    pub overload_nack_p99_us: f64,
    pub overload_p99_us: f64,
    pub overload_client_p99_us: f64,
    /// Calls that failed other than by NACK or local refusal, and wrong replies, over the
    /// sweep.
    pub errors: u64,
    pub wrong: u64,
}

impl Summary {
    fn of(config: &Config, rows: &[Row]) -> Option<Summary> {
        let top = rows
            .iter()
            .max_by(|a, b| a.load_fraction.total_cmp(&b.load_fraction))?;
        Some(Summary {
            config: config.clone(),
            receive_buffer_bytes: top.receive_buffer_bytes,
            depth_limit: top.depth_limit,
            max_throughput_per_s: rows.iter().map(|r| r.throughput_per_s).fold(0.0, f64::max),
            throughput_within_slo_per_s: rows
                .iter()
                .filter(|r| r.within_slo)
                .map(|r| r.throughput_per_s)
                .fold(0.0, f64::max),
            overload_x_capacity: top.offered_x_capacity,
            overload_nack_rate: top.nack_rate,
            overload_nack_late_share: if top.client.nacks > 0 {
                top.client.nacks_late as f64 / top.client.nacks as f64
            } else {
                0.0
            },
            overload_nack_p99_us: top.client.nack_latency.p99_us,
            overload_p99_us: top.server.p99_us,
            overload_client_p99_us: top.client.latency.p99_us,
            errors: rows.iter().map(|r| r.client.errors).sum(),
            wrong: rows.iter().map(|r| r.client.wrong).sum(),
        })
    }
}

/// Where the peers run and what they all need.
struct Ctx {
    exe: PathBuf,
    dir: String,
    keys: u32,
    work_ns: u64,
    /// (generator CPU, server CPU), unless the machine has one CPU.
    cpus: Option<(usize, usize)>,
}

impl Ctx {
    fn server(
        &self,
        service: &str,
        config: &Config,
        slo: Option<(f64, f64)>,
    ) -> anyhow::Result<PeerProcess> {
        let mut args: Vec<String> = [
            "bench-peer",
            "kvs",
            "server",
            "--dir",
            &self.dir,
            "--service",
            service,
        ]
        .map(String::from)
        .to_vec();
        let provisioning = serde_plain(&config.provisioning);
        let dispatch = serde_plain(&config.dispatch);
        args.extend([
            "--keys".into(),
            self.keys.to_string(),
            "--provisioning".into(),
            provisioning,
            "--dispatch".into(),
            dispatch,
            "--workers".into(),
            config.workers.to_string(),
            "--work-ns".into(),
            self.work_ns.to_string(),
            "--request-bytes".into(),
            MEAN_REQUEST.to_string(),
            "--max-connections".into(),
            (CONNECTIONS[2] + 64).to_string(),
        ]);
        if let Some(b) = config.buffer_bytes() {
            args.extend(["--buffer-bytes".into(), b.to_string()]);
        }
        if let (true, Some((slo_us, service_us))) = (config.slo, slo) {
            args.extend([
                "--slo-ns".into(),
                ((slo_us * 1e3) as u64).to_string(),
                "--service-ns".into(),
                ((service_us * 1e3) as u64).max(1).to_string(),
            ]);
        }
        // One worker spins up to 10 ms before it sleeps, so that the server's CPU does not
        // idle between requests at low load (an idle vCPU of this VM can take milliseconds to
        // get back from the hypervisor); workers that share a core sleep as soon as idle (see
        // the module docs).
        let spin_us = if config.workers > 1 {
            0
        } else {
            WORKER_SPIN_US
        };
        args.extend(["--spin-us".into(), spin_us.to_string()]);
        if let Some((helpers, workers)) = self.cpus {
            args.extend([
                "--pin-cpu".into(),
                workers.to_string(),
                "--helper-cpu".into(),
                helpers.to_string(),
            ]);
        }
        PeerProcess::start(&self.exe, &args, "LISTENING")
    }

    fn generator(&self, service: &str, connections: usize) -> anyhow::Result<PeerProcess> {
        let mut args: Vec<String> = [
            "bench-peer",
            "kvs",
            "load",
            "--dir",
            &self.dir,
            "--service",
            service,
        ]
        .map(String::from)
        .to_vec();
        args.extend([
            "--keys".into(),
            self.keys.to_string(),
            "--connections".into(),
            connections.to_string(),
        ]);
        if let Some((cpu, _)) = self.cpus {
            args.extend(["--pin-cpu".into(), cpu.to_string()]);
        }
        PeerProcess::start(&self.exe, &args, "READY")
    }
}

/// A clap value's name (`per-connection`).
fn serde_plain<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

/// What else took the cores during a window.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Noise {
    /// Involuntary context switches of the server's workers and of the generator's thread.
    pub server_preemptions: u64,
    pub generator_preemptions: u64,
    /// Time the hypervisor gave the server's CPU to other guests, ms.
    pub server_cpu_steal_ms: f64,
}

/// The figures of one window: the generator's, then the server's for the same calls.
fn measure_point(
    ctx: &Ctx,
    server: &mut PeerProcess,
    generator: &mut PeerProcess,
    rate: f64,
    warmup: Duration,
    window: Duration,
    seed: u64,
) -> anyhow::Result<(Window, ServerWindow, Stats, Noise)> {
    let before: Stats = server.ask("stats")?;
    let server_cpu = ctx.cpus.map_or(0, |(_, s)| s);
    // The server's workers, and the generator's one thread that sends and polls (its
    // process's name; the connections' monitor threads are named).
    let (workers, sender) = ("netless-worker", "netless");
    let preempted = |p: &PeerProcess, prefix| preemptions(p.id(), prefix);
    let (s0, g0, t0) = (
        preempted(server, workers),
        preempted(generator, sender) - preempted(generator, "netless-"),
        steal_ms(server_cpu),
    );
    let w: Window = generator.ask(&format!(
        "run {rate} {} {} {seed}",
        warmup.as_millis(),
        window.as_millis()
    ))?;
    let noise = Noise {
        server_preemptions: preempted(server, workers).saturating_sub(s0),
        generator_preemptions: (preempted(generator, sender) - preempted(generator, "netless-"))
            .saturating_sub(g0),
        server_cpu_steal_ms: (steal_ms(server_cpu) - t0).max(0.0),
    };
    // The server-side latency at the rank of the 99th percentile among all calls sent.
    let q = if w.accepted > 0 {
        (0.99 * w.sent as f64 / w.accepted as f64).min(1.0)
    } else {
        1.0
    };
    let sw: ServerWindow = server.ask(&format!("window {q}"))?;
    let mut after: Stats = server.ask("stats")?;
    after.requests -= before.requests;
    Ok((w, sw, after, noise))
}

/// Measures the service time, the SLO and the capacity on the reference server.
fn baseline(ctx: &Ctx, quick: bool, work_us: f64) -> anyhow::Result<Baseline> {
    let reference = Config::new(
        "reference",
        Provisioning::Shared,
        Dispatch::Single,
        1,
        CONNECTIONS[0],
        Buffer::Default,
    );
    let mut server = ctx.server("kv.ref", &reference, None)?;
    let handler: Calibration = server.ask(if quick {
        "calibrate 20000"
    } else {
        "calibrate 200000"
    })?;
    let mut generator = ctx.generator("kv.ref", reference.connections)?;
    // Warm the paths (and the store's pages), then measure one call at a time, three
    // times: the machine is shared, and a stall of a few ms moves a mean of µs, so the
    // quietest of the three is kept.
    let _: ZeroLoad = generator.ask("zero 500 7")?;
    let _: ServerWindow = server.ask("window 0.99")?;
    let calls = if quick { 1000 } else { 2000 };
    let mut zero: Option<(ZeroLoad, ServerWindow)> = None;
    for round in 0..3 {
        let client: ZeroLoad = generator.ask(&format!("zero {calls} {round}"))?;
        let at_server: ServerWindow = server.ask("window 0.99")?;
        if client.failed > 0 || at_server.latency.count == 0 {
            bail!("zero-load calls failed: {client:?}");
        }
        if zero
            .as_ref()
            .is_none_or(|(_, z)| at_server.latency.mean_us < z.latency.mean_us)
        {
            zero = Some((client, at_server));
        }
    }
    let (client, zero) = zero.expect("three rounds");
    // Far more than the server can take: its queue stays full, it never idles. The best of
    // two windows.
    let rate = (4e6 / zero.latency.mean_us).min(3e6);
    let window = Duration::from_millis(if quick { 150 } else { 400 });
    let mut capacity = (0.0f64, 0.0f64);
    for round in 0..2 {
        let (w, _, _, _) = measure_point(
            ctx,
            &mut server,
            &mut generator,
            rate,
            window / 3,
            window,
            11 + round,
        )?;
        let accepted = w.accepted as f64 / w.window_s;
        if accepted > capacity.0 {
            capacity = (accepted, w.sent as f64 / w.window_s);
        }
    }
    Ok(Baseline {
        keys: ctx.keys,
        work_us,
        handler,
        zero_load_server: zero.latency,
        zero_load_client: client.latency,
        slo_us: SLO_RATIO * zero.latency.mean_us,
        capacity_per_s: capacity.0,
        capacity_offered_per_s: capacity.1,
    })
}

/// A configuration's server and generator, started and warmed for a sweep.
struct Running<'c> {
    config: &'c Config,
    server: PeerProcess,
    generator: PeerProcess,
    open: Stats,
    rows: Vec<Row>,
}

impl<'c> Running<'c> {
    fn start(ctx: &Ctx, base: &Baseline, config: &'c Config) -> anyhow::Result<Running<'c>> {
        let service = format!("kv.{}", ctx_service_suffix(config));
        let mut server = ctx.server(
            &service,
            config,
            Some((base.slo_us, base.zero_load_server.mean_us)),
        )?;
        let mut generator = ctx.generator(&service, config.connections)?;
        // The server counts a connection once its acceptor has registered it, a moment after
        // the client's handshake.
        let mut open: Stats = server.ask("stats")?;
        let since = Instant::now();
        while (open.connections as usize) < config.connections
            && since.elapsed() < PEER_TIMEOUT / 10
        {
            std::thread::sleep(Duration::from_millis(20));
            open = server.ask("stats")?;
        }
        if open.connections as usize != config.connections {
            bail!(
                "{} connections open instead of {}",
                open.connections,
                config.connections
            );
        }
        // Use every connection once, then warm the store.
        let warm: ZeroLoad = generator.ask("warm")?;
        if warm.failed > 0 {
            bail!("{} of the warm-up calls failed", warm.failed);
        }
        let _: ZeroLoad = generator.ask("zero 300 5")?;
        let _: ServerWindow = server.ask("window 0.99")?;
        Ok(Running {
            config,
            server,
            generator,
            open,
            rows: Vec::new(),
        })
    }
}

/// Sweeps `configs` together: at each load point, each configuration in turn (the order
/// alternating from point to point), so that a drift of the shared host hits the
/// configurations compared alike. Returns each configuration's rows.
fn sweep(
    ctx: &Ctx,
    base: &Baseline,
    configs: &[&Config],
    fractions: &[f64],
    (window, repeats): (Duration, u32),
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<Vec<Row>>> {
    let names: Vec<&str> = configs.iter().map(|c| c.mode.as_str()).collect();
    bar.set_message(format!("{} × {}", names.join(", "), configs[0].connections));
    let mut running = Vec::new();
    for config in configs {
        running.push(
            Running::start(ctx, base, config).with_context(|| {
                format!("{} with {} connections", config.mode, config.connections)
            })?,
        );
    }
    let warmup = (window / 4).max(Duration::from_millis(30));
    for (k, &fraction) in fractions.iter().enumerate() {
        let planned = fraction * base.capacity_per_s;
        let order: Vec<usize> = if k % 2 == 0 {
            (0..running.len()).collect()
        } else {
            (0..running.len()).rev().collect()
        };
        for i in order {
            let r = &mut running[i];
            let mut kept: Option<Row> = None;
            for attempt in 0..repeats {
                let (w, sw, stats, noise) = measure_point(
                    ctx,
                    &mut r.server,
                    &mut r.generator,
                    planned,
                    warmup,
                    window,
                    (k as u64 + 1) * 100 + u64::from(attempt),
                )
                .with_context(|| {
                    format!(
                        "{} with {} connections",
                        r.config.mode, r.config.connections
                    )
                })?;
                let row = make_row(
                    r.config, &r.open, base, fraction, planned, w, sw, stats, noise,
                );
                let better = kept.as_ref().is_none_or(|old| row.rank() < old.rank());
                let met = row.within_slo;
                if better {
                    kept = Some(Row {
                        window_kept: attempt + 1,
                        ..row
                    });
                }
                if met {
                    break;
                }
            }
            r.rows.extend(kept);
            bar.inc(1);
        }
    }
    Ok(running.into_iter().map(|r| r.rows).collect())
}

/// The configurations swept together: those of the provisioning comparison
/// (`shared`, `shared-slo`, `per-connection`) at the same connection count; every other
/// configuration alone.
fn groups(plan: &[Config]) -> Vec<Vec<&Config>> {
    let compared =
        |c: &Config| matches!(c.mode.as_str(), "shared" | "shared-slo" | "per-connection");
    let mut groups: Vec<Vec<&Config>> = Vec::new();
    for config in plan {
        match groups.last_mut() {
            Some(g)
                if compared(config) && compared(g[0]) && g[0].connections == config.connections =>
            {
                g.push(config)
            }
            _ => groups.push(vec![config]),
        }
    }
    groups
}

/// A load point's row from its measurements.
#[allow(clippy::too_many_arguments)]
fn make_row(
    config: &Config,
    open: &Stats,
    base: &Baseline,
    fraction: f64,
    planned: f64,
    w: Window,
    sw: ServerWindow,
    stats: Stats,
    noise: Noise,
) -> Row {
    let sent = w.sent.max(1) as f64;
    let unanswered = w.sent.saturating_sub(w.accepted);
    let p99_all_us = (unanswered as f64 <= 0.01 * sent).then_some(sw.at_quantile_us);
    let offered = w.sent as f64 / w.window_s;
    Row {
        config: config.clone(),
        receive_buffer_bytes: open.receive_buffer_bytes,
        depth_limit: open.depth_limit,
        load_fraction: fraction,
        planned_per_s: planned,
        offered_per_s: offered,
        offered_x_capacity: offered / base.capacity_per_s,
        throughput_per_s: w.accepted as f64 / w.window_s,
        nack_rate: w.nacks as f64 / sent,
        nack_depth_share: if w.nacks > 0 {
            w.nacks_depth as f64 / w.nacks as f64
        } else {
            0.0
        },
        within_slo: p99_all_us.is_some_and(|p| p <= base.slo_us),
        p99_all_us,
        client: w,
        server: sw.latency,
        server_requests: stats.requests,
        noise,
        window_kept: 1,
    }
}

impl Row {
    /// Order of preference among windows of the same point: within the SLO first, then the
    /// least time stolen by the hypervisor from the server's CPU, then the lowest p99 over all
    /// calls (unanswered calls beyond 1% last), then the lowest p99.
    fn rank(&self) -> (bool, u64, u64, u64) {
        (
            !self.within_slo,
            self.noise.server_cpu_steal_ms as u64,
            self.p99_all_us.map_or(u64::MAX, |p| (p * 1e3) as u64),
            (self.server.p99_us * 1e3) as u64,
        )
    }
}

/// A service name for a configuration (short: it becomes a socket path).
fn ctx_service_suffix(config: &Config) -> String {
    format!("{}.{}", config.mode.replace('/', "-"), config.connections)
}

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if !(args.work_us >= 0.0 && args.work_us < 1e6) || args.window_ms == Some(0) {
        bail!("--work-us must be 0..1e6 and --window-ms positive");
    }
    let quick = args.common.quick;
    let run_dir = RunDir::create("kvs")?;
    let cpus = match netless_shm::allowed_cpus().as_slice() {
        [a, b, ..] => Some((*a, *b)),
        _ => None,
    };
    if let Some((mine, _)) = cpus {
        // This process sleeps on the generator's CPU, never on the server's.
        netless_shm::pin_current_thread(mine)?;
    }
    let ctx = Ctx {
        exe: crate::self_exe()?,
        dir: run_dir
            .path
            .to_str()
            .context("socket directory is not UTF-8")?
            .to_string(),
        keys: args
            .keys
            .unwrap_or(if quick { 1 << 16 } else { 1 << 20 })
            .max(1),
        work_ns: (args.work_us * 1e3) as u64,
        cpus,
    };
    let fractions: &[f64] = if quick { &QUICK_FRACTIONS } else { &FRACTIONS };
    let window = Duration::from_millis(args.window_ms.unwrap_or(if quick { 120 } else { 250 }));
    let repeats = args.repeats.unwrap_or(if quick { 1 } else { 4 }).max(1);
    let plan = Config::plan(quick);
    let started = Instant::now();
    eprintln!(
        "bench kvs: {} keys, {} µs of work per request, {} configurations × {} load points",
        ctx.keys,
        args.work_us,
        plan.len(),
        fractions.len()
    );
    let base = baseline(&ctx, quick, args.work_us)?;
    render::print_baseline(&base);
    let bar = indicatif::ProgressBar::new((plan.len() * fractions.len()) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg:28} [{bar:30}] {pos}/{len} points, {eta} left",
        )
        .expect("valid template"),
    );
    let mut rows = Vec::new();
    let mut summaries = Vec::new();
    for group in groups(&plan) {
        let swept = sweep(&ctx, &base, &group, fractions, (window, repeats), &bar)?;
        for (config, mine) in group.into_iter().zip(swept) {
            summaries.extend(Summary::of(config, &mine));
            rows.extend(mine);
        }
    }
    bar.finish_and_clear();
    render::print_rows(&rows, &base);
    render::print_summaries(&summaries, &base);
    let acceptance = render::Acceptance::of(&summaries, &rows, &base);
    render::print_acceptance(&acceptance);
    println!(
        "(machine: {} CPUs, {}; {:.0} s)",
        super::report::Machine::current().nproc,
        super::report::Machine::current().cpu_model,
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.common.json {
        render::write_json(path, &base, &rows, &summaries, &acceptance)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.common.plot {
        render::plot(&rows, &base, path).with_context(|| format!("drawing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_and_buffer_sizes() {
        assert_eq!(MEAN_REQUEST, 284);
        assert_eq!(LARGEST_REQUEST, 640);
        let quick = Config::plan(true);
        assert_eq!(quick.len(), 6);
        assert!(quick.iter().all(|c| c.slo && c.workers == 1));
        let full = Config::plan(false);
        assert_eq!(full.len(), 14);
        let noslo = full
            .iter()
            .find(|c| c.mode == "per-connection-noslo")
            .unwrap();
        assert!(!noslo.slo);
        // The provisioning comparison is swept three at a time per connection count.
        let sizes: Vec<usize> = groups(&full).iter().map(Vec::len).collect();
        assert_eq!(sizes, [3, 3, 3, 1, 1, 1, 1, 1]);
        assert_eq!(
            groups(&quick).iter().map(Vec::len).collect::<Vec<_>>(),
            [2, 2, 2]
        );
        let shared = &full[0];
        assert_eq!(shared.depth_limit(), 8);
        // (8 + 1) requests of 640 B, doubled, to a power of two.
        assert_eq!(shared.buffer_bytes(), Some(16 * 1024));
        let two = full.iter().find(|c| c.mode == "shared/single/2w").unwrap();
        assert_eq!(two.depth_limit(), 17);
        assert_eq!(two.buffer_bytes(), Some(32 * 1024));
        let part = full
            .iter()
            .find(|c| c.mode == "per-worker/partitioned/2w")
            .unwrap();
        assert_eq!(part.depth_limit(), 8);
        assert_eq!(part.buffer_bytes(), Some(16 * 1024));
        assert_eq!(full[1].buffer_bytes(), None);
        assert_eq!(serde_plain(&Provisioning::PerConnection), "per-connection");
    }
}
