//! The socket directory and the server's identity, with real processes: directories another
//! user made, symbolic links and directories others may write are refused by servers and
//! clients alike; one live server holds a name, however servers start, die and stop; and a
//! client refuses a server that runs as another uid than it expects.
//!
//! Peers are this test binary again, running only `child_process_entry` in a role; the cases
//! that need a second uid run a peer as another uid (`Command::uid`) and are skipped, saying
//! so, when the tests do not run as root.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::*;
use netless::{Acl, CallOptions, Client, ClientConfig, Code, Server, ServerConfig, Status};

/// An unprivileged uid that owns nothing else here (the usual `nobody`).
const OTHER_UID: u32 = 65534;
/// How long a peer may take to come up or to answer.
const PATIENCE: Duration = Duration::from_secs(20);

/// Entry point of spawned peers (run only by them, via `--ignored`).
#[test]
#[ignore = "entry point of the peer processes the other tests spawn"]
fn child_process_entry() {
    let Some((role, dir, service)) = role() else {
        return;
    };
    let config = match role.as_str() {
        // Serve in `dir` until stdin closes.
        "server" => server_config(&dir),
        // As "server", in whatever directory the environment names (NETLESS_DIR, ...).
        "default-dir-server" => ServerConfig {
            dir: None,
            ..server_config(&dir)
        },
        // As "server", letting root's clients in too (this peer runs as another uid).
        "open-server" => ServerConfig {
            acl: Acl::same_user().allow_uid(0),
            ..server_config(&dir)
        },
        other => panic!("unknown role {other}"),
    };
    match Server::bind(&service, config, test_handler) {
        Ok(server) => {
            say("READY");
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            drop(server);
        }
        Err(e) => say(&format!("BIND-ERR {}: {}", e.code(), e.message())),
    }
}

/// One line to the parent, marked (the harness prints its own lines on the same stdout).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "@@{line}").unwrap();
    out.flush().unwrap();
}

/// A peer process; killed on drop.
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Peer {
    /// Spawns `role` serving `service` in `dir`, as `uid` if given, with `env` set (an empty
    /// value removes the variable).
    fn spawn(
        role: &str,
        dir: &Path,
        service: &str,
        uid: Option<u32>,
        env: &[(&str, &str)],
    ) -> Peer {
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
        .env(SERVICE, service)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        for (key, value) in env {
            if value.is_empty() {
                cmd.env_remove(key);
            } else {
                cmd.env(key, value);
            }
        }
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        let mut child = cmd.spawn().expect("spawn a peer");
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

    /// The peer's first line (`READY` or `BIND-ERR ...`).
    fn first_line(&self) -> String {
        self.lines
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|e| panic!("peer {} said nothing: {e:?}", self.child.id()))
    }

    fn serving(role: &str, dir: &Path, service: &str, uid: Option<u32>) -> Peer {
        let peer = Peer::spawn(role, dir, service, uid, &[]);
        let line = peer.first_line();
        assert_eq!(line, "READY", "the peer could not serve");
        peer
    }

    /// Closes stdin (the peer stops serving and exits) and waits for it.
    fn stop(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "peer exited with {status}");
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().as_raw() == 0
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A directory owned by `uid`, mode 0700, removed on drop.
fn dir_of(uid: u32, tag: &str) -> TestDir {
    let dir = TestDir::new(tag);
    std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid)).unwrap();
    dir
}

fn call_echo(client: &Client) -> Result<Vec<u8>, Status> {
    Ok(client.call("Echo", b"who", &CallOptions::new())?.payload)
}

fn refused(result: Result<impl std::fmt::Debug, Status>, says: &str) {
    match result {
        Err(e) => {
            assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
            assert!(e.message().contains(says), "{e}");
        }
        Ok(v) => panic!("accepted ({v:?}), expected a refusal saying {says:?}"),
    }
}

