//! The key-value service of `slo_buffers`: a MICA-like store of 16-byte keys and
//! 512-byte values, its two methods (`Get`, `Set`), and the server process serving it.
//!
//! The store is preloaded with keys `0..n` and never grows: `Set` overwrites the value of an
//! existing key in place (MICA appends to a circular log and moves the index entry; with
//! uniform keys and a fixed key set the work per request is the same: one hash-index probe
//! and one 512-byte copy between the request or response and a value that is, for a large
//! store, not in the cache). The index is an open-addressing table built once and only read
//! afterwards; each value has its own lock, so any number of workers serve it.
//!
//! The server process (the `server` peer role) prints `LISTENING <service>` once it
//! serves, then answers commands on stdin, one JSON line each on stdout: `stats` (the
//! server's counters) and `calibrate N` (the mean handler time of N random requests, run
//! in-process, so with no transport). It exits at end of input: the benchmark closes its
//! stdin, or dies.

use std::io::{BufRead as _, Write as _};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hdrhistogram::Histogram;
#[cfg(test)]
use netless::Metadata;
use netless::{Request, ResponseBuilder, Server, ServerConfig, Slo, Status};
use serde::{Deserialize, Serialize};

use super::config::{Dispatch, Provisioning};
use super::load::Latency;
use crate::harness::histogram::new_histogram;

/// Key size, bytes (NEBULA §VI: MICA with 16-byte keys).
pub(super) const KEY_BYTES: usize = 16;
/// Value size, bytes (NEBULA §VI: 512-byte values).
pub(super) const VALUE_BYTES: usize = 512;
/// The read method: payload = key ‖ stamp; reply = the value.
pub(super) const GET: &str = "Get";
/// The write method: payload = key ‖ value ‖ stamp; empty reply.
pub(super) const SET: &str = "Set";
/// Bytes of the [`Stamp`] that ends every request.
pub(super) const STAMP_BYTES: usize = 9;

/// What the load generator appends to every request: when it was sent (`CLOCK_MONOTONIC`,
/// ns) and whether it belongs to a recorded window. The server times a recorded request from
/// its send to the end of its handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Stamp {
    /// Send time, ns of `CLOCK_MONOTONIC`.
    pub sent_ns: u64,
    /// Whether the server should record the request's latency.
    pub measured: bool,
}

impl Stamp {
    /// The 9 bytes on the wire.
    pub(super) fn to_bytes(self) -> [u8; STAMP_BYTES] {
        let mut b = [0u8; STAMP_BYTES];
        b[..8].copy_from_slice(&self.sent_ns.to_le_bytes());
        b[8] = u8::from(self.measured);
        b
    }

    /// Splits a request payload into its body and its stamp.
    pub(super) fn split(payload: &[u8]) -> Option<(&[u8], Stamp)> {
        let at = payload.len().checked_sub(STAMP_BYTES)?;
        let (body, stamp) = payload.split_at(at);
        Some((
            body,
            Stamp {
                sent_ns: u64::from_le_bytes(stamp[..8].try_into().ok()?),
                measured: stamp[8] != 0,
            },
        ))
    }
}

/// One value, the first 8 bytes of which always hold its key's number (so that a reader can
/// check a `Get` returned the value of the key it asked for).
pub(super) type Value = [u8; VALUE_BYTES];

/// splitmix64: a well-mixed 64-bit function of `x` (keys, values, the load generator's
/// random numbers).
pub(super) fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key numbered `i`: 16 bytes that look random (a hash of `i`, then `i`).
pub(super) fn key_of(i: u64) -> [u8; KEY_BYTES] {
    let mut key = [0u8; KEY_BYTES];
    key[..8].copy_from_slice(&mix64(i ^ 0x6b65_795f_6b76_7321).to_le_bytes());
    key[8..].copy_from_slice(&i.to_le_bytes());
    key
}

/// Fills `value` for key `i`, version `version`: the key's number, then a pattern.
pub(super) fn fill_value(value: &mut [u8], i: u64, version: u64) {
    value[..8].copy_from_slice(&i.to_le_bytes());
    let word = mix64(i ^ version.rotate_left(32)).to_le_bytes();
    for (k, b) in value[8..].iter_mut().enumerate() {
        *b = word[k % 8];
    }
}

