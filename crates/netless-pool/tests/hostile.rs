//! Attacks on a domain by processes around it and inside it, performed for real, and what
//! its honest members still get:
//!
//! - a process outside the ACL that may search the socket directory cannot open the domain's
//!   lock and members files, so it cannot keep the domain from being founded or taken over,
//!   nor make dead members look alive (needs root, to run peers as other uids; skipped,
//!   saying so, otherwise);
//! - a process that can open the members file (one of the directory owner's) and read-locks
//!   every token at once keeps no dead member from being reaped, and gets no live one
//!   reaped; one that holds the domain's lock delays a join only until its timeout;
//! - a member that asks to rejoin its own row in a loop costs the coordinator one socket,
//!   not one per request, and the others keep joining and sharing;
//! - a coordinator that trickles its handshake a byte at a time holds a join no longer than
//!   its timeout, and a member rejoining it leaves the domain at once when dropped;
//! - a member that writes 0 over another member's liveness token in the shared member table
//!   does not get it reaped (what else a member can do to another is in the design's trust
//!   model: a domain is one trust group).
//!
//! Peers are this test binary again, running only `child_process_entry`: a `worker` (a member
//! driven by line commands), a `jammer` (which takes the domain's locks if it can and says
//! what it got), a `rejoiner` or a `zeroer` (members that speak the join protocol by hand
//! and misbehave) or a `trickler` (a coordinator that turns into a fake one). Children
//! prefix their lines with `@@`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use common::{eventually, hex, pattern, ref_from_hex, say, PATIENCE};
use netless_pool::{Domain, DomainConfig, PoolError, PoolGeometry, SharedBuf, PAGE_SIZE};
use rustix::fs::FlockOperation;

const ROLE: &str = "NLP_HOSTILE_ROLE";
const DIR: &str = "NLP_HOSTILE_DIR";
/// The uids the domain's ACL admits, comma-separated (none: ours alone).
const UIDS: &str = "NLP_HOSTILE_UIDS";
/// How many times a rejoiner asks to rejoin.
const REJOINS: &str = "NLP_HOSTILE_REJOINS";
/// The member row whose token a zeroer overwrites.
const VICTIM: &str = "NLP_HOSTILE_VICTIM";
/// What a jammer takes: `range` (a read lock over the whole members file) or `all` (that,
/// and the flocks: the domain's lock exclusively, the members file shared).
const JAM: &str = "NLP_HOSTILE_JAM";
const DOMAIN: &str = "h";
const GEOMETRY: PoolGeometry = PoolGeometry {
    pages: 1024,
    ref_slots: 64,
};
/// How long anything that should be prompt may take on a loaded two-core machine.
/// A member of the domain running as another user.
const MEMBER_UID: u32 = 65534;
/// A user the domain's ACL does not admit.
const OUTSIDER_UID: u32 = 65533;
const LEN: usize = 5 * PAGE_SIZE + 77;

fn config(dir: &Path, uids: &[u32]) -> DomainConfig {
    let mut c = DomainConfig::new(DOMAIN);
    c.dir = Some(dir.to_path_buf());
    c.geometry = GEOMETRY;
    c.lease_low = 4;
    c.lease_high = 16;
    c.join_timeout = PATIENCE;
    if !uids.is_empty() {
        c.acl = uids
            .iter()
            .fold(netless_shm::Acl::new(), |acl, &uid| acl.allow_uid(uid));
    }
    c
}

fn file(dir: &Path, kind: &str) -> PathBuf {
    dir.join(format!("netless-domain.{DOMAIN}.{kind}"))
}

/// A private directory `/tmp/nlp-h-<pid>-<tag>`, removed on drop.
struct TestDir(PathBuf);

