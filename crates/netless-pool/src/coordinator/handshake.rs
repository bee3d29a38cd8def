//! The joining side of the pool handshake: connect to the domain's socket, check who
//! answers, ask for a member row (or our own again) and take the pool. It never admits
//! anyone (`admit` does).

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::files::Paths;
use super::{JOIN_MAGIC, PROTOCOL, WELCOME_MAGIC};
use crate::layout::MAX_MEMBERS;
use crate::members::Identity;
use crate::{DomainConfig, PoolError};

pub(super) enum Attempt {
    NoCoordinator,
    Joined(UnixStream, Option<OwnedFd>, usize),
}

pub(super) fn join_err(config: &DomainConfig, reason: String) -> PoolError {
    PoolError::Join {
        name: config.name.clone(),
        reason,
    }
}

/// One try at joining through the socket as `me`; `rejoin` re-registers an existing member.
pub(super) fn try_connect(
    config: &DomainConfig,
    paths: &Paths,
    me: &Identity,
    rejoin: Option<(u64, usize, u32)>,
) -> Result<Attempt, PoolError> {
    let stream = match paths.dir.connect(&paths.socket) {
        Ok(s) => s,
        Err(e) if netless_shm::nobody_listens(&e) => return Ok(Attempt::NoCoordinator),
        Err(e) => {
            return Err(join_err(
                config,
                format!("connect to {}: {e}", paths.socket_path().display()),
            ))
        }
    };
    // Nothing goes to a coordinator the ACL would not admit as a member.
    let cred = netless_shm::peer_cred(&stream)?;
    if !config.acl.allows(&cred) {
        return Err(join_err(
            config,
            format!(
                "the coordinator at {} runs as uid {} gid {}, which the domain's ACL does not \
                 allow: another user may be impersonating it; nothing was sent",
                paths.socket_path().display(),
                cred.uid,
                cred.gid
            ),
        ));
    }
    let io = |e: std::io::Error| join_err(config, format!("socket set-up: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(io)?;
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .map_err(io)?;
    let mut req = JOIN_MAGIC.to_vec();
    req.extend_from_slice(&PROTOCOL.to_le_bytes());
    let (domain, member, generation) = rejoin.unwrap_or((0, u32::MAX as usize, 0));
    req.extend_from_slice(&domain.to_le_bytes());
    req.extend_from_slice(&(member as u32).to_le_bytes());
    req.extend_from_slice(&generation.to_le_bytes());
    req.extend_from_slice(&me.token.to_le_bytes());
    req.extend_from_slice(&me.pid.to_le_bytes());
    req.extend_from_slice(&me.pid_ns.to_le_bytes());
    let reply = netless_shm::send_frame(&stream, &req, &[])
        .and_then(|()| netless_shm::recv_frame(&stream, 1));
    let (payload, fds) = match reply {
        Ok(r) => r,
        // The coordinator is exiting: treat as absent and retry.
        Err(netless_shm::Error::PeerClosed) => return Ok(Attempt::NoCoordinator),
        Err(e) => {
            return Err(join_err(
                config,
                format!("handshake with the coordinator: {e}"),
            ))
        }
    };
    if payload.len() < 5 || &payload[..4] != WELCOME_MAGIC {
        return Err(join_err(
            config,
            "the coordinator sent a malformed reply".into(),
        ));
    }
    if payload[4] != 0 {
        return Err(join_err(
            config,
            String::from_utf8_lossy(&payload[5..]).into_owned(),
        ));
    }
    if payload.len() != 5 + 16 {
        return Err(join_err(
            config,
            "the coordinator sent a malformed welcome".into(),
        ));
    }
    let member = u32::from_le_bytes(payload[13..17].try_into().expect("4 bytes")) as usize;
    if member >= MAX_MEMBERS {
        return Err(join_err(
            config,
            format!("the coordinator assigned member {member}"),
        ));
    }
    stream.set_read_timeout(None).map_err(io)?;
    Ok(Attempt::Joined(stream, fds.into_iter().next(), member))
}