/// The key number a value says it belongs to.
pub(super) fn value_key(value: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(value.get(..8)?.try_into().ok()?))
}

/// Index entry: a key and the number of its value (`u32::MAX`: empty).
#[derive(Clone, Copy)]
struct Entry {
    key: [u8; KEY_BYTES],
    value: u32,
}

const EMPTY: u32 = u32::MAX;

/// The store: a read-only open-addressing index over a fixed set of keys, and one locked
/// 512-byte value per key.
pub(super) struct Store {
    index: Box<[Entry]>,
    mask: usize,
    values: Box<[Mutex<Value>]>,
}

impl Store {
    /// A store holding keys `0..keys`, each with its initial value.
    pub(super) fn preload(keys: u32) -> Store {
        // Load factor ≤ 0.5: short probe sequences, as MICA's lossy index mostly hits the
        // first bucket.
        let slots = (keys as usize * 2).next_power_of_two().max(16);
        let mut index = vec![
            Entry {
                key: [0; KEY_BYTES],
                value: EMPTY,
            };
            slots
        ]
        .into_boxed_slice();
        let mask = slots - 1;
        for i in 0..keys {
            let key = key_of(u64::from(i));
            let mut at = hash(&key) & mask;
            while index[at].value != EMPTY {
                at = (at + 1) & mask;
            }
            index[at] = Entry { key, value: i };
        }
        let values = (0..keys)
            .map(|i| {
                let mut v = [0u8; VALUE_BYTES];
                fill_value(&mut v, u64::from(i), 0);
                Mutex::new(v)
            })
            .collect();
        Store {
            index,
            mask,
            values,
        }
    }

    /// Number of keys.
    pub(super) fn len(&self) -> usize {
        self.values.len()
    }

    /// The value slot of `key`, if present.
    fn find(&self, key: &[u8]) -> Option<&Mutex<Value>> {
        let key: &[u8; KEY_BYTES] = key.try_into().ok()?;
        let mut at = hash(key) & self.mask;
        loop {
            let e = &self.index[at];
            if e.value == EMPTY {
                return None;
            }
            if &e.key == key {
                return self.values.get(e.value as usize);
            }
            at = (at + 1) & self.mask;
        }
    }

    /// Serves one request (the handler of the service, but for the stamp: `body` is the
    /// payload without it).
    pub(super) fn handle(
        &self,
        method: &str,
        body: &[u8],
        resp: &mut ResponseBuilder<'_>,
    ) -> Result<(), Status> {
        match method {
            GET => {
                let slot = self.find(body).ok_or_else(|| not_found(body))?;
                let value = slot.lock().unwrap_or_else(|e| e.into_inner());
                resp.payload.extend_from_slice(&value[..]);
                Ok(())
            }
            SET => {
                if body.len() != KEY_BYTES + VALUE_BYTES {
                    return Err(Status::invalid_argument(format!(
                        "Set takes a {KEY_BYTES}-byte key and a {VALUE_BYTES}-byte value, got {} bytes",
                        body.len()
                    )));
                }
                let (key, new) = body.split_at(KEY_BYTES);
                let slot = self.find(key).ok_or_else(|| not_found(key))?;
                slot.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .copy_from_slice(new);
                Ok(())
            }
            other => Err(Status::unimplemented(format!("no method `{other}`"))),
        }
    }
}

fn not_found(key: &[u8]) -> Status {
    Status::new(
        netless::Code::NotFound,
        format!("no key {key:02x?} in the store"),
    )
}

/// Hash of a key for the index (the key is already random-looking: fold and mix).
fn hash(key: &[u8; KEY_BYTES]) -> usize {
    let a = u64::from_le_bytes(key[..8].try_into().expect("8 bytes"));
    let b = u64::from_le_bytes(key[8..].try_into().expect("8 bytes"));
    mix64(a ^ b.rotate_left(17)) as usize
}

