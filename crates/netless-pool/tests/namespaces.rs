//! Members in another pid namespace, for real: a child made pid 1 of a new pid namespace with
//! its own `/proc` (as in a container) shares a domain with processes of the root namespace.
//! Whoever reaps and whoever coordinates, in either namespace, no live member's pages are
//! freed (every buffer keeps its bytes while the others allocate and write every free page),
//! and a member's pages come back once it exits.
//!
//! The namespace needs root (`unshare(CLONE_NEWPID | CLONE_NEWNS)`, mounting `/proc`): without
//! it the tests say so and pass. Peers are this test binary again, running only
//! `child_process_entry` as a `worker` that executes line commands from stdin.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use common::{eventually, hex, pattern, ref_from_hex, say, PATIENCE};
use netless_pool::{Domain, DomainConfig, PoolError, PoolGeometry, SharedBuf, PAGE_SIZE};
use netless_testing::{in_new_pid_namespace, pid_namespace};

const ROLE: &str = "NLP_NS_ROLE";
const DIR: &str = "NLP_NS_DIR";
const DOMAIN: &str = "ns";
/// 8 MiB: small enough that a churn touches every free page.
const GEOMETRY: PoolGeometry = PoolGeometry {
    pages: 2048,
    ref_slots: 256,
};
fn config(dir: &Path) -> DomainConfig {
    let mut c = DomainConfig::new(DOMAIN);
    c.dir = Some(dir.to_path_buf());
    c.geometry = GEOMETRY;
    c.lease_low = 8;
    c.lease_high = 32;
    c.join_timeout = PATIENCE;
    c
}

/// A private socket directory, removed on drop.
struct TestDir(PathBuf);

