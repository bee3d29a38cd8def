//! Helpers the multi-process pool tests share: payload patterns, Refs over a pipe as hex,
//! the children's report lines and a bounded wait.

use std::io::Write;
use std::time::{Duration, Instant};

use netless_pool::Ref;

/// How long anything that should be prompt may take on a loaded two-core machine.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// `len` bytes determined by `seed`.
pub(crate) fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn ref_from_hex(s: &str) -> Ref {
    let bytes: Vec<u8> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect();
    Ref::from_bytes(&bytes).unwrap()
}

pub(crate) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "@@{line}").unwrap();
    out.flush().unwrap();
}

/// Polls `cond` until it holds; panics with `what` after [`PATIENCE`].
pub(crate) fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
