//! gRPC status codes and the `Status` error every call returns.
//!
//! This module owns the mapping from what went wrong to a gRPC code and a message that says
//! what happened and what to do. It never decides *when* something is an error: the client
//! and server do, and build a `Status` here.

use std::fmt;

/// A gRPC status code, with the numeric values of the gRPC specification.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum Code {
    /// Not an error.
    Ok = 0,
    /// The operation was cancelled, typically by the caller.
    Cancelled = 1,
    /// Unknown error.
    Unknown = 2,
    /// The client specified an invalid argument.
    InvalidArgument = 3,
    /// The deadline expired before the operation could complete.
    DeadlineExceeded = 4,
    /// Some requested entity was not found.
    NotFound = 5,
    /// The entity that a client attempted to create already exists.
    AlreadyExists = 6,
    /// The caller does not have permission.
    PermissionDenied = 7,
    /// Some resource has been exhausted (a full queue, an oversized message).
    ResourceExhausted = 8,
    /// The system is not in a state required for the operation.
    FailedPrecondition = 9,
    /// The operation was aborted.
    Aborted = 10,
    /// Operation was attempted past the valid range.
    OutOfRange = 11,
    /// The operation is not implemented or not supported.
    Unimplemented = 12,
    /// Internal error: an invariant was broken.
    Internal = 13,
    /// The service is currently unavailable (not running, or its process died).
    Unavailable = 14,
    /// Unrecoverable data loss or corruption.
    DataLoss = 15,
    /// The request does not have valid authentication credentials.
    Unauthenticated = 16,
}

impl Code {
    /// Every code, in numeric order.
    pub const ALL: [Code; 17] = [
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// The code for a numeric value, or `None` if it is not a gRPC code.
    ///
    /// ```
    /// use netless::Code;
    /// assert_eq!(Code::from_u16(14), Some(Code::Unavailable));
    /// assert_eq!(Code::from_u16(99), None);
    /// ```
    pub fn from_u16(value: u16) -> Option<Code> {
        Code::ALL.get(usize::from(value)).copied()
    }

    /// The gRPC name of the code, e.g. `UNAVAILABLE`.
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Cancelled => "CANCELLED",
            Code::Unknown => "UNKNOWN",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::NotFound => "NOT_FOUND",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Aborted => "ABORTED",
            Code::OutOfRange => "OUT_OF_RANGE",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::DataLoss => "DATA_LOSS",
            Code::Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The outcome of a failed call: a gRPC code and a message for humans.
///
/// ```
/// use netless::{Code, Status};
/// let status = Status::new(Code::NotFound, "no such key");
/// assert_eq!(status.code(), Code::NotFound);
/// assert_eq!(status.to_string(), "NOT_FOUND: no such key");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    code: Code,
    message: String,
    /// A NACK: refused without running, so the call may be retried as is.
    nack: bool,
    /// Of NACKs, one a server's worker sent (the request waited too long in its queue).
    by_worker: bool,
}

impl Status {
    /// A status with `code` and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Status {
        Status {
            code,
            message: message.into(),
            nack: false,
            by_worker: false,
        }
    }

    /// A NACK (`RESOURCE_EXHAUSTED`): the request was refused before any of it was sent.
    pub(crate) fn nack(message: impl Into<String>) -> Status {
        Status {
            nack: true,
            ..Status::resource_exhausted(message)
        }
    }

    /// Whether this is a NACK: the request was refused without running, so retrying it
    /// (later, or on another replica) cannot run it twice. Always `RESOURCE_EXHAUSTED`. The
    /// client refuses a call before sending any of it when the server's receive buffer is
    /// full or its queue deeper than its SLO allows; a server under an SLO refuses a request
    /// that waited so long in its queue that serving it would miss the SLO.
    pub fn is_nack(&self) -> bool {
        self.nack
    }

    /// Whether this NACK came from one of the server's workers rather than from this client:
    /// the request was sent, but waited in the server's queue too long to finish within its
    /// SLO, and was refused without running (see [`Status::is_nack`]).
    pub fn is_refused_by_worker(&self) -> bool {
        self.by_worker
    }

    /// The gRPC code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// `INVALID_ARGUMENT` with `message`.
    pub fn invalid_argument(message: impl Into<String>) -> Status {
        Status::new(Code::InvalidArgument, message)
    }

    /// `UNAVAILABLE` with `message`.
    pub fn unavailable(message: impl Into<String>) -> Status {
        Status::new(Code::Unavailable, message)
    }

    /// `RESOURCE_EXHAUSTED` with `message`.
    pub fn resource_exhausted(message: impl Into<String>) -> Status {
        Status::new(Code::ResourceExhausted, message)
    }

    /// `DEADLINE_EXCEEDED` with `message`.
    pub fn deadline_exceeded(message: impl Into<String>) -> Status {
        Status::new(Code::DeadlineExceeded, message)
    }

    /// `INTERNAL` with `message`.
    pub fn internal(message: impl Into<String>) -> Status {
        Status::new(Code::Internal, message)
    }

    /// `UNIMPLEMENTED` with `message`.
    pub fn unimplemented(message: impl Into<String>) -> Status {
        Status::new(Code::Unimplemented, message)
    }
}

