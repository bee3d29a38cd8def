//! `netless stat`: shows replicas' live counters, refreshing like top(1), or prints one JSON
//! snapshot.
//!
//! The counters are read from each replica's segment, which any client maps: this tool
//! connects once to every replica it shows and then only reads shared memory. It sends no
//! message, so it costs the servers' data path nothing; its connection does take one of the
//! server's connection slots (see `max_connections`), and it is left out of the connections
//! shown. The socket-directory helpers here (listing services and replicas, connecting to
//! replica `N`) serve `netless ctl` too.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use netless::fabric::Fabric;
use netless::{Client, ClientConfig, ReplicaStats, Status};
use serde::Serialize;

/// Command-line arguments of `netless stat`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Service to show (a row per replica); every service in the socket directory (or the
    /// fabric) if omitted.
    pub service: Option<String>,
    /// Print one snapshot as JSON (totals since the server started, no rates) and exit.
    #[arg(long, conflicts_with = "prometheus")]
    pub json: bool,
    /// Print one snapshot in the Prometheus text format (totals since the server started)
    /// and exit: `grpc_server_call_started_total`, `netless_server_calls_total` by
    /// `grpc_status`, the sampled service-time histogram and the other counters, labelled
    /// `netless_service` and `netless_replica` (see `netless_grpc::prometheus`).
    #[arg(long)]
    pub prometheus: bool,
    /// Time between refreshes, in milliseconds.
    #[arg(long, short = 'i', default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(10..))]
    pub interval_ms: u64,
    /// Stop after this many refreshes (default: until interrupted).
    #[arg(long, short = 'c', value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Show the services published in a memory fabric instead of the socket directory.
    #[command(flatten)]
    pub fabric: super::fabric::JoinArgs,
}

/// Shows the counters of `args.service`'s replicas (or of every service) until `--count`
/// refreshes are done, or prints one JSON snapshot with `--json`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let source = match args.fabric.join().map_err(|e| anyhow::anyhow!("{e}"))? {
        Some(fabric) => Source::Fabric(fabric),
        None => {
            Source::Dir(netless_shm::socket_dir().context("finding the netless socket directory")?)
        }
    };
    let mut watch = Watch::new(source, args.service.clone());
    watch.refresh(true)?;
    if args.json {
        let services: Vec<JsonReplica<'_>> = watch
            .members
            .iter()
            .map(|(socket, member)| JsonReplica::new(socket, &member.client.replica_stats()))
            .collect();
        let text = serde_json::to_string_pretty(&JsonSnapshot { services })?;
        println!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    if args.prometheus {
        print!("{}", prometheus(&watch));
        return Ok(ExitCode::SUCCESS);
    }
    let interval = Duration::from_millis(args.interval_ms);
    let tty = std::io::stdout().is_terminal();
    let mut next = Instant::now();
    let mut refresh = 0u64;
    loop {
        if refresh > 0 {
            watch.refresh(false)?;
        }
        refresh += 1;
        let rows = watch.sample();
        let mut out = String::new();
        if tty {
            // Home the cursor and clear the screen, like top(1).
            out.push_str("\x1b[H\x1b[J");
        } else if refresh > 1 {
            out.push('\n');
        }
        let of = args.count.map(|c| format!("/{c}")).unwrap_or_default();
        out.push_str(&format!(
            "netless stat: {} every {} ms, refresh {refresh}{of}\n",
            watch.source, args.interval_ms
        ));
        out.push_str(&render(&rows));
        if rows.is_empty() {
            out.push_str(&match &watch.service {
                Some(s) => format!("(no replica of `{s}` reachable)\n"),
                None => "(no services)\n".to_string(),
            });
        }
        out.push_str(
            "rates and p50/p99/batch over the last refresh interval (`-`: none yet); p50/p99 are \
             sampled service times inside the server, not round trips\n",
        );
        let mut stdout = std::io::stdout().lock();
        // A closed pipe (`netless stat | head`) ends the command quietly.
        if stdout
            .write_all(out.as_bytes())
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return Ok(ExitCode::SUCCESS);
        }
        drop(stdout);
        if args.count.is_some_and(|c| refresh >= c) {
            return Ok(ExitCode::SUCCESS);
        }
        next += interval;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
}

