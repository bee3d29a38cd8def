//! Result rows of a latency experiment: one [`Row`] per (transport, payload size), built
//! from an HdrHistogram of per-call wall times in nanoseconds, printed as an aligned table
//! (with the p50 speed-up over a baseline transport) and written as JSON.
//!
//! JSON shape (see [`write_json`]):
//!
//! ```json
//! {"experiment":"echo",
//!  "machine":{"cpu_model":"…","nproc":2,"kernel":"6.8.0-…"},
//!  "rows":[{"transport":"grpc-http2","payload_bytes":64,"calls":10000,
//!           "avg_us":121.3,"p50_us":118.9,"p99_us":160.2,"p999_us":310.5,
//!           "speedup_vs_baseline_p50":1.0}, …]}
//! ```
//!
//! `speedup_vs_baseline_p50` is only present when a baseline is given
//! ([`write_json_with_baseline`]); it is `null` when the baseline has no row for that
//! payload size.

use std::io::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest value a latency histogram can hold: 60 s in nanoseconds.
pub const HISTOGRAM_MAX_NS: u64 = 60_000_000_000;

/// A latency histogram in nanoseconds, 1 ns .. 60 s, 3 significant figures.
///
/// Record with `hist.saturating_record(ns)` so an outlier above 60 s cannot fail a run.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, HISTOGRAM_MAX_NS, 3)
        .expect("valid histogram bounds (1 ns .. 60 s, 3 significant figures)")
}

/// One line of a latency table: a transport at one payload size.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Row {
    /// Transport name, e.g. `grpc-http2`, `shm`, `floor`.
    pub transport: String,
    /// Payload size of each call, in bytes.
    pub payload_bytes: usize,
    /// Number of recorded calls.
    pub calls: u64,
    /// Mean latency, µs.
    pub avg_us: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// 99.9th percentile, µs.
    pub p999_us: f64,
}

impl Row {
    /// Summarises `hist`, whose values are nanoseconds. An empty histogram gives zeros.
    pub fn from_histogram(transport: &str, payload_bytes: usize, hist: &Histogram<u64>) -> Row {
        let us = |ns: u64| ns as f64 / 1_000.0;
        let empty = hist.is_empty();
        let q = |quantile: f64| {
            if empty {
                0.0
            } else {
                us(hist.value_at_quantile(quantile))
            }
        };
        Row {
            transport: transport.to_string(),
            payload_bytes,
            calls: hist.len(),
            avg_us: if empty { 0.0 } else { hist.mean() / 1_000.0 },
            p50_us: q(0.5),
            p99_us: q(0.99),
            p999_us: q(0.999),
        }
    }
}

/// Speed-up of `row` over the baseline transport at the same payload size:
/// baseline p50 / row p50. `None` when `rows` holds no baseline row for that payload size
/// (the first matching one is used) or a p50 is zero.
pub fn speedup_vs(rows: &[Row], baseline_transport: &str, row: &Row) -> Option<f64> {
    let base = rows
        .iter()
        .find(|r| r.transport == baseline_transport && r.payload_bytes == row.payload_bytes)?;
    if base.p50_us > 0.0 && row.p50_us > 0.0 {
        Some(base.p50_us / row.p50_us)
    } else {
        None
    }
}

/// A latency in µs: 3 decimals below 1 µs, 2 below 100 µs, 1 above.
pub fn fmt_us(us: f64) -> String {
    if us < 1.0 {
        format!("{us:.3}")
    } else if us < 100.0 {
        format!("{us:.2}")
    } else {
        format!("{us:.1}")
    }
}

/// A payload size: `64 B`, `4 KiB`, `1.5 MiB`.
pub fn fmt_bytes(n: usize) -> String {
    const KIB: usize = 1024;
    const MIB: usize = 1024 * 1024;
    if n >= MIB && n & (MIB - 1) == 0 {
        format!("{} MiB", n / MIB)
    } else if n >= MIB {
        format!("{:.1} MiB", n as f64 / MIB as f64)
    } else if n >= KIB && n & (KIB - 1) == 0 {
        format!("{} KiB", n / KIB)
    } else if n >= KIB {
        format!("{:.1} KiB", n as f64 / KIB as f64)
    } else {
        format!("{n} B")
    }
}

