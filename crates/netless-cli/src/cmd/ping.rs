//! `netless ping`: calls a service like ping(8) and summarises round-trip times and failures.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use netless::{CallOptions, Client, ClientConfig, Code};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Service to call.
    pub service: String,
    /// Number of calls.
    #[arg(long, short = 'c', default_value_t = 10)]
    pub count: u64,
    /// Request payload size in bytes.
    #[arg(long, short = 's', default_value_t = 64)]
    pub payload: usize,
    /// Per-call deadline in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub deadline_ms: u64,
    /// Pause between calls in milliseconds.
    #[arg(long, short = 'i', default_value_t = 100)]
    pub interval_ms: u64,
    /// Method to call.
    #[arg(long, default_value = "Echo")]
    pub method: String,
    /// Calls kept in flight at once on one pipelined connection (batched as the service's
    /// registers say). Above 1, ping is a closed-loop load: no pause, no line per call, the
    /// rate at the end.
    #[arg(long, short = 'w', default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub window: u32,
    /// Find the service in a memory fabric instead of the socket directory.
    #[command(flatten)]
    pub fabric: super::fabric::JoinArgs,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.window > 1 {
        return run_window(&args);
    }
    let mut failures: BTreeMap<Code, u64> = BTreeMap::new();
    let mut times_us: Vec<f64> = Vec::new();
    println!(
        "PING {} ({} bytes of payload) over netless",
        args.service, args.payload
    );
    let connected = args.fabric.join().and_then(|fabric| {
        let config = ClientConfig {
            fabric,
            ..ClientConfig::default()
        };
        Client::connect_with(&args.service, config)
    });
    let client = match connected {
        Ok(c) => Some(c),
        Err(status) => {
            println!("connect: {status}");
            None
        }
    };
    let payload: Vec<u8> = (0..args.payload).map(|i| i as u8).collect();
    let mut out = Vec::new();
    for seq in 0..args.count {
        if seq > 0 && args.interval_ms > 0 {
            std::thread::sleep(Duration::from_millis(args.interval_ms));
        }
        let Some(client) = &client else {
            *failures.entry(Code::Unavailable).or_default() += 1;
            continue;
        };
        let options = CallOptions::new().timeout(Duration::from_millis(args.deadline_ms));
        let start = Instant::now();
        let result = client.call_into(&args.method, &payload, &options, &mut out);
        let us = start.elapsed().as_secs_f64() * 1e6;
        match result {
            Ok(_) if out == payload => {
                times_us.push(us);
                println!(
                    "{} bytes from {}: seq={seq} time={us:.2} µs",
                    out.len(),
                    args.service
                );
            }
            Ok(_) => {
                *failures.entry(Code::DataLoss).or_default() += 1;
                println!(
                    "seq={seq}: reply differs from the request ({} bytes)",
                    out.len()
                );
            }
            Err(status) => {
                *failures.entry(status.code()).or_default() += 1;
                println!("seq={seq}: {status}");
            }
        }
    }
    let rtt = (!times_us.is_empty()).then(|| {
        let mut sorted = times_us.clone();
        sorted.sort_by(f64::total_cmp);
        let pct = |p: f64| sorted[((sorted.len() - 1) as f64 * p).round() as usize];
        let avg = sorted.iter().sum::<f64>() / sorted.len() as f64;
        format!(
            "rtt min/avg/p50/p99/max = {:.2}/{:.2}/{:.2}/{:.2}/{:.2} µs",
            sorted[0],
            avg,
            pct(0.50),
            pct(0.99),
            sorted[sorted.len() - 1]
        )
    });
    Ok(summarise(&args, times_us.len() as u64, &failures, rtt))
}

