//! Pipelined calls and request batching across real processes: many calls in flight from one
//! thread, replies matched by id in any order, batch size set live through the replica's
//! soft registers, and a server's death seen by a pipeline.

mod common;

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::process::Child;
use std::time::{Duration, Instant};

use common::*;
use netless::{control, CallOptions, Client, ClientConfig, Code, Pipeline, Server, ServerConfig};

/// Entry point of spawned peers (run only by them, via `--ignored`).
#[test]
#[ignore = "entry point of the peer processes the other tests spawn"]
fn pipeline_child_entry() {
    let Some((role, dir, service)) = role() else {
        return;
    };
    if role == "keeper" {
        return keeper(&dir, &service);
    }
    let _server = Server::bind(&service, server_config(&dir), test_handler).unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

/// A pipeline client for `kept_runs_are_reused_and_freed`: runs rounds of 4000 calls with 8
/// in flight, printing `ROUND` after each, on each `round` line of stdin; on `hold` it leaves
/// eight slow calls in flight and prints `HELD`; on end of input it exits (dropping the
/// pipeline).
fn keeper(dir: &std::path::Path, service: &str) {
    let config = ClientConfig {
        max_in_flight: 8,
        ..client_config(dir)
    };
    let mut pipe = Pipeline::connect(service, config).unwrap();
    for line in std::io::stdin().lines() {
        match line.unwrap().as_str() {
            "round" => {
                run_sized(&mut pipe, 4000, 8, 100);
                println!("ROUND");
            }
            "hold" => {
                let mut slow = 300u64.to_le_bytes().to_vec();
                slow.resize(100, 0);
                for _ in 0..8 {
                    pipe.submit("Slow", &slow).unwrap();
                }
                pipe.flush();
                println!("HELD");
            }
            other => panic!("unknown command {other}"),
        }
        std::io::stdout().flush().unwrap();
    }
}

/// Like `run`, with every payload `size` bytes.
fn run_sized(pipe: &mut Pipeline, calls: u32, window: u32, size: usize) {
    let (mut sent, mut done) = (0u32, 0u32);
    let deadline = Instant::now() + Duration::from_secs(60);
    while done < calls {
        assert!(Instant::now() < deadline, "stalled at {done}/{calls}");
        while sent < calls && pipe.in_flight() < window {
            let payload = vec![sent as u8; size];
            pipe.submit("Echo", &payload).unwrap();
            sent += 1;
        }
        let n = pipe
            .poll(|_, reply| assert_eq!(reply.unwrap().len(), size))
            .unwrap();
        if n == 0 {
            pipe.wait(Some(Duration::from_secs(5))).unwrap();
        }
        done += n as u32;
    }
}

fn start(dir: &TestDir, service: &str) -> Child {
    let mut child = spawn_role("pipeline_child_entry", "server", dir.path(), service);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    wait_for_line(&mut out, "READY");
    drain_in_background(out);
    child
}

fn set(client: &Client, line: &str) -> String {
    let reply = client
        .call(control::SET, line.as_bytes(), &CallOptions::new())
        .unwrap();
    String::from_utf8(reply.payload).unwrap()
}

/// Runs `calls` calls through `pipe` with up to `window` in flight, checking every reply
/// against what its call sent; returns the mean batch size of this run.
fn run(pipe: &mut Pipeline, calls: u32, window: u32) -> f64 {
    let (batches0, batched0) = pipe.batch_counts();
    // What each call should get: its payload back, or `None` for NOT_FOUND (`Fail`).
    let mut expected: HashMap<u64, Option<Vec<u8>>> = HashMap::new();
    let (mut sent, mut done) = (0u32, 0u32);
    let deadline = Instant::now() + Duration::from_secs(60);
    while done < calls {
        assert!(
            Instant::now() < deadline,
            "pipeline stalled at {done}/{calls}"
        );
        while sent < calls && pipe.in_flight() < window {
            let payload: Vec<u8> = (0..(sent % 300)).map(|i| (i ^ sent) as u8).collect();
            // Methods of different lengths, so a batch's compact requests start at every
            // 8-byte alignment; each runs twice in a row, so a request repeats the method
            // before it (sent without the name) as often as it changes it, and a reply
            // shows which method the server ran.
            let method = ["EchoRef", "Echo", "Echo", "Fail", "Fail"][sent as usize % 5];
            let id = pipe.submit(method, &payload).unwrap();
            expected.insert(id, (method != "Fail").then_some(payload));
            sent += 1;
        }
        let mut got = Vec::new();
        let n = pipe
            .poll(|id, reply| got.push((id, reply.map(<[u8]>::to_vec))))
            .unwrap();
        if n == 0 {
            pipe.wait(Some(Duration::from_secs(5))).unwrap();
        }
        for (id, reply) in got {
            match expected.remove(&id).expect("a reply to a call in flight") {
                Some(want) => assert_eq!(reply.unwrap(), want),
                None => assert_eq!(reply.unwrap_err().code(), netless::Code::NotFound),
            }
            done += 1;
        }
    }
    assert!(expected.is_empty());
    let (batches, batched) = pipe.batch_counts();
    (batched - batched0) as f64 / (batches - batches0).max(1) as f64
}

#[test]
fn pipelined_calls_are_matched_by_id_and_batched_as_the_registers_say() {
    let dir = TestDir::new("pipe");
    let mut server = start(&dir, "t.Pipe");
    let control = Client::connect_with("t.Pipe", client_config(dir.path())).unwrap();
    let config = ClientConfig {
        max_in_flight: 64,
        ..client_config(dir.path())
    };
    let mut pipe = Pipeline::connect("t.Pipe", config).unwrap();

    // Fixed batches of 8: every batch but the last of each window refill is full.
    assert!(set(&control, "batch_mode=fixed").contains("batch_mode=fixed"));
    set(&control, "batch=8");
    let before = control.replica_stats();
    let mean8 = run(&mut pipe, 4000, 64);
    let after8 = control.replica_stats();
    // No batching: one request per queue entry.
    let set_reply = set(&control, "batch=1");
    let mean1 = run(&mut pipe, 2000, 64);
    let after1 = control.replica_stats();
    eprintln!("mean batch: fixed 8 → {mean8:.2}, 1 → {mean1:.2}");
    assert!(mean8 > 4.0, "batch=8 gave batches of {mean8:.2}");
    assert_eq!(mean1, 1.0);
    // The server saw the same: entries per request before and after the change.
    let server_mean = |a: &netless::ReplicaStats, b: &netless::ReplicaStats| {
        (b.calls - a.calls) as f64 / (b.entries - a.entries) as f64
    };
    assert!(server_mean(&before, &after8) > 4.0);
    assert_eq!(server_mean(&after8, &after1), 1.0);
    // Every pipelined call counted once, plus the `set batch=1` call in between.
    assert_eq!(after1.calls - before.calls, 6000 + 1);
    // By status and bytes too (a batch's OK calls are counted together, before its replies
    // go out): `run` sends methods in fives, the last two of each `Fail` (NOT_FOUND), and
    // call `i` of a run carries `i % 300` bytes, which the others echo.
    let code = |stats: &netless::ReplicaStats, code: Code| {
        stats
            .by_code
            .iter()
            .find(|(c, _)| *c == code)
            .map_or(0, |(_, n)| *n)
    };
    let fails = (0..4000u64).chain(0..2000).filter(|i| i % 5 >= 3).count() as u64;
    assert_eq!(
        code(&after1, Code::NotFound) - code(&before, Code::NotFound),
        fails
    );
    assert_eq!(after1.errors - before.errors, fails);
    assert_eq!(
        code(&after1, Code::Ok) - code(&before, Code::Ok),
        6000 + 1 - fails
    );
    let payloads = |keep: fn(u64) -> bool| -> u64 {
        (0..4000u64)
            .chain(0..2000)
            .filter(|i| keep(*i))
            .map(|i| i % 300)
            .sum()
    };
    let echoed = payloads(|i| i % 5 < 3);
    assert_eq!(
        after1.bytes_out - before.bytes_out,
        echoed + set_reply.len() as u64
    );
    // Requests: every payload, and method names unless a compact request repeats them.
    let bytes_in = after1.bytes_in - before.bytes_in;
    let sent = payloads(|_| true);
    assert!(
        (sent..sent + 7 * 6000 + 100).contains(&bytes_in),
        "{bytes_in} request bytes counted for {sent} payload bytes"
    );

    // Adaptive: whatever the load, every call is answered. One call at a time finds the
    // server idle and goes alone (no batching latency); a deep window batches.
    set(&control, "batch_mode=adaptive");
    set(&control, "batch=32");
    let alone = run(&mut pipe, 200, 1);
    let adaptive = run(&mut pipe, 3000, 64);
    eprintln!("adaptive mean batch: window 1 → {alone:.2}, window 64 → {adaptive:.2}");
    assert_eq!(alone, 1.0);
    assert!(
        (1.5..=32.0).contains(&adaptive),
        "adaptive batches of {adaptive:.2} with 64 in flight"
    );

    // A request too large for one run is refused with a clear error, not a hang.
    let big = vec![0u8; 200_000];
    let e = pipe.submit("Echo", &big).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");

    // The server dies: the pipeline reports UNAVAILABLE promptly.
    for _ in 0..10 {
        pipe.submit("Slow", &200u64.to_le_bytes()).unwrap();
    }
    pipe.flush();
    sigkill(&server);
    server.wait().unwrap();
    let start = Instant::now();
    let err = loop {
        assert!(start.elapsed() < Duration::from_secs(5), "death not seen");
        match pipe.poll(|_, _| {}) {
            Err(e) => break e,
            Ok(_) => {
                let _ = pipe.wait(Some(Duration::from_millis(50)));
            }
        }
    };
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(pipe.submit("Echo", b"x").is_err());
}

/// Calls whose request or reply does not fit a compact header's fields (a method name of 256
/// bytes or more, a body of 64 KiB or more) still batch: the request opens a batch of its own
/// with a short or (a name of 64 KiB or more) full header, the reply goes as a record of its
/// own; and call ids stay right after a slot's 16-bit generation wraps.
#[test]
fn calls_too_large_for_compact_headers_and_wrapped_generations() {
    let dir = TestDir::new("pipewide");
    // Blocks of 4 KiB, so that a batch's run (64 blocks) holds more than 64 KiB and the
    // compact header's 16-bit body length, not the run, is what sends the 66 000-byte
    // request to a batch of its own.
    let config = netless::ServerConfig {
        block_size: 4096,
        buffer_bytes: Some(8 << 20),
        ..server_config(dir.path())
    };
    let server = Server::bind("t.Wide", config, test_handler).unwrap();
    let control = Client::connect_with("t.Wide", client_config(dir.path())).unwrap();
    set(&control, "batch_mode=fixed");
    set(&control, "batch=8");
    // A ring whose records may exceed 128 KiB, so that the 64 KiB field, not half a record,
    // is what keeps a 70 000-byte reply out of a reply batch.
    let config = ClientConfig {
        max_in_flight: 64,
        ring_bytes: 1 << 20,
        ..client_config(dir.path())
    };
    let mut pipe = Pipeline::connect("t.Wide", config).unwrap();
    let long_name = "N".repeat(300);
    // Too long for a short header's 16-bit method length as well.
    let huge_name = "H".repeat(70_000);
    let big_request = vec![7u8; 66_000];
    let big_reply = 70_000u64.to_le_bytes();
    // What each call should get back: its reply's length, or UNIMPLEMENTED naming its method.
    let mut expected: HashMap<u64, Result<usize, &str>> = HashMap::new();
    for round in 0..8 {
        // The first big request opens a run with room for more like it, so the second
        // would fit there as a compact request if its length were not checked.
        let calls: [(&str, &[u8], Result<usize, &str>); 7] = [
            ("Echo", &big_request, Ok(big_request.len())),
            ("Echo", &big_request, Ok(big_request.len())),
            ("Echo", b"after a big request", Ok(19)),
            (&long_name, b"x", Err(&long_name)),
            ("Big", &big_reply, Ok(70_000)),
            (&huge_name, b"y", Err(&huge_name)),
            ("Echo", b"last", Ok(4)),
        ];
        for (method, payload, want) in calls {
            let id = pipe
                .submit(method, payload)
                .unwrap_or_else(|e| panic!("round {round}: {method:.8}: {e}"));
            assert!(id < 1 << 32, "call id {id:#x} does not fit 32 bits");
            expected.insert(id, want);
        }
        pipe.flush();
        let deadline = Instant::now() + Duration::from_secs(30);
        while pipe.in_flight() > 0 {
            assert!(Instant::now() < deadline, "round {round} stalled");
            let n = pipe
                .poll(
                    |id, reply| match expected.remove(&id).expect("a call in flight") {
                        Ok(len) => assert_eq!(reply.unwrap().len(), len),
                        Err(name) => {
                            // The server read the whole name (the reply quotes it).
                            let e = reply.unwrap_err();
                            assert_eq!(e.code(), Code::Unimplemented);
                            assert!(e.message().contains(name), "{:.80}", e.message());
                        }
                    },
                )
                .unwrap();
            if n == 0 {
                pipe.wait(Some(Duration::from_secs(5))).unwrap();
            }
        }
    }
    assert!(expected.is_empty());
    // The same name through a unary call, which takes a short header when it can.
    let e = control
        .call(&huge_name, b"z", &CallOptions::new())
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    assert!(e.message().contains(&huge_name), "{:.80}", e.message());

    // One slot, 70 000 calls in turn: its generation wraps past 16 bits.
    let config = ClientConfig {
        max_in_flight: 1,
        ..client_config(dir.path())
    };
    let mut one = Pipeline::connect("t.Wide", config).unwrap();
    set(&control, "batch=1");
    let mut last = None;
    for i in 0..70_000u32 {
        let id = one.submit("Echo", &i.to_le_bytes()).unwrap();
        assert_eq!(Pipeline::slot(id), 0);
        assert_ne!(Some(id), last, "call {i} reused the id before it");
        last = Some(id);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let n = one
                .poll(|got, reply| {
                    assert_eq!(got, id);
                    assert_eq!(reply.unwrap(), i.to_le_bytes());
                })
                .unwrap();
            if n == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "call {i} unanswered");
            one.wait(Some(Duration::from_secs(5))).unwrap();
        }
    }
    drop(server);
}

