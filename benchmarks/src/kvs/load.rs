//! The load generator of `slo_buffers`: many connections to the key-value service, and
//! one open-loop Poisson arrival process spread uniformly over them.
//!
//! The process (the `load` peer role) opens its connections, prints `READY N`, and
//! then answers commands on stdin with one JSON line each on stdout:
//!
//! - `zero N SEED`: N calls one at a time, each on a random connection (the zero-load
//!   latency, through exactly the path the load takes);
//! - `warm`: one call on each connection in turn;
//! - `run RATE WARMUP_MS WINDOW_MS SEED`: Poisson arrivals at RATE calls/s for WARMUP_MS (not
//!   recorded) and then WINDOW_MS (recorded), each a `Get` or a `Set` (50/50) of a uniformly
//!   chosen key on a uniformly chosen connection.
//!
//! One thread does everything, spinning: it sends every call at its scheduled time and polls
//! the connections that have calls in flight. Each connection is a [`Pipeline`]: a submit
//! writes the request into the server's receive buffer and returns at once (a refused one
//! fails at once with a NACK), and a poll takes whatever replies have come; nothing waits for
//! a reply, so calls in flight never hold back the schedule, and no thread but this one ever
//! runs (a `Pipeline` starts no reaper thread, and the connections' monitor threads sleep
//! until a connection dies). `call_async` is not used: each call on a connection with
//! nothing else in flight wakes that connection's reaper thread, which on a core shared with
//! the sender costs several context switches per call (measured: the generator saturated
//! below 20 000 calls/s with 1024 connections).
//!
//! Each request carries its send time (`CLOCK_MONOTONIC`, shared by the processes) and
//! whether it belongs to the recorded window, so that the server can time it from send to
//! the end of its handler (see `store`). Here a call is timed from its *scheduled* send time
//! to the poll that sees its reply (no coordinated omission), so the client-side figure also
//! holds the generator's own lateness. The schedule never runs ahead of the generator by more
//! than [`MAX_LAG`]: if the thread was held up longer (the machine is shared), the arrivals
//! due meanwhile are dropped rather than sent in a burst, the stall counts as a pause, and the
//! offered load reported is the one actually sent.
//!
//! Outcomes are counted apart: accepted (a reply), NACKed (`Status::is_nack`: the server's
//! receive buffer was full or its queue deeper than its SLO allows), refused locally (the
//! connection already had `max_in_flight` calls outstanding) and failed otherwise. Every reply
//! is checked: a `Get` must return a value of the requested key, a `Set` nothing.

use std::io::{BufRead as _, Write as _};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hdrhistogram::Histogram;
use netless::{ClientConfig, Pipeline, Status};
use serde::{Deserialize, Serialize};

use super::store::{
    fill_value, key_of, mix64, value_key, Stamp, GET, KEY_BYTES, SET, STAMP_BYTES, VALUE_BYTES,
};
use crate::harness::histogram::{mean_us, new_histogram, quantile_us};

/// How late a call may be sent before the schedule is shifted instead (see the module docs).
pub(super) const MAX_LAG: Duration = Duration::from_micros(20);
/// Connections polled between two looks at the schedule.
const POLL_SLICE: usize = 32;
/// How long the end of a window waits for the replies of calls still in flight.
const DRAIN: Duration = Duration::from_secs(5);

/// The `load` peer role: one load-generator process.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadArgs {
    /// Socket directory of the run.
    #[arg(long)]
    pub dir: PathBuf,
    /// Service name.
    #[arg(long)]
    pub service: String,
    /// Connections to open.
    #[arg(long)]
    pub connections: usize,
    /// Keys the store holds (keys are drawn uniformly from them).
    #[arg(long)]
    pub keys: u32,
    /// Most calls in flight per connection.
    #[arg(long, default_value_t = 32)]
    pub max_in_flight: u32,
    /// Bytes of each connection's response ring.
    #[arg(long, default_value_t = 32 * 1024)]
    pub ring_bytes: usize,
    /// Pin the process to this CPU.
    #[arg(long)]
    pub pin_cpu: Option<usize>,
}

