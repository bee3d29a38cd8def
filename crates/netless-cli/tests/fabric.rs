//! End-to-end tests of `--fabric`: `netless echo-server` and `netless ping` (and `stat`) as
//! separate processes that share a memory-fabric region and nothing else: each runs with a
//! socket directory (`NETLESS_DIR`) of its own, which stays empty, so a call that goes
//! through went through the region.

mod common;

use std::path::{Path, PathBuf};

use rustix::process::Signal;

use common::*;

/// The entries of `dir`, by name.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A region file in a directory of its own (not created yet).
fn region(shared: &TestDir) -> PathBuf {
    shared.path.join("region")
}

#[test]
fn echo_server_and_ping_meet_in_a_fabric_with_no_socket_directory_in_common() {
    let shared = TestDir::new("fabric");
    let path = region(&shared);
    let fabric = path.to_str().unwrap();
    for (coherence, service) in [("hardware", "cli.FabricHw"), ("software", "cli.FabricSw")] {
        let _ = std::fs::remove_file(&path);
        let (server_dir, client_dir) = (TestDir::new("fs"), TestDir::new("fc"));
        let mut server = spawn(
            &server_dir,
            &[
                "echo-server",
                "--service",
                service,
                "--spin-us",
                "5",
                "--fabric",
                fabric,
                "--coherence",
                coherence,
                "--fabric-size",
                &(32u64 << 20).to_string(),
            ],
        );
        let ping = run_until_ok(
            &client_dir,
            &mut server,
            &[
                "ping",
                service,
                "--fabric",
                fabric,
                "--count",
                "3",
                "--payload",
                "100000",
                "--interval-ms",
                "0",
            ],
        );
        let report = ping.describe();
        assert!(
            ping.stdout.lines().any(|l| l == "3 calls, 3 ok, 0 failed"),
            "{report}"
        );
        assert_eq!(
            ping.stdout
                .lines()
                .filter(|l| l.starts_with(&format!("100000 bytes from {service}:")))
                .count(),
            3,
            "{report}"
        );
        // A pipelined ping goes through the region too.
        let window = run(
            &client_dir,
            &[
                "ping", service, "--fabric", fabric, "--count", "500", "--window", "8",
            ],
            SHORT,
        )
        .ok();
        assert!(
            window.stdout.contains("500 calls, 500 ok, 0 failed"),
            "{}",
            window.describe()
        );

        // stat finds the replica in the region's directory and reads its counters there.
        let stat = run(
            &client_dir,
            &["stat", service, "--fabric", fabric, "--json"],
            SHORT,
        )
        .ok();
        let json = stat.json();
        let replica = &json["services"][0];
        assert_eq!(replica["service"], service, "{}", stat.describe());
        assert!(
            replica["calls"].as_u64().unwrap() >= 503,
            "{}",
            stat.describe()
        );

        // fabric ls: the server's membership and its entry, alive.
        let ls = run(&client_dir, &["fabric", "ls", fabric], SHORT).ok();
        let report = ls.describe();
        assert!(
            ls.stdout
                .lines()
                .next()
                .is_some_and(|l| l.contains(&format!("{coherence} coherence"))),
            "{report}"
        );
        let entry = ls
            .stdout
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(service))
            .unwrap_or_else(|| panic!("no entry for {service}\n{report}"));
        assert!(entry.ends_with(" yes"), "{report}");
        let member = entry.split_whitespace().nth(2).unwrap();
        let server_line = ls
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{member} ")))
            .unwrap_or_else(|| panic!("no member {member}\n{report}"));
        assert!(server_line.contains(" live "), "{report}");
        assert!(server_line.ends_with(" yes"), "{report}");
        assert!(
            ls.stdout.lines().any(|l| l.ends_with(" (this)")),
            "{report}"
        );

        // Nothing went through a socket directory, and the region is the only shared file.
        assert_eq!(listing(&server_dir.path), Vec::<String>::new());
        assert_eq!(listing(&client_dir.path), Vec::<String>::new());
        assert_eq!(listing(&shared.path), vec!["region".to_string()]);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 32 << 20);

        let out = server.stop(Signal::TERM);
        assert!(
            out.stdout
                .contains(&format!("serving `{service}` in fabric {fabric}")),
            "{}",
            out.describe()
        );

        // Its entry is gone with it: a ping now fails UNAVAILABLE.
        let gone = run(
            &client_dir,
            &[
                "ping",
                service,
                "--fabric",
                fabric,
                "--count",
                "1",
                "--interval-ms",
                "0",
            ],
            SHORT,
        );
        assert_eq!(gone.status.code(), Some(1), "{}", gone.describe());
        assert!(
            gone.stdout.contains("not found in the fabric"),
            "{}",
            gone.describe()
        );
        assert!(
            gone.stdout.contains("failures by status: UNAVAILABLE 1"),
            "{}",
            gone.describe()
        );
    }
}

#[test]
fn a_client_never_makes_a_region_and_a_bad_region_is_refused() {
    let dir = TestDir::new("fabric-args");
    // Only the server makes a region, so only it takes --coherence and --fabric-size.
    let out = run(
        &dir,
        &["ping", "cli.X", "--coherence", "software", "--count", "1"],
        SHORT,
    );
    assert_eq!(out.status.code(), Some(2), "{}", out.describe());
    assert!(out.stderr.contains("--coherence"), "{}", out.describe());

    // No region yet: the calls fail UNAVAILABLE, as with no server, and none is made.
    let missing = dir.path.join("missing");
    let out = run(
        &dir,
        &[
            "ping",
            "cli.X",
            "--fabric",
            missing.to_str().unwrap(),
            "--count",
            "2",
            "-i",
            "0",
        ],
        SHORT,
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    assert!(
        out.stdout.contains("no fabric region at"),
        "{}",
        out.describe()
    );
    assert!(
        out.stdout.contains("failures by status: UNAVAILABLE 2"),
        "{}",
        out.describe()
    );
    assert!(!missing.exists());
    let out = run(&dir, &["fabric", "ls", missing.to_str().unwrap()], SHORT);
    assert_eq!(out.status.code(), Some(2), "{}", out.describe());
    assert!(
        out.stderr.contains("no fabric region at"),
        "{}",
        out.describe()
    );
    assert!(!missing.exists());

    // A file that is not a region is refused with the reason, not formatted over.
    let junk = dir.path.join("junk");
    std::fs::write(&junk, vec![0xa5u8; 4 << 20]).unwrap();
    let junk = junk.to_str().unwrap();
    let out = run(
        &dir,
        &["ping", "cli.X", "--fabric", junk, "--count", "1"],
        SHORT,
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    assert!(
        out.stdout.contains("not a netless fabric region"),
        "{}",
        out.describe()
    );
    let out = run(&dir, &["stat", "--fabric", junk, "--json"], SHORT);
    assert_eq!(out.status.code(), Some(2), "{}", out.describe());
    assert!(
        out.stderr.contains("not a netless fabric region"),
        "{}",
        out.describe()
    );
    assert_eq!(std::fs::read(junk).unwrap(), vec![0xa5u8; 4 << 20]);
}