impl TestDir {
    fn new(tag: &str) -> TestDir {
        let path = PathBuf::from(format!("/tmp/nlp-h-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        TestDir(path)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

// ----- The children. -----

/// Entry point of the spawned children (run only by them, via `--ignored`).
#[test]
#[ignore = "entry point of the child processes the other tests spawn"]
fn child_process_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let dir = PathBuf::from(std::env::var(DIR).unwrap());
    let uids: Vec<u32> = std::env::var(UIDS)
        .unwrap_or_default()
        .split(',')
        .filter(|u| !u.is_empty())
        .map(|u| u.parse().unwrap())
        .collect();
    match role.as_str() {
        "worker" => worker(&config(&dir, &uids)),
        "jammer" => jammer(&dir, &std::env::var(JAM).unwrap()),
        "rejoiner" => rejoiner(&dir, std::env::var(REJOINS).unwrap().parse().unwrap()),
        "trickler" => trickler(&config(&dir, &uids)),
        "zeroer" => zeroer(&dir, std::env::var(VICTIM).unwrap().parse().unwrap()),
        other => panic!("unknown role {other}"),
    }
}

/// A member holding buffers by id, driven by line commands until stdin closes.
fn worker(config: &DomainConfig) {
    let domain = match Domain::join(config) {
        Ok(d) => d,
        Err(e) => return say(&format!("join-err {e}")),
    };
    say(&format!(
        "ready {} {}",
        domain.is_coordinator(),
        domain.member()
    ));
    let mut bufs: std::collections::HashMap<u64, SharedBuf> = Default::default();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> u64 { w[i].parse().unwrap() };
        let answer: Result<String, PoolError> = (|| {
            Ok(match w[0] {
                // alloc ID SEED
                "alloc" => {
                    let buf = domain.alloc_from(&pattern(num(2), LEN))?;
                    bufs.insert(num(1), buf);
                    String::new()
                }
                "share" => hex(&bufs[&num(1)].share()?.to_bytes()),
                // Whether buffer ID holds pattern SEED.
                "check" => (bufs[&num(1)].to_vec() == pattern(num(2), LEN)).to_string(),
                // map ID REF: the Ref's buffer, as buffer ID.
                "map" => {
                    bufs.insert(num(1), domain.map(&ref_from_hex(w[2]))?);
                    String::new()
                }
                "fds" => std::fs::read_dir("/proc/self/fd")
                    .unwrap()
                    .count()
                    .to_string(),
                "reap" => domain.reap_dead().to_string(),
                "stats" => {
                    let s = domain.stats();
                    let coordinates = domain.is_coordinator();
                    format!("{} {} {coordinates}", s.members, s.held_pages)
                }
                other => panic!("unknown command {other}"),
            })
        })();
        match answer {
            Ok(out) => say(&format!("ok {out}")),
            Err(e) => say(&format!("err {e}")),
        }
    }
}

/// Opens the domain's files if it can, takes what `jam` says, reports what it got, and holds
/// it until stdin closes. A lock someone else holds, it waits for (on a thread), as an
/// attacker racing the members for it when the coordinator dies would.
fn jammer(dir: &Path, jam: &str) {
    let take = |kind: &str, ops: &[(&'static str, FlockOperation)]| {
        let file = match std::fs::File::open(file(dir, kind)) {
            Ok(file) => std::sync::Arc::new(file),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return "denied".to_owned()
            }
            Err(e) => return format!("error:{e}"),
        };
        let mut got = Vec::new();
        for &(name, op) in ops {
            let lock = move |file: &std::fs::File, op| match name {
                "range" => rustix::fs::fcntl_lock(file, op),
                _ => rustix::fs::flock(file, op),
            };
            if lock(&file, op).is_ok() {
                got.push(format!("{name}:held"));
                continue;
            }
            got.push(format!("{name}:waiting"));
            let blocking = match op {
                FlockOperation::NonBlockingLockShared => FlockOperation::LockShared,
                _ => FlockOperation::LockExclusive,
            };
            let file = file.clone();
            std::thread::spawn(move || {
                let _ = lock(&file, blocking);
                std::thread::park();
            });
        }
        std::mem::forget(file);
        got.join(",")
    };
    // A whole-file read lock (from byte 0, to the end and beyond) covers every token.
    let mut members_ops = vec![("range", FlockOperation::NonBlockingLockShared)];
    let mut lock_ops = vec![];
    if jam == "all" {
        members_ops.push(("flock", FlockOperation::NonBlockingLockShared));
        lock_ops.push(("flock", FlockOperation::NonBlockingLockExclusive));
    }
    let members = take("members", &members_ops);
    let lock = take("lock", &lock_ops);
    say(&format!("jam members={members} lock={lock}"));
    let _ = std::io::stdin().lock().read_line(&mut String::new());
}

/// The domain's socket in `dir`.
fn socket(dir: &Path) -> PathBuf {
    file(dir, "sock")
}

/// A join request as the protocol has it: magic, protocol 3, the row to rejoin (domain,
/// member, generation; `u32::MAX` for a new one), liveness token, pid, pid namespace.
fn join_request(rejoin: Option<(u64, u32, u32)>, token: u64) -> Vec<u8> {
    let (domain, member, generation) = rejoin.unwrap_or((0, u32::MAX, 0));
    let pid_ns = rustix::fs::stat("/proc/self/ns/pid").map_or(0, |st| st.st_ino);
    let mut req = b"NLDJ".to_vec();
    req.extend_from_slice(&3u32.to_le_bytes());
    req.extend_from_slice(&domain.to_le_bytes());
    req.extend_from_slice(&member.to_le_bytes());
    req.extend_from_slice(&generation.to_le_bytes());
    req.extend_from_slice(&token.to_le_bytes());
    req.extend_from_slice(&std::process::id().to_le_bytes());
    req.extend_from_slice(&pid_ns.to_le_bytes());
    req
}

/// A join made by hand, as a member that does more than netless would.
struct RawJoin {
    stream: UnixStream,
    /// The members file offered, our token held on it (a new member's).
    members: Option<std::fs::File>,
    /// Domain, member row and generation from the welcome.
    row: (u64, u32, u32),
    pool: Option<OwnedFd>,
}

/// One join through `dir`'s socket holding `token` (on the offered members file, for a new
/// member); the coordinator's refusal as an error.
fn raw_join(dir: &Path, rejoin: Option<(u64, u32, u32)>, token: u64) -> Result<RawJoin, String> {
    let stream = UnixStream::connect(socket(dir)).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let (offer, fds) = netless_shm::recv_frame(&stream, 1).map_err(|e| e.to_string())?;
    if !offer.starts_with(b"NLDO") {
        return Err(format!("no offer: {}", String::from_utf8_lossy(&offer)));
    }
    let members = match rejoin {
        Some(_) => None,
        None => {
            let file = std::fs::File::from(fds.into_iter().next().ok_or("no members file")?);
            netless_shm::hold_liveness_token(&file, token).map_err(|e| e.to_string())?;
            Some(file)
        }
    };
    netless_shm::send_frame(&stream, &join_request(rejoin, token), &[])
        .map_err(|e| e.to_string())?;
    let (reply, fds) = netless_shm::recv_frame(&stream, 1).map_err(|e| e.to_string())?;
    if reply.len() != 21 || reply[4] != 0 {
        return Err(String::from_utf8_lossy(&reply[5.min(reply.len())..]).into_owned());
    }
    let u32_at = |at: usize| u32::from_le_bytes(reply[at..at + 4].try_into().unwrap());
    let domain = u64::from_le_bytes(reply[5..13].try_into().unwrap());
    Ok(RawJoin {
        stream,
        members,
        row: (domain, u32_at(13), u32_at(17)),
        pool: fds.into_iter().next(),
    })
}

/// Joins by hand, then asks `rejoins` times to rejoin its own row (with its own generation
/// and token, so that every check but one passes), keeping every socket it is welcomed on;
/// says how many it was, and holds on until stdin closes.
fn rejoiner(dir: &Path, rejoins: usize) {
    let token = u64::from(std::process::id()) << 16 | 0x5eed;
    let first = raw_join(dir, None, token).unwrap();
    let mut kept = vec![first.stream];
    let mut refused = 0;
    for _ in 0..rejoins {
        match raw_join(dir, Some(first.row), token) {
            Ok(again) => kept.push(again.stream),
            Err(_) => refused += 1,
        }
    }
    say(&format!(
        "rejoined welcomed={} refused={refused}",
        kept.len() - 1
    ));
    let _ = std::io::stdin().lock().read_line(&mut String::new());
    drop((kept, first.members, first.pool));
}

/// Joins by hand, maps the pool as any member does, writes 0 over row `victim`'s liveness
/// token (at 4096 + 64 × row + 56: the member table's layout), says what it read before and
/// after, and holds on until stdin closes.
fn zeroer(dir: &Path, victim: usize) {
    let token = u64::from(std::process::id()) << 16 | 0x0123;
    let joined = raw_join(dir, None, token).unwrap();
    let pool = joined.pool.expect("a new member gets the pool");
    let len = 2 * PAGE_SIZE;
    // SAFETY: a new shared mapping of the pool's memfd, which is far longer than 8 KiB;
    // nothing else in this process refers to it.
    let base = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            &pool,
            0,
        )
    }
    .unwrap();
    let offset = PAGE_SIZE + 64 * victim + 56;
    assert!(offset + 8 <= len);
    // SAFETY: the offset is 8-aligned and inside the mapping, which lives to the end of
    // this function; every process reads and writes the word atomically.
    let word = unsafe {
        &*base
            .cast::<u8>()
            .add(offset)
            .cast::<std::sync::atomic::AtomicU64>()
    };
    let before = word.swap(0, std::sync::atomic::Ordering::SeqCst);
    let after = word.load(std::sync::atomic::Ordering::SeqCst);
    say(&format!("zeroed {before} {after}"));
    let _ = std::io::stdin().lock().read_line(&mut String::new());
    drop((joined.stream, joined.members));
}