/// Latencies, µs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Latency {
    /// Calls timed.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest.
    pub max_us: f64,
}

impl Latency {
    /// Summarises a histogram of nanoseconds.
    pub(super) fn of(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            count: h.len(),
            mean_us: mean_us(h),
            p50_us: quantile_us(h, 0.5),
            p99_us: quantile_us(h, 0.99),
            p999_us: quantile_us(h, 0.999),
            max_us: h.max() as f64 / 1e3,
        }
    }
}

/// What `zero` measured.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct ZeroLoad {
    /// Calls that failed.
    pub failed: u64,
    /// Client-side latency of those that got a reply.
    pub latency: Latency,
}

/// What one `run` window measured at the client.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Window {
    /// Length of the recorded window, s.
    pub window_s: f64,
    /// Calls sent in the window (NACKed ones included).
    pub sent: u64,
    /// Calls answered.
    pub accepted: u64,
    /// Calls NACKed: by the client before sending (buffer full, queue deeper than the SLO
    /// allows) or by a worker (queued too long to finish within the SLO).
    pub nacks: u64,
    /// Of those, the NACKs for a queue deeper than the SLO allows (the rest found no room in
    /// the receive buffer or queue, or waited too long).
    pub nacks_depth: u64,
    /// Of those, the NACKs from a worker for a request that had waited in the queue too
    /// long to finish within the SLO (refused without running; the rest were refused by
    /// the client before sending).
    #[serde(default)]
    pub nacks_late: u64,
    /// Time from the scheduled send to the NACK, client-side: how fast refused calls fail.
    #[serde(default)]
    pub nack_latency: Latency,
    /// Calls refused by the client: their connection had `max_in_flight` calls outstanding.
    pub local_rejects: u64,
    /// Calls that failed otherwise (connection lost, handler error, no reply in time).
    pub errors: u64,
    /// Replies that were not what the call asked for.
    pub wrong: u64,
    /// Time the schedule was shifted because the generator was held up, ms.
    pub paused_ms: f64,
    /// Client-side latency of the accepted calls, from their scheduled send time.
    pub latency: Latency,
}

/// A window's outcomes as they come.
struct Acc {
    latency: Histogram<u64>,
    nack_latency: Histogram<u64>,
    nacks_late: u64,
    sent: u64,
    accepted: u64,
    nacks: u64,
    nacks_depth: u64,
    local_rejects: u64,
    errors: u64,
    wrong: u64,
    first_error: Option<String>,
}

impl Acc {
    fn new() -> Acc {
        Acc {
            latency: new_histogram(),
            nack_latency: new_histogram(),
            nacks_late: 0,
            sent: 0,
            accepted: 0,
            nacks: 0,
            nacks_depth: 0,
            local_rejects: 0,
            errors: 0,
            wrong: 0,
            first_error: None,
        }
    }

    /// Records the outcome of a call: its reply payload or status, how long it took (ns, for
    /// an answered call) and the key of a `Get` (`None` for a `Set`).
    fn record(&mut self, outcome: Result<&[u8], Status>, took_ns: u64, get_key: Option<u64>) {
        match outcome {
            Ok(payload) => {
                self.accepted += 1;
                self.latency.saturating_record(took_ns.max(1));
                let ok = match get_key {
                    Some(i) => payload.len() == VALUE_BYTES && value_key(payload) == Some(i),
                    None => payload.is_empty(),
                };
                self.wrong += u64::from(!ok);
            }
            Err(s) => self.fail(&s, took_ns),
        }
    }

