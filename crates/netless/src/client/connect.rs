//! Connecting: the client's half of the handshake over the service's Unix socket (our
//! connection segment out, our trust group's replica segment and the server's read-only
//! control segment in), and the checks of who serves it (the uid the kernel reports for the
//! socket) and of what the server sent, before anything is sent to it or anything of it is
//! used.

use std::os::unix::net::UnixStream;
use std::path::Path;

use netless_shm::{peer_cred, recv_frame_by, send_frame, SocketDir};

use super::connection::Handshaken;
use crate::config::ClientConfig;
use crate::segment::{ConnSegment, ControlSegment, ReplicaSegment};
use crate::status::{Code, Status};
use crate::wire::handshake::{Frame, NO_CPU, NO_MEMBER, PROTOCOL_VERSION};
use crate::wire::header::HEADER_LEN;

/// Longest handshake frame read from a server (a `Reject` carries a status message).
const MAX_HANDSHAKE_FRAME: usize = 64 * 1024;

/// Connects to the server listening on socket `name` (a replica's) in `dir` as `service`.
pub(super) fn handshake(
    service: &str,
    dir: &SocketDir,
    name: &str,
    config: ClientConfig,
) -> Result<Handshaken, Status> {
    let path = dir.path().join(name);
    let not_found = || {
        Status::unavailable(format!(
                "service `{service}` not found in {}: is its server running? (set NETLESS_DIR if it uses another directory)",
                dir.path().display()
            ))
    };
    let socket = match dir.connect(name) {
        Ok(s) => s,
        Err(e) if netless_shm::nobody_listens(&e) => return Err(not_found()),
        Err(e) => {
            return Err(Status::unavailable(format!(
                "cannot connect to service `{service}` at {}: {e}",
                path.display()
            )))
        }
    };
    check_server(service, &path, dir, &socket, &config)?;
    let timeout = Some(config.connect_timeout);
    let io = |e: std::io::Error| Status::unavailable(format!("connecting to `{service}`: {e}"));
    socket.set_read_timeout(timeout).map_err(io)?;
    socket.set_write_timeout(timeout).map_err(io)?;
    let (segment, consumer) = ConnSegment::create(config.ring_bytes)?;
    let hs = |e: netless_shm::Error| {
        Status::unavailable(format!(
                "handshake with service `{service}` failed: {e} (refused by the server's ACL, or it is shutting down)"
            ))
    };
    // The server speaks first: a greeting once our credentials passed its ACL, or the
    // reason it refuses us. Only then does our segment's fd cross.
    // One deadline for the whole handshake, however the server paces its bytes.
    let deadline = std::time::Instant::now() + config.connect_timeout;
    let (bytes, _) = recv_frame_by(&socket, 0, MAX_HANDSHAKE_FRAME, deadline).map_err(hs)?;
    match Frame::decode(&bytes) {
        Some(Frame::Greeting { version }) if version == PROTOCOL_VERSION => {}
        // Its `Hello` would not be ours: say so rather than send one it cannot read.
        Some(Frame::Greeting { version }) => {
            return Err(Status::unavailable(format!(
                "service `{service}` speaks netless protocol {version}, this client \
                 {PROTOCOL_VERSION}: use the same netless release on both sides"
            )))
        }
        Some(Frame::Reject(status)) => return Err(status),
        _ => {
            return Err(Status::unavailable(format!(
                "service `{service}` sent a malformed greeting"
            )))
        }
    }
    // A member of a domain claims its row, and proves it with the open file its liveness
    // token is held on: the server maps our Refs only if it checks out.
    let claim = config.domain.as_ref().and_then(|d| d.member_claim());
    let mut fds = vec![segment.segment().fd()];
    fds.extend(claim.map(|(_, file)| file));
    send_frame(
        &socket,
        &Frame::Hello {
            version: PROTOCOL_VERSION,
            max_message: u32::try_from(config.max_message).unwrap_or(u32::MAX),
            domain: config.domain.as_ref().map_or(0, |d| d.id()),
            member: claim.map_or(NO_MEMBER, |(c, _)| c.member),
            generation: claim.map_or(0, |(c, _)| c.generation),
            cpu: config
                .cpu
                .or_else(pinned_cpu)
                .and_then(|cpu| u32::try_from(cpu).ok())
                .unwrap_or(NO_CPU),
        }
        .encode(),
        &fds,
    )
    .map_err(hs)?;
    let (bytes, fds) = recv_frame_by(&socket, 2, MAX_HANDSHAKE_FRAME, deadline).map_err(hs)?;
    let (conn_index, tag, token, server_domain, by_ref) = match Frame::decode(&bytes) {
        Some(Frame::Welcome {
            version,
            conn_index,
            tag,
            token,
            domain,
            by_ref,
        }) if version == PROTOCOL_VERSION => (conn_index, tag, token, domain, by_ref),
        Some(Frame::Welcome { version, .. }) => {
            return Err(Status::unavailable(format!(
            "service `{service}` speaks netless protocol {version}, this client {PROTOCOL_VERSION}"
        )))
        }
        Some(Frame::Reject(status)) => return Err(status),
        _ => {
            return Err(Status::unavailable(format!(
                "service `{service}` sent a malformed handshake"
            )))
        }
    };
    let [replica, control]: [_; 2] = fds.try_into().map_err(|_| {
        Status::unavailable(format!(
            "service `{service}` sent no replica and control segments"
        ))
    })?;
    let control = std::sync::Arc::new(ControlSegment::attach(control)?);
    let replica = ReplicaSegment::attach(replica, control)?;
    socket.set_read_timeout(None).map_err(io)?;
    socket.set_write_timeout(None).map_err(io)?;

    let fragment_body = fragment_body(service, &replica)?;
    // Pass by reference only when both sides map the same pool and the server says it
    // maps our Refs (it checked our member claim). A server that says so falsely only
    // fails our calls, which it could anyway: a Ref is of use to members alone.
    let pool = config
        .domain
        .clone()
        .filter(|d| by_ref && server_domain != 0 && d.id() == server_domain);
    Ok(Handshaken {
        service: service.to_string(),
        dir: dir.path().to_owned(),
        pool,
        replica,
        segment,
        consumer,
        conn_index,
        tag,
        token,
        fragment_body,
        socket,
        config,
        polled: None,
        max_sleep: super::wait::MAX_SLEEP,
    })
}

