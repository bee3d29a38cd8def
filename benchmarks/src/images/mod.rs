//! `image_app`: a real application after DmRPC's evaluation (§VI, the image-processing
//! pipeline of DeathStarBench's media service): a 7-tier image service written as tonic
//! services the way a team would write them, run over tonic's own TCP transport, over netless
//! by value and over netless by reference, in one run.
//!
//! The tiers are ingest → decode → resize → filter → watermark → encode → store
//! (`proto/images.proto`, one service per tier, each its own process: the `tier` peer role,
//! [`tier`]). They do real work with the `image` crate ([`work`]): ingest checks the file's
//! header and stamps an id; decode turns the PNG or JPEG into RGB8 pixels; resize halves it
//! with a triangle filter; filter sharpens (3×3) and adds contrast; watermark blends a
//! generated mark into the bottom-right corner; encode makes a JPEG (quality 85); the store
//! checksums it, keeps the last 16 and answers a receipt, which goes back up the chain. The
//! pictures are made at start-up ([`picture`]: gradients, shapes and grain, one JPEG and one
//! PNG per `--sizes` entry) and sent in turn.
//!
//! Each tier is served twice, by two sets of seven processes: by tonic's HTTP/2 server on a
//! loopback port, calling the next tier through a tonic `Channel` (**tcp**), and by a netless
//! `GrpcServer`, calling the next tier through a netless `Channel` (**netless**). The service
//! code is the same; only the channel differs. Over netless a picture goes **by value** (in
//! the `image` field, as over tcp) or **by reference**: the client puts each picture in the
//! domain's page pool once and sends a fresh Ref per call in `image_ref`; each tier maps the
//! Ref, reads the pixels in place, writes its output into a `SharedBuf` and passes a Ref on
//! (ingest passes a new Ref to the same pages; watermark writes only the rows of its mark,
//! copy-on-write). The same handler serves both: "if `image_ref` is set, map it".
//!
//! The client ([`client`]) first times `--unloaded-calls` calls one at a time per transport
//! (the unloaded latency), then `--in-flight` calls at a time for a window (the closed-loop
//! peak), then offers open-loop Poisson load at the `--loads` fractions of each transport's
//! peak, a window per transport and load (longer at low rates, to see `--min-arrivals`
//! arrivals), the transports' order rotating from one load to the next. A call is timed from its scheduled arrival to its reply. Per window it reports
//! the achieved throughput, p50 and p99, and the CPU time (utime + stime from
//! `/proc/PID/stat`) of every tier process and of the client over the window, per completed
//! request and per tier, so the bounding tier shows. A transport's throughput at SLO is its
//! highest achieved throughput whose p99 is within 10× its own unloaded latency (the mean of
//! the sequential calls; [`report::SLO_FACTOR`] says why not their p50), and also within
//! tcp's SLO, one bound for all ([`report`]).
//!
//! The machine has two CPUs and the chain eight busy processes: nothing is pinned. A tcp tier
//! runs tonic on a 2-worker tokio runtime (what `#[tokio::main]` gives on two CPUs); a netless
//! tier has one runtime thread and `--in-flight` workers (a unary call holds its worker while
//! it waits for the next tier), which poll `--spin-us` before sleeping; every netless call to
//! a next tier sleeps at once (its reply is milliseconds away).

pub mod client;
pub mod picture;
pub mod report;
pub mod tier;
pub mod work;

use anyhow::Context as _;

use crate::harness::{CommonArgs, Peer, RunDir, Stop};
use client::{Command, Measured, Transport};
use report::{Point, Run};
use tier::{Serving, Stage};

/// The domain's name (unique per run because its socket directory is).
const DOMAIN: &str = "images";

