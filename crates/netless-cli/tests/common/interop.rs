//! The gateway's multi-process setups: a backend process (the test binary itself, run as
//! its `backend_process_entry` test, which calls [`backend_main`]) serving the example
//! services over netless, `netless gateway` in front of it, and the Python grpcio clients
//! (`tests/interop/client.py`, `tests/interop/probe.py`).
//!
//! The Python interpreter is `$NETLESS_PYTHON`, else `target/interop-venv/bin/python`
//! (`scripts/python-env` makes it; `.ci/run` and `scripts/test` run that first).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use netless_examples::greeter::MyGreeter;
use netless_examples::helloworld::greeter_server::GreeterServer;
use netless_examples::routeguide::RouteGuideService;
use netless_examples::routeguide_pb::route_guide_server::RouteGuideServer;
use serde_json::{json, Value};

use super::{TestDir, BIN};

pub(crate) fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The backend process: the example services over netless until stdin closes; with
/// `NETLESS_INTEROP_DOMAIN` set, also a member (the founder) of that page-pool domain, so
/// its coordinator's socket is there too. Runs only when `NETLESS_INTEROP_BACKEND` is set.
pub(crate) fn backend_main() {
    if std::env::var_os("NETLESS_INTEROP_BACKEND").is_none() {
        return;
    }
    let _domain = std::env::var("NETLESS_INTEROP_DOMAIN").ok().map(|name| {
        netless::netless_pool::Domain::join(&netless::netless_pool::DomainConfig::new(&name))
            .unwrap()
    });
    let observer = std::sync::Arc::new(|_event: String| {});
    let serving = netless_grpc::GrpcServer::new()
        .add_service(GreeterServer::new(MyGreeter))
        .add_service(RouteGuideServer::new(RouteGuideService::new(
            1000, observer,
        )))
        .serve()
        .unwrap();
    println!("\nBACKEND READY");
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(serving);
}

/// A child process killed when dropped.
pub(crate) struct Running(pub(crate) Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for a line starting with `marker` on `child`'s stdout (which must be piped) and
/// returns the rest of it; the rest of the output is drained on a thread.
pub(crate) fn read_marker(child: &mut Child, marker: &str) -> String {
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let wanted = marker.to_string();
    std::thread::spawn(move || {
        let mut line = String::new();
        let mut sent = false;
        while out.read_line(&mut line).unwrap_or(0) > 0 {
            if !sent {
                if let Some(pos) = line.find(&wanted) {
                    let _ = tx.send(line[pos + wanted.len()..].trim().to_string());
                    sent = true;
                }
            }
            line.clear();
        }
    });
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("no `{marker}` line within 20 s"))
}

/// `netless gateway --listen 127.0.0.1:0 --threads 2 <args>` on socket directory `dir`, and
/// the address it listens on.
pub(crate) fn start_gateway(dir: &Path, args: &[&str]) -> (Running, String) {
    let mut gateway = Command::new(BIN)
        .args(["gateway", "--listen", "127.0.0.1:0", "--threads", "2"])
        .args(args)
        .env("NETLESS_DIR", dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let address = read_marker(&mut gateway, "LISTENING ")
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    (Running(gateway), address)
}

/// The backend and the gateway in front of it. Fields drop in order: the backend, then the
/// gateway, then their socket directory.
pub(crate) struct Setup {
    pub(crate) backend: Option<Running>,
    pub(crate) gateway: Running,
    pub(crate) address: String,
    pub(crate) dir: TestDir,
}

impl Setup {
    /// A backend, then a gateway started with `gateway_args` (which must say what it
    /// forwards).
    pub(crate) fn start(tag: &str, gateway_args: &[&str]) -> Setup {
        Setup::start_with(tag, gateway_args, &[])
    }

    /// [`Setup::start`] with environment variables `env` for the backend.
    pub(crate) fn start_with(tag: &str, gateway_args: &[&str], env: &[(&str, &str)]) -> Setup {
        let dir = TestDir::new(tag);
        let mut backend = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "backend_process_entry",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("NETLESS_INTEROP_BACKEND", "1")
            .env("NETLESS_DIR", &dir.path)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        read_marker(&mut backend, "BACKEND READY");
        let (gateway, address) = start_gateway(&dir.path, gateway_args);
        Setup {
            dir,
            backend: Some(Running(backend)),
            gateway,
            address,
        }
    }
}

/// The Python interpreter with grpcio.
pub(crate) fn python() -> PathBuf {
    let python = std::env::var_os("NETLESS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/interop-venv/bin/python"));
    let ok = Command::new(&python)
        .args(["-c", "import grpc, grpc_tools"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{} cannot import grpc and grpc_tools: run scripts/python-env (or set NETLESS_PYTHON \
         to a python with grpcio and grpcio-tools)",
        python.display()
    );
    python
}

/// Runs the Python client against `target`; returns its output, panicking if it failed.
pub(crate) fn run_python(target: &str, ca: Option<&Path>, tag: &str) -> String {
    let out_dir = TestDir::new(&format!("py-{tag}"));
    let mut command = Command::new(python());
    command
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/client.py"))
        .arg(target)
        .arg(workspace().join("examples/proto"))
        .arg(&out_dir.path);
    if let Some(ca) = ca {
        command.arg(ca);
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "the Python client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// One call for [`probe`]: a method path, the request's bytes, metadata.
#[derive(Clone, Debug, Default)]
pub(crate) struct Call {
    pub(crate) path: String,
    pub(crate) payload: Vec<u8>,
    pub(crate) metadata: Vec<(String, String)>,
}

impl Call {
    pub(crate) fn new(path: &str, payload: &[u8]) -> Call {
        Call {
            path: path.to_string(),
            payload: payload.to_vec(),
            metadata: Vec::new(),
        }
    }

    pub(crate) fn with(mut self, key: &str, value: &str) -> Call {
        self.metadata.push((key.to_string(), value.to_string()));
        self
    }
}

/// How a [`probe`] call ended: the status code's name (`OK`, `UNIMPLEMENTED`, ...), its
/// message, the reply's bytes.
#[derive(Clone, Debug)]
pub(crate) struct Outcome {
    pub(crate) code: String,
    pub(crate) details: String,
    pub(crate) reply: Vec<u8>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// Makes `calls` with the Python grpcio client (`probe.py`) at `target`, one after the
/// other; `tls`: the CA to trust, and optionally the client's certificate and key.
pub(crate) fn probe(target: &str, calls: &[Call], tls: &[&Path]) -> Vec<Outcome> {
    let calls: Vec<Value> = calls
        .iter()
        .map(|c| {
            json!({
                "path": c.path,
                "payload": hex(&c.payload),
                "metadata": c.metadata.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
                "timeout": 20,
            })
        })
        .collect();
    let output = Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/probe.py"))
        .arg(target)
        .arg(Value::from(calls.clone()).to_string())
        .args(tls)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "probe.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let outcomes: Vec<Outcome> = stdout
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            Outcome {
                code: v["code"].as_str().unwrap().to_string(),
                details: v["details"].as_str().unwrap().to_string(),
                reply: unhex(v["reply"].as_str().unwrap()),
            }
        })
        .collect();
    assert_eq!(outcomes.len(), calls.len(), "{stdout}");
    outcomes
}