    /// Counts a failed call, `took_ns` after its scheduled send.
    fn fail(&mut self, s: &Status, took_ns: u64) {
        if s.is_nack() {
            self.nacks += 1;
            self.nack_latency.saturating_record(took_ns.max(1));
            // The runtime says why a client refused only in words: "… has N requests
            // queued, more than …".
            self.nacks_depth += u64::from(s.message().contains("requests queued"));
            self.nacks_late += u64::from(s.is_refused_by_worker());
        } else if s.code() == netless::Code::ResourceExhausted {
            self.local_rejects += 1;
        } else {
            self.errors += 1;
            if self.first_error.is_none() {
                self.first_error = Some(s.to_string());
            }
        }
    }
}

/// A random stream: splitmix64 over a counter.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix64(self.0)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n.
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n.max(1))) >> 64) as u64
    }

    /// An exponential inter-arrival gap for `rate` arrivals per second, ns.
    fn gap_ns(&mut self, rate: f64) -> u64 {
        (-(1.0 - self.unit()).ln() / rate * 1e9) as u64
    }
}

/// A call in flight: when it was due, the key of a `Get`, and whether it is recorded.
#[derive(Clone, Copy, Default)]
struct InFlight {
    due_ns: u64,
    get_key: Option<u64>,
    measured: bool,
}

/// The connections and the calls in flight on them.
struct Generator {
    pipes: Vec<Pipeline>,
    /// Per connection, per call slot (the low half of a call id): the call in it.
    calls: Vec<Vec<InFlight>>,
    /// Connections with calls in flight (the only ones polled), membership, and where the
    /// next poll starts.
    active: Vec<usize>,
    is_active: Vec<bool>,
    cursor: usize,
    keys: u64,
    payload: Vec<u8>,
    version: u64,
}

impl Generator {
    fn in_flight(&self) -> u64 {
        self.active
            .iter()
            .map(|&c| u64::from(self.pipes[c].in_flight()))
            .sum()
    }

    /// Sends one call due at `due_ns` (a NACK is decided at once).
    fn send(&mut self, rng: &mut Rng, due_ns: u64, measured: bool, acc: &mut Acc) {
        let conn = rng.below(self.pipes.len() as u64) as usize;
        self.send_on(conn, rng, due_ns, measured, acc);
    }

    /// Sends one call on connection `conn`.
    fn send_on(&mut self, conn: usize, rng: &mut Rng, due_ns: u64, measured: bool, acc: &mut Acc) {
        let key = rng.below(self.keys);
        let is_set = rng.next() & 1 == 1;
        self.payload[..KEY_BYTES].copy_from_slice(&key_of(key));
        let (method, len) = if is_set {
            self.version += 1;
            fill_value(
                &mut self.payload[KEY_BYTES..KEY_BYTES + VALUE_BYTES],
                key,
                self.version,
            );
            (SET, KEY_BYTES + VALUE_BYTES)
        } else {
            (GET, KEY_BYTES)
        };
        let stamp = Stamp {
            sent_ns: netless_shm::monotonic_ns(),
            measured,
        };
        self.payload[len..len + STAMP_BYTES].copy_from_slice(&stamp.to_bytes());
        let result = self.pipes[conn].submit(method, &self.payload[..len + STAMP_BYTES]);
        if measured {
            acc.sent += 1;
        }
        match result {
            Ok(id) => {
                let slot = Pipeline::slot(id);
                let calls = &mut self.calls[conn];
                if calls.len() <= slot {
                    calls.resize(slot + 1, InFlight::default());
                }
                calls[slot] = InFlight {
                    due_ns,
                    get_key: (!is_set).then_some(key),
                    measured,
                };
                if !self.is_active[conn] {
                    self.is_active[conn] = true;
                    self.active.push(conn);
                }
            }
            Err(s) if measured => {
                let took = netless_shm::monotonic_ns().saturating_sub(due_ns);
                acc.fail(&s, took)
            }
            Err(_) => {}
        }
    }