fn fmt_speedup(row: &Row, rows: &[Row], baseline_transport: &str) -> String {
    if row.transport == baseline_transport {
        return "1.0×".to_string();
    }
    match speedup_vs(rows, baseline_transport, row) {
        Some(x) if x < 1.0 => format!("{x:.2}×"),
        Some(x) => format!("{x:.1}×"),
        None => "-".to_string(),
    }
}

/// Renders the table printed by [`print_table`] (without a trailing newline).
pub fn format_table(title: &str, rows: &[Row], baseline_transport: &str) -> String {
    let header: Vec<String> = vec![
        "transport".into(),
        "payload".into(),
        "calls".into(),
        "avg µs".into(),
        "p50 µs".into(),
        "p99 µs".into(),
        "p999 µs".into(),
        format!("speed-up vs {baseline_transport} (p50)"),
    ];
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.transport.clone(),
                fmt_bytes(r.payload_bytes),
                r.calls.to_string(),
                fmt_us(r.avg_us),
                fmt_us(r.p50_us),
                fmt_us(r.p99_us),
                fmt_us(r.p999_us),
                fmt_speedup(r, rows, baseline_transport),
            ]
        })
        .collect();

    let width = |s: &str| s.chars().count();
    let mut widths: Vec<usize> = header.iter().map(|h| width(h)).collect();
    for line in &body {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(width(cell));
        }
    }
    // Column 0 (transport) is left-aligned, the figures right-aligned.
    let render = |cells: &[String]| -> String {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            let pad = " ".repeat(w - width(cell));
            if i > 0 {
                out.push_str("  ");
            }
            if i == 0 {
                out.push_str(cell);
                out.push_str(&pad);
            } else {
                out.push_str(&pad);
                out.push_str(cell);
            }
        }
        out.trim_end().to_string()
    };

    let total: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
    let mut out = String::new();
    out.push_str(title);
    out.push('\n');
    out.push_str(&render(&header));
    out.push('\n');
    out.push_str(&"-".repeat(total));
    for line in &body {
        out.push('\n');
        out.push_str(&render(line));
    }
    out
}

/// Prints an aligned table of `rows` to stdout, with a last column giving the p50
/// speed-up over `baseline_transport` at the same payload size.
pub fn print_table(title: &str, rows: &[Row], baseline_transport: &str) {
    println!("{}", format_table(title, rows, baseline_transport));
}

/// The machine the figures were taken on, read from `/proc`.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Machine {
    /// `model name` of the first CPU in `/proc/cpuinfo`, or `unknown`.
    pub cpu_model: String,
    /// Number of online CPUs (`processor` entries in `/proc/cpuinfo`).
    pub nproc: usize,
    /// Kernel release (`/proc/sys/kernel/osrelease`), or `unknown`.
    pub kernel: String,
}

impl Machine {
    /// Reads the current machine's description. Never fails: missing fields are `unknown`.
    pub fn current() -> Machine {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".to_string());
        // Online CPUs of the machine, not of this thread (which may be pinned).
        let nproc = std::fs::read_to_string("/proc/cpuinfo")
            .map(|s| s.lines().filter(|l| l.starts_with("processor")).count())
            .ok()
            .filter(|&n| n > 0)
            .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
            .unwrap_or(0);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".to_string());
        Machine {
            cpu_model,
            nproc,
            kernel,
        }
    }
}

#[derive(Serialize)]
struct JsonRow<'a> {
    #[serde(flatten)]
    row: &'a Row,
    #[serde(skip_serializing_if = "Option::is_none")]
    speedup_vs_baseline_p50: Option<Option<f64>>,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    experiment: &'a str,
    machine: Machine,
    rows: Vec<JsonRow<'a>>,
}