/// A reply's status as the wire carries it (`ResponseHeader::status`,
/// `CompactReply::status`): the gRPC code, and whether the server refused the call without
/// running it (a NACK, [`Status::is_nack`]), in bit 15 (bit 7 of a `CompactReply`'s byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReplyCode {
    pub code: Code,
    pub not_run: bool,
}

impl ReplyCode {
    const NOT_RUN: u16 = 1 << 15;

    /// The reply code of a call that failed with `status`.
    pub(crate) fn of(status: &Status) -> ReplyCode {
        ReplyCode {
            code: status.code,
            not_run: status.nack,
        }
    }

    /// The wire's `u16`.
    pub(crate) fn wire(self) -> u16 {
        self.code as u16 | if self.not_run { Self::NOT_RUN } else { 0 }
    }

    /// Decodes a wire `u16` (written by the peer: `None` for an unknown code, or a NOT_RUN
    /// bit on anything but `RESOURCE_EXHAUSTED`).
    pub(crate) fn from_wire(wire: u16) -> Option<ReplyCode> {
        let code = Code::from_u16(wire & !Self::NOT_RUN)?;
        let not_run = wire & Self::NOT_RUN != 0;
        (!not_run || code == Code::ResourceExhausted).then_some(ReplyCode { code, not_run })
    }

    /// The one-byte form a [`CompactReply`](crate::wire::header::CompactReply) carries: the code
    /// (0–16) in the low bits, NOT_RUN in bit 7.
    pub(crate) fn wire8(self) -> u8 {
        self.code as u8 | if self.not_run { 0x80 } else { 0 }
    }

    /// Decodes the one-byte form, as [`ReplyCode::from_wire`] does the `u16`.
    pub(crate) fn from_wire8(wire: u8) -> Option<ReplyCode> {
        let not_run = if wire & 0x80 != 0 { Self::NOT_RUN } else { 0 };
        Self::from_wire(u16::from(wire & 0x7f) | not_run)
    }

    /// The status of a failed call from its message bytes, copied out of the ring before
    /// they are decoded (the server can still write there).
    pub(crate) fn status(self, message: &[u8]) -> Status {
        Status {
            code: self.code,
            message: String::from_utf8_lossy(&Vec::from(message)).into_owned(),
            nack: self.not_run,
            by_worker: self.not_run,
        }
    }
}

impl From<Code> for ReplyCode {
    fn from(code: Code) -> ReplyCode {
        ReplyCode {
            code,
            not_run: false,
        }
    }
}

/// The gRPC status for a page-pool failure.
pub(crate) fn from_pool(e: netless_pool::PoolError) -> Status {
    use netless_pool::PoolError as E;
    let code = match &e {
        E::Exhausted(_) | E::CountOverflow { .. } => Code::ResourceExhausted,
        E::ForeignRef { .. } | E::InvalidRef(_) | E::OutOfBounds { .. } | E::Config(_) => {
            Code::InvalidArgument
        }
        E::RefGone(_) | E::DoubleFree(_) => Code::FailedPrecondition,
        E::Corrupt(_) => Code::DataLoss,
        E::Join { .. } | E::Shm(_) => Code::Unavailable,
        _ => Code::Internal,
    };
    Status::new(code, format!("page pool: {e}"))
}

impl From<netless_pool::PoolError> for Status {
    fn from(e: netless_pool::PoolError) -> Status {
        from_pool(e)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Status {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for code in Code::ALL {
            assert_eq!(Code::from_u16(code as u16), Some(code));
        }
        assert_eq!(Code::from_u16(17), None);
    }

    #[test]
    fn reply_codes_round_trip_and_reject_a_stray_not_run_bit() {
        for code in Code::ALL {
            let plain = ReplyCode::from(code);
            assert_eq!(ReplyCode::from_wire(plain.wire()), Some(plain));
            assert_eq!(ReplyCode::from_wire8(plain.wire8()), Some(plain));
        }
        let nack = ReplyCode::of(&Status::nack("queued past the SLO"));
        assert_eq!(nack.wire(), 0x8000 | Code::ResourceExhausted as u16);
        assert_eq!(ReplyCode::from_wire(nack.wire()), Some(nack));
        let status = nack.status(b"queued past the SLO");
        assert!(status.is_nack() && status.is_refused_by_worker());
        assert!(!Status::nack("queue full").is_refused_by_worker());
        assert_eq!(status.code(), Code::ResourceExhausted);
        // Only a refusal may say it did not run.
        assert_eq!(ReplyCode::from_wire(0x8000 | Code::Internal as u16), None);
        assert_eq!(ReplyCode::from_wire(0x8000 | 17), None);
        assert_eq!(nack.wire8(), 0x80 | Code::ResourceExhausted as u8);
        assert_eq!(ReplyCode::from_wire8(nack.wire8()), Some(nack));
        assert_eq!(ReplyCode::from_wire8(0x80 | Code::Internal as u8), None);
        assert_eq!(ReplyCode::from_wire8(17), None);
        assert_eq!(ReplyCode::from_wire8(0x7f), None);
    }
}
