//! The load of the cross-host chain, the `client` peer role: a process on host A that calls
//! `chain.Tier1` through a netless `Channel` (this host's gateway carries the call to host B)
//! with a number of calls in flight for a window, and answers what it measured. It takes
//! its commands as JSON lines on stdin ([`Command`]) and answers each with one JSON line.
//! By value the array is the request; by reference the client puts it on the memory node
//! (fresh for every call, as a by-value call sends it afresh), sends the reference and
//! releases it when the reply comes. Every reply's sum is checked.

use std::io::{BufRead as _, Write as _};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::Request;

use super::remote::Memory;
use super::tier::byte_sum;
use crate::harness::histogram::{new_histogram, quantile_us};
use crate::proto::chain::{HopReply, HopRequest};

/// The `client` peer role.
#[derive(clap::Args, Debug)]
pub struct ClientArgs {
    /// The memory node (`http://ADDR`).
    #[arg(long)]
    pub memnode: String,
    /// Host B's gateway (`http://ADDR`), for the direct remote latency.
    #[arg(long)]
    pub remote_gateway: String,
}

/// What the benchmark asks of the client.
#[derive(Deserialize, Debug)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Command {
    /// Calls down a chain of `hops` tiers with an array of `size` bytes, `in_flight` calls at
    /// once, for `window_ms`.
    Chain {
        hops: u32,
        size: usize,
        by_ref: bool,
        in_flight: usize,
        window_ms: u64,
    },
    /// `calls` sequential 64-byte calls to a last tier: `chain.Tier2` on this host
    /// (`local`), `chain.Tier1` on host B through this host's gateway (`egress`) or through
    /// host B's gateway straight over HTTP/2 (`direct`).
    Latency { via: Via, calls: usize },
}

/// Where a latency call goes.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    Local,
    Egress,
    Direct,
}

/// What one window measured.
#[derive(Serialize, Deserialize, Debug, Default, Clone)]
pub struct Measured {
    pub calls: u64,
    pub errors: u64,
    pub elapsed_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// The first failure's status, if any.
    pub first_error: Option<String>,
}

/// Runs the `client` role: answers commands until stdin closes.
pub fn serve(args: ClientArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let memory = Arc::new(runtime.block_on(Memory::open(&args.memnode, "client"))?);
    crate::harness::peer::listening("client")?;
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let command: Command = serde_json::from_str(&line?)?;
        let measured = runtime.block_on(run(&command, &memory, &args))?;
        writeln!(out, "{}", serde_json::to_string(&measured)?)?;
        out.flush()?;
    }
    Ok(())
}

async fn run(
    command: &Command,
    memory: &Arc<Memory>,
    args: &ClientArgs,
) -> anyhow::Result<Measured> {
    match *command {
        Command::Chain {
            hops,
            size,
            by_ref,
            in_flight,
            window_ms,
        } => {
            let channel = netless_grpc::Channel::target("chain.Tier1")?;
            let call = Caller::new(channel, "chain.Tier1", memory.clone(), size, by_ref, hops);
            // Warm-up: every tier's connections made, buffers used.
            for _ in 0..4 {
                call.once().await?;
            }
            Ok(call
                .window(in_flight, Duration::from_millis(window_ms))
                .await)
        }
        Command::Latency { via, calls } => {
            // One Channel type for the three paths: the target alone says where it goes.
            let (target, service) = match via {
                Via::Local => ("chain.Tier2", "chain.Tier2"),
                Via::Egress => ("chain.Tier1", "chain.Tier1"),
                Via::Direct => (args.remote_gateway.as_str(), "chain.Tier1"),
            };
            let channel = netless_grpc::Channel::target(target)?;
            let measured = Caller::new(channel, service, memory.clone(), 64, false, 1)
                .sequential(calls)
                .await;
            Ok(measured)
        }
    }
}

/// Calls of one kind to one tier.
struct Caller<T> {
    grpc: tonic::client::Grpc<T>,
    path: PathAndQuery,
    memory: Arc<Memory>,
    data: Arc<Vec<u8>>,
    sum: u64,
    by_ref: bool,
    hops: u32,
}

