//! The load of the image application, the `client` peer role: one process that calls
//! `images.Ingest/Process` through the generated tonic client, on a tonic `Channel` to the
//! tcp ingest's port or on a netless `Channel`, with the picture in the message (tcp, by
//! value) or, by reference, as a fresh Ref to a pool buffer it filled once per picture. It
//! takes its commands as JSON lines on stdin ([`Command`]) and answers each with one JSON line
//! ([`Measured`]).
//!
//! Open-loop load: arrivals are a Poisson process at the offered rate; a call is timed from
//! its scheduled arrival to its reply, so time spent waiting for one of the `--in-flight`
//! call slots (the client's and the tiers' concurrency) counts. Arrivals still waiting for a
//! slot when the drain time after the window ends are given up, counted as `unfinished`
//! with the time they waited as their latency. Every reply is checked against what the
//! pipeline computes locally on the same picture (size, length and checksum of the stored
//! JPEG). The CPU time of the processes named in the command and of this one is read at the
//! window's start and end.

use std::io::{BufRead as _, Write as _};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use netless_pool::SharedBuf;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use super::picture::{self, Picture};
use super::tier::{self, Stage};
use super::work;
use crate::harness::histogram::{mean_us, new_histogram, quantile_us};
use crate::harness::noise::{cpu_time, machine_busy};
use crate::proto::images::{Image, Receipt};

/// The `client` peer role.
#[derive(clap::Args, Debug)]
pub struct ClientArgs {
    /// The run's socket directory.
    #[arg(long)]
    pub dir: PathBuf,
    /// The run's domain.
    #[arg(long)]
    pub domain: String,
    /// The tcp ingest tier (`http://ADDR`).
    #[arg(long)]
    pub tcp: String,
    /// Picture sizes (`WxH`, comma-separated), as the benchmark's `--sizes`.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<String>,
    /// Calls in flight at most.
    #[arg(long)]
    pub in_flight: usize,
}

/// The three ways a picture goes down the chain.
#[derive(clap::ValueEnum, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// tonic over loopback TCP, the picture in the messages.
    Tcp,
    /// netless, the picture in the messages.
    ByValue,
    /// netless, the picture in the domain's pool, Refs in the messages.
    ByRef,
}

impl Transport {
    pub const ALL: [Transport; 3] = [Transport::Tcp, Transport::ByValue, Transport::ByRef];

    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::ByValue => "by_value",
            Transport::ByRef => "by_ref",
        }
    }
}

/// What the benchmark asks of the client.
#[derive(Deserialize, Serialize, Debug)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Command {
    /// `calls` calls one at a time.
    Unloaded { transport: Transport, calls: usize },
    /// `--in-flight` calls at a time for `window_ms`.
    Closed {
        transport: Transport,
        window_ms: u64,
        pids: Vec<u32>,
    },
    /// Poisson arrivals at `rate` per second for `window_ms`.
    Open {
        transport: Transport,
        rate: f64,
        window_ms: u64,
        drain_ms: u64,
        seed: u64,
        pids: Vec<u32>,
    },
}

/// What one window measured.
#[derive(Serialize, Deserialize, Debug, Default, Clone)]
pub struct Measured {
    /// Replies received within the window.
    pub calls: u64,
    /// Replies received in all (also while draining).
    pub completed: u64,
    pub errors: u64,
    /// Arrivals given up while waiting for a call slot.
    pub unfinished: u64,
    /// Replies whose receipt differs from the local pipeline's.
    pub mismatches: u64,
    pub window_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    /// CPU time over the window of each process named in the command, in ms.
    pub cpu_ms: Vec<f64>,
    /// This process's CPU time over the window, in ms.
    pub client_cpu_ms: f64,
    /// The whole machine's busy CPU time over the window (`/proc/stat`, all but idle and
    /// iowait), in ms: what other processes took shows against the above.
    pub machine_cpu_ms: f64,
    pub first_error: Option<String>,
}

/// What the store must receive for each picture.
#[derive(Clone, Copy, Debug)]
struct Expected {
    width: u32,
    height: u32,
    length: u64,
    checksum: u64,
}

struct Load {
    pictures: Vec<Picture>,
    expected: Vec<Expected>,
    /// Each picture in the pool, shared afresh for every by-reference call.
    pooled: Vec<SharedBuf>,
    tcp: tonic::transport::Channel,
    netless: netless_grpc::Channel,
    in_flight: usize,
}

