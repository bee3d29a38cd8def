//! The pool's one error type: what went wrong with a page, a Ref or the domain, worded so the
//! caller knows what to do next.

/// Everything the pool can refuse.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The OS layer failed (memfd, socket, fd passing).
    #[error(transparent)]
    Shm(#[from] netless_shm::Error),

    /// A bad setting.
    #[error("invalid pool configuration: {0}")]
    Config(String),

    /// The pool ran out of pages, ref slots or member rows.
    #[error("pool exhausted: {0}")]
    Exhausted(String),

    /// A Ref minted by another domain's pool.
    #[error(
        "the Ref belongs to domain {theirs:016x}, not this process's domain {ours:016x}: \
         Refs only travel between processes of one domain; send the bytes instead"
    )]
    ForeignRef {
        /// The domain named in the Ref.
        theirs: u64,
        /// Ours.
        ours: u64,
    },

    /// A malformed or forged Ref (bad bytes, slot out of range, pages its creator does not
    /// hold).
    #[error("invalid Ref: {0}; it was corrupted or forged, refusing it")]
    InvalidRef(String),

    /// A well-formed Ref that can no longer be mapped.
    #[error("the Ref is gone: {0}")]
    RefGone(String),

    /// A handle freed twice, or never allocated.
    #[error("rfree of {0:#x}: no such allocation in this process (already freed?)")]
    DoubleFree(u64),

    /// A page used by too many buffers and Refs of one process.
    #[error(
        "page {page} already has {max} references in this process: reference count overflow; \
         drop some buffers or Refs first"
    )]
    CountOverflow {
        /// The page.
        page: u32,
        /// The per-process limit.
        max: u32,
    },

    /// An access outside a buffer.
    #[error("access of {len} bytes at offset {offset} is outside a buffer of {size} bytes")]
    OutOfBounds {
        /// Start of the access.
        offset: usize,
        /// Its length.
        len: usize,
        /// The buffer's length.
        size: usize,
    },

    /// The pool's shared state is inconsistent (another process wrote garbage into it).
    #[error("pool corrupted: {0}")]
    Corrupt(String),

    /// Joining the domain failed.
    #[error("domain `{name}`: {reason}")]
    Join {
        /// The domain's name.
        name: String,
        /// What happened and what to do.
        reason: String,
    },
}
