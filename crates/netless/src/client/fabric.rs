//! Connecting through a memory fabric: the client's half of the handshake when client and
//! server share nothing but the region.
//!
//! The service's directory entry names its replica, control and mailbox extents; each is
//! checked to be units its publisher holds before it is mapped. Our connection segment is
//! made in the fabric; its extent goes in a connect slot with our protocol version, and the
//! server's answer comes back in the slot. The connection then gets a local socket pair in
//! place of the Unix socket: the fabric's thread writes the server's goodbye into the far
//! end and hangs it up when the server says it is done or its membership dies, and says we
//! are gone when we hang up our end; so the monitor thread, the wait loops and drop work as
//! they do over a socket.

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use netless_shm::fabric::{Extent, Fabric, Mailbox, MemberId, Phase, SLOT_BYTES};
use netless_shm::send_frame;

use super::connect::fragment_body;
use super::connection::Handshaken;
use super::polled::PolledClient;
use crate::config::ClientConfig;
use crate::polled::ClientRings;
use crate::segment::place::{CONTROL_EXTENT, MAILBOX_EXTENT, REPLICA_EXTENT};
use crate::segment::{ConnSegment, ControlSegment, Place, ReplicaSegment};
use crate::status::{Code, Status};
use crate::wire::handshake::{Frame, PROTOCOL_VERSION};
use netless_shm::coherence::Coherence;

