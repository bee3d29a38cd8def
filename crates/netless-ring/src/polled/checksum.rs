//! CRC-32C (Castagnoli), the checksum of a polled ring's records: the SSE4.2 `crc32`
//! instruction where the CPU has it, a table otherwise (both give the same value).

/// The reflected CRC-32C polynomial.
const POLY: u32 = 0x82f6_3b78;

/// Byte-at-a-time table.
const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// A running CRC-32C.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Crc32c(u32);

impl Crc32c {
    pub(crate) fn new() -> Crc32c {
        Crc32c(!0)
    }

    /// Adds `bytes`.
    #[inline]
    pub(crate) fn update(self, bytes: &[u8]) -> Crc32c {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU has SSE4.2 (checked just above).
            return Crc32c(unsafe { update_sse42(self.0, bytes) });
        }
        Crc32c(update_table(self.0, bytes))
    }

    /// The checksum of everything added.
    #[inline]
    pub(crate) fn finish(self) -> u32 {
        !self.0
    }
}

fn update_table(mut crc: u32, bytes: &[u8]) -> u32 {
    for &b in bytes {
        crc = (crc >> 8) ^ TABLE[((crc ^ u32::from(b)) & 0xff) as usize];
    }
    crc
}

/// # Safety
/// The CPU has SSE4.2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn update_sse42(crc: u32, bytes: &[u8]) -> u32 {
    use core::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut crc64 = u64::from(crc);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        crc64 = _mm_crc32_u64(crc64, u64::from_le_bytes(word));
    }
    let mut crc = crc64 as u32;
    for &b in chunks.remainder() {
        crc = _mm_crc32_u8(crc, b);
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_value_and_both_paths_agree() {
        assert_eq!(Crc32c::new().update(b"123456789").finish(), 0xe306_9283);
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 31 + i / 7) as u8).collect();
        for len in [0, 1, 7, 8, 9, 63, 64, 65, 999, 1000] {
            let split = len / 3;
            let whole = !update_table(!0, &data[..len]);
            let parts = Crc32c::new()
                .update(&data[..split])
                .update(&data[split..len])
                .finish();
            assert_eq!(whole, parts, "len {len}");
        }
    }
}
