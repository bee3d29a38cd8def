//! The pool handshake's frames, and its joining side: connect to the domain's socket, check
//! who answers, take the members file it offers (to hold our liveness token on), ask for a
//! member row (or our own again) and take the pool. It never admits anyone (`admit` does).
//!
//! The coordinator speaks first, once the ACL admitted the joiner: an offer carrying its
//! protocol version and a new open file of the domain's members file (or a refusal). The
//! joiner, holding its token, sends its request; the coordinator answers with a welcome (and
//! the pool's fd, for a new member) or a refusal. Each side gives the whole exchange one
//! deadline, however the other paces its bytes.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::Instant;

use super::files::Paths;
use crate::layout::MAX_MEMBERS;
use crate::members::Identity;
use crate::{DomainConfig, PoolError};

/// The coordinator's first frame: its protocol version, and a members file.
pub(super) const OFFER_MAGIC: &[u8; 4] = b"NLDO";
/// A joiner's request.
pub(super) const JOIN_MAGIC: &[u8; 4] = b"NLDJ";
/// The coordinator's answer: 0 and the row (a welcome), or 1 and why not (a refusal).
pub(super) const WELCOME_MAGIC: &[u8; 4] = b"NLDW";
pub(super) const PROTOCOL: u32 = 3;
/// Bytes of a join request: magic, protocol, domain id, member row and generation (to
/// rejoin), liveness token, pid and pid namespace.
pub(super) const JOIN_LEN: usize = 44;
/// Longest frame a joiner reads from a coordinator (a refusal carries its reason).
const MAX_REPLY: usize = 4096;

/// What a joining process asks for.
pub(crate) struct Request {
    /// The domain, member row and generation it had, to be watched again after its
    /// coordinator went away; `None` for a new member row.
    pub(crate) rejoin: Option<(u64, usize, u32)>,
    /// Who asks, as it sees itself, and the token it holds.
    pub(crate) who: Identity,
}

impl Request {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut req = JOIN_MAGIC.to_vec();
        req.extend_from_slice(&PROTOCOL.to_le_bytes());
        let (domain, member, generation) = self.rejoin.unwrap_or((0, u32::MAX as usize, 0));
        req.extend_from_slice(&domain.to_le_bytes());
        req.extend_from_slice(&(member as u32).to_le_bytes());
        req.extend_from_slice(&generation.to_le_bytes());
        req.extend_from_slice(&self.who.token.to_le_bytes());
        req.extend_from_slice(&self.who.pid.to_le_bytes());
        req.extend_from_slice(&self.who.pid_ns.to_le_bytes());
        req
    }

    /// The request in `bytes`, or why it is refused.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Request, String> {
        if bytes.len() != JOIN_LEN || &bytes[..4] != JOIN_MAGIC {
            return Err("malformed join request".into());
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        if u32_at(4) != PROTOCOL {
            return Err(format!(
                "protocol version mismatch (the coordinator speaks {PROTOCOL})"
            ));
        }
        let member = u32_at(16);
        Ok(Request {
            rejoin: (member != u32::MAX).then(|| (u64_at(8), member as usize, u32_at(20))),
            who: Identity {
                token: u64_at(24),
                pid: u32_at(32),
                pid_ns: u64_at(36),
            },
        })
    }
}

/// The coordinator's first frame to a process the ACL admits.
pub(crate) fn offer() -> Vec<u8> {
    let mut frame = OFFER_MAGIC.to_vec();
    frame.extend_from_slice(&PROTOCOL.to_le_bytes());
    frame
}

/// A welcome to member row `member` of generation `generation`.
pub(crate) fn welcome(domain: u64, member: usize, generation: u32) -> Vec<u8> {
    let mut frame = WELCOME_MAGIC.to_vec();
    frame.push(0);
    frame.extend_from_slice(&domain.to_le_bytes());
    frame.extend_from_slice(&(member as u32).to_le_bytes());
    frame.extend_from_slice(&generation.to_le_bytes());
    frame
}

/// A refusal, saying why.
pub(crate) fn refusal(why: &str) -> Vec<u8> {
    let mut frame = WELCOME_MAGIC.to_vec();
    frame.push(1);
    frame.extend_from_slice(why.as_bytes());
    frame
}

pub(super) enum Attempt {
    NoCoordinator,
    Joined(Joined),
}

/// A join the coordinator welcomed.
pub(super) struct Joined {
    pub(super) stream: UnixStream,
    /// The pool, for a new member.
    pub(super) pool: Option<OwnedFd>,
    pub(super) member: usize,
    pub(super) generation: u32,
    /// The members file the coordinator offered, our token held on it, if we had none.
    pub(super) members: Option<File>,
}