/// The `server` peer role: the key-value service in its own process.
#[derive(clap::Args, Debug, Clone)]
pub struct ServerArgs {
    /// Socket directory of the run.
    #[arg(long)]
    pub dir: PathBuf,
    /// Service name.
    #[arg(long)]
    pub service: String,
    /// Keys preloaded.
    #[arg(long)]
    pub keys: u32,
    /// Receive-buffer provisioning.
    #[arg(long, value_enum)]
    pub provisioning: Provisioning,
    /// Dispatch of requests to workers.
    #[arg(long, value_enum)]
    pub dispatch: Dispatch,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Receive buffer (whole, per worker or per connection); default: the runtime's (sized
    /// from the SLO if there is one).
    #[arg(long)]
    pub buffer_bytes: Option<usize>,
    /// SLO on the time a request spends at the server, ns (none: no SLO, no queue limit).
    #[arg(long)]
    pub slo_ns: Option<u64>,
    /// Mean service time the SLO is declared with, ns.
    #[arg(long)]
    pub service_ns: Option<u64>,
    /// Mean request size (method and payload) the SLO buffer is sized for, bytes.
    #[arg(long, default_value_t = 284)]
    pub request_bytes: usize,
    /// Connection slots.
    #[arg(long, default_value_t = 1100)]
    pub max_connections: u32,
    /// How long idle workers spin before they sleep, µs [default: the runtime's].
    #[arg(long)]
    pub spin_us: Option<u64>,
    /// Computation added to every request after its key-value operation, ns (busy-waiting).
    #[arg(long, default_value_t = 0)]
    pub work_ns: u64,
    /// Pin the workers to this CPU.
    #[arg(long)]
    pub pin_cpu: Option<usize>,
    /// Pin the process's other threads (this one, which answers the commands, and the
    /// runtime's acceptor, which polls every connection's socket) to this CPU, away from the
    /// workers'.
    #[arg(long)]
    pub helper_cpu: Option<usize>,
}

impl ServerArgs {
    /// The server configuration these arguments describe.
    pub fn config(&self) -> ServerConfig {
        let slo = self.slo_ns.map(|target| {
            let mut slo =
                Slo::new(Duration::from_nanos(target)).mean_request_bytes(self.request_bytes);
            if let Some(s) = self.service_ns {
                slo = slo.mean_service(Duration::from_nanos(s));
            }
            slo
        });
        let mut wait = netless::WaitPolicy::default();
        if let Some(us) = self.spin_us {
            wait.spin = Duration::from_micros(us);
        }
        ServerConfig {
            workers: self.workers,
            wait,
            buffer_bytes: self.buffer_bytes,
            provisioning: self.provisioning.into(),
            dispatch: self.dispatch.into(),
            slo,
            max_connections: self.max_connections,
            dir: Some(self.dir.clone()),
            pin_cpus: self.pin_cpu.into_iter().collect(),
            ..ServerConfig::default()
        }
    }
}

/// The server's counters, as the `stats` command prints them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub(super) struct Stats {
    /// Connections open.
    pub connections: u32,
    /// Requests answered.
    pub requests: u64,
    /// Requests the handler failed.
    pub errors: u64,
    /// Queue entries or requests dropped as corrupt or unattributable.
    pub dropped: u64,
    /// Connections closed for violating the protocol.
    pub protocol_violations: u64,
    /// Receive-buffer bytes provisioned for the open connections.
    pub receive_buffer_bytes: u64,
    /// Blocks of the receive buffer in the mapped segment (all partitions).
    pub total_blocks: u32,
    /// NACKs, as the clients count them in the replica's shared memory.
    pub nacks: u64,
    /// The queue-depth limit in force (0: none).
    pub depth_limit: u32,
    /// Resident memory of the server process, bytes.
    pub rss_bytes: u64,
}

/// What the `window` command reports: the server-side latency (send to end of handler) of
/// the recorded requests since the previous `window`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct ServerWindow {
    /// Latency summary.
    pub latency: Latency,
    /// The latency at the quantile the command asked for, µs (0 without requests).
    pub at_quantile_us: f64,
}

