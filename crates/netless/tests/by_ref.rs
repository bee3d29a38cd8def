//! Pass by reference on the raw path: a client and a server process in one page-pool domain
//! send large payloads as Refs, invisibly to both, whatever pid namespace each lives in;
//! outside a shared domain they go by value.

mod common;

use std::io::{BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::time::Duration;

use common::*;
use netless::netless_pool::{Domain, DomainConfig};
use netless::{CallOptions, Client, Code, Request, ResponseBuilder, Server, Status};

fn domain_config(dir: &std::path::Path, name: &str) -> DomainConfig {
    let mut config = DomainConfig::new(name);
    config.dir = Some(dir.to_path_buf());
    config
}

/// Replies with the payload's length and a checksum, so the test sees what the handler saw.
fn digest<'a>(req: &Request<'a>, resp: &mut ResponseBuilder<'a>) -> Result<(), Status> {
    let sum = req.payload.iter().enumerate().fold(0u64, |acc, (i, &b)| {
        acc.wrapping_mul(31).wrapping_add(b as u64 ^ i as u64)
    });
    resp.payload
        .extend_from_slice(&(req.payload.len() as u64).to_le_bytes());
    resp.payload.extend_from_slice(&sum.to_le_bytes());
    Ok(())
}

fn expected(payload: &[u8]) -> Vec<u8> {
    let sum = payload.iter().enumerate().fold(0u64, |acc, (i, &b)| {
        acc.wrapping_mul(31).wrapping_add(b as u64 ^ i as u64)
    });
    let mut v = (payload.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(&sum.to_le_bytes());
    v
}

#[test]
#[ignore = "entry point of the peer processes the other tests spawn"]
fn by_ref_peer() {
    let Some((role, dir, service)) = role() else {
        return;
    };
    let domain = Domain::join(&domain_config(&dir, &role)).unwrap();
    let config = netless::ServerConfig {
        domain: Some(domain.clone()),
        ..server_config(&dir)
    };
    let server = Server::bind(&service, config, digest).unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(server);
}

#[test]
fn large_payloads_travel_by_reference_in_a_shared_domain() {
    let dir = TestDir::new("byref");
    let service = "test.ByRef";
    let domain = Domain::join(&domain_config(dir.path(), "d1")).unwrap();
    let mut child = spawn_role("by_ref_peer", "d1", dir.path(), service);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    wait_for_line(&mut out, "READY");
    let config = netless::ClientConfig {
        domain: Some(domain.clone()),
        ref_threshold: 16 * 1024,
        ..client_config(dir.path())
    };
    let client = Client::connect_with(service, config).unwrap();
    let opts = CallOptions::new().timeout(Duration::from_secs(20));
    let start = domain.stats();
    let mut sent_by_ref = 0u64;
    for (i, len) in [100usize, 16 * 1024, 100_000, 1 << 20, 3 << 20]
        .into_iter()
        .enumerate()
    {
        let payload: Vec<u8> = (0..len).map(|j| (j * 7 + i) as u8).collect();
        let reply = client.call("Digest", &payload, &opts).unwrap();
        assert_eq!(reply.payload, expected(&payload), "payload of {len} bytes");
        if len >= 16 * 1024 {
            sent_by_ref += len as u64;
        }
    }
    // The by-reference payloads were written into the pool once (counted there), and every
    // Ref was mapped and released when its call returned: nothing outstanding, nothing leaked.
    let end = domain.stats();
    assert_eq!(end.bytes_copied - start.bytes_copied, sent_by_ref);
    assert_eq!(end.outstanding_refs, 0);
    // Over the limit by reference too.
    let err = client
        .call("Digest", &vec![0u8; 5 << 20], &opts)
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    drop(client);
    drop(child.stdin.take());
    let _ = out.read_to_end(&mut Vec::new());
    child.wait().unwrap();
    // The server process left the domain: all its pages came back.
    let s = domain.stats();
    assert_eq!(s.free_pages + s.held_pages, s.pages, "{s:?}");
    assert_eq!(s.held_pages, s.leased_pages, "{s:?}");
}

#[test]
fn different_domains_fall_back_to_by_value() {
    let dir = TestDir::new("byval");
    let service = "test.ByVal";
    let ours = Domain::join(&domain_config(dir.path(), "mine")).unwrap();
    let mut child = spawn_role("by_ref_peer", "theirs", dir.path(), service);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    wait_for_line(&mut out, "READY");
    let config = netless::ClientConfig {
        domain: Some(ours.clone()),
        ..client_config(dir.path())
    };
    let client = Client::connect_with(service, config).unwrap();
    let payload = vec![5u8; 200_000];
    let reply = client
        .call(
            "Digest",
            &payload,
            &CallOptions::new().timeout(Duration::from_secs(20)),
        )
        .unwrap();
    assert_eq!(reply.payload, expected(&payload));
    assert_eq!(
        ours.stats().bytes_copied,
        0,
        "nothing went through our pool"
    );
    drop(client);
    drop(child.stdin.take());
    let _ = out.read_to_end(&mut Vec::new());
    child.wait().unwrap();
}

#[test]
fn a_server_in_another_pid_namespace_gets_large_payloads_by_reference() {
    if rustix::process::geteuid().as_raw() != 0 {
        eprintln!("SKIPPED: creating a pid namespace needs root");
        return;
    }
    let dir = TestDir::new("byns");
    let service = "test.ByNs";
    let domain = Domain::join(&domain_config(dir.path(), "d2")).unwrap();
    // The server, in the same domain, runs as pid 1 of a pid namespace of its own: the pid
    // its socket reports means nothing there, but our proof of membership does.
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "by_ref_peer",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ROLE, "d2")
    .env(DIR, dir.path())
    .env(SERVICE, service)
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .process_group(0);
    let mut child = match netless_testing::in_new_pid_namespace(&mut cmd).spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("SKIPPED: cannot create a pid namespace with its own /proc here: {e}");
            return;
        }
    };
    let mut out = BufReader::new(child.stdout.take().unwrap());
    wait_for_line(&mut out, "READY");
    assert_eq!(domain.stats().members, 2, "the server joined our domain");
    let config = netless::ClientConfig {
        domain: Some(domain.clone()),
        ..client_config(dir.path())
    };
    let client = Client::connect_with(service, config).unwrap();
    let payload: Vec<u8> = (0..300_000).map(|j| (j * 13) as u8).collect();
    let opts = CallOptions::new().timeout(Duration::from_secs(20));
    let reply = client.call("Digest", &payload, &opts).unwrap();
    assert_eq!(reply.payload, expected(&payload));
    let s = domain.stats();
    assert_eq!(
        s.bytes_copied,
        payload.len() as u64,
        "the payload went through the pool"
    );
    assert_eq!(s.outstanding_refs, 0, "the server mapped its Ref");
    drop(client);
    drop(child.stdin.take());
    let _ = out.read_to_end(&mut Vec::new());
    child.wait().unwrap();
}