/// Runs the `client` role: answers commands until stdin closes.
pub fn serve(args: ClientArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let sizes = args
        .sizes
        .iter()
        .map(|s| picture::parse_size(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let pictures = picture::generate(&sizes).map_err(anyhow::Error::msg)?;
    let mark = work::mark();
    let expected = pictures
        .iter()
        .map(|p| {
            work::pipeline(&p.encoded, &mark).map(|(width, height, length, checksum)| Expected {
                width,
                height,
                length: length as u64,
                checksum,
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let domain = tier::join(&args.domain, &args.dir)?;
    let pooled = pictures
        .iter()
        .map(|p| domain.alloc_from(&p.encoded))
        .collect::<Result<Vec<_>, _>>()?;
    let load = runtime.block_on(async {
        anyhow::Ok(Arc::new(Load {
            tcp: tonic::transport::Endpoint::from_shared(args.tcp.clone())?
                .tcp_nodelay(true)
                .connect_lazy(),
            netless: netless_grpc::Channel::connect_with(
                Stage::Ingest.service(),
                tier::client_config(&args.dir),
            )?,
            pictures,
            expected,
            pooled,
            in_flight: args.in_flight.max(1),
        }))
    })?;
    crate::harness::peer::listening("client")?;
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let command: Command = serde_json::from_str(&line?)?;
        let measured = runtime.block_on(run(&load, command));
        writeln!(out, "{}", serde_json::to_string(&measured)?)?;
        out.flush()?;
    }
    Ok(())
}

async fn run(load: &Arc<Load>, command: Command) -> Measured {
    let transport = match &command {
        Command::Unloaded { transport, .. }
        | Command::Closed { transport, .. }
        | Command::Open { transport, .. } => *transport,
    };
    // Warm-up: every tier's connection made and every picture through once.
    for i in 0..load.pictures.len() * 2 {
        let _ = load.once(transport, i).await;
    }
    match command {
        Command::Unloaded { calls, .. } => load.unloaded(transport, calls).await,
        Command::Closed {
            window_ms, pids, ..
        } => {
            load.clone()
                .closed(transport, Duration::from_millis(window_ms), &pids)
                .await
        }
        Command::Open {
            rate,
            window_ms,
            drain_ms,
            seed,
            pids,
            ..
        } => {
            let window = Duration::from_millis(window_ms);
            let drain = Duration::from_millis(drain_ms);
            load.clone()
                .open(transport, rate, window, drain, seed, &pids)
                .await
        }
    }
}

/// What the calls of a window gathered.
struct Tally {
    hist: Histogram<u64>,
    measured: Measured,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            hist: new_histogram(),
            measured: Measured::default(),
        }
    }

    fn record(&mut self, result: Result<(), Outcome>, latency: Duration, in_window: bool) {
        let m = &mut self.measured;
        match result {
            Ok(()) => {
                m.completed += 1;
                m.calls += u64::from(in_window);
            }
            Err(Outcome::Mismatch(why)) => {
                m.mismatches += 1;
                m.first_error.get_or_insert(why);
            }
            Err(Outcome::Failed(status)) => {
                m.errors += 1;
                m.first_error
                    .get_or_insert_with(|| format!("{:?}: {}", status.code(), status.message()));
            }
            Err(Outcome::GivenUp) => m.unfinished += 1,
        }
        self.hist.saturating_record(latency.as_nanos() as u64);
    }

    fn finish(mut self, window: Duration, cpu: Option<Cpu>) -> Measured {
        let m = &mut self.measured;
        m.window_s = window.as_secs_f64();
        m.p50_us = quantile_us(&self.hist, 0.5);
        m.p99_us = quantile_us(&self.hist, 0.99);
        m.mean_us = mean_us(&self.hist);
        if let Some(cpu) = cpu {
            m.cpu_ms = cpu.pids;
            m.client_cpu_ms = cpu.client;
            m.machine_cpu_ms = cpu.machine;
        }
        self.measured
    }
}

enum Outcome {
    Failed(tonic::Status),
    Mismatch(String),
    GivenUp,
}

/// CPU time over a window, ms.
struct Cpu {
    pids: Vec<f64>,
    client: f64,
    machine: f64,
}

/// CPU times so far: of each pid, of this process and of the whole machine.
type CpuMark = (Vec<Duration>, Duration, Duration);

fn cpu_now(pids: &[u32]) -> CpuMark {
    (
        pids.iter().map(|&p| cpu_time(p)).collect(),
        cpu_time(std::process::id()),
        machine_busy(),
    )
}

fn cpu_since(start: &CpuMark, pids: &[u32]) -> Cpu {
    let end = cpu_now(pids);
    let ms = |a: Duration, b: Duration| b.saturating_sub(a).as_secs_f64() * 1e3;
    Cpu {
        pids: start
            .0
            .iter()
            .zip(&end.0)
            .map(|(&a, &b)| ms(a, b))
            .collect(),
        client: ms(start.1, end.1),
        machine: ms(start.2, end.2),
    }
}

impl Load {
    /// One call with picture `i % pictures`, its receipt checked.
    async fn once(&self, transport: Transport, i: usize) -> Result<(), Outcome> {
        let i = i % self.pictures.len();
        let picture = &self.pictures[i];
        let mut image = Image {
            width: picture.width,
            height: picture.height,
            format: picture.format as i32,
            ..Image::default()
        };
        let receipt = match transport {
            Transport::Tcp => {
                image.image = picture.encoded.clone();
                tier::call(Stage::Ingest, self.tcp.clone(), image).await
            }
            Transport::ByValue => {
                image.image = picture.encoded.clone();
                tier::call(Stage::Ingest, self.netless.clone(), image).await
            }
            Transport::ByRef => {
                let r = self.pooled[i].share().map_err(|e| {
                    Outcome::Failed(tonic::Status::resource_exhausted(e.to_string()))
                })?;
                image.image_ref = r.to_bytes().to_vec();
                tier::call(Stage::Ingest, self.netless.clone(), image).await
            }
        };
        let receipt = receipt.map_err(Outcome::Failed)?;
        check(&receipt, &self.expected[i]).map_err(Outcome::Mismatch)
    }

    async fn unloaded(&self, transport: Transport, calls: usize) -> Measured {
        let mut tally = Tally::new();
        let started = Instant::now();
        for i in 0..calls {
            let t = Instant::now();
            let result = self.once(transport, i).await;
            tally.record(result, t.elapsed(), true);
        }
        tally.finish(started.elapsed(), None)
    }

    async fn closed(
        self: Arc<Self>,
        transport: Transport,
        window: Duration,
        pids: &[u32],
    ) -> Measured {
        let tally = Arc::new(Mutex::new(Tally::new()));
        let cpu = cpu_now(pids);
        let started = Instant::now();
        let end = started + window;
        // One sequence of pictures for all the tasks, as the open loop's arrivals take them:
        // a picture per task would let the cheap pictures' tasks make most of the calls.
        let next = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..self.in_flight)
            .map(|_| {
                let (me, tally, next) = (self.clone(), tally.clone(), next.clone());
                tokio::spawn(async move {
                    while Instant::now() < end {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let t = Instant::now();
                        let result = me.once(transport, i).await;
                        let done = Instant::now();
                        lock(&tally).record(result, done - t, done <= end);
                    }
                })
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
        let cpu = cpu_since(&cpu, pids);
        take(tally).finish(window, Some(cpu))
    }

    async fn open(
        self: Arc<Self>,
        transport: Transport,
        rate: f64,
        window: Duration,
        drain: Duration,
        seed: u64,
        pids: &[u32],
    ) -> Measured {
        let tally = Arc::new(Mutex::new(Tally::new()));
        let slots = Arc::new(Semaphore::new(self.in_flight));
        let mut rng = seed | 1;
        let cpu = cpu_now(pids);
        let started = tokio::time::Instant::now();
        let end = started + window;
        let mut at = started;
        let mut tasks = Vec::new();
        for i in 0.. {
            at += Duration::from_secs_f64(exponential(&mut rng) / rate.max(1e-3));
            if at >= end {
                break;
            }
            tokio::time::sleep_until(at).await;
            let (me, tally, slots) = (self.clone(), tally.clone(), slots.clone());
            tasks.push(tokio::spawn(async move {
                let result = match slots.acquire_owned().await {
                    Ok(_slot) => me.once(transport, i).await,
                    Err(_) => Err(Outcome::GivenUp),
                };
                let done = tokio::time::Instant::now();
                lock(&tally).record(result, done - at, done <= end);
            }));
        }
        tokio::time::sleep_until(end).await;
        let cpu = cpu_since(&cpu, pids);
        let mut all = tokio::spawn(async move {
            for task in tasks {
                let _ = task.await;
            }
        });
        if tokio::time::timeout_at(end + drain, &mut all)
            .await
            .is_err()
        {
            // Arrivals still waiting for a slot are given up; calls under way finish.
            slots.close();
            let _ = all.await;
        }
        let mut measured = take(tally).finish(window, Some(cpu));
        measured.window_s = window.as_secs_f64();
        measured
    }
}

/// An exponential variate of mean 1 (xorshift64* uniform).
fn exponential(state: &mut u64) -> f64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    let bits = state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
    let uniform = (bits as f64 + 1.0) / (1u64 << 53) as f64;
    -uniform.ln()
}

fn check(receipt: &Receipt, want: &Expected) -> Result<(), String> {
    let got = (
        receipt.width,
        receipt.height,
        receipt.length,
        receipt.checksum,
    );
    let expected = (want.width, want.height, want.length, want.checksum);
    if got == expected && receipt.stored > 0 {
        Ok(())
    } else {
        Err(format!(
            "the store received {got:?} (width, height, length, checksum) instead of {expected:?}"
        ))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn take(tally: Arc<Mutex<Tally>>) -> Tally {
    match Arc::try_unwrap(tally) {
        Ok(m) => m.into_inner().unwrap_or_else(|e| e.into_inner()),
        Err(shared) => std::mem::replace(&mut *lock(&shared), Tally::new()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn exponential_variates_have_mean_one() {
        let mut state = 7;
        let n = 100_000;
        let mean = (0..n).map(|_| super::exponential(&mut state)).sum::<f64>() / n as f64;
        assert!((mean - 1.0).abs() < 0.02, "{mean}");
    }
}
