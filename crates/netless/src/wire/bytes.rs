//! Byte-string comparison for the per-call paths, where a call to `bcmp` for a method name
//! of a few bytes costs more than the comparison itself.

/// `a == b` for the short byte strings of method names, without a call to `bcmp`: from 4
/// to 16 bytes, two overlapping loads of 4 or 8 bytes from each side.
#[inline(always)]
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let u32_at = |s: &[u8], at: usize| u32::from_ne_bytes(s[at..at + 4].try_into().unwrap());
    let u64_at = |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().unwrap());
    match n {
        4..=7 => u32_at(a, 0) == u32_at(b, 0) && u32_at(a, n - 4) == u32_at(b, n - 4),
        8..=16 => u64_at(a, 0) == u64_at(b, 0) && u64_at(a, n - 8) == u64_at(b, n - 8),
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_bytes_is_slice_equality() {
        let names: Vec<&[u8]> = vec![
            b"",
            b"a",
            b"abc",
            b"Echo",
            b"Echp",
            b"pcho",
            b"Echo2",
            b"netless.",
            b"netless!",
            b"/a.B/Method",
            b"/a.B/Methoe",
            b"0123456789abcdef",
            b"0123456789abcdeF",
            b"0123456789abcdefg",
            b"0123456789abcdefh",
        ];
        for a in &names {
            for b in &names {
                assert_eq!(same_bytes(a, b), a == b, "{a:?} vs {b:?}");
            }
        }
        // Every length up to 24, equal and differing in each single byte.
        for n in 0..=24usize {
            let a: Vec<u8> = (0..n as u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
            assert!(same_bytes(&a, &a.clone()), "length {n}");
            for i in 0..n {
                let mut b = a.clone();
                b[i] ^= 0x80;
                assert!(!same_bytes(&a, &b), "length {n}, byte {i}");
            }
        }
    }
}
