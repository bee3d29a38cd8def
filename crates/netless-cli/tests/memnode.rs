//! The memory node end to end: `netless memnode` as a process of its own, clients over
//! TCP (tonic) in the test process and in processes the tests kill, and the same client
//! over netless (`netless_grpc::Channel`) to a node served by a peer process.
//!
//! Bounds are generous (seconds where the node takes milliseconds): a test fails when
//! something is wrong, never on speed.

mod common;

use std::io::{Read as _, Write as _};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use netless_memnode::proto::mem_node_client::MemNodeClient;
use netless_memnode::proto::{OpenRequest, PutChunk, ReadRequest, SessionRequest};
use netless_memnode::{MemNode, RemoteRef, Session, Stats, Transport, PAGE_SIZE};
use rustix::process::{Pid, Signal};
use tonic::transport::Channel;
use tonic::Code;

use common::interop::read_marker;
use common::{TestDir, BIN, SHORT, SHUTDOWN};

const PAGE: u64 = PAGE_SIZE as u64;

/// A child process in a process group of its own, killed with the group when dropped.
struct Peer {
    child: Child,
    reaped: bool,
}

impl Peer {
    fn spawn(command: &mut Command, ready: &str) -> (Peer, String) {
        let mut child = command
            .stdout(Stdio::piped())
            .stdin(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let line = read_marker(&mut child, ready);
        (
            Peer {
                child,
                reaped: false,
            },
            line,
        )
    }

    fn pid(&self) -> Pid {
        Pid::from_child(&self.child)
    }

    /// Sends `signal` and checks that the process exits with 0 within [`SHUTDOWN`].
    fn stop(mut self, signal: Signal) {
        rustix::process::kill_process(self.pid(), signal).unwrap();
        let deadline = Instant::now() + SHUTDOWN;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "no exit within {SHUTDOWN:?} of {signal:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        self.reaped = true;
        assert!(status.success(), "after {signal:?}: {status:?}");
    }

    /// SIGKILLs the process group and reaps the child.
    fn kill(&mut self) {
        if !self.reaped {
            let _ = rustix::process::kill_process_group(self.pid(), Signal::KILL);
            let _ = self.child.wait();
            self.reaped = true;
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `netless memnode --listen <listen> <extra>`, and the address it listens on.
fn start_node_on(listen: &str, extra: &[&str]) -> (Peer, String) {
    let (node, line) = Peer::spawn(
        Command::new(BIN)
            .args(["memnode", "--listen", listen])
            .args(extra),
        "LISTENING tcp=",
    );
    let addr = line.split_whitespace().next().unwrap().to_string();
    (node, addr)
}

fn start_node(extra: &[&str]) -> (Peer, String) {
    start_node_on("127.0.0.1:0", extra)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn connect(addr: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn stats<T: Transport>(node: &MemNode<T>) -> Stats {
    node.stats().await.unwrap()
}

/// Polls the node's stats until `done` holds, for up to `timeout`.
async fn wait_for<T: Transport>(
    node: &MemNode<T>,
    timeout: Duration,
    done: impl Fn(&Stats) -> bool,
) -> Stats {
    let deadline = Instant::now() + timeout;
    loop {
        let s = stats(node).await;
        if done(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "not within {timeout:?}: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Bytes that differ from page to page and within each.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

fn assert_refused<T: std::fmt::Debug>(result: Result<T, tonic::Status>, code: Code, says: &str) {
    let status = result.unwrap_err();
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(says),
        "`{}` does not say `{says}`",
        status.message()
    );
}

#[test]
fn objects_of_every_size_come_back_as_put() {
    let (node, addr) = start_node(&[]);
    runtime().block_on(async {
        let session = Session::open(connect(&addr).await, "sizes").await.unwrap();
        for len in [0, 1, 4095, 4096, 4097, (1 << 20) + 3] {
            let data = pattern(len);
            let r = session.put(&data).await.unwrap();
            assert_eq!(r.len(), len as u64);
            assert_eq!(session.read(&r).await.unwrap(), data, "{len} bytes");
            let again = RemoteRef::from_bytes(&r.to_bytes()).unwrap();
            assert_eq!(session.read(&again).await.unwrap(), data, "{len} bytes");
        }
        // Several slices, cut anywhere, make one object.
        let data = pattern(600_000);
        let slices: Vec<&[u8]> = vec![
            &data[..1],
            &data[1..4096],
            &data[4096..300_001],
            &[],
            &data[300_001..],
        ];
        let r = session.put_slices(&slices).await.unwrap();
        assert_eq!(session.read(&r).await.unwrap(), data);
        assert_eq!(session.close().await.unwrap(), 7);
        let s = stats(&MemNode::new(connect(&addr).await)).await;
        assert_eq!(
            (s.objects, s.pages, s.sessions, s.holds),
            (0, 0, 0, 0),
            "{s:?}"
        );
    });
    node.stop(Signal::INT);
}

#[test]
fn reads_fetch_only_the_pages_they_touch() {
    let (node, addr) = start_node(&[]);
    runtime().block_on(async {
        let session = Session::open(connect(&addr).await, "reader").await.unwrap();
        let data = pattern(64 * PAGE_SIZE + 100);
        let r = session.put(&data).await.unwrap();
        let node_client = session.node().clone();
        let before = stats(&node_client).await.pages_read;

        let pages = session.read_pages(&r, 10..12).await.unwrap();
        assert_eq!(pages, data[10 * PAGE_SIZE..12 * PAGE_SIZE]);
        assert_eq!(stats(&node_client).await.pages_read - before, 2);
        let last = session.read_pages(&r, 64..65).await.unwrap();
        assert_eq!(last, data[64 * PAGE_SIZE..], "the last page is short");
        assert_refused(
            session.read_pages(&r, 64..66).await,
            Code::OutOfRange,
            "outside",
        );

        let mut view = session.map(&r);
        let before = stats(&node_client).await.pages_read;
        assert_eq!(view.read(5000..5010).await.unwrap(), data[5000..5010]);
        assert_eq!(view.fetched_pages(), 1);
        assert_eq!(view.read(5000..5010).await.unwrap(), data[5000..5010]);
        assert_eq!(view.read(4000..8200).await.unwrap(), data[4000..8200]);
        assert_eq!(
            view.fetched_pages(),
            3,
            "pages 0 and 2 fetched; page 1 cached"
        );
        assert_eq!(stats(&node_client).await.pages_read - before, 3);
        assert_refused(
            view.read(0..data.len() as u64 + 1).await,
            Code::OutOfRange,
            "outside",
        );
    });
    node.stop(Signal::TERM);
}

#[test]
fn writes_copy_pages_and_publish_shares_the_rest() {
    let (node, addr) = start_node(&[]);
    runtime().block_on(async {
        let caller = Session::open(connect(&addr).await, "caller").await.unwrap();
        let callee = Session::open(connect(&addr).await, "callee").await.unwrap();
        let data = pattern(8 * PAGE_SIZE);
        let r = caller.put(&data).await.unwrap();
        assert_eq!(stats(caller.node()).await.pages, 8);

        // The callee keeps the reference past the call: it retains it first.
        callee.retain(&r).await.unwrap();
        caller.release(&r).await.unwrap();
        let mut view = callee.map(&r);
        view.write(3 * PAGE + 10, b"hello").await.unwrap();
        assert_eq!(
            view.fetched_pages(),
            1,
            "a partial page is fetched before it is written"
        );
        view.write(5 * PAGE, &[9; PAGE_SIZE]).await.unwrap();
        assert_eq!(view.fetched_pages(), 1, "a whole page is not");
        assert_eq!(view.dirty_pages(), 2);
        assert_eq!(
            callee.read(&r).await.unwrap(),
            data,
            "nothing reaches the node before publish"
        );

        let edited = view.publish().await.unwrap();
        let mut expected = data.clone();
        expected[3 * PAGE_SIZE + 10..3 * PAGE_SIZE + 15].copy_from_slice(b"hello");
        expected[5 * PAGE_SIZE..6 * PAGE_SIZE].fill(9);
        assert_eq!(caller.read(&edited).await.unwrap(), expected);
        assert_eq!(
            caller.read(&r).await.unwrap(),
            data,
            "the base never changes"
        );
        let s = stats(caller.node()).await;
        assert_eq!(
            (s.objects, s.pages),
            (2, 10),
            "6 pages shared, 2 private copies"
        );

        // Written across a page boundary, then published again: two more private pages.
        view.write(PAGE - 2, b"abcd").await.unwrap();
        let again = view.publish().await.unwrap();
        expected[PAGE_SIZE - 2..PAGE_SIZE + 2].copy_from_slice(b"abcd");
        assert_eq!(callee.read(&again).await.unwrap(), expected);
        assert_eq!(stats(caller.node()).await.pages, 12);

        // A derived object may grow: the bytes past the base's end read as zero.
        let small = caller.put(&pattern(5000)).await.unwrap();
        let grown = caller
            .derive(&small, 3 * PAGE, &[(9000, b"xyz")])
            .await
            .unwrap();
        let mut expected = pattern(5000);
        expected.resize(3 * PAGE_SIZE, 0);
        expected[9000..9003].copy_from_slice(b"xyz");
        assert_eq!(caller.read(&grown).await.unwrap(), expected);
        let shrunk = caller.derive(&small, 10, &[]).await.unwrap();
        assert_eq!(caller.read(&shrunk).await.unwrap(), pattern(10));
        let regrown = caller.derive(&shrunk, 20, &[]).await.unwrap();
        let mut expected = pattern(10);
        expected.resize(20, 0);
        assert_eq!(
            caller.read(&regrown).await.unwrap(),
            expected,
            "hidden bytes stay hidden"
        );
        assert_refused(
            caller.derive(&small, 10, &[(8, b"abc")]).await,
            Code::OutOfRange,
            "past the new length",
        );

        caller.close().await.unwrap();
        callee.close().await.unwrap();
        let s = stats(&MemNode::new(connect(&addr).await)).await;
        assert_eq!((s.objects, s.pages, s.holds), (0, 0, 0), "{s:?}");
    });
    node.stop(Signal::TERM);
}

#[test]
fn the_node_refuses_what_it_did_not_issue_and_says_why() {
    let (node, addr) = start_node(&[]);
    runtime().block_on(async {
        let channel = connect(&addr).await;
        let session = Session::open(channel.clone(), "checker").await.unwrap();
        let r = session.put(&pattern(3 * PAGE_SIZE)).await.unwrap();

        let mut bytes = r.to_bytes();
        bytes[47] ^= 0x01; // the MAC
        let forged = RemoteRef::from_bytes(&bytes).unwrap();
        assert_refused(
            session.read(&forged).await,
            Code::PermissionDenied,
            "not a reference this memory node issued",
        );
        let mut bytes = r.to_bytes();
        bytes[24] += 1; // the length
        let longer = RemoteRef::from_bytes(&bytes).unwrap();
        assert_refused(
            session.read_pages(&longer, 0..1).await,
            Code::PermissionDenied,
            "forged or altered",
        );
        assert_refused(
            session.retain(&longer).await,
            Code::PermissionDenied,
            "not a reference",
        );

        let mut raw = MemNodeClient::new(channel.clone());
        for garbage in [&b"garbage"[..], &[0u8; 48][..], &[]] {
            let reply = raw
                .read(ReadRequest {
                    reference: garbage.to_vec().into(),
                    first_page: 0,
                    pages: 0,
                })
                .await;
            assert_refused(reply, Code::InvalidArgument, "RemoteRef::to_bytes()");
        }

        assert_refused(
            session.read_pages(&r, 2..4).await,
            Code::OutOfRange,
            "outside this object of 3 pages",
        );
        session.release(&r).await.unwrap();
        assert_refused(session.read(&r).await, Code::NotFound, "no longer held");
        assert_refused(session.release(&r).await, Code::NotFound, "no longer held");

        let other = Session::open(channel.clone(), "other").await.unwrap();
        let kept = other.put(b"kept").await.unwrap();
        assert_refused(
            session.release(&kept).await,
            Code::FailedPrecondition,
            "does not hold",
        );

        let closed = session.clone();
        session.close().await.unwrap();
        assert_refused(
            closed.put(b"late").await,
            Code::Unauthenticated,
            "open a new one",
        );
        assert_eq!(other.read(&kept).await.unwrap(), b"kept");
    });
    node.stop(Signal::TERM);
}

#[test]
fn references_do_not_survive_a_restart_of_the_node() {
    let (node, addr) = start_node(&[]);
    let r = runtime().block_on(async {
        let session = Session::open(connect(&addr).await, "before").await.unwrap();
        session.put(b"gone with the node").await.unwrap()
    });
    node.stop(Signal::TERM);
    let (node, again) = start_node_on(&addr, &[]);
    assert_eq!(again, addr);
    runtime().block_on(async {
        let session = Session::open(connect(&addr).await, "after").await.unwrap();
        assert_refused(
            session.read(&r).await,
            Code::NotFound,
            "the memory node restarted",
        );
        assert_refused(session.retain(&r).await, Code::NotFound, "its data is gone");
    });
    node.stop(Signal::TERM);
}

#[test]
fn a_full_node_refuses_and_recovers_after_release() {
    let (node, addr) = start_node(&["--capacity", "1", "--max-object", "1"]);
    runtime().block_on(async {
        let session = Session::open(connect(&addr).await, "filler").await.unwrap();
        let big = session.put(&pattern(768 << 10)).await.unwrap();
        assert_refused(
            session.put(&pattern(512 << 10)).await,
            Code::ResourceExhausted,
            "full",
        );
        let mut view = session.map(&big);
        for page in 0..70 {
            view.write(page * PAGE, b"x").await.unwrap();
        }
        assert_refused(view.publish().await, Code::ResourceExhausted, "full");
        assert_refused(
            session.put(&pattern(2 << 20)).await,
            Code::ResourceExhausted,
            "limit",
        );
        let s = stats(session.node()).await;
        assert_eq!((s.objects, s.pages, s.reserved_bytes), (1, 192, 0), "{s:?}");
        session.release(&big).await.unwrap();
        let r = session.put(&pattern(1 << 20)).await.unwrap();
        assert_eq!(session.read(&r).await.unwrap(), pattern(1 << 20));
    });
    node.stop(Signal::TERM);
}

#[test]
fn the_node_bounds_each_client_and_all_holds() {
    let (node, addr) = start_node(&["--max-sessions-per-peer", "2", "--max-holds", "3"]);
    runtime().block_on(async {
        let first = Session::open(connect(&addr).await, "first").await.unwrap();
        let second = Session::open(connect(&addr).await, "second").await.unwrap();
        assert_refused(
            Session::open(connect(&addr).await, "third").await,
            Code::ResourceExhausted,
            "2 sessions are open from 127.0.0.1, the limit per client",
        );
        let r = first.put(b"one").await.unwrap();
        first.put(&[]).await.unwrap();
        second.retain(&r).await.unwrap();
        assert_refused(
            first.put(&[]).await,
            Code::ResourceExhausted,
            "keeps 3 holds, its limit",
        );
        second.release(&r).await.unwrap();
        first.put(&[]).await.unwrap();
        let s = stats(first.node()).await;
        assert_eq!((s.sessions, s.objects, s.holds), (2, 3, 3), "{s:?}");
        second.close().await.unwrap();
        Session::open(connect(&addr).await, "third").await.unwrap();
    });
    node.stop(Signal::TERM);

    // A configuration the node cannot run: refused before it listens, naming the field.
    for flags in [
        &["--lease", "1441m"][..],
        &["--max-holds", "0"],
        &["--capacity", "0"],
    ] {
        let out = Command::new(BIN)
            .args(["memnode", "--listen", "127.0.0.1:0"])
            .args(flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{flags:?}: printed a readiness line");
        assert!(stderr.contains("MemNodeConfig::"), "{flags:?}: {stderr}");
    }
}

/// Entry point of the client process the kill test spawns (run only by it, via
/// `--ignored`): puts and derives objects, then starts a Put it never finishes, prints
/// `CLIENT READY` and waits to be killed.
#[test]
#[ignore = "entry point of the client process a test spawns"]
fn client_process_entry() {
    let Ok(addr) = std::env::var("NETLESS_MEMNODE_CLIENT") else {
        return;
    };
    runtime().block_on(async {
        let channel = connect(&addr).await;
        let session = Session::open(channel.clone(), "doomed").await.unwrap();
        let r = session.put(&pattern(300_000)).await.unwrap();
        session.put(&[]).await.unwrap();
        let mut view = session.map(&r);
        view.write(0, b"mine").await.unwrap();
        view.publish().await.unwrap();
        std::mem::forget(session); // as a crash would: no Close

        // A Put under a session of its own, kept alive by hand, stopped halfway.
        let mut raw = MemNodeClient::new(channel);
        let id = raw
            .open(OpenRequest {
                holder: "halfway".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .id;
        let mut keep = raw.clone();
        let keep_id = id.clone();
        tokio::spawn(async move {
            loop {
                let _ = keep
                    .keep_alive(SessionRequest {
                        session: keep_id.clone(),
                    })
                    .await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        let (chunks, rx) = tokio::sync::mpsc::channel(4);
        let first = PutChunk {
            session: id,
            total_len: 4 << 20,
            data: vec![1; 256 << 10].into(),
        };
        chunks.send(first).await.unwrap();
        tokio::spawn(async move {
            raw.put(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
        });
        // A byte at a time from now on: the Put is under way, and stays so, until the kill.
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let byte = PutChunk {
                    data: vec![2].into(),
                    ..Default::default()
                };
                if chunks.send(byte).await.is_err() {
                    return;
                }
            }
        });
        println!("CLIENT READY");
        std::io::stdout().flush().unwrap();
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
    });
}

#[test]
fn a_killed_client_leaves_no_page_behind_and_others_are_served_meanwhile() {
    let (node, addr) = start_node(&["--lease", "1s"]);
    let (mut client, _) = Peer::spawn(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "client_process_entry",
                "--ignored",
                "--nocapture",
            ])
            .env("NETLESS_MEMNODE_CLIENT", &addr),
        "CLIENT READY",
    );
    runtime().block_on(async {
        let observer = MemNode::new(connect(&addr).await);
        let s = wait_for(&observer, SHORT, |s| s.reserved_bytes > 0).await;
        assert_eq!((s.objects, s.sessions), (3, 2), "{s:?}");
        assert_eq!(s.pages, 74 + 1, "74 pages put, one private copy: {s:?}");
        assert_eq!(
            s.reserved_bytes,
            4 << 20,
            "the whole Put is set aside: {s:?}"
        );

        client.kill();
        let other = Session::open(connect(&addr).await, "survivor")
            .await
            .unwrap();
        let data = pattern(100_000);
        let r = other.put(&data).await.unwrap();
        // Past the dead client's lease, with KeepAlives the survivor's session lives on.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(other.read(&r).await.unwrap(), data);

        let s = wait_for(&observer, SHORT, |s| s.sessions == 1).await;
        assert_eq!(
            (s.objects, s.reserved_bytes),
            (1, 0),
            "only the survivor's: {s:?}"
        );
        other.close().await.unwrap();
        let s = stats(&observer).await;
        assert_eq!(
            (s.objects, s.pages, s.bytes, s.holds, s.reserved_bytes),
            (0, 0, 0, 0, 0),
            "{s:?}"
        );
    });
    node.stop(Signal::TERM);
}

#[test]
fn stat_prints_what_the_node_holds() {
    let (node, addr) = start_node(&[]);
    let dir = TestDir::new("mn");
    let session = runtime().block_on(async {
        let session = Session::open(connect(&addr).await, "stat").await.unwrap();
        session.put(&pattern(5000)).await.unwrap();
        session
    });
    let out = common::run(&dir, &["memnode", "stat", "--addr", &addr, "--json"], SHORT).ok();
    let json = out.json();
    assert_eq!(
        (json["objects"].as_u64(), json["pages"].as_u64()),
        (Some(1), Some(2)),
        "{json}"
    );
    assert_eq!(json["sessions"].as_u64(), Some(1), "{json}");
    let out = common::run(
        &dir,
        &["memnode", "stat", "--addr", &format!("http://{addr}")],
        SHORT,
    )
    .ok();
    assert!(out.stdout.contains("objects     1"), "{}", out.describe());
    drop(session);
    node.stop(Signal::TERM);
    let out = common::run(&dir, &["memnode", "stat", "--addr", &addr], SHORT);
    assert_eq!(out.status.code(), Some(2), "{}", out.describe());
    assert!(out.stderr.contains("is it running?"), "{}", out.describe());
}

/// Entry point of the peer that serves a memory node over netless (run only by the test
/// below, via `--ignored`): serves until stdin closes.
#[test]
#[ignore = "entry point of the node process a test spawns"]
fn netless_node_entry() {
    if std::env::var_os("NETLESS_MEMNODE_NETLESS").is_none() {
        return;
    }
    let node =
        netless_memnode::MemNodeService::new(netless_memnode::MemNodeConfig::default()).unwrap();
    let serving = netless_grpc::GrpcServer::new()
        .add_service(node.into_server())
        .serve()
        .unwrap();
    println!("NODE READY");
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(serving);
}

#[test]
fn the_client_runs_over_netless_too() {
    let dir = TestDir::new("mn-nl");
    let (_node, _) = Peer::spawn(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "netless_node_entry", "--ignored", "--nocapture"])
            .env("NETLESS_MEMNODE_NETLESS", "1")
            .env("NETLESS_DIR", &dir.path),
        "NODE READY",
    );
    runtime().block_on(async {
        let config = netless::ClientConfig {
            dir: Some(dir.path.clone()),
            ..Default::default()
        };
        let channel =
            netless_grpc::Channel::connect_with("netless.memnode.MemNode", config).unwrap();
        let session = Session::open(channel, "local").await.unwrap();
        let data = pattern(700_000);
        let r = session.put(&data).await.unwrap();
        assert_eq!(session.read(&r).await.unwrap(), data);
        let mut view = session.map(&r);
        view.write(100, b"local write").await.unwrap();
        let edited = view.publish().await.unwrap();
        assert_eq!(
            session.read_pages(&edited, 0..1).await.unwrap()[100..111],
            *b"local write"
        );
        assert_eq!(session.read(&r).await.unwrap(), data);
        let s = stats(session.node()).await;
        assert_eq!((s.objects, s.pages), (2, 171 + 1), "{s:?}");
        assert_eq!(session.close().await.unwrap(), 2);
    });
}
