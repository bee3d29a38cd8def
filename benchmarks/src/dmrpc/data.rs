//! What the client and the tiers of `pass_by_reference` exchange and count: the arrays they
//! send (and the sums that check them), replies made of 64-bit words, and the counters of a
//! `stats` call. It never sends anything itself.

use netless::Status;
use netless_pool::{PoolError, SharedBuf};

/// `len` bytes of little-endian u32 words that do not sum to anything obvious.
pub(super) fn pattern(len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut i: u32 = 0;
    while v.len() + 4 <= len {
        v.extend_from_slice(&(i.wrapping_mul(2_654_435_761) ^ 0x5a5a_5a5a).to_le_bytes());
        i += 1;
    }
    v.resize(len, 0x5a);
    v
}

/// The sum of the little-endian u32 words of `bytes` (a trailing partial word is ignored).
pub(super) fn sum_words(bytes: &[u8]) -> u64 {
    bytes
        .chunks_exact(4)
        .map(|w| u64::from(u32::from_le_bytes([w[0], w[1], w[2], w[3]])))
        .sum()
}

/// [`sum_words`] of a pool buffer, read in place (pages are multiples of 4 bytes).
pub(super) fn sum_buf(buf: &SharedBuf) -> u64 {
    match buf.as_slice() {
        Some(s) => sum_words(s),
        None => buf.chunks().map(sum_words).sum(),
    }
}

/// The first and the last 8 bytes of a pool buffer (of at least 8 bytes), read in place.
pub(super) fn head_tail(buf: &SharedBuf) -> (u64, u64) {
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    if let Some(s) = buf.as_slice() {
        return (word(&s[..8]), word(&s[s.len() - 8..]));
    }
    let first = buf.chunks().next().expect("a page");
    let last = buf.chunks().last().expect("a page");
    (word(&first[..8]), word(&last[last.len() - 8..]))
}

pub(super) fn u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        .collect()
}

pub(super) fn to_bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

pub(super) fn pool_status(e: PoolError) -> Status {
    match e {
        PoolError::Exhausted(_) => Status::resource_exhausted(format!("pool: {e}")),
        e => Status::internal(format!("pool: {e}")),
    }
}

/// What one process counted (a `stats` reply, or this process's own figures).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Counts {
    /// Work calls it handled (not `stats`).
    pub(super) requests: u64,
    /// Calls it forwarded to a next tier.
    pub(super) forwarded: u64,
    /// Payload bytes it copied into netless messages it sent (by value).
    pub(super) payload_bytes: u64,
    /// Ref bytes it sent (by reference).
    pub(super) handle_bytes: u64,
    /// Refs it mapped.
    pub(super) maps: u64,
    /// `PoolStats::bytes_copied` of the process.
    pub(super) pool_bytes: u64,
    /// `PoolStats::pages_copied` of the process.
    pub(super) pool_pages: u64,
}

impl Counts {
    pub(super) fn fields(&self) -> [u64; 7] {
        [
            self.requests,
            self.forwarded,
            self.payload_bytes,
            self.handle_bytes,
            self.maps,
            self.pool_bytes,
            self.pool_pages,
        ]
    }

    pub(super) fn from_fields(f: &[u64]) -> Option<Counts> {
        let &[requests, forwarded, payload_bytes, handle_bytes, maps, pool_bytes, pool_pages] = f
        else {
            return None;
        };
        Some(Counts {
            requests,
            forwarded,
            payload_bytes,
            handle_bytes,
            maps,
            pool_bytes,
            pool_pages,
        })
    }

    pub(super) fn zip(self, other: Counts, f: impl Fn(u64, u64) -> u64) -> Counts {
        let (a, b) = (self.fields(), other.fields());
        let v: Vec<u64> = a.iter().zip(&b).map(|(&x, &y)| f(x, y)).collect();
        Counts::from_fields(&v).expect("7 fields")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_sums_and_counts_round_trip() {
        let data = pattern(4096);
        assert_eq!(data.len(), 4096);
        let expect: u64 = (0..1024u32)
            .map(|i| u64::from(i.wrapping_mul(2_654_435_761) ^ 0x5a5a_5a5a))
            .sum();
        assert_eq!(sum_words(&data), expect);
        let domain = netless_pool::Domain::private(Default::default()).unwrap();
        let buf = domain.alloc_from(&pattern(3 * 4096)).unwrap();
        assert_eq!(sum_buf(&buf), sum_words(&pattern(3 * 4096)));
        let c = Counts {
            requests: 1,
            forwarded: 2,
            payload_bytes: 3,
            handle_bytes: 4,
            maps: 5,
            pool_bytes: 6,
            pool_pages: 7,
        };
        assert_eq!(Counts::from_fields(&u64s(&to_bytes(&c.fields()))), Some(c));
    }
}
