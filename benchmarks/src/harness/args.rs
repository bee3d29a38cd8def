//! The options the benchmarks that write JSON and plots and have a short run share
//! ([`CommonArgs`]). It owns their names and generic help; each benchmark says what its files
//! hold and what `--quick` shortens, and never adds a flag here that only one of them reads.

use std::path::PathBuf;

/// `--json`, `--plot` and `--quick`, `#[command(flatten)]`ed into a benchmark's `Args`.
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

/// Checks that `A` parses the shared options into its `common` and gives `--quick` the help
/// `quick_help` (a `mut_arg` naming a missing argument would panic here).
#[cfg(test)]
pub(crate) fn assert_parses_common<A: clap::Args + std::fmt::Debug>(
    common: impl Fn(&A) -> &CommonArgs,
    quick_help: &str,
) {
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

#[cfg(test)]
mod tests {
    /// A benchmark's options: the shared ones with a help of its own.
    #[derive(clap::Args, Debug)]
    #[command(mut_arg("quick", |a| a.help("One short window")))]
    struct Example {
        #[command(flatten)]
        common: super::CommonArgs,
    }

    #[test]
    fn a_benchmark_parses_the_shared_options_with_its_own_help() {
        super::assert_parses_common(|a: &Example| &a.common, "One short window");
    }
}
