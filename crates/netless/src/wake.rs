//! Wake-up sources: the doorbell of a client connection, handed to a server worker so that
//! it sleeps on its queue and on the replies its handler waits for at once
//! ([`Handler::wake_sources`](crate::Handler::wake_sources)).
//!
//! A source keeps its connection's segment mapped; it only ever gives out the doorbell, whose
//! words the waiter's protocol treats as untrusted (`netless_ring::doorbell`).

use std::sync::Arc;

use netless_ring::DoorbellWords;

use crate::client::Shared;

/// The doorbell a connection's replies ring: see [`Client::wake_source`](crate::Client::wake_source)
/// and [`Pipeline::wake_source`](crate::Pipeline::wake_source). Cheap to clone.
#[derive(Clone)]
pub struct WakeSource {
    shared: Arc<Shared>,
}

impl WakeSource {
    pub(crate) fn new(shared: Arc<Shared>) -> WakeSource {
        WakeSource { shared }
    }

    pub(crate) fn doorbell(&self) -> &DoorbellWords {
        self.shared.conn.doorbell()
    }
}

impl std::fmt::Debug for WakeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WakeSource")
            .field("service", &self.shared.service)
            .finish()
    }
}
