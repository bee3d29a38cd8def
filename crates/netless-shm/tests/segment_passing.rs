//! A segment created, sealed, passed over a socket pair and attached by the "peer".
// Never built under loom: clippy.toml's ban (enforced under `--cfg loom`) does not apply,
// and without loom the shim's atomics are std's types anyway.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]
#![cfg(not(loom))] // Uses real shared memory; loom atomics only work inside loom::model.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use netless_shm::sync::{AtomicU64, Ordering};
use netless_shm::{recv_frame, send_frame, Error, Segment};
use rustix::fs::{MemfdFlags, SealFlags};

#[test]
fn created_segment_is_sealed_against_resizing() {
    let segment = Segment::create("sealed", 64 * 1024).unwrap();
    let seals = rustix::fs::fcntl_get_seals(segment.fd()).unwrap();
    assert!(seals.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL));
    assert_eq!(
        rustix::fs::ftruncate(segment.fd(), 4096),
        Err(rustix::io::Errno::PERM)
    );
    assert_eq!(
        rustix::fs::ftruncate(segment.fd(), 1 << 20),
        Err(rustix::io::Errno::PERM)
    );
    // F_SEAL_SEAL: no more seals can be added (or removed).
    assert!(rustix::fs::fcntl_add_seals(segment.fd(), SealFlags::WRITE).is_err());
    let received_fd = rustix::io::fcntl_getfd(segment.fd()).unwrap();
    assert!(received_fd.contains(rustix::io::FdFlags::CLOEXEC));
}

#[test]
fn passed_segment_shares_memory_both_ways() {
    let (server, client) = UnixStream::pair().unwrap();
    let created = Segment::create("passed", 2 * 4096).unwrap();
    send_frame(&server, b"segment", &[created.fd()]).unwrap();

    let (payload, fds) = recv_frame(&client, 1).unwrap();
    assert_eq!(payload, b"segment");
    assert_eq!(fds.len(), 1);
    let attached = Segment::attach(fds.into_iter().next().unwrap(), 1 << 20).unwrap();
    assert_eq!(attached.len(), created.len());
    assert_ne!(
        attached.as_ptr(),
        created.as_ptr(),
        "a second, distinct mapping"
    );

    // SAFETY: both mappings are at least 8 KiB and page aligned, so offsets 0 and 4096 hold
    // aligned AtomicU64s that live as long as the segments; all access is atomic.
    let (a0, a1, b0, b1) = unsafe {
        (
            &*(created.as_ptr() as *const AtomicU64),
            &*(created.as_ptr().add(4096) as *const AtomicU64),
            &*(attached.as_ptr() as *const AtomicU64),
            &*(attached.as_ptr().add(4096) as *const AtomicU64),
        )
    };
    a0.store(0xfeed_beef, Ordering::Release);
    assert_eq!(b0.load(Ordering::Acquire), 0xfeed_beef);
    b1.store(42, Ordering::Release);
    assert_eq!(a1.load(Ordering::Acquire), 42);

    // The attached segment lives on after the creator drops its side.
    drop(created);
    assert_eq!(b0.load(Ordering::Acquire), 0xfeed_beef);
}

fn unsealed_memfd(len: u64, seals: SealFlags) -> OwnedFd {
    let fd =
        rustix::fs::memfd_create("raw", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&fd, len).unwrap();
    if !seals.is_empty() {
        rustix::fs::fcntl_add_seals(&fd, seals).unwrap();
    }
    fd
}

#[test]
fn attach_refuses_unsealed_memfd() {
    let err = Segment::attach(unsealed_memfd(4096, SealFlags::empty()), 1 << 20).unwrap_err();
    assert!(matches!(err, Error::NotSealed { .. }), "{err}");
    // Only one of the two seals is not enough either.
    let err = Segment::attach(unsealed_memfd(4096, SealFlags::SHRINK), 1 << 20).unwrap_err();
    assert!(matches!(err, Error::NotSealed { .. }), "{err}");
    let err = Segment::attach(unsealed_memfd(4096, SealFlags::GROW), 1 << 20).unwrap_err();
    assert!(matches!(err, Error::NotSealed { .. }), "{err}");
    // Both are enough (F_SEAL_SEAL is the creator's business).
    let ok = Segment::attach(
        unsealed_memfd(4096, SealFlags::SHRINK | SealFlags::GROW),
        1 << 20,
    )
    .unwrap();
    assert_eq!(ok.len(), 4096);
}

#[test]
fn attach_refuses_memfd_without_sealing_support() {
    let fd = rustix::fs::memfd_create("nosealing", MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&fd, 4096).unwrap();
    let err = Segment::attach(fd, 1 << 20).unwrap_err();
    // F_SEAL_SEAL is preset on memfds created without MFD_ALLOW_SEALING.
    assert!(matches!(err, Error::NotSealed { .. }), "{err}");
}

#[test]
fn attach_refuses_oversized_and_empty() {
    let segment = Segment::create("big", 8192).unwrap();
    let fd = segment.fd().try_clone_to_owned().unwrap();
    let err = Segment::attach(fd, 8191).unwrap_err();
    assert!(
        matches!(
            err,
            Error::SegmentTooLarge {
                len: 8192,
                max: 8191
            }
        ),
        "{err}"
    );
    let fd = segment.fd().try_clone_to_owned().unwrap();
    assert_eq!(Segment::attach(fd, 8192).unwrap().len(), 8192);

    let err = Segment::attach(
        unsealed_memfd(0, SealFlags::SHRINK | SealFlags::GROW),
        1 << 20,
    )
    .unwrap_err();
    assert!(matches!(err, Error::EmptySegment), "{err}");
}

#[test]
fn attach_refuses_sockets_and_pipes() {
    let (a, _b) = UnixStream::pair().unwrap();
    let err = Segment::attach(a.as_fd().try_clone_to_owned().unwrap(), 1 << 20).unwrap_err();
    assert!(
        matches!(err, Error::BadSegment { .. } | Error::EmptySegment),
        "{err}"
    );
}
