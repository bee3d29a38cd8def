//! Under an SLO, a worker refuses without running the requests that waited in its queue too
//! long to finish within the SLO (a stall of the worker made them late), as long as others
//! wait behind them; across real processes: the server runs in the test process (so the test
//! counts what its handler ran), the calls come from a spawned client process.

mod common;

use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use netless::{
    CallOptions, Client, ClientConfig, Code, Pipeline, Request, ResponseBuilder, RetryPolicy,
    Server, ServerConfig, Slo, Status,
};

/// How long the first call holds the only worker: long enough for the client to queue the
/// others behind it on a loaded machine.
const STALL: Duration = Duration::from_secs(1);
/// Calls queued behind it.
const QUEUED: usize = 10;
/// Pipelined calls queued behind those, each a queue entry of its own.
const PIPELINED: usize = 3;

/// `Work` calls the handler ran.
static WORKED: AtomicU64 = AtomicU64::new(0);
/// The file the `Stall` handler creates once it holds the worker (the client waits for it).
static STALLING: OnceLock<PathBuf> = OnceLock::new();

fn stalling_marker(dir: &Path) -> PathBuf {
    dir.join("stalling")
}

fn handler<'a>(req: &Request<'a>, resp: &mut ResponseBuilder<'a>) -> Result<(), netless::Status> {
    match req.method {
        "Stall" => {
            std::fs::write(STALLING.get().expect("marker path set"), b"").unwrap();
            thread::sleep(STALL)
        }
        _ => {
            WORKED.fetch_add(1, Ordering::Relaxed);
        }
    }
    resp.payload.extend_from_slice(req.payload);
    Ok(())
}

/// Entry point of spawned peers (run only by them, via `--ignored`).
#[test]
#[ignore = "entry point of the peer processes the other tests spawn"]
fn shedding_child_entry() {
    let Some((role, dir, service)) = role() else {
        return;
    };
    if role != "burst" {
        return;
    }
    let client = Client::connect_with(&service, client_config(&dir)).unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    // One call holds the worker; the others queue behind it meanwhile, each from its own
    // thread (blocking calls, so that each is a queue entry of its own).
    let stall = {
        let client = client.clone();
        thread::spawn(move || client.call("Stall", b"s", &CallOptions::new()))
    };
    let marker = stalling_marker(&dir);
    let waited = Instant::now();
    while !marker.exists() {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "Stall never started"
        );
        thread::sleep(Duration::from_millis(1));
    }
    // First in the queue, a call from a client that retries NACKs: refused like the others
    // when the stall ends (others wait behind it), then retried after its backoff, and served.
    let retrying = {
        let config = ClientConfig {
            retry: RetryPolicy::Backoff {
                attempts: 3,
                initial: Duration::from_millis(100),
                max: Duration::from_millis(100),
            },
            ..client_config(&dir)
        };
        let client = Client::connect_with(&service, config).unwrap();
        thread::spawn(move || client.call("Work", b"r", &CallOptions::new()))
    };
    thread::sleep(Duration::from_millis(200));
    let queued: Vec<_> = (0..QUEUED)
        .map(|_| {
            let client = client.clone();
            thread::spawn(move || {
                let t0 = Instant::now();
                let r = client.call("Work", b"w", &CallOptions::new());
                (r, t0.elapsed())
            })
        })
        .collect();
    // Then pipelined calls, each published alone: their entries carry the stamp too.
    thread::sleep(Duration::from_millis(100));
    let mut pipe = Pipeline::connect(&service, client_config(&dir)).unwrap();
    for _ in 0..PIPELINED {
        pipe.submit("Work", b"p").unwrap();
        pipe.flush();
    }
    let shed_by_worker = |s: &Status| {
        s.code() == Code::ResourceExhausted
            && s.is_nack()
            && s.is_refused_by_worker()
            && s.message().contains("SLO")
    };
    assert!(stall.join().unwrap().is_ok());
    let retried_ok = retrying.join().unwrap().is_ok();
    let (mut ok, mut shed, mut other, mut slowest_refusal) = (0, 0, 0, Duration::ZERO);
    for t in queued {
        match t.join().unwrap() {
            (Ok(_), _) => ok += 1,
            (Err(s), took) if shed_by_worker(&s) => {
                shed += 1;
                slowest_refusal = slowest_refusal.max(took);
            }
            (Err(s), _) => {
                eprintln!("unexpected: {s}");
                other += 1;
            }
        }
    }
    let (mut pipe_ok, mut pipe_shed) = (0, 0);
    let waited = Instant::now();
    while pipe.in_flight() > 0 {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "pipeline stalled"
        );
        pipe.wait(Some(Duration::from_millis(100))).unwrap();
        pipe.poll(|_, reply| match reply {
            Ok(_) => pipe_ok += 1,
            Err(s) if shed_by_worker(&s) => pipe_shed += 1,
            Err(s) => {
                eprintln!("unexpected: {s}");
                other += 1;
            }
        })
        .unwrap();
    }
    // Afterwards, with nothing queued, calls are served again.
    let after = client.call("Work", b"a", &CallOptions::new()).is_ok();
    println!(
        "RESULT ok={ok} shed={shed} pipe_ok={pipe_ok} pipe_shed={pipe_shed} other={other} slowest_refusal_ms={} after_ok={} retried_ok={}",
        slowest_refusal.as_millis(),
        u8::from(after),
        u8::from(retried_ok)
    );
    std::io::stdout().flush().unwrap();
}