impl TestDir {
    fn new(tag: &str) -> TestDir {
        let path = PathBuf::from(format!("/tmp/nlp-ns-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path).unwrap();
        TestDir(path)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ----- The child. -----

/// Entry point of the spawned children (run only by them, via `--ignored`).
#[test]
#[ignore = "entry point of the child processes the other tests spawn"]
fn child_process_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    assert_eq!(role, "worker");
    let dir = PathBuf::from(std::env::var(DIR).unwrap());
    let domain = match Domain::join(&config(&dir)) {
        Ok(d) => d,
        Err(e) => return say(&format!("join-err {e}")),
    };
    say(&format!(
        "ready {} {} {}",
        std::process::id(),
        pid_namespace(),
        domain.is_coordinator()
    ));
    let mut worker = Worker {
        domain,
        bufs: std::collections::HashMap::new(),
        churn: Vec::new(),
    };
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        if line == "exit" {
            break;
        }
        let answer = match worker.exec(&line) {
            Ok(out) => format!("ok {out}"),
            Err(e) => format!("err {e}"),
        };
        say(&answer);
    }
}

/// A member holding buffers by id, driven by line commands.
struct Worker {
    domain: Domain,
    bufs: std::collections::HashMap<u64, SharedBuf>,
    /// Buffers filling the pool's free pages, with their contents.
    churn: Vec<(SharedBuf, Vec<u8>)>,
}

impl Worker {
    fn exec(&mut self, line: &str) -> Result<String, PoolError> {
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> u64 { w[i].parse().unwrap() };
        Ok(match w[0] {
            "alloc" => {
                let buf = self.domain.alloc_from(&pattern(num(3), num(2) as usize))?;
                self.bufs.insert(num(1), buf);
                String::new()
            }
            "share" => hex(&self.bufs[&num(1)].share()?.to_bytes()),
            "map" => {
                let buf = self.domain.map(&ref_from_hex(w[2]))?;
                self.bufs.insert(num(1), buf);
                String::new()
            }
            "hash" => hex(&fnv(&self.bufs[&num(1)].to_vec()).to_le_bytes()),
            "reap" => self.domain.reap_dead().to_string(),
            // Allocates and writes every free page (16 at a time), then checks them all.
            "churn" => {
                let seed = num(1);
                loop {
                    let data = pattern(seed + self.churn.len() as u64, 16 * PAGE_SIZE);
                    match self.domain.alloc_from(&data) {
                        Ok(buf) => self.churn.push((buf, data)),
                        Err(PoolError::Exhausted(_)) => break,
                        Err(e) => return Err(e),
                    }
                }
                let intact = self.churn.iter().all(|(b, d)| b.to_vec() == *d);
                format!("{} {intact}", self.churn.len())
            }
            "unchurn" => {
                self.churn.clear();
                String::new()
            }
            "stats" => {
                let s = self.domain.stats();
                format!(
                    "{} {} {} {} {}",
                    s.pages,
                    s.free_pages,
                    s.held_pages,
                    s.members,
                    self.domain.is_coordinator()
                )
            }
            other => panic!("unknown command {other}"),
        })
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

// ----- The parent's side. -----

/// A `worker` child, in a process group of its own (killed with it on drop).
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Its pid and pid namespace as it sees them, and whether it founded the domain.
    pid: u32,
    pid_ns: u64,
    founded: bool,
}

/// Why a child in a new pid namespace could not be made (the tests then skip).
enum NoNamespace {
    NotRoot,
    Refused(std::io::Error),
}

impl Peer {
    fn spawn(dir: &Path, new_namespace: bool) -> Result<Peer, NoNamespace> {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "child_process_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, "worker")
        .env(DIR, dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0);
        if new_namespace {
            if rustix::process::geteuid().as_raw() != 0 {
                return Err(NoNamespace::NotRoot);
            }
            in_new_pid_namespace(&mut cmd);
        }
        let mut child = cmd.spawn().map_err(NoNamespace::Refused)?;
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
        let mut peer = Peer {
            child,
            stdin,
            lines,
            pid: 0,
            pid_ns: 0,
            founded: false,
        };
        let ready = peer.line();
        let w: Vec<&str> = ready.split_whitespace().collect();
        assert_eq!(w[0], "ready", "the child could not join: {ready}");
        peer.pid = w[1].parse().unwrap();
        peer.pid_ns = w[2].parse().unwrap();
        peer.founded = w[3] == "true";
        Ok(peer)
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

    /// (pages, free, held, members, coordinator) as the child sees them.
    fn stats(&mut self) -> (usize, usize, usize, usize, bool) {
        let s = self.ok("stats");
        let w: Vec<&str> = s.split_whitespace().collect();
        let n = |i: usize| w[i].parse::<usize>().unwrap();
        (n(0), n(1), n(2), n(3), w[4] == "true")
    }

    /// Allocates and writes every free page in the child; checks that they read back.
    fn churn(&mut self, seed: u64) -> usize {
        let out = self.ok(&format!("churn {seed}"));
        let (n, intact) = out.split_once(' ').unwrap();
        assert_eq!(intact, "true", "the child's own churn buffers changed");
        n.parse().unwrap()
    }

    /// SIGKILL to its whole process group (a namespaced child is the grandchild).
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

/// The namespaced worker, or `None` (the reason printed) if this machine cannot make one.
fn namespaced_worker(dir: &Path) -> Option<Peer> {
    match Peer::spawn(dir, true) {
        Ok(peer) => {
            assert_eq!(peer.pid, 1, "the child is pid 1 of its namespace");
            assert_ne!(peer.pid_ns, pid_namespace(), "the child's namespace is new");
            Some(peer)
        }
        Err(NoNamespace::NotRoot) => {
            eprintln!("SKIPPED: creating a pid namespace needs root");
            None
        }
        Err(NoNamespace::Refused(e)) => {
            eprintln!("SKIPPED: cannot create a pid namespace with its own /proc here: {e}");
            None
        }
    }
}

fn hash_of(bytes: &[u8]) -> String {
    hex(&fnv(bytes).to_le_bytes())
}

const LEN: usize = 6 * PAGE_SIZE + 123;

#[test]
fn a_member_in_another_pid_namespace_keeps_its_pages_through_reaps_and_a_hand_over() {
    let dir = TestDir::new("member");
    let d = Domain::join(&config(&dir.0)).unwrap();
    assert!(d.is_coordinator());
    let Some(mut k) = namespaced_worker(&dir.0) else {
        return;
    };
    let mut w = Peer::spawn(&dir.0, false).ok().unwrap();
    assert!(!k.founded && !w.founded);
    assert_eq!(d.stats().members, 3);

    // Buffers of their own, and each other's (and ours) mapped.
    w.ok(&format!("alloc 1 {LEN} 1"));
    k.ok(&format!("alloc 1 {LEN} 2"));
    let from_w = w.ok("share 1");
    k.ok(&format!("map 2 {from_w}"));
    let from_k = k.ok("share 1");
    w.ok(&format!("map 2 {from_k}"));
    let mine = d.alloc_from(&pattern(3, LEN)).unwrap();
    k.ok(&format!("map 3 {}", hex(&mine.share().unwrap().to_bytes())));
    let expected_w = [
        (1, hash_of(&pattern(1, LEN))),
        (2, hash_of(&pattern(2, LEN))),
    ];
    let expected_k = [
        (1, hash_of(&pattern(2, LEN))),
        (2, hash_of(&pattern(1, LEN))),
        (3, hash_of(&pattern(3, LEN))),
    ];
    let check = |w: &mut Peer, k: &mut Peer| {
        for (id, hash) in &expected_w {
            assert_eq!(&w.ok(&format!("hash {id}")), hash, "W's buffer {id}");
        }
        for (id, hash) in &expected_k {
            assert_eq!(&k.ok(&format!("hash {id}")), hash, "K's buffer {id}");
        }
    };

    // Reapers in both namespaces find nobody dead: every member lives.
    assert_eq!(
        d.reap_dead(),
        0,
        "the root namespace's coordinator reaped a live member"
    );
    assert_eq!(
        k.ok("reap"),
        "0",
        "the namespaced member reaped live members"
    );
    assert_eq!(w.ok("reap"), "0");
    // Every free page taken and written, by both: had anyone's pages been freed, they would
    // be among them.
    assert!(k.churn(100) > 0);
    w.churn(200);
    check(&mut w, &mut k);
    assert_eq!(mine.to_vec(), pattern(3, LEN));
    k.ok("unchurn");
    w.ok("unchurn");

    // Hand-over: the coordinator leaves; one of the other two, in either namespace, takes
    // over and reaps at once.
    drop(mine);
    drop(d);
    eventually("a member took over", || k.stats().4 || w.stats().4);
    assert_eq!(k.ok("reap"), "0");
    assert_eq!(w.ok("reap"), "0");
    k.churn(300);
    w.churn(400);
    check(&mut w, &mut k);
    k.ok("unchurn");
    w.ok("unchurn");
    assert_eq!(w.stats().3, 2, "W and K are the members");

    // The namespaced member dies: its pages come back (those W maps stay W's).
    let k_pages = |k: &mut Peer| k.stats().2;
    assert!(k_pages(&mut k) > 0);
    k.kill();
    eventually(
        "the namespaced member is reaped and its pages are back",
        || {
            let (pages, free, held, members, _) = w.stats();
            members == 1 && free + held == pages
        },
    );
    assert_eq!(
        w.ok("hash 2"),
        hash_of(&pattern(2, LEN)),
        "W's copy of K's buffer"
    );
}

#[test]
fn a_coordinator_in_another_pid_namespace_admits_and_reaps_the_root_namespaces_members() {
    let dir = TestDir::new("coord");
    let Some(mut k) = namespaced_worker(&dir.0) else {
        return;
    };
    assert!(k.founded, "the namespaced child founds the domain");
    // A process of the root namespace joins through it, and another.
    let d = Domain::join(&config(&dir.0)).unwrap();
    assert!(!d.is_coordinator());
    let mut w = Peer::spawn(&dir.0, false).ok().unwrap();
    assert_eq!(d.stats().members, 3);

    let mine = d.alloc_from(&pattern(5, LEN)).unwrap();
    w.ok(&format!("alloc 1 {LEN} 6"));
    k.ok(&format!("alloc 1 {LEN} 7"));
    // The coordinator sweeps every 250 ms; give it several, and take every free page.
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(
        k.ok("reap"),
        "0",
        "the namespaced coordinator reaped live members"
    );
    assert!(k.churn(500) > 0);
    assert_eq!(mine.to_vec(), pattern(5, LEN));
    assert_eq!(w.ok("hash 1"), hash_of(&pattern(6, LEN)));
    assert_eq!(d.stats().members, 3);
    k.ok("unchurn");

    // A root-namespace member dies: the namespaced coordinator reaps it.
    w.kill();
    eventually("the namespaced coordinator reaped the dead member", || {
        let (pages, free, held_k, members, _) = k.stats();
        members == 2 && free + held_k + d.stats().held_pages == pages
    });
    assert_eq!(mine.to_vec(), pattern(5, LEN));
    assert_eq!(k.ok("hash 1"), hash_of(&pattern(7, LEN)));

    // The namespaced coordinator dies: we take over, reap it, and hold what is ours alone.
    k.kill();
    eventually("we took over and every other page is back", || {
        let s = d.stats();
        d.is_coordinator() && s.members == 1 && s.free_pages + s.held_pages == s.pages
    });
    assert_eq!(mine.to_vec(), pattern(5, LEN));
}
