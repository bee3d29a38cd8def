//! `socket_dir` resolution and securing. All environment changes happen in one test function
//! (this file is its own test binary), so nothing races on the environment.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use netless_shm::{service_socket_path, socket_dir, Error};

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("netless-shm-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn socket_dir_resolution_and_permissions() {
    // SAFETY: this is the only test in this binary, so no other thread reads or writes the
    // environment concurrently.
    unsafe {
        std::env::remove_var("NETLESS_DIR");
        std::env::remove_var("XDG_RUNTIME_DIR");
    }

    // 1. NETLESS_DIR wins and is created 0700, parents included.
    let root = scratch("root");
    let dir = root.join("a/b/netless");
    // SAFETY: single-threaded test binary, see above.
    unsafe { std::env::set_var("NETLESS_DIR", &dir) };
    assert_eq!(socket_dir().unwrap(), dir);
    assert!(dir.is_dir());
    assert_eq!(mode(&dir), 0o700);

    // 2. An existing directory with group/other bits is tightened to 0700.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(socket_dir().unwrap(), dir);
    assert_eq!(mode(&dir), 0o700);

    // 3. A file in the way is refused.
    let file = root.join("file");
    std::fs::write(&file, b"x").unwrap();
    // SAFETY: single-threaded test binary, see above.
    unsafe { std::env::set_var("NETLESS_DIR", &file) };
    assert!(matches!(socket_dir(), Err(Error::SocketDir { .. })));

    // 4. A directory owned by someone else is refused. As root we can make one by chown;
    //    otherwise "/" (owned by root) serves.
    let foreign = if rustix::process::geteuid().as_raw() == 0 {
        let foreign = root.join("foreign");
        std::fs::create_dir(&foreign).unwrap();
        std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
        foreign
    } else {
        PathBuf::from("/")
    };
    // SAFETY: single-threaded test binary, see above.
    unsafe { std::env::set_var("NETLESS_DIR", &foreign) };
    let err = socket_dir().unwrap_err();
    assert!(matches!(err, Error::SocketDir { .. }), "{err}");
    assert!(err.to_string().contains("owned by uid"), "{err}");

    // 5. Without NETLESS_DIR, XDG_RUNTIME_DIR/netless is used if XDG_RUNTIME_DIR exists.
    let runtime = root.join("runtime");
    std::fs::create_dir_all(&runtime).unwrap();
    // SAFETY: single-threaded test binary, see above.
    unsafe {
        std::env::remove_var("NETLESS_DIR");
        std::env::set_var("XDG_RUNTIME_DIR", &runtime);
    }
    assert_eq!(socket_dir().unwrap(), runtime.join("netless"));
    assert_eq!(mode(&runtime.join("netless")), 0o700);

    // 6. A missing XDG_RUNTIME_DIR falls back to /tmp/netless-<euid>.
    // SAFETY: single-threaded test binary, see above.
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