/// A server's socket in the socket directory: `SERVICE.sock`, or `SERVICE#N.sock` for
/// replica `N`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Socket {
    /// The service name.
    pub service: String,
    /// The replica number, for `SERVICE#N.sock`.
    pub replica: Option<u32>,
}

impl Socket {
    /// `SERVICE` or `SERVICE#N`, as shown to the user.
    pub(crate) fn display_name(&self) -> String {
        match self.replica {
            Some(n) => format!("{}#{n}", self.service),
            None => self.service.clone(),
        }
    }

    /// Parses a socket file name; `None` for anything but a server's socket (page-pool
    /// domain sockets `netless-domain.*.sock` included). The service is the name up to the
    /// last `#` (or `.sock`); [`netless::replica_of`] reads the replica number.
    pub(crate) fn parse(file_name: &str) -> Option<Socket> {
        let stem = file_name.strip_suffix(".sock")?;
        if stem.starts_with('.') || stem.starts_with("netless-domain.") {
            return None;
        }
        let service = stem.rsplit_once('#').map_or(stem, |(service, _)| service);
        let valid = !service.is_empty()
            && service
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !valid {
            return None;
        }
        Some(Socket {
            service: service.to_string(),
            replica: netless::replica_of(file_name, service)?,
        })
    }
}

/// The servers' sockets in `dir`, sorted by service and replica.
pub(crate) fn list_sockets(dir: &Path) -> anyhow::Result<Vec<Socket>> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    let mut sockets: Vec<Socket> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
        .filter_map(|e| Socket::parse(e.file_name().to_str()?))
        .collect();
    sockets.sort();
    Ok(sockets)
}

/// Connects to the server behind `socket` in `dir`.
pub(crate) fn connect(dir: &Path, socket: &Socket, config: ClientConfig) -> Result<Client, Status> {
    let config = ClientConfig {
        dir: Some(dir.to_path_buf()),
        ..config
    };
    match socket.replica {
        None => Client::connect_with(&socket.service, config),
        Some(n) => Client::connect_replica(&socket.service, n, config),
    }
}

/// The connection options of a reader: the smallest response ring, one call at most (it
/// never calls), and a short connect timeout so a hung server does not stall the display.
fn reader_config() -> ClientConfig {
    ClientConfig {
        ring_bytes: 4096,
        max_in_flight: 1,
        connect_timeout: Duration::from_secs(2),
        ..ClientConfig::default()
    }
}

/// Where the replicas are found: a socket directory, or a memory fabric's directory.
enum Source {
    Dir(PathBuf),
    Fabric(Fabric),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Dir(dir) => write!(f, "{}", dir.display()),
            Source::Fabric(fabric) => write!(f, "fabric {}", fabric.path().display()),
        }
    }
}

impl Source {
    /// The replicas served here now, sorted by service and replica.
    fn list(&self) -> anyhow::Result<Vec<Socket>> {
        match self {
            Source::Dir(dir) => list_sockets(dir),
            Source::Fabric(fabric) => {
                let mut found: Vec<Socket> = fabric
                    .entries()
                    .into_iter()
                    .filter(|e| fabric.is_alive(e.owner))
                    .map(|e| Socket {
                        service: e.name,
                        replica: e.replica,
                    })
                    .collect();
                found.sort();
                found.dedup();
                Ok(found)
            }
        }
    }

    /// Connects to the replica `socket` names.
    fn connect(&self, socket: &Socket, config: ClientConfig) -> Result<Client, Status> {
        match self {
            Source::Dir(dir) => connect(dir, socket, config),
            Source::Fabric(fabric) => {
                let config = ClientConfig {
                    fabric: Some(fabric.clone()),
                    ..config
                };
                match socket.replica {
                    None => Client::connect_with(&socket.service, config),
                    Some(n) => Client::connect_replica(&socket.service, n, config),
                }
            }
        }
    }
}

/// The replicas being shown, with their connections and last samples.
struct Watch {
    source: Source,
    service: Option<String>,
    members: BTreeMap<Socket, Member>,
}

/// A connected replica and its previous sample (for rates).
struct Member {
    client: Client,
    previous: Option<(Instant, ReplicaStats)>,
}