/// `image_app`'s options.
#[derive(clap::Args, Debug)]
#[command(
    mut_arg("json", |a| a.help(
        "Write every window and the per-transport summary (throughput at SLO, ratios, CPU per \
         request and per tier) as JSON to this file"
    )),
    mut_arg("plot", |a| a.help(
        "Draw p99 against achieved throughput, and achieved against offered load, per \
         transport to this SVG file"
    )),
    mut_arg("quick", |a| a.help(
        "A few seconds: small pictures, two loads, short windows (for tests)"
    )),
)]
pub struct Args {
    /// Picture sizes, `WxH`: a JPEG and a PNG of each are sent in turn (the defaults make
    /// a request a few milliseconds of CPU).
    #[arg(long, value_delimiter = ',', default_value = "320x240,640x480")]
    pub sizes: Vec<String>,
    /// Offered loads, as fractions of each transport's closed-loop peak.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,1.1"
    )]
    pub loads: Vec<f64>,
    /// Length of each measured window, in ms [default: 3000, or 500 with --quick]; a window
    /// at a low rate lasts longer, up to 3×, to see `--min-arrivals` arrivals.
    #[arg(long)]
    pub window_ms: Option<u64>,
    /// Arrivals a window should see at least, so that its p99 is not its maximum
    /// [default: 250, or 0 with --quick].
    #[arg(long)]
    pub min_arrivals: Option<u64>,
    /// Calls in flight at most (the client's slots, and each netless tier's workers).
    #[arg(long, default_value_t = 16)]
    pub in_flight: usize,
    /// Sequential calls of the unloaded latency [default: 100, or 8 with --quick].
    #[arg(long)]
    pub unloaded_calls: Option<usize>,
    /// How long netless tiers' workers poll for a request before sleeping, in µs.
    #[arg(long, default_value_t = 5)]
    pub spin_us: u64,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// The peer roles.
#[derive(clap::Subcommand, Debug)]
pub enum Role {
    /// A tier of the chain.
    Tier(tier::TierArgs),
    /// The load.
    Client(client::ClientArgs),
}

/// Runs a peer role.
pub fn peer(role: Role) -> anyhow::Result<()> {
    match role {
        Role::Tier(args) => tier::serve(args),
        Role::Client(args) => client::serve(args),
    }
}

/// The processes of a run, stopped in reverse order of start when dropped.
struct Processes {
    /// Each tier's transport, stage and process.
    tiers: Vec<(Serving, Stage, Peer)>,
}

impl Drop for Processes {
    fn drop(&mut self) {
        while let Some(peer) = self.tiers.pop() {
            drop(peer);
        }
    }
}

/// Starts both sets of tiers, the store first, so each one's next tier is up.
fn start_tiers(run_dir: &RunDir, args: &Args) -> anyhow::Result<(Processes, String)> {
    let dir = run_dir.to_str()?;
    let mut processes = Processes { tiers: Vec::new() };
    let mut tcp_ingest = String::new();
    for serving in [Serving::Tcp, Serving::Netless] {
        let mut next: Option<String> = None;
        for &stage in Stage::ALL.iter().rev() {
            let mut words: Vec<String> = vec![
                "tier".into(),
                "--stage".into(),
                stage.name().to_lowercase(),
                "--dir".into(),
                dir.into(),
                "--workers".into(),
                args.in_flight.to_string(),
                "--spin-us".into(),
                args.spin_us.to_string(),
            ];
            words.extend(match serving {
                Serving::Tcp => ["--serving".into(), "tcp".into()],
                Serving::Netless => ["--serving".into(), "netless".into()],
            });
            if serving == Serving::Netless {
                words.extend(["--domain".into(), DOMAIN.into()]);
            }
            if let Some(next) = &next {
                words.extend(["--next".into(), next.clone()]);
            }
            let (peer, rest) = Peer::spawn(&words, "LISTENING", Stop::CloseStdin)
                .with_context(|| format!("starting {} over {serving:?}", stage.service()))?;
            next = Some(match serving {
                Serving::Tcp => format!("http://{rest}"),
                Serving::Netless => stage.service().to_string(),
            });
            processes.tiers.push((serving, stage, peer));
        }
        if serving == Serving::Tcp {
            tcp_ingest = next.unwrap_or_default();
        }
    }
    Ok((processes, tcp_ingest))
}

