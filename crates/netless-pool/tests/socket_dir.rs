//! A domain's socket directory and its coordinator's identity: joining refuses a directory
//! that is a symbolic link or that others may write, and a coordinator that runs as a uid
//! the domain's ACL does not admit (a peer process of another uid, when the tests run as
//! root; skipped, saying so, otherwise).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use netless_pool::{Domain, DomainConfig, PoolError, PoolGeometry};

const ROLE: &str = "NLP_DIR_ROLE";
const DIR: &str = "NLP_DIR_DIR";
const OTHER_UID: u32 = 65534;

fn config(dir: &Path) -> DomainConfig {
    let mut c = DomainConfig::new("d");
    c.dir = Some(dir.to_path_buf());
    c.geometry = PoolGeometry {
        pages: 64,
        ref_slots: 16,
    };
    c
}

/// A private directory `/tmp/nlp-dir-<pid>-<tag>`, removed on drop.
struct TestDir(PathBuf);

impl TestDir {
    fn new(tag: &str) -> TestDir {
        let path = PathBuf::from(format!("/tmp/nlp-dir-{}-{tag}", std::process::id()));
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

fn refused(result: Result<Domain, PoolError>, says: &str) {
    match result {
        Err(e @ PoolError::Shm(netless_shm::Error::SocketDir { .. })) => {
            assert!(e.to_string().contains(says), "{e}")
        }
        other => panic!("expected a refused directory saying {says:?}, got {other:?}"),
    }
}

/// Entry point of the spawned peer (run only by it, via `--ignored`): founds the domain in
/// its directory, says so, and coordinates it until stdin closes.
#[test]
#[ignore = "entry point of the peer process the other tests spawn"]
fn child_process_entry() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    let dir = PathBuf::from(std::env::var(DIR).unwrap());
    let domain = Domain::join(&config(&dir)).unwrap();
    assert!(domain.is_coordinator());
    println!("@@READY");
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

#[test]
fn a_domain_refuses_a_linked_or_shared_socket_dir() {
    let real = TestDir::new("real");
    let link = real.0.with_extension("link");
    std::os::unix::fs::symlink(&real.0, &link).unwrap();
    refused(Domain::join(&config(&link)), "symbolic link");
    std::fs::remove_file(&link).unwrap();
    let shared = TestDir::new("shared");
    std::fs::set_permissions(&shared.0, std::fs::Permissions::from_mode(0o1777)).unwrap();
    refused(Domain::join(&config(&shared.0)), "(mode 1777)");
    // Nothing was created in either, and the real directory serves.
    assert_eq!(std::fs::read_dir(&real.0).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(&shared.0).unwrap().count(), 0);
    assert!(Domain::join(&config(&real.0)).unwrap().is_coordinator());
}

#[test]
fn a_member_refuses_a_coordinator_its_acl_does_not_admit() {
    if rustix::process::geteuid().as_raw() != 0 {
        eprintln!("SKIPPED: running a coordinator as another uid needs root");
        return;
    }
    // Another user founds a domain in a directory of its own...
    let theirs = TestDir::new("theirs");
    std::os::unix::fs::chown(&theirs.0, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    let mut peer = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_entry", "--ignored", "--nocapture"])
        .env(ROLE, "coordinator")
        .env(DIR, &theirs.0)
        .uid(OTHER_UID)
        .gid(OTHER_UID)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(peer.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("@@READY") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the peer died");
    }
    // ...and its socket turns up in ours: we refuse it before sending anything.
    let ours = TestDir::new("ours");
    std::fs::hard_link(
        theirs.0.join("netless-domain.d.sock"),
        ours.0.join("netless-domain.d.sock"),
    )
    .unwrap();
    let err = Domain::join(&config(&ours.0)).unwrap_err();
    assert!(
        matches!(err, PoolError::Join { .. })
            && err
                .to_string()
                .contains(&format!("runs as uid {OTHER_UID}")),
        "{err}"
    );
    // Its directory itself is refused unless its owner is someone the ACL admits.
    refused(Domain::join(&config(&theirs.0)), "owned by uid 65534");
    drop(peer.stdin.take());
    let _ = peer.kill();
    let _ = peer.wait();
}