/// Result of `calibrate`: the handler's own time, with no transport.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Calibration {
    /// Requests timed.
    pub requests: u64,
    /// Mean handler time of a `Get`, ns.
    pub get_ns: f64,
    /// Mean handler time of a `Set`, ns.
    pub set_ns: f64,
    /// Mean of the 50/50 mix, ns.
    pub mean_ns: f64,
}

/// Runs the key-value operation of `n` random requests (half `Get`, half `Set`) in this
/// thread and times them.
pub(super) fn calibrate(store: &Store, n: u64) -> Calibration {
    let keys = store.len() as u64;
    let mut body = vec![0u8; KEY_BYTES + VALUE_BYTES];
    let mut out = Vec::with_capacity(VALUE_BYTES);
    let (mut get, mut set) = ((0u64, Duration::ZERO), (0u64, Duration::ZERO));
    for k in 0..n {
        let r = mix64(k ^ 0xca1b);
        let i = (r >> 1) % keys.max(1);
        let is_set = r & 1 == 1;
        body[..KEY_BYTES].copy_from_slice(&key_of(i));
        if is_set {
            fill_value(&mut body[KEY_BYTES..], i, k);
        }
        let mut resp = ResponseBuilder::default();
        resp.payload = std::mem::take(&mut out);
        resp.payload.clear();
        let started = Instant::now();
        let result = if is_set {
            store.handle(SET, &body, &mut resp)
        } else {
            store.handle(GET, &body[..KEY_BYTES], &mut resp)
        };
        let took = started.elapsed();
        debug_assert!(result.is_ok());
        out = std::mem::take(&mut resp.payload);
        let acc = if is_set { &mut set } else { &mut get };
        acc.0 += 1;
        acc.1 += took;
    }
    let mean = |(n, t): (u64, Duration)| t.as_nanos() as f64 / n.max(1) as f64;
    Calibration {
        requests: n,
        get_ns: mean(get),
        set_ns: mean(set),
        mean_ns: (mean(get) + mean(set)) / 2.0,
    }
}

/// Resident set size of this process, bytes (0 if unknown).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * rustix::param::page_size() as u64)
}

/// The handler: the key-value operation, the added work, and the server-side latency of
/// recorded requests.
fn handler(
    store: Arc<Store>,
    work: Duration,
    recorded: Arc<Mutex<Histogram<u64>>>,
) -> impl Fn(&Request<'_>, &mut ResponseBuilder<'_>) -> Result<(), Status> + Send + Sync + 'static {
    move |req: &Request<'_>, resp: &mut ResponseBuilder<'_>| {
        let (body, stamp) = Stamp::split(req.payload)
            .ok_or_else(|| Status::invalid_argument("request without its stamp"))?;
        let result = store.handle(req.method, body, resp);
        if !work.is_zero() {
            let started = Instant::now();
            while started.elapsed() < work {
                std::hint::spin_loop();
            }
        }
        if stamp.measured {
            let ns = netless_shm::monotonic_ns().saturating_sub(stamp.sent_ns);
            recorded
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .saturating_record(ns.max(1));
        }
        result
    }
}

