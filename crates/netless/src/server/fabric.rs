//! Serving in a memory fabric: the replica's segments live in the region, its entry in the
//! region's directory names them, and clients are admitted through the entry's connect
//! slots, polled on the fabric's thread.
//!
//! Everything a client leaves in a slot is checked before use: its membership must be live,
//! its protocol ours, and its connection segment units that it holds, no longer than the
//! server maps. Every fabric client joins the owner's trust group: whoever can open the
//! region can write all of it, so the region is one trust group (give groups that must not
//! share a writable segment regions of their own). Each connection gets a local socket pair
//! in place of a Unix socket: the fabric's thread hangs up the far end when the client says
//! it is gone or its membership dies, and reads from it the goodbye the server writes, which
//! it leaves in the slot; so the acceptor watches and reclaims fabric connections as it does
//! socket ones.

use std::os::unix::net::UnixStream;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use netless_shm::fabric::{Extent, Fabric, Mailbox, MemberId, Request};
use netless_shm::recv_frame_by;

use super::handshake::{install, Inbox, Newcomer};
use super::polled::{PolledConn, PolledConns};
use super::state::ServerState;
use crate::segment::place::{CONTROL_EXTENT, MAILBOX_EXTENT, REPLICA_EXTENT};
use crate::segment::{ConnSegment, Place};
use crate::status::{Code, Status};
use crate::wire::handshake::{Frame, PROTOCOL_VERSION};