impl<T> Caller<T>
where
    T: tonic::client::GrpcService<tonic::body::Body> + Clone + Send + 'static,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
    T::Future: Send,
{
    fn new(
        channel: T,
        service: &str,
        memory: Arc<Memory>,
        size: usize,
        by_ref: bool,
        hops: u32,
    ) -> Self {
        let data: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
        let grpc = tonic::client::Grpc::new(channel)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        Caller {
            grpc,
            path: PathAndQuery::try_from(format!("/{service}/Hop")).expect("a valid path"),
            memory,
            sum: byte_sum(&data),
            data: Arc::new(data),
            by_ref,
            hops,
        }
    }

    /// One call, its sum checked.
    async fn once(&self) -> Result<(), tonic::Status> {
        let mut request = HopRequest {
            hops: self.hops,
            ..HopRequest::default()
        };
        if self.by_ref {
            request.remote_ref = self.memory.put(&self.data).await?;
        } else {
            request.data = self.data.as_ref().clone();
        }
        let reference = request.remote_ref.clone();
        let mut grpc = self.grpc.clone();
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.into().to_string()))?;
        let codec = tonic_prost::ProstCodec::<HopRequest, HopReply>::default();
        let reply = grpc
            .unary(Request::new(request), self.path.clone(), codec)
            .await;
        if self.by_ref {
            self.memory.release(&reference).await?;
        }
        let reply = reply?.into_inner();
        if reply.sum != self.sum {
            return Err(tonic::Status::data_loss(format!(
                "tier {} summed {} instead of {}",
                reply.last, reply.sum, self.sum
            )));
        }
        Ok(())
    }

    /// `calls` calls one after the other.
    async fn sequential(&self, calls: usize) -> Measured {
        let mut hist = new_histogram();
        let mut measured = Measured::default();
        let started = Instant::now();
        for _ in 0..calls {
            let t = Instant::now();
            match self.once().await {
                Ok(()) => hist.saturating_record(t.elapsed().as_nanos() as u64),
                Err(e) => note_error(&mut measured, &e),
            }
        }
        finish(measured, &hist, started.elapsed())
    }

    /// `in_flight` calls at a time for `window`.
    async fn window(&self, in_flight: usize, window: Duration) -> Measured
    where
        Self: Sync,
    {
        let deadline = Instant::now() + window;
        let started = Instant::now();
        let tasks: Vec<_> = (0..in_flight)
            .map(|_| {
                let me = self.clone_for_task();
                tokio::spawn(async move {
                    let mut hist = new_histogram();
                    let mut measured = Measured::default();
                    while Instant::now() < deadline {
                        let t = Instant::now();
                        match me.once().await {
                            Ok(()) => hist.saturating_record(t.elapsed().as_nanos() as u64),
                            Err(e) => note_error(&mut measured, &e),
                        }
                    }
                    (measured, hist)
                })
            })
            .collect();
        let mut all = new_histogram();
        let mut measured = Measured::default();
        for task in tasks {
            let Ok((part, hist)) = task.await else {
                measured.errors += 1;
                continue;
            };
            measured.errors += part.errors;
            measured.first_error = measured.first_error.or(part.first_error);
            let _ = all.add(&hist);
        }
        finish(measured, &all, started.elapsed())
    }

    fn clone_for_task(&self) -> Caller<T> {
        Caller {
            grpc: self.grpc.clone(),
            path: self.path.clone(),
            memory: self.memory.clone(),
            data: self.data.clone(),
            sum: self.sum,
            by_ref: self.by_ref,
            hops: self.hops,
        }
    }
}

fn note_error(measured: &mut Measured, error: &tonic::Status) {
    measured.errors += 1;
    if measured.first_error.is_none() {
        measured.first_error = Some(format!("{:?}: {}", error.code(), error.message()));
    }
}

fn finish(mut measured: Measured, hist: &Histogram<u64>, elapsed: Duration) -> Measured {
    measured.calls = hist.len();
    measured.elapsed_s = elapsed.as_secs_f64();
    measured.p50_us = quantile_us(hist, 0.5);
    measured.p99_us = quantile_us(hist, 0.99);
    measured
}
