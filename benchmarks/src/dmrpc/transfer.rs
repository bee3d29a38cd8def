//! The by-value / by-reference crossover: from which payload size a request is cheaper to
//! send as a Ref through the domain's page pool than by value through the receive buffer.
//!
//! One client process (this one) and one server process (the `transfer-server` peer role)
//! join one domain. The server's handler reads every byte of the payload (sums it) and replies
//! with 8 bytes, so both variants pay for the receiver touching the data. Two connections
//! differ only in `ref_threshold` (0: every payload by reference; `usize::MAX`: by value);
//! calls alternate between them in rounds, so drifts in the machine's load hit both alike.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use netless::fabric::{Fabric, FabricOptions};
use netless::netless_pool::{Domain, DomainConfig};
use netless::{
    CallOptions, Client, ClientConfig, Request, ResponseBuilder, Server, ServerConfig, Status,
};
use serde::Serialize;

use crate::harness::histogram::{new_histogram, quantile_us};
use crate::harness::table::{fmt_bytes, fmt_us};
use crate::harness::{peer, Peer, Stop};

/// One payload size: sequential call latency by value and by reference.
#[derive(Serialize, Clone, Debug)]
pub(super) struct TransferRow {
    /// Payload bytes.
    pub payload_bytes: usize,
    /// Median call latency by value, µs.
    pub by_value_p50_us: f64,
    /// Median call latency by reference, µs.
    pub by_ref_p50_us: f64,
    /// Mean call latency by value, µs.
    pub by_value_avg_us: f64,
    /// Mean call latency by reference, µs.
    pub by_ref_avg_us: f64,
    /// by_value_p50 / by_ref_p50: above 1, the Ref is faster.
    pub speedup: f64,
}

/// The crossover: the smallest measured size at which by reference was faster.
pub(super) fn crossover(rows: &[TransferRow]) -> Option<usize> {
    rows.iter()
        .find(|r| r.speedup > 1.0)
        .map(|r| r.payload_bytes)
}

/// The server's handler: sum the payload as u64 words, reply with the sum.
fn sum_handler<'a>(req: &Request<'a>, resp: &mut ResponseBuilder<'a>) -> Result<(), Status> {
    let mut sum = 0u64;
    let mut words = req.payload.chunks_exact(8);
    for w in &mut words {
        sum = sum.wrapping_add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
    }
    for &b in words.remainder() {
        sum = sum.wrapping_add(u64::from(b));
    }
    resp.payload.extend_from_slice(&sum.to_le_bytes());
    Ok(())
}

/// The `transfer-server` peer role.
#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    /// The run's socket directory (services and the domain).
    #[arg(long)]
    pub dir: PathBuf,
    /// The domain to join.
    #[arg(long)]
    pub domain: String,
    /// The service to serve.
    #[arg(long)]
    pub service: String,
    /// Pin the server to this CPU.
    #[arg(long)]
    pub pin_cpu: Option<usize>,
    /// Serve in this memory fabric region, and join the domain's pool there.
    #[arg(long)]
    pub fabric: Option<PathBuf>,
}

/// The `transfer-server` peer role: joins `--domain` in `--dir`, serves `--service` until
/// stdin closes.
pub(super) fn serve(args: ServerArgs) -> anyhow::Result<()> {
    let ServerArgs {
        dir,
        domain,
        service,
        pin_cpu,
        fabric,
    } = args;
    if let Some(cpu) = pin_cpu {
        netless_shm::pin_current_thread(cpu)?;
    }
    let mut config = DomainConfig::new(&domain);
    config.dir = Some(dir.clone());
    let fabric = match fabric {
        Some(path) => Some(Fabric::open(&path, &FabricOptions::default())?),
        None => None,
    };
    let domain = match &fabric {
        Some(fabric) => Domain::join_fabric(&config, fabric)?,
        None => Domain::join(&config)?,
    };
    let server_config = ServerConfig {
        dir: Some(dir),
        fabric,
        domain: Some(domain),
        pin_cpus: pin_cpu.into_iter().collect(),
        max_message: 16 << 20,
        ..Default::default()
    };
    let _server = Server::bind(&service, server_config, sum_handler)?;
    peer::listening(&service)?;
    peer::until_stdin_closes();
    Ok(())
}

