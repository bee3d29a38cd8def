//! [`RemoteRef`], the memory node's reference, and its encoding; [`Keys`], the node's secret
//! that signs the references it issues and checks those it is given.
//!
//! A reference is a capability: it names an object and proves that this run of this node
//! issued it. Decoding checks only the shape; whether a reference is genuine is for the
//! node to say ([`Keys::verify`]), because only it has the key.

use std::fmt;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// Bytes of an encoded [`RemoteRef`].
pub const REF_LEN: usize = 48;
/// The encoding's version this crate writes and reads.
pub const REF_VERSION: u8 = 1;
/// Bytes of the truncated HMAC-SHA256 at the end of the encoding.
const MAC_LEN: usize = 16;
const SIGNED_LEN: usize = REF_LEN - MAC_LEN;
const MAGIC: [u8; 4] = *b"nlmr";

/// A reference to an immutable object on a memory node: 48 bytes that any message can carry
/// ([`RemoteRef::to_bytes`]), and any process can read with (see
/// [`MemNode::read`](crate::MemNode::read)) while some session holds the object.
///
/// Layout (integers little-endian): `b"nlmr"`, version (1), three zero bytes, the node's
/// incarnation (random per start, 8 bytes), object id (8), length in bytes (8), then the
/// first 16 bytes of HMAC-SHA256 over the 32 bytes before it, keyed with a secret the node
/// draws at start. Altering any byte (a longer length, another object) makes the MAC wrong.
///
/// ```
/// use netless_memnode::RemoteRef;
///
/// let bytes = [0u8; 48]; // as received in a message
/// assert!(RemoteRef::from_bytes(&bytes).is_err()); // not even shaped as a reference
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRef {
    incarnation: u64,
    object: u64,
    len: u64,
    mac: [u8; MAC_LEN],
}

/// Why bytes are not a [`RemoteRef`] (the node answers `INVALID_ARGUMENT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefError {
    /// Not 48 bytes.
    Length(usize),
    /// The first four bytes are not `nlmr`.
    Magic,
    /// A version this crate does not read.
    Version(u8),
    /// The reserved bytes are not zero.
    Reserved,
}

impl fmt::Display for RefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RefError::Length(n) => write!(
                f,
                "a memory-node reference is {REF_LEN} bytes, not {n}: pass RemoteRef::to_bytes() unchanged"
            ),
            RefError::Magic => write!(
                f,
                "these bytes are not a memory-node reference: pass RemoteRef::to_bytes() unchanged"
            ),
            RefError::Version(v) => write!(
                f,
                "memory-node reference version {v} is not known here (this node reads version {REF_VERSION})"
            ),
            RefError::Reserved => write!(
                f,
                "a memory-node reference with reserved bytes set: pass RemoteRef::to_bytes() unchanged"
            ),
        }
    }
}

impl std::error::Error for RefError {}

impl RemoteRef {
    /// The object's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the object is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pages of 4096 bytes the object spans (the last may be short).
    pub fn pages(&self) -> u64 {
        self.len.div_ceil(crate::PAGE_SIZE as u64)
    }

    /// The node run (incarnation) that issued this reference.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The object's id on that run.
    pub fn object(&self) -> u64 {
        self.object
    }

    /// The 48-byte encoding.
    pub fn to_bytes(&self) -> [u8; REF_LEN] {
        let mut full = [0u8; REF_LEN];
        full[..SIGNED_LEN].copy_from_slice(&signed_part(self.incarnation, self.object, self.len));
        full[SIGNED_LEN..].copy_from_slice(&self.mac);
        full
    }

    /// Decodes the shape of a reference; whether the node issued it is checked there.
    ///
    /// # Errors
    /// [`RefError`] if `bytes` are not 48 bytes laid out as [`RemoteRef::to_bytes`] writes.
    pub fn from_bytes(bytes: &[u8]) -> Result<RemoteRef, RefError> {
        let bytes: &[u8; REF_LEN] = bytes
            .try_into()
            .map_err(|_| RefError::Length(bytes.len()))?;
        if bytes[..4] != MAGIC {
            return Err(RefError::Magic);
        }
        if bytes[4] != REF_VERSION {
            return Err(RefError::Version(bytes[4]));
        }
        if bytes[5..8] != [0, 0, 0] {
            return Err(RefError::Reserved);
        }
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let mut mac = [0u8; MAC_LEN];
        mac.copy_from_slice(&bytes[SIGNED_LEN..]);
        Ok(RemoteRef {
            incarnation: word(8),
            object: word(16),
            len: word(24),
            mac,
        })
    }
}

impl fmt::Debug for RemoteRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The MAC is left out: with it, a log line would be a usable capability.
        f.debug_struct("RemoteRef")
            .field("incarnation", &format_args!("{:016x}", self.incarnation))
            .field("object", &self.object)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

fn signed_part(incarnation: u64, object: u64, len: u64) -> [u8; SIGNED_LEN] {
    let mut out = [0u8; SIGNED_LEN];
    out[..4].copy_from_slice(&MAGIC);
    out[4] = REF_VERSION;
    out[8..16].copy_from_slice(&incarnation.to_le_bytes());
    out[16..24].copy_from_slice(&object.to_le_bytes());
    out[24..32].copy_from_slice(&len.to_le_bytes());
    out
}

/// Why the node refuses a well-formed reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forgery {
    /// Issued by an earlier run of the node: its data is gone.
    OtherIncarnation,
    /// The MAC does not match: forged or altered.
    BadMac,
}