/// One replica's line: its totals now, and what changed since the previous sample.
struct Row {
    name: String,
    now: ReplicaStats,
    /// Seconds since the previous sample and the counters' increase over them.
    interval: Option<(f64, ReplicaStats)>,
}

impl Watch {
    fn new(source: Source, service: Option<String>) -> Watch {
        Watch {
            source,
            service,
            members: BTreeMap::new(),
        }
    }

    /// Re-reads the socket (or fabric) directory: drops connections to servers that went away, connects
    /// to new ones (skipping quietly those that refuse). With a service named, `first` fails
    /// if none of its replicas answers.
    fn refresh(&mut self, first: bool) -> anyhow::Result<()> {
        let sockets: Vec<Socket> = self
            .source
            .list()?
            .into_iter()
            .filter(|s| self.service.as_ref().is_none_or(|n| *n == s.service))
            .collect();
        self.members
            .retain(|s, m| sockets.contains(s) && !m.client.check_closed());
        let mut last_error = None;
        for socket in sockets {
            if self.members.contains_key(&socket) {
                continue;
            }
            match self.source.connect(&socket, reader_config()) {
                Ok(client) => {
                    self.members.insert(
                        socket,
                        Member {
                            client,
                            previous: None,
                        },
                    );
                }
                // A stale socket of a dead server, or one that refuses us: not shown.
                Err(e) => last_error = Some(e),
            }
        }
        match (&self.service, last_error) {
            (Some(_), Some(status)) if first && self.members.is_empty() => {
                // The runtime's message names the directory and what to check.
                anyhow::bail!("{status}")
            }
            (Some(service), None) if first && self.members.is_empty() => {
                let hint = match self.source {
                    Source::Dir(_) => "set NETLESS_DIR if it uses another directory",
                    Source::Fabric(_) => "it must be started with the same --fabric",
                };
                anyhow::bail!(
                    "service `{service}` not found in {}: is its server running? ({hint})",
                    self.source
                )
            }
            _ => {}
        }
        Ok(())
    }

    /// Reads every member's counters (shared memory only) and pairs them with the previous
    /// sample.
    fn sample(&mut self) -> Vec<Row> {
        let now = Instant::now();
        self.members
            .iter_mut()
            .map(|(socket, member)| {
                let stats = member.client.replica_stats();
                let interval = member.previous.as_ref().and_then(|(then, before)| {
                    let secs = now.duration_since(*then).as_secs_f64();
                    Some((secs, increase(before, &stats)?)).filter(|(s, _)| *s > 0.0)
                });
                member.previous = Some((now, stats.clone()));
                Row {
                    name: socket.display_name(),
                    now: stats,
                    interval,
                }
            })
            .collect()
    }
}

/// The counters' increase from `before` to `after` (calls, NACKs, bytes, sleeps, entries and
/// latency samples); `None` if any went down, as when the server restarted.
fn increase(before: &ReplicaStats, after: &ReplicaStats) -> Option<ReplicaStats> {
    let latency = after
        .latency
        .iter()
        .zip(before.latency.iter().chain(std::iter::repeat(&0)))
        .map(|(a, b)| a.checked_sub(*b))
        .collect::<Option<Vec<u64>>>()?;
    Some(ReplicaStats {
        calls: after.calls.checked_sub(before.calls)?,
        errors: after.errors.checked_sub(before.errors)?,
        nacks: after.nacks.checked_sub(before.nacks)?,
        bytes_in: after.bytes_in.checked_sub(before.bytes_in)?,
        bytes_out: after.bytes_out.checked_sub(before.bytes_out)?,
        sleeps: after.sleeps.checked_sub(before.sleeps)?,
        entries: after.entries.checked_sub(before.entries)?,
        latency,
        ..ReplicaStats::default()
    })
}

