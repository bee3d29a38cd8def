//! `--fabric PATH`, shared by the tools that serve or reach a service.
//!
//! With `--fabric`, a tool serves or finds its service in the memory-fabric region at PATH
//! instead of in the socket directory: two processes that share only that file, in any
//! namespaces, reach each other. The serving tool makes the region if the file is missing
//! or empty (`--coherence`, `--fabric-size`); the others only join one that exists, so that a
//! client started first cannot make it with other options than the server's. The region is
//! joined for as long as the tool runs. This module never decides what a tool does with it.

use std::path::PathBuf;

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
