//! A domain in a memory fabric: members that share nothing but the region pass Refs, a dead
//! member's pages come back, and the pool outlives the member that made it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use netless_pool::{Domain, DomainConfig, PoolGeometry};
use netless_shm::fabric::{Fabric, FabricOptions};

fn region(tag: &str) -> std::path::PathBuf {
    let path =
        std::env::temp_dir().join(format!("netless-pool-fabric-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

fn open(path: &std::path::Path) -> Fabric {
    Fabric::open(
        path,
        &FabricOptions {
            size: 64 << 20,
            lease: Duration::from_millis(200),
            ..FabricOptions::default()
        },
    )
    .unwrap()
}

fn config() -> DomainConfig {
    let mut config = DomainConfig::new("fab");
    config.geometry = PoolGeometry {
        pages: 1024,
        ref_slots: 256,
    };
    config
}

fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn members_of_a_fabric_pass_refs_with_copy_on_write() {
    let path = region("refs");
    let (fa, fb) = (open(&path), open(&path));
    let a = Domain::join_fabric(&config(), &fa).unwrap();
    let b = Domain::join_fabric(&config(), &fb).unwrap();
    assert_eq!(a.id(), b.id(), "both joined the one pool");
    assert_eq!(a.stats().members, 2);
    let data: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
    let mine = a.alloc_from(&data).unwrap();
    let r = mine.share().unwrap();
    let mut seen = b.map(&r).unwrap();
    assert_eq!(seen.to_vec(), data);
    seen.write(0, &[0xff; 4096]).unwrap();
    assert_eq!(&seen.to_vec()[..4096], &[0xff; 4096][..]);
    assert_eq!(
        mine.to_vec(),
        data,
        "the callee's write changed the caller's pages"
    );
    drop((seen, mine));
    let _ = std::fs::remove_file(path);
}

#[test]
fn the_pool_outlives_the_member_that_made_it() {
    let path = region("heir");
    let (fa, fb) = (open(&path), open(&path));
    let a = Domain::join_fabric(&config(), &fa).unwrap();
    let b = Domain::join_fabric(&config(), &fb).unwrap();
    let id = a.id();
    let kept = b.alloc_from(b"kept").unwrap();
    drop(a);
    // The heir lists the pool again; a newcomer finds the same pool.
    let fc = open(&path);
    eventually("the heir never listed the pool", || {
        !fc.lookup("pool.fab", None).is_empty()
    });
    let c = Domain::join_fabric(&config(), &fc).unwrap();
    assert_eq!(c.id(), id);
    let r = kept.share().unwrap();
    assert_eq!(c.map(&r).unwrap().to_vec(), b"kept");
    drop((kept, b, c));
    let _ = std::fs::remove_file(path);
}

/// The child: joins, takes pages, says so, waits to be killed.
#[test]
fn child_member() {
    let Ok(path) = std::env::var("NETLESS_POOL_FABRIC_CHILD") else {
        return;
    };
    let fabric = open(path.as_ref());
    let domain = Domain::join_fabric(&config(), &fabric).unwrap();
    let held = domain.alloc_from(&vec![7u8; 200 * 4096]).unwrap();
    println!("READY");
    std::thread::sleep(Duration::from_secs(60));
    drop(held);
}

#[test]
fn a_killed_members_pages_come_back() {
    let path = region("kill");
    let fabric = open(&path);
    let domain = Domain::join_fabric(&config(), &fabric).unwrap();
    let before = domain.stats();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_member", "--nocapture", "--test-threads=1"])
        .env("NETLESS_POOL_FABRIC_CHILD", &path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    eventually("the child never joined", || domain.stats().members == 2);
    eventually("the child never took its pages", || {
        domain.stats().free_pages + 200 <= before.free_pages
    });
    child.kill().unwrap();
    child.wait().unwrap();
    eventually("the dead member's pages stayed", || {
        let s = domain.stats();
        s.members == 1 && s.free_pages == before.free_pages
    });
    let _ = std::fs::remove_file(path);
}

#[test]
fn pages_not_written_back_never_pass_for_the_data() {
    use netless_shm::coherence::{Coherence, Faults};
    let path = region("view");
    let options = |faults| FabricOptions {
        size: 64 << 20,
        coherence: Coherence::Software,
        emulation: Some(faults),
        ..FabricOptions::default()
    };
    let fa = Fabric::open(&path, &options(Faults::default())).unwrap();
    let fb = Fabric::open(&path, &options(Faults::default())).unwrap();
    let (a, b) = (
        Domain::join_fabric(&config(), &fa).unwrap(),
        Domain::join_fabric(&config(), &fb).unwrap(),
    );
    let mut out = Vec::new();
    for (round, (skip_flush, skip_invalidate, arrives)) in [
        (false, false, true),
        (true, false, false),
        (false, true, false),
    ]
    .into_iter()
    .enumerate()
    {
        // Other bytes each round: a freed buffer's pages may come back to the next
        // allocation, with the last round's bytes in them.
        let data: Vec<u8> = (0..20_000u32)
            .map(|i| (i % 251) as u8 + 1 + round as u8)
            .collect();
        let mut writer = a
            .pages_view(
                Coherence::Software,
                Some(Faults {
                    skip_flush,
                    skip_invalidate: false,
                }),
            )
            .unwrap();
        // The reader has seen these pages before (its private copy), as a host's cache would.
        let mut reader = b
            .pages_view(
                Coherence::Software,
                Some(Faults {
                    skip_flush: false,
                    skip_invalidate,
                }),
            )
            .unwrap();
        let buf = a.alloc(data.len()).unwrap();
        writer.write_back(&buf, &data).unwrap();
        let seen = b.map(&buf.share().unwrap()).unwrap();
        reader.read_fresh(&seen, &mut out).unwrap();
        assert_eq!(
            out == data,
            arrives,
            "skip_flush {skip_flush}, skip_invalidate {skip_invalidate}"
        );
    }
    let _ = std::fs::remove_file(path);
}

#[test]
fn members_joining_at_once_make_one_pool() {
    let path = region("race");
    for round in 0..5 {
        let name = format!("race{round}");
        let fabrics: Vec<Fabric> = (0..4).map(|_| open(&path)).collect();
        let barrier = std::sync::Barrier::new(fabrics.len());
        let ids: Vec<u64> = std::thread::scope(|scope| {
            let joins: Vec<_> = fabrics
                .iter()
                .map(|f| {
                    let (barrier, name) = (&barrier, &name);
                    scope.spawn(move || {
                        let mut config = config();
                        config.name = name.clone();
                        barrier.wait();
                        let domain = Domain::join_fabric(&config, f).unwrap();
                        let id = domain.id();
                        (id, domain)
                    })
                })
                .collect();
            let joined: Vec<(u64, Domain)> = joins.into_iter().map(|j| j.join().unwrap()).collect();
            joined.iter().map(|(id, _)| *id).collect()
        });
        assert!(
            ids.windows(2).all(|w| w[0] == w[1]),
            "round {round}: pools {ids:x?}"
        );
    }
    let _ = std::fs::remove_file(path);
}