#[test]
fn symbolic_links_and_directories_others_may_write_are_refused() {
    let real = TestDir::new("real");
    let link = real.path().with_extension("link");
    std::os::unix::fs::symlink(real.path(), &link).unwrap();
    let writable = TestDir::new("writable");
    chmod(writable.path(), 0o777);
    for (dir, says) in [(&link, "symbolic link"), (&writable.0, "(mode 0777)")] {
        refused(
            Server::bind("test.Dir", server_config(dir), test_handler),
            says,
        );
        refused(Client::connect_with("test.Dir", client_config(dir)), says);
        refused(client_config(dir).socket_path("test.Dir"), says);
        // Named through the environment rather than the configuration, in another process.
        let peer = Peer::spawn(
            "default-dir-server",
            real.path(),
            "test.Dir",
            None,
            &[("NETLESS_DIR", dir.to_str().unwrap())],
        );
        let line = peer.first_line();
        assert!(
            line.starts_with("BIND-ERR FAILED_PRECONDITION") && line.contains(says),
            "{line}"
        );
    }
    // Nothing was created behind the link, and a server still binds in the real directory.
    assert!(!real.path().join("test.Dir.sock").exists());
    let _server = Server::bind("test.Dir", server_config(real.path()), test_handler).unwrap();
    std::fs::remove_file(&link).unwrap();
}

#[test]
fn a_socket_dir_made_by_another_user_is_refused() {
    if !is_root() {
        eprintln!("SKIPPED: making a directory of another user needs root");
        return;
    }
    // The explicit directory of a configuration.
    let theirs = dir_of(OTHER_UID, "theirs");
    let says = format!("owned by uid {OTHER_UID}");
    refused(
        Server::bind("test.Dir", server_config(theirs.path()), test_handler),
        &says,
    );
    refused(
        Client::connect_with("test.Dir", client_config(theirs.path())),
        &says,
    );

    // The default directory of a user, /tmp/netless-<uid>, made first by another user: a
    // server of that user (a peer running as it, with no NETLESS_DIR or XDG_RUNTIME_DIR)
    // refuses it rather than serve where the other user can read and replace its socket.
    let victim = 61_000 + std::process::id() % 1000;
    let default = PathBuf::from(format!("/tmp/netless-{victim}"));
    if default.exists() {
        eprintln!(
            "SKIPPED the default-directory case: {} exists",
            default.display()
        );
        return;
    }
    std::fs::create_dir(&default).unwrap();
    std::os::unix::fs::chown(&default, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    chmod(&default, 0o755);
    let peer = Peer::spawn(
        "default-dir-server",
        theirs.path(),
        "test.Dir",
        Some(victim),
        &[("NETLESS_DIR", ""), ("XDG_RUNTIME_DIR", "")],
    );
    let line = peer.first_line();
    drop(peer);
    std::fs::remove_dir_all(&default).unwrap();
    assert!(
        line.starts_with("BIND-ERR FAILED_PRECONDITION")
            && line.contains(&format!("/tmp/netless-{victim}"))
            && line.contains(&says)
            && line.contains(&format!("neither ours (uid {victim})")),
        "{line}"
    );
}

#[test]
fn a_second_server_is_refused_while_the_first_serves() {
    let dir = TestDir::new("second");
    let first = Peer::serving("server", dir.path(), "test.Two", None);
    let err = Server::bind("test.Two", server_config(dir.path()), test_handler).unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err}");
    assert!(err.message().contains("already served"), "{err}");
    // The first server's socket is still there and still answers.
    let client = Client::connect_with("test.Two", client_config(dir.path())).unwrap();
    assert_eq!(call_echo(&client).unwrap(), b"who");
    drop(client);
    first.stop();
    // Once it stopped, the name is free.
    let _server = Server::bind("test.Two", server_config(dir.path()), test_handler).unwrap();
}

