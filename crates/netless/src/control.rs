//! A replica's soft registers (Dagger §3.3) and its live stats, both in its control segment
//! (which clients map read-only): the registers are set through the reserved
//! `netless.ctl/Set` method (by the server's own uid, or root), validated by the server and
//! read by its workers (and clients) as they run; the stats are the workers' counters,
//! which any client of the replica can read without a message.
//!
//! ```no_run
//! let client = netless::Client::connect("demo.Echo")?;
//! let stats = client.replica_stats();
//! println!("{} calls, p99 {:?}", stats.calls, stats.latency_quantile(0.99));
//! client.call(netless::control::SET, b"wait=futex", &netless::CallOptions::new())?;
//! # Ok::<(), netless::Status>(())
//! ```

use std::time::Duration;

use netless_ring::{WaitMode, WaitPolicy};

use crate::config::ServerConfig;
use crate::segment::layout::{
    batch_mode, latency_bucket_floor, wait_mode, ServerControl, WorkerStats, BATCH_BUCKETS,
    LATENCY_BUCKETS,
};
use crate::status::{Code, Status};
use crate::sync::Ordering;

/// The method that answers with the registers, one `key=value` per line.
pub const GET: &str = "netless.ctl/Get";
/// The method that sets one register from a `key=value` payload and answers like [`GET`].
pub const SET: &str = "netless.ctl/Set";
/// Prefix of the methods the runtime answers itself.
pub(crate) const PREFIX: &str = "netless.ctl/";

/// The registers, with what each accepts (for `GET`'s answer and error messages).
pub const REGISTERS: &[(&str, &str)] = &[
    (
        "batch",
        "requests per batch a client publishes at most: 1..=256",
    ),
    (
        "batch_mode",
        "fixed (batches of `batch`) or adaptive (grow to `batch` under load, 1 when idle)",
    ),
    (
        "wait",
        "how idle workers wait: spin, futex, adaptive or yield",
    ),
    (
        "spin_us",
        "adaptive (or yield) wait's budget before sleeping in µs: 0..=1000000",
    ),
    (
        "slo_us",
        "latency objective in µs (0: none); sets depth_limit from the service time",
    ),
    (
        "depth_limit",
        "most requests queued ahead of a new one before it is NACKed (0: none)",
    ),
    (
        "max_connections",
        "most connections admitted: 1..=the configured maximum",
    ),
];

/// Default largest batch.
pub const DEFAULT_BATCH: u32 = 16;
/// Largest batch a register accepts.
pub const MAX_BATCH: u32 = 256;

/// Writes the registers' initial values from the server's configuration.
pub(crate) fn init(ctrl: &ServerControl, config: &ServerConfig) {
    let mode = match config.wait.mode {
        WaitMode::Spin => wait_mode::SPIN,
        WaitMode::Futex => wait_mode::FUTEX,
        WaitMode::Adaptive => wait_mode::ADAPTIVE,
        WaitMode::Yield => wait_mode::YIELD,
    };
    ctrl.wait_mode.store(mode, Ordering::Relaxed);
    ctrl.spin_ns
        .store(config.wait.spin.as_nanos() as u64, Ordering::Relaxed);
    ctrl.batch_mode
        .store(batch_mode::ADAPTIVE, Ordering::Relaxed);
    ctrl.batch_max.store(DEFAULT_BATCH, Ordering::Relaxed);
    ctrl.max_connections
        .store(config.max_connections, Ordering::Relaxed);
    let slo = config.slo.map_or(0, |s| s.target.as_nanos() as u64);
    ctrl.slo_ns.store(slo, Ordering::Relaxed);
}

/// The workers' wait policy as the registers say now.
pub(crate) fn wait_policy(ctrl: &ServerControl) -> WaitPolicy {
    let mode = match ctrl.wait_mode.load(Ordering::Relaxed) {
        wait_mode::SPIN => WaitMode::Spin,
        wait_mode::FUTEX => WaitMode::Futex,
        wait_mode::YIELD => WaitMode::Yield,
        _ => WaitMode::Adaptive,
    };
    WaitPolicy {
        mode,
        spin: Duration::from_nanos(ctrl.spin_ns.load(Ordering::Relaxed).min(1_000_000_000)),
    }
}