/// Measures the crossover from this process, a member of domain `name` (socket directory
/// `dir`), against a spawned server on `peer_cpu` that joins the same domain.
pub(super) fn measure(
    (dir, name, domain): (&Path, &str, &Domain),
    fabric: Option<&Fabric>,
    sizes: &[usize],
    calls_per_size: u64,
    peer_cpu: Option<usize>,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<TransferRow>> {
    let service = "bench.Transfer";
    let cpu = peer_cpu.map(|c| c.to_string());
    let dir_s = dir.to_string_lossy().into_owned();
    let fabric_s = fabric.map(|f| f.path().to_string_lossy().into_owned());
    let mut args = vec![
        "transfer-server",
        "--dir",
        &dir_s,
        "--domain",
        &name,
        "--service",
        service,
    ];
    if let Some(cpu) = &cpu {
        args.extend(["--pin-cpu", cpu]);
    }
    if let Some(path) = &fabric_s {
        args.extend(["--fabric", path]);
    }
    let (_peer, _) = Peer::spawn(&args, "LISTENING", Stop::CloseStdin)?;
    let connect = |threshold: usize| {
        Client::connect_with(
            service,
            ClientConfig {
                dir: Some(dir.to_path_buf()),
                fabric: fabric.cloned(),
                domain: Some(domain.clone()),
                ref_threshold: threshold,
                max_message: 16 << 20,
                ..Default::default()
            },
        )
    };
    let by_value = connect(usize::MAX)?;
    let by_ref = connect(0)?;
    let opts = CallOptions::new().timeout(Duration::from_secs(30));
    let mut rows = Vec::new();
    const ROUNDS: u64 = 10;
    for &size in sizes {
        let payload: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let expect = {
            let mut b = ResponseBuilder::default();
            let req = Request {
                method: "Sum",
                metadata: Default::default(),
                payload: &payload,
                deadline: None,
            };
            sum_handler(&req, &mut b).expect("sum");
            b.payload
        };
        let mut hists = [new_histogram(), new_histogram()];
        // Warm both paths (page faults, leases, caches).
        for client in [&by_value, &by_ref] {
            for _ in 0..20 {
                client.call("Sum", &payload, &opts)?;
            }
        }
        let per_round = calls_per_size.div_ceil(ROUNDS).max(1);
        for _ in 0..ROUNDS {
            for (k, client) in [&by_value, &by_ref].into_iter().enumerate() {
                for _ in 0..per_round {
                    let t = Instant::now();
                    let reply = client.call("Sum", &payload, &opts)?;
                    hists[k].saturating_record(t.elapsed().as_nanos() as u64);
                    anyhow::ensure!(reply.payload == expect, "wrong sum at {size} bytes");
                }
                progress.inc(per_round);
            }
        }
        let (v, r) = (quantile_us(&hists[0], 0.5), quantile_us(&hists[1], 0.5));
        rows.push(TransferRow {
            payload_bytes: size,
            by_value_p50_us: v,
            by_ref_p50_us: r,
            by_value_avg_us: hists[0].mean() / 1e3,
            by_ref_avg_us: hists[1].mean() / 1e3,
            speedup: v / r.max(1e-9),
        });
    }
    Ok(rows)
}

/// The region and pool of the fabric rows: a hardware-coherence region on `/dev/shm` (else
/// the temp directory), removed when the returned guard drops, and this process's
/// membership of domain `name`'s pool in it.
pub(super) fn fabric_domain(name: &str) -> anyhow::Result<(FabricFile, Fabric, Domain)> {
    let shm = PathBuf::from("/dev/shm");
    let dir = if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    };
    let file = FabricFile(dir.join(format!("netless-bench-transfer-{}", std::process::id())));
    let _ = std::fs::remove_file(&file.0);
    let fabric = Fabric::open(
        &file.0,
        &FabricOptions {
            size: 512 << 20,
            ..FabricOptions::default()
        },
    )?;
    let mut config = DomainConfig::new(name);
    config.geometry = netless::netless_pool::PoolGeometry {
        pages: 32768,
        ref_slots: 4096,
    };
    let domain = Domain::join_fabric(&config, &fabric)?;
    Ok((file, fabric, domain))
}

/// A region file of the run, removed on drop.
#[derive(Debug)]
pub(super) struct FabricFile(PathBuf);

impl Drop for FabricFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Prints the crossover table (`where_`: what the connections go through).
pub(super) fn print(rows: &[TransferRow], where_: &str) {
    println!("\nby value vs by reference{where_} (sequential calls; the server reads every byte)");
    println!(
        "{:>10} {:>12} {:>12} {:>9}",
        "payload", "value p50", "ref p50", "value/ref"
    );
    for r in rows {
        println!(
            "{:>10} {:>12} {:>12} {:>8.2}x",
            fmt_bytes(r.payload_bytes),
            fmt_us(r.by_value_p50_us),
            fmt_us(r.by_ref_p50_us),
            r.speedup
        );
    }
    match crossover(rows) {
        Some(at) => {
            println!(
                "crossover: by reference is first faster at {}",
                fmt_bytes(at)
            );
            let slower: Vec<String> = rows
                .iter()
                .filter(|r| r.payload_bytes > at && r.speedup < 1.0)
                .map(|r| fmt_bytes(r.payload_bytes))
                .collect();
            if !slower.is_empty() {
                println!("  (but slower again at {})", slower.join(", "));
            }
        }
        None => println!("crossover: by reference was faster at no measured size"),
    }
}
