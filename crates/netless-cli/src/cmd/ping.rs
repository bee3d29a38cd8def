//! `netless ping`: calls a service like ping(8) and summarises round-trip times and failures.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use netless::{CallOptions, Client, Code};

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
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut failures: BTreeMap<Code, u64> = BTreeMap::new();
    let mut times_us: Vec<f64> = Vec::new();
    println!(
        "PING {} ({} bytes of payload) over netless",
        args.service, args.payload
    );
    let client = match Client::connect(&args.service) {
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
    let failed: u64 = failures.values().sum();
    println!();
    println!("--- {} netless ping statistics ---", args.service);
    println!(
        "{} calls, {} ok, {} failed",
        args.count,
        times_us.len(),
        failed
    );
    if !times_us.is_empty() {
        let mut sorted = times_us.clone();
        sorted.sort_by(f64::total_cmp);
        let pct = |p: f64| sorted[((sorted.len() - 1) as f64 * p).round() as usize];
        let avg = sorted.iter().sum::<f64>() / sorted.len() as f64;
        println!(
            "rtt min/avg/p50/p99/max = {:.2}/{:.2}/{:.2}/{:.2}/{:.2} µs",
            sorted[0],
            avg,
            pct(0.50),
            pct(0.99),
            sorted[sorted.len() - 1]
        );
    }
    if failed > 0 {
        let by_code: Vec<String> = failures.iter().map(|(c, n)| format!("{c} {n}")).collect();
        println!("failures by status: {}", by_code.join(", "));
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
