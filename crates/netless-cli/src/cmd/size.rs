//! `netless size`: sizes a receive buffer from the queueing model of NEBULA §IV-C and §V-C
//! (Erlang-C E\[Nq\], then 10 × E\[Nq\] × the mean message size in 64-byte slots); the
//! arithmetic is `netless::sizing`'s, this module only validates and prints.

use std::process::ExitCode;

use netless::sizing::{self, Sizing};
use serde::Serialize;

/// Arguments of `netless size`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Workers (cores) draining the queue, k.
    #[arg(long)]
    pub workers: u32,
    /// Offered load A = λ / μ in Erlangs (busy workers on average); must be below k.
    #[arg(long)]
    pub offered_load: f64,
    /// Mean request size in bytes.
    #[arg(long)]
    pub mean_msg_bytes: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The figures `netless size` prints, under their JSON names.
#[derive(Clone, Copy, Debug, Serialize)]
struct Figures {
    /// k.
    workers: u32,
    /// A, in Erlangs.
    offered_load: f64,
    /// A / k.
    utilisation: f64,
    /// Erlang-C probability that a request waits, C_k(A).
    wait_probability: f64,
    /// E\[Nq\] = C_k(A) · A / (k − A), mean requests waiting.
    mean_queue: f64,
    /// B.
    mean_msg_bytes: usize,
    /// 10 × E\[Nq\] × B, rounded up to whole slots.
    buffer_bytes: usize,
    /// `buffer_bytes` / 1024.
    buffer_kib: f64,
    /// Size of a slot of the receive buffer.
    slot_bytes: usize,
    /// Slots in the buffer.
    slots: u32,
    /// One bit per slot, in whole bytes.
    bitvector_bytes: u32,
}

impl Figures {
    fn new(sizing: &Sizing, mean_msg_bytes: usize) -> Figures {
        Figures {
            workers: sizing.workers,
            offered_load: sizing.load,
            utilisation: sizing.load / f64::from(sizing.workers),
            wait_probability: sizing.wait_probability,
            mean_queue: sizing.mean_queue,
            mean_msg_bytes,
            buffer_bytes: sizing.buffer_bytes,
            buffer_kib: sizing.buffer_bytes as f64 / 1024.0,
            slot_bytes: sizing::SLOT_BYTES,
            slots: sizing.slots,
            bitvector_bytes: sizing.slots.div_ceil(8),
        }
    }
}

/// Validates the arguments, sizes the buffer and prints it.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let k = args.workers;
    let a = args.offered_load;
    anyhow::ensure!(k >= 1, "--workers must be at least 1");
    anyhow::ensure!(
        a.is_finite() && a > 0.0,
        "--offered-load must be a positive number of Erlangs, not {a}"
    );
    anyhow::ensure!(
        a < f64::from(k),
        "--offered-load {a} must be below --workers {k}: at A ≥ k the workers cannot keep up \
         and the queue grows without bound, so no buffer is large enough"
    );
    anyhow::ensure!(
        args.mean_msg_bytes >= 1,
        "--mean-msg-bytes must be at least 1"
    );

    let figures = Figures::new(
        &sizing::size_buffer(k, a, args.mean_msg_bytes),
        args.mean_msg_bytes,
    );
    if args.json {
        println!("{}", serde_json::to_string(&figures)?);
    } else {
        print!("{}", table(&figures));
    }
    Ok(ExitCode::SUCCESS)
}

/// The human-readable form: one figure a line, values aligned.
fn table(f: &Figures) -> String {
    let lines = [
        ("workers k", f.workers.to_string()),
        ("offered load A", format!("{} Erlangs", f.offered_load)),
        ("utilisation A/k", format!("{:.4}", f.utilisation)),
        ("P(wait), Erlang C", format!("{:.4}", f.wait_probability)),
        (
            "E[Nq], mean waiting",
            format!("{:.2} requests", f.mean_queue),
        ),
        (
            "buffer 10 × E[Nq] × B",
            format!(
                "{} bytes ({:.1} KiB) for B = {} bytes",
                f.buffer_bytes, f.buffer_kib, f.mean_msg_bytes
            ),
        ),
        ("slots", format!("{} of {} bytes", f.slots, f.slot_bytes)),
        (
            "bitvector (1 bit per slot)",
            format!("{} bytes", f.bitvector_bytes),
        ),
    ];
    let width = lines
        .iter()
        .map(|(label, _)| label.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::from("Receive buffer for an M/M/k server (NEBULA §IV-C, §V-C)\n");
    for (label, value) in lines {
        out += &format!("  {label:<width$}  {value}\n");
    }
    out
}
