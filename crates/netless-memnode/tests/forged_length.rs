//! A reference's length is only as true as its MAC, which only the node can check: a reader
//! handed a forged reference with a huge length must not allocate, or build a list, in
//! proportion to it before the node has refused it.
//!
//! This binary's allocator records the largest allocation made while a forged reference is
//! read, and refuses any over 256 MiB (the process then aborts: a failure, not a machine
//! out of memory). One test only, so that nothing else allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use netless_memnode::{MemNodeConfig, RemoteRef, Session};
use tonic::Code;

struct Recording;

static ARMED: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);
const REFUSED_OVER: usize = 256 << 20;

impl Recording {
    fn allowed(size: usize) -> bool {
        if !ARMED.load(Ordering::Relaxed) {
            return true;
        }
        LARGEST.fetch_max(size, Ordering::Relaxed);
        size <= REFUSED_OVER
    }
}

// SAFETY: every call is passed on to `System` unchanged, or refused with a null pointer,
// which `GlobalAlloc` allows.
unsafe impl GlobalAlloc for Recording {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !Recording::allowed(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's guarantees for `layout` are `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !Recording::allowed(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !Recording::allowed(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` came from `System` with `layout`; the caller's guarantees for
        // `new_size` are `System`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Recording = Recording;

/// Runs `call` with the allocator recording; returns its result and the largest
/// allocation made meanwhile (by the client or the node, both in this process).
async fn recorded<F: std::future::Future>(call: F) -> (F::Output, usize) {
    LARGEST.store(0, Ordering::Relaxed);
    ARMED.store(true, Ordering::Relaxed);
    let output = call.await;
    ARMED.store(false, Ordering::Relaxed);
    (output, LARGEST.load(Ordering::Relaxed))
}

/// `genuine` with its length replaced (its MAC no longer matches), or its incarnation too.
fn forged(genuine: &RemoteRef, len: u64, other_run: bool) -> RemoteRef {
    let mut bytes = genuine.to_bytes();
    bytes[24..32].copy_from_slice(&len.to_le_bytes());
    if other_run {
        bytes[8] ^= 1;
    }
    RemoteRef::from_bytes(&bytes).unwrap()
}

/// Well above what a refused call allocates (a few KiB of HTTP/2 buffers), far below any
/// forged length.
const SMALL: usize = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_length_costs_nothing_before_the_node_refuses_it() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(netless_memnode::serve(listener, MemNodeConfig::default()));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let session = Session::open(channel, "victim").await.unwrap();
    let genuine = session.put(b"twelve bytes").await.unwrap();
    let started = Instant::now();

    for (len, other_run, code) in [
        (1 << 38, false, Code::PermissionDenied),
        (1 << 50, false, Code::PermissionDenied),
        (u64::MAX, false, Code::PermissionDenied),
        (1 << 50, true, Code::NotFound),
    ] {
        let r = forged(&genuine, len, other_run);
        let (result, largest) = recorded(session.read(&r)).await;
        assert_eq!(
            result.unwrap_err().code(),
            code,
            "Session::read, {len} bytes"
        );
        assert!(
            largest < SMALL,
            "Session::read of {len} bytes allocated {largest} bytes"
        );

        let (result, largest) = recorded(session.read_pages(&r, 0..r.pages())).await;
        assert_eq!(result.unwrap_err().code(), code, "read_pages, {len} bytes");
        assert!(
            largest < SMALL,
            "read_pages of {len} bytes allocated {largest} bytes"
        );

        let mut view = session.map(&r);
        let (result, largest) = recorded(view.to_vec()).await;
        assert_eq!(
            result.unwrap_err().code(),
            code,
            "RemoteBuf::to_vec, {len} bytes"
        );
        assert!(
            largest < SMALL,
            "RemoteBuf::to_vec of {len} bytes allocated {largest} bytes"
        );

        // Pages written whole are not fetched; a read across them still asks the node
        // before it sizes anything.
        view.write(3 * 4096, &[1; 4096]).await.unwrap();
        let (result, largest) = recorded(view.read(0..len / 2)).await;
        assert_eq!(
            result.unwrap_err().code(),
            code,
            "RemoteBuf::read, {len} bytes"
        );
        assert!(
            largest < SMALL,
            "RemoteBuf::read of {len} bytes allocated {largest} bytes"
        );
        assert_eq!(view.fetched_pages(), 0);
    }
    // Each refusal is one round trip: a few milliseconds, not seconds.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(session.read(&genuine).await.unwrap(), b"twelve bytes");
}
