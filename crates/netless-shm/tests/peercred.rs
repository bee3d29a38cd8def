//! `SO_PEERCRED` on a socket pair, and ACL decisions.

use std::os::unix::net::UnixStream;

use netless_shm::{peer_cred, Acl, PeerCred};

#[test]
fn peer_cred_of_socketpair_is_ourselves() {
    let (a, b) = UnixStream::pair().unwrap();
    for sock in [&a, &b] {
        let cred = peer_cred(sock).unwrap();
        assert_eq!(cred.pid, std::process::id() as i32);
        assert_eq!(cred.uid, rustix::process::geteuid().as_raw());
        assert_eq!(cred.gid, rustix::process::getegid().as_raw());
        assert!(Acl::same_user().allows(&cred));
        assert!(Acl::default().allows(&cred));
    }
}

#[test]
fn acl_decisions() {
    let me = rustix::process::geteuid().as_raw();
    let cred = |uid, gid| PeerCred { pid: 1, uid, gid };
    let other = if me == 4242 { 4243 } else { 4242 };

    let same = Acl::same_user();
    assert_eq!(same.uids(), &[me]);
    assert!(same.gids().is_empty());
    assert!(same.allows(&cred(me, 12345)));
    assert!(!same.allows(&cred(other, 12345)));
    if me != 0 {
        assert!(!same.allows(&cred(0, 0)), "root is not implicitly allowed");
    }

    let nobody = Acl::new();
    assert!(!nobody.allows(&cred(me, 0)));
    assert!(!nobody.allows(&cred(0, 0)));

    let acl = Acl::new().allow_uid(1000).allow_gid(50).allow_uid(1000);
    assert_eq!(acl.uids(), &[1000]);
    assert!(acl.allows(&cred(1000, 1)));
    assert!(acl.allows(&cred(7, 50)));
    assert!(!acl.allows(&cred(7, 51)));
    assert!(!acl.allows(&cred(0, 0)));
    assert!(Acl::new().allow_uid(0).allows(&cred(0, 0)));
}