/// The registers as `key=value` lines.
pub(crate) fn get(ctrl: &ServerControl) -> String {
    let wait = match ctrl.wait_mode.load(Ordering::Relaxed) {
        wait_mode::SPIN => "spin",
        wait_mode::FUTEX => "futex",
        wait_mode::YIELD => "yield",
        _ => "adaptive",
    };
    let batch_mode = match ctrl.batch_mode.load(Ordering::Relaxed) {
        batch_mode::FIXED => "fixed",
        _ => "adaptive",
    };
    format!(
        "batch={}\nbatch_mode={batch_mode}\nwait={wait}\nspin_us={}\nslo_us={}\ndepth_limit={}\nmax_connections={}\n",
        ctrl.batch_max.load(Ordering::Relaxed),
        ctrl.spin_ns.load(Ordering::Relaxed) / 1000,
        ctrl.slo_ns.load(Ordering::Relaxed) / 1000,
        ctrl.depth_limit.load(Ordering::Relaxed),
        ctrl.max_connections.load(Ordering::Relaxed),
    )
}

/// Applies `key=value` (validated) and returns the registers. `service_time` is the mean
/// service time to derive a depth limit from when the SLO changes (declared or measured).
pub(crate) fn set(
    ctrl: &ServerControl,
    config: &ServerConfig,
    line: &[u8],
    service_time: Option<Duration>,
) -> Result<String, Status> {
    let line = std::str::from_utf8(line)
        .map_err(|_| Status::invalid_argument("a register setting must be UTF-8 `key=value`"))?;
    let (key, value) = line
        .trim()
        .split_once('=')
        .ok_or_else(|| Status::invalid_argument(format!("expected `key=value`, got `{line}`")))?;
    let (key, value) = (key.trim(), value.trim());
    let number = |max: u64| -> Result<u64, Status> {
        value
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= max)
            .ok_or_else(|| bad_value(key, value))
    };
    match key {
        "batch" => {
            let n = number(u64::from(MAX_BATCH))? as u32;
            if n == 0 {
                return Err(bad_value(key, value));
            }
            ctrl.batch_max.store(n, Ordering::Relaxed);
        }
        "batch_mode" => {
            let mode = match value {
                "fixed" => batch_mode::FIXED,
                "adaptive" => batch_mode::ADAPTIVE,
                _ => return Err(bad_value(key, value)),
            };
            ctrl.batch_mode.store(mode, Ordering::Relaxed);
        }
        "wait" => {
            let mode = match value {
                "spin" => wait_mode::SPIN,
                "futex" => wait_mode::FUTEX,
                "adaptive" => wait_mode::ADAPTIVE,
                "yield" => wait_mode::YIELD,
                _ => return Err(bad_value(key, value)),
            };
            ctrl.wait_mode.store(mode, Ordering::Relaxed);
        }
        "spin_us" => {
            let us = number(1_000_000)?;
            ctrl.spin_ns.store(us * 1000, Ordering::Relaxed);
        }
        "slo_us" => {
            let us = number(60_000_000)?;
            let target = Duration::from_micros(us);
            let derived = service_time.and_then(|s| config.depth_limit_for(target, s));
            let limit = match (us, derived) {
                (0, _) => 0,
                (_, Some(limit)) => limit,
                _ => {
                    return Err(Status::new(
                        Code::FailedPrecondition,
                        "slo_us needs the mean service time, which is neither declared \
                         (ServerConfig::slo) nor measured yet: set depth_limit directly, or \
                         retry after the server has served some requests",
                    ))
                }
            };
            ctrl.slo_ns.store(us * 1000, Ordering::Relaxed);
            ctrl.depth_limit.store(limit, Ordering::Relaxed);
        }
        "depth_limit" => {
            let n = number(u64::from(u32::MAX))? as u32;
            ctrl.depth_limit.store(n, Ordering::Relaxed);
        }
        "max_connections" => {
            let n = number(u64::from(config.max_connections))? as u32;
            if n == 0 {
                return Err(bad_value(key, value));
            }
            ctrl.max_connections.store(n, Ordering::Relaxed);
        }
        _ => {
            let known: Vec<&str> = REGISTERS.iter().map(|(k, _)| *k).collect();
            return Err(Status::invalid_argument(format!(
                "unknown register `{key}`; known: {}",
                known.join(", ")
            )));
        }
    }
    ctrl.generation.fetch_add(1, Ordering::Relaxed);
    Ok(get(ctrl))
}

