//! The server's side of its connections: one [`Conn`] per admitted client (its segment, its
//! response ring's producer end, its socket and what the handshake agreed), the
//! [`ConnTable`] workers look connections up in by the index a request names, and the
//! reassembly of requests that arrive in fragments.
//!
//! The acceptor alone adds and removes connections; workers only look them up, through a
//! per-worker [`ConnCache`] refreshed when a slot's tag changes, so the hot path takes no
//! lock and clones no `Arc`.

use std::collections::{HashMap, VecDeque};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use netless_ring::prefetch::prefetch_write_range;
use netless_ring::Producer;
use netless_shm::send_frame;

use crate::segment::ConnSegment;
use crate::spin_lock::SpinLock;
use crate::status::Status;
use crate::sync::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use crate::wire::handshake::Frame;
use crate::wire::header::{WireHeader, RESPONSE_HEADER_LEN};
use crate::wire::reply::RecordLimits;

/// How long a half-received fragmented request is kept.
const PARTIAL_TTL: Duration = Duration::from_secs(10);
/// Most fragmented requests one connection may have half-sent at once.
pub(super) const MAX_PARTIALS: usize = 16;

/// One admitted client.
pub(super) struct Conn {
    pub(super) index: u32,
    /// Its trust group: the replica segment its requests come through.
    pub(super) group: u32,
    /// Its client's uid (`SO_PEERCRED`).
    pub(super) uid: u32,
    /// Its index plus a generation (never 0): the block-table words its blocks carry.
    pub(super) tag: u32,
    /// The secret its requests carry, so a stray or forged entry cannot pass for it.
    pub(super) token: u64,
    pub(super) segment: ConnSegment,
    pub(super) producer: SpinLock<Producer<'static>>,
    /// Where the next response record goes (a prefetch hint, updated after each push).
    pub(super) next_record: AtomicUsize,
    pub(super) socket: UnixStream,
    pub(super) dead: AtomicBool,
    partials: Mutex<HashMap<u64, Partial>>,
    /// Replies waiting for room in the ring (its client is slow, or stopped reading).
    pub(super) backlog: Mutex<Backlog>,
    /// What its response ring takes.
    pub(super) limits: RecordLimits,
    /// It sent a compact batch, so it reads `RESPONSE_BATCH` records (it is a `Pipeline`).
    pub(super) pipelined: AtomicBool,
    /// The member of our page-pool domain the client proved to be, if any: its payloads may
    /// then arrive as Refs, only ones it created.
    pub(super) peer_member: Option<netless_pool::PeerMember>,
    /// Its polled rings, on a software-coherent fabric: deferred replies go there.
    pub(super) polled: std::sync::OnceLock<std::sync::Weak<super::polled::PolledConn>>,
    /// Run when the last handle drops, when nothing of the server can write into the
    /// client's memory any more: a fabric connection says so to the client, who may then
    /// give that memory back.
    pub(super) on_release: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        let release = self
            .on_release
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(release) = release {
            release();
        }
    }
}

/// What the handshake settled for a new connection.
pub(super) struct Admitted {
    pub(super) index: u32,
    pub(super) group: u32,
    pub(super) uid: u32,
    pub(super) tag: u32,
    pub(super) token: u64,
    pub(super) segment: ConnSegment,
    pub(super) producer: Producer<'static>,
    pub(super) socket: UnixStream,
    /// The largest response body the client accepts (from its `Hello`).
    pub(super) client_max: usize,
    pub(super) peer_member: Option<netless_pool::PeerMember>,
}

/// Replies that found the connection's response ring full, in order, waiting for room.
#[derive(Default)]
pub(super) struct Backlog {
    pub(super) records: VecDeque<Vec<u8>>,
    pub(super) bytes: usize,
    /// When the oldest of them was backlogged.
    pub(super) since: Option<Instant>,
}

/// A fragmented request being reassembled.
struct Partial {
    body: Vec<u8>,
    received: usize,
    /// When the first fragment arrived: a request left half-sent (its client gave up) is
    /// dropped after `PARTIAL_TTL`.
    started: Instant,
}

