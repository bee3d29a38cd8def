//! [`MemNodeConfig`]: the bounds of everything a memory node holds for its clients.

use std::time::Duration;

use crate::PAGE_SIZE;

/// What a memory node may hold, and for how long without a word from its holder.
///
/// Every bound refuses with `RESOURCE_EXHAUSTED` and a message saying which one; none
/// makes the node wait or grow. [`MemNodeService::new`](crate::MemNodeService::new)
/// refuses a configuration [`MemNodeConfig::validate`] refuses.
///
/// ```
/// use std::time::Duration;
/// use netless_memnode::MemNodeConfig;
///
/// let config = MemNodeConfig {
///     capacity_bytes: 64 << 20,
///     lease: Duration::from_secs(2),
///     ..MemNodeConfig::default()
/// };
/// assert_eq!(config.max_sessions, MemNodeConfig::default().max_sessions);
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone)]
pub struct MemNodeConfig {
    /// Bytes of pages stored at most (rounded down to whole 4 KiB pages), counting the
    /// pages of Puts and Derives under way: from one page to 16 TiB.
    pub capacity_bytes: u64,
    /// A session that sends no KeepAlive for this long is closed and loses its holds.
    /// Clients keep theirs alive every third of it. From 10 ms to a day.
    pub lease: Duration,
    /// Sessions open at once.
    pub max_sessions: usize,
    /// Sessions open at once from one client, told by the IP address of its connection
    /// (`Open` asks for no credential, so this is what keeps one client from taking every
    /// session). Clients whose address the transport does not give, as over netless,
    /// count as one client.
    pub max_sessions_per_peer: usize,
    /// The longest object.
    pub max_object_bytes: u64,
    /// Objects stored at once (an empty object takes no page, but takes one of these).
    pub max_objects: usize,
    /// Holds (a session holding an object) at once, over all sessions: what bounds the
    /// node's bookkeeping, which capacity does not count.
    pub max_holds: usize,
    /// Objects one session holds at once.
    pub max_holds_per_session: usize,
}

impl Default for MemNodeConfig {
    fn default() -> MemNodeConfig {
        MemNodeConfig {
            capacity_bytes: 1 << 30,
            lease: Duration::from_secs(10),
            max_sessions: 4096,
            max_sessions_per_peer: 256,
            max_object_bytes: 256 << 20,
            max_objects: 1 << 20,
            max_holds: 1 << 20,
            max_holds_per_session: 1 << 16,
        }
    }
}

/// The shortest lease: clients keep sessions alive every third of it.
const MIN_LEASE: Duration = Duration::from_millis(10);
/// The longest lease: a dead client's holds must go some day.
const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);
/// The largest capacity: the node numbers its pages with 32 bits.
const MAX_CAPACITY: u64 = (u32::MAX as u64 + 1) * PAGE_SIZE as u64;

impl MemNodeConfig {
    /// Checks that the node can run with this configuration: a lease from 10 ms to a day,
    /// a capacity from one page to 16 TiB, and every other bound above 0.
    ///
    /// # Errors
    /// `InvalidInput`, naming the field and its range.
    pub fn validate(&self) -> std::io::Result<()> {
        let invalid = |field: &str, value: &dyn std::fmt::Debug, range: &str| {
            Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("MemNodeConfig::{field} is {value:?}: it must be {range}"),
            ))
        };
        if !(MIN_LEASE..=MAX_LEASE).contains(&self.lease) {
            return invalid("lease", &self.lease, "from 10 ms to 1 day");
        }
        if !(PAGE_SIZE as u64..=MAX_CAPACITY).contains(&self.capacity_bytes) {
            return invalid(
                "capacity_bytes",
                &self.capacity_bytes,
                "from one page (4096) to 16 TiB",
            );
        }
        let counts = [
            ("max_sessions", self.max_sessions),
            ("max_sessions_per_peer", self.max_sessions_per_peer),
            ("max_objects", self.max_objects),
            ("max_holds", self.max_holds),
            ("max_holds_per_session", self.max_holds_per_session),
        ];
        if let Some((field, value)) = counts.into_iter().find(|&(_, v)| v == 0) {
            return invalid(field, &value, "at least 1");
        }
        if self.max_object_bytes == 0 {
            return invalid("max_object_bytes", &self.max_object_bytes, "at least 1");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemNodeService;

    #[test]
    fn the_node_refuses_a_configuration_it_cannot_run_and_names_the_field() {
        type Change = fn(&mut MemNodeConfig);
        let cases: [(&str, Change); 11] = [
            ("lease", |c| c.lease = Duration::MAX),
            ("lease", |c| c.lease = Duration::ZERO),
            ("lease", |c| c.lease = MAX_LEASE + Duration::from_nanos(1)),
            ("capacity_bytes", |c| c.capacity_bytes = 4095),
            ("capacity_bytes", |c| c.capacity_bytes = MAX_CAPACITY + 1),
            ("max_sessions", |c| c.max_sessions = 0),
            ("max_sessions_per_peer", |c| c.max_sessions_per_peer = 0),
            ("max_object_bytes", |c| c.max_object_bytes = 0),
            ("max_objects", |c| c.max_objects = 0),
            ("max_holds", |c| c.max_holds = 0),
            ("max_holds_per_session", |c| c.max_holds_per_session = 0),
        ];
        for (field, change) in cases {
            let mut config = MemNodeConfig::default();
            change(&mut config);
            let error = MemNodeService::new(config).unwrap_err();
            assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput, "{error}");
            let named = format!("MemNodeConfig::{field} is ");
            assert!(error.to_string().starts_with(&named), "{error}");
        }
        assert!(MemNodeService::new(MemNodeConfig::default()).is_ok());
        let smallest = MemNodeConfig {
            lease: MIN_LEASE,
            capacity_bytes: PAGE_SIZE as u64,
            max_sessions: 1,
            max_sessions_per_peer: 1,
            max_object_bytes: 1,
            max_objects: 1,
            max_holds: 1,
            max_holds_per_session: 1,
        };
        assert!(MemNodeService::new(smallest).is_ok());
        let largest = MemNodeConfig {
            lease: MAX_LEASE,
            capacity_bytes: MAX_CAPACITY,
            ..MemNodeConfig::default()
        };
        assert!(MemNodeService::new(largest).is_ok());
    }
}
