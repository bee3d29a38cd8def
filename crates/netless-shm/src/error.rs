//! The crate's one error type. It owns the wording of every failure this layer reports;
//! it never decides what the caller does next (retry, close, report) — the messages only
//! suggest it.

use std::path::PathBuf;

/// Everything that can go wrong in the OS layer.
///
/// Messages say what happened and what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A system call failed.
    #[error("{op} failed: {source}")]
    Io {
        /// What we were doing, e.g. `"memfd_create"`.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A segment of length zero was requested or offered.
    #[error("shared memory segment has length 0: segments must be at least one byte long")]
    EmptySegment,

    /// A peer offered a segment larger than the caller accepts.
    #[error(
        "shared memory segment of {len} bytes exceeds the limit of {max} bytes: \
         the peer is misconfigured or malicious; close the connection"
    )]
    SegmentTooLarge {
        /// Size of the offered segment.
        len: u64,
        /// The caller's limit.
        max: usize,
    },

    /// A peer offered a file descriptor that is not a usable shared memory segment.
    #[error("file descriptor offered as a segment is not usable: {reason}; close the connection")]
    BadSegment {
        /// Why it was refused.
        reason: String,
    },

    /// A peer offered a memfd without the shrink and grow seals.
    #[error(
        "shared memory segment is not sealed against resizing (seals {seals:#x}, need \
         F_SEAL_SHRINK|F_SEAL_GROW): the peer could truncate it and crash us with SIGBUS; \
         refusing it — the peer must create segments with Segment::create"
    )]
    NotSealed {
        /// The raw seals found on the fd.
        seals: u32,
    },

    /// The peer closed the socket (EOF or broken pipe).
    #[error("peer closed the connection")]
    PeerClosed,

    /// The socket's read or write timeout expired (or it is non-blocking and had no data).
    #[error(
        "timed out waiting on the peer's socket: the peer is slow or hung; retry or close \
         the connection"
    )]
    Timeout,

    /// A frame longer than [`crate::MAX_FRAME`] was sent or announced.
    #[error(
        "frame of {len} bytes exceeds the limit of {max} bytes: send large data through \
         shared memory, not the control socket"
    )]
    FrameTooLarge {
        /// Length sent or announced.
        len: usize,
        /// The limit.
        max: usize,
    },

    /// More file descriptors arrived (or were to be sent) than allowed.
    #[error(
        "frame carries {got} file descriptors, more than the {max} allowed: the extra \
         descriptors were closed; close the connection"
    )]
    TooManyFds {
        /// Number received or offered (a lower bound if the kernel truncated).
        got: usize,
        /// The limit.
        max: usize,
    },

    /// The byte stream on the socket is not well-formed.
    #[error("protocol error on the control socket: {0}; close the connection")]
    Protocol(String),

    /// A service name is not acceptable.
    #[error(
        "invalid service name {name:?}: {reason} (use 1 to 100 characters from \
         A-Z a-z 0-9 . _ -, not starting with '.')"
    )]
    InvalidName {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A socket path does not fit in `sockaddr_un`.
    #[error(
        "socket path {path:?} is {len} bytes, longer than the 107 a Unix socket address \
         allows: set NETLESS_DIR to a shorter directory"
    )]
    SocketPathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },

    /// The socket directory is unusable.
    #[error("socket directory {path:?} is unusable: {reason}")]
    SocketDir {
        /// The directory.
        path: PathBuf,
        /// Why, and what to do.
        reason: String,
    },

    /// A live process holds the name a server asked for.
    #[error(
        "{path:?} is already served by a live process (it holds the name's lock file): stop \
         that server, or pick another name"
    )]
    AlreadyServed {
        /// The socket's path.
        path: PathBuf,
    },

    /// A CPU index is out of range or not allowed for this thread.
    #[error(
        "cannot pin to CPU {cpu}: {reason}; choose one of the CPUs this process may use \
         (see netless_shm::allowed_cpus)"
    )]
    InvalidCpu {
        /// The requested CPU.
        cpu: usize,
        /// Why it failed.
        reason: String,
    },

    /// A fabric region is unusable or full, or something in it failed validation.
    #[error("memory fabric {path:?}: {reason}")]
    Fabric {
        /// The fabric's file.
        path: PathBuf,
        /// What is wrong, and what to do.
        reason: String,
    },
}

impl Error {
    /// Builds a closure mapping a rustix errno to [`Error::Io`] for `op`.
    pub(crate) fn os(op: &'static str) -> impl FnOnce(rustix::io::Errno) -> Error {
        move |errno| Error::Io {
            op,
            source: errno.into(),
        }
    }
}
