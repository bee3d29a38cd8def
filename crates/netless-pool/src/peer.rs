//! Telling which member a socket's peer is, in any pid namespace: the peer claims a member
//! row and passes, with `SCM_RIGHTS`, the open file of the domain's `members` file its
//! liveness token is held on; the receiver checks that exactly that open file holds the
//! row's token. Only the member holds that open file (and a child it forked without `exec`,
//! which shares its mappings too), so no other process can make the claim, whatever pid it
//! shows or whatever pid namespace either side is in; no pid is looked up.
//!
//! The proof: the receiver's own open file of `members` sees a shared lock of exactly the
//! token's byte that is not its own ([`TokenLock::Held`]), and the passed open file sees no
//! lock on that byte but its own ([`TokenLock::Free`]): any other open file would see the
//! holder's lock. For the receiver's own row, its own open file holds the token, so the
//! passed one must be it. The passed file must be the domain's `members` file (same device
//! and inode), and the row must stay ALIVE in the claimed generation throughout.
//!
//! Every member writes the member table, so a member can still claim another's row by
//! writing its own token there: the proof tells the domain's processes from the others (who
//! hold no open file of `members`), not members from each other, who share one trust group.
//!
//! The receiver holds the passed file only while it checks it: a peer's open file kept
//! open would keep the peer's token held after it dies. This module never talks on a socket
//! (the caller passes the file) and never decides what a proven member may do.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;

use netless_shm::TokenLock;

use crate::layout::{member_state, MAX_MEMBERS};
use crate::{Domain, PoolError, Ref, SharedBuf};

/// A process's claim to a member row of a domain: the row and the generation it holds it
/// in. Sent to a peer with the open file from [`Domain::member_claim`], which proves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberClaim {
    /// The member row (its bit in the page words).
    pub member: u32,
    /// How many times the row had been reused when the member took it.
    pub generation: u32,
}

/// A member of this process's domain that proved a [`MemberClaim`] ([`Domain::verify_member`]):
/// the process at the other end of the socket the proof came over. Only made by a proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerMember {
    member: usize,
    generation: u32,
}

impl PeerMember {
    pub(crate) fn new(member: usize, generation: u32) -> PeerMember {
        PeerMember { member, generation }
    }

    /// Its member row.
    pub fn member(&self) -> usize {
        self.member
    }
}

/// Whom a mapped Ref must have been created by.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Creator {
    /// A process as the mapper sees it: its pid and the mapper's pid namespace.
    Pid(u32, u64),
    /// A proven member, in the generation it proved.
    Member(PeerMember),
}

impl Creator {
    /// Whether row `creator`, `row`, is this creator's.
    pub(crate) fn is(&self, row: &crate::layout::MemberRow, creator: usize) -> bool {
        let word = row.state.load(Ordering::Acquire);
        match *self {
            Creator::Pid(pid, pid_ns) => {
                row.pid.load(Ordering::Acquire) == pid
                    && row.pid_ns.load(Ordering::Acquire) == pid_ns
                    && pid_ns != 0
                    && word & 0xff == member_state::ALIVE
            }
            Creator::Member(peer) => creator == peer.member && word == alive_word(peer.generation),
        }
    }
}

fn alive_word(generation: u32) -> u64 {
    u64::from(generation) << 32 | member_state::ALIVE
}

impl Domain {
    /// This process's claim to its member row, and the open file that proves it: send both
    /// to a peer (the file with `SCM_RIGHTS`) for [`Domain::verify_member`]. None for a
    /// private domain. The file proves the claim to whoever holds it: send it only to a
    /// process of the domain, which closes it once checked.
    pub fn member_claim(&self) -> Option<(MemberClaim, BorrowedFd<'_>)> {
        let m = &self.membership;
        let file = m.tokens.file()?;
        let word = m.map.members()[m.member].state.load(Ordering::Acquire);
        let claim = MemberClaim {
            member: m.member as u32,
            generation: (word >> 32) as u32,
        };
        Some((claim, file.as_fd()))
    }

    /// Checks a peer's [`MemberClaim`] against the open file it passed (which is closed
    /// here): the peer is that member exactly when that open file holds the row's liveness
    /// token. Works whatever pid namespaces the two live in.
    pub fn verify_member(&self, claim: MemberClaim, file: OwnedFd) -> Option<PeerMember> {
        let m = &self.membership;
        let ours = m.tokens.file()?;
        let theirs = File::from(file);
        let member = claim.member as usize;
        if member >= MAX_MEMBERS || !same_file(ours, &theirs) {
            return None;
        }
        let row = &m.map.members()[member];
        let word = alive_word(claim.generation);
        if row.state.load(Ordering::Acquire) != word {
            return None;
        }
        let token = row.token.load(Ordering::Acquire);
        if token == 0 {
            return None;
        }
        let held_elsewhere = member == m.member || m.tokens.lock(token) == TokenLock::Held;
        let held_there = matches!(
            netless_shm::liveness_token_lock(&theirs, token),
            Ok(TokenLock::Free)
        );
        let unchanged =
            row.state.load(Ordering::Acquire) == word && row.token.load(Ordering::Acquire) == token;
        (held_elsewhere && held_there && unchanged).then_some(PeerMember {
            member,
            generation: claim.generation,
        })
    }

    /// Whether `peer` still holds its member row (in the generation it proved).
    pub fn is_live_member(&self, peer: &PeerMember) -> bool {
        let row = &self.membership.map.members()[peer.member];
        row.state.load(Ordering::Acquire) == alive_word(peer.generation)
    }

    /// Maps a Ref only if member `peer` created it: for a server that receives Refs from a
    /// connection whose peer proved its membership, so that it cannot make it map Refs meant
    /// for someone else.
    ///
    /// # Errors
    /// As [`Domain::map`], and [`PoolError::InvalidRef`] if another member created it.
    pub fn map_from_member(&self, r: &Ref, peer: &PeerMember) -> Result<SharedBuf, PoolError> {
        let pages = self.membership.map_ref(r, Some(Creator::Member(*peer)))?;
        Ok(SharedBuf::new(self.clone(), pages, r.len()))
    }
}

/// Whether two open files are of the same file (device and inode).
fn same_file(a: &File, b: &File) -> bool {
    match (rustix::fs::fstat(a), rustix::fs::fstat(b)) {
        (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
        _ => false,
    }
}