fn report<'a>(
    experiment: &'a str,
    rows: &'a [Row],
    baseline_transport: Option<&str>,
) -> JsonReport<'a> {
    JsonReport {
        experiment,
        machine: Machine::current(),
        rows: rows
            .iter()
            .map(|row| JsonRow {
                row,
                speedup_vs_baseline_p50: baseline_transport.map(|b| speedup_vs(rows, b, row)),
            })
            .collect(),
    }
}

/// The JSON document [`write_json`] (baseline `None`) or [`write_json_with_baseline`]
/// writes, pretty printed, fields in the documented order.
pub fn to_json_string(experiment: &str, rows: &[Row], baseline_transport: Option<&str>) -> String {
    serde_json::to_string_pretty(&report(experiment, rows, baseline_transport))
        .expect("a report always serialises")
}

/// Writes `{"experiment":…,"machine":{…},"rows":[{transport, payload_bytes, calls, avg_us,
/// p50_us, p99_us, p999_us}, …]}` (pretty printed) to `path`.
pub fn write_json(path: &Path, experiment: &str, rows: &[Row]) -> std::io::Result<()> {
    write_json_with_baseline(path, experiment, rows, None)
}

/// Like [`write_json`]; with `Some(baseline)`, every row also gets a
/// `speedup_vs_baseline_p50` field (`null` when the baseline has no row at that payload
/// size).
pub fn write_json_with_baseline(
    path: &Path,
    experiment: &str,
    rows: &[Row],
    baseline_transport: Option<&str>,
) -> std::io::Result<()> {
    write_string(path, &to_json_string(experiment, rows, baseline_transport))
}

fn write_string(path: &Path, json: &str) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(json.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()
}