/// Founds the domain; on `trickle`, keeps its lock (a second descriptor of the coordinator's
/// own open lock file, so that no member can take over), stops coordinating, and serves the
/// domain's socket as a fake coordinator that sends one byte every 300 ms to whoever
/// connects, announcing a 4000-byte frame (20 minutes of it).
fn trickler(config: &DomainConfig) {
    let dir = config.dir.clone().unwrap();
    let domain = Domain::join(config).unwrap();
    assert!(domain.is_coordinator());
    let lock_path = file(&dir, "lock");
    let held = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|p| p == lock_path))
        .map(|e| e.file_name().to_str().unwrap().parse::<i32>().unwrap())
        .expect("the coordinator's lock file among our descriptors");
    // SAFETY: descriptor `held` is the coordinator's open lock file, which it keeps until
    // `domain` is dropped, after this duplicate is made.
    let lock = unsafe { std::os::fd::BorrowedFd::borrow_raw(held) }
        .try_clone_to_owned()
        .unwrap();
    say("ready true 0");
    let _ = std::io::stdin().lock().read_line(&mut String::new());
    drop(domain);
    let _ = std::fs::remove_file(socket(&dir));
    let listener = std::os::unix::net::UnixListener::bind(socket(&dir)).unwrap();
    say("trickling");
    // Gone with the test, even one that was killed.
    std::thread::spawn(|| {
        let _ = std::io::stdin().lock().read_line(&mut String::new());
        std::process::exit(0);
    });
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        say("accepted");
        std::thread::spawn(move || {
            let announced = 4000u32.to_le_bytes();
            for byte in announced.into_iter().chain(std::iter::repeat(0)) {
                if stream.write_all(&[byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        });
    }
    drop(lock);
}

// ----- The parent's side. -----

/// A child process in a process group of its own, killed on drop.
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Peer {
    /// Starts this binary as `role` with `env`, as user `uid` if given.
    fn start(role: &str, dir: &Path, uid: Option<u32>, env: &[(&str, &str)]) -> Peer {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "child_process_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env(DIR, dir)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0);
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        let mut child = cmd.spawn().expect("spawn a child test process");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find("@@") {
                    if tx.send(line[at + 2..].to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        let stdin = child.stdin.take();
        Peer {
            child,
            stdin,
            lines,
        }
    }

    /// A `worker` that joined; returns it and whether it coordinates.
    fn worker(dir: &Path, uid: Option<u32>, uids: &[u32]) -> (Peer, bool) {
        let uids: Vec<String> = uids.iter().map(u32::to_string).collect();
        let peer = Peer::start("worker", dir, uid, &[(UIDS, &uids.join(","))]);
        let ready = peer.line();
        let w: Vec<&str> = ready.split_whitespace().collect();
        assert_eq!(w[0], "ready", "the worker could not join: {ready}");
        (peer, w[1] == "true")
    }

    fn line(&self) -> String {
        match self.lines.recv_timeout(PATIENCE) {
            Ok(line) => line,
            Err(e) => panic!("child {} did not answer: {e:?}", self.child.id()),
        }
    }

    /// Runs a command that must succeed; returns what follows `ok`.
    fn ok(&mut self, command: &str) -> String {
        let stdin = self.stdin.as_mut().expect("child still running");
        writeln!(stdin, "{command}").unwrap();
        stdin.flush().unwrap();
        let answer = self.line();
        match answer.strip_prefix("ok") {
            Some(rest) => rest.trim().to_owned(),
            None => panic!("`{command}` failed in child {}: {answer}", self.child.id()),
        }
    }

    /// Sends `command` and expects `line` back.
    fn ok_line(&mut self, command: &str, line: &str) {
        let stdin = self.stdin.as_mut().expect("child still running");
        writeln!(stdin, "{command}").unwrap();
        stdin.flush().unwrap();
        assert_eq!(self.line(), line, "after `{command}`");
    }

    /// SIGKILL to its process group, then reap it.
    fn kill(&mut self) {
        self.stdin = None;
        let group = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until `d` sees `members` live members and `free` free pages.
fn wait_for(d: &Domain, members: usize, free: usize) {
    let mut last = d.stats();
    let deadline = Instant::now() + PATIENCE;
    while last.members != members || last.free_pages != free {
        assert!(
            Instant::now() < deadline,
            "expected {members} members and {free} free pages within {PATIENCE:?}: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
        last = d.stats();
    }
}

// ----- 1. The domain's files. -----

/// Root founds a domain that admits uid `nobody` in a directory everyone may search; a user
/// outside the ACL tries to take the domain's locks. It cannot open the files, and the domain
/// lives on: the `nobody` member joins, a member takes over when the founder is killed, the
/// killed `nobody` member's pages come back, and the domain can be founded anew.
#[test]
fn an_outsider_cannot_jam_a_domain_it_may_search() {
    if !is_root() {
        eprintln!("SKIPPED: running peers as other uids needs root");
        return;
    }
    let dir = TestDir::new("outsider");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let uids = [0, MEMBER_UID];
    let (mut founder, coordinates) = Peer::worker(&dir.0, None, &uids);
    assert!(coordinates, "the first process founds the domain");
    let (mut other, coordinates) = Peer::worker(&dir.0, Some(MEMBER_UID), &uids);
    assert!(!coordinates);
    other.ok("alloc 1 11");
    let jammer = Peer::start("jammer", &dir.0, Some(OUTSIDER_UID), &[(JAM, "all")]);
    let jammed = jammer.line();

    // This process joins, the founder dies: we take over (`nobody` may not), and the `nobody`
    // member rejoins us and keeps its buffer.
    let d = Domain::join(&config(&dir.0, &uids)).unwrap();
    assert!(!d.is_coordinator());
    let mine = d.alloc_from(&pattern(2, LEN)).unwrap();
    founder.kill();
    eventually("this process takes over", || d.is_coordinator());
    assert_eq!(other.ok("check 1 11"), "true");
    let theirs = d.map(&ref_from_hex(&other.ok("share 1"))).unwrap();
    assert_eq!(theirs.to_vec(), pattern(11, LEN));
    drop(theirs);
    eventually("the killed founder is reaped", || d.stats().members == 2);

    // Killed, the `nobody` member is reaped: every page but ours comes back.
    let held = d.stats().held_pages;
    other.kill();
    wait_for(&d, 1, GEOMETRY.pages as usize - held);
    assert_eq!(mine.to_vec(), pattern(2, LEN));
    drop((mine, d));

    // With everyone gone, the next process founds the domain again.
    let again = Domain::join(&config(&dir.0, &uids)).unwrap();
    assert!(again.is_coordinator(), "a new founder is not held off");
    assert_eq!(
        jammed, "jam members=denied lock=denied",
        "the outsider opened the domain's files"
    );
    for kind in ["lock", "members"] {
        let meta = std::fs::metadata(file(&dir.0, kind)).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600, "{kind} file's mode");
        assert_eq!(meta.uid(), 0, "{kind} file's owner");
    }
}

/// A process of ours, no member, read-locks the whole members file: every token, held or
/// not, is covered. Live members (one that joined under the lock included) are not reaped
/// however many sweeps pass; a killed one is, once its socket hangs up.
#[test]
fn a_lock_over_every_token_keeps_no_dead_member_alive() {
    let dir = TestDir::new("covered");
    let (_founder, coordinates) = Peer::worker(&dir.0, None, &[]);
    assert!(coordinates);
    let d = Domain::join(&config(&dir.0, &[])).unwrap();
    let mine = d.alloc_from(&pattern(2, LEN)).unwrap();
    let jammer = Peer::start("jammer", &dir.0, None, &[(JAM, "range")]);
    assert_eq!(jammer.line(), "jam members=range:held lock=");
    let baseline = d.stats().free_pages;
    let (mut victim, _) = Peer::worker(&dir.0, None, &[]);
    victim.ok("alloc 1 11");

    // The coordinator sweeps every 250 ms: a second is several sweeps.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        d.reap_dead(),
        0,
        "a reaper took a covered token for a dead one"
    );
    assert_eq!(d.stats().members, 3, "a live member was reaped");
    assert_eq!(victim.ok("check 1 11"), "true");
    assert_eq!(mine.to_vec(), pattern(2, LEN));

    victim.kill();
    wait_for(&d, 2, baseline);
    assert_eq!(mine.to_vec(), pattern(2, LEN));
}

/// A process of ours, no member, holds the domain's lock (and the members file) while no
/// coordinator serves it: a joiner cannot found the domain, and fails by its join timeout
/// saying why; once the holder is gone, the next joiner founds it.
#[test]
fn a_process_holding_the_domains_lock_delays_a_join_only_until_its_timeout() {
    let dir = TestDir::new("lockheld");
    drop(Domain::join(&config(&dir.0, &[])).unwrap());
    let mut jammer = Peer::start("jammer", &dir.0, None, &[(JAM, "all")]);
    assert_eq!(
        jammer.line(),
        "jam members=range:held,flock:held lock=flock:held"
    );
    let mut short = config(&dir.0, &[]);
    short.join_timeout = Duration::from_secs(2);
    let started = Instant::now();
    let err = Domain::join(&short).unwrap_err();
    let took = started.elapsed();
    assert!(
        err.to_string().contains("holds the domain's lock"),
        "unclear error: {err}"
    );
    assert!(
        took < short.join_timeout + Duration::from_secs(10),
        "join took {took:?}"
    );
    jammer.kill();
    assert!(Domain::join(&short).unwrap().is_coordinator());
}

// ----- 2. A member's rejoins. -----

/// The coordinator's open descriptors, as it counts them.
fn fds(coordinator: &mut Peer) -> usize {
    coordinator.ok("fds").parse().unwrap()
}

#[test]
fn a_member_rejoining_in_a_loop_holds_one_socket_of_the_coordinator() {
    let dir = TestDir::new("rejoin");
    let (mut coordinator, coordinates) = Peer::worker(&dir.0, None, &[]);
    assert!(coordinates);
    let before = fds(&mut coordinator);
    let d = Domain::join(&config(&dir.0, &[])).unwrap();
    let rejoiner = Peer::start("rejoiner", &dir.0, None, &[(REJOINS, "300")]);

    // Meanwhile the others share pages and join as usual.
    let mine = d.alloc_from(&pattern(3, LEN)).unwrap();
    coordinator.ok(&format!("map 1 {}", hex(&mine.share().unwrap().to_bytes())));
    assert_eq!(coordinator.ok("check 1 3"), "true");
    let (mut late, _) = Peer::worker(&dir.0, None, &[]);
    late.ok("alloc 1 4");
    coordinator.ok(&format!("map 2 {}", late.ok("share 1")));
    assert_eq!(coordinator.ok("check 2 4"), "true");

    let rejoined = rejoiner.line();
    // Three members' sockets (ours, the late worker's, the rejoiner's first), and a few
    // descriptors of joins still ending.
    eventually("the coordinator holds a socket per member", || {
        fds(&mut coordinator) <= before + 8
    });
    assert_eq!(rejoined, "rejoined welcomed=0 refused=300");
    assert_eq!(d.stats().members, 4);
    drop(rejoiner);
    eventually("the killed rejoiner is reaped", || d.stats().members == 3);
    assert_eq!(late.ok("check 1 4"), "true");
}

// ----- 3. A trickling coordinator. -----

/// Runs `f` on a thread; its result, or `None` if it is still running after `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

#[test]
fn a_trickling_coordinator_holds_a_join_no_longer_than_its_timeout() {
    let dir = TestDir::new("trickle");
    let mut trickler = Peer::start("trickler", &dir.0, None, &[]);
    assert!(trickler.line().starts_with("ready"));
    // A member whose own joins may take a minute: only stopping it can end its rejoin soon.
    let member = Domain::join(&config(&dir.0, &[])).unwrap();
    assert!(!member.is_coordinator());
    trickler.ok_line("trickle", "trickling");
    assert_eq!(
        trickler.line(),
        "accepted",
        "the member did not try to rejoin"
    );

    // The member, in the middle of its rejoin's handshake, leaves at once.
    let left = within(Duration::from_secs(10), move || drop(member));
    assert!(
        left.is_some(),
        "dropping a Domain whose watcher is rejoining hung"
    );

    // A new process joins with a 3 s timeout: it gives up by then, saying why.
    let mut short = config(&dir.0, &[]);
    short.join_timeout = Duration::from_secs(3);
    let started = Instant::now();
    let joined = within(short.join_timeout + Duration::from_secs(10), move || {
        Domain::join(&short).map(drop)
    });
    let err = joined
        .expect("a join was held past its timeout by a trickling coordinator")
        .unwrap_err();
    assert!(
        err.to_string().contains("did not finish the handshake"),
        "unclear error: {err}"
    );
    assert!(started.elapsed() >= Duration::from_secs(3), "{err}");
}

// ----- 4. A member writing another's row. -----

#[test]
fn a_member_that_zeroes_another_members_token_gets_it_no_reaped() {
    let dir = TestDir::new("zero");
    let (mut coordinator, coordinates) = Peer::worker(&dir.0, None, &[]);
    assert!(coordinates);
    let d = Domain::join(&config(&dir.0, &[])).unwrap();
    let mine = d.alloc_from(&pattern(5, LEN)).unwrap();
    let held = d.stats().held_pages;
    let victim = d.member().to_string();
    let zeroer = Peer::start("zeroer", &dir.0, None, &[(VICTIM, &victim)]);
    let zeroed = zeroer.line();
    let w: Vec<&str> = zeroed.split_whitespace().collect();
    assert!(w[0] == "zeroed" && w[1] != "0" && w[2] == "0", "{zeroed}");

    // The coordinator sweeps every 250 ms: a second is several sweeps.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        coordinator.ok("reap"),
        "0",
        "a reaper took token 0 for a death"
    );
    let now = d.stats();
    assert_eq!(now.members, 3, "a live member was reaped: {now:?}");
    assert_eq!(now.held_pages, held, "our pages were released: {now:?}");
    assert_eq!(mine.to_vec(), pattern(5, LEN));
}
