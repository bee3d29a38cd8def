//! The examples of the raw netless API run their servers as processes of their own, as they
//! would run in production: an example re-runs itself with `--role NAME --dir DIR` for each
//! server, waits until it says it is ready, and stops it when done (closing its stdin). All
//! of them use a private socket directory, so an example never meets another's services.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context as _};

/// How long a server process may take to say it is ready.
const STARTUP: Duration = Duration::from_secs(20);

/// If this process was started as a server of an example: its role and socket directory.
pub fn role() -> Option<(String, PathBuf)> {
    let args: Vec<String> = std::env::args().collect();
    let at = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    Some((at("--role")?.clone(), PathBuf::from(at("--dir")?)))
}

/// For a server process: says it is ready, then blocks until the example that started it
/// closes its stdin (or exits).
pub fn serve_until_released() {
    println!("READY");
    let _ = std::io::stdout().flush();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

/// A private socket directory for one run of an example (mode 0700), removed on drop.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// Creates `$TMPDIR/netless-example-TAG-PID`.
    pub fn new(tag: &str) -> anyhow::Result<RunDir> {
        use std::os::unix::fs::DirBuilderExt as _;
        let path =
            std::env::temp_dir().join(format!("netless-example-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        Ok(RunDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A server process of an example: stopped (its stdin closed, then killed if it lingers)
/// when dropped.
#[derive(Debug)]
pub struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Peer {
    /// Runs this executable again as `role` with socket directory `dir` and waits until it
    /// is ready.
    pub fn start(role: &str, dir: &Path) -> anyhow::Result<Peer> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(["--role", role, "--dir"])
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting the {role} process"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if line == "READY" {
                    let _ = tx.send(());
                } else {
                    println!("{line}");
                }
            }
        });
        let mut peer = Peer { child, stdin };
        if rx.recv_timeout(STARTUP).is_err() {
            let _ = peer.child.kill();
            bail!("the {role} process did not start within {STARTUP:?}");
        }
        Ok(peer)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        drop(self.stdin.take());
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
