//! What the example tests share: an example server process serving on both transports,
//! and the tokio runtime the clients run on.

// Each test binary uses a part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use netless::netless_pool::{Domain, DomainConfig};
use netless_grpc::Channel;

/// An example server process serving on both transports.
pub(crate) struct ServerProcess {
    child: Child,
    pub(crate) tcp: String,
    pub(crate) dir: std::path::PathBuf,
    events: mpsc::Receiver<String>,
}

impl ServerProcess {
    pub(crate) fn start(binary: &str, args: &[&str]) -> ServerProcess {
        // Unique per server (tests run in parallel) and short (socket paths must fit in
        // 107 bytes).
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "nl-ex-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new(binary)
            .args(["--transport", "both", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("NETLESS_DIR", &dir)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let (mut tcp, mut netless) = (None, false);
        while tcp.is_none() || !netless {
            let mut line = String::new();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "{binary} exited before listening"
            );
            match line.trim().strip_prefix("LISTENING ") {
                Some(rest) if rest.starts_with("tcp=") => tcp = Some(rest[4..].to_string()),
                Some(rest) if rest.starts_with("netless=") => netless = true,
                _ => {}
            }
        }
        ServerProcess {
            child,
            tcp: tcp.unwrap(),
            dir,
            events: forward_events(out),
        }
    }

    pub(crate) fn tcp_channel(
        &self,
    ) -> impl std::future::Future<Output = tonic::transport::Channel> {
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.tcp)).unwrap();
        async move { endpoint.connect().await.unwrap() }
    }

    pub(crate) fn netless_channel(&self, service: &str) -> Channel {
        let config = netless::ClientConfig {
            dir: Some(self.dir.clone()),
            ..Default::default()
        };
        Channel::connect_with(service, config).unwrap()
    }

    /// A channel in the server's page-pool domain `ex` that sends every message of 1 KiB or
    /// more by reference.
    pub(crate) fn by_ref_channel(&self, service: &str) -> (Channel, Domain) {
        let mut domain_config = DomainConfig::new("ex");
        domain_config.dir = Some(self.dir.clone());
        let domain = Domain::join(&domain_config).unwrap();
        let config = netless::ClientConfig {
            dir: Some(self.dir.clone()),
            domain: Some(domain.clone()),
            ref_threshold: 1024,
            ..Default::default()
        };
        (Channel::connect_with(service, config).unwrap(), domain)
    }

    /// The next `EVENT` line the server printed (within `limit`).
    pub(crate) fn event(&self, limit: Duration) -> Option<String> {
        self.events.recv_timeout(limit).ok()
    }
}

fn forward_events(out: BufReader<ChildStdout>) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if let Some(event) = line.strip_prefix("EVENT ") {
                let _ = tx.send(event.to_string());
            }
        }
    });
    rx
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// What a process that ran to its end printed.
pub(crate) struct Finished {
    pub(crate) out: String,
    pub(crate) err: String,
}

/// Runs `command` to its end, killing it (and panicking) if it takes longer than `limit`;
/// panics if it fails. Its output is read on threads, so a full pipe cannot stall it.
pub(crate) fn run_to_end(command: &mut Command, limit: Duration) -> Finished {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let read = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let out = read(Box::new(child.stdout.take().unwrap()));
    let err = read(Box::new(child.stderr.take().unwrap()));
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let finished = Finished {
        out: out.join().unwrap(),
        err: err.join().unwrap(),
    };
    assert!(
        status.success(),
        "{command:?} failed:\n{}{}",
        finished.out,
        finished.err
    );
    finished
}

/// This test binary again, running only the ignored test `entry`: how a test starts a peer
/// process whose code lives beside it.
pub(crate) fn this_test_running(entry: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args([
        "--exact",
        entry,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    command
}
