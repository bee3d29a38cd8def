//! One-process semantics of the pool: copy-on-write, Ref validation, the DmRPC calls, limits.

use netless_pool::{Domain, PoolError, PoolGeometry, Ref, PAGE_SIZE};

fn domain() -> Domain {
    Domain::private(PoolGeometry {
        pages: 4096,
        ref_slots: 8192,
    })
    .unwrap()
}

fn all_free(d: &Domain) -> bool {
    let s = d.stats();
    s.free_pages + s.held_pages == s.pages && s.held_pages == s.leased_pages
}

#[test]
fn copy_on_write_isolates_both_sides() {
    let d = domain();
    let mut a = d.alloc_from(&vec![1u8; 5 * PAGE_SIZE + 100]).unwrap();
    let r = a.share().unwrap();
    let mut b = d.map(&r).unwrap();
    assert_eq!(b.pages(), a.pages(), "mapping shares the pages");
    let before = d.stats().pages_copied;
    a.write(PAGE_SIZE + 10, &[2; 3]).unwrap();
    assert_eq!(
        d.stats().pages_copied - before,
        1,
        "one touched page copied"
    );
    b.write(0, &[3; PAGE_SIZE]).unwrap();
    let va = a.to_vec();
    let vb = b.to_vec();
    assert_eq!(&va[..3], &[1, 1, 1]);
    assert_eq!(&va[PAGE_SIZE + 10..PAGE_SIZE + 13], &[2, 2, 2]);
    assert_eq!(&vb[..3], &[3, 3, 3]);
    assert_eq!(&vb[PAGE_SIZE + 10..PAGE_SIZE + 13], &[1, 1, 1]);
    assert_eq!(
        a.pages()[2..],
        b.pages()[2..],
        "untouched pages stay shared"
    );
    drop((a, b));
    assert!(all_free(&d));
}

#[test]
fn sole_owner_writes_in_place_and_reads_zero_copy() {
    let d = domain();
    let mut a = d.alloc(3 * PAGE_SIZE).unwrap();
    a.write(0, &[9; 3 * PAGE_SIZE]).unwrap();
    assert_eq!(d.stats().pages_copied, 0);
    let slice = a.as_slice().expect("a fresh allocation is contiguous");
    assert!(slice.iter().all(|&b| b == 9));
    assert_eq!(a.chunks().map(<[u8]>::len).sum::<usize>(), 3 * PAGE_SIZE);
}

#[test]
fn refs_are_checked() {
    let d = domain();
    let a = d.alloc_from(b"hello").unwrap();
    let r = a.share().unwrap();
    // Another domain's Ref.
    let other = domain();
    let mut foreign = Ref::from_bytes(&r.to_bytes()).unwrap();
    assert!(matches!(
        other.map(&foreign),
        Err(PoolError::RefGone(_)) | Err(PoolError::ForeignRef { .. })
    ));
    let mut bytes = r.to_bytes();
    bytes[8] ^= 0x55; // domain id
    foreign = Ref::from_bytes(&bytes).unwrap();
    assert!(matches!(d.map(&foreign), Err(PoolError::ForeignRef { .. })));
    // Forged: slot out of range, wrong generation, wrong length.
    let mut bytes = r.to_bytes();
    bytes[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        d.map(&Ref::from_bytes(&bytes).unwrap()),
        Err(PoolError::InvalidRef(_))
    ));
    let mut bytes = r.to_bytes();
    bytes[16] ^= 1;
    assert!(matches!(
        d.map(&Ref::from_bytes(&bytes).unwrap()),
        Err(PoolError::RefGone(_))
    ));
    let mut bytes = r.to_bytes();
    bytes[24] ^= 1;
    assert!(matches!(
        d.map(&Ref::from_bytes(&bytes).unwrap()),
        Err(PoolError::InvalidRef(_))
    ));
    // A Ref maps once.
    let b = d.map(&r).unwrap();
    let again = d.map(&r).unwrap_err();
    assert!(again.to_string().contains("mapped already"), "{again}");
    // Revoked Refs are gone.
    let r2 = a.share().unwrap();
    d.revoke(&r2).unwrap();
    assert!(matches!(d.map(&r2), Err(PoolError::RefGone(_))));
    assert!(matches!(d.revoke(&r2), Err(PoolError::RefGone(_))));
    drop((a, b));
    d.collect();
    assert!(all_free(&d));
}

