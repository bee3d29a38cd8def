//! A benchmark binary's command line and exit status ([`main`]): either the benchmark's own
//! flags, or, hidden, `peer <role> …`, one of the peer processes it spawns by running itself
//! again. It parses and dispatches; it never measures.

use std::process::ExitCode;

/// Runs a benchmark binary: `name [FLAGS]` calls `run` with the parsed flags `A`;
/// `name peer <role> [ARGS]` (hidden: only the benchmark itself spawns it) calls `peer` with
/// the role `P`, in a process that dies with its parent.
///
/// A usage error exits with status 2 (clap's message); so does an error of `run` or
/// `peer`, printed as `name: error: cause…`.
pub fn main<A, P>(
    name: &'static str,
    about: &'static str,
    run: impl FnOnce(A) -> anyhow::Result<()>,
    peer: impl FnOnce(P) -> anyhow::Result<()>,
) -> ExitCode
where
    A: clap::Args,
    P: clap::Subcommand,
{
    // The doc comments of `A` and `P` would be the commands' help: `about` goes after.
    let roles = P::augment_subcommands(clap::Command::new("peer"))
        .about("Internal: the peer processes this benchmark spawns")
        .hide(true)
        .subcommand_required(true);
    let command = A::augment_args(clap::Command::new(name))
        .about(about)
        .version(env!("CARGO_PKG_VERSION"))
        .subcommand(roles)
        .args_conflicts_with_subcommands(true);
    let matches = command.get_matches();
    let result = match matches.subcommand() {
        Some(("peer", role)) => {
            let role = P::from_arg_matches(role).unwrap_or_else(|e| e.exit());
            super::peer::die_with_parent().and_then(|()| peer(role))
        }
        _ => run(A::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            ExitCode::from(2)
        }
    }
}
