//! Domains whose pool lives in a memory fabric: members that share nothing but the region
//! pass references to each other's pages as they do on one host.
//!
//! The pool is an extent of the region, published in its directory as `pool.NAME`; the
//! first member to join makes it, the others map it. There is no coordinator: a member
//! claims its row itself (a compare-and-swap, as the coordinator would for it), and every
//! member reaps dead rows on each tick of its fabric thread. A member's liveness token is a
//! byte of the fabric file, named after its fabric membership (slot and generation), so
//! liveness is the kernel's lock wherever the member runs on this kernel; the pool is
//! therefore one kernel's (a member on another kernel, whose lock cannot be seen, would be
//! reaped alive: joining refuses it). The extent belongs to one live member at a time: the
//! one that made it, then whoever adopts it when that one dies (before the fabric reclaims
//! a dead member's memory, two leases on), or the heir it hands it to when it leaves.

use std::fs::File;
use std::sync::{Arc, Weak};

use netless_shm::fabric::{Extent, Fabric, MemberId, MEMBERS};

use crate::domain::Membership;
use crate::layout::{member_state, PoolMap};
use crate::members::{claim_row, pid_namespace, reap_dead_members, Identity, Tokens};
use crate::{Domain, DomainConfig, PoolError};

/// Liveness tokens of pool members are these bytes of the fabric file (beyond the fabric's
/// own members' tokens).
const TOKEN_BASE: u64 = 1 << 51;

/// The liveness token of fabric member `m`: one per occupancy of its slot.
pub(crate) fn token_of(m: MemberId) -> u64 {
    TOKEN_BASE + (u64::from(m.index) << 32) + u64::from(m.generation)
}

/// The fabric member a pool row's token names, if it names one.
pub(crate) fn member_of(token: u64) -> Option<MemberId> {
    let t = token.checked_sub(TOKEN_BASE)?;
    let index = u32::try_from(t >> 32).ok()?;
    ((index as usize) < MEMBERS).then_some(MemberId {
        index,
        generation: t as u32,
    })
}

fn entry_name(domain: &str) -> String {
    format!("pool.{domain}")
}

impl Domain {
    /// Joins domain `config.name` in `fabric`, making its pool there if no live member has
    /// yet (`config.geometry`); `config.dir` and `config.acl` do not apply: whoever can open
    /// the region is in its trust group.
    ///
    /// # Errors
    /// [`PoolError::Join`] if the pool is held by a member on another kernel, is full of
    /// members, or another member's pool is malformed; [`PoolError::Shm`] if the region has
    /// no room or cannot be mapped.
    ///
    /// ```
    /// use netless_pool::{Domain, DomainConfig, PoolGeometry};
    /// use netless_shm::fabric::{Fabric, FabricOptions};
    ///
    /// let path = std::env::temp_dir().join(format!("nl-fabric-pool-doc-{}", std::process::id()));
    /// let fabric = Fabric::open(&path, &FabricOptions::default())?;
    /// let mut config = DomainConfig::new("doc");
    /// config.geometry = PoolGeometry { pages: 1024, ref_slots: 64 }; // 4 MiB of the region
    /// let domain = Domain::join_fabric(&config, &fabric)?;
    /// let r = domain.alloc_from(b"by reference")?.share()?;
    /// assert_eq!(domain.map(&r)?.to_vec(), b"by reference");
    /// # drop(domain); std::fs::remove_file(path).ok();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn join_fabric(config: &DomainConfig, fabric: &Fabric) -> Result<Domain, PoolError> {
        let refuse = |reason: String| PoolError::Join {
            name: config.name.clone(),
            reason,
        };
        let me = fabric.member();
        let file = File::open(fabric.path()).map_err(|e| {
            refuse(format!(
                "cannot open the fabric's file for its liveness token: {e}"
            ))
        })?;
        netless_shm::hold_liveness_token(&file, token_of(me))?;
        let tokens = Tokens::new(Arc::new(file));
        // Making, joining and leaving the pool take turns: no two members make one each,
        // and no member leaves it to nobody while another is joining.
        let turn = fabric.lock_name(&entry_name(&config.name))?;
        let (map, extent) = find_or_make(config, fabric)?;
        let who = Identity {
            pid: std::process::id(),
            pid_ns: pid_namespace(),
            token: token_of(me),
        };
        let Some((member, _)) = claim_row(&map, who, None, &tokens) else {
            return Err(refuse(
                "its pool's member rows are all taken: stop some members".into(),
            ));
        };
        let domain = Domain::from_parts(Arc::new(map), member, config, None, tokens, who.pid_ns);
        *crate::domain::lock(&domain.membership.fabric) = Some(Hold {
            fabric: fabric.clone(),
            extent,
            name: entry_name(&config.name),
        });
        drop(turn);
        let mut keeper = Keeper {
            membership: Arc::downgrade(&domain.membership),
            extent,
            name: entry_name(&config.name),
        };
        fabric.watch(Box::new(move |fabric| keeper.tick(fabric)));
        Ok(domain)
    }
}

