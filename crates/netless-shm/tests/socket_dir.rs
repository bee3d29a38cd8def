//! `socket_dir` resolution and the checks of `SocketDir`. All environment changes happen in
//! one test function (this file is its own test binary), so nothing races on the environment;
//! the other tests name their directories explicitly.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use netless_shm::{service_socket_path, socket_dir, Error, SocketClaim, SocketDir};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("netless-shm-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn refused(result: Result<SocketDir, Error>, says: &str) {
    match result {
        Err(e @ Error::SocketDir { .. }) => assert!(e.to_string().contains(says), "{e}"),
        other => panic!("expected a refusal saying {says:?}, got {other:?}"),
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().as_raw() == 0
}

#[test]
fn socket_dir_resolution_and_permissions() {
    // SAFETY: this is the only test in this binary that touches the environment, and no
    // test here reads it (the others name their directories).
    unsafe {
        std::env::remove_var("NETLESS_DIR");
        std::env::remove_var("XDG_RUNTIME_DIR");
    }

    // 1. NETLESS_DIR wins and is created 0700, parents included.
    let root = scratch("root");
    let dir = root.join("a/b/netless");
    // SAFETY: the only test in this binary that touches the environment; no other test here
    // reads it (they name their directories), so no thread reads it while it is set.
    unsafe { std::env::set_var("NETLESS_DIR", &dir) };
    assert_eq!(socket_dir().unwrap(), dir);
    assert!(dir.is_dir());
    assert_eq!(mode(&dir), 0o700);

    // 2. An existing directory its owner lets others read and search is left as it is (a
    //    deployment serving other users does that on purpose); one others may write is not.
    chmod(&dir, 0o755);
    assert_eq!(socket_dir().unwrap(), dir);
    assert_eq!(mode(&dir), 0o755);
    chmod(&dir, 0o775);
    let err = socket_dir().unwrap_err();
    assert!(
        err.to_string().contains("may write it (mode 0775)"),
        "{err}"
    );
    chmod(&dir, 0o700);

    // 3. A file in the way is refused.
    let file = root.join("file");
    std::fs::write(&file, b"x").unwrap();
    // SAFETY: the only test in this binary that touches the environment; no other test here
    // reads it (they name their directories), so no thread reads it while it is set.
    unsafe { std::env::set_var("NETLESS_DIR", &file) };
    assert!(matches!(socket_dir(), Err(Error::SocketDir { .. })));

    // 4. A symbolic link to a good directory is refused, through the environment too.
    let link = root.join("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    // SAFETY: the only test in this binary that touches the environment; no other test here
    // reads it (they name their directories), so no thread reads it while it is set.
    unsafe { std::env::set_var("NETLESS_DIR", &link) };
    let err = socket_dir().unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");

    // 5. Without NETLESS_DIR, XDG_RUNTIME_DIR/netless is used if XDG_RUNTIME_DIR exists.
    let runtime = root.join("runtime");
    std::fs::create_dir_all(&runtime).unwrap();
    // SAFETY: the only test in this binary that touches the environment; no other test here
    // reads it (they name their directories), so no thread reads it while it is set.
    unsafe {
        std::env::remove_var("NETLESS_DIR");
        std::env::set_var("XDG_RUNTIME_DIR", &runtime);
    }
    assert_eq!(socket_dir().unwrap(), runtime.join("netless"));
    assert_eq!(mode(&runtime.join("netless")), 0o700);

    // 6. A missing XDG_RUNTIME_DIR falls back to /tmp/netless-<euid>.
    // SAFETY: the only test in this binary that touches the environment; no other test here
    // reads it (they name their directories), so no thread reads it while it is set.
    unsafe { std::env::set_var("XDG_RUNTIME_DIR", root.join("missing")) };
    let uid = rustix::process::geteuid().as_raw();
    assert_eq!(
        socket_dir().unwrap(),
        PathBuf::from(format!("/tmp/netless-{uid}"))
    );
    assert!(!root.join("missing").exists());

    // service_socket_path composes with it.
    let path = service_socket_path(&runtime.join("netless"), "pkg.Echo").unwrap();
    assert_eq!(path, runtime.join("netless/pkg.Echo.sock"));

    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn only_a_directory_of_a_trusted_owner_that_others_cannot_write() {
    let root = scratch("checks");
    let good = root.join("good");
    let dir = SocketDir::resolve(Some(&good), &[]).unwrap();
    assert_eq!(mode(&good), 0o700);
    assert_eq!(dir.owner(), rustix::process::geteuid().as_raw());

    for bad in [0o777, 0o1777, 0o770, 0o702] {
        chmod(&good, bad);
        refused(SocketDir::open(&good, &[]), "may write it");
    }
    chmod(&good, 0o700);

    let link = root.join("link");
    std::os::unix::fs::symlink(&good, &link).unwrap();
    refused(SocketDir::open(&link, &[]), "symbolic link");
    refused(SocketDir::resolve(Some(&link), &[]), "symbolic link");
    refused(
        SocketDir::open(&root.join("missing"), &[]),
        "does not exist",
    );

    if is_root() {
        // Another user's directory: refused unless that user is trusted (an expected server).
        let theirs = root.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        refused(SocketDir::open(&theirs, &[]), "owned by uid 65534");
        refused(SocketDir::open(&theirs, &[4242]), "owned by uid 65534");
        assert_eq!(SocketDir::open(&theirs, &[65534]).unwrap().owner(), 65534);
    } else {
        eprintln!("skipping the other-user case: it needs root to chown a directory");
    }
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_swapped_directory_does_not_redirect_binds() {
    let root = scratch("swap");
    let first = root.join("first");
    let dir = SocketDir::resolve(Some(&first), &[]).unwrap();
    // After the check, the path is renamed away and a different directory takes its name:
    // sockets still go where the check looked.
    std::fs::rename(&first, root.join("moved")).unwrap();
    std::fs::create_dir(&first).unwrap();
    let (claim, _listener) = SocketClaim::bind(&dir, "swap.Echo.sock").unwrap();
    assert!(root.join("moved/swap.Echo.sock").exists());
    assert!(!first.join("swap.Echo.sock").exists());
    assert!(dir.connect("swap.Echo.sock").is_ok());
    assert_eq!(dir.sockets().unwrap(), vec!["swap.Echo.sock".to_owned()]);
    drop(claim);
    assert!(!root.join("moved/swap.Echo.sock").exists());
    assert!(!root.join("moved/swap.Echo.sock.lock").exists());
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_claim_removes_only_its_own_socket() {
    let root = scratch("claim");
    let dir = SocketDir::resolve(Some(&root), &[]).unwrap();
    let (first, _l1) = SocketClaim::bind(&dir, "c.sock").unwrap();
    assert!(matches!(
        SocketClaim::bind(&dir, "c.sock"),
        Err(Error::AlreadyServed { .. })
    ));
    // Someone removes our socket and lock file and a second server takes the name.
    std::fs::remove_file(root.join("c.sock")).unwrap();
    std::fs::remove_file(root.join("c.sock.lock")).unwrap();
    let (second, _l2) = SocketClaim::bind(&dir, "c.sock").unwrap();
    drop(first);
    assert!(
        root.join("c.sock").exists(),
        "the first claim removed the second's socket"
    );
    assert!(root.join("c.sock.lock").exists());
    assert!(matches!(
        SocketClaim::bind(&dir, "c.sock"),
        Err(Error::AlreadyServed { .. })
    ));
    drop(second);
    assert!(!root.join("c.sock").exists());
    std::fs::remove_dir_all(&root).unwrap();
}
