//! What a caller passes with a call and gets back: [`CallOptions`] and the [`Reply`].
//!
//! Plain data; no shared memory, no I/O.

use std::time::{Duration, Instant};

use crate::wire::metadata::Metadata;

/// Per-call options: deadline and request metadata.
///
/// ```
/// use std::time::Duration;
/// let opts = netless::CallOptions::new().timeout(Duration::from_millis(50)).metadata("x-id", "1");
/// assert!(opts.deadline().is_some());
/// ```
#[derive(Clone, Debug, Default)]
pub struct CallOptions {
    deadline: Option<Instant>,
    metadata: Metadata,
}

impl CallOptions {
    /// No deadline (the client's default timeout applies), no metadata.
    pub fn new() -> CallOptions {
        CallOptions::default()
    }

    /// Fail with `DEADLINE_EXCEEDED` if no reply arrived within `timeout` from now. The
    /// deadline is fixed here, when the options are made: make them per call, as options
    /// kept for retries run out with the first call's time.
    pub fn timeout(mut self, timeout: Duration) -> CallOptions {
        self.deadline = Instant::now().checked_add(timeout);
        self
    }

    /// Fail with `DEADLINE_EXCEEDED` if no reply arrived by `deadline`.
    pub fn deadline_at(mut self, deadline: Instant) -> CallOptions {
        self.deadline = Some(deadline);
        self
    }

    /// Adds a request metadata pair.
    pub fn metadata(mut self, key: &str, value: impl AsRef<[u8]>) -> CallOptions {
        self.metadata.insert(key, value);
        self
    }

    /// Replaces the request metadata.
    pub fn with_metadata(mut self, metadata: Metadata) -> CallOptions {
        self.metadata = metadata;
        self
    }

    /// The deadline, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The request metadata.
    pub fn request_metadata(&self) -> &Metadata {
        &self.metadata
    }
}

/// A successful reply: response metadata and payload.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reply {
    /// Metadata the server attached.
    pub metadata: Metadata,
    /// The response bytes.
    pub payload: Vec<u8>,
}
