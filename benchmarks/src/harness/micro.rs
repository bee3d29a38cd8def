//! The loop of the `cargo bench` targets, micro-benchmarks of single-process data structures
//! ([`Micro`]): it calibrates a batch of calls to a millisecond or so, times batches, and
//! prints the median and the least time per operation. It never checks what it times; the
//! targets assert their results once before timing.
//!
//! `cargo bench` passes `--bench`: then each benchmark runs for about half a second. Without
//! it (`cargo test --benches`, `cargo test --all-targets`) each runs a few batches only, as a
//! smoke test. A positional argument keeps only the benchmarks whose name contains it.

use std::time::{Duration, Instant};

/// Batches timed per benchmark under `cargo bench`.
const BATCHES: usize = 31;
/// How long a batch should take at least, so that the clock's cost and resolution vanish.
const BATCH_TIME: Duration = Duration::from_millis(10);

/// A run of micro-benchmarks, configured from the command line.
#[derive(Debug)]
pub struct Micro {
    full: bool,
    filter: Option<String>,
}

impl Micro {
    /// Reads `--bench` and an optional name filter from the command line.
    pub fn from_args() -> Micro {
        let mut full = false;
        let mut filter = None;
        for arg in std::env::args().skip(1) {
            if arg == "--bench" {
                full = true;
            } else if !arg.starts_with('-') {
                filter = Some(arg);
            }
        }
        Micro { full, filter }
    }

    /// Times `call`, which does `ops` operations each time, and prints
    /// `name  median ns/op  least ns/op`.
    pub fn run(&self, name: &str, ops: u64, mut call: impl FnMut()) {
        if self.filter.as_deref().is_some_and(|f| !name.contains(f)) {
            return;
        }
        let (batches, batch_time) = if self.full {
            (BATCHES, BATCH_TIME)
        } else {
            (3, Duration::from_micros(100))
        };
        // Calibrate (this also warms caches and branch predictors).
        let mut calls: u64 = 1;
        loop {
            let started = Instant::now();
            for _ in 0..calls {
                call();
            }
            if started.elapsed() >= batch_time || calls >= 1 << 30 {
                break;
            }
            calls *= 2;
        }
        let mut per_op: Vec<f64> = (0..batches)
            .map(|_| {
                let started = Instant::now();
                for _ in 0..calls {
                    call();
                }
                started.elapsed().as_nanos() as f64 / (calls * ops) as f64
            })
            .collect();
        per_op.sort_by(f64::total_cmp);
        println!(
            "{name:<44} {:>9.2} ns/op (median of {batches} batches of {} ops; least {:.2})",
            per_op[per_op.len() / 2],
            calls * ops,
            per_op[0],
        );
    }
}