pub(super) fn join_err(config: &DomainConfig, reason: String) -> PoolError {
    PoolError::Join {
        name: config.name.clone(),
        reason,
    }
}

/// One try at joining through the socket as `me`, all of it by `deadline`; `rejoin`
/// re-registers an existing member. `members` is the members file `me.token` is held on, if
/// this process has one; otherwise it takes the one the coordinator offers and holds its
/// token there. `publish` sees the socket before anything is read from it, so that a
/// stopping member can shut it down, and returns false to give up (as if nobody answered).
pub(super) fn try_connect(
    config: &DomainConfig,
    paths: &Paths,
    me: &Identity,
    (rejoin, members): (Option<(u64, usize, u32)>, Option<&File>),
    deadline: Instant,
    publish: &dyn Fn(&UnixStream) -> bool,
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
    // Nothing goes to (or comes from) a coordinator the ACL would not admit as a member.
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
    if !publish(&stream) {
        return Ok(Attempt::NoCoordinator);
    }
    let handshake = |e: netless_shm::Error| match e {
        netless_shm::Error::Timeout | netless_shm::Error::Protocol(_) => join_err(
            config,
            format!(
                "the coordinator at {} did not finish the handshake within the join timeout \
                 ({:?}): is it hung, or not a netless coordinator?",
                paths.socket_path().display(),
                config.join_timeout
            ),
        ),
        e => join_err(config, format!("handshake with the coordinator: {e}")),
    };
    let (frame, fds) = match netless_shm::recv_frame_by(&stream, 1, MAX_REPLY, deadline) {
        Ok(r) => r,
        // The coordinator is exiting: treat as absent and retry.
        Err(netless_shm::Error::PeerClosed) => return Ok(Attempt::NoCoordinator),
        Err(e) => return Err(handshake(e)),
    };
    check_offer(config, &frame)?;
    let adopted = match members {
        Some(_) => None,
        None => {
            let fd = fds.into_iter().next().ok_or_else(|| {
                join_err(config, "the coordinator offered no members file".into())
            })?;
            let file = File::from(fd);
            netless_shm::hold_liveness_token(&file, me.token)?;
            Some(file)
        }
    };
    let request = Request { rejoin, who: *me };
    let reply = netless_shm::send_frame_by(&stream, &request.encode(), &[], deadline)
        .and_then(|()| netless_shm::recv_frame_by(&stream, 1, MAX_REPLY, deadline));
    let (payload, fds) = match reply {
        Ok(r) => r,
        Err(netless_shm::Error::PeerClosed) => return Ok(Attempt::NoCoordinator),
        Err(e) => return Err(handshake(e)),
    };
    let (member, generation) = check_welcome(config, &payload)?;
    let io = |e: std::io::Error| join_err(config, format!("socket set-up: {e}"));
    stream.set_read_timeout(None).map_err(io)?;
    stream.set_write_timeout(None).map_err(io)?;
    Ok(Attempt::Joined(Joined {
        stream,
        pool: fds.into_iter().next(),
        member,
        generation,
        members: adopted,
    }))
}

/// Checks the coordinator's first frame: an offer in our protocol, or a refusal.
pub(crate) fn check_offer(config: &DomainConfig, frame: &[u8]) -> Result<(), PoolError> {
    if frame.len() >= 5 && frame[..4] == *WELCOME_MAGIC && frame[4] != 0 {
        return Err(join_err(
            config,
            String::from_utf8_lossy(&frame[5..]).into_owned(),
        ));
    }
    if frame.len() != 8 || &frame[..4] != OFFER_MAGIC {
        return Err(join_err(
            config,
            "the coordinator sent a malformed offer".into(),
        ));
    }
    let theirs = u32::from_le_bytes(frame[4..8].try_into().expect("4 bytes"));
    if theirs != PROTOCOL {
        return Err(join_err(
            config,
            format!("the coordinator speaks protocol {theirs}, this process {PROTOCOL}"),
        ));
    }
    Ok(())
}

/// The member row and generation a welcome gives, or the refusal's reason as an error.
pub(crate) fn check_welcome(
    config: &DomainConfig,
    payload: &[u8],
) -> Result<(usize, u32), PoolError> {
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
    let generation = u32::from_le_bytes(payload[17..21].try_into().expect("4 bytes"));
    if member >= MAX_MEMBERS {
        return Err(join_err(
            config,
            format!("the coordinator assigned member {member}"),
        ));
    }
    Ok((member, generation))
}
