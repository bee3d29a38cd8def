//! `netless memnode`: the memory node (DmRPC-net), a gRPC service holding the pages of
//! references that leave their host (`netless_memnode`); and `netless memnode stat`, which
//! asks a running node what it holds.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use netless_memnode::{MemNode, MemNodeConfig};

/// Serve a memory node: objects of 4 KiB pages that sessions put, derive (copy-on-write)
/// and hold, read by anyone with a reference. Prints `LISTENING tcp=ADDR` once bound;
/// exits on SIGINT or SIGTERM. Anyone who can reach the address can open sessions (up to
/// --max-sessions-per-peer from one address) and fill the node up to --capacity: listen on
/// a network only the services' hosts share.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    /// Ask a running node instead of serving one.
    #[command(subcommand)]
    pub action: Option<Action>,
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,
    /// Pages held at most, in MiB (Puts and Derives under way included).
    #[arg(long, value_name = "MiB", default_value_t = 1024)]
    pub capacity: u64,
    /// A session with no KeepAlive for this long loses its holds (`500ms`, `10s`, `1m`;
    /// from 10 ms to a day).
    #[arg(long, default_value = "10s", value_parser = parse_lease)]
    pub lease: Duration,
    /// Sessions open at once.
    #[arg(long, default_value_t = MemNodeConfig::default().max_sessions)]
    pub max_sessions: usize,
    /// Sessions open at once from one client IP address (clients over netless, whose
    /// address is unknown, count as one).
    #[arg(long, default_value_t = MemNodeConfig::default().max_sessions_per_peer)]
    pub max_sessions_per_peer: usize,
    /// Holds (a session holding an object) at once, over all sessions.
    #[arg(long, default_value_t = MemNodeConfig::default().max_holds)]
    pub max_holds: usize,
    /// The longest object, in MiB.
    #[arg(long, value_name = "MiB", default_value_t = MemNodeConfig::default().max_object_bytes >> 20)]
    pub max_object: u64,
}

/// What `netless memnode` does instead of serving.
#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// Print what a running node holds: objects, pages, bytes, sessions, holds.
    Stat {
        /// The node's address (`host:port` or `http://host:port`).
        #[arg(long)]
        addr: String,
        /// One JSON object instead of the table.
        #[arg(long)]
        json: bool,
    },
}

/// A lease: milliseconds (`500ms`), seconds (`10s`, or a bare number) or minutes (`1m`),
/// not zero.
fn parse_lease(text: &str) -> Result<Duration, String> {
    let (digits, scale) = if let Some(ms) = text.strip_suffix("ms") {
        (ms, 1)
    } else if let Some(m) = text.strip_suffix('m') {
        (m, 60_000)
    } else {
        (text.strip_suffix('s').unwrap_or(text), 1000)
    };
    match digits.parse::<u64>() {
        Ok(n) if n > 0 => Ok(Duration::from_millis(n.saturating_mul(scale))),
        _ => Err(format!(
            "`{text}` is not a lease: a positive number of ms, s or m (`500ms`, `10s`, `1m`)"
        )),
    }
}

/// Runs `netless memnode [stat]`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match args.action {
        Some(Action::Stat { addr, json }) => runtime.block_on(stat(&addr, json)),
        None => runtime.block_on(serve(&args)),
    }
}

async fn serve(args: &Args) -> anyhow::Result<ExitCode> {
    let config = MemNodeConfig {
        capacity_bytes: args.capacity.saturating_mul(1 << 20),
        lease: args.lease,
        max_sessions: args.max_sessions,
        max_sessions_per_peer: args.max_sessions_per_peer,
        max_holds: args.max_holds,
        max_object_bytes: args.max_object.saturating_mul(1 << 20),
        ..MemNodeConfig::default()
    };
    // Before binding: a node that cannot run prints no readiness line.
    config.validate().context("the node's flags")?;
    // Before the readiness line: a signal sent as soon as it is read must find its handler.
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let address = listener.local_addr()?;
    println!(
        "LISTENING tcp={address} (capacity {} MiB, lease {} ms)",
        args.capacity,
        args.lease.as_millis()
    );
    std::io::stdout().flush()?;
    netless_memnode::serve_with_shutdown(listener, config, async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
    .await
    .context("serving the memory node")?;
    eprintln!("memnode: bye");
    Ok(ExitCode::SUCCESS)
}

async fn stat(addr: &str, json: bool) -> anyhow::Result<ExitCode> {
    let url = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    };
    let channel = tonic::transport::Endpoint::from_shared(url.clone())
        .with_context(|| format!("`{addr}` is not an address (host:port)"))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .with_context(|| format!("connecting to the memory node at {url}: is it running?"))?;
    let s = MemNode::new(channel)
        .stats()
        .await
        .map_err(|status| anyhow::anyhow!("{url}: {}", status.message()))?;
    if json {
        let value = serde_json::json!({
            "objects": s.objects,
            "pages": s.pages,
            "bytes": s.bytes,
            "sessions": s.sessions,
            "holds": s.holds,
            "reserved_bytes": s.reserved_bytes,
            "capacity_bytes": s.capacity_bytes,
            "pages_read": s.pages_read,
        });
        println!("{value}");
    } else {
        println!("memory node {url}");
        println!("  objects     {}", s.objects);
        println!("  pages       {} ({} bytes)", s.pages, s.bytes);
        println!("  capacity    {} bytes", s.capacity_bytes);
        println!(
            "  reserved    {} bytes (Puts and Derives under way)",
            s.reserved_bytes
        );
        println!("  sessions    {}", s.sessions);
        println!("  holds       {}", s.holds);
        println!("  pages read  {}", s.pages_read);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::parse_lease;
    use std::time::Duration;

    #[test]
    fn leases_parse() {
        assert_eq!(parse_lease("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_lease("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_lease("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_lease("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_lease("0").is_err());
        assert!(parse_lease("5h").is_err());
        assert!(parse_lease("").is_err());
    }
}
