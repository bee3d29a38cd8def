//! Multi-process tests of the domain page pool: real OS processes sharing one memfd pool
//! through the domain's socket, with real deaths (SIGKILL) and a real coordinator hand-over.
//!
//! Each test spawns this test binary again, running only `child_process_entry` with a role in
//! the environment (as `crates/netless/tests/process.rs` does). A `worker` child executes line
//! commands from stdin against its `HashMap<id, SharedBuf>` and answers each with one line; a
//! `chaos` child loops on its own (alloc, share, write, verify, free) and maps the Refs the
//! parent relays to it. Children prefix their lines with `@@`: the test harness prints its own
//! lines on the same stdout.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};

use netless_pool::{Domain, DomainConfig, PoolError, PoolGeometry, Ref, SharedBuf, PAGE_SIZE};
use proptest::sample::Index;
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestRunner};

const ROLE: &str = "NLP_TEST_ROLE";
const DIR: &str = "NLP_TEST_DIR";
/// Every test has its own socket directory, so one domain name serves all.
const DOMAIN: &str = "t";
/// 32 MiB of pages (touched only when used) and 1024 ref slots.
const GEOMETRY: PoolGeometry = PoolGeometry {
    pages: 8192,
    ref_slots: 1024,
};
/// How long anything that should be prompt may take on a loaded two-core machine.
const PATIENCE: Duration = Duration::from_secs(30);

fn config(dir: &Path, chaos: bool) -> DomainConfig {
    let mut c = DomainConfig::new(DOMAIN);
    c.dir = Some(dir.to_path_buf());
    c.geometry = GEOMETRY;
    // Small leases: pages go back and forth through the global free list often.
    c.lease_low = 8;
    c.lease_high = 32;
    c.join_timeout = PATIENCE;
    if chaos {
        // Refs relayed to a child that was then killed expire (and free their slot) soon.
        c.ref_ttl = Duration::from_secs(1);
    }
    c
}

// ----- Helpers shared by parent and children. -----

/// A private socket directory `/tmp/nlp-<pid>-<tag>` (short: Unix socket paths are limited),
/// removed on drop.
struct TestDir(PathBuf);

