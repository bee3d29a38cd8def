//! What the node holds: sessions and their holds, objects and their pages, and the bytes set
//! aside for Puts and Derives under way. Every operation is a short synchronous step taking
//! the current time as an argument, so the server calls it under its lock and never awaits
//! inside, and the tests move time by hand. Every refusal is a `tonic::Status` whose message
//! says what happened and what to do, and names nothing of another session.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::time::Instant;

use bytes::Bytes;
use tonic::Status;

use crate::pages::{PageId, PageStore};
use crate::proto::StatsReply;
use crate::reference::{Forgery, Keys, RemoteRef};
use crate::{MemNodeConfig, PAGE_SIZE};

/// Bytes of a session id: random, so one holder cannot guess another's.
pub(crate) const SESSION_ID_LEN: usize = 16;
/// The longest holder label `Open` accepts.
pub(crate) const MAX_HOLDER_LEN: usize = 128;

pub(crate) type SessionId = [u8; SESSION_ID_LEN];

const PAGE: u64 = PAGE_SIZE as u64;

#[derive(Debug)]
struct Object {
    len: u64,
    pages: Vec<PageId>,
    /// Sessions that hold it; at 0 it is freed.
    holders: u64,
}

#[derive(Debug)]
struct SessionEntry {
    holder: String,
    peer: Peer,
    expires: Instant,
    holds: HashSet<u64>,
}

/// Who opened a session: the IP address of its connection, `None` if the transport does
/// not say (all such clients count as one).
pub(crate) type Peer = Option<IpAddr>;

/// The node's state; the server keeps it behind one mutex.
#[derive(Debug)]
pub(crate) struct State {
    config: MemNodeConfig,
    capacity_pages: u64,
    keys: Keys,
    pages: PageStore,
    objects: HashMap<u64, Object>,
    next_object: u64,
    sessions: HashMap<SessionId, SessionEntry>,
    /// Sessions open per peer (no entry: none).
    peers: HashMap<Peer, usize>,
    holds: u64,
    reserved_pages: u64,
    pages_read: u64,
}

impl State {
    /// An empty node with fresh keys.
    ///
    /// # Errors
    /// If the system's random source fails.
    pub(crate) fn new(config: MemNodeConfig) -> Result<State, ring::error::Unspecified> {
        Ok(State {
            capacity_pages: config.capacity_bytes / PAGE,
            config,
            keys: Keys::generate()?,
            pages: PageStore::default(),
            objects: HashMap::new(),
            next_object: 1,
            sessions: HashMap::new(),
            peers: HashMap::new(),
            holds: 0,
            reserved_pages: 0,
            pages_read: 0,
        })
    }

    pub(crate) fn config(&self) -> &MemNodeConfig {
        &self.config
    }

    /// A new session for `holder`, opened by `peer`, alive until `now` + lease unless kept
    /// alive.
    pub(crate) fn open(
        &mut self,
        holder: &str,
        peer: Peer,
        now: Instant,
    ) -> Result<SessionId, Status> {
        if holder.len() > MAX_HOLDER_LEN {
            return Err(Status::invalid_argument(format!(
                "the holder label is {} bytes, over the limit of {MAX_HOLDER_LEN}: use a shorter name",
                holder.len()
            )));
        }
        self.sweep(now);
        if self.sessions.len() >= self.config.max_sessions {
            return Err(Status::resource_exhausted(format!(
                "the memory node has {} sessions open, its limit: close sessions no longer used, \
                 or retry when leases run out",
                self.sessions.len()
            )));
        }
        let from_peer = self.peers.get(&peer).copied().unwrap_or(0);
        if from_peer >= self.config.max_sessions_per_peer {
            let from = peer.map_or_else(
                || "clients of unknown address (over netless, say), which count as one".to_owned(),
                |ip| ip.to_string(),
            );
            return Err(Status::resource_exhausted(format!(
                "{from_peer} sessions are open from {from}, the limit per client: close \
                 sessions no longer used (one session holds many objects), or retry when \
                 leases run out"
            )));
        }
        let expires = self.expiry(now)?;
        let mut id = [0u8; SESSION_ID_LEN];
        self.keys
            .fill(&mut id)
            .map_err(|_| Status::unavailable("the memory node's random source failed: retry"))?;
        self.sessions.insert(
            id,
            SessionEntry {
                holder: holder.to_owned(),
                peer,
                expires,
                holds: HashSet::new(),
            },
        );
        *self.peers.entry(peer).or_default() += 1;
        Ok(id)
    }