fn ask(client: &mut Peer, command: &Command) -> anyhow::Result<Measured> {
    let line = serde_json::to_string(command)?;
    client
        .ask(&line)
        .with_context(|| format!("the client's answer to {line}"))
}

/// Runs the benchmark.
pub fn run(mut args: Args) -> anyhow::Result<()> {
    let quick = args.common.quick;
    if quick {
        args.sizes = vec!["256x192".into()];
        args.loads = vec![0.3, 0.8];
    }
    anyhow::ensure!(
        !args.loads.is_empty() && args.loads.iter().all(|&f| f > 0.0),
        "--loads must be positive fractions"
    );
    anyhow::ensure!(args.in_flight > 0, "--in-flight must be positive");
    let sizes = args
        .sizes
        .iter()
        .map(|s| picture::parse_size(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let pictures = picture::generate(&sizes).map_err(anyhow::Error::msg)?;
    let window_ms = args.window_ms.unwrap_or(if quick { 500 } else { 3000 });
    let drain_ms = if quick { 500 } else { 2000 };
    let unloaded_calls = args.unloaded_calls.unwrap_or(if quick { 8 } else { 100 });
    let min_arrivals = args.min_arrivals.unwrap_or(if quick { 0 } else { 250 });

    let run_dir = RunDir::create("images")?;
    // This process founds the domain; the netless tiers and the client join it.
    let _domain = tier::join(DOMAIN, &run_dir.path)?;
    let (processes, tcp_ingest) = start_tiers(&run_dir, &args)?;
    let pids: Vec<u32> = processes.tiers.iter().map(|(_, _, p)| p.id()).collect();
    let mut words: Vec<String> = vec![
        "client".into(),
        "--dir".into(),
        run_dir.to_str()?.into(),
        "--domain".into(),
        DOMAIN.into(),
        "--tcp".into(),
        tcp_ingest,
        "--in-flight".into(),
        args.in_flight.to_string(),
        "--sizes".into(),
    ];
    words.push(args.sizes.join(","));
    let (mut client, _) = Peer::spawn(&words, "LISTENING", Stop::CloseStdin)?;

    let mut run = Run::new(&processes.tiers, &pictures, &args, window_ms);
    for &transport in &Transport::ALL {
        eprintln!("unloaded latency over {}", transport.name());
        let measured = ask(
            &mut client,
            &Command::Unloaded {
                transport,
                calls: unloaded_calls,
            },
        )?;
        run.unloaded.push((transport, measured));
    }
    for &transport in &Transport::ALL {
        eprintln!("closed-loop peak over {}", transport.name());
        let measured = ask(
            &mut client,
            &Command::Closed {
                transport,
                window_ms,
                pids: pids.clone(),
            },
        )?;
        run.peaks.push((transport, measured));
    }
    for (k, &fraction) in args.loads.iter().enumerate() {
        for j in 0..Transport::ALL.len() {
            // Rotated per load, so a drift of the host hits every transport alike.
            let transport = Transport::ALL[(j + k) % Transport::ALL.len()];
            let rate = fraction * run.peak_per_s(transport).max(1.0);
            let window_ms = (min_arrivals as f64 * 1e3 / rate)
                .clamp(window_ms as f64, 3.0 * window_ms as f64) as u64;
            eprintln!(
                "{} at {:.0}% of its peak: {rate:.1}/s",
                transport.name(),
                fraction * 100.0
            );
            let measured = ask(
                &mut client,
                &Command::Open {
                    transport,
                    rate,
                    window_ms,
                    drain_ms,
                    seed: (k * Transport::ALL.len() + j) as u64 + 1,
                    pids: pids.clone(),
                },
            )?;
            run.points.push(Point {
                transport,
                fraction,
                offered_per_s: rate,
                measured,
            });
        }
    }
    drop(client);
    drop(processes);
    run.print();
    if let Some(path) = &args.common.json {
        run.write_json(path)?;
    }
    if let Some(path) = &args.common.plot {
        report::plot(&run, path)?;
    }
    Ok(())
}
