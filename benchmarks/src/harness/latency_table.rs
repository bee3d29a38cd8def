//! The latency table of sequential-call experiments: one [`Row`] per (transport, payload
//! size), built from a histogram of per-call wall times in nanoseconds, printed aligned with
//! the p50 speed-up over a baseline transport, and written as JSON. It never measures.
//!
//! JSON shape (see [`write_json`]):
//!
//! ```json
//! {"experiment":"echo",
//!  "machine":{"cpu_model":"…","nproc":2,"kernel":"6.8.0-…"},
//!  "rows":[{"transport":"grpc-http2","payload_bytes":64,"calls":10000,
//!           "avg_us":121.3,"p50_us":118.9,"p99_us":160.2,"p999_us":310.5}, …]}
//! ```

use std::path::Path;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::histogram::{mean_us, quantile_us};
use super::json::{self, Machine};
use super::table::{aligned_table, fmt_bytes, fmt_us};

/// One line of a latency table: a transport at one payload size.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Row {
    /// Transport name, e.g. `grpc-http2`, `netless-raw`, `floor`.
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
        Row {
            transport: transport.to_string(),
            payload_bytes,
            calls: hist.len(),
            avg_us: mean_us(hist),
            p50_us: quantile_us(hist, 0.5),
            p99_us: quantile_us(hist, 0.99),
            p999_us: quantile_us(hist, 0.999),
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
    let header = [
        "transport".to_string(),
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
    format!("{title}\n{}", aligned_table(&header, &body))
}

/// Prints an aligned table of `rows` to stdout, with a last column giving the p50
/// speed-up over `baseline_transport` at the same payload size.
pub fn print_table(title: &str, rows: &[Row], baseline_transport: &str) {
    println!("{}", format_table(title, rows, baseline_transport));
}

#[derive(Serialize)]
struct Report<'a> {
    experiment: &'a str,
    machine: Machine,
    rows: &'a [Row],
}

/// The JSON document [`write_json`] writes, pretty printed, fields in the documented order.
pub fn to_json_string(experiment: &str, rows: &[Row]) -> String {
    let report = Report {
        experiment,
        machine: Machine::current(),
        rows,
    };
    serde_json::to_string_pretty(&report).expect("a report always serialises")
}

/// Writes `{"experiment":…,"machine":{…},"rows":[{transport, payload_bytes, calls, avg_us,
/// p50_us, p99_us, p999_us}, …]}` (pretty printed) to `path`.
pub fn write_json(path: &Path, experiment: &str, rows: &[Row]) -> anyhow::Result<()> {
    json::write(
        path,
        &Report {
            experiment,
            machine: Machine::current(),
            rows,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::super::histogram::new_histogram;
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
    fn json_shape() {
        let rows = vec![
            row("grpc", 64, 120.0),
            row("shm", 64, 2.0),
            row("shm", 128, 2.0),
        ];
        let text = to_json_string("echo", &rows);
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