/// The `server` peer role: serves the store until stdin ends.
pub(super) fn serve(args: ServerArgs) -> anyhow::Result<()> {
    if let Some(cpu) = args.helper_cpu {
        // Before binding: the acceptor thread inherits it (the workers are pinned by the
        // runtime, from `ServerConfig::pin_cpus`).
        netless_shm::pin_current_thread(cpu)?;
    }
    let store = Arc::new(Store::preload(args.keys));
    let recorded = Arc::new(Mutex::new(new_histogram()));
    let work = Duration::from_nanos(args.work_ns);
    let server = Server::bind(
        &args.service,
        args.config(),
        handler(store.clone(), work, recorded.clone()),
    )
    .with_context(|| format!("serving `{}`", args.service))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "LISTENING {}", args.service)?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let mut words = line.split_whitespace();
        let reply = match words.next() {
            Some("stats") => {
                let s = server.stats();
                serde_json::to_string(&Stats {
                    connections: s.connections,
                    requests: s.requests,
                    errors: s.errors,
                    dropped: s.dropped,
                    protocol_violations: s.protocol_violations,
                    receive_buffer_bytes: s.receive_buffer_bytes,
                    total_blocks: s.total_blocks,
                    nacks: s.nacks,
                    depth_limit: s.depth_limit,
                    rss_bytes: rss_bytes(),
                })?
            }
            Some("window") => {
                let q: f64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0.99);
                let mut h = recorded.lock().unwrap_or_else(|e| e.into_inner());
                let w = ServerWindow {
                    latency: Latency::of(&h),
                    at_quantile_us: if h.is_empty() {
                        0.0
                    } else {
                        h.value_at_quantile(q.clamp(0.0, 1.0)) as f64 / 1e3
                    },
                };
                h.reset();
                serde_json::to_string(&w)?
            }
            Some("calibrate") => {
                let n = words.next().and_then(|w| w.parse().ok()).unwrap_or(100_000);
                serde_json::to_string(&calibrate(&store, n))?
            }
            _ => anyhow::bail!("unknown command {line:?}"),
        };
        writeln!(out, "{reply}")?;
        out.flush()?;
    }
    server.shutdown();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(store: &Store, method: &str, body: &[u8]) -> Result<Vec<u8>, Status> {
        let mut resp = ResponseBuilder::default();
        store.handle(method, body, &mut resp)?;
        Ok(resp.payload)
    }

    #[test]
    fn get_returns_what_set_stored() {
        let store = Store::preload(1000);
        assert_eq!(store.len(), 1000);
        let v = call(&store, GET, &key_of(7)).unwrap();
        assert_eq!(v.len(), VALUE_BYTES);
        assert_eq!(value_key(&v), Some(7));
        let mut set = key_of(7).to_vec();
        let mut value = [0u8; VALUE_BYTES];
        fill_value(&mut value, 7, 99);
        set.extend_from_slice(&value);
        assert!(call(&store, SET, &set).unwrap().is_empty());
        assert_eq!(call(&store, GET, &key_of(7)).unwrap(), value.to_vec());
        // Every preloaded key is found; others are not.
        for i in 0..1000 {
            assert!(store.find(&key_of(i)).is_some(), "{i}");
        }
        let missing = call(&store, GET, &key_of(1000)).unwrap_err();
        assert_eq!(missing.code(), netless::Code::NotFound);
        assert_eq!(
            call(&store, SET, &key_of(1)).unwrap_err().code(),
            netless::Code::InvalidArgument
        );
        assert_eq!(
            call(&store, "Del", &key_of(1)).unwrap_err().code(),
            netless::Code::Unimplemented
        );
    }

    #[test]
    fn the_handler_strips_and_records_the_stamp() {
        let recorded = Arc::new(Mutex::new(new_histogram()));
        let h = handler(
            Arc::new(Store::preload(16)),
            Duration::from_micros(5),
            recorded.clone(),
        );
        let mut payload = key_of(3).to_vec();
        let sent = netless_shm::monotonic_ns();
        payload.extend_from_slice(
            &Stamp {
                sent_ns: sent,
                measured: true,
            }
            .to_bytes(),
        );
        let req = Request {
            method: GET,
            metadata: Metadata::default(),
            payload: &payload,
            deadline: None,
        };
        let mut resp = ResponseBuilder::default();
        h(&req, &mut resp).unwrap();
        assert_eq!(value_key(&resp.payload), Some(3));
        let recorded = recorded.lock().unwrap();
        assert_eq!(recorded.len(), 1);
        // The added work (5 µs) is inside the recorded time.
        assert!(recorded.max() >= 5_000, "{}", recorded.max());
        assert_eq!(
            Stamp::split(&payload).map(|(b, s)| (b.len(), s.measured)),
            Some((KEY_BYTES, true))
        );
    }

    #[test]
    fn calibration_times_both_methods() {
        let store = Store::preload(4096);
        let c = calibrate(&store, 2000);
        assert_eq!(c.requests, 2000);
        assert!(c.get_ns > 0.0 && c.set_ns > 0.0, "{c:?}");
    }
}