#[test]
fn a_full_pipeline_says_so() {
    let dir = TestDir::new("pipefull");
    let mut server = start(&dir, "t.Full");
    let config = ClientConfig {
        max_in_flight: 4,
        ..client_config(dir.path())
    };
    let mut pipe = Pipeline::connect("t.Full", config).unwrap();
    for _ in 0..4 {
        pipe.submit("Slow", &20u64.to_le_bytes()).unwrap();
    }
    let e = pipe.submit("Echo", b"x").unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(e.message().contains("poll"), "{e}");
    let mut n = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while n < 4 {
        assert!(Instant::now() < deadline);
        pipe.wait(Some(Duration::from_secs(1))).unwrap();
        n += pipe.poll(|_, r| assert!(r.is_ok())).unwrap();
    }
    assert_eq!(pipe.in_flight(), 0);
    drop(server.stdin.take());
    server.wait().unwrap();
}

/// A kept run is the pipeline's only while the block table says so (memory the server
/// writes): a faulty server hands the last block of one to another connection. A lone
/// request, which writes only the run's first block, may still use it; a batch, which may
/// grow to fill the whole run, must not, and the stolen block is never written.
#[test]
fn a_kept_run_no_longer_wholly_ours_is_not_filled() {
    let dir = TestDir::new("stolen");
    let _server = Server::bind("t.Stolen", server_config(dir.path()), test_handler).unwrap();
    let control = Client::connect_with("t.Stolen", client_config(dir.path())).unwrap();
    set(&control, "batch_mode=fixed");
    set(&control, "batch=8");
    let config = ClientConfig {
        max_in_flight: 8,
        ..client_config(dir.path())
    };
    let mut pipe = Pipeline::connect("t.Stolen", config).unwrap();
    // Sends one request per payload (as one batch, when the registers say so) and checks
    // every echo.
    let echo_all = |pipe: &mut Pipeline, payloads: &[Vec<u8>]| {
        let mut expected = HashMap::new();
        for p in payloads {
            expected.insert(pipe.submit("Echo", p).unwrap(), p.clone());
        }
        pipe.flush();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !expected.is_empty() {
            assert!(
                Instant::now() < deadline,
                "{} calls unanswered",
                expected.len()
            );
            pipe.wait(Some(Duration::from_secs(1))).unwrap();
            pipe.poll(|id, reply| {
                assert_eq!(
                    reply.unwrap(),
                    expected.remove(&id).expect("a call in flight")
                );
            })
            .unwrap();
        }
    };
    // A batch of 8 echoes of 100 bytes: a run of 15 blocks (136 + 7 × 112 = 920 bytes),
    // kept, idle once answered.
    echo_all(&mut pipe, &vec![vec![1u8; 100]; 8]);
    let stolen = netless::fault::steal_kept_tail(&pipe).expect("a kept run of the batch");
    // Lone requests of 20 bytes take the run's first block, still ours.
    set(&control, "batch=1");
    for i in 0..4u8 {
        echo_all(&mut pipe, &[vec![i; 20]]);
    }
    // A batch whose first request (20 bytes) asks for room for 8 like it (280 bytes, 5
    // blocks) and whose others (120 bytes each) then fill 952 bytes: in the old run that
    // reaches its 15th block, the stolen one.
    set(&control, "batch=8");
    let mut batch = vec![vec![2u8; 20]];
    batch.extend((0..7u8).map(|i| vec![i; 120]));
    echo_all(&mut pipe, &batch);
    assert!(
        netless::fault::canary_intact(&pipe, stolen),
        "the pipeline wrote block {stolen}, which the table gave to another connection"
    );
}

