//! Call metadata: ordered key/value pairs carried with requests and responses.
//!
//! This module owns the metadata type and its encoding inside a message body. Decoding treats
//! the bytes as untrusted input (they come from another process's shared memory) and refuses
//! anything malformed; it never panics on bad input.

use crate::status::Status;

/// Ordered key/value pairs sent with a call or its reply, like gRPC metadata.
///
/// Keys are ASCII (lower-cased on insert, as HTTP/2 requires for gRPC); values are bytes.
///
/// ```
/// use netless::Metadata;
/// let mut md = Metadata::new();
/// md.insert("x-request-id", "42");
/// assert_eq!(md.get("X-Request-Id"), Some(&b"42"[..]));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metadata {
    entries: Vec<(String, Vec<u8>)>,
}

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 255;

impl Metadata {
    /// Empty metadata.
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// Appends a pair. The key is lower-cased. Keys longer than [`MAX_KEY_LEN`] are truncated
    /// to keep every encodable `Metadata` decodable.
    pub fn insert(&mut self, key: &str, value: impl AsRef<[u8]>) {
        let mut key = key.to_ascii_lowercase();
        key.truncate(MAX_KEY_LEN);
        self.entries.push((key, value.as_ref().to_vec()));
    }

    /// The first value for `key` (case-insensitive).
    pub fn get(&self, key: &str) -> Option<&[u8]> {
        self.entries
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_slice())
    }

    /// All pairs in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_slice()))
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Removes every pair, keeping the allocation.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Bytes [`Metadata::encode_into`] writes.
    pub fn encoded_len(&self) -> usize {
        self.entries
            .iter()
            .map(|(k, v)| 1 + 4 + k.len() + v.len())
            .sum()
    }

    /// Appends the encoding: per pair, `key_len: u8, value_len: u32 LE, key, value`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        for (k, v) in &self.entries {
            out.push(k.len() as u8);
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(v);
        }
    }

    /// Decodes what [`Metadata::encode_into`] wrote, refusing malformed input.
    pub fn decode(mut bytes: &[u8]) -> Result<Metadata, Status> {
        let mut md = Metadata::new();
        while !bytes.is_empty() {
            let bad = || Status::internal("malformed metadata in message from peer");
            if bytes.len() < 5 {
                return Err(bad());
            }
            let key_len = usize::from(bytes[0]);
            let value_len = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
            bytes = &bytes[5..];
            if key_len == 0 || bytes.len() < key_len || bytes.len() - key_len < value_len {
                return Err(bad());
            }
            // Copy first, then validate the copy: the bytes may live in memory a peer can
            // still change under us.
            let mut key = String::from_utf8(bytes[..key_len].to_vec()).map_err(|_| bad())?;
            if !key.is_ascii() {
                return Err(bad());
            }
            key.make_ascii_lowercase();
            md.entries
                .push((key, bytes[key_len..key_len + value_len].to_vec()));
            bytes = &bytes[key_len + value_len..];
        }
        Ok(md)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut md = Metadata::new();
        md.insert("a", "1");
        md.insert("B-bin", [0u8, 255, 3]);
        let mut buf = Vec::new();
        md.encode_into(&mut buf);
        assert_eq!(buf.len(), md.encoded_len());
        assert_eq!(Metadata::decode(&buf).unwrap(), md);
    }

    #[test]
    fn garbage_is_refused_not_panicking() {
        let mut state = 0x1234_5678_u64;
        for len in 0..200 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            let _ = Metadata::decode(&bytes);
        }
        assert!(Metadata::decode(&[3, 255, 255, 255, 255, b'a']).is_err());
    }
}
