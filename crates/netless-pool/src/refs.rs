//! The Ref: a 32-byte handle that names a buffer's pages in the pool, and its wire format.
//!
//! A Ref names a ref slot (index and generation) in its domain's pool. The slot, not the Ref,
//! lists the pages, so forwarding a Ref costs 32 bytes whatever the buffer's size, and a
//! forged Ref can at worst name a live slot (whose pages its creator holds), never arbitrary
//! memory.

use crate::PoolError;

const MAGIC: [u8; 4] = *b"NLR1";

/// A handle to a buffer in a domain's page pool, to be put in any message and mapped by
/// exactly one receiver with [`crate::Domain::map`]. Forwarding it does not touch the data.
///
/// ```
/// use netless_pool::Ref;
/// let bytes = [0u8; 32];
/// assert!(Ref::from_bytes(&bytes).is_err()); // not a Ref
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ref {
    pub(crate) domain: u64,
    pub(crate) slot: u32,
    pub(crate) generation: u32,
    pub(crate) len: u64,
}

impl Ref {
    /// Bytes in a Ref's encoding.
    pub const LEN: usize = 32;

    /// Bytes of the buffer this Ref names.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The domain that minted it.
    pub fn domain(&self) -> u64 {
        self.domain
    }

    /// The encoding to put in a message (for protobuf, a `bytes` field).
    pub fn to_bytes(&self) -> [u8; Ref::LEN] {
        let mut b = [0u8; Ref::LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..8].copy_from_slice(&self.slot.to_le_bytes());
        b[8..16].copy_from_slice(&self.domain.to_le_bytes());
        b[16..20].copy_from_slice(&self.generation.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes [`Ref::to_bytes`]. Only the format is checked here; whether the Ref is live
    /// and genuine is checked when it is mapped.
    ///
    /// # Errors
    /// [`PoolError::InvalidRef`] if `bytes` is not a Ref's encoding.
    pub fn from_bytes(bytes: &[u8]) -> Result<Ref, PoolError> {
        if bytes.len() != Ref::LEN || bytes[0..4] != MAGIC || bytes[20..24] != [0; 4] {
            return Err(PoolError::InvalidRef(format!(
                "{} bytes that are not a Ref encoding",
                bytes.len()
            )));
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        Ok(Ref {
            slot: u32_at(4),
            domain: u64_at(8),
            generation: u32_at(16),
            len: u64_at(24),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let r = Ref {
            domain: 0xdead_beef,
            slot: 7,
            generation: 3,
            len: 12345,
        };
        assert_eq!(Ref::from_bytes(&r.to_bytes()).unwrap(), r);
        assert!(Ref::from_bytes(&r.to_bytes()[..31]).is_err());
        let mut bad = r.to_bytes();
        bad[0] = b'X';
        assert!(Ref::from_bytes(&bad).is_err());
    }
}
