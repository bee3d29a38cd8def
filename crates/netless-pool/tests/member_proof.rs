//! Proving membership to a peer: a member's claim to its row holds only with the open file
//! its liveness token is held on, whoever else knows the row, the token or the file's path;
//! and a server maps a proven member's Refs only. Two memberships of one process stand for
//! two processes: each holds its token on an open file of its own.

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use netless_pool::{Domain, DomainConfig, MemberClaim, PoolError};

struct TestDir(PathBuf);

impl TestDir {
    fn new(tag: &str) -> TestDir {
        let path = std::env::temp_dir().join(format!("nlp-proof-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path).unwrap();
        TestDir(path)
    }

    fn join(&self) -> Domain {
        let mut config = DomainConfig::new("proof");
        config.dir = Some(self.0.clone());
        Domain::join(&config).unwrap()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A member's claim, and a copy of the open file proving it (as `SCM_RIGHTS` passes it).
fn claim(d: &Domain) -> (MemberClaim, OwnedFd) {
    let (claim, file) = d.member_claim().unwrap();
    (claim, file.try_clone_to_owned().unwrap())
}

#[test]
fn a_member_proves_its_row_with_its_own_open_file_only() {
    let dir = TestDir::new("prove");
    let server = dir.join();
    let client = dir.join();
    let (mine, my_file) = claim(&client);
    assert_eq!(mine.member as usize, client.member());
    let peer = server
        .verify_member(mine, my_file)
        .expect("the member's own proof");
    assert_eq!(peer.member(), client.member());
    assert!(server.is_live_member(&peer));

    // The server's own row, proved by the server's open file (a client in the process).
    let (its, its_file) = claim(&server);
    assert!(server.verify_member(its, its_file).is_some());

    // The client's row with any other open file: the server's, or one opened anew by path
    // (as the domain's owner could).
    let members = dir.0.join("netless-domain.proof.members");
    let other = || -> OwnedFd { std::fs::File::open(&members).unwrap().into() };
    let (_, its_file) = claim(&server);
    assert!(server.verify_member(mine, its_file).is_none());
    assert!(server.verify_member(mine, other()).is_none());
    // The server's row with the client's file.
    let (_, my_file) = claim(&client);
    assert!(server.verify_member(its, my_file).is_none());
    // Another generation, another row, a row beyond the table, another file altogether.
    for forged in [
        MemberClaim {
            generation: mine.generation + 1,
            ..mine
        },
        MemberClaim {
            member: mine.member + 1,
            ..mine
        },
        MemberClaim {
            member: 10_000,
            ..mine
        },
    ] {
        let (_, my_file) = claim(&client);
        assert!(
            server.verify_member(forged, my_file).is_none(),
            "{forged:?}"
        );
    }
    let unrelated: OwnedFd = std::fs::File::open(&dir.0).unwrap().into();
    assert!(server.verify_member(mine, unrelated).is_none());
    // Private domains have no members file to prove anything with.
    let private = Domain::private(netless_pool::PoolGeometry::default()).unwrap();
    assert!(private.member_claim().is_none());
    let (_, my_file) = claim(&client);
    assert!(private.verify_member(mine, my_file).is_none());

    // A proof kept nothing open: the member leaves, and its row is no longer live.
    drop(client);
    assert!(!server.is_live_member(&peer));
}

#[test]
fn a_server_maps_only_the_proven_members_refs() {
    let dir = TestDir::new("map");
    let server = dir.join();
    let client = dir.join();
    let third = dir.join();
    let (mine, my_file) = claim(&client);
    let peer = server.verify_member(mine, my_file).unwrap();
    let theirs = third
        .alloc_from(b"not the client's")
        .unwrap()
        .share()
        .unwrap();
    let err = server.map_from_member(&theirs, &peer).unwrap_err();
    assert!(matches!(err, PoolError::InvalidRef(_)), "{err}");
    let buf = client.alloc_from(b"the client's").unwrap();
    let r = buf.share().unwrap();
    assert_eq!(
        server.map_from_member(&r, &peer).unwrap().to_vec(),
        b"the client's"
    );
    // Once the member left, its proof maps nothing more.
    let stale = client.alloc_from(b"late").unwrap().share().unwrap();
    drop(buf);
    drop(client);
    let err = server.map_from_member(&stale, &peer).unwrap_err();
    assert!(
        matches!(err, PoolError::InvalidRef(_) | PoolError::RefGone(_)),
        "{err}"
    );
}
