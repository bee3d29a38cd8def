//! The echo server `batching` measures, as its `echo-server` peer role: a 64-byte echo,
//! the reply copied once into the reply ring, on workers that spin or sleep after a spin.
//! Its batching registers are set from outside (`netless.ctl/Set`); it measures nothing.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use netless::{
    Dispatch, Request, ResponseBuilder, Server, ServerConfig, Status, WaitMode, WaitPolicy,
};

use super::load;
use crate::harness::peer;

/// The `echo-server` peer role: the echo server of the benchmark, until stdin closes.
#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    /// The run's socket directory.
    #[arg(long)]
    pub dir: PathBuf,
    /// The service to serve.
    #[arg(long)]
    pub service: String,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Pin worker i to CPU `pin_cpus[i % len]` (none: unpinned).
    #[arg(long, value_delimiter = ',')]
    pub pin_cpus: Vec<usize>,
    /// Idle workers spin this long, µs, then sleep on their futex (absent: spin forever).
    #[arg(long)]
    pub spin_us: Option<u64>,
    /// How requests reach the workers.
    #[arg(long, value_enum, default_value_t = PairsDispatch::Shared)]
    pub dispatch: PairsDispatch,
}

/// How the server's workers share requests, as named on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairsDispatch {
    /// Each connection served by the worker pinned to its client's CPU
    /// (`Dispatch::CpuLocal`).
    CpuLocal,
    /// One queue every worker takes from (`Dispatch::SingleQueue`).
    Shared,
}

impl PairsDispatch {
    /// As on the command line (clap's name for it).
    pub(super) fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default()
    }
}

/// The echo: the reply is the request's payload, copied once into the reply ring.
fn echo<'a>(req: &Request<'a>, resp: &mut ResponseBuilder<'a>) -> Result<(), Status> {
    resp.reply_with(req.payload);
    Ok(())
}

/// The `echo-server` peer role: serves the echo until stdin reaches EOF.
pub(super) fn serve(args: ServerArgs) -> anyhow::Result<()> {
    let wait = match args.spin_us {
        None => load::spin_policy(),
        Some(us) => WaitPolicy {
            mode: WaitMode::Adaptive,
            spin: Duration::from_micros(us),
        },
    };
    let config = ServerConfig {
        workers: args.workers,
        pin_cpus: args.pin_cpus,
        wait,
        dispatch: match args.dispatch {
            PairsDispatch::CpuLocal => Dispatch::CpuLocal,
            PairsDispatch::Shared => Dispatch::SingleQueue,
        },
        dir: Some(args.dir),
        ..Default::default()
    };
    let server = Server::bind(&args.service, config, echo)
        .with_context(|| format!("serving `{}`", args.service))?;
    peer::listening(&args.service)?;
    peer::until_stdin_closes();
    drop(server);
    Ok(())
}
