//! Aligned text tables and the number formats the benchmarks' tables share (µs, byte
//! sizes). It lays out cells it is given; it never decides which columns a table has.

/// An aligned table (header, a rule, the rows): the first column left-aligned, the others
/// right-aligned, two spaces apart; widths count characters, not bytes.
pub fn aligned_table<H: AsRef<str>>(header: &[H], body: &[Vec<String>]) -> String {
    let width = |s: &str| s.chars().count();
    let mut widths: Vec<usize> = header.iter().map(|h| width(h.as_ref())).collect();
    for line in body {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(width(cell));
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
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
    let mut out = line(&mut header.iter().map(AsRef::as_ref));
    out.push('\n');
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
    for cells in body {
        out.push('\n');
        out.push_str(&line(&mut cells.iter().map(String::as_str)));
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align() {
        let t = aligned_table(
            &["setting", "Mrps"],
            &[
                vec!["B=1".into(), "1.00".into()],
                vec!["adaptive(32)".into(), "12.50".into()],
            ],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        let w = lines[0].chars().count();
        assert!(lines.iter().all(|l| l.chars().count() == w), "{t}");
        assert!(lines[3].starts_with("adaptive(32)  12.50"), "{t}");
    }

    #[test]
    fn number_formats() {
        assert_eq!(fmt_us(0.3124), "0.312");
        assert_eq!(fmt_us(12.345), "12.35");
        assert_eq!(fmt_us(123.45), "123.5");
        assert_eq!(fmt_bytes(64), "64 B");
        assert_eq!(fmt_bytes(4096), "4 KiB");
        assert_eq!(fmt_bytes(1 << 20), "1 MiB");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
    }
}