fn bad_value(key: &str, value: &str) -> Status {
    let what = REGISTERS
        .iter()
        .find(|(k, _)| *k == key)
        .map_or("", |(_, w)| *w);
    Status::invalid_argument(format!("bad value `{value}` for `{key}`: {what}"))
}

/// A snapshot of a replica's live counters, as its workers published them in shared memory.
/// The values are the server's to write: read, summed and displayed, never trusted further.
/// Calls to the runtime's own `netless.ctl/` methods count like any other call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    /// Workers (one set of counters each).
    pub workers: u32,
    /// Live connections.
    pub connections: u32,
    /// Requests answered.
    pub calls: u64,
    /// Requests answered with an error status.
    pub errors: u64,
    /// Answers by status code, codes with a zero count left out.
    pub by_code: Vec<(Code, u64)>,
    /// Requests clients refused to send (NACKs), as the clients counted them.
    pub nacks: u64,
    /// Request bytes received.
    pub bytes_in: u64,
    /// Response bytes sent.
    pub bytes_out: u64,
    /// Times a worker went to sleep (each wake-up costs a system call).
    pub sleeps: u64,
    /// Queue entries taken (a batch of requests is one entry).
    pub entries: u64,
    /// Requests per entry, in buckets 1, 2, 3–4, 5–8, …, 129+.
    pub batch_sizes: [u64; BATCH_BUCKETS],
    /// Requests queued now (all queues).
    pub queue_depth: u64,
    /// Sampled service times: counts per log-linear bucket (see `latency_quantile`).
    pub latency: Vec<u64>,
    /// The registers, as `key=value` lines.
    pub registers: String,
}

impl ReplicaStats {
    /// The `q` quantile (0..=1) of the sampled service times (the lower edge of its bucket,
    /// within 19% below the true value); `None` before any sample.
    pub fn latency_quantile(&self, q: f64) -> Option<Duration> {
        let total = self.latency.iter().fold(0u64, |a, n| a.saturating_add(*n));
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (b, n) in self.latency.iter().enumerate() {
            seen = seen.saturating_add(*n);
            if seen >= rank {
                return Some(Duration::from_nanos(latency_bucket_floor(b)));
            }
        }
        None
    }

    /// The sampled service times as buckets: `(from, below, count)`, `count` samples of at
    /// least `from` and less than `below` (`None`: no upper bound), in order. Every bucket
    /// is listed, empty ones too; their widths are a quarter of a power of two (at most 19%
    /// of `from`).
    pub fn latency_buckets(&self) -> impl Iterator<Item = (Duration, Option<Duration>, u64)> + '_ {
        let last = self
            .latency
            .len()
            .saturating_sub(1)
            .min(LATENCY_BUCKETS - 1);
        self.latency
            .iter()
            .take(LATENCY_BUCKETS)
            .enumerate()
            .map(move |(b, n)| {
                let below = (b < last).then(|| Duration::from_nanos(latency_bucket_floor(b + 1)));
                (Duration::from_nanos(latency_bucket_floor(b)), below, *n)
            })
    }

    /// The mean batch size (requests per queue entry).
    pub fn mean_batch(&self) -> f64 {
        if self.entries == 0 {
            0.0
        } else {
            self.calls as f64 / self.entries as f64
        }
    }
}

/// The workers' sampled service times, summed per bucket.
pub(crate) fn latency_histogram(workers: &[WorkerStats]) -> Vec<u64> {
    let mut latency = vec![0u64; LATENCY_BUCKETS];
    for w in workers {
        for (sum, c) in latency.iter_mut().zip(&w.latency) {
            *sum = sum.saturating_add(c.load(Ordering::Relaxed));
        }
    }
    latency
}

