//! Service-level objectives (NEBULA §IV–V): the [`Slo`] a server is given, the queueing
//! arithmetic that sizes its receive buffer and queue-depth limit from it ([`sizing`]), and the
//! admission rules that refuse, with a NACK, a request that could no longer meet it
//! ([`admission`]: up front by depth at the client, or unrun at the worker after a stall).
//!
//! Nothing here touches a segment but through the server's control line, whose values are
//! hints a peer may have written.

use std::time::Duration;

pub(crate) mod admission;
pub mod sizing;

/// A latency objective: the server sizes its receive buffer for it and refuses, at once and
/// with `RESOURCE_EXHAUSTED`, a request that would queue behind more than it allows.
///
/// ```
/// use std::time::Duration;
/// let slo = netless::Slo::new(Duration::from_micros(50)).mean_service(Duration::from_micros(5));
/// assert!((slo.ratio().unwrap() - 10.0).abs() < 1e-9);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slo {
    /// The latency target for the time a request spends at the server.
    pub target: Duration,
    /// Mean handler time; `None`: measured by the server while it runs (the queue-depth
    /// limit starts when it has seen [`Slo::WARMUP`] requests, and the buffer is sized for
    /// an SLO of 10× the service time).
    pub mean_service: Option<Duration>,
    /// Mean request size (method, metadata and payload) the buffer is sized for.
    pub mean_request_bytes: usize,
}

impl Slo {
    /// Requests a server measures before it applies a measured queue-depth limit.
    pub const WARMUP: u64 = 1000;

    /// An SLO of `target` with a measured service time and 1 KiB requests.
    pub fn new(target: Duration) -> Slo {
        Slo {
            target,
            mean_service: None,
            mean_request_bytes: 1024,
        }
    }

    /// Declares the mean service time.
    pub fn mean_service(self, mean: Duration) -> Slo {
        Slo {
            mean_service: Some(mean),
            ..self
        }
    }

    /// Declares the mean request size.
    pub fn mean_request_bytes(self, bytes: usize) -> Slo {
        Slo {
            mean_request_bytes: bytes,
            ..self
        }
    }

    /// The SLO in mean service times, if the service time is declared.
    pub fn ratio(&self) -> Option<f64> {
        let s = self.mean_service?.as_secs_f64();
        (s > 0.0).then(|| self.target.as_secs_f64() / s)
    }
}
