//! [`MemNodeConfig`]: the bounds of everything a memory node holds for its clients.

use std::time::Duration;

/// What a memory node may hold, and for how long without a word from its holder.
///
/// Every bound refuses with `RESOURCE_EXHAUSTED` and a message saying which one; none
/// makes the node wait or grow.
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
/// ```
#[derive(Debug, Clone)]
pub struct MemNodeConfig {
    /// Bytes of pages stored at most (rounded down to whole 4 KiB pages), counting the
    /// pages of Puts and Derives under way.
    pub capacity_bytes: u64,
    /// A session that sends no KeepAlive for this long is closed and loses its holds.
    /// Clients keep theirs alive every third of it.
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
