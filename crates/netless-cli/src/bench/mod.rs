//! Benchmarks: programs that run client and server processes, print a table and write JSON.
//!
//! `echo` orchestrates; `grpc_http2` and `floor` are the baseline and the physical limit it is
//! compared with; `grpc` and `split` compare tonic paths and the split gateway, with `peer`
//! spawning and stopping their server processes; `report` formats the figures; `proto` holds
//! the generated protobuf types. `dmrpc` reproduces DmRPC's pass-by-reference experiments
//! with the domain page pool, each tier its own process; `transfer` measures the payload size
//! from which pass by reference beats pass by value (the default `ref_threshold`).
//! [`CommonArgs`] holds the options that `dagger`, `dmrpc` and `kvs` share.

use std::path::PathBuf;

pub mod clock;
pub mod dagger;
pub mod dmrpc;
pub mod echo;
pub mod floor;
pub mod grpc;
pub mod grpc_http2;
pub mod h2load;
pub mod kvs;
pub mod peer;
pub mod proto;
pub mod report;
pub mod split;
pub mod transfer;

/// The options `bench dagger`, `bench dmrpc` and `bench kvs` share (`#[command(flatten)]`ed
/// into their `Args`): where to write the JSON and the plot, and `--quick`.
///
/// The help below is generic; each benchmark says what its files hold and what `--quick`
/// shortens with `#[command(mut_arg("json", |a| a.help("…")), …)]` on its `Args`.
#[derive(clap::Args, Debug)]
pub struct CommonArgs {
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw the results to this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// A short run instead of the full one: fewer and shorter windows (for tests).
    #[arg(long)]
    pub quick: bool,
}

/// A benchmark run's private socket directory (mode 0700, under the user's netless socket
/// directory, named `TAG-PID`), removed on drop. Short: socket paths must fit in 108 bytes.
pub(crate) struct RunDir {
    pub path: PathBuf,
}

impl RunDir {
    pub(crate) fn create(tag: &str) -> anyhow::Result<RunDir> {
        use anyhow::Context as _;
        use std::os::unix::fs::DirBuilderExt as _;
        let path = netless_shm::socket_dir()?.join(format!("{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        Ok(RunDir { path })
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use clap::Args;

    use super::CommonArgs;

    /// Each benchmark parses the shared options into its `common` and keeps its own help
    /// for them (a `mut_arg` naming a missing argument would panic here).
    #[test]
    fn shared_options_parse_with_each_benchmarks_help() {
        fn check<A: Args + std::fmt::Debug>(common: impl Fn(&A) -> &CommonArgs, quick_help: &str) {
            let command = A::augment_args(clap::Command::new("bench"));
            command.clone().debug_assert();
            let quick = command
                .get_arguments()
                .find(|a| a.get_id() == "quick")
                .and_then(|a| a.get_help())
                .map(ToString::to_string);
            assert_eq!(quick.as_deref(), Some(quick_help));
            let argv = [
                "bench", "--json", "out.json", "--plot", "out.svg", "--quick",
            ];
            let args = A::from_arg_matches(&command.get_matches_from(argv)).unwrap();
            let c = common(&args);
            assert_eq!(c.json.as_deref(), Some("out.json".as_ref()));
            assert_eq!(c.plot.as_deref(), Some("out.svg".as_ref()));
            assert!(c.quick);
        }
        check(
            |a: &super::dagger::Args| &a.common,
            "A few seconds instead of about 1.5 min: 50 ms windows, one round, three loads (tests)",
        );
        check(
            |a: &super::dmrpc::Args| &a.common,
            "A few seconds instead of about a minute: short windows, one round (for tests)",
        );
        check(
            |a: &super::kvs::Args| &a.common,
            "About half a minute instead of about five: 64 Ki keys, four load points of short \
             windows, shared and per-connection buffers only (for tests)",
        );
    }
}