/// Prints ping's statistics (`detail` after the counts) and gives its exit status: 1 if any
/// call failed.
fn summarise(
    args: &Args,
    ok: u64,
    failures: &BTreeMap<Code, u64>,
    detail: Option<String>,
) -> ExitCode {
    let failed: u64 = failures.values().sum();
    println!();
    println!("--- {} netless ping statistics ---", args.service);
    println!("{} calls, {ok} ok, {failed} failed", args.count);
    if let Some(detail) = detail {
        println!("{detail}");
    }
    if failed > 0 {
        let by_code: Vec<String> = failures.iter().map(|(c, n)| format!("{c} {n}")).collect();
        println!("failures by status: {}", by_code.join(", "));
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// `--window N`: `count` calls through a `Pipeline`, up to `window` in flight. A reply must
/// echo the payload; `deadline_ms` bounds the wait for any one reply.
fn run_window(args: &Args) -> anyhow::Result<ExitCode> {
    println!(
        "PING {} ({} bytes of payload, {} in flight) over netless",
        args.service, args.payload, args.window
    );
    let payload: Vec<u8> = (0..args.payload).map(|i| i as u8).collect();
    let mut failures: BTreeMap<Code, u64> = BTreeMap::new();
    let (mut sent, mut answered, mut ok) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let connected = args.fabric.join().and_then(|fabric| {
        let config = ClientConfig {
            max_in_flight: args.window,
            fabric,
            ..ClientConfig::default()
        };
        netless::Pipeline::connect(&args.service, config)
    });
    let mut pipe = match connected {
        Ok(pipe) => pipe,
        // A software-coherent fabric serves no Pipeline: `window` calls at once from as
        // many threads on one connection instead.
        Err(status) if status.code() == Code::Unimplemented && args.fabric.fabric.is_some() => {
            return run_window_threads(args, &payload, start);
        }
        Err(status) => {
            println!("connect: {status}");
            failures.insert(status.code(), args.count);
            return summarise_window(args, ok, &failures, start);
        }
    };
    let patience = Duration::from_millis(args.deadline_ms);
    let mut last_reply = Instant::now();
    while answered < args.count {
        while sent < args.count && pipe.in_flight() < args.window {
            sent += 1;
            if let Err(status) = pipe.submit(&args.method, &payload) {
                *failures.entry(status.code()).or_default() += 1;
                answered += 1;
                // A NACK: collect replies before sending more.
                break;
            }
        }
        let polled = pipe.poll(|_, reply| match reply {
            Ok(bytes) if bytes == payload.as_slice() => ok += 1,
            Ok(_) => *failures.entry(Code::DataLoss).or_default() += 1,
            Err(status) => *failures.entry(status.code()).or_default() += 1,
        });
        let lost = match polled {
            Ok(0) if pipe.in_flight() == 0 => None,
            Ok(0) => match patience.checked_sub(last_reply.elapsed()) {
                Some(left) => pipe.wait(Some(left)).err(),
                None => Some(netless::Status::deadline_exceeded(format!(
                    "no reply from `{}` within --deadline-ms {}: giving up the {} calls in flight",
                    args.service,
                    args.deadline_ms,
                    pipe.in_flight()
                ))),
            },
            Ok(n) => {
                answered += n as u64;
                last_reply = Instant::now();
                None
            }
            Err(status) => Some(status),
        };
        if let Some(status) = lost {
            println!("{status}");
            let left = args.count - ok - failures.values().sum::<u64>();
            *failures.entry(status.code()).or_default() += left;
            break;
        }
    }
    summarise_window(args, ok, &failures, start)
}

/// `--window N` where no `Pipeline` is served: `count` calls from `window` threads sharing
/// one connection, each call waiting for its own reply.
fn run_window_threads(args: &Args, payload: &[u8], start: Instant) -> anyhow::Result<ExitCode> {
    println!(
        "(a software-coherent fabric: {} threads calling at once)",
        args.window
    );
    let failures: std::sync::Mutex<BTreeMap<Code, u64>> = Default::default();
    let ok = std::sync::atomic::AtomicU64::new(0);
    let connected = args.fabric.join().and_then(|fabric| {
        netless::Client::connect_with(
            &args.service,
            ClientConfig {
                fabric,
                ..ClientConfig::default()
            },
        )
    });
    let client = match connected {
        Ok(client) => client,
        Err(status) => {
            println!("connect: {status}");
            let failed = BTreeMap::from([(status.code(), args.count)]);
            return summarise_window(args, 0, &failed, start);
        }
    };
    let next = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..args.window {
            scope.spawn(|| {
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < args.count {
                    let options = netless::CallOptions::new()
                        .timeout(Duration::from_millis(args.deadline_ms));
                    let code = match client.call(&args.method, payload, &options) {
                        Ok(reply) if reply.payload == payload => {
                            ok.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            continue;
                        }
                        Ok(_) => Code::DataLoss,
                        Err(status) => status.code(),
                    };
                    *failures
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .entry(code)
                        .or_default() += 1;
                }
            });
        }
    });
    let failures = failures
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    summarise_window(args, ok.into_inner(), &failures, start)
}

/// The statistics of a `--window` run, with its rate.
fn summarise_window(
    args: &Args,
    ok: u64,
    failures: &BTreeMap<Code, u64>,
    start: Instant,
) -> anyhow::Result<ExitCode> {
    let elapsed = start.elapsed().as_secs_f64();
    let rate = format!(
        "{:.3} Mcalls/s over {:.3} s ({} in flight)",
        ok as f64 / elapsed / 1e6,
        elapsed,
        args.window
    );
    Ok(summarise(args, ok, failures, Some(rate)))
}