    /// The live session `id` names; an expired one is closed here (its holds released).
    pub(crate) fn session(&mut self, id: &[u8], now: Instant) -> Result<SessionId, Status> {
        let lease = self.config.lease.as_millis();
        let unknown = || {
            Status::unauthenticated(format!(
                "no such session on this memory node (closed, or no KeepAlive within its \
                 {lease} ms lease, or the node restarted): open a new one"
            ))
        };
        let id: SessionId = id.try_into().map_err(|_| unknown())?;
        let expires = self.sessions.get(&id).ok_or_else(unknown)?.expires;
        if expires <= now {
            self.end_session(&id, true);
            return Err(unknown());
        }
        Ok(id)
    }

    /// Extends session `id` by a lease from `now`.
    pub(crate) fn keep_alive(&mut self, id: &[u8], now: Instant) -> Result<(), Status> {
        let id = self.session(id, now)?;
        let expires = self.expiry(now)?;
        if let Some(entry) = self.sessions.get_mut(&id) {
            entry.expires = expires;
        }
        Ok(())
    }

    /// When a session kept alive at `now` expires.
    fn expiry(&self, now: Instant) -> Result<Instant, Status> {
        // MemNodeConfig::validate keeps the lease to a day; this is for a State made without.
        now.checked_add(self.config.lease).ok_or_else(|| {
            Status::internal(
                "the memory node's lease is too long for its clock: configure at most a day",
            )
        })
    }

    /// Ends session `id`; returns how many holds it released.
    pub(crate) fn close(&mut self, id: &[u8], now: Instant) -> Result<u64, Status> {
        let id = self.session(id, now)?;
        Ok(self.end_session(&id, false))
    }

