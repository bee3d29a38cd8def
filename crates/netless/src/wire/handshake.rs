//! The connection handshake over the service's Unix socket: who sends which fd, and the small
//! frames exchanged before shared memory takes over.
//!
//! Server → client: `Greeting` once `SO_PEERCRED` passed the ACL, or `Reject` with a status
//! (so no fd crosses in either direction before the ACL check, and a refused client reads
//! the reason instead of a reset).
//! Client → server: `Hello` with the client's connection segment (its response ring), the CPU
//! its calls come from (a hint for `Dispatch::CpuLocal`), and, from a member of a page-pool
//! domain, its claim to its member row with the open file that proves it
//! (`netless_pool::Domain::member_claim`).
//! Server → client: `Welcome` with two fds, the replica segment of the client's trust group
//! and the server's control segment (read-only), and whether the connection passes payloads
//! by reference; or `Reject` with a status.
//! Afterwards the socket stays open and silent: its hang-up is each side's death notice; the
//! server may send one `Goodbye` (a status saying why) before it closes a connection.
//! Decoding refuses anything malformed; it never panics.

use crate::status::{Code, Status};

const HELLO: u8 = 1;
/// Bytes of an encoded `Hello`.
pub(crate) const HELLO_LEN: usize = 29;
/// The longest frame a server reads where it expects a `Hello`: room for the longer `Hello`
/// of a later protocol, so that its version can be read and named in the refusal.
pub(crate) const MAX_HELLO_READ: usize = 256;
const WELCOME: u8 = 2;
const REJECT: u8 = 3;
const GOODBYE: u8 = 4;
const GREETING: u8 = 5;
/// Protocol version carried in `Hello` and `Welcome`. 5: a reply's status may carry
/// NOT_RUN (bit 15, `status::ReplyCode`), which protocol 4 clients would take for an
/// unknown code. 7: a compact request may repeat the method before it
/// (`compact_flags::SAME_METHOD`), which protocol 6 servers would read as an empty name.
/// 8: compact request and reply headers are 8 bytes (a 32-bit call id), on 8-byte
/// boundaries. 9: a run may start with a 32-byte `ShortHeader` (`kind::REQUEST_SHORT`),
/// which protocol 8 servers would refuse as an unknown kind. 10: `Welcome` carries a
/// replica segment per trust group and a read-only control segment. 11: `Hello` carries
/// the client's member claim and `Welcome` whether Refs may pass (no pid decides it).
/// 12: `Hello` carries the CPU the client's calls come from.
pub(crate) const PROTOCOL_VERSION: u32 = 12;
/// `Hello::member` of a client that claims no member row.
pub(crate) const NO_MEMBER: u32 = u32::MAX;
/// `Hello::cpu` of a client that does not say where its calls come from.
pub(crate) const NO_CPU: u32 = u32::MAX;

/// A handshake frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    Greeting {
        version: u32,
    },
    Hello {
        version: u32,
        /// The largest response body the client accepts: the server answers a call whose
        /// reply would be larger with `RESOURCE_EXHAUSTED` instead.
        max_message: u32,
        /// The id of the page-pool domain the client belongs to (0: none). When the
        /// server's is the same, large payloads may travel as Refs.
        domain: u64,
        /// The client's member row in that domain ([`NO_MEMBER`]: none) and its generation,
        /// proved by the open file sent with the frame.
        member: u32,
        generation: u32,
        /// The CPU the client's calls come from ([`NO_CPU`]: unknown): a hint, which a
        /// server with `Dispatch::CpuLocal` follows when a worker of its runs there.
        cpu: u32,
    },
    Welcome {
        version: u32,
        conn_index: u32,
        tag: u32,
        token: u64,
        /// The server's domain id (0: none).
        domain: u64,
        /// The server maps this client's Refs: it proved its membership of that domain.
        by_ref: bool,
    },
    Reject(Status),
    Goodbye(Status),
}