/// Maps the domain's pool, or makes it.
fn find_or_make(config: &DomainConfig, fabric: &Fabric) -> Result<(PoolMap, Extent), PoolError> {
    let refuse = |reason: String| PoolError::Join {
        name: config.name.clone(),
        reason,
    };
    let name = entry_name(&config.name);
    if let Some(entry) = fabric.lookup(&name, None).into_iter().next() {
        if !fabric.same_kernel(entry.owner) {
            return Err(refuse(
                "its pool is held by a member on another kernel, whose liveness this \
                 kernel cannot see: pass by value, or keep a domain's members on one host"
                    .into(),
            ));
        }
        let extent = entry.extents[0];
        if !fabric.is_owned_by(extent, entry.owner, 1 << 40) {
            return Err(refuse(
                "its directory entry names memory its holder does not hold".into(),
            ));
        }
        let map = PoolMap::attach_segment(fabric.map(extent)?, None)?;
        return Ok((map, extent));
    }
    // A pool whose holder died before another member adopted it: adopt it here, rather
    // than make a second one beside its members.
    let orphan = fabric
        .entries()
        .into_iter()
        .find(|e| e.name == name && e.replica.is_none() && !fabric.is_alive(e.owner));
    if let Some(entry) = orphan {
        let extent = entry.extents[0];
        if fabric.is_owned_by(extent, entry.owner, 1 << 40) && fabric.adopt(extent) {
            let map = PoolMap::attach_segment(fabric.map(extent)?, None)?;
            let none = Extent { offset: 0, len: 0 };
            fabric.publish(&name, None, [extent, none, none], 0)?;
            return Ok((map, extent));
        }
    }
    let geometry = config.geometry;
    geometry.validate()?;
    let len = geometry.header(0).total_len as usize;
    let extent = fabric.alloc(len)?;
    let segment = match fabric.map(extent) {
        Ok(segment) => segment,
        Err(e) => {
            fabric.free(extent);
            return Err(e.into());
        }
    };
    // SAFETY: a fresh mapping of `len` bytes of units this member just took; nobody else
    // has been told where they are.
    unsafe { std::ptr::write_bytes(segment.as_ptr(), 0, segment.len()) };
    let map = match PoolMap::create_in(segment, geometry, random_id()) {
        Ok(map) => map,
        Err(e) => {
            fabric.free(extent);
            return Err(e);
        }
    };
    let none = Extent { offset: 0, len: 0 };
    // Under the name's lock: no other member of this kernel makes one meanwhile.
    if let Err(e) = fabric.publish(&name, None, [extent, none, none], 0) {
        fabric.free(extent);
        return Err(e.into());
    }
    Ok((map, extent))
}

fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish() | 1
}

/// Each tick of the fabric thread: reap dead rows, and keep the pool held by a live member
/// and listed.
struct Keeper {
    membership: Weak<Membership>,
    extent: Extent,
    name: String,
}

impl Keeper {
    fn tick(&mut self, fabric: &Fabric) -> bool {
        let Some(m) = self.membership.upgrade() else {
            return false;
        };
        reap_dead_members(&m.map, &m.tokens, Some(m.member));
        if fabric.lookup(&self.name, None).is_empty() && fabric.adopt(self.extent) {
            let none = Extent { offset: 0, len: 0 };
            let _ = fabric.publish(&self.name, None, [self.extent, none, none], 0);
        }
        true
    }
}

/// A member's hold on a fabric pool: on leaving, the member that holds the extent hands it
/// to another live member, or gives it back if none is left.
pub(crate) struct Hold {
    fabric: Fabric,
    extent: Extent,
    name: String,
}

impl Hold {
    pub(crate) fn leave(self, membership: &Membership) {
        let fabric = &self.fabric;
        // In turn with joiners (see `join_fabric`); without the lock, as safe as before.
        let _turn = fabric.lock_name(&self.name).ok();
        if fabric.owner_of(self.extent) != Some(fabric.member()) {
            return;
        }
        let heir = membership
            .map
            .members()
            .iter()
            .enumerate()
            .filter(|&(m, row)| {
                m != membership.member
                    && row.state.load(std::sync::atomic::Ordering::Acquire) & 0xff
                        == member_state::ALIVE
            })
            .filter_map(|(_, row)| member_of(row.token.load(std::sync::atomic::Ordering::Acquire)))
            .find(|&m| m != fabric.member() && fabric.is_alive(m));
        for entry in fabric.lookup(&self.name, None) {
            if entry.owner == fabric.member() {
                fabric.withdraw(entry.index);
            }
        }
        match heir {
            // Its keeper lists the pool again at its next tick.
            Some(heir) if fabric.hand_over(self.extent, heir) => {}
            _ => fabric.free_later(self.extent),
        }
    }
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("extent", &self.extent)
            .finish_non_exhaustive()
    }
}

impl Domain {
    /// Checks the claim of the fabric member `member` (as the connect slot it posted names
    /// it) to be row `claim` of this domain: the row must be alive in that generation and hold
    /// the token of that membership, which the kernel shows locked. In a fabric whoever can
    /// open the region can write its rows: this keeps out mistakes and stale claims, not a
    /// member of the region.
    pub fn verify_fabric_member(
        &self,
        claim: crate::MemberClaim,
        member: MemberId,
    ) -> Option<crate::PeerMember> {
        let m = &self.membership;
        let row = m.map.members().get(claim.member as usize)?;
        let alive = u64::from(claim.generation) << 32 | member_state::ALIVE;
        let token = token_of(member);
        let ok = row.state.load(std::sync::atomic::Ordering::Acquire) == alive
            && row.token.load(std::sync::atomic::Ordering::Acquire) == token
            && (claim.member as usize == m.member || m.tokens.held(token));
        ok.then(|| crate::PeerMember::new(claim.member as usize, claim.generation))
    }

    /// This member's own claim, to send to a peer in the same fabric.
    pub fn fabric_claim(&self) -> crate::MemberClaim {
        let m = &self.membership;
        let word = m.map.members()[m.member]
            .state
            .load(std::sync::atomic::Ordering::Acquire);
        crate::MemberClaim {
            member: m.member as u32,
            generation: (word >> 32) as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_their_member_and_nothing_else() {
        let m = MemberId {
            index: 5,
            generation: 0xffff_fff0,
        };
        assert_eq!(member_of(token_of(m)), Some(m));
        assert_eq!(member_of(7), None);
        assert_eq!(member_of(TOKEN_BASE + (64 << 32)), None);
    }
}