    /// Closes every session whose lease ran out by `now`; returns how many.
    pub(crate) fn sweep(&mut self, now: Instant) -> usize {
        let expired: Vec<SessionId> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.expires <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            self.end_session(id, true);
        }
        expired.len()
    }

    fn end_session(&mut self, id: &SessionId, expired: bool) -> u64 {
        let Some(entry) = self.sessions.remove(id) else {
            return 0;
        };
        if let Some(count) = self.peers.get_mut(&entry.peer) {
            *count -= 1;
            if *count == 0 {
                self.peers.remove(&entry.peer);
            }
        }
        let released = entry.holds.len() as u64;
        if expired {
            // Escaped: a label is the client's text, and may hold newlines or escapes.
            tracing::info!(
                holder = ?entry.holder,
                released,
                "memory node: a session's lease ran out; its holds are released"
            );
        }
        for object in entry.holds {
            self.drop_hold(object);
        }
        released
    }

    /// Sets `pages` pages aside for an object being built.
    pub(crate) fn reserve(&mut self, pages: u64) -> Result<(), Status> {
        let taken = self.pages.len() + self.reserved_pages;
        if taken.saturating_add(pages) > self.capacity_pages {
            let free = self.capacity_pages.saturating_sub(taken) * PAGE;
            return Err(Status::resource_exhausted(format!(
                "the memory node is full: {} more bytes wanted, {free} of {} free; release \
                 objects no longer needed, or retry later",
                pages * PAGE,
                self.capacity_pages * PAGE
            )));
        }
        self.reserved_pages += pages;
        Ok(())
    }

    /// Returns pages set aside by [`State::reserve`].
    pub(crate) fn unreserve(&mut self, pages: u64) {
        debug_assert!(pages <= self.reserved_pages);
        self.reserved_pages = self.reserved_pages.saturating_sub(pages);
    }

    /// Checks an object length against the node's limit.
    pub(crate) fn check_len(&self, len: u64) -> Result<(), Status> {
        if len > self.config.max_object_bytes {
            return Err(Status::resource_exhausted(format!(
                "an object of {len} bytes is over this memory node's limit of {} bytes: split it",
                self.config.max_object_bytes
            )));
        }
        Ok(())
    }

    /// The object `reference` names, if this run issued it and it is still held.
    fn object(&self, reference: &RemoteRef) -> Result<&Object, Status> {
        match self.keys.verify(reference) {
            Ok(()) => {}
            Err(Forgery::OtherIncarnation) => {
                return Err(Status::not_found(
                    "the memory node restarted since this reference was made; its data is gone: \
                     put the object again",
                ))
            }
            Err(Forgery::BadMac) => {
                return Err(Status::permission_denied(
                    "not a reference this memory node issued (forged or altered): pass the \
                     bytes of RemoteRef::to_bytes() unchanged",
                ))
            }
        }
        self.objects.get(&reference.object()).ok_or_else(|| {
            Status::not_found(format!(
                "no longer held: object {} was released by every session that held it, or \
                 their leases ran out; a callee that keeps a reference must retain it under \
                 its own session while the caller still holds it",
                reference.object()
            ))
        })
    }

    /// Checks `reference` and the page range `first..first + count` (count 0: to the end)
    /// against its object; returns the range's end.
    pub(crate) fn page_range(
        &self,
        reference: &RemoteRef,
        first: u64,
        count: u64,
    ) -> Result<u64, Status> {
        let object = self.object(reference)?;
        let total = object.pages.len() as u64;
        let end = if count == 0 {
            total.max(first)
        } else {
            first.saturating_add(count)
        };
        if end > total {
            return Err(Status::out_of_range(format!(
                "pages {first}..{end} are outside this object of {total} pages ({} bytes)",
                object.len
            )));
        }
        Ok(end)
    }

    /// Pages `first..end` of the object (the last one cut to its length), counted as read.
    pub(crate) fn read(
        &mut self,
        reference: &RemoteRef,
        first: u64,
        end: u64,
    ) -> Result<Vec<Bytes>, Status> {
        let object = self.object(reference)?;
        let (len, total) = (object.len, object.pages.len() as u64);
        if first > end || end > total {
            return Err(Status::out_of_range(format!(
                "pages {first}..{end} are outside this object of {total} pages ({len} bytes)"
            )));
        }
        let pages: Vec<Bytes> = object.pages[first as usize..end as usize]
            .iter()
            .zip(first..)
            .map(|(&id, i)| {
                let data = self.pages.data(id);
                let valid = (len - i * PAGE).min(PAGE) as usize;
                data.slice(..valid.min(data.len()))
            })
            .collect();
        self.pages_read += pages.len() as u64;
        Ok(pages)
    }

    /// Bytes of the base object's pages at `indices` (`None` past its end): what a Derive
    /// copies before writing, taken without holding the lock for the copy.
    pub(crate) fn base_pages(
        &self,
        base: &RemoteRef,
        indices: &[u64],
    ) -> Result<Vec<Option<Bytes>>, Status> {
        let object = self.object(base)?;
        Ok(indices
            .iter()
            .map(|&i| {
                object
                    .pages
                    .get(usize::try_from(i).ok()?)
                    .map(|&id| self.pages.data(id))
            })
            .collect())
    }

    /// Length and page count of the object `reference` names.
    pub(crate) fn shape(&self, reference: &RemoteRef) -> Result<(u64, u64), Status> {
        let object = self.object(reference)?;
        Ok((object.len, object.pages.len() as u64))
    }

    /// Stores a new object of `len` bytes made of `pages`, held by `session`.
    pub(crate) fn commit_put(
        &mut self,
        session: &[u8],
        len: u64,
        pages: Vec<Bytes>,
        now: Instant,
    ) -> Result<RemoteRef, Status> {
        let session = self.session(session, now)?;
        self.check_room(&session)?;
        let ids = pages.into_iter().map(|p| self.pages.insert(p)).collect();
        Ok(self.add_object(session, len, ids))
    }

    /// Stores a new object of `len` bytes: page `i` is `written[i]` if there is one, else
    /// the base's page `i`, shared. Held by `session`.
    pub(crate) fn commit_derive(
        &mut self,
        session: &[u8],
        base: &RemoteRef,
        len: u64,
        written: BTreeMap<u64, Bytes>,
        now: Instant,
    ) -> Result<RemoteRef, Status> {
        let session = self.session(session, now)?;
        let base_pages = self.object(base)?.pages.clone();
        let count = len.div_ceil(PAGE);
        if let Some(missing) =
            (0..count).find(|i| !written.contains_key(i) && *i >= base_pages.len() as u64)
        {
            return Err(Status::internal(format!(
                "derive: page {missing} is neither written nor in the base"
            )));
        }
        self.check_room(&session)?;
        let mut written = written;
        let ids = (0..count)
            .map(|i| match written.remove(&i) {
                Some(data) => self.pages.insert(data),
                None => {
                    let id = base_pages[i as usize];
                    self.pages.share(id);
                    id
                }
            })
            .collect();
        Ok(self.add_object(session, len, ids))
    }

    /// Whether `session` may hold one more object and the node store one more.
    fn check_room(&self, session: &SessionId) -> Result<(), Status> {
        if self.objects.len() >= self.config.max_objects {
            return Err(Status::resource_exhausted(format!(
                "the memory node holds {} objects, its limit: release objects no longer needed",
                self.objects.len()
            )));
        }
        self.check_holds(session)
    }

    /// Whether `session` may hold one more object, and the node keep one more hold.
    fn check_holds(&self, session: &SessionId) -> Result<(), Status> {
        if self.holds >= self.config.max_holds as u64 {
            return Err(Status::resource_exhausted(format!(
                "the memory node keeps {} holds, its limit: release objects no longer needed, \
                 or close sessions",
                self.holds
            )));
        }
        let holds = self.sessions.get(session).map_or(0, |s| s.holds.len());
        if holds >= self.config.max_holds_per_session {
            return Err(Status::resource_exhausted(format!(
                "this session holds {holds} objects, the limit per session: release some"
            )));
        }
        Ok(())
    }

    fn add_object(&mut self, session: SessionId, len: u64, pages: Vec<PageId>) -> RemoteRef {
        let id = self.next_object;
        self.next_object += 1;
        self.objects.insert(
            id,
            Object {
                len,
                pages,
                holders: 1,
            },
        );
        if let Some(entry) = self.sessions.get_mut(&session) {
            entry.holds.insert(id);
        }
        self.holds += 1;
        self.keys.issue(id, len)
    }

    /// `session` holds the object (holding twice is holding once).
    pub(crate) fn retain(
        &mut self,
        session: &[u8],
        reference: &RemoteRef,
        now: Instant,
    ) -> Result<(), Status> {
        let session = self.session(session, now)?;
        self.object(reference)?;
        let object = reference.object();
        if self
            .sessions
            .get(&session)
            .is_some_and(|s| s.holds.contains(&object))
        {
            return Ok(());
        }
        self.check_holds(&session)?;
        if let Some(entry) = self.sessions.get_mut(&session) {
            entry.holds.insert(object);
        }
        if let Some(o) = self.objects.get_mut(&object) {
            o.holders += 1;
        }
        self.holds += 1;
        Ok(())
    }

    /// `session` stops holding the object; the last holder frees it.
    pub(crate) fn release(
        &mut self,
        session: &[u8],
        reference: &RemoteRef,
        now: Instant,
    ) -> Result<(), Status> {
        let session = self.session(session, now)?;
        self.object(reference)?;
        let object = reference.object();
        let held = self
            .sessions
            .get_mut(&session)
            .is_some_and(|s| s.holds.remove(&object));
        if !held {
            return Err(Status::failed_precondition(
                "this session does not hold that object: release only what it put, derived \
                 or retained",
            ));
        }
        self.drop_hold(object);
        Ok(())
    }

    fn drop_hold(&mut self, object: u64) {
        self.holds -= 1;
        let Some(o) = self.objects.get_mut(&object) else {
            debug_assert!(false, "a hold on object {object}, which is not stored");
            return;
        };
        o.holders -= 1;
        if o.holders == 0 {
            if let Some(freed) = self.objects.remove(&object) {
                for page in freed.pages {
                    self.pages.release(page);
                }
            }
        }
    }

    pub(crate) fn stats(&self) -> StatsReply {
        StatsReply {
            objects: self.objects.len() as u64,
            pages: self.pages.len(),
            bytes: self.pages.len() * PAGE,
            sessions: self.sessions.len() as u64,
            holds: self.holds,
            reserved_bytes: self.reserved_pages * PAGE,
            capacity_bytes: self.capacity_pages * PAGE,
            pages_read: self.pages_read,
        }
    }

    /// How many objects hold the page at `index` of the object `reference` names.
    #[cfg(test)]
    pub(crate) fn page_refs(&self, reference: &RemoteRef, index: usize) -> u64 {
        let object = self.object(reference).unwrap();
        self.pages.refs(object.pages[index])
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