/// What a fragment did to its request.
pub(super) enum Reassembly {
    /// More fragments are due.
    Incomplete,
    /// This one completed the request: its whole body.
    Complete(Vec<u8>),
    /// The connection already has [`MAX_PARTIALS`] requests half-sent: this one is refused
    /// (a NACK for the call, not a protocol violation: an honest client with many threads
    /// can get here).
    TooMany,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Conn {
    pub(super) fn new(a: Admitted) -> Conn {
        Conn {
            index: a.index,
            group: a.group,
            uid: a.uid,
            tag: a.tag,
            token: a.token,
            next_record: AtomicUsize::new(a.producer.next_record_ptr() as usize),
            limits: RecordLimits {
                client_max: a.client_max,
                record_limit: a.producer.max_record_len(),
            },
            pipelined: AtomicBool::new(false),
            producer: SpinLock::new(a.producer),
            segment: a.segment,
            socket: a.socket,
            dead: AtomicBool::new(false),
            partials: Mutex::new(HashMap::new()),
            backlog: Mutex::new(Backlog::default()),
            peer_member: a.peer_member,
            polled: std::sync::OnceLock::new(),
            on_release: Mutex::new(None),
        }
    }

    /// Starts owning the response ring's lines a reply with a `body_len`-byte body would
    /// take now (a guess made before the handler runs: a reply about as long as the request).
    #[inline(always)]
    pub(super) fn prefetch_reply(&self, body_len: usize) {
        let next = self.next_record.load(Ordering::Relaxed) as *const u8;
        prefetch_write_range(next, 8 + RESPONSE_HEADER_LEN + body_len, 64);
    }

    /// After a reply with a `body_len`-byte body: starts owning the lines a reply like it
    /// will take next time, but not the first (the client polls its record word, and
    /// stealing it would only bounce).
    #[inline(always)]
    pub(super) fn prefetch_next_reply(&self, body_len: usize) {
        let next = self.next_record.load(Ordering::Relaxed) as *const u8;
        let reply_len = 8 + RESPONSE_HEADER_LEN + body_len;
        prefetch_write_range(next.wrapping_add(64), reply_len.saturating_sub(64), 64);
    }

    /// Whether the connection is gone (hung up, retired or closed).
    #[inline(always)]
    pub(super) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Closes the connection, telling the client why.
    pub(super) fn close(&self, status: Status) {
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self
            .socket
            .set_write_timeout(Some(Duration::from_millis(10)));
        let _ = send_frame(&self.socket, &Frame::Goodbye(status).encode(), &[]);
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }

    /// Adds `fragment`, the fragment `h` describes (validated: it lies inside the body), to
    /// the request it belongs to.
    pub(super) fn reassemble(
        &self,
        h: &WireHeader,
        fragment: &[u8],
    ) -> Result<Reassembly, &'static str> {
        let mut partials = lock(&self.partials);
        if !partials.contains_key(&h.call_id) {
            partials.retain(|_, p| p.started.elapsed() < PARTIAL_TTL);
            if partials.len() >= MAX_PARTIALS {
                return Ok(Reassembly::TooMany);
            }
        }
        let p = partials.entry(h.call_id).or_insert_with(|| Partial {
            body: vec![0; h.body_len as usize],
            received: 0,
            started: Instant::now(),
        });
        if p.body.len() != h.body_len as usize {
            return Err("fragments disagree on the body length");
        }
        let off = h.frag_offset as usize;
        netless_shm::copy::copy_slice(&mut p.body[off..off + fragment.len()], fragment);
        p.received += fragment.len();
        if p.received < p.body.len() {
            return Ok(Reassembly::Incomplete);
        }
        Ok(partials
            .remove(&h.call_id)
            .map_or(Reassembly::Incomplete, |p| Reassembly::Complete(p.body)))
    }
}

/// One slot of the connection table.
struct ConnSlot {
    /// The live connection's tag, or 0.
    tag: AtomicU32,
    conn: RwLock<Option<Arc<Conn>>>,
}

/// The server's connections by index, and how many are live.
pub(super) struct ConnTable {
    slots: Box<[ConnSlot]>,
    live: AtomicU32,
    /// Connections retired so far (see `retirements`).
    retired: crate::sync::AtomicU64,
}

impl ConnTable {
    pub(super) fn new(slots: u32) -> ConnTable {
        ConnTable {
            slots: (0..slots)
                .map(|_| ConnSlot {
                    tag: AtomicU32::new(0),
                    conn: RwLock::new(None),
                })
                .collect(),
            live: AtomicU32::new(0),
            retired: crate::sync::AtomicU64::new(0),
        }
    }

    /// Slots in the table.
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Connections live now.
    pub(super) fn live(&self) -> u32 {
        self.live.load(Ordering::Relaxed)
    }

    /// Adds `delta` to the live count; returns the new count.
    pub(super) fn count(&self, delta: i32) -> u32 {
        self.live
            .fetch_add(delta as u32, Ordering::Relaxed)
            .wrapping_add(delta as u32)
    }

    /// Live connections of `uid` (one pass over the table: for admissions, which are rare).
    pub(super) fn live_of(&self, uid: u32) -> u32 {
        self.slots
            .iter()
            .filter(|s| s.tag.load(Ordering::Acquire) != 0)
            .filter(|s| {
                s.conn
                    .read()
                    .is_ok_and(|c| c.as_ref().is_some_and(|c| c.uid == uid))
            })
            .count() as u32
    }