/// Connects to `service` (replica `replica`) published in `fabric`.
pub(super) fn handshake(
    service: &str,
    replica: Option<u32>,
    fabric: &Fabric,
    config: ClientConfig,
) -> Result<Handshaken, Status> {
    let named = match replica {
        Some(r) => format!("{service}#{r}"),
        None => service.to_owned(),
    };
    let Some(entry) = fabric.lookup(service, replica).into_iter().next() else {
        return Err(Status::unavailable(format!(
            "service `{named}` not found in the fabric: is its server running, with the same \
             fabric?"
        )));
    };
    if entry.attrs != u64::from(PROTOCOL_VERSION) {
        return Err(Status::unavailable(format!(
            "service `{named}` speaks netless protocol {}, this client {PROTOCOL_VERSION}",
            entry.attrs
        )));
    }
    let server = entry.owner;
    let extent = |i: usize, max: usize| -> Result<Extent, Status> {
        let e = entry.extents[i];
        if fabric.is_owned_by(e, server, max as u64) {
            Ok(e)
        } else {
            Err(Status::unavailable(format!(
                "service `{named}`'s directory entry names memory its server does not hold: \
                 it is malformed or stale; retry"
            )))
        }
    };
    let replica_extent = extent(REPLICA_EXTENT, crate::segment::replica::MAX_REPLICA_LEN)?;
    let control_extent = extent(CONTROL_EXTENT, ControlSegment::max_len())?;
    let mailbox_extent = extent(MAILBOX_EXTENT, 1 << 20)?;
    let unmappable = |e: netless_shm::Error| {
        Status::unavailable(format!("cannot map service `{named}`'s segments: {e}"))
    };
    let control =
        ControlSegment::attach_view(fabric.map_read_only(control_extent).map_err(unmappable)?)?;
    let replica_segment = ReplicaSegment::attach_segment(
        fabric.map(replica_extent).map_err(unmappable)?,
        std::sync::Arc::new(control),
    )?;
    let fragment_body = fragment_body(&named, &replica_segment)?;
    let mailbox = fabric.mailbox(mailbox_extent).map_err(unmappable)?;
    if mailbox.slots() == 0 || mailbox_extent.len < SLOT_BYTES as u64 {
        return Err(Status::unavailable(format!(
            "service `{named}` publishes no connect slots"
        )));
    }
    let (segment, consumer) = ConnSegment::create_in(config.ring_bytes, Place::Fabric(fabric))?;
    let Some(conn_extent) = segment.extent() else {
        return Err(Status::internal("a fabric segment without an extent"));
    };
    let rings = if fabric.coherence() == Coherence::Software {
        match ClientRings::create(fabric, config.ring_bytes) {
            Ok(rings) => Some(rings),
            Err(e) => {
                fabric.free(conn_extent);
                return Err(e);
            }
        }
    } else {
        None
    };
    let mut extents = vec![conn_extent];
    extents.extend(rings.as_ref().map(|r| r.extent));
    let polled_extent = rings.as_ref().map(|r| r.extent);
    // Pass by reference if our domain is in this fabric too: our row, for the server to
    // check against the pool.
    let (domain, claim) = config.domain.as_ref().map_or((0, 0), |d| {
        let claim = d.fabric_claim();
        (
            d.id(),
            u64::from(claim.member) << 32 | u64::from(claim.generation),
        )
    });
    let request = [
        u64::from(PROTOCOL_VERSION),
        config.max_message as u64,
        conn_extent.offset,
        conn_extent.len,
        domain,
        claim,
        polled_extent.map_or(0, |e| e.offset),
        polled_extent.map_or(0, |e| e.len),
    ];
    let Some((slot, seq)) = mailbox.post(fabric.member(), request) else {
        drop(rings);
        for extent in &extents {
            fabric.free(*extent);
        }
        return Err(Status::resource_exhausted(format!(
            "service `{named}` has all its {} connect slots taken: retry later",
            mailbox.slots()
        )));
    };
    let deadline = Instant::now() + config.connect_timeout;
    // Giving up: the server may have mapped our memory (it admitted us after all), so it
    // goes back once the server says it refused us, released it, or moved on, or is dead.
    let give_up = |status: Status| {
        if fabric.is_alive(server) {
            mailbox.client_gone(slot, seq);
        }
        let mut drain = Drain {
            mailbox: mailbox.clone(),
            slot,
            seq,
            server,
            extents: extents.clone(),
        };
        if drain.step(fabric) {
            fabric.watch(Box::new(move |fabric| drain.step(fabric)));
        }
        Err(status)
    };
    let mut pause = Duration::from_micros(50);
    let reply = loop {
        match mailbox.state(slot) {
            Some((Phase::Accepted, s)) if s == seq => break mailbox.reply(slot),
            Some((Phase::Refused, s)) if s == seq => {
                let (code, reason) = mailbox.reason(slot);
                let code = u16::try_from(code)
                    .ok()
                    .and_then(Code::from_u16)
                    .unwrap_or(Code::Unavailable);
                return give_up(Status::new(code, reason));
            }
            Some((Phase::Request, s)) if s == seq => {}
            _ => {
                return give_up(Status::unavailable(format!(
                    "service `{named}`'s connect slot was taken from under us: retry"
                )))
            }
        }
        if !fabric.is_alive(server) {
            return give_up(server_dead(&named));
        }
        if Instant::now() >= deadline {
            return give_up(Status::unavailable(format!(
                "service `{named}` did not answer within {:?} (ClientConfig::connect_timeout)",
                config.connect_timeout
            )));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    };
    if reply[0] != u64::from(PROTOCOL_VERSION) {
        return give_up(Status::unavailable(format!(
            "service `{named}` answered in netless protocol {}, this client speaks \
             {PROTOCOL_VERSION}",
            reply[0]
        )));
    }
    // Refs only if the server says it checked our claim against its pool, which is ours.
    let pool = config
        .domain
        .clone()
        .filter(|d| reply[5] == 1 && reply[4] == d.id() && d.id() != 0);
    // Payloads by reference over polled rings go through our view of the pool's pages.
    let pages = match (&rings, &pool) {
        (Some(_), Some(d)) => match d.pages_view(fabric.coherence(), fabric.emulation()) {
            Ok(view) => Some(view),
            Err(e) => return give_up(Status::internal(e.to_string())),
        },
        _ => None,
    };
    let polled = rings.map(|rings| PolledClient::new(rings, pages));
    let (near, far) = match UnixStream::pair() {
        Ok(pair) => pair,
        Err(e) => return give_up(Status::resource_exhausted(format!("socketpair: {e}"))),
    };
    let _ = far.set_nonblocking(true);
    let mut link = Link {
        mailbox,
        slot,
        seq,
        server,
        far,
        extents: extents.clone(),
        service: named.clone(),
        told: None,
        hung_up: false,
    };
    fabric.watch(Box::new(move |fabric| link.step(fabric)));
    Ok(Handshaken {
        service: named,
        dir: fabric.path().to_owned(),
        pool,
        replica: replica_segment,
        segment,
        consumer,
        conn_index: reply[1] as u32,
        tag: reply[2] as u32,
        token: reply[3],
        fragment_body,
        socket: near,
        config,
        polled,
        max_sleep: if fabric.same_kernel(server) {
            super::wait::MAX_SLEEP
        } else {
            REMOTE_SLEEP
        },
    })
}

/// Longest sleep of a call waiting for a server on another kernel: no futex wake-up crosses,
/// so the waiter polls.
pub(crate) const REMOTE_SLEEP: Duration = Duration::from_micros(100);

fn server_dead(service: &str) -> Status {
    Status::unavailable(format!(
        "service `{service}`'s server stopped: its fabric membership ended (it exited, was \
         killed, or stopped beating); retry when it is back"
    ))
}

/// The memory of a connection given up on during its handshake, waiting to be given back.
struct Drain {
    mailbox: Mailbox,
    slot: usize,
    seq: u64,
    server: MemberId,
    extents: Vec<Extent>,
}

impl Drain {
    /// One tick; `false` once the memory is back.
    fn step(&mut self, fabric: &Fabric) -> bool {
        if !fabric.is_alive(self.server) {
            for extent in &self.extents {
                fabric.free_later(*extent);
            }
            return false;
        }
        let settled = match self.mailbox.state(self.slot) {
            // Refused (nothing of ours was kept), or the slot moved on without us.
            Some((Phase::Refused, s)) if s == self.seq => true,
            Some((_, s)) if s != self.seq => true,
            Some((Phase::Free, _)) | None => true,
            _ => self.mailbox.is_released(self.slot, self.seq),
        };
        if settled {
            for extent in &self.extents {
                fabric.free(*extent);
            }
        }
        !settled
    }
}

/// The client's end of a fabric connection, stepped on the fabric's thread.
struct Link {
    mailbox: Mailbox,
    slot: usize,
    seq: u64,
    server: MemberId,
    /// The far end of the connection's socket pair.
    far: UnixStream,
    /// The connection segment, and the polled rings if any: given back once the server
    /// released them (or died).
    extents: Vec<Extent>,
    service: String,
    /// Ticks since the connection was told the server is gone (a call mid-request finishes
    /// writing within one), then `client_gone` is said.
    told: Option<u32>,
    /// Whether the client dropped the connection.
    hung_up: bool,
}

impl Link {
    /// One tick; `false` once the connection is over on both sides and its memory is back.
    fn step(&mut self, fabric: &Fabric) -> bool {
        let server_alive = fabric.is_alive(self.server);
        match self.told {
            None => {
                let status = if !server_alive {
                    Some(server_dead(&self.service))
                } else if self.mailbox.is_server_gone(self.slot, self.seq) {
                    let (code, reason) = self.mailbox.reason(self.slot);
                    Some(Status::new(
                        u16::try_from(code)
                            .ok()
                            .and_then(Code::from_u16)
                            .unwrap_or(Code::Unavailable),
                        reason,
                    ))
                } else {
                    None
                };
                if let Some(status) = status {
                    let _ = send_frame(&self.far, &Frame::Goodbye(status).encode(), &[]);
                    let _ = self.far.shutdown(std::net::Shutdown::Write);
                    self.told = Some(0);
                }
            }
            Some(ticks) => self.told = Some(ticks.saturating_add(1)),
        }
        if !self.hung_up {
            // The client hangs up its end when it drops the connection.
            let mut byte = [0u8; 1];
            self.hung_up = matches!(
                rustix::net::recv(&self.far, &mut byte, rustix::net::RecvFlags::DONTWAIT),
                Ok((0, _)) | Err(rustix::io::Errno::PIPE | rustix::io::Errno::CONNRESET)
            );
        }
        // No more requests from us: say so (never into a dead server's memory, which may be
        // someone else's by now).
        if server_alive && (self.hung_up || self.told.is_some_and(|t| t >= 1)) {
            self.mailbox.client_gone(self.slot, self.seq);
        }
        if !self.hung_up {
            return true;
        }
        // Our memory goes back once the server says nothing of it writes there any more,
        // or once it is dead.
        if self.mailbox.is_released(self.slot, self.seq) && server_alive {
            for extent in &self.extents {
                fabric.free(*extent);
            }
            return false;
        }
        if !server_alive {
            for extent in &self.extents {
                fabric.free_later(*extent);
            }
            return false;
        }
        true
    }
}