/// An aligned table (header, a rule, the rows): the first column left-aligned, the others
/// right-aligned, two spaces apart; widths count characters, not bytes.
pub fn aligned_table(header: &[String], body: &[Vec<String>]) -> String {
    let width = |s: &str| s.chars().count();
    let mut widths: Vec<usize> = header.iter().map(|h| width(h)).collect();
    for line in body {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(width(cell));
        }
    }
    let line = |cells: &[String]| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            let pad = " ".repeat(w - width(cell));
            if i == 0 {
                out.push_str(cell);
                out.push_str(&pad);
            } else {
                out.push_str("  ");
                out.push_str(&pad);
                out.push_str(cell);
            }
        }
        out.trim_end().to_string()
    };
    let mut out = line(header);
    out.push('\n');
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
    for cells in body {
        out.push('\n');
        out.push_str(&line(cells));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(transport: &str, payload_bytes: usize, p50_us: f64) -> Row {
        Row {
            transport: transport.into(),
            payload_bytes,
            calls: 10,
            avg_us: p50_us,
            p50_us,
            p99_us: p50_us * 2.0,
            p999_us: p50_us * 3.0,
        }
    }

    #[test]
    fn from_histogram_converts_ns_to_us() {
        let mut h = new_histogram();
        for ns in [1_000u64, 2_000, 3_000, 4_000] {
            h.record(ns).unwrap();
        }
        let r = Row::from_histogram("x", 64, &h);
        assert_eq!(r.calls, 4);
        assert!((r.avg_us - 2.5).abs() < 0.01, "{r:?}");
        assert!((r.p50_us - 2.0).abs() < 0.01, "{r:?}");
        assert!((r.p999_us - 4.0).abs() < 0.01, "{r:?}");
        let empty = Row::from_histogram("x", 64, &new_histogram());
        assert_eq!((empty.calls, empty.p50_us, empty.avg_us), (0, 0.0, 0.0));
    }

    #[test]
    fn speedup_is_baseline_p50_over_row_p50_at_same_payload() {
        let rows = vec![
            row("grpc", 64, 120.0),
            row("grpc", 4096, 150.0),
            row("shm", 64, 2.0),
            row("shm", 4096, 3.0),
            row("shm", 65536, 10.0),
        ];
        assert_eq!(speedup_vs(&rows, "grpc", &rows[0]), Some(1.0));
        assert_eq!(speedup_vs(&rows, "grpc", &rows[2]), Some(60.0));
        assert_eq!(speedup_vs(&rows, "grpc", &rows[3]), Some(50.0));
        assert_eq!(speedup_vs(&rows, "grpc", &rows[4]), None);
        assert_eq!(speedup_vs(&rows, "nope", &rows[2]), None);

        let table = format_table("echo", &rows, "grpc");
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "echo");
        assert!(lines[1].ends_with("speed-up vs grpc (p50)"), "{table}");
        assert!(lines[3].ends_with("1.0×"), "{table}");
        assert!(lines[5].ends_with("60.0×"), "{table}");
        assert!(lines[7].ends_with('-'), "{table}");
        // Aligned: every data line is as wide as the header line (right-aligned last column).
        let w = lines[1].chars().count();
        assert!(lines[3..].iter().all(|l| l.chars().count() == w), "{table}");
    }

    #[test]
    fn number_formats() {
        assert_eq!(fmt_us(0.3124), "0.312");
        assert_eq!(fmt_us(12.345), "12.35");
        assert_eq!(fmt_us(123.45), "123.5");
        assert_eq!(fmt_bytes(64), "64 B");
        assert_eq!(fmt_bytes(4096), "4 KiB");
        assert_eq!(fmt_bytes(1 << 20), "1 MiB");
    }

    #[test]
    fn json_shape() {
        let rows = vec![
            row("grpc", 64, 120.0),
            row("shm", 64, 2.0),
            row("shm", 128, 2.0),
        ];
        let text = to_json_string("echo", &rows, None);
        // Fields in the documented order, not alphabetical.
        let (e, m, r) = (
            text.find("\"experiment\"").unwrap(),
            text.find("\"machine\"").unwrap(),
            text.find("\"rows\"").unwrap(),
        );
        assert!(e < m && m < r, "{text}");
        let t = text.find("\"transport\"").unwrap();
        assert!(t < text.find("\"payload_bytes\"").unwrap(), "{text}");
        assert!(text.find("\"p99_us\"").unwrap() < text.find("\"p999_us\"").unwrap());
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["experiment"], "echo");
        assert!(v["machine"]["nproc"].as_u64().is_some());
        let r0 = v["rows"][0].as_object().unwrap();
        let mut keys: Vec<&str> = r0.keys().map(|k| k.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "avg_us",
                "calls",
                "p50_us",
                "p999_us",
                "p99_us",
                "payload_bytes",
                "transport"
            ]
        );
        assert_eq!(r0["transport"], "grpc");
        assert_eq!(r0["payload_bytes"], 64);
        assert_eq!(r0["calls"], 10);
        assert_eq!(r0["p50_us"], 120.0);

        let v: serde_json::Value =
            serde_json::from_str(&to_json_string("echo", &rows, Some("grpc"))).unwrap();
        assert_eq!(v["rows"][0]["speedup_vs_baseline_p50"], 1.0);
        assert_eq!(v["rows"][1]["speedup_vs_baseline_p50"], 60.0);
        assert!(v["rows"][2]["speedup_vs_baseline_p50"].is_null());
        assert!(v["rows"][2]
            .as_object()
            .unwrap()
            .contains_key("speedup_vs_baseline_p50"));

        let path = std::env::temp_dir().join(format!("netless-report-{}.json", std::process::id()));
        write_json(&path, "echo", &rows).unwrap();
        let back: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).ok();
        assert_eq!(back["experiment"], "echo");
        assert_eq!(back["rows"].as_array().unwrap().len(), 3);
        assert_eq!(back["rows"][1]["transport"], "shm");
    }
}
