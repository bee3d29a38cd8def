//! Metrics in the Prometheus text exposition format (version 0.0.4): the writer that both
//! `netless stat --prometheus` and the gateway's `/metrics` use, the gateway's histogram,
//! and a replica's shared-memory counters ([`ReplicaStats`]) as metric families.
//!
//! Names follow gRFC A66 (the OpenTelemetry gRPC metrics) mapped to Prometheus: dots
//! become underscores, counters end in `_total`, durations are in seconds
//! (`grpc_server_call_duration_seconds`), and the labels are `grpc_method` (the full
//! method, `pkg.Service/Method`), `grpc_status` (the status code's name, `OK`) and, for a
//! client, `grpc_target`. What netless counts that A66 does not name goes under `netless_`.
//!
//! ```
//! use netless_grpc::prometheus::{Exposition, Kind};
//! let mut out = Exposition::new();
//! out.family("demo_calls_total", Kind::Counter, "Calls.");
//! out.sample("demo_calls_total", &[("grpc_method", "a.B/C")], 3u64);
//! assert_eq!(
//!     out.finish(),
//!     "# HELP demo_calls_total Calls.\n# TYPE demo_calls_total counter\n\
//!      demo_calls_total{grpc_method=\"a.B/C\"} 3\n"
//! );
//! ```

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use netless::ReplicaStats;

/// The `Content-Type` of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The upper bounds of the duration histograms' buckets: 250 ns to 10 s in steps of 2, 2.5
/// and 2 (1-2.5-5 a decade), fine enough below a microsecond for netless calls and wide
/// enough for calls that wait on the network. One set everywhere, so that histograms from
/// the gateway and from replicas can be added up.
pub const DURATION_BUCKETS: [Duration; 24] = {
    const NS: [u64; 24] = [
        250,
        500,
        1_000,
        2_500,
        5_000,
        10_000,
        25_000,
        50_000,
        100_000,
        250_000,
        500_000,
        1_000_000,
        2_500_000,
        5_000_000,
        10_000_000,
        25_000_000,
        50_000_000,
        100_000_000,
        250_000_000,
        500_000_000,
        1_000_000_000,
        2_500_000_000,
        5_000_000_000,
        10_000_000_000,
    ];
    let mut out = [Duration::ZERO; 24];
    let mut i = 0;
    while i < NS.len() {
        out[i] = Duration::from_nanos(NS[i]);
        i += 1;
    }
    out
};

/// A metric family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (restarts at zero with its process); the name ends in `_total`.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Cumulative buckets (`_bucket{le}`), `_sum` and `_count`.
    Histogram,
}

/// A sample's value: a count or a measurement.
pub trait Value {
    /// Writes the value as the text format spells it.
    fn write(&self, out: &mut String);
}

impl Value for u64 {
    fn write(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
}

impl Value for f64 {
    fn write(&self, out: &mut String) {
        if self.is_nan() {
            out.push_str("NaN");
        } else if self.is_infinite() {
            out.push_str(if *self > 0.0 { "+Inf" } else { "-Inf" });
        } else {
            let _ = write!(out, "{self}");
        }
    }
}

/// A text-format document being written: families one after the other, each a `# HELP`
/// and a `# TYPE` line and then its samples.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// An empty document.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Starts family `name` (`[a-zA-Z_:][a-zA-Z0-9_:]*`): its samples follow, none of
    /// another family between them.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        debug_assert!(is_metric_name(name), "{name}");
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = write!(self.out, "# HELP {name} ");
        for c in help.chars() {
            match c {
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                c => self.out.push(c),
            }
        }
        let _ = writeln!(self.out, "\n# TYPE {name} {kind}");
    }

    /// One sample of the current family: `name{labels} value`. Label names are the
    /// caller's constants; their values are escaped here.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Value) {
        self.out.push_str(name);
        self.labels(labels, None);
        self.out.push(' ');
        value.write(&mut self.out);
        self.out.push('\n');
    }

    /// The samples of one histogram of the current family `name`: `buckets` are `(upper
    /// bound, cumulative count)` in increasing order (the `+Inf` bucket, `count`, is added
    /// here), then `_sum` and `_count`.
    pub fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        buckets: impl IntoIterator<Item = (f64, u64)>,
        sum: f64,
        count: u64,
    ) {
        let mut le = String::new();
        for (bound, n) in buckets.into_iter().chain([(f64::INFINITY, count)]) {
            le.clear();
            bound.write(&mut le);
            let _ = write!(self.out, "{name}_bucket");
            self.labels(labels, Some(&le));
            let _ = writeln!(self.out, " {n}");
        }
        let _ = write!(self.out, "{name}_sum");
        self.labels(labels, None);
        self.out.push(' ');
        sum.write(&mut self.out);
        let _ = write!(self.out, "\n{name}_count");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {count}");
    }

    /// The document.
    pub fn finish(self) -> String {
        self.out
    }

    fn labels(&mut self, labels: &[(&str, &str)], le: Option<&str>) {
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let all = labels.iter().copied().chain(le.map(|le| ("le", le)));
        for (i, (name, value)) in all.enumerate() {
            debug_assert!(is_label_name(name), "{name}");
            if i > 0 {
                self.out.push(',');
            }
            self.out.push_str(name);
            self.out.push_str("=\"");
            for c in value.chars() {
                match c {
                    '\\' => self.out.push_str("\\\\"),
                    '"' => self.out.push_str("\\\""),
                    '\n' => self.out.push_str("\\n"),
                    c => self.out.push(c),
                }
            }
            self.out.push('"');
        }
        self.out.push('}');
    }
}

fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(name: &str) -> bool {
    is_metric_name(name) && !name.contains(':') && !name.starts_with("__")
}

/// A duration histogram with the [`DURATION_BUCKETS`], updated with relaxed atomics from
/// any thread (each observation: two additions and a bucket's increment).
#[derive(Debug, Default)]
pub(crate) struct Histogram {
    /// Per bucket, and one past the last bound; not cumulative.
    counts: [AtomicU64; DURATION_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    pub(crate) fn observe(&self, elapsed: Duration) {
        let i = DURATION_BUCKETS.partition_point(|b| *b < elapsed);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Adds `other`'s observations to this one.
    pub(crate) fn absorb(&self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter().zip(&other.counts) {
            mine.fetch_add(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        let sum = other.sum_ns.load(Ordering::Relaxed);
        self.sum_ns.fetch_add(sum, Ordering::Relaxed);
    }

    /// Observations so far.
    pub(crate) fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Writes its samples (the count is the buckets' total, so `+Inf` and `_count` agree
    /// even while observations land).
    pub(crate) fn write(&self, out: &mut Exposition, name: &str, labels: &[(&str, &str)]) {
        let mut total = 0u64;
        let buckets: Vec<(f64, u64)> = DURATION_BUCKETS
            .iter()
            .zip(&self.counts)
            .map(|(bound, n)| {
                total += n.load(Ordering::Relaxed);
                (bound.as_secs_f64(), total)
            })
            .collect();
        let count = total + self.counts[DURATION_BUCKETS.len()].load(Ordering::Relaxed);
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        out.histogram(name, labels, buckets, sum, count);
    }
}

/// One replica's counters to export, and the labels that tell it from the others.
#[derive(Debug)]
pub struct Replica<'a> {
    /// Labels of every sample of this replica, such as `netless_service`.
    pub labels: Vec<(&'static str, &'a str)>,
    /// Its counters, as read from shared memory.
    pub stats: &'a ReplicaStats,
    /// Connections to leave out of its count (the reader's own).
    pub own_connections: u32,
}

/// Writes `replicas`' counters as metric families, family by family.
///
/// What a replica's shared memory records decides what can be labelled: calls and their
/// status codes (exactly, every call), bytes, NACKs, queue entries, and the service time of
/// **one queue entry in 16** (a batch is one entry), which stays a sample so that the hot
/// path reads no clock for the other fifteen. Nothing is recorded per method. So:
///
/// - `grpc_server_call_started_total` (with `grpc_families`): calls answered, counted when
///   the handler returns (a deferred reply: when it is deferred); for a gRPC service served
///   by `GrpcServer`, a call that becomes a stream adds the netless calls of its stream
///   operations (`recv`, `send`, ...);
/// - `netless_server_calls_total{grpc_status}`: the same calls by the status of the
///   netless reply (for a gRPC service served by `GrpcServer` the gRPC status travels in
///   its trailers, so failures the service reports count as `OK` here);
/// - `netless_server_sampled_service_duration_seconds`: the sampled service times, a
///   histogram whose `_count` is the number of samples, not of calls; each sample falls in
///   the first bucket whose bound it cannot exceed (the shared buckets are 4 per power of
///   two, so a bucket counts only samples known to be at most its bound), and `_sum` is
///   estimated from the middles of the shared buckets;
/// - bytes, NACKs, sleeps, queue entries as counters, connections, workers and the queue's
///   depth as gauges.
///
/// `grpc_families`: also write `grpc_server_call_started_total` (the gateway, whose own
/// family has that name, leaves it out).
pub fn write_replicas(out: &mut Exposition, replicas: &[Replica<'_>], grpc_families: bool) {
    type Count = fn(&ReplicaStats) -> u64;
    type Gauge = fn(&Replica<'_>) -> u64;
    if grpc_families {
        out.family(
            "grpc_server_call_started_total",
            Kind::Counter,
            "Netless calls the replica answered (counted when the handler returns; a gRPC \
             stream's operations are calls too).",
        );
        for r in replicas {
            out.sample("grpc_server_call_started_total", &r.labels, r.stats.calls);
        }
    }
    out.family(
        "netless_server_calls_total",
        Kind::Counter,
        "Calls the replica answered, by the status code of the netless reply.",
    );
    for r in replicas {
        for (code, n) in &r.stats.by_code {
            let mut labels = r.labels.clone();
            labels.push(("grpc_status", code.name()));
            out.sample("netless_server_calls_total", &labels, *n);
        }
    }
    let counters: [(&str, &str, Count); 5] = [
        (
            "netless_server_received_bytes_total",
            "Request bytes received (method, metadata and payload).",
            |s| s.bytes_in,
        ),
        (
            "netless_server_sent_bytes_total",
            "Response bytes sent (metadata and payload).",
            |s| s.bytes_out,
        ),
        (
            "netless_server_nacks_total",
            "Calls clients did not send because the replica's queue was too deep (NACKs).",
            |s| s.nacks,
        ),
        (
            "netless_server_sleeps_total",
            "Times a worker went to sleep (each wake-up costs a system call).",
            |s| s.sleeps,
        ),
        (
            "netless_server_queue_entries_total",
            "Queue entries taken (a batch of requests is one).",
            |s| s.entries,
        ),
    ];
    for (name, help, value) in counters {
        out.family(name, Kind::Counter, help);
        for r in replicas {
            out.sample(name, &r.labels, value(r.stats));
        }
    }
    let gauges: [(&str, &str, Gauge); 3] = [
        (
            "netless_server_connections",
            "Client connections open now.",
            |r| u64::from(r.stats.connections.saturating_sub(r.own_connections)),
        ),
        ("netless_server_workers", "Worker threads.", |r| {
            u64::from(r.stats.workers)
        }),
        ("netless_server_queue_depth", "Requests queued now.", |r| {
            r.stats.queue_depth
        }),
    ];
    for (name, help, value) in gauges {
        out.family(name, Kind::Gauge, help);
        for r in replicas {
            out.sample(name, &r.labels, value(r));
        }
    }
    let name = "netless_server_sampled_service_duration_seconds";
    out.family(
        name,
        Kind::Histogram,
        "Service times of one queue entry in 16 (time from taking a request to having sent \
         its reply); _count counts samples, not calls; _sum is estimated.",
    );
    for r in replicas {
        let (buckets, sum, count) = rebucket(r.stats);
        out.histogram(name, &r.labels, buckets, sum, count);
    }
}

/// The replica's sampled service times in the [`DURATION_BUCKETS`]: each shared bucket goes
/// to the first bound no sample in it can exceed; the sum from the shared buckets' middles.
fn rebucket(stats: &ReplicaStats) -> (Vec<(f64, u64)>, f64, u64) {
    let mut counts = [0u64; DURATION_BUCKETS.len()];
    let (mut sum, mut count) = (0f64, 0u64);
    for (from, below, n) in stats.latency_buckets() {
        if n == 0 {
            continue;
        }
        count = count.saturating_add(n);
        // Samples are whole nanoseconds: the largest in [from, below) is below - 1 ns.
        let most = below.map(|b| b.saturating_sub(Duration::from_nanos(1)));
        let middle = below.map_or(from, |b| (from + b) / 2);
        sum += middle.as_secs_f64() * n as f64;
        if let Some(most) = most {
            let i = DURATION_BUCKETS.partition_point(|bound| *bound < most);
            if let Some(c) = counts.get_mut(i) {
                *c = c.saturating_add(n);
            }
        }
    }
    let mut total = 0u64;
    let buckets = DURATION_BUCKETS
        .iter()
        .zip(counts)
        .map(|(bound, n)| {
            total = total.saturating_add(n);
            (bound.as_secs_f64(), total)
        })
        .collect();
    (buckets, sum, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_help_are_escaped() {
        let mut out = Exposition::new();
        out.family("x_total", Kind::Counter, "a \\ b\nc \"q\"");
        out.sample("x_total", &[("a", "q\"\\\nz")], 1u64);
        out.sample("x_total", &[], 2.5f64);
        let text = out.finish();
        assert_eq!(
            text,
            "# HELP x_total a \\\\ b\\nc \"q\"\n# TYPE x_total counter\n\
             x_total{a=\"q\\\"\\\\\\nz\"} 1\nx_total 2.5\n"
        );
    }

    #[test]
    fn histograms_are_cumulative_and_agree_with_their_count() {
        let h = Histogram::default();
        for ns in [100, 250, 251, 3_000, 20_000_000_000] {
            h.observe(Duration::from_nanos(ns));
        }
        assert_eq!(h.count(), 5);
        let mut out = Exposition::new();
        out.family("d_seconds", Kind::Histogram, "D.");
        h.write(&mut out, "d_seconds", &[("m", "x")]);
        let text = out.finish();
        assert!(
            text.contains("d_seconds_bucket{m=\"x\",le=\"0.00000025\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("d_seconds_bucket{m=\"x\",le=\"0.0000005\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("d_seconds_bucket{m=\"x\",le=\"0.000005\"} 4\n"),
            "{text}"
        );
        assert!(
            text.contains("d_seconds_bucket{m=\"x\",le=\"10\"} 4\n"),
            "{text}"
        );
        assert!(
            text.contains("d_seconds_bucket{m=\"x\",le=\"+Inf\"} 5\n"),
            "{text}"
        );
        assert!(text.contains("d_seconds_count{m=\"x\"} 5\n"), "{text}");
        assert!(text.contains("d_seconds_sum{m=\"x\"} 20.0000036"), "{text}");
        let other = Histogram::default();
        other.absorb(&h);
        assert_eq!(other.count(), 5);
    }

    #[test]
    fn sampled_buckets_go_where_no_sample_exceeds_the_bound() {
        let mut stats = ReplicaStats {
            latency: vec![0; 160],
            ..Default::default()
        };
        // Shared buckets: [192, 224), [224, 256), [1024, 1280), and the last, open one.
        let find = |stats: &ReplicaStats, ns: u64| {
            stats
                .latency_buckets()
                .position(|(from, below, _)| {
                    from.as_nanos() as u64 <= ns && below.is_none_or(|b| ns < b.as_nanos() as u64)
                })
                .unwrap()
        };
        for (ns, n) in [(200, 1), (250, 2), (1100, 4)] {
            let b = find(&stats, ns);
            stats.latency[b] += n;
        }
        stats.latency[159] += 8;
        let (buckets, sum, count) = rebucket(&stats);
        assert_eq!(count, 15);
        // 200 ns is at most 223: under 250 ns. 250 ns may be 255: under 500 ns.
        assert_eq!(buckets[0], (250e-9, 1));
        assert_eq!(buckets[1], (500e-9, 3));
        // 1100 ns may be 1279: under 2.5 µs. The open bucket is in +Inf only.
        assert_eq!(buckets[2], (1e-6, 3));
        assert_eq!(buckets[3], (2.5e-6, 7));
        assert_eq!(buckets.last().unwrap().1, 7);
        assert!(sum > 0.0);
    }
}
