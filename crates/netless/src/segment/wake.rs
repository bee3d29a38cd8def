//! Wake-up sources: the doorbell of a client connection, handed to a server worker so that
//! it sleeps on its queue and on the replies its handler waits for at once
//! ([`Handler::wake_sources`](crate::Handler::wake_sources)).
//!
//! A source keeps its connection's segment mapped and gives out only the doorbell, whose
//! words the waiter's protocol treats as untrusted (`netless_ring::doorbell`). It holds
//! nothing of the client's but that segment.

use std::sync::Arc;

use netless_ring::DoorbellWords;

use super::ConnSegment;

/// The doorbell a connection's replies notify: see [`Client::wake_source`](crate::Client::wake_source)
/// and [`Pipeline::wake_source`](crate::Pipeline::wake_source). Cheap to clone.
#[derive(Clone)]
pub struct WakeSource {
    segment: Arc<ConnSegment>,
    service: Arc<str>,
}

impl WakeSource {
    pub(crate) fn new(segment: Arc<ConnSegment>, service: &str) -> WakeSource {
        WakeSource {
            segment,
            service: service.into(),
        }
    }

    pub(crate) fn doorbell(&self) -> &DoorbellWords {
        self.segment.doorbell()
    }
}

impl std::fmt::Debug for WakeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WakeSource")
            .field("service", &self.service)
            .finish()
    }
}