#[test]
fn dmrpc_calls_and_double_free() {
    let d = domain();
    let addr = d.ralloc(10_000).unwrap();
    d.rwrite(addr, 0, &[5; 10_000]).unwrap();
    let r = d.create_ref(addr, 6000).unwrap();
    let mapped = d.map_ref(&r).unwrap();
    d.rwrite(mapped, 0, &[6; 10]).unwrap();
    let mut out = [0u8; 10];
    d.rread(addr, 0, &mut out).unwrap();
    assert_eq!(out, [5; 10], "the caller never sees the callee's write");
    d.rread(mapped, 0, &mut out).unwrap();
    assert_eq!(out, [6; 10]);
    assert!(matches!(
        d.rread(mapped, 5995, &mut out),
        Err(PoolError::OutOfBounds { .. })
    ));
    d.rfree(addr).unwrap();
    assert!(matches!(d.rfree(addr), Err(PoolError::DoubleFree(_))));
    d.rfree(mapped).unwrap();
    d.collect();
    assert!(all_free(&d), "{:?}", d.stats());
}

#[test]
fn count_overflow_and_exhaustion_are_refused() {
    let d = domain();
    let a = d.alloc_from(b"x").unwrap();
    let mut refs = Vec::new();
    let err = loop {
        match a.share() {
            Ok(r) => refs.push(r),
            Err(e) => break e,
        }
        assert!(refs.len() <= netless_pool::MAX_LOCAL_REFS as usize);
    };
    assert!(matches!(err, PoolError::CountOverflow { .. }), "{err}");
    for r in &refs {
        d.revoke(r).unwrap();
    }
    drop(a);
    let small = Domain::private(PoolGeometry {
        pages: 64,
        ref_slots: 4,
    })
    .unwrap();
    let err = small.alloc(65 * PAGE_SIZE).unwrap_err();
    assert!(matches!(err, PoolError::Exhausted(_)), "{err}");
    let buf = small.alloc(PAGE_SIZE).unwrap();
    let refs: Vec<_> = (0..4).map(|_| buf.share().unwrap()).collect();
    assert!(matches!(buf.share(), Err(PoolError::Exhausted(_))));
    for r in &refs {
        small.revoke(r).unwrap();
    }
    drop(buf);
    assert!(all_free(&small));
}

#[test]
fn map_from_accepts_only_the_creators_refs() {
    let d = domain();
    let a = d.alloc_from(b"mine").unwrap();
    let r = a.share().unwrap();
    // A server maps a connection's Refs only if that peer created them.
    let err = d.map_from(&r, 1).unwrap_err();
    assert!(matches!(err, PoolError::InvalidRef(_)), "{err}");
    assert!(d.has_member(std::process::id()));
    assert!(!d.has_member(1));
    let b = d.map_from(&r, std::process::id()).unwrap();
    assert_eq!(b.to_vec(), b"mine");
}

#[test]
fn a_freed_run_is_leased_whole_and_reused() {
    let d = domain();
    let a = d.alloc_from(&vec![1u8; 8 * PAGE_SIZE]).unwrap();
    let run = a.pages().to_vec();
    drop(a);
    assert!(
        all_free(&d),
        "a leased run counts as leased: {:?}",
        d.stats()
    );
    let b = d.alloc(6 * PAGE_SIZE).unwrap();
    assert_eq!(b.pages(), &run[..6], "the freed run is taken again");
    // Shared, mapped and dropped: the run comes back when the Ref is collected.
    let r = b.share().unwrap();
    let c = d.map(&r).unwrap();
    drop((b, c));
    let e = d.alloc(6 * PAGE_SIZE).unwrap();
    assert_eq!(e.pages(), &run[..6]);
    drop(e);
    d.collect();
    assert!(all_free(&d), "{:?}", d.stats());
}

#[test]
fn writes_across_pages_copy_only_shared_pages() {
    let d = domain();
    let mut a = d.alloc_from(&vec![1u8; 4 * PAGE_SIZE]).unwrap();
    let r = a.share().unwrap();
    let b = d.map(&r).unwrap();
    let before = d.stats().pages_copied;
    // Bytes 100 into page 1 to 50 into page 3: three pages touched, all shared.
    a.write(PAGE_SIZE + 100, &vec![2u8; 2 * PAGE_SIZE - 50])
        .unwrap();
    assert_eq!(d.stats().pages_copied - before, 3);
    let va = a.to_vec();
    assert!(va[..PAGE_SIZE + 100].iter().all(|&x| x == 1));
    assert!(va[PAGE_SIZE + 100..3 * PAGE_SIZE + 50]
        .iter()
        .all(|&x| x == 2));
    assert!(va[3 * PAGE_SIZE + 50..].iter().all(|&x| x == 1));
    assert!(
        b.to_vec().iter().all(|&x| x == 1),
        "the receiver's view is unchanged"
    );
    a.write(3 * PAGE_SIZE, &[]).unwrap();
    assert_eq!(
        d.stats().pages_copied - before,
        3,
        "an empty write copies nothing"
    );
    drop((a, b));
    d.collect();
    assert!(all_free(&d), "{:?}", d.stats());
}