impl Frame {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32);
        match self {
            Frame::Hello {
                version,
                max_message,
                domain,
                member,
                generation,
                cpu,
            } => {
                out.push(HELLO);
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&max_message.to_le_bytes());
                out.extend_from_slice(&domain.to_le_bytes());
                out.extend_from_slice(&member.to_le_bytes());
                out.extend_from_slice(&generation.to_le_bytes());
                out.extend_from_slice(&cpu.to_le_bytes());
            }
            Frame::Greeting { version } => {
                out.push(GREETING);
                out.extend_from_slice(&version.to_le_bytes());
            }
            Frame::Welcome {
                version,
                conn_index,
                tag,
                token,
                domain,
                by_ref,
            } => {
                out.push(WELCOME);
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&conn_index.to_le_bytes());
                out.extend_from_slice(&tag.to_le_bytes());
                out.extend_from_slice(&token.to_le_bytes());
                out.extend_from_slice(&domain.to_le_bytes());
                out.push(u8::from(*by_ref));
            }
            Frame::Reject(status) | Frame::Goodbye(status) => {
                out.push(if matches!(self, Frame::Reject(_)) {
                    REJECT
                } else {
                    GOODBYE
                });
                out.extend_from_slice(&(status.code() as u16).to_le_bytes());
                out.extend_from_slice(status.message().as_bytes());
            }
        }
        out
    }

    /// The protocol version a `Hello` of any length carries (a client of another version may
    /// send one of another length), so the server can say which versions differ before it
    /// decodes the rest.
    pub(crate) fn hello_version(bytes: &[u8]) -> Option<u32> {
        match bytes {
            [HELLO, v0, v1, v2, v3, ..] => Some(u32::from_le_bytes([*v0, *v1, *v2, *v3])),
            _ => None,
        }
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<Frame> {
        let (&tag, rest) = bytes.split_first()?;
        let u32_at = |i: usize| -> Option<u32> {
            Some(u32::from_le_bytes(rest.get(i..i + 4)?.try_into().ok()?))
        };
        match tag {
            GREETING if rest.len() == 4 => Some(Frame::Greeting {
                version: u32_at(0)?,
            }),
            HELLO if rest.len() == HELLO_LEN - 1 => Some(Frame::Hello {
                version: u32_at(0)?,
                max_message: u32_at(4)?,
                domain: u64::from_le_bytes(rest.get(8..16)?.try_into().ok()?),
                member: u32_at(16)?,
                generation: u32_at(20)?,
                cpu: u32_at(24)?,
            }),
            WELCOME if rest.len() == 29 && rest[28] <= 1 => Some(Frame::Welcome {
                version: u32_at(0)?,
                conn_index: u32_at(4)?,
                tag: u32_at(8)?,
                token: u64::from_le_bytes(rest.get(12..20)?.try_into().ok()?),
                domain: u64::from_le_bytes(rest.get(20..28)?.try_into().ok()?),
                by_ref: rest[28] == 1,
            }),
            REJECT | GOODBYE if rest.len() >= 2 => {
                let code = Code::from_u16(u16::from_le_bytes([rest[0], rest[1]]))?;
                let message = String::from_utf8_lossy(&rest[2..]).into_owned();
                let status = Status::new(code, message);
                Some(if tag == REJECT {
                    Frame::Reject(status)
                } else {
                    Frame::Goodbye(status)
                })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        for f in [
            Frame::Hello {
                version: 1,
                max_message: 4 << 20,
                domain: 7,
                member: 3,
                generation: 12,
                cpu: 1,
            },
            Frame::Greeting { version: 1 },
            Frame::Welcome {
                version: 1,
                conn_index: 3,
                tag: 9,
                token: u64::MAX,
                domain: 0,
                by_ref: true,
            },
            Frame::Reject(Status::new(Code::PermissionDenied, "no")),
            Frame::Goodbye(Status::new(Code::Unavailable, "bye")),
        ] {
            assert_eq!(Frame::decode(&f.encode()), Some(f));
        }
        assert_eq!(Frame::decode(&[]), None);
        assert_eq!(Frame::decode(&[2, 1]), None);
        assert_eq!(Frame::decode(&[3, 99, 0]), None);
    }

    #[test]
    fn a_hello_of_another_length_still_tells_its_version() {
        let mut old = Frame::Hello {
            version: 11,
            max_message: 1,
            domain: 0,
            member: NO_MEMBER,
            generation: 0,
            cpu: NO_CPU,
        }
        .encode();
        old.truncate(25);
        assert_eq!(Frame::decode(&old), None);
        assert_eq!(Frame::hello_version(&old), Some(11));
        assert_eq!(Frame::hello_version(&[HELLO, 1, 0]), None);
        assert_eq!(Frame::hello_version(&[WELCOME, 1, 0, 0, 0]), None);
    }
}
