//! `netless ctl`: reads or sets a running replica's soft registers (batch, wait, SLO, …)
//! through the runtime's `netless.ctl/Get` and `netless.ctl/Set` methods.
//!
//! The server validates every setting and applies it at once (its workers read the registers
//! as they run); a refused setting fails the command with the server's message, which says
//! what is accepted.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use netless::{control, CallOptions, Client, ClientConfig};

use super::stat::{connect, list_sockets, parse_registers, Socket};

/// Command-line arguments of `netless ctl`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Service whose registers to read or set.
    pub service: String,
    /// Address replica N (the server bound as `SERVICE#N`) instead of `SERVICE`.
    #[arg(long, global = true)]
    pub replica: Option<u32>,
    /// What to do.
    #[command(subcommand)]
    pub action: Action,
}

/// `get` or `set`.
#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// Print the registers, one `key=value` per line, with what each accepts.
    Get,
    /// Set registers in the order given, then print them all.
    Set {
        /// Settings such as `wait=futex` or `batch=8`.
        #[arg(required = true, value_name = "KEY=VALUE")]
        settings: Vec<String>,
    },
}

/// How long a control call may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `get` or `set` against the addressed replica; a refused setting is an error (exit 2).
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let client = connect_to(&args)?;
    let options = CallOptions::new().timeout(TIMEOUT);
    let registers = match &args.action {
        Action::Get => {
            let reply = client
                .call(control::GET, b"", &options)
                .with_context(|| format!("reading the registers of `{}`", name(&args)))?;
            reply.payload
        }
        Action::Set { settings } => {
            let mut last = Vec::new();
            for (i, setting) in settings.iter().enumerate() {
                match client.call(control::SET, setting.as_bytes(), &options) {
                    Ok(reply) => last = reply.payload,
                    Err(status) => {
                        let applied = match &settings[..i] {
                            [] => String::new(),
                            done => format!(" ({} applied before it)", done.join(" ")),
                        };
                        anyhow::bail!("`{}` refused `{setting}`{applied}: {status}", name(&args));
                    }
                }
            }
            last
        }
    };
    print!("{}", table(&String::from_utf8_lossy(&registers)));
    Ok(ExitCode::SUCCESS)
}

/// `SERVICE` or `SERVICE#N`.
fn name(args: &Args) -> String {
    socket(args).display_name()
}

fn socket(args: &Args) -> Socket {
    Socket {
        service: args.service.clone(),
        replica: args.replica,
    }
}

/// Connects to the addressed server; if `SERVICE` is not there but its replicas are, says
/// which to pick with `--replica`.
fn connect_to(args: &Args) -> anyhow::Result<Client> {
    let dir = netless_shm::socket_dir().context("finding the netless socket directory")?;
    let config = ClientConfig {
        ring_bytes: 64 * 1024,
        max_in_flight: 1,
        connect_timeout: TIMEOUT,
        ..ClientConfig::default()
    };
    match connect(&dir, &socket(args), config) {
        Ok(client) => Ok(client),
        Err(status) => {
            let replicas: Vec<String> = match args.replica {
                None => list_sockets(&dir)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|s| s.service == args.service && s.replica.is_some())
                    .map(|s| s.display_name())
                    .collect(),
                Some(_) => Vec::new(),
            };
            if replicas.is_empty() {
                anyhow::bail!("{status}");
            }
            anyhow::bail!(
                "{status}; its replicas {} are there: pick one with --replica N",
                replicas.join(", ")
            )
        }
    }
}

/// The registers as `key=value` lines, each followed by what the register accepts.
fn table(registers: &str) -> String {
    let pairs: Vec<(String, String)> = parse_registers(registers).collect();
    let width = pairs
        .iter()
        .map(|(k, v)| k.chars().count() + v.chars().count() + 1)
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (key, value) in &pairs {
        let setting = format!("{key}={value}");
        let about = control::REGISTERS
            .iter()
            .find(|(k, _)| k == key)
            .map_or("", |(_, about)| about);
        let line = format!("{setting:<width$}  {about}");
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_descriptions() {
        let t = table("batch=16\nwait=futex\nnew_one=3\n");
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[0].starts_with("batch=16    requests per batch"),
            "{t}"
        );
        assert!(
            lines[1].starts_with("wait=futex  how idle workers wait"),
            "{t}"
        );
        assert_eq!(lines[2], "new_one=3");
    }
}