    /// Polls up to `most` of the connections with calls in flight, round robin from where
    /// the last poll stopped; returns the replies taken.
    fn poll(&mut self, most: usize, acc: &mut Acc) -> usize {
        let mut taken = 0;
        let mut visited = 0;
        while visited < most && !self.active.is_empty() {
            visited += 1;
            if self.cursor >= self.active.len() {
                self.cursor = 0;
            }
            let conn = self.active[self.cursor];
            let calls = &self.calls[conn];
            let polled = self.pipes[conn].poll(|id, outcome| {
                let call = calls.get(Pipeline::slot(id)).copied().unwrap_or_default();
                if call.measured {
                    let took = netless_shm::monotonic_ns().saturating_sub(call.due_ns);
                    acc.record(outcome, took, call.get_key);
                }
            });
            match polled {
                Ok(n) => taken += n,
                Err(s) => {
                    // The connection is gone with its calls: count them, stop polling it.
                    for _ in 0..self.pipes[conn].in_flight() {
                        acc.fail(&s, 0);
                    }
                }
            }
            if self.pipes[conn].in_flight() == 0 || self.pipes[conn].is_closed() {
                self.is_active[conn] = false;
                self.active.swap_remove(self.cursor);
            } else {
                self.cursor += 1;
            }
        }
        taken
    }

    /// `warm`: one call on each connection in turn, so that every connection's state and
    /// its part of the receive buffer have been used before anything is measured.
    fn warm(&mut self) -> ZeroLoad {
        let mut acc = Acc::new();
        for conn in 0..self.pipes.len() {
            let mut rng = Rng(conn as u64);
            let due = netless_shm::monotonic_ns();
            self.send_on(conn, &mut rng, due, true, &mut acc);
            self.drain(&mut acc);
        }
        ZeroLoad {
            failed: acc.sent - acc.accepted,
            latency: Latency::of(&acc.latency),
        }
    }

    /// Polls until every call in flight is answered, or `DRAIN` has passed.
    fn drain(&mut self, acc: &mut Acc) {
        let deadline = Instant::now() + DRAIN;
        while !self.active.is_empty() && Instant::now() < deadline {
            self.poll(usize::MAX, acc);
        }
    }

    /// `zero`: `n` calls one at a time.
    fn zero(&mut self, n: u64, seed: u64) -> ZeroLoad {
        let mut rng = Rng(seed);
        let mut acc = Acc::new();
        for _ in 0..n {
            let due = netless_shm::monotonic_ns();
            self.send(&mut rng, due, true, &mut acc);
            self.drain(&mut acc);
        }
        ZeroLoad {
            failed: acc.sent - acc.accepted,
            latency: Latency::of(&acc.latency),
        }
    }

    /// `run`: one open-loop window.
    fn run(&mut self, rate: f64, warmup: Duration, window: Duration, seed: u64) -> Window {
        let mut acc = Acc::new();
        let mut rng = Rng(seed);
        let max_lag = MAX_LAG.as_nanos() as u64;
        let t0 = netless_shm::monotonic_ns();
        let measure_from = t0 + warmup.as_nanos() as u64;
        let end = measure_from + window.as_nanos() as u64;
        let mut next = t0 + rng.gap_ns(rate);
        let mut paused = 0u64;
        while next < end {
            let now = netless_shm::monotonic_ns();
            if now > next + max_lag {
                // Held up: shift the schedule rather than send the backlog in a burst.
                if next >= measure_from {
                    paused += now - next;
                }
                next = now;
            }
            // Send every call that is due, then poll a slice of the connections in flight.
            while next <= now && next < end {
                let due = next;
                next += rng.gap_ns(rate);
                self.send(&mut rng, due, due >= measure_from, &mut acc);
            }
            self.poll(POLL_SLICE, &mut acc);
        }
        self.drain(&mut acc);
        let unanswered = self.in_flight();
        if unanswered > 0 {
            // Unanswered after the drain: counted as failed (the benchmark reports them).
            acc.errors += unanswered;
            acc.first_error
                .get_or_insert_with(|| format!("{unanswered} calls unanswered after {DRAIN:?}"));
        }
        if let Some(e) = &acc.first_error {
            eprintln!("kvs load: {} calls failed, first: {e}", acc.errors);
        }
        Window {
            window_s: window.as_secs_f64(),
            sent: acc.sent,
            accepted: acc.accepted,
            nacks: acc.nacks,
            nacks_depth: acc.nacks_depth,
            nacks_late: acc.nacks_late,
            nack_latency: Latency::of(&acc.nack_latency),
            local_rejects: acc.local_rejects,
            errors: acc.errors,
            wrong: acc.wrong,
            paused_ms: paused as f64 / 1e6,
            latency: Latency::of(&acc.latency),
        }
    }
}

