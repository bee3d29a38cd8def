//! gRPC's interop suite through the gateway: grpc-go's own interop client
//! (`google.golang.org/grpc/interop/client`, built by `scripts/go-interop-client` into
//! `target/go-interop/client`) runs the cases of grpc's interop test descriptions against
//! `grpc.testing.TestService` (`netless_examples::interop`), served over netless by a
//! backend process behind `netless gateway`, in plain text and over TLS; and the examples'
//! tonic client runs the same cases through the gateway over TCP.
//!
//! Without `go` on the machine (and so no client built), the grpc-go tests say `SKIPPED:`
//! and pass; with `go` but no client, they fail and say to run the script.
//! `NETLESS_GO_INTEROP_CLIENT` names another build of the client.

mod common;

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::interop::{workspace, Setup};
use common::{Proc, TestDir};
use netless_examples::interop::client::CASES;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// How long one run of the Go client may take.
const CASE_LIMIT: Duration = Duration::from_secs(60);

/// Entry point of the backend process (run only by it, via `--ignored`): the interop
/// service over netless until stdin closes.
#[test]
#[ignore = "entry point of the backend process the other tests spawn"]
fn backend_process_entry() {
    if std::env::var_os("NETLESS_INTEROP_BACKEND").is_none() {
        return;
    }
    let serving = netless_grpc::GrpcServer::new()
        .add_service(netless_examples::interop::server::service())
        .serve()
        .unwrap();
    println!("\nBACKEND READY");
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(serving);
}

/// grpc-go's interop client, or `None` (having said `SKIPPED:`) where there is no `go` to
/// build it with.
fn go_client() -> Option<PathBuf> {
    let client = std::env::var_os("NETLESS_GO_INTEROP_CLIENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/go-interop/client"));
    if client.is_file() {
        return Some(client);
    }
    // The script could not build it here (an old go, no module proxy): it said why.
    let unavailable = client.with_file_name("unavailable");
    if let Ok(reason) = std::fs::read_to_string(&unavailable) {
        println!("SKIPPED: grpc-go's interop cases: {}", reason.trim());
        return None;
    }
    let have_go = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|out| out.status.success());
    assert!(
        !have_go,
        "{} is missing: run scripts/go-interop-client (scripts/test does)",
        client.display()
    );
    println!(
        "SKIPPED: grpc-go's interop cases: no `go` on this machine to build {} with",
        client.display()
    );
    None
}

/// Runs every case (grpc-go's names are those of [`CASES`]) with the Go client at the gateway's `port`, with `extra` flags; panics
/// with a table of the cases' outcomes unless all passed.
fn run_go_cases(client: &Path, port: &str, extra: &[&str], what: &str) {
    let mut failures = Vec::new();
    let mut table = String::new();
    for case in CASES {
        let mut command = Command::new(client);
        command
            .args(["--server_host", "127.0.0.1", "--server_port", port])
            .args(["--test_case", case])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let out = Proc::spawn_command(command, &format!("grpc-go interop client {case}"))
            .finish(CASE_LIMIT);
        let passed = out.status.success();
        table.push_str(&format!(
            "{what} {case}: {}\n",
            if passed { "PASS" } else { "FAIL" }
        ));
        if !passed {
            failures.push(out.describe());
        }
    }
    print!("{table}");
    assert!(
        failures.is_empty(),
        "grpc-go's interop client, {what}:\n{table}\n{}",
        failures.join("\n")
    );
}

/// The gateway's port from its `127.0.0.1:PORT`.
fn port(setup: &Setup) -> &str {
    setup.address.rsplit(':').next().unwrap()
}

#[test]
fn grpc_go_interop_client_passes_through_the_gateway() {
    let Some(client) = go_client() else { return };
    // `grpc.testing.*` lets `grpc.testing.UnimplementedService` through, to no socket: the
    // gateway answers it as a service that does not exist, UNIMPLEMENTED.
    let setup = Setup::start("go", &["--allow", "grpc.testing.*"]);
    run_go_cases(&client, port(&setup), &[], "plain");
}

#[test]
fn grpc_go_interop_client_passes_through_the_gateway_over_tls() {
    let Some(client) = go_client() else { return };
    let dir = TestDir::new("go-tls");
    let host = "interop.netless.test";
    let write = |name: &str, pem: String| {
        let path = dir.path.join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    // A CA and a certificate it issued: Go takes no self-signed leaf as its own root.
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "netless interop test CA");
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![host.to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let cert_path = write("cert.pem", cert.pem());
    let key_path = write("key.pem", key.serialize_pem());
    let ca_path = write("ca.pem", ca.pem());
    // Only the test service: `grpc.testing.UnimplementedService` is not allowed, which the
    // gateway answers as it answers a service that does not exist.
    let setup = Setup::start(
        "go-tls",
        &[
            "--allow",
            "grpc.testing.TestService",
            "--tls-cert",
            cert_path.to_str().unwrap(),
            "--tls-key",
            key_path.to_str().unwrap(),
        ],
    );
    // `--ca_file` counts only with `--use_test_ca`, else the system's roots are used.
    let tls = [
        "--use_tls",
        "--use_test_ca",
        "--ca_file",
        ca_path.to_str().unwrap(),
        "--server_host_override",
        host,
    ];
    run_go_cases(&client, port(&setup), &tls, "TLS");
}

/// The examples' tonic client, over TCP to the gateway: every case, the deadline of
/// `timeout_on_sleeping_server` held by the gateway's netless channel.
#[test]
fn tonic_interop_client_passes_through_the_gateway() {
    let setup = Setup::start("tonic-interop", &["--allow", "grpc.testing.*"]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let failures: Vec<String> = runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", setup.address))
            .unwrap()
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap();
        let mut failures = Vec::new();
        for case in CASES {
            if let Err(e) = netless_examples::interop::client::run(case, channel.clone()).await {
                failures.push(format!("{case}: {e:#}"));
            }
        }
        failures
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
