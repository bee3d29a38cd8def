//! The node in this process, over TCP: what its clients may take, and how a view fetches.

use std::time::{Duration, Instant};

use bytes::Bytes;
use netless_memnode::proto::mem_node_client::MemNodeClient;
use netless_memnode::proto::{DeriveChunk, OpenRequest, PageWrite, PutChunk, SessionRequest};
use netless_memnode::{MemNode, MemNodeConfig, Session, Stats, PAGE_SIZE};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Code;

/// A node with `config` on a free port of 127.0.0.1, and its address.
async fn start(config: MemNodeConfig) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(netless_memnode::serve(listener, config));
    addr
}

async fn connect(addr: std::net::SocketAddr) -> Channel {
    connect_from(addr, "127.0.0.1").await
}

/// A connection to `addr` from the loopback address `local` (any of 127.0.0.0/8).
async fn connect_from(addr: std::net::SocketAddr, local: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .local_address(Some(local.parse().unwrap()))
        .connect()
        .await
        .unwrap()
}

/// Polls the node's stats until `done` holds, for up to `timeout`.
async fn wait_for(node: &MemNode<Channel>, timeout: Duration, done: impl Fn(&Stats) -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        let s = node.stats().await.unwrap();
        if done(&s) {
            return;
        }
        assert!(Instant::now() < deadline, "not within {timeout:?}: {s:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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

/// Bytes that differ from page to page and within each.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_fetches_a_large_object_a_batch_at_a_time() {
    let addr = start(MemNodeConfig::default()).await;
    let session = Session::open(connect(addr).await, "reader").await.unwrap();
    let data = pattern(2500 * PAGE_SIZE + 7);
    let r = session.put(&data).await.unwrap();
    let mut view = session.map(&r);
    // Pages cached here and there: the runs between them are fetched, nothing twice.
    assert_eq!(view.read(5..6).await.unwrap(), data[5..6]);
    let at = 1500 * PAGE_SIZE;
    assert_eq!(
        view.read(at as u64..at as u64 + 9000).await.unwrap(),
        data[at..at + 9000]
    );
    view.write(2000 * PAGE_SIZE as u64, &[9; PAGE_SIZE])
        .await
        .unwrap();
    let before = session.node().stats().await.unwrap().pages_read;
    let whole = view.to_vec().await.unwrap();
    let mut expected = data.clone();
    expected[2000 * PAGE_SIZE..2001 * PAGE_SIZE].fill(9);
    assert!(
        whole == expected,
        "the view reads what was put, and its own write"
    );
    assert_eq!(view.fetched_pages(), 2500);
    let read = session.node().stats().await.unwrap().pages_read - before;
    assert_eq!(
        read,
        2501 - 1 - 3 - 1,
        "pages cached or written are not fetched"
    );
    assert!(session.read(&r).await.unwrap() == data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_cannot_take_every_session() {
    let addr = start(MemNodeConfig {
        max_sessions: 50,
        max_sessions_per_peer: 3,
        ..MemNodeConfig::default()
    })
    .await;
    // Connections of their own do not make a client another one: its address does.
    for _ in 0..3 {
        let mut raw = MemNodeClient::new(connect(addr).await);
        raw.open(OpenRequest {
            holder: "hog".into(),
        })
        .await
        .unwrap();
    }
    assert_refused(
        Session::open(connect(addr).await, "hog").await,
        Code::ResourceExhausted,
        "3 sessions are open from 127.0.0.1, the limit per client",
    );
    let other = Session::open(connect_from(addr, "127.0.0.2").await, "other")
        .await
        .unwrap();
    other.put(b"served").await.unwrap();
    assert_eq!(other.node().stats().await.unwrap().sessions, 4);
}

/// A Put or Derive under way whose session is closed gives its reservation back at once:
/// on its next chunk, or within a sweep period (a quarter lease, at most 1 s) if none
/// comes, not a lease later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_session_ended_gives_its_reservation_back() {
    let addr = start(MemNodeConfig::default()).await; // a lease of 10 s
    let channel = connect(addr).await;
    let node = MemNode::new(channel.clone());
    let owner = Session::open(channel.clone(), "owner").await.unwrap();
    let base = Bytes::copy_from_slice(&owner.put(&[5; 8 * PAGE_SIZE]).await.unwrap().to_bytes());
    let write = |page| PageWrite {
        page,
        offset: 0,
        data: Bytes::from_static(b"w"),
    };

    for (call, keep_sending) in [
        ("put", true),
        ("put", false),
        ("derive", true),
        ("derive", false),
    ] {
        let mut raw = MemNodeClient::new(channel.clone());
        let id = raw
            .open(OpenRequest {
                holder: call.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .id;
        let (put_tx, put_rx) = mpsc::channel(1);
        let (derive_tx, derive_rx) = mpsc::channel(1);
        let mut client = raw.clone();
        let reply = tokio::spawn(async move {
            if call == "put" {
                client.put(ReceiverStream::new(put_rx)).await.map(|_| ())
            } else {
                client
                    .derive(ReceiverStream::new(derive_rx))
                    .await
                    .map(|_| ())
            }
        });
        if call == "put" {
            let first = PutChunk {
                session: id.clone(),
                total_len: 1 << 20,
                data: Bytes::from_static(b"p"),
            };
            put_tx.send(first).await.unwrap();
        } else {
            let first = DeriveChunk {
                session: id.clone(),
                base: base.clone(),
                len: None,
                writes: vec![write(0)],
            };
            derive_tx.send(first).await.unwrap();
        }
        wait_for(&node, Duration::from_secs(5), |s| s.reserved_bytes > 0).await;

        raw.close(SessionRequest { session: id }).await.unwrap();
        let started = Instant::now();
        let sender = tokio::spawn(async move {
            for i in 1..250u64 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let sent = if !keep_sending {
                    Ok(())
                } else if call == "put" {
                    put_tx
                        .send(PutChunk {
                            data: Bytes::from_static(b"p"),
                            ..PutChunk::default()
                        })
                        .await
                        .map_err(drop)
                } else {
                    derive_tx
                        .send(DeriveChunk {
                            writes: vec![write(i % 8)],
                            ..DeriveChunk::default()
                        })
                        .await
                        .map_err(drop)
                };
                if sent.is_err() {
                    return;
                }
            }
        });
        let ended = tokio::time::timeout(Duration::from_secs(4), reply).await;
        sender.abort();
        let ended = ended.unwrap_or_else(|_| {
            panic!("{call} (sending: {keep_sending}) still runs after its session closed")
        });
        assert_refused(ended.unwrap(), Code::Unauthenticated, "open a new one");
        let s = node.stats().await.unwrap();
        assert_eq!(
            s.reserved_bytes,
            0,
            "{call} after {:?}: {s:?}",
            started.elapsed()
        );
    }
    let s = node.stats().await.unwrap();
    assert_eq!((s.objects, s.sessions), (1, 1), "{s:?}");
}
