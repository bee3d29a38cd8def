//! The fabric region: formatting, members, the directory, the heap, connect slots, and the
//! reclaiming of a member killed in another process.
#![cfg(not(loom))] // The fabric maps a real file: netless-shm leaves it out under loom.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use netless_shm::fabric::{Extent, Fabric, FabricOptions, Phase, UNIT};

fn region(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("netless-fabric-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

fn options() -> FabricOptions {
    FabricOptions {
        size: 8 << 20,
        lease: Duration::from_millis(200),
        ..FabricOptions::default()
    }
}

#[test]
fn members_share_a_directory_and_a_heap() {
    let path = region("share");
    let a = Fabric::open(&path, &options()).unwrap();
    let b = Fabric::open(&path, &options()).unwrap();
    assert_ne!(a.member(), b.member());
    assert!(a.is_alive(b.member()) && b.is_alive(a.member()));
    assert!(a.same_kernel(b.member()));
    let free = a.free_bytes();
    let seg = a.alloc(3 * UNIT - 1).unwrap();
    assert_eq!(seg.len, 3 * UNIT as u64 - 1);
    assert_eq!(a.free_bytes(), free - 3 * UNIT as u64);
    assert!(b.is_owned_by(seg, a.member(), 1 << 30));
    assert!(!b.is_owned_by(seg, b.member(), 1 << 30));
    assert!(!b.is_owned_by(seg, a.member(), UNIT as u64));
    let longer = Extent {
        len: seg.len + 2,
        ..seg
    };
    assert!(
        !b.is_owned_by(longer, a.member(), 1 << 30),
        "one unit past it is free"
    );
    let written = a.map(seg).unwrap();
    let read = b.map(seg).unwrap();
    // SAFETY: both map the same 3 units; offset 5 is inside; one thread writes then reads.
    unsafe {
        written.as_ptr().add(5).write(77);
        assert_eq!(read.as_ptr().add(5).read(), 77);
    }
    let none = Extent { offset: 0, len: 0 };
    let index = a.publish("pkg.Echo", None, [seg, none, none], 9).unwrap();
    let found = b.lookup("pkg.Echo", None);
    assert_eq!(found.len(), 1);
    assert_eq!(
        (found[0].owner, found[0].extents[0], found[0].attrs),
        (a.member(), seg, 9)
    );
    assert!(b.lookup("pkg.Echo", Some(1)).is_empty());
    assert!(b.lookup("pkg.Ech", None).is_empty());
    a.withdraw(index);
    assert!(b.lookup("pkg.Echo", None).is_empty());
    a.free(seg);
    assert_eq!(a.free_bytes(), free);
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_full_heap_says_so() {
    let path = region("full");
    let a = Fabric::open(&path, &options()).unwrap();
    let err = a.alloc(64 << 20).unwrap_err().to_string();
    assert!(err.contains("no 67108864 bytes free"), "{err}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_file_that_is_not_a_region_is_refused() {
    let path = region("junk");
    std::fs::write(&path, vec![0xa5u8; 4 << 20]).unwrap();
    let err = Fabric::open(&path, &options()).unwrap_err().to_string();
    assert!(err.contains("not a netless fabric region"), "{err}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn connect_slots_carry_a_request_and_an_answer() {
    let path = region("slots");
    let server = Fabric::open(&path, &options()).unwrap();
    let client = Fabric::open(&path, &options()).unwrap();
    let ext = server.alloc(UNIT).unwrap();
    let mb = server.mailbox(ext).unwrap();
    let mc = client.mailbox(ext).unwrap();
    let (slot, seq) = mc.post(client.member(), [1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    let reqs = mb.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!((reqs[0].slot, reqs[0].seq), (slot, seq));
    assert_eq!(reqs[0].client, Some(client.member()));
    assert_eq!(reqs[0].words[7], 8);
    assert!(mb.accept(slot, seq, [9; 8]));
    assert!(!mb.accept(slot, seq, [9; 8]), "answered twice");
    assert_eq!(mc.state(slot), Some((Phase::Accepted, seq)));
    assert_eq!(mc.reply(slot), [9; 8]);
    mb.server_gone(slot, seq, 14, "shutting down");
    assert!(mc.is_server_gone(slot, seq));
    assert_eq!(mc.reason(slot), (14, "shutting down".to_owned()));
    mc.client_gone(slot, seq);
    assert!(mb.release(slot, seq));
    // The next connection in the slot is a new sequence: the old "gone" lines do not count.
    let (slot2, seq2) = mc.post(client.member(), [0; 8]).unwrap();
    assert_eq!(slot2, slot);
    assert_ne!(seq2, seq);
    assert!(!mb.is_client_gone(slot2, seq2) && !mb.is_server_gone(slot2, seq2));
    assert!(mb.refuse(slot2, seq2, 7, "not you"));
    assert_eq!(mc.state(slot2), Some((Phase::Refused, seq2)));
    let _ = std::fs::remove_file(path);
}

/// The child: joins the region, takes units, publishes a name, says so, and waits to be
/// killed.
#[test]
fn child_member() {
    let Ok(path) = std::env::var("NETLESS_FABRIC_CHILD") else {
        return;
    };
    let fabric = Fabric::open(path.as_ref(), &options()).unwrap();
    let seg = fabric.alloc(2 * UNIT).unwrap();
    let none = Extent { offset: 0, len: 0 };
    fabric
        .publish("pkg.Child", None, [seg, none, none], 0)
        .unwrap();
    println!(
        "READY {} {}",
        fabric.member().index,
        fabric.member().generation
    );
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn a_killed_member_is_dead_at_once_and_reclaimed_after_two_leases() {
    let path = region("kill");
    let me = Fabric::open(&path, &options()).unwrap();
    let free = me.free_bytes();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_member", "--nocapture", "--test-threads=1"])
        .env("NETLESS_FABRIC_CHILD", &path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while me.lookup("pkg.Child", None).is_empty() {
        assert!(Instant::now() < deadline, "the child never published");
        std::thread::sleep(Duration::from_millis(5));
    }
    let owner = me.lookup("pkg.Child", None)[0].owner;
    assert!(me.is_alive(owner));
    assert_eq!(me.free_bytes(), free - 2 * UNIT as u64);
    child.kill().unwrap();
    child.wait().unwrap();
    // One kernel: its lock went with it, so it is dead now, not a lease from now.
    assert!(!me.is_alive(owner));
    assert!(me.lookup("pkg.Child", None).is_empty());
    while me.free_bytes() != free || !me.entries().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the dead member's units were not reclaimed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_member_that_left_is_dead_at_once() {
    let path = region("lease");
    let me = Fabric::open(&path, &options()).unwrap();
    let other = Fabric::open(&path, &options()).unwrap();
    let id = other.member();
    assert!(me.is_alive(id));
    drop(other);
    // It left: dead at once, reclaimed later.
    assert!(!me.is_alive(id));
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_member_elsewhere_lives_by_the_heartbeats_it_writes_back() {
    use netless_shm::coherence::{Coherence, Faults};
    let path = region("beats");
    let member = |elsewhere: bool, control_faults: Faults| {
        Fabric::open(
            &path,
            &FabricOptions {
                size: 8 << 20,
                coherence: Coherence::Software,
                lease: Duration::from_millis(200),
                emulation: Some(Faults::default()),
                control_faults,
                another_kernel: elsewhere,
            },
        )
        .unwrap()
    };
    let me = member(false, Faults::default());
    let beating = member(true, Faults::default());
    let silent = member(
        true,
        Faults {
            skip_flush: true,
            skip_invalidate: false,
        },
    );
    assert!(!me.same_kernel(beating.member()));
    // Judged by heartbeat alone: the one whose beats reach the region lives on, the one
    // that never writes them back dies a lease after it was first seen.
    let start = Instant::now();
    let _ = me.is_alive(silent.member());
    while start.elapsed() < Duration::from_millis(600) {
        assert!(me.is_alive(beating.member()));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!me.is_alive(silent.member()));
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_file_sized_by_hand_is_formatted_with_its_first_openers_options() {
    // A DAX device, or a file truncated to size: no creator formats it, so its first
    // opener does, after waiting for one.
    let path = region("by-hand");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let software = FabricOptions {
        coherence: netless_shm::coherence::Coherence::Software,
        ..options()
    };
    let first = Fabric::open(&path, &software).unwrap();
    assert_eq!(
        first.coherence(),
        netless_shm::coherence::Coherence::Software
    );
    let second = Fabric::open(&path, &options()).unwrap();
    assert_eq!(
        second.coherence(),
        netless_shm::coherence::Coherence::Software,
        "an existing region keeps its own"
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn members_lists_the_slots_taken_alive_or_not() {
    let path = region("list");
    let me = Fabric::open(&path, &options()).unwrap();
    let other = Fabric::open(&path, &options()).unwrap();
    let id = other.member();
    let listed = me.members();
    assert_eq!(listed.len(), 2, "{listed:?}");
    for m in &listed {
        assert!([me.member(), id].contains(&m.id), "{m:?}");
        assert_eq!(m.state, "live");
        assert_eq!(m.pid, std::process::id());
        assert_eq!(m.uid, rustix::process::geteuid().as_raw());
    }
    drop(other);
    let left = me.members().into_iter().find(|m| m.id == id).unwrap();
    assert_eq!(left.state, "left", "listed until it is reclaimed");
    // Reclaimed two leases on: its slot is free again.
    let deadline = Instant::now() + Duration::from_secs(20);
    while me.members().iter().any(|m| m.id == id) {
        assert!(Instant::now() < deadline, "the slot was never reclaimed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(path);
}
