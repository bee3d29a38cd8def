//! `--fabric PATH`, shared by the tools that serve or reach a service, and `netless fabric
//! ls`, which lists what a region holds.
//!
//! With `--fabric`, a tool serves or finds its service in the memory-fabric region at PATH
//! instead of in the socket directory: two processes that share only that file, in any
//! namespaces, reach each other. The serving tool makes the region if the file is missing
//! or empty (`--coherence`, `--fabric-size`); the others only join one that exists, so that a
//! client started first cannot make it with other options than the server's. The region is
//! joined for as long as the tool runs. This module never decides what a tool does with it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use netless::fabric::{Coherence, Fabric, FabricOptions};
use netless::{Code, Status};

/// The options that put a serving tool in a memory fabric (flattened into its arguments).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct FabricArgs {
    /// Serve in the memory-fabric region at PATH (a file on a tmpfs, hugetlbfs or DAX mount,
    /// or a DAX device) instead of the socket directory; the region is made if the file is
    /// missing or empty.
    #[arg(long, value_name = "PATH")]
    pub fabric: Option<PathBuf>,
    /// Coherence of a region created now: hardware or software (an existing region keeps
    /// its own).
    #[arg(long, requires = "fabric", value_name = "MODE")]
    pub coherence: Option<Coherence>,
    /// Size of a region created now, in bytes (an existing region keeps its own).
    #[arg(long, requires = "fabric", value_name = "BYTES")]
    pub fabric_size: Option<u64>,
}

impl FabricArgs {
    /// The region `--fabric` names, joined; `None` without `--fabric`.
    ///
    /// # Errors
    /// If the region cannot be opened, created or joined (the reason says why).
    pub fn open(&self) -> anyhow::Result<Option<Fabric>> {
        let Some(path) = &self.fabric else {
            return Ok(None);
        };
        let defaults = FabricOptions::default();
        let options = FabricOptions {
            size: self.fabric_size.unwrap_or(defaults.size),
            coherence: self.coherence.unwrap_or(defaults.coherence),
            ..defaults
        };
        let fabric = Fabric::open(path, &options)
            .with_context(|| format!("opening the fabric region {}", path.display()))?;
        Ok(Some(fabric))
    }
}

/// The option that makes a calling tool find its service in a memory fabric.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct JoinArgs {
    /// Find the service in the memory-fabric region at PATH (the file its server was started
    /// with, `echo-server --fabric PATH`) instead of the socket directory.
    #[arg(long, value_name = "PATH")]
    pub fabric: Option<PathBuf>,
}

impl JoinArgs {
    /// The region `--fabric` names, joined; `None` without `--fabric`.
    ///
    /// # Errors
    /// UNAVAILABLE if there is no region at the path yet (its server has not made it);
    /// FAILED_PRECONDITION if it cannot be opened or joined (the reason says why).
    pub fn join(&self) -> Result<Option<Fabric>, Status> {
        let Some(path) = &self.fabric else {
            return Ok(None);
        };
        if std::fs::metadata(path).map_or(true, |m| m.file_type().is_file() && m.len() == 0) {
            return Err(Status::unavailable(format!(
                "no fabric region at {}: is the server running, started with --fabric {0}?",
                path.display()
            )));
        }
        Fabric::open(path, &FabricOptions::default())
            .map(Some)
            .map_err(|e| {
                Status::new(
                    Code::FailedPrecondition,
                    format!("cannot join the fabric: {e}"),
                )
            })
    }
}

/// Command-line arguments of `netless fabric`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub action: Action,
}

/// What `netless fabric` does.
#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// List a region's members (alive or not) and its directory's entries.
    Ls {
        /// The region's file (or DAX device); it must hold a region already.
        path: PathBuf,
    },
}

/// Runs `netless fabric ACTION`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.action {
        Action::Ls { path } => ls(&path),
    }
}

/// Prints the region's size and coherence, its members and its entries. Looking joins the
/// region as a member for as long as it takes (listed as `(this)`); a member's pid and uid
/// are as it wrote them, in its own namespaces.
fn ls(path: &Path) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        std::fs::metadata(path).is_ok_and(|m| !m.file_type().is_file() || m.len() > 0),
        "no fabric region at {}: give the file a server was started with (--fabric)",
        path.display()
    );
    let fabric = JoinArgs {
        fabric: Some(path.to_owned()),
    }
    .join()
    .map_err(|e| anyhow::anyhow!("{}", e.message()))?
    .context("a fabric path was given")?;
    println!(
        "fabric {}: {} coherence, lease {} ms, heap {} of {} bytes free",
        path.display(),
        fabric.coherence(),
        fabric.lease().as_millis(),
        fabric.free_bytes(),
        fabric.heap_bytes()
    );
    println!();
    println!(
        "{:<8} {:<10} {:>8} {:>6} {:<6} ALIVE",
        "MEMBER", "STATE", "PID", "UID", "KERNEL"
    );
    let me = fabric.member();
    for m in fabric.members() {
        let alive = if m.id == me {
            "(this)"
        } else if fabric.is_alive(m.id) {
            "yes"
        } else {
            "no"
        };
        println!(
            "{:<8} {:<10} {:>8} {:>6} {:<6} {}",
            format!("{}.{}", m.id.index, m.id.generation),
            m.state,
            m.pid,
            m.uid,
            if fabric.same_kernel(m.id) {
                "this"
            } else {
                "other"
            },
            alive
        );
    }
    println!();
    println!(
        "{:<6} {:<32} {:<8} {:>8} ALIVE",
        "ENTRY", "SERVICE", "MEMBER", "BYTES"
    );
    for e in fabric.entries() {
        let name = match e.replica {
            Some(r) => format!("{}#{r}", e.name),
            None => e.name.clone(),
        };
        let bytes: u64 = e.extents.iter().map(|x| x.len).sum();
        println!(
            "{:<6} {:<32} {:<8} {:>8} {}",
            e.index,
            name,
            format!("{}.{}", e.owner.index, e.owner.generation),
            bytes,
            if fabric.is_alive(e.owner) {
                "yes"
            } else {
                "no"
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}