/// Reads a replica's stats from its segments.
pub(crate) fn snapshot(replica: &crate::segment::ReplicaSegment) -> ReplicaStats {
    let mut s = ReplicaStats {
        workers: replica.stats().len() as u32,
        latency: vec![0; LATENCY_BUCKETS],
        ..ReplicaStats::default()
    };
    let load = |a: &crate::sync::AtomicU64| a.load(Ordering::Relaxed);
    let mut by_code = [0u64; 17];
    for w in replica.stats() {
        s.calls = s.calls.wrapping_add(load(&w.calls));
        s.errors = s.errors.wrapping_add(load(&w.errors));
        s.bytes_in = s.bytes_in.wrapping_add(load(&w.bytes_in));
        s.bytes_out = s.bytes_out.wrapping_add(load(&w.bytes_out));
        s.sleeps = s.sleeps.wrapping_add(load(&w.sleeps));
        s.entries = s.entries.wrapping_add(load(&w.entries));
        for (i, c) in w.by_code.iter().enumerate() {
            by_code[i] = by_code[i].wrapping_add(load(c));
        }
        for (i, c) in w.batch.iter().enumerate() {
            s.batch_sizes[i] = s.batch_sizes[i].wrapping_add(load(c));
        }
    }
    s.latency = latency_histogram(replica.stats());
    s.by_code = by_code
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .filter_map(|(c, n)| Some((Code::from_u16(c as u16)?, *n)))
        .collect();
    s.queue_depth = replica.queues().iter().map(|q| q.depth()).sum();
    let ctrl = replica.server_control();
    s.connections = ctrl.connections.load(Ordering::Relaxed);
    s.nacks = replica.client_control().nacks.load(Ordering::Relaxed);
    s.registers = get(ctrl);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::layout::latency_bucket;

    fn control() -> Box<ServerControl> {
        // SAFETY: ServerControl is atomics only, for which all-zero bytes are valid.
        Box::new(unsafe { std::mem::zeroed() })
    }

    #[test]
    fn set_validates_and_applies() {
        let ctrl = control();
        let config = ServerConfig::default();
        init(&ctrl, &config);
        assert!(get(&ctrl).contains("wait=adaptive"));
        let out = set(&ctrl, &config, b"wait=futex", None).unwrap();
        assert!(out.contains("wait=futex"));
        assert_eq!(wait_policy(&ctrl).mode, WaitMode::Futex);
        set(&ctrl, &config, b" batch = 4 ", None).unwrap();
        assert_eq!(ctrl.batch_max.load(Ordering::Relaxed), 4);
        for bad in [
            &b"batch=0"[..],
            b"batch=999",
            b"wait=sometimes",
            b"spin_us=-1",
            b"nonsense",
            b"max_connections=5000",
        ] {
            let e = set(&ctrl, &config, bad, None).unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e}");
        }
        let e = set(&ctrl, &config, b"colour=blue", None).unwrap_err();
        assert!(e.message().contains("known: batch"), "{e}");
        let e = set(&ctrl, &config, b"slo_us=100", None).unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        set(
            &ctrl,
            &config,
            b"slo_us=100",
            Some(Duration::from_micros(10)),
        )
        .unwrap();
        assert_eq!(ctrl.depth_limit.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn quantiles_from_buckets() {
        let mut s = ReplicaStats {
            latency: vec![0; LATENCY_BUCKETS],
            ..Default::default()
        };
        assert_eq!(s.latency_quantile(0.5), None);
        for ns in [1000u64; 98].into_iter().chain([50_000, 80_000]) {
            s.latency[latency_bucket(ns)] += 1;
        }
        let p50 = s.latency_quantile(0.5).unwrap().as_nanos() as u64;
        assert!((800..=1000).contains(&p50), "{p50}");
        let p99 = s.latency_quantile(0.99).unwrap().as_nanos() as u64;
        assert!((40_000..=50_000).contains(&p99), "{p99}");
        let buckets: Vec<_> = s.latency_buckets().collect();
        assert_eq!(buckets.len(), LATENCY_BUCKETS);
        assert_eq!(buckets.iter().map(|b| b.2).sum::<u64>(), 100);
        for pair in buckets.windows(2) {
            assert_eq!(pair[0].1, Some(pair[1].0));
        }
        assert_eq!(buckets.last().unwrap().1, None);
        let (from, below, n) = buckets[latency_bucket(1000)];
        assert!(from.as_nanos() <= 1000 && below.unwrap().as_nanos() > 1000 && n == 98);
    }
}