/// The table of `rows`, a header line first.
fn render(rows: &[Row]) -> String {
    const HEADS: [&str; 14] = [
        "SERVICE", "WORKERS", "CONNS", "CALLS/S", "CALLS", "ERRORS", "NACKS/S", "MB/S IN",
        "MB/S OUT", "QUEUE", "P50", "P99", "BATCH", "SLEEPS/S",
    ];
    let lines: Vec<[String; 14]> = rows.iter().map(row_cells).collect();
    let widths: Vec<usize> = (0..HEADS.len())
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .chain([HEADS[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let heads = HEADS.map(str::to_string);
    for cells in std::iter::once(&heads).chain(lines.iter()) {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let w = widths[i];
            if i == 0 {
                line.push_str(&format!("{cell:<w$}"));
            } else {
                line.push_str(&format!("  {cell:>w$}"));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// One row's cells, in the order of the table's columns.
fn row_cells(row: &Row) -> [String; 14] {
    let s = &row.now;
    let per_sec = |f: &dyn Fn(&ReplicaStats) -> u64| {
        row.interval
            .as_ref()
            .map_or("-".to_string(), |(secs, d)| count(f(d) as f64 / secs))
    };
    let mb_per_sec = |f: &dyn Fn(&ReplicaStats) -> u64| {
        row.interval.as_ref().map_or("-".to_string(), |(secs, d)| {
            format!("{:.2}", f(d) as f64 / secs / 1e6)
        })
    };
    let recent = row.interval.as_ref().map(|(_, d)| d);
    let quantile = |q: f64| recent.map_or("-".to_string(), |d| latency(d.latency_quantile(q)));
    let batch = recent
        .filter(|d| d.entries > 0)
        .map_or("-".to_string(), |d| format!("{:.1}", d.mean_batch()));
    [
        row.name.clone(),
        s.workers.to_string(),
        // Less this tool's own connection.
        s.connections.saturating_sub(1).to_string(),
        per_sec(&|d| d.calls),
        s.calls.to_string(),
        s.errors.to_string(),
        per_sec(&|d| d.nacks),
        mb_per_sec(&|d| d.bytes_in),
        mb_per_sec(&|d| d.bytes_out),
        s.queue_depth.to_string(),
        quantile(0.5),
        quantile(0.99),
        batch,
        per_sec(&|d| d.sleeps),
    ]
}

/// A rate for a column: whole numbers, then k and M.
fn count(v: f64) -> String {
    if v < 10_000.0 {
        format!("{v:.0}")
    } else if v < 10_000_000.0 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{:.1}M", v / 1e6)
    }
}

/// A service time for a column (`-` before any sample).
fn latency(d: Option<Duration>) -> String {
    let Some(d) = d else {
        return "-".to_string();
    };
    let ns = d.as_nanos() as f64;
    if ns < 1e3 {
        format!("{ns:.0}ns")
    } else if ns < 1e6 {
        format!("{:.1}µs", ns / 1e3)
    } else {
        format!("{:.2}ms", ns / 1e6)
    }
}

/// What `--prometheus` prints: every member's counters, read once.
fn prometheus(watch: &Watch) -> String {
    use netless_grpc::prometheus::{write_replicas, Exposition, Replica};
    let stats: Vec<(&Socket, ReplicaStats, String)> = watch
        .members
        .iter()
        .map(|(socket, member)| {
            let replica = socket.replica.map(|n| n.to_string()).unwrap_or_default();
            (socket, member.client.replica_stats(), replica)
        })
        .collect();
    let replicas: Vec<Replica<'_>> = stats
        .iter()
        .map(|(socket, stats, replica)| Replica {
            labels: vec![
                ("netless_service", socket.service.as_str()),
                ("netless_replica", replica.as_str()),
            ],
            stats,
            // This tool's own.
            own_connections: 1,
        })
        .collect();
    let mut out = Exposition::new();
    write_replicas(&mut out, &replicas, true);
    out.finish()
}

/// What `--json` prints.
#[derive(Serialize)]
struct JsonSnapshot<'a> {
    /// A replica each, sorted by service and replica number.
    services: Vec<JsonReplica<'a>>,
}

/// One replica in `--json`: the totals since the server started.
#[derive(Serialize)]
struct JsonReplica<'a> {
    service: &'a str,
    /// `N` for a replica bound as `SERVICE#N`, else null.
    replica: Option<u32>,
    workers: u32,
    /// Less this tool's own connection.
    connections: u32,
    calls: u64,
    errors: u64,
    by_code: BTreeMap<&'static str, u64>,
    nacks: u64,
    bytes_in: u64,
    bytes_out: u64,
    sleeps: u64,
    entries: u64,
    batch_sizes: Vec<u64>,
    mean_batch: f64,
    queue_depth: u64,
    /// Sampled service times since the start, in µs (null before any sample).
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    registers: BTreeMap<String, String>,
}

impl<'a> JsonReplica<'a> {
    fn new(socket: &'a Socket, s: &ReplicaStats) -> JsonReplica<'a> {
        let us = |q: f64| s.latency_quantile(q).map(|d| d.as_nanos() as f64 / 1e3);
        JsonReplica {
            service: &socket.service,
            replica: socket.replica,
            workers: s.workers,
            connections: s.connections.saturating_sub(1),
            calls: s.calls,
            errors: s.errors,
            by_code: s.by_code.iter().map(|(c, n)| (c.name(), *n)).collect(),
            nacks: s.nacks,
            bytes_in: s.bytes_in,
            bytes_out: s.bytes_out,
            sleeps: s.sleeps,
            entries: s.entries,
            batch_sizes: s.batch_sizes.to_vec(),
            mean_batch: s.mean_batch(),
            queue_depth: s.queue_depth,
            p50_us: us(0.5),
            p99_us: us(0.99),
            registers: parse_registers(&s.registers).collect(),
        }
    }
}

/// The `key=value` lines of a register dump, as pairs.
pub(crate) fn parse_registers(text: &str) -> impl Iterator<Item = (String, String)> + '_ {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::DirBuilderExt as _;

    #[test]
    fn socket_names() {
        let s = |name: &str, replica| {
            Some(Socket {
                service: name.to_string(),
                replica,
            })
        };
        assert_eq!(Socket::parse("kv.Store.sock"), s("kv.Store", None));
        assert_eq!(Socket::parse("kv.Store#3.sock"), s("kv.Store", Some(3)));
        assert_eq!(Socket::parse("netless-domain.pool.sock"), None);
        assert_eq!(Socket::parse("kv.Store#.sock"), None);
        assert_eq!(Socket::parse("kv.Store#x.sock"), None);
        assert_eq!(Socket::parse("kv#1#2.sock"), None);
        assert_eq!(Socket::parse(".hidden.sock"), None);
        assert_eq!(Socket::parse("kv.Store"), None);
        assert_eq!(s("a", Some(2)).unwrap().display_name(), "a#2");
    }

    #[test]
    fn increase_is_none_after_a_restart() {
        let before = ReplicaStats {
            calls: 10,
            latency: vec![1, 2],
            ..ReplicaStats::default()
        };
        let after = ReplicaStats {
            calls: 15,
            latency: vec![1, 5],
            ..ReplicaStats::default()
        };
        let d = increase(&before, &after).unwrap();
        assert_eq!((d.calls, d.latency), (5, vec![0, 3]));
        assert!(increase(&after, &before).is_none());
    }

    #[test]
    fn replicas_are_reached_through_an_alias() {
        use netless::{CallOptions, Request, ResponseBuilder, Server, ServerConfig};
        fn echo<'a>(req: &Request<'a>, resp: &mut ResponseBuilder<'a>) -> Result<(), Status> {
            resp.reply_with(req.payload);
            Ok(())
        }
        let dir = std::env::temp_dir().join(format!("nl-stat-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let config = |n| ServerConfig {
            replica: Some(n),
            dir: Some(dir.clone()),
            ..ServerConfig::default()
        };
        let _r0 = Server::bind("u.Stat", config(0), echo).unwrap();
        let _r1 = Server::bind("u.Stat", config(1), echo).unwrap();
        let sockets = list_sockets(&dir).unwrap();
        assert_eq!(sockets.len(), 2, "{sockets:?}");
        let c1 = connect(&dir, &sockets[1], ClientConfig::default()).unwrap();
        c1.call("Echo", b"hi", &CallOptions::new()).unwrap();
        let c0 = connect(&dir, &sockets[0], reader_config()).unwrap();
        assert_eq!(c1.replica_stats().calls, 1);
        assert_eq!(c0.replica_stats().calls, 0);
        let missing = Socket {
            service: "u.Stat".to_string(),
            replica: Some(7),
        };
        let e = connect(&dir, &missing, reader_config()).unwrap_err();
        assert!(e.message().contains("`u.Stat#7`"), "{e}");
        assert!(e.message().contains(&dir.display().to_string()), "{e}");
        drop((c0, c1));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