    /// A slot holding no connection, live or retired: one whose index is `r` modulo `m` when
    /// `home` is `Some((r, m))` and one is free, else the first.
    pub(super) fn vacant(&self, home: Option<(u32, u32)>) -> Option<u32> {
        let is_vacant = |s: &ConnSlot| {
            s.tag.load(Ordering::Acquire) == 0
                && s.conn.read().map(|c| c.is_none()).unwrap_or(false)
        };
        let at_home = |i: usize| home.is_none_or(|(r, m)| i as u32 % m.max(1) == r);
        let mut first = None;
        for (i, s) in self.slots.iter().enumerate() {
            if is_vacant(s) {
                if at_home(i) {
                    return Some(i as u32);
                }
                first = first.or(Some(i as u32));
            }
        }
        first
    }

    /// Live connections whose index is `r` modulo `m` (for admissions, which are rare).
    pub(super) fn live_at(&self, (r, m): (u32, u32)) -> usize {
        self.slots
            .iter()
            .enumerate()
            .filter(|(i, s)| *i as u32 % m.max(1) == r && s.tag.load(Ordering::Acquire) != 0)
            .count()
    }

    /// Puts `conn` in its slot, live.
    pub(super) fn install(&self, conn: &Arc<Conn>) {
        let slot = &self.slots[conn.index as usize];
        *slot.conn.write().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
        slot.tag.store(conn.tag, Ordering::Release);
    }

    /// Marks slot `index` not live: no worker looks its connection up any more.
    pub(super) fn retire(&self, index: u32) {
        self.slots[index as usize].tag.store(0, Ordering::Release);
        self.retired.fetch_add(1, Ordering::Release);
    }

    /// Bumped whenever a connection is retired: workers then drop their handles on dead
    /// ones (`ConnCache::prune`).
    pub(super) fn retirements(&self) -> u64 {
        self.retired.load(Ordering::Acquire)
    }

    /// Empties slot `index` (after `retire`), so it can be reused.
    pub(super) fn remove(&self, index: u32) -> Option<Arc<Conn>> {
        let slot = &self.slots[index as usize];
        slot.tag.store(0, Ordering::Release);
        slot.conn.write().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The connection in slot `index`, live or retired.
    pub(super) fn get(&self, index: u32) -> Option<Arc<Conn>> {
        let slot = self.slots.get(index as usize)?;
        slot.conn.read().ok()?.clone()
    }

    /// The word holding slot `index`'s live tag (0: none).
    #[inline(always)]
    pub(super) fn tag_word(&self, index: u32) -> Option<&AtomicU32> {
        self.slots.get(index as usize).map(|s| &s.tag)
    }

    /// Empties every slot, for shutdown: the connections taken out.
    pub(super) fn drain(&self) -> Vec<Arc<Conn>> {
        (0..self.slots.len() as u32)
            .filter_map(|i| self.remove(i))
            .collect()
    }
}

/// A worker's view of the connection table: the connection of each slot as of its tag, so
/// that looking one up takes no lock while it stays live.
pub(super) struct ConnCache {
    conns: Vec<Option<Arc<Conn>>>,
    /// `ConnTable::retirements` when it last pruned.
    pruned_at: u64,
}

impl ConnCache {
    pub(super) fn new(table: &ConnTable) -> ConnCache {
        ConnCache {
            conns: vec![None; table.len()],
            pruned_at: 0,
        }
    }

    /// Drops the handles on connections retired since the last call, so a dead one's memory
    /// is let go of (`Conn::on_release`) without waiting for its slot to be reused. One
    /// load unless something was retired.
    pub(super) fn prune(&mut self, table: &ConnTable) {
        let now = table.retirements();
        if now != self.pruned_at {
            self.pruned_at = now;
            for cached in &mut self.conns {
                if cached.as_ref().is_some_and(|c| c.is_dead()) {
                    *cached = None;
                }
            }
        }
    }

    /// The live connection at `index` (refreshed from `table` when the slot's tag changed).
    /// Borrowed, so the hot path clones no `Arc`.
    #[inline(always)]
    pub(super) fn lookup(&mut self, table: &ConnTable, index: u32) -> Option<&Arc<Conn>> {
        let slot = table.slots.get(index as usize)?;
        let tag = slot.tag.load(Ordering::Acquire);
        if tag == 0 {
            return None;
        }
        let cached = &mut self.conns[index as usize];
        if cached.as_ref().is_none_or(|c| c.tag != tag) {
            *cached = slot.conn.read().ok()?.clone();
        }
        cached.as_ref().filter(|c| c.tag == tag)
    }
}