/// A whole call without metadata, deadline or SLO takes the 32-byte short header: a `Slow`
/// call's 12-byte body then fits one 64-byte block, where with a full header (as a call with
/// a deadline still takes) it needs two; and a lone pipelined 20-byte echo keeps a run of one
/// block, not two.
#[test]
fn plain_calls_take_the_short_header() {
    let dir = TestDir::new("short");
    let server = Server::bind("t.Short", server_config(dir.path()), test_handler).unwrap();
    let total = server.stats().total_blocks;
    let held = || total - server.stats().free_blocks;
    for (options, blocks) in [
        (CallOptions::new(), 1),
        (CallOptions::new().timeout(Duration::from_secs(60)), 2),
    ] {
        // While the handler sleeps, the client holds the request's run and a spare run like
        // it (claimed during the wait for the next call), nothing else.
        let client = Client::connect_with("t.Short", client_config(dir.path())).unwrap();
        let call = std::thread::spawn(move || {
            client
                .call("Slow", &400u64.to_le_bytes(), &options)
                .map(|r| r.payload)
        });
        let mut most = 0;
        while !call.is_finished() {
            most = most.max(held());
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(call.join().unwrap().unwrap(), 400u64.to_le_bytes());
        assert_eq!(
            most,
            2 * blocks,
            "blocks held during a call taking {blocks}"
        );
        wait_all_free(&server, total);
    }
    let config = ClientConfig {
        max_in_flight: 1,
        ..client_config(dir.path())
    };
    let mut pipe = Pipeline::connect("t.Short", config).unwrap();
    let id = pipe.submit("Echo", &[5u8; 20]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = None;
    while got.is_none() {
        assert!(Instant::now() < deadline, "no reply");
        pipe.wait(Some(Duration::from_secs(1))).unwrap();
        pipe.poll(|i, reply| got = Some((i, reply.unwrap().to_vec())))
            .unwrap();
    }
    assert_eq!(got, Some((id, vec![5u8; 20])));
    // The run stays OWNED by the pipeline, for its next batch.
    assert_eq!(held(), 1);
}

/// A pipeline keeps the runs its batches used (`KEEP_BLOCKS`): the server leaves them OWNED,
/// later batches reuse them instead of claiming more, and they are all free again when the
/// pipeline closes or its process is killed.
#[test]
fn kept_runs_are_reused_and_freed() {
    let dir = TestDir::new("keep");
    let server = Server::bind("t.Keep", server_config(dir.path()), test_handler).unwrap();
    let total = server.stats().total_blocks;
    let control = Client::connect_with("t.Keep", client_config(dir.path())).unwrap();
    set(&control, "batch_mode=fixed");
    set(&control, "batch=8");
    // (Its own spare run would count as held.)
    drop(control);
    // A batch of 8 requests of 100 bytes ("Echo"): a 32-byte short header and 7 compact
    // (8-byte) ones repeating the method, each padded to 8 bytes: 136 + 7 × 112 bytes, 15
    // blocks.
    let run_blocks = (136 + 7 * 112u32).div_ceil(64);
    let held = || total - server.stats().free_blocks;

    let mut child = spawn_role("pipeline_child_entry", "keeper", dir.path(), "t.Keep");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    for round in 0..2 {
        writeln!(stdin, "round").unwrap();
        wait_for_line(&mut out, "ROUND");
        // Idle now, yet still holding its runs; with 8 calls in flight at most it never
        // needs more than 8 of them. (Without reuse, 500 batches a round would have piled
        // up to the pipeline's budget: a quarter of the buffer per sharer.)
        let h = held();
        assert!(h > 0, "round {round}: no run kept");
        assert!(
            h <= 8 * run_blocks,
            "round {round}: {h} blocks held, more than 8 runs of {run_blocks}"
        );
    }
    // A clean close gives every block back.
    drop(stdin);
    assert!(child.wait().unwrap().success());
    wait_all_free(&server, total);

    // Killed with calls in flight in its kept runs: the server reclaims them.
    let mut child = spawn_role("pipeline_child_entry", "keeper", dir.path(), "t.Keep");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "round").unwrap();
    wait_for_line(&mut out, "ROUND");
    writeln!(stdin, "hold").unwrap();
    wait_for_line(&mut out, "HELD");
    assert!(held() > 0);
    sigkill(&child);
    child.wait().unwrap();
    wait_all_free(&server, total);
    // The server serves on.
    let client = Client::connect_with("t.Keep", client_config(dir.path())).unwrap();
    let reply = client.call("Echo", b"after", &CallOptions::new()).unwrap();
    assert_eq!(reply.payload, b"after");
    drop(client);

    // Under an SLO the buffer is sized for what the SLO admits: no run is kept.
    let config = netless::ServerConfig {
        slo: Some(netless::Slo {
            target: Duration::from_millis(2),
            mean_service: Some(Duration::from_micros(20)),
            mean_request_bytes: 128,
        }),
        ..server_config(dir.path())
    };
    let slo_server = Server::bind("t.KeepSlo", config, test_handler).unwrap();
    let control = Client::connect_with("t.KeepSlo", client_config(dir.path())).unwrap();
    set(&control, "batch_mode=fixed");
    set(&control, "batch=8");
    drop(control);
    let total = slo_server.stats().total_blocks;
    let mut child = spawn_role("pipeline_child_entry", "keeper", dir.path(), "t.KeepSlo");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "round").unwrap();
    wait_for_line(&mut out, "ROUND");
    wait_all_free(&slo_server, total);
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

/// Waits (up to 5 s) until every block of the server's buffer is free.
fn wait_all_free(server: &Server, total: u32) {
    let start = Instant::now();
    loop {
        let stats = server.stats();
        if stats.free_blocks == total {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "blocks not freed: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// At B = 1 a worker serves runs of lone requests in one go while they come from one
/// connection and call one method (`serve_lone_run`); two pipelines interleaving in one
/// queue, each changing methods and failing some calls, must still get each reply right, and
/// the stats must count every call and entry once.
#[test]
fn lone_requests_of_two_connections_and_methods_interleave() {
    let dir = TestDir::new("lone");
    let config = ServerConfig {
        workers: 1,
        ..server_config(dir.path())
    };
    let _server = Server::bind("t.Lone", config, test_handler).unwrap();
    let control = Client::connect_with("t.Lone", client_config(dir.path())).unwrap();
    assert!(set(&control, "batch_mode=fixed").contains("batch_mode=fixed"));
    set(&control, "batch=1");
    let before = control.replica_stats();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let config = ClientConfig {
                max_in_flight: 64,
                ..client_config(dir.path())
            };
            std::thread::spawn(move || {
                let mut pipe = Pipeline::connect("t.Lone", config).unwrap();
                run(&mut pipe, 3000, 64)
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 1.0);
    }
    let after = control.replica_stats();
    assert_eq!(after.calls - before.calls, 6000);
    assert_eq!(after.entries - before.entries, 6000);
    let fails = 2 * (0..3000u64).filter(|i| i % 5 >= 3).count() as u64;
    assert_eq!(after.errors - before.errors, fails);
}
