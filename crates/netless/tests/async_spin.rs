//! Async calls that poll the ring themselves (the spinner) leave the reaper thread asleep:
//! waking it for every call cost a system call and a context switch on the caller's core,
//! and its preemptions were the tail of tonic-over-netless latency. In a binary of its own,
//! so that this client's reaper is the only one in the process.

mod common;

use std::io::{BufReader, Read, Write};
use std::time::{Duration, Instant};

use common::*;
use netless::{CallOptions, Client, ClientConfig, Server, WaitMode, WaitPolicy};

/// Entry point of the spawned server (run only by it, via `--ignored`).
#[test]
#[ignore = "entry point of the peer processes the other tests spawn"]
fn async_spin_child_entry() {
    let Some((_role, dir, service)) = role() else {
        return;
    };
    let _server = Server::bind(&service, server_config(&dir), test_handler).unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

/// The first CPU this process may use.
fn first_cpu() -> usize {
    let set = rustix::thread::sched_getaffinity(None).unwrap();
    (0..rustix::thread::CpuSet::MAX_CPU)
        .find(|&c| set.is_set(c))
        .unwrap()
}

/// Voluntary context switches of this process's thread named `name` (0 if none).
fn switches_of(name: &str) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        total += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

#[test]
fn sequential_async_calls_leave_the_reaper_asleep() {
    let dir = TestDir::new("spin");
    let mut server = spawn_role("async_spin_child_entry", "server", dir.path(), "test.Spin");
    let mut out = BufReader::new(server.stdout.take().unwrap());
    wait_for_line(&mut out, "READY");
    // A spin budget no reply here needs to outlast, so that no call hands over to the
    // reaper for want of a reply.
    let client = Client::connect_with(
        "test.Spin",
        ClientConfig {
            wait: WaitPolicy {
                mode: WaitMode::Adaptive,
                spin: Duration::from_millis(200),
            },
            ..client_config(dir.path())
        },
    )
    .unwrap();
    // One CPU for this thread and the reaper it starts, as a pinned client would have: a
    // reaper woken there preempts the caller.
    rustix::thread::sched_setaffinity(None, &{
        let mut set = rustix::thread::CpuSet::new();
        set.set(first_cpu());
        set
    })
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    const CALLS: u64 = 2000;
    rt.block_on(async {
        // The first call starts the reaper.
        client
            .call_async("Echo", b"warm", &CallOptions::new())
            .await
            .unwrap();
        let before = switches_of("netless-reaper");
        let started = Instant::now();
        for i in 0..CALLS {
            let payload = i.to_le_bytes();
            let reply = client
                .call_async("Echo", &payload, &CallOptions::new())
                .await
                .unwrap();
            assert_eq!(reply.payload, payload);
        }
        let elapsed_ms = started.elapsed().as_millis() as u64;
        let woken = switches_of("netless-reaper") - before;
        // The reaper checks on a spinner at most once a millisecond on its own; woken for
        // calls it had nothing to do for, it switched hundreds of times here.
        assert!(
            woken <= elapsed_ms + 20,
            "the reaper was woken {woken} times for {CALLS} calls in {elapsed_ms} ms"
        );
    });
    sigkill(&server);
    server.wait().unwrap();
}