/// Checks that the process serving `path` runs as the uid this client expects (the socket's
/// `SO_PEERCRED`, recorded by the kernel when the server started listening), before
/// anything is sent to it.
fn check_server(
    service: &str,
    path: &Path,
    dir: &SocketDir,
    socket: &UnixStream,
    config: &ClientConfig,
) -> Result<(), Status> {
    let server = peer_cred(socket)
        .map_err(|e| Status::unavailable(format!("connecting to `{service}`: {e}")))?;
    let (expected, why) = match config.expect_server_uid {
        Some(uid) => (uid, "ClientConfig::expect_server_uid"),
        None => (dir.owner(), "the socket directory's owner"),
    };
    if server.uid != expected {
        return Err(Status::new(
            Code::PermissionDenied,
            format!(
                "service `{service}` at {} is served by uid {}, not by uid {expected} ({why}): \
                 another user may be impersonating it, so nothing was sent; if that user's \
                 server is the one you mean, set ClientConfig::expect_server_uid to {}",
                path.display(),
                server.uid,
                server.uid
            ),
        ));
    }
    Ok(())
}

/// The most body bytes one fragment of a request to `replica` carries.
pub(super) fn fragment_body(service: &str, replica: &ReplicaSegment) -> Result<usize, Status> {
    let g = *replica.geometry();
    let block = g.block_size as usize;
    // Fragments of up to 64 KiB or 64 blocks, whichever is more (a server with large
    // blocks takes large requests whole), and at most a quarter of the partition each.
    // At least one byte of body per fragment, even with 64-byte blocks.
    let min_run = (HEADER_LEN / block + 1) as u32;
    let max_run = (g.part_blocks / 4)
        .clamp(min_run, (65536 / g.block_size).max(64).max(min_run))
        .min(g.part_blocks) as usize;
    if max_run * block <= HEADER_LEN {
        return Err(Status::unavailable(format!(
            "service `{service}`'s receive buffer is too small to hold a request"
        )));
    }
    Ok(max_run * block - HEADER_LEN)
}

/// The CPU the calling thread is pinned to, if it may run on one alone: where its calls will
/// come from. An unpinned thread's CPU of the moment says nothing of where it will run.
fn pinned_cpu() -> Option<usize> {
    (netless_shm::available_cpus() == 1).then(netless_shm::current_cpu)
}