#[test]
fn servers_starting_together_over_a_stale_socket_get_one_name() {
    let dir = TestDir::new("race");
    for round in 0..8 {
        // A dead server's socket: bound, then left behind.
        drop(std::os::unix::net::UnixListener::bind(dir.path().join("test.Race.sock")).unwrap());
        let start = Arc::new(Barrier::new(4));
        let contenders: Vec<_> = (0..4)
            .map(|_| {
                let (start, path) = (start.clone(), dir.path().to_owned());
                std::thread::spawn(move || {
                    start.wait();
                    Server::bind("test.Race", server_config(&path), test_handler)
                })
            })
            .collect();
        let results: Vec<_> = contenders.into_iter().map(|t| t.join().unwrap()).collect();
        let winners: Vec<&Server> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        for r in &results {
            if let Err(e) = r {
                assert_eq!(e.code(), Code::AlreadyExists, "round {round}: {e}");
            }
        }
        // The winner's socket is the one in the directory.
        let client = Client::connect_with("test.Race", client_config(dir.path())).unwrap();
        assert_eq!(call_echo(&client).unwrap(), b"who", "round {round}");
        drop(client);
        drop(results);
        assert!(!dir.path().join("test.Race.sock").exists(), "round {round}");
    }
}

#[test]
fn a_killed_servers_stale_socket_is_replaced() {
    let dir = TestDir::new("stale");
    let mut dead = Peer::serving("server", dir.path(), "test.Stale", None);
    dead.kill();
    assert!(
        dir.path().join("test.Stale.sock").exists(),
        "SIGKILL leaves the socket behind"
    );
    let _server = Server::bind("test.Stale", server_config(dir.path()), test_handler).unwrap();
    let client = Client::connect_with("test.Stale", client_config(dir.path())).unwrap();
    assert_eq!(call_echo(&client).unwrap(), b"who");
}

#[test]
fn a_server_whose_socket_was_replaced_leaves_the_new_one() {
    let dir = TestDir::new("replaced");
    let old = Server::bind("test.Swap", server_config(dir.path()), test_handler).unwrap();
    // Someone removes the old server's files (its lock file, if it has one), and another
    // server takes the name.
    std::fs::remove_file(dir.path().join("test.Swap.sock")).unwrap();
    let _ = std::fs::remove_file(dir.path().join("test.Swap.sock.lock"));
    let new = Peer::serving("server", dir.path(), "test.Swap", None);
    drop(old);
    assert!(dir.path().join("test.Swap.sock").exists());
    let client = Client::connect_with("test.Swap", client_config(dir.path())).unwrap();
    assert_eq!(call_echo(&client).unwrap(), b"who");
    // And the new server still holds the name.
    let err = Server::bind("test.Swap", server_config(dir.path()), test_handler).unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err}");
    drop(client);
    new.stop();
}

#[test]
fn a_client_refuses_a_server_of_another_uid() {
    if !is_root() {
        eprintln!("SKIPPED: running a server as another uid needs root");
        return;
    }
    let ours = TestDir::new("ours");
    let theirs = dir_of(OTHER_UID, "theirs");
    let _root_server = Peer::serving("server", ours.path(), "test.Root", None);
    let other_server = Peer::serving("open-server", theirs.path(), "test.Other", Some(OTHER_UID));

    // A server of another uid whose socket turns up in our directory (linked there: the
    // socket is reached by its inode) is refused before anything is sent.
    std::fs::hard_link(
        theirs.path().join("test.Other.sock"),
        ours.path().join("test.Planted.sock"),
    )
    .unwrap();
    let err = Client::connect_with("test.Planted", client_config(ours.path())).unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    assert!(
        err.message()
            .contains(&format!("served by uid {OTHER_UID}, not by uid 0"))
            && err.message().contains("expect_server_uid"),
        "{err}"
    );

    // A client told to expect that uid reaches it, in its directory...
    let expecting = ClientConfig {
        expect_server_uid: Some(OTHER_UID),
        ..client_config(theirs.path())
    };
    let client = Client::connect_with("test.Other", expecting.clone()).unwrap();
    assert_eq!(call_echo(&client).unwrap(), b"who");
    // ...but refuses root's server: root is not the uid it expects.
    let err = Client::connect_with(
        "test.Root",
        ClientConfig {
            dir: Some(ours.path().to_owned()),
            ..expecting
        },
    )
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    assert!(
        err.message()
            .contains(&format!("served by uid 0, not by uid {OTHER_UID}")),
        "{err}"
    );
    // Without the expectation, the other user's directory itself is refused.
    refused(
        Client::connect_with("test.Other", client_config(theirs.path())),
        &format!("owned by uid {OTHER_UID}"),
    );
    drop(client);
    other_server.stop();
}