#[test]
fn requests_that_waited_past_the_slo_are_refused_without_running() {
    let dir = TestDir::new("shed");
    // 50 ms objective, 1 ms declared service: the depth limit (48) admits all the calls,
    // and a request that waited more than 48 ms when the worker reaches it would be late.
    let slo = Slo::new(Duration::from_millis(50)).mean_service(Duration::from_millis(1));
    let config = ServerConfig {
        workers: 1,
        slo: Some(slo),
        ..server_config(dir.path())
    };
    STALLING.set(stalling_marker(dir.path())).unwrap();
    let server = Server::bind("t.Shed", config, handler).unwrap();
    assert!(server.stats().depth_limit as usize > QUEUED);
    let mut child = spawn_role("shedding_child_entry", "burst", dir.path(), "t.Shed");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    wait_for_line(&mut out, "READY");
    let line = read_result(&mut out, Duration::from_secs(60));
    assert!(child.wait().unwrap().success());
    let stats = server.stats();
    let summary = format!("{} | {stats:?}", line.trim());
    eprintln!("{summary}");
    // Every queued call but the last was refused (the last had no one behind it: refusing
    // it would help no one, so it ran, late); the handler ran only what was answered. The
    // pipelined calls queued last, so all but one of them at least were refused.
    assert_eq!(field(&line, "other"), 0, "{summary}");
    let (shed, pipe_shed) = (field(&line, "shed"), field(&line, "pipe_shed"));
    assert_eq!(
        shed + pipe_shed,
        (QUEUED + PIPELINED) as u64 - 1,
        "{summary}"
    );
    assert!(pipe_shed >= PIPELINED as u64 - 1, "{summary}");
    assert_eq!(field(&line, "ok") + field(&line, "pipe_ok"), 1, "{summary}");
    assert_eq!(field(&line, "after_ok"), 1, "{summary}");
    // The retrying client's call was refused once (it was first in the queue) and then
    // served on its retry: Client::call retries a worker's refusal under its policy.
    assert_eq!(field(&line, "retried_ok"), 1, "{summary}");
    assert_eq!(stats.shed, (QUEUED + PIPELINED) as u64, "{summary}");
    assert_eq!(WORKED.load(Ordering::Relaxed), 3, "{summary}");
    // The refused calls failed as soon as the worker reached them, not after being run.
    let slowest = Duration::from_millis(field(&line, "slowest_refusal_ms"));
    assert!(slowest < STALL + Duration::from_secs(10), "{summary}");
}
