//! The node in this process, over TCP: what its clients may take, and how a view fetches.

use netless_memnode::proto::mem_node_client::MemNodeClient;
use netless_memnode::proto::OpenRequest;
use netless_memnode::{MemNodeConfig, Session, PAGE_SIZE};
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