/// The server's entry in a fabric, withdrawn when the server drops; its memory is given
/// back once every client that was connected is gone (the admissions' last step).
pub(super) struct Published {
    fabric: Fabric,
    entry: u32,
    stopped: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Published {
    fn drop(&mut self) {
        self.fabric.withdraw(self.entry);
        self.stopped
            .store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Publishes `server` in `fabric` and starts admitting its clients.
pub(super) fn publish(
    server: &Arc<ServerState>,
    fabric: &Fabric,
    inbox: Arc<Inbox>,
    polled: Option<Arc<PolledConns>>,
) -> Result<Published, Status> {
    let no_extent = || Status::internal("a fabric server's segment has no extent");
    let replica = server
        .groups
        .get(0)
        .and_then(|g| g.replica.extent())
        .ok_or_else(no_extent)?;
    let control = server.control.extent().ok_or_else(no_extent)?;
    let (mailbox_segment, mailbox_extent) = Place::Fabric(fabric)
        .segment("netless-mailbox", netless_shm::fabric::UNIT)
        .map_err(|e| Status::resource_exhausted(format!("cannot make connect slots: {e}")))?;
    drop(mailbox_segment);
    let mailbox_extent = mailbox_extent.ok_or_else(no_extent)?;
    let mut extents = [Extent { offset: 0, len: 0 }; 3];
    extents[REPLICA_EXTENT] = replica;
    extents[CONTROL_EXTENT] = control;
    extents[MAILBOX_EXTENT] = mailbox_extent;
    let entry = fabric
        .publish(
            &server.service,
            server.config.replica,
            extents,
            u64::from(PROTOCOL_VERSION),
        )
        .map_err(|e| {
            fabric.free(mailbox_extent);
            Status::resource_exhausted(format!("cannot publish service `{}`: {e}", server.service))
        })?;
    let mailbox = fabric
        .mailbox(mailbox_extent)
        .map_err(|e| Status::internal(e.to_string()))?;
    let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut admissions = Admissions {
        server: Arc::downgrade(server),
        inbox,
        polled,
        mailbox,
        links: Vec::new(),
        refused: Vec::new(),
        generation: 0,
        claimed: Vec::new(),
        extents,
        stopped: stopped.clone(),
        stopping: false,
    };
    fabric.watch(Box::new(move |fabric| admissions.step(fabric)));
    Ok(Published {
        fabric: fabric.clone(),
        entry,
        stopped,
    })
}

/// Admission and the live connections, stepped on the fabric's thread.
struct Admissions {
    server: Weak<ServerState>,
    inbox: Arc<Inbox>,
    /// The software-coherent connections, in a region without hardware coherence.
    polled: Option<Arc<PolledConns>>,
    mailbox: Mailbox,
    links: Vec<Link>,
    /// Slots whose client was refused, and since when: freed once it read why.
    refused: Vec<(usize, u64, Option<MemberId>, Instant)>,
    generation: u32,
    /// Slots seen mid-claim, and since when: a client that died claiming one leaves it so.
    claimed: Vec<(usize, u64, Instant)>,
    /// The server's replica, control and mailbox segments.
    extents: [Extent; 3],
    /// Set when the server drops its entry.
    stopped: Arc<std::sync::atomic::AtomicBool>,
    /// The server stopped: its clients were told, and their going is awaited.
    stopping: bool,
}

impl Admissions {
    fn step(&mut self, fabric: &Fabric) -> bool {
        let server = self.server.upgrade().filter(|s| {
            !s.is_stopping() && !self.stopped.load(std::sync::atomic::Ordering::Acquire)
        });
        match &server {
            Some(server) if !fabric.is_evicted() => {
                for request in self.mailbox.requests() {
                    self.admit(server, fabric, request);
                }
            }
            _ if !self.stopping => {
                self.stopping = true;
                for link in &self.links {
                    self.mailbox.server_gone(
                        link.slot,
                        link.seq,
                        Code::Unavailable as u32,
                        "the service is shutting down",
                    );
                }
            }
            _ => {}
        }
        drop(server);
        let mailbox = self.mailbox.clone();
        self.links.retain_mut(|link| link.step(fabric, &mailbox));
        self.release_refused(fabric);
        self.free_stale_claims(fabric.lease());
        if self.stopping && self.links.is_empty() {
            // No client writes into the server's segments any more: give them back.
            for extent in self.extents {
                fabric.free(extent);
            }
            return false;
        }
        true
    }

    /// Frees the slots of refused clients once they read why (or died, or two leases on).
    fn release_refused(&mut self, fabric: &Fabric) {
        let quarantine = 2 * fabric.lease();
        let mailbox = &self.mailbox;
        self.refused.retain(|&(slot, seq, client, since)| {
            let done = mailbox.is_client_gone(slot, seq)
                || client.is_none_or(|c| !fabric.is_alive(c))
                || since.elapsed() > quarantine;
            !(done
                && (mailbox.release(slot, seq) || mailbox.state(slot).is_none_or(|s| s.1 != seq)))
        });
    }

    fn free_stale_claims(&mut self, lease: Duration) {
        let now = Instant::now();
        let mut still = Vec::new();
        for slot in 0..self.mailbox.slots() {
            if let Some((netless_shm::fabric::Phase::Claimed, seq)) = self.mailbox.state(slot) {
                let since = self
                    .claimed
                    .iter()
                    .find(|c| c.0 == slot && c.1 == seq)
                    .map_or(now, |c| c.2);
                if now.duration_since(since) > 2 * lease {
                    self.mailbox.release(slot, seq);
                } else {
                    still.push((slot, seq, since));
                }
            }
        }
        self.claimed = still;
    }

    /// Admits the request in a slot, or refuses it saying why.
    fn admit(&mut self, server: &ServerState, fabric: &Fabric, request: Request) {
        let (slot, seq, client) = (request.slot, request.seq, request.client);
        if let Err(status) = self.try_admit(server, fabric, request) {
            if self
                .mailbox
                .refuse(slot, seq, status.code() as u32, status.message())
            {
                self.refused.push((slot, seq, client, Instant::now()));
            }
        }
    }

    fn try_admit(
        &mut self,
        server: &ServerState,
        fabric: &Fabric,
        request: Request,
    ) -> Result<(), Status> {
        let (slot, seq) = (request.slot, request.seq);
        let Some(client) = request.client.filter(|&c| fabric.is_alive(c)) else {
            // Nobody to tell: the slot is free again.
            self.mailbox.release(slot, seq);
            return Ok(());
        };
        let words = request.words;
        if words[0] != u64::from(PROTOCOL_VERSION) {
            return Err(Status::unavailable(format!(
                "client speaks netless protocol {}, server {PROTOCOL_VERSION}",
                words[0]
            )));
        }
        let conn_extent = Extent {
            offset: words[2],
            len: words[3],
        };
        let max = ConnSegment::max_len(server.config.max_client_ring);
        if !fabric.is_owned_by(conn_extent, client, max as u64) {
            return Err(Status::invalid_argument(format!(
                "the connection segment the client named is not memory it holds, or is longer \
                 than the {max} bytes this server maps (its max_client_ring)"
            )));
        }
        let attached = fabric
            .map(conn_extent)
            .map_err(|e| e.to_string())
            .and_then(ConnSegment::attach_segment);
        let (segment, producer) = match attached {
            Ok(s) => s,
            Err(e) => return Err(Status::invalid_argument(e)),
        };
        let client_max = usize::try_from(words[1]).unwrap_or(usize::MAX);
        // Refs from a member of our domain whose claim to its row holds (see
        // `Domain::verify_fabric_member`).
        let peer_member = server.config.domain.as_ref().and_then(|d| {
            let claim = netless_pool::MemberClaim {
                member: (words[5] >> 32) as u32,
                generation: words[5] as u32,
            };
            (words[4] != 0 && words[4] == d.id())
                .then(|| d.verify_fabric_member(claim, client))
                .flatten()
        });
        let by_ref = peer_member.is_some();
        let rings = match (&self.polled, words[6]) {
            (None, 0) => None,
            (Some(_), 0) => {
                return Err(Status::new(
                    Code::FailedPrecondition,
                    "this fabric is software-coherent: a client must bring polled rings (its \
                     netless is too old, or it opened the region as hardware-coherent)",
                ))
            }
            (None, _) => {
                return Err(Status::new(
                    Code::FailedPrecondition,
                    "this fabric is hardware-coherent: polled rings are not served here",
                ))
            }
            (Some(_), offset) => {
                let extent = Extent {
                    offset,
                    len: words[7],
                };
                match attach_rings(fabric, client, extent) {
                    Ok(rings) => Some(rings),
                    Err(e) => return Err(Status::invalid_argument(e)),
                }
            }
        };
        let (near, far) = match UnixStream::pair() {
            Ok(pair) => pair,
            Err(e) => return Err(Status::resource_exhausted(format!("socketpair: {e}"))),
        };
        let _ = far.set_nonblocking(true);
        self.generation = self.generation.wrapping_add(1);
        let newcomer = Newcomer {
            uid: server.owner_uid,
            segment,
            producer,
            client_max,
            peer_member,
            generation: self.generation,
            // A client on another host has no CPU of this one.
            cpu: None,
        };
        let conn = install(server, newcomer, &near)?;
        if let Some(group) = server.group(&conn) {
            // Put back what a faulty member of the group may have overwritten.
            group.replica.restore_headers();
        }
        if !fabric.same_kernel(client) {
            // Its wake-ups never reach our workers' futexes: they poll from now on.
            server
                .remote_clients
                .store(true, crate::sync::Ordering::Relaxed);
        }
        let reply = [
            u64::from(PROTOCOL_VERSION),
            u64::from(conn.index),
            u64::from(conn.tag),
            conn.token,
            server.domain_id(),
            u64::from(by_ref),
            0,
            0,
        ];
        if !self.mailbox.accept(slot, seq, reply) {
            server.conns.remove(conn.index);
            server.count_connection(-1);
            return Ok(());
        }
        // When the last handle on the connection drops, nothing of the server writes into
        // the client's memory any more: say so, and give back what was adopted from a dead
        // client.
        let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let adopted: Arc<std::sync::Mutex<Vec<Extent>>> = Arc::default();
        {
            let (mailbox, fabric) = (self.mailbox.clone(), fabric.clone());
            let (released, adopted) = (released.clone(), adopted.clone());
            *super::conn::lock(&conn.on_release) = Some(Box::new(move || {
                mailbox.released(slot, seq);
                // Under the lock the link adopts under: nothing is adopted after this.
                let mut adopted = super::conn::lock(&adopted);
                for extent in adopted.drain(..) {
                    fabric.free(extent);
                }
                released.store(true, std::sync::atomic::Ordering::Release);
            }));
        }
        let mut client_extents = vec![conn_extent];
        if words[6] != 0 {
            client_extents.push(Extent {
                offset: words[6],
                len: words[7],
            });
        }
        if let (Some(polled), Some(rings)) = (&self.polled, rings) {
            let polled_conn = Arc::new(PolledConn::new(
                conn.clone(),
                client_max,
                rings,
                peer_member,
            ));
            let _ = conn.polled.set(Arc::downgrade(&polled_conn));
            polled.add(polled_conn);
        }
        self.inbox.deliver(conn);
        self.links.push(Link {
            slot,
            seq,
            client,
            far,
            hung_up: false,
            done: false,
            client_extents,
            adopted,
            released,
        });
        Ok(())
    }
}

/// The server's end of one fabric connection.
struct Link {
    slot: usize,
    seq: u64,
    client: MemberId,
    /// The far end of the connection's socket pair.
    far: UnixStream,
    /// Whether the client is gone and the connection was hung up.
    hung_up: bool,
    /// Whether the server is done with the connection (and said so in the slot).
    done: bool,
    /// The client's memory the server maps (connection segment, polled rings): adopted if
    /// the client dies, so the fabric does not hand it out while a reply may still land.
    client_extents: Vec<Extent>,
    adopted: Arc<std::sync::Mutex<Vec<Extent>>>,
    /// Set when the connection's last handle dropped (see `Conn::on_release`).
    released: Arc<std::sync::atomic::AtomicBool>,
}

impl Link {
    /// One tick; `false` once the connection is over on both sides and the slot is free.
    fn step(&mut self, fabric: &Fabric, mailbox: &Mailbox) -> bool {
        let dead = !fabric.is_alive(self.client);
        if dead && !self.client_extents.is_empty() {
            // Before the fabric reclaims them (two leases on), while a reply may still land.
            let mut adopted = super::conn::lock(&self.adopted);
            if self.released.load(std::sync::atomic::Ordering::Acquire) {
                self.client_extents.clear();
            }
            for extent in self.client_extents.drain(..) {
                if fabric.adopt(extent) {
                    adopted.push(extent);
                }
            }
        }
        if !self.hung_up && (dead || mailbox.is_client_gone(self.slot, self.seq)) {
            let _ = self.far.shutdown(std::net::Shutdown::Both);
            self.hung_up = true;
        }
        if !self.done {
            let mut byte = [0u8; 1];
            let status = match rustix::net::recv(
                &self.far,
                &mut byte,
                rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
            ) {
                Ok((0, _)) | Err(rustix::io::Errno::PIPE | rustix::io::Errno::CONNRESET) => {
                    Some(Status::unavailable("the service closed the connection"))
                }
                Ok(_) => {
                    let deadline = Instant::now() + Duration::from_millis(10);
                    match recv_frame_by(&self.far, 0, 64 * 1024, deadline) {
                        Ok((bytes, _)) => match Frame::decode(&bytes) {
                            Some(Frame::Goodbye(status)) => Some(status),
                            _ => Some(Status::unavailable("the service closed the connection")),
                        },
                        Err(_) => Some(Status::unavailable("the service closed the connection")),
                    }
                }
                Err(_) => None,
            };
            if let Some(status) = status {
                mailbox.server_gone(self.slot, self.seq, status.code() as u32, status.message());
                self.done = true;
            }
        }
        if self.done && self.hung_up && self.released.load(std::sync::atomic::Ordering::Acquire) {
            mailbox.release(self.slot, self.seq);
            return false;
        }
        true
    }
}

/// Maps a client's polled extent and attaches to its rings: the server consumes requests and
/// produces replies.
fn attach_rings(
    fabric: &Fabric,
    client: MemberId,
    extent: Extent,
) -> Result<crate::polled::ServerRings, String> {
    if !fabric.is_owned_by(extent, client, crate::polled::MAX_EXTENT as u64) {
        return Err(format!(
            "the polled rings the client named are not memory it holds, or longer than the {} \
             bytes a server maps",
            crate::polled::MAX_EXTENT
        ));
    }
    let segment = fabric.map(extent).map_err(|e| e.to_string())?;
    crate::polled::ServerRings::attach(fabric, segment)
}
