//! The echo rows through a memory fabric: the same user's echo server and the same raw-bytes
//! calls as `netless-raw`, but server and client meet in a fabric region (a file on
//! `/dev/shm`, else the temp directory) instead of the socket directory: the replica, the
//! connection segment and the connect slot are in the region, and the liveness of each side
//! is its membership. A row is one [`FabricRow`]; the region, made here with the row's
//! coherence before the server starts, is removed when the run ends. It never measures.

use std::path::PathBuf;

use anyhow::Context as _;
use netless::fabric::{Coherence, Fabric, FabricOptions};
use netless::ClientConfig;

use super::Setup;

/// One fabric row of the table.
#[derive(Clone, Copy, Debug)]
pub(super) struct FabricRow {
    /// The row's `transport` in the table and the JSON.
    pub(super) transport: &'static str,
    /// What the row is, in words.
    pub(super) label: &'static str,
    /// The coherence its region is made with.
    pub(super) coherence: Coherence,
}

/// The fabric rows measured, beside `netless-raw`: a region of each coherence (the server
/// and client read it from the region). Software coherence runs its calls over polled rings
/// with real cache-line write-backs and invalidations (`clwb`/`clflushopt`), on this
/// coherent machine: what they cost, not what a non-coherent fabric would add.
pub(super) const FABRIC_ROWS: [FabricRow; 2] = [
    FabricRow {
        transport: "netless-fabric-hw",
        label: "netless fabric (hardware coherence)",
        coherence: Coherence::Hardware,
    },
    FabricRow {
        transport: "netless-fabric-sw",
        label: "netless fabric (software coherence, flushes)",
        coherence: Coherence::Software,
    },
];

/// Bytes of a region: the server's replica and the client's connection segment, with room.
const REGION_BYTES: u64 = 64 << 20;

/// A region file of this run, removed on drop.
#[derive(Debug)]
pub(super) struct Region {
    path: PathBuf,
}

impl Drop for Region {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Makes `row`'s region and joins it: the region (removed on drop) and the [`Setup`] of a
/// server and client that meet in it.
pub(super) fn setup(row: &FabricRow) -> anyhow::Result<(Region, Setup)> {
    let shm = PathBuf::from("/dev/shm");
    let dir = if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    };
    let region = Region {
        path: dir.join(format!(
            "netless-bench-{}-{}",
            row.transport,
            std::process::id()
        )),
    };
    let _ = std::fs::remove_file(&region.path);
    let options = FabricOptions {
        size: REGION_BYTES,
        coherence: row.coherence,
        ..FabricOptions::default()
    };
    let fabric = Fabric::open(&region.path, &options)
        .with_context(|| format!("making the fabric region {}", region.path.display()))?;
    let path = region.path.to_str().context("region path is not UTF-8")?;
    let setup = Setup {
        server_flags: vec!["--fabric".into(), path.into()],
        client: ClientConfig {
            fabric: Some(fabric),
            ..ClientConfig::default()
        },
    };
    Ok((region, setup))
}