impl TestDir {
    fn new(tag: &str) -> TestDir {
        let path = PathBuf::from(format!("/tmp/nlp-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        TestDir(path)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// xorshift64*: deterministic contents from a seed, and the chaos schedule.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn time_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        ^ u64::from(std::process::id()) << 32
}

/// `len` bytes determined by `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&rng.next().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// FNV-1a over a sequence of byte slices (a buffer's pages, or one Vec).
fn fnv<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for part in parts {
        for &b in part {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn buf_hash(buf: &SharedBuf) -> u64 {
    fnv(buf.chunks())
}

fn vec_hash(v: &[u8]) -> u64 {
    fnv([v])
}

/// Whether `buf` holds exactly `model` (compared page by page, in place).
fn same(buf: &SharedBuf, model: &[u8]) -> bool {
    buf.len() == model.len()
        && buf
            .chunks()
            .zip(model.chunks(PAGE_SIZE))
            .all(|(a, b)| a == b)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn ref_from_hex(s: &str) -> Ref {
    let bytes: Vec<u8> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect();
    Ref::from_bytes(&bytes).expect("a Ref's encoding")
}

/// The error's variant name, for the parent to match on.
fn kind(e: &PoolError) -> &'static str {
    match e {
        PoolError::Shm(_) => "Shm",
        PoolError::Config(_) => "Config",
        PoolError::Exhausted(_) => "Exhausted",
        PoolError::ForeignRef { .. } => "ForeignRef",
        PoolError::InvalidRef(_) => "InvalidRef",
        PoolError::RefGone(_) => "RefGone",
        PoolError::DoubleFree(_) => "DoubleFree",
        PoolError::CountOverflow { .. } => "CountOverflow",
        PoolError::OutOfBounds { .. } => "OutOfBounds",
        PoolError::Corrupt(_) => "Corrupt",
        PoolError::Join { .. } => "Join",
        _ => "Other",
    }
}

/// One line to the parent.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "@@{line}").unwrap();
    out.flush().unwrap();
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
    match role.as_str() {
        "worker" => worker(&dir),
        "chaos" => chaos_child(&dir),
        other => panic!("unknown role {other}"),
    }
}

/// A process holding buffers by id, driven by line commands.
struct Holder {
    domain: Domain,
    bufs: HashMap<u64, SharedBuf>,
    /// Refs this process created (revoked on `reset` if nobody mapped them).
    created: Vec<Ref>,
}

impl Holder {
    fn exec(&mut self, line: &str) -> String {
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> u64 { w[i].parse().unwrap() };
        let result: Result<String, PoolError> = (|| {
            Ok(match w[0] {
                "alloc" => {
                    let buf = self.domain.alloc_from(&pattern(num(3), num(2) as usize))?;
                    self.bufs.insert(num(1), buf);
                    String::new()
                }
                "share" => {
                    let r = self.bufs[&num(1)].share()?;
                    self.created.push(r);
                    hex(&r.to_bytes())
                }
                "map" => {
                    let buf = self.domain.map(&ref_from_hex(w[2]))?;
                    self.bufs.insert(num(1), buf);
                    String::new()
                }
                "write" => {
                    let data = pattern(num(4), num(3) as usize);
                    let buf = self.bufs.get_mut(&num(1)).unwrap();
                    buf.write(num(2) as usize, &data)?;
                    String::new()
                }
                "free" => {
                    self.bufs.remove(&num(1)).unwrap();
                    String::new()
                }
                "hash" => format!("{:016x}", buf_hash(&self.bufs[&num(1)])),
                "hashall" => {
                    let mut all: Vec<_> = self.bufs.iter().collect();
                    all.sort_by_key(|(id, _)| **id);
                    all.iter()
                        .map(|(id, b)| format!("{id}:{:016x}", buf_hash(b)))
                        .collect::<Vec<_>>()
                        .join(" ")
                }
                // Drop everything, revoke what nobody mapped, and report what is still held.
                "reset" => {
                    self.bufs.clear();
                    for r in self.created.drain(..) {
                        let _ = self.domain.revoke(&r);
                    }
                    self.domain.collect();
                    let s = self.domain.stats();
                    format!("{} {} {}", s.held_pages, s.leased_pages, s.outstanding_refs)
                }
                other => panic!("unknown command {other}"),
            })
        })();
        match result {
            Ok(out) => format!("ok {out}"),
            Err(e) => format!("err {} {e}", kind(&e)),
        }
    }
}

fn worker(dir: &Path) {
    let domain = Domain::join(&config(dir, false)).expect("join the domain");
    say(&format!(
        "ready {:016x} {}",
        domain.id(),
        domain.is_coordinator()
    ));
    let mut holder = Holder {
        domain,
        bufs: HashMap::new(),
        created: Vec::new(),
    };
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        if line == "exit" {
            break;
        }
        let out = holder.exec(&line);
        say(&out);
    }
    // Dropping the holder leaves the domain: everything it held goes back.
}

/// Loops on random pool operations, checking every buffer against its own model (what this
/// process wrote, or what the sharer had at share time), until stdin closes or it is killed.
/// Prints `ref <hex> <hash>` for the parent to relay, `mapped`/`gone` per relayed Ref, and
/// `bad <what>` on any wrong byte or unexpected error.
fn chaos_child(dir: &Path) {
    let d = Domain::join(&config(dir, true)).expect("join the domain");
    say(&format!("ready {:016x} {}", d.id(), d.is_coordinator()));
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut rng = Rng::new(time_seed());
    let mut bufs: Vec<(SharedBuf, Vec<u8>)> = Vec::new();
    let unexpected = |what: &str, e: &PoolError| match e {
        PoolError::Exhausted(_) => {}
        e => say(&format!("bad {what}: {e}")),
    };
    loop {
        loop {
            match rx.try_recv() {
                Ok(line) => {
                    let w: Vec<&str> = line.split_whitespace().collect();
                    let hash = u64::from_str_radix(w[2], 16).unwrap();
                    match d.map(&ref_from_hex(w[1])) {
                        Ok(buf) => {
                            let model = buf.to_vec();
                            if vec_hash(&model) != hash {
                                say("bad a mapped Ref does not hold what its sharer had");
                            }
                            say("mapped");
                            bufs.push((buf, model));
                        }
                        // Its creator was killed (and reaped), or the Ref expired.
                        Err(PoolError::RefGone(_)) => say("gone"),
                        Err(e) => unexpected("map", &e),
                    }
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        let pick = |rng: &mut Rng, n: usize| rng.below(n.max(1));
        match rng.below(10) {
            0 | 1 if bufs.len() < 10 => {
                let len = match rng.below(8) {
                    0 => 1 + rng.below(100),
                    1..=5 => 1 + rng.below(4 * PAGE_SIZE),
                    6 => PAGE_SIZE * (1 + rng.below(4)),
                    _ => 1 + rng.below(24 * PAGE_SIZE),
                };
                let data = pattern(rng.next(), len);
                match d.alloc_from(&data) {
                    Ok(buf) => bufs.push((buf, data)),
                    Err(e) => unexpected("alloc", &e),
                }
            }
            2 | 3 if !bufs.is_empty() => {
                let (buf, model) = &bufs[pick(&mut rng, bufs.len())];
                match buf.share() {
                    Ok(r) => say(&format!(
                        "ref {} {:016x}",
                        hex(&r.to_bytes()),
                        vec_hash(model)
                    )),
                    Err(e) => unexpected("share", &e),
                }
            }
            4..=6 if !bufs.is_empty() => {
                let i = pick(&mut rng, bufs.len());
                let (buf, model) = &mut bufs[i];
                let off = rng.below(model.len());
                let len = 1 + rng.below((model.len() - off).min(2 * PAGE_SIZE));
                let data = pattern(rng.next(), len);
                match buf.write(off, &data) {
                    Ok(()) => {
                        model[off..off + len].copy_from_slice(&data);
                        if !same(buf, model) {
                            say("bad a write did not land as written");
                        }
                    }
                    Err(e) => unexpected("write", &e),
                }
            }
            7 if !bufs.is_empty() => {
                let (buf, model) = &bufs[pick(&mut rng, bufs.len())];
                if !same(buf, model) {
                    say("bad a buffer changed under its holder");
                }
            }
            8 | 9 if !bufs.is_empty() => {
                let i = pick(&mut rng, bufs.len());
                let (buf, model) = bufs.swap_remove(i);
                if !same(&buf, &model) {
                    say("bad a buffer changed under its holder");
                }
            }
            _ => {}
        }
        if bufs.len() > 12 {
            bufs.remove(0);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

// ----- The parent's side. -----

fn spawn_child(role: &str, dir: &Path) -> (Child, ChildStdin, ChildStdout) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env(DIR, dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn a child test process");
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    (child, stdin, stdout)
}

/// Forwards the child's `@@` lines (without the marker) to `tx`, tagged, until it exits.
fn forward_lines<T: Clone + Send + 'static>(stdout: ChildStdout, tag: T, tx: Sender<(T, String)>) {
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(at) = line.find("@@") {
                if tx.send((tag.clone(), line[at + 2..].to_owned())).is_err() {
                    break;
                }
            }
        }
    });
}

/// A `worker` child, killed (if still running) on drop.
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<((), String)>,
    domain_id: u64,
    coordinator: bool,
}

impl Peer {
    /// Spawns a worker; call [`Peer::wait_ready`] before using it.
    fn start(dir: &Path) -> Peer {
        let (child, stdin, stdout) = spawn_child("worker", dir);
        let (tx, lines) = mpsc::channel();
        forward_lines(stdout, (), tx);
        Peer {
            child,
            stdin: Some(stdin),
            lines,
            domain_id: 0,
            coordinator: false,
        }
    }

    fn spawn(dir: &Path) -> Peer {
        let mut p = Peer::start(dir);
        p.wait_ready();
        p
    }

    fn line(&self) -> String {
        match self.lines.recv_timeout(PATIENCE) {
            Ok((_, line)) => line,
            Err(e) => panic!("child {} did not answer: {e:?}", self.child.id()),
        }
    }

    fn wait_ready(&mut self) {
        let line = self.line();
        let w: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(w[0], "ready", "{line}");
        self.domain_id = u64::from_str_radix(w[1], 16).unwrap();
        self.coordinator = w[2] == "true";
    }

    /// Runs one command; returns its answer (`ok ...` or `err Kind message`).
    fn cmd(&mut self, command: &str) -> String {
        let stdin = self.stdin.as_mut().expect("child still running");
        writeln!(stdin, "{command}").unwrap();
        stdin.flush().unwrap();
        self.line()
    }

    /// Runs a command that must succeed; returns what follows `ok `.
    fn ok(&mut self, command: &str) -> String {
        let answer = self.cmd(command);
        match answer.strip_prefix("ok") {
            Some(rest) => rest.trim().to_owned(),
            None => panic!("`{command}` failed in the child: {answer}"),
        }
    }

    /// Lets the child leave the domain and exit normally.
    fn exit(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = writeln!(stdin, "exit");
        }
        let status = self.child.wait().unwrap();
        assert!(status.success(), "child exited with {status}");
    }

    /// SIGKILL, then reap the process.
    fn kill(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `cond` (no busy loop) until it holds; panics with `what` after [`PATIENCE`].
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until this process is the domain's only member and every page is free or in its
/// lease (every other member left or was reaped), and checks it holds nothing else.
fn wait_all_back(d: &Domain) {
    let mut last = d.stats();
    let deadline = Instant::now() + PATIENCE;
    while !(last.members == 1 && last.free_pages + last.held_pages == last.pages) {
        assert!(
            Instant::now() < deadline,
            "pages not back within {PATIENCE:?}: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
        last = d.stats();
    }
    assert_eq!(
        last.held_pages, last.leased_pages,
        "holding no buffers, this process holds only its lease: {last:?}"
    );
    assert_eq!(last.outstanding_refs, 0, "{last:?}");
}

// ----- 1. Cross-process basics. -----

#[test]
fn cross_process_share_map_and_copy_on_write() {
    let dir = TestDir::new("basic");
    let d = Domain::join(&config(dir.path(), false)).unwrap();
    assert!(d.is_coordinator(), "the first process founds the domain");
    let start = d.stats();
    assert_eq!(start.free_pages, start.pages);

    let mut child = Peer::spawn(dir.path());
    assert_eq!(child.domain_id, d.id(), "the child joined our domain");
    assert!(!child.coordinator);
    assert_eq!(d.stats().members, 2);

    // Parent to child: the child maps our Ref and reads our bytes.
    let len = 3 * PAGE_SIZE + 100;
    let original = pattern(1, len);
    let mut mine = d.alloc_from(&original).unwrap();
    let r = mine.share().unwrap();
    child.ok(&format!("map 1 {}", hex(&r.to_bytes())));
    assert_eq!(child.ok("hash 1"), format!("{:016x}", vec_hash(&original)));
    let again = d.map(&r).unwrap_err();
    assert!(
        matches!(again, PoolError::RefGone(_)),
        "a Ref maps once: {again}"
    );

    // The child writes across a page boundary: it copies those pages, ours stay as they were.
    let mut theirs = original.clone();
    theirs[PAGE_SIZE - 50..PAGE_SIZE + 50].copy_from_slice(&pattern(2, 100));
    child.ok(&format!("write 1 {} 100 2", PAGE_SIZE - 50));
    assert_eq!(child.ok("hash 1"), format!("{:016x}", vec_hash(&theirs)));
    assert_eq!(
        mine.to_vec(),
        original,
        "the child's write reached the sharer"
    );

    // Our write never reaches the child either (the page is shared with it: copied).
    let copied = d.stats().pages_copied;
    mine.write(0, &[0xAB; 10]).unwrap();
    assert_eq!(d.stats().pages_copied - copied, 1);
    assert_eq!(&mine.to_vec()[..10], &[0xAB; 10]);
    assert_eq!(child.ok("hash 1"), format!("{:016x}", vec_hash(&theirs)));

    // Child to parent.
    child.ok("alloc 2 10000 3");
    let theirs2 = ref_from_hex(&child.ok("share 2"));
    assert_eq!(theirs2.domain(), d.id());
    let got = d.map(&theirs2).unwrap();
    assert_eq!(got.to_vec(), pattern(3, 10000));
    child.ok("write 2 0 10000 4");
    assert_eq!(
        got.to_vec(),
        pattern(3, 10000),
        "the sharer's later write reached us"
    );
    assert_eq!(
        child.ok("hash 2"),
        format!("{:016x}", vec_hash(&pattern(4, 10000)))
    );

    // The child leaves; with our buffers dropped, every page is free or in our lease.
    child.exit();
    assert_eq!(
        got.to_vec(),
        pattern(3, 10000),
        "mapped pages outlive their sharer"
    );
    drop((mine, got));
    wait_all_back(&d);
    assert_eq!(d.stats().members, 1);

    // A holder killed while holding a mapped buffer, its own buffer and an unmapped Ref:
    // once the coordinator (this process) reaps it, all of that comes back.
    let mut doomed = Peer::spawn(dir.path());
    let buf = d.alloc_from(&pattern(5, 5 * PAGE_SIZE)).unwrap();
    doomed.ok(&format!("map 1 {}", hex(&buf.share().unwrap().to_bytes())));
    doomed.ok("write 1 0 1 7");
    doomed.ok("alloc 2 20000 6");
    doomed.ok("share 2");
    let s = d.stats();
    assert!(s.free_pages + s.held_pages < s.pages, "{s:?}");
    doomed.kill();
    assert_eq!(buf.to_vec(), pattern(5, 5 * PAGE_SIZE));
    drop(buf);
    wait_all_back(&d);
}

// ----- 4. A dead creator's Ref. -----

#[test]
fn a_dead_creators_unmapped_ref_is_gone() {
    let dir = TestDir::new("gone");
    let d = Domain::join(&config(dir.path(), false)).unwrap();
    let mut child = Peer::spawn(dir.path());
    child.ok("alloc 1 9000 11");
    let kept = ref_from_hex(&child.ok("share 1"));
    let orphan = ref_from_hex(&child.ok("share 1"));
    let mapped = d.map(&kept).unwrap();
    child.kill();
    // Reaped: every page is free or ours (the slots are released before the pages).
    eventually("the dead creator is reaped", || {
        let s = d.stats();
        s.members == 1 && s.free_pages + s.held_pages == s.pages
    });
    let err = d.map(&orphan).unwrap_err();
    assert!(matches!(err, PoolError::RefGone(_)), "{err:?}");
    assert!(err.to_string().contains("creator exited"), "{err}");

    // A Ref mapped while its creator lived outlives it, and is now ours alone: written in
    // place (the creator's hold was reaped, so no copy).
    let mut mapped = mapped;
    assert_eq!(mapped.to_vec(), pattern(11, 9000));
    let copied = d.stats().pages_copied;
    mapped.write(0, b"mine").unwrap();
    assert_eq!(d.stats().pages_copied, copied);
    drop(mapped);
    wait_all_back(&d);
}

// ----- 2. Copy-on-write isolation across processes, against a model. -----

/// Child processes holding buffers in the property test.
const HOLDERS: usize = 3;

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        holder: usize,
        len: usize,
        seed: u64,
    },
    Share {
        buf: Index,
    },
    /// Maps a Ref in another process than its creator's (`to` is the distance).
    Map {
        r: Index,
        to: usize,
    },
    /// Maps an already-mapped Ref again: must fail.
    MapAgain {
        r: Index,
        holder: usize,
    },
    Write {
        buf: Index,
        at: Index,
        len: usize,
        seed: u64,
    },
    WritePage {
        buf: Index,
        page: Index,
        seed: u64,
    },
    Free {
        buf: Index,
    },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let len = proptest::prop_oneof![
        1usize..64,
        1usize..5 * PAGE_SIZE,
        (1usize..4).prop_map(|n| n * PAGE_SIZE),
    ];
    proptest::prop_oneof![
        3 => (0..HOLDERS, len, proptest::arbitrary::any::<u64>())
            .prop_map(|(holder, len, seed)| Op::Alloc { holder, len, seed }),
        3 => proptest::arbitrary::any::<Index>().prop_map(|buf| Op::Share { buf }),
        3 => (proptest::arbitrary::any::<Index>(), 1..HOLDERS).prop_map(|(r, to)| Op::Map { r, to }),
        1 => (proptest::arbitrary::any::<Index>(), 0..HOLDERS)
            .prop_map(|(r, holder)| Op::MapAgain { r, holder }),
        4 => (
            proptest::arbitrary::any::<Index>(),
            proptest::arbitrary::any::<Index>(),
            1usize..2 * PAGE_SIZE,
            proptest::arbitrary::any::<u64>(),
        )
            .prop_map(|(buf, at, len, seed)| Op::Write { buf, at, len, seed }),
        1 => (
            proptest::arbitrary::any::<Index>(),
            proptest::arbitrary::any::<Index>(),
            proptest::arbitrary::any::<u64>(),
        )
            .prop_map(|(buf, page, seed)| Op::WritePage { buf, page, seed }),
        2 => proptest::arbitrary::any::<Index>().prop_map(|buf| Op::Free { buf }),
    ]
}

/// A buffer in the model: what its holder must see.
struct MBuf {
    id: u64,
    holder: usize,
    content: Vec<u8>,
}

/// A Ref in the model: the sharer's content at share time.
struct MRef {
    creator: usize,
    hex: String,
    content: Vec<u8>,
}

#[derive(Default)]
struct Model {
    next_id: u64,
    bufs: Vec<MBuf>,
    refs: Vec<MRef>,
    mapped: Vec<String>,
}

impl Model {
    fn apply(&mut self, op: &Op, peers: &mut [Peer]) {
        match *op {
            Op::Alloc { holder, len, seed } => {
                self.next_id += 1;
                let id = self.next_id;
                peers[holder].ok(&format!("alloc {id} {len} {seed}"));
                let content = pattern(seed, len);
                self.bufs.push(MBuf {
                    id,
                    holder,
                    content,
                });
            }
            Op::Share { buf } if !self.bufs.is_empty() => {
                let b = &self.bufs[buf.index(self.bufs.len())];
                let hex = peers[b.holder].ok(&format!("share {}", b.id));
                self.refs.push(MRef {
                    creator: b.holder,
                    hex,
                    content: b.content.clone(),
                });
            }
            Op::Map { r, to } if !self.refs.is_empty() => {
                let r = self.refs.remove(r.index(self.refs.len()));
                let holder = (r.creator + to) % HOLDERS;
                self.next_id += 1;
                let id = self.next_id;
                peers[holder].ok(&format!("map {id} {}", r.hex));
                self.mapped.push(r.hex);
                self.bufs.push(MBuf {
                    id,
                    holder,
                    content: r.content,
                });
            }
            Op::MapAgain { r, holder } if !self.mapped.is_empty() => {
                let hex = &self.mapped[r.index(self.mapped.len())];
                let answer = peers[holder].cmd(&format!("map 0 {hex}"));
                assert!(
                    answer.starts_with("err RefGone"),
                    "a Ref mapped twice: {answer}"
                );
            }
            Op::Write { buf, at, len, seed } if !self.bufs.is_empty() => {
                let n = self.bufs.len();
                let b = &mut self.bufs[buf.index(n)];
                let off = at.index(b.content.len());
                let len = len.min(b.content.len() - off);
                peers[b.holder].ok(&format!("write {} {off} {len} {seed}", b.id));
                b.content[off..off + len].copy_from_slice(&pattern(seed, len));
            }
            Op::WritePage { buf, page, seed } if !self.bufs.is_empty() => {
                let n = self.bufs.len();
                let b = &mut self.bufs[buf.index(n)];
                let off = page.index(b.content.len().div_ceil(PAGE_SIZE)) * PAGE_SIZE;
                let len = PAGE_SIZE.min(b.content.len() - off);
                peers[b.holder].ok(&format!("write {} {off} {len} {seed}", b.id));
                b.content[off..off + len].copy_from_slice(&pattern(seed, len));
            }
            Op::Free { buf } if !self.bufs.is_empty() => {
                let b = self.bufs.remove(buf.index(self.bufs.len()));
                peers[b.holder].ok(&format!("free {}", b.id));
            }
            _ => {}
        }
    }

    /// Every holder sees exactly its model buffers.
    fn check(&self, peers: &mut [Peer], after: &Op) {
        for (h, peer) in peers.iter_mut().enumerate() {
            let got: BTreeMap<u64, String> = peer
                .ok("hashall")
                .split_whitespace()
                .map(|kv| {
                    let (k, v) = kv.split_once(':').unwrap();
                    (k.parse().unwrap(), v.to_owned())
                })
                .collect();
            let want: BTreeMap<u64, String> = self
                .bufs
                .iter()
                .filter(|b| b.holder == h)
                .map(|b| (b.id, format!("{:016x}", vec_hash(&b.content))))
                .collect();
            assert_eq!(got, want, "holder {h} after {after:?}");
        }
    }
}

fn run_case(d: &Domain, dir: &Path, ops: &[Op]) {
    // A failed case (while shrinking) leaves killed children for the coordinator to reap.
    wait_all_back(d);
    let start = d.stats().free_pages;
    assert_eq!(start, GEOMETRY.pages as usize);
    let mut peers: Vec<Peer> = (0..HOLDERS).map(|_| Peer::start(dir)).collect();
    for p in &mut peers {
        p.wait_ready();
        assert_eq!(p.domain_id, d.id());
    }
    let mut model = Model::default();
    for op in ops {
        model.apply(op, &mut peers);
        model.check(&mut peers, op);
    }
    // Free everything: each child then holds only its lease, and the pool has every page.
    let mut leased = 0;
    for p in &mut peers {
        let answer = p.ok("reset");
        let n: Vec<usize> = answer
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(n[0], n[1], "a child holds pages beyond its lease: {answer}");
        assert_eq!(n[2], 0, "a child kept outstanding Refs: {answer}");
        leased += n[1];
    }
    let s = d.stats();
    assert_eq!(s.free_pages + leased, start, "{s:?}");
    for p in &mut peers {
        p.exit();
    }
    let s = d.stats();
    assert_eq!(s.free_pages, start, "{s:?}");
    assert_eq!(s.members, 1, "{s:?}");
}

#[test]
fn copy_on_write_isolation_across_processes() {
    let dir = TestDir::new("prop");
    let d = Domain::join(&config(dir.path(), false)).unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 10,
        max_shrink_iters: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let ops = proptest::collection::vec(op_strategy(), 10..40);
    runner
        .run(&ops, |ops| {
            run_case(&d, dir.path(), &ops);
            Ok(())
        })
        .unwrap();
}

// ----- 3. Chaos: holders killed at random under load. -----

struct ChaosPeer {
    child: Child,
    stdin: ChildStdin,
    incarnation: u64,
    ready: bool,
}

/// The parent's side of the chaos tests: spawns `chaos` children in slots, relays each Ref
/// a child shares to another child, and kills and respawns children at random.
struct Chaos {
    dir: PathBuf,
    tx: Sender<((usize, u64), String)>,
    rx: Receiver<((usize, u64), String)>,
    peers: Vec<Option<ChaosPeer>>,
    incarnations: u64,
    rng: Rng,
    /// Refs to relay later: when, from which slot, the line.
    delayed: Vec<(Instant, usize, String)>,
    domain_id: Option<u64>,
    /// Children that reported joining, and how many of them joined as the coordinator.
    joined: usize,
    founders: usize,
    relayed: usize,
    mapped: usize,
    gone: usize,
    kills: usize,
    bad: Vec<String>,
}

impl Chaos {
    fn new(dir: &Path, slots: usize, domain_id: Option<u64>) -> Chaos {
        let (tx, rx) = mpsc::channel();
        let seed = time_seed();
        eprintln!("chaos seed {seed:#x}");
        Chaos {
            dir: dir.to_path_buf(),
            tx,
            rx,
            peers: (0..slots).map(|_| None).collect(),
            incarnations: 0,
            rng: Rng::new(seed),
            delayed: Vec::new(),
            domain_id,
            joined: 0,
            founders: 0,
            relayed: 0,
            mapped: 0,
            gone: 0,
            kills: 0,
            bad: Vec::new(),
        }
    }

    fn spawn(&mut self, slot: usize) {
        assert!(self.peers[slot].is_none());
        let (child, stdin, stdout) = spawn_child("chaos", &self.dir);
        self.incarnations += 1;
        forward_lines(stdout, (slot, self.incarnations), self.tx.clone());
        self.peers[slot] = Some(ChaosPeer {
            child,
            stdin,
            incarnation: self.incarnations,
            ready: false,
        });
    }

    fn kill(&mut self, slot: usize) {
        if let Some(mut p) = self.peers[slot].take() {
            let _ = p.child.kill();
            let _ = p.child.wait();
            self.kills += 1;
        }
    }

    fn handle(&mut self, (slot, incarnation): (usize, u64), line: String) {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w[0] {
            "ready" => {
                let id = u64::from_str_radix(w[1], 16).unwrap();
                match self.domain_id {
                    None => self.domain_id = Some(id),
                    Some(expect) if expect != id => self.bad.push(format!(
                        "a child joined domain {id:016x}, not {expect:016x}"
                    )),
                    Some(_) => {}
                }
                self.joined += 1;
                self.founders += usize::from(w[2] == "true");
                if let Some(p) = &mut self.peers[slot] {
                    p.ready |= p.incarnation == incarnation;
                }
            }
            "ref" => {
                // Half the Refs are relayed at once, the others later: their creator may have
                // been killed meanwhile, or they may have expired.
                let delay = match self.rng.below(4) {
                    0 | 1 => 0,
                    2 => self.rng.below(300),
                    _ => 900 + self.rng.below(300),
                };
                let due = Instant::now() + Duration::from_millis(delay as u64);
                self.delayed
                    .push((due, slot, format!("map {} {}", w[1], w[2])));
                self.relay_due();
            }
            "mapped" => self.mapped += 1,
            "gone" => self.gone += 1,
            _ => self.bad.push(format!("child in slot {slot}: {line}")),
        }
    }

    /// Sends the Refs whose relay time came, each to a random other child that joined.
    fn relay_due(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.delayed.len() {
            if self.delayed[i].0 > now {
                i += 1;
                continue;
            }
            let (_, from, line) = self.delayed.swap_remove(i);
            let others: Vec<usize> = (0..self.peers.len())
                .filter(|&s| s != from && self.peers[s].as_ref().is_some_and(|p| p.ready))
                .collect();
            if others.is_empty() {
                continue; // The Ref expires in its creator.
            }
            let to = others[self.rng.below(others.len())];
            let p = self.peers[to].as_mut().unwrap();
            // A child killed meanwhile: EPIPE, and the Ref expires.
            if writeln!(p.stdin, "{line}").is_ok() {
                self.relayed += 1;
            }
        }
    }

    /// Handles the children's lines (and relays Refs) until `until`.
    fn pump(&mut self, until: Instant) {
        loop {
            self.relay_due();
            let now = Instant::now();
            if now >= until {
                return;
            }
            match self
                .rx
                .recv_timeout((until - now).min(Duration::from_millis(10)))
            {
                Ok((tag, line)) => self.handle(tag, line),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => unreachable!("we hold a sender"),
            }
        }
    }

    fn wait_ready(&mut self, slot: usize) {
        let deadline = Instant::now() + PATIENCE;
        while !self.peers[slot].as_ref().unwrap().ready {
            assert!(Instant::now() < deadline, "chaos child {slot} never joined");
            self.pump(Instant::now() + Duration::from_millis(20));
        }
    }

    /// Load with random kills (and respawns) of the children in `killable`, for at least
    /// `min` and until at least `maps` relayed Refs were mapped and `kills` children killed
    /// (so a slow machine still tests something), at most [`PATIENCE`].
    fn run(&mut self, min: Duration, killable: &[usize], maps: usize, kills: usize) {
        let start = Instant::now();
        let (mapped0, kills0) = (self.mapped, self.kills);
        let mut next_kill = start + Duration::from_millis(100 + self.rng.below(200) as u64);
        loop {
            let now = Instant::now();
            let enough = self.mapped - mapped0 >= maps && self.kills - kills0 >= kills;
            if now >= start + min && enough {
                return;
            }
            assert!(
                now < start + PATIENCE,
                "no progress under chaos: {} maps, {} kills",
                self.mapped - mapped0,
                self.kills - kills0
            );
            if now >= next_kill {
                let slot = killable[self.rng.below(killable.len())];
                self.kill(slot);
                self.spawn(slot);
                next_kill = now + Duration::from_millis(50 + self.rng.below(250) as u64);
            }
            self.pump(next_kill.min(now + Duration::from_millis(50)));
        }
    }

    /// Kills every child, collects their last lines, and checks none saw a wrong byte.
    fn finish(&mut self) {
        for slot in 0..self.peers.len() {
            self.kill(slot);
        }
        // The readers end at the children's EOF; take what they forwarded.
        self.pump(Instant::now() + Duration::from_millis(100));
        while let Ok((tag, line)) = self.rx.try_recv() {
            self.handle(tag, line);
        }
        eprintln!(
            "chaos: {} joins, {} kills, {} Refs relayed, {} mapped, {} gone",
            self.joined, self.kills, self.relayed, self.mapped, self.gone
        );
        assert!(self.bad.is_empty(), "{:#?}", self.bad);
    }
}

impl Drop for Chaos {
    fn drop(&mut self) {
        for p in self.peers.iter_mut().flatten() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

/// Every ref slot of the domain is free: this process can claim all of them, and no more.
fn check_all_slots_free(d: &Domain) {
    let buf = d.alloc_from(b"slot probe").unwrap();
    let refs: Vec<Ref> = (0..GEOMETRY.ref_slots)
        .map(|i| {
            buf.share().unwrap_or_else(|e| {
                panic!("only {i} of {} ref slots are free: {e}", GEOMETRY.ref_slots)
            })
        })
        .collect();
    assert!(matches!(buf.share(), Err(PoolError::Exhausted(_))));
    for r in &refs {
        d.revoke(r).unwrap();
    }
    drop(buf);
    let s = d.stats();
    assert_eq!(s.free_pages + s.held_pages, s.pages, "{s:?}");
    assert_eq!(s.held_pages, s.leased_pages, "{s:?}");
}

#[test]
fn chaos_killed_holders_leak_nothing() {
    let dir = TestDir::new("chaos");
    let d = Domain::join(&config(dir.path(), true)).unwrap();
    assert!(d.is_coordinator());
    let start = d.stats();
    assert_eq!(start.free_pages, start.pages);
    let mut chaos = Chaos::new(dir.path(), 4, Some(d.id()));
    for slot in 0..4 {
        chaos.spawn(slot);
    }
    chaos.run(Duration::from_millis(2500), &[0, 1, 2, 3], 20, 4);
    chaos.finish();
    // This process coordinates: it reaps every killed child.
    wait_all_back(&d);
    assert_eq!(d.stats().free_pages, start.free_pages, "pages leaked");
    check_all_slots_free(&d);
}

#[test]
fn chaos_coordinator_killed_a_member_takes_over() {
    let dir = TestDir::new("takeover");
    // A child founds the domain and coordinates it; this process is a plain member.
    let mut chaos = Chaos::new(dir.path(), 4, None);
    chaos.spawn(0);
    chaos.wait_ready(0);
    assert_eq!(chaos.founders, 1, "the first child founds the domain");
    let d = Domain::join(&config(dir.path(), true)).unwrap();
    assert_eq!(Some(d.id()), chaos.domain_id);
    assert!(!d.is_coordinator());
    for slot in 1..4 {
        chaos.spawn(slot);
    }
    chaos.run(Duration::from_millis(1000), &[1, 2, 3], 10, 2);

    // Kill the coordinator under load; a new process joins right after.
    chaos.kill(0);
    let joined = chaos.joined;
    chaos.spawn(0);
    chaos.wait_ready(0);
    chaos.run(Duration::from_millis(1500), &[0, 1, 2, 3], 10, 3);
    // (Every child that joined reported the domain's id: `handle` checks it.)
    assert!(chaos.joined > joined);
    chaos.finish();

    // With every child dead, this process is the last member: it took over and reaped them
    // all, the dead coordinator included.
    eventually("this process takes over", || d.is_coordinator());
    wait_all_back(&d);
    assert_eq!(
        d.stats().free_pages,
        GEOMETRY.pages as usize,
        "pages leaked"
    );
    check_all_slots_free(&d);
}

/// A process that connects to the coordinator and sends its join request a byte at a time
/// (each byte well inside any per-read timeout), and twenty that never send a word, hold up
/// no one else's join, and are cut off once the whole join's deadline (2 s) passes.
#[test]
fn a_trickled_join_holds_up_no_one_and_is_cut_off() {
    let dir = TestDir::new("trickle");
    let config = config(dir.path(), false);
    let founder = Domain::join(&config).unwrap();
    assert!(founder.is_coordinator());
    let socket = dir.path().join(format!("netless-domain.{DOMAIN}.sock"));
    let silent: Vec<std::os::unix::net::UnixStream> = (0..20)
        .map(|_| std::os::unix::net::UnixStream::connect(&socket).unwrap())
        .collect();
    let mut trickler = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let mut writer = trickler.try_clone().unwrap();
    let trickling = std::thread::spawn(move || {
        let _ = writer.write_all(&44u32.to_le_bytes());
        for _ in 0..40 {
            if writer.write_all(&[1]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    // Meanwhile another process joins as usual.
    let started = Instant::now();
    let mut peer = Peer::spawn(dir.path());
    assert_eq!(peer.domain_id, founder.id());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "a join took {:?} behind a trickled one",
        started.elapsed()
    );
    // The stalled joins are cut off: their sockets read end-of-file.
    let closed = |s: &mut std::os::unix::net::UnixStream| {
        s.set_read_timeout(Some(Duration::from_secs(6))).unwrap();
        let mut buf = [0u8; 64];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) => {
                    return !matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    )
                }
            }
        }
    };
    assert!(
        closed(&mut trickler),
        "a trickled join was still open after 6 s"
    );
    for mut s in silent {
        assert!(closed(&mut s), "a silent join stayed open");
    }
    trickling.join().unwrap();
    peer.exit();
}