/// A node run's identity and secret: the incarnation in every reference it issues and the
/// HMAC key that signs them. Both are random per start, so a restarted node refuses, and
/// cannot confuse, the references of its previous run.
pub(crate) struct Keys {
    incarnation: u64,
    key: hmac::Key,
    random: SystemRandom,
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keys")
            .field("incarnation", &format_args!("{:016x}", self.incarnation))
            .finish_non_exhaustive()
    }
}

impl Keys {
    /// Fresh keys from the system's random source.
    ///
    /// # Errors
    /// If the system's random source fails.
    pub(crate) fn generate() -> Result<Keys, ring::error::Unspecified> {
        let random = SystemRandom::new();
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &random)?;
        let mut incarnation = [0u8; 8];
        random.fill(&mut incarnation)?;
        Ok(Keys {
            incarnation: u64::from_le_bytes(incarnation),
            key,
            random,
        })
    }

    /// Fills `out` with random bytes (session ids).
    pub(crate) fn fill(&self, out: &mut [u8]) -> Result<(), ring::error::Unspecified> {
        self.random.fill(out)
    }

    /// A reference to object `object` of `len` bytes, signed.
    pub(crate) fn issue(&self, object: u64, len: u64) -> RemoteRef {
        let signed = signed_part(self.incarnation, object, len);
        let tag = hmac::sign(&self.key, &signed);
        let mut mac = [0u8; MAC_LEN];
        mac.copy_from_slice(&tag.as_ref()[..MAC_LEN]);
        RemoteRef {
            incarnation: self.incarnation,
            object,
            len,
            mac,
        }
    }

    /// Whether this run issued `reference`. The incarnation is checked first so that a
    /// reference from before a restart is told apart from a forgery.
    pub(crate) fn verify(&self, reference: &RemoteRef) -> Result<(), Forgery> {
        if reference.incarnation != self.incarnation {
            return Err(Forgery::OtherIncarnation);
        }
        let expected = self.issue(reference.object, reference.len);
        // Constant time: how many leading bytes match must not show in the reply's timing.
        let difference = expected
            .mac
            .iter()
            .zip(&reference.mac)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if std::hint::black_box(difference) == 0 {
            Ok(())
        } else {
            Err(Forgery::BadMac)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn issued_references_verify_and_altered_ones_do_not() {
        let keys = Keys::generate().unwrap();
        let r = keys.issue(7, 5000);
        assert_eq!(keys.verify(&r), Ok(()));
        let bytes = r.to_bytes();
        assert_eq!(bytes.len(), REF_LEN);
        assert_eq!(RemoteRef::from_bytes(&bytes), Ok(r));
        for at in 16..REF_LEN {
            let mut altered = bytes;
            altered[at] ^= 0x10;
            let altered = RemoteRef::from_bytes(&altered).unwrap();
            assert_eq!(keys.verify(&altered), Err(Forgery::BadMac), "byte {at}");
        }
        let mut other_run = bytes;
        other_run[8] ^= 1;
        let other_run = RemoteRef::from_bytes(&other_run).unwrap();
        assert_eq!(keys.verify(&other_run), Err(Forgery::OtherIncarnation));
        let restarted = Keys::generate().unwrap();
        assert_eq!(
            restarted.verify(&r),
            Err(Forgery::OtherIncarnation),
            "a new run draws a new incarnation"
        );
    }

    #[test]
    fn malformed_bytes_say_what_is_wrong() {
        let keys = Keys::generate().unwrap();
        let good = keys.issue(1, 1).to_bytes();
        assert_eq!(
            RemoteRef::from_bytes(&good[..47]),
            Err(RefError::Length(47))
        );
        assert_eq!(RemoteRef::from_bytes(&[]), Err(RefError::Length(0)));
        let mut bad = good;
        bad[0] = b'x';
        assert_eq!(RemoteRef::from_bytes(&bad), Err(RefError::Magic));
        let mut bad = good;
        bad[4] = 2;
        assert_eq!(RemoteRef::from_bytes(&bad), Err(RefError::Version(2)));
        let mut bad = good;
        bad[6] = 1;
        assert_eq!(RemoteRef::from_bytes(&bad), Err(RefError::Reserved));
    }

    #[test]
    fn debug_leaves_the_mac_out() {
        let keys = Keys::generate().unwrap();
        let r = keys.issue(3, 10);
        let text = format!("{r:?}");
        assert!(text.contains("object: 3"), "{text}");
        assert!(!text.contains("mac"), "{text}");
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_fail_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(r) = RemoteRef::from_bytes(&bytes) {
                prop_assert_eq!(&r.to_bytes()[..], &bytes[..]);
            }
        }

        #[test]
        fn well_shaped_bytes_round_trip(incarnation: u64, object: u64, len: u64, mac: [u8; 16]) {
            let mut bytes = signed_part(incarnation, object, len).to_vec();
            bytes.extend_from_slice(&mac);
            let r = RemoteRef::from_bytes(&bytes).unwrap();
            prop_assert_eq!((r.incarnation(), r.object(), r.len()), (incarnation, object, len));
            prop_assert_eq!(&r.to_bytes()[..], &bytes[..]);
        }

        #[test]
        fn a_changed_field_never_verifies(object: u64, len: u64, at in 8usize..32, bit in 0u8..8) {
            let keys = Keys::generate().unwrap();
            let mut bytes = keys.issue(object, len).to_bytes();
            bytes[at] ^= 1 << bit;
            let altered = RemoteRef::from_bytes(&bytes).unwrap();
            prop_assert!(keys.verify(&altered).is_err());
        }
    }
}