/// The `load` peer role: opens the connections, then runs commands until stdin ends.
pub(super) fn generate(args: LoadArgs) -> anyhow::Result<()> {
    if let Some(cpu) = args.pin_cpu {
        // Before connecting: the connections' monitor threads inherit the CPU.
        netless_shm::pin_current_thread(cpu)?;
    }
    let config = ClientConfig {
        dir: Some(args.dir.clone()),
        ring_bytes: args.ring_bytes,
        max_in_flight: args.max_in_flight,
        ..ClientConfig::default()
    };
    let pipes = (0..args.connections)
        .map(|k| {
            Pipeline::connect(&args.service, config.clone())
                .with_context(|| format!("connection {k} to `{}`", args.service))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut generator = Generator {
        calls: vec![Vec::new(); pipes.len()],
        active: Vec::with_capacity(pipes.len()),
        is_active: vec![false; pipes.len()],
        cursor: 0,
        pipes,
        keys: u64::from(args.keys),
        payload: vec![0u8; KEY_BYTES + VALUE_BYTES + STAMP_BYTES],
        version: 0,
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY {}", args.connections)?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> anyhow::Result<f64> {
            words
                .get(i)
                .and_then(|w| w.parse::<f64>().ok())
                .with_context(|| format!("bad command {line:?}"))
        };
        let reply = match words.first() {
            Some(&"zero") => {
                let z = generator.zero(num(1)? as u64, num(2)? as u64);
                serde_json::to_string(&z)?
            }
            Some(&"warm") => serde_json::to_string(&generator.warm())?,
            Some(&"run") => {
                let rate = num(1)?;
                anyhow::ensure!(rate > 0.0, "rate must be positive: {line:?}");
                let warmup = Duration::from_secs_f64(num(2)? / 1e3);
                let window = Duration::from_secs_f64(num(3)? / 1e3);
                let w = generator.run(rate, warmup, window, num(4)? as u64);
                serde_json::to_string(&w)?
            }
            _ => anyhow::bail!("unknown command {line:?}"),
        };
        writeln!(out, "{reply}")?;
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_gaps_have_the_rate_asked_for() {
        let mut rng = Rng(1);
        let n = 200_000;
        let total: u64 = (0..n).map(|_| rng.gap_ns(1e5)).sum();
        let rate = n as f64 / (total as f64 / 1e9);
        assert!((rate - 1e5).abs() / 1e5 < 0.02, "{rate}");
        let mut below = [0u64; 4];
        for _ in 0..40_000 {
            below[rng.below(4) as usize] += 1;
        }
        assert!(
            below.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{below:?}"
        );
    }

    #[test]
    fn outcomes_are_counted_apart_and_replies_checked() {
        let mut acc = Acc::new();
        acc.record(Ok(&[]), 1000, None);
        let mut value = [0u8; VALUE_BYTES];
        fill_value(&mut value, 7, 1);
        acc.record(Ok(&value), 1000, Some(7));
        acc.record(Ok(&value), 1000, Some(8));
        acc.record(Ok(&[1]), 1000, None);
        acc.record(Err(Status::resource_exhausted("in flight")), 0, None);
        acc.record(Err(Status::unavailable("gone")), 0, None);
        assert_eq!((acc.accepted, acc.wrong), (4, 2));
        assert_eq!((acc.nacks, acc.local_rejects, acc.errors), (0, 1, 1));
        assert_eq!(acc.latency.len(), 4);
    }
}
