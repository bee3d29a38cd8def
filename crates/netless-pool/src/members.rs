//! The member table: claiming a row for a joining process, telling live members from dead
//! ones, and reaping the dead (freeing their Ref slots and clearing their holder bit from
//! every page), so a member that dies by any signal leaks nothing.
//!
//! A row's state word runs FREE → JOINING → ALIVE, then back to FREE when the member leaves
//! or through REAPING when it dies; its high 32 bits count reuses. A survivor reaps a dead
//! row only after winning the compare-exchange to REAPING, and reaping is idempotent, so a
//! reaper that dies midway is simply redone by the next.
//!
//! A member is alive while its liveness token is held: a byte of the domain's `members` file
//! that the member locked before it joined and keeps locked while it runs
//! (`netless_shm::hold_liveness_token`); the kernel drops the lock when it dies, however it
//! dies. Any member asks the same file, so the answer is the same in every pid namespace:
//! no pid is looked up in `/proc`, and none can be reused. Whatever cannot be answered counts
//! as alive, so a live member's pages are never freed on doubt: a token covered by a lock
//! that is no member's (`TokenLock::Covered`) counts as alive too, but for a member whose
//! socket to the coordinator hung up, which is gone whatever covers its token. A row also
//! names its process
//! as the process sees itself (its pid and pid namespace), so that a server can tell which
//! member a socket's peer is, in the namespace both share (in any namespace, the peer proves
//! it with its open file of `members`: `peer`).
//!
//! This module never talks on a socket or decides who may join (the coordinator does), and
//! never touches a live member's private ledger of page uses (`domain` does); it frees pages
//! only by clearing a member's holder bit (`pages::reap`).

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use netless_shm::TokenLock;

use crate::layout::{member_state, slot_parts, slot_state, slot_word, PoolMap, MAX_MEMBERS};
use crate::pages;

/// Who a member row names: a process as it sees itself, and the token it holds while it
/// lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    /// Its pid in its own pid namespace.
    pub(crate) pid: u32,
    /// That namespace: the inode of its `/proc/self/ns/pid` (0 if unknown).
    pub(crate) pid_ns: u64,
    /// Its liveness token (0: none, in a private pool).
    pub(crate) token: u64,
}

impl Identity {
    /// This process, holding `token`.
    pub(crate) fn this_process(token: u64) -> Identity {
        Identity {
            pid: std::process::id(),
            pid_ns: pid_namespace(),
            token,
        }
    }
}

/// This process's pid namespace: the inode of `/proc/self/ns/pid` (which names the
/// process's own namespace whichever procfs is mounted), or 0 if there is no `/proc`.
pub(crate) fn pid_namespace() -> u64 {
    rustix::fs::stat("/proc/self/ns/pid").map_or(0, |st| st.st_ino)
}

/// The domain's `members` file, through which members' liveness tokens are held and
/// tested; none for a private pool, which no other process can join.
#[derive(Clone, Debug)]
pub(crate) struct Tokens {
    file: Option<Arc<File>>,
    /// Whether this process has warned of a lock covering members' tokens.
    warned: Arc<AtomicBool>,
}

impl Tokens {
    pub(crate) fn new(members: Arc<File>) -> Tokens {
        Tokens {
            file: Some(members),
            warned: Arc::default(),
        }
    }

    pub(crate) fn private() -> Tokens {
        Tokens {
            file: None,
            warned: Arc::default(),
        }
    }

    /// The members file this process holds its token on; none for a private pool.
    pub(crate) fn file(&self) -> Option<&File> {
        self.file.as_deref()
    }

    /// What locks `token`: [`TokenLock::Free`] only when the kernel says nothing does (or
    /// there is no token at all); a failed question, and any token of a private pool, is
    /// [`TokenLock::Held`].
    pub(crate) fn lock(&self, token: u64) -> TokenLock {
        let Some(file) = &self.file else {
            return TokenLock::Held;
        };
        if token == 0 {
            return TokenLock::Free;
        }
        match netless_shm::liveness_token_lock(file, token) {
            Ok(TokenLock::Covered) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "netless-pool: a lock that no member takes covers members' liveness \
                         tokens in the domain's members file: a process that can open it (its \
                         owner's, root's or a member's) is interfering; a member it covers is \
                         reaped only once its socket to the coordinator closes"
                    );
                }
                TokenLock::Covered
            }
            Ok(lock) => lock,
            Err(_) => TokenLock::Held,
        }
    }

    /// Whether the holder of `token` may still run: anything locks it (see [`Tokens::lock`]).
    pub(crate) fn held(&self, token: u64) -> bool {
        self.lock(token) != TokenLock::Free
    }
}

/// Whether the process recorded in row `member` still runs. Not for the caller's own row:
/// its own open file does not see its own token.
///
/// A row is ALIVE only once its token is written, and keeps it until it is FREE again (a
/// leaving member frees its row without clearing it): token 0 on an ALIVE row is no death
/// but a member's write into another's row, and counts as alive like any doubt.
pub(crate) fn row_alive(map: &PoolMap, tokens: &Tokens, member: usize) -> bool {
    let row = &map.members()[member];
    match row.token.load(Ordering::Acquire) {
        0 => row.state.load(Ordering::Acquire) & 0xff == member_state::ALIVE,
        token => tokens.held(token),
    }
}

/// Whether process `pid` of pid namespace `pid_ns` (as the caller, in that namespace, sees
/// it) holds a live row (state ALIVE) of the table; `me` is the caller's own row.
pub(crate) fn has_live_pid(
    map: &PoolMap,
    tokens: &Tokens,
    me: usize,
    pid: u32,
    pid_ns: u64,
) -> bool {
    pid != 0
        && pid_ns != 0
        && map.members().iter().enumerate().any(|(m, row)| {
            row.state.load(Ordering::Acquire) & 0xff == member_state::ALIVE
                && row.pid.load(Ordering::Acquire) == pid
                && row.pid_ns.load(Ordering::Acquire) == pid_ns
                && (m == me || row_alive(map, tokens, m))
        })
}

/// Whether a row in use (not FREE) already names `token`.
pub(crate) fn token_in_use(map: &PoolMap, token: u64) -> bool {
    map.members().iter().any(|row| {
        row.state.load(Ordering::Acquire) & 0xff != member_state::FREE
            && row.token.load(Ordering::Acquire) == token
    })
}

/// Rows in state ALIVE (a statistic: a snapshot, not synchronised with joins or deaths).
pub(crate) fn live_count(map: &PoolMap) -> usize {
    map.members()
        .iter()
        .filter(|m| m.state.load(Ordering::Relaxed) & 0xff == member_state::ALIVE)
        .count()
}

/// Releases every Ref slot and page `member` holds. For a dead member the caller has won its
/// row (`REAPING`); a leaving member calls it on itself.
pub(crate) fn release_member(map: &PoolMap, member: usize, leaving: bool) {
    for s in map.slots() {
        let mut word = s.state.load(Ordering::Acquire);
        // Bounded: a peer that keeps rewriting the word cannot hold us here.
        for _ in 0..64 {
            let (generation, creator, state) = slot_parts(word);
            if creator != member || state == slot_state::FREE {
                break;
            }
            // A mapper racing us fails its compare-exchange on the old word. If its
            // READY -> TAKEN won instead, free the TAKEN slot: only its creator would.
            match s.state.compare_exchange(
                word,
                slot_word(generation, 0, slot_state::FREE),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => word = now,
            }
        }
    }
    let freed = pages::reap(map, member);
    let row = &map.members()[member];
    let word = row.state.load(Ordering::Acquire);
    let free = (word >> 32) << 32 | member_state::FREE;
    // A reaped row (REAPING, ours) names nobody from here on. A leaving member's stays as it
    // is until the row is claimed again: cleared while still ALIVE, it would read as a row
    // whose token a member overwrote, alive, should the member die before freeing it.
    if !leaving {
        row.pid.store(0, Ordering::Relaxed);
        row.pid_ns.store(0, Ordering::Relaxed);
        row.token.store(0, Ordering::Relaxed);
    }
    // Exactly the word we (the reaper, or the leaving member) own: never overwrite a row that
    // someone else has since changed.
    if row
        .state
        .compare_exchange(word, free, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        tracing::warn!("netless-pool: member row {member} changed while it was released");
    }
    if !leaving {
        tracing::info!("netless-pool: reaped dead member {member}: {freed} pages freed");
    }
}

/// Reaps every member row whose process is gone; `me` (this process's row, if any) is
/// recorded as the reaper. Returns how many rows were reaped.
pub(crate) fn reap_dead_members(map: &PoolMap, tokens: &Tokens, me: Option<usize>) -> usize {
    let mut reaped = 0;
    let reaper = me.unwrap_or(0xff);
    for (m, row) in map.members().iter().enumerate() {
        if Some(m) == me {
            continue;
        }
        let word = row.state.load(Ordering::Acquire);
        let state = word & 0xff;
        let candidate = match state {
            member_state::ALIVE | member_state::JOINING => true,
            // A reaper that died mid-reap left REAPING: reaping is idempotent, so redo it,
            // but never alongside a live reaper (it would clear a reused row's bit).
            member_state::REAPING => {
                let by = ((word >> 8) & 0xff) as usize;
                by < MAX_MEMBERS && Some(by) != me && !row_alive(map, tokens, by)
            }
            _ => false,
        };
        if candidate && !row_alive(map, tokens, m) && take_for_reaping(map, m, word, reaper) {
            reaped += 1;
        }
    }
    reaped
}

/// Reaps row `member` of generation `generation`, whose socket to the coordinator hung up,
/// unless its token is held as its holder holds it; `me` is the reaper's row. A member keeps
/// that socket for as long as it is one (closing netless's descriptors is leaving the
/// domain), so a token that a lock of someone else's covers (`TokenLock::Covered`: the
/// holder may or may not be behind it) does not keep it alive. Returns whether it reaped.
pub(crate) fn reap_hung_up(
    map: &PoolMap,
    tokens: &Tokens,
    member: usize,
    generation: u32,
    me: usize,
) -> bool {
    let row = &map.members()[member];
    let word = row.state.load(Ordering::Acquire);
    // Only the row the socket was for: a member that left, or a row reused since, is not.
    word == u64::from(generation) << 32 | member_state::ALIVE
        && tokens.lock(row.token.load(Ordering::Acquire)) != TokenLock::Held
        && take_for_reaping(map, member, word, me)
}

/// Takes row `member`, seen as `word`, to REAPING in the name of row `reaper` (0xff: none)
/// and reaps it; false if the row changed meanwhile (someone else reaps it, or it lives on).
fn take_for_reaping(map: &PoolMap, member: usize, word: u64, reaper: usize) -> bool {
    let reaping = (word & !0xffff) | (reaper as u64) << 8 | member_state::REAPING;
    let won = map.members()[member]
        .state
        .compare_exchange(word, reaping, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok();
    if won {
        release_member(map, member, false);
    }
    won
}

/// Claims a free member row for process `who`.
pub(crate) fn claim_row(
    map: &PoolMap,
    who: Identity,
    me: Option<usize>,
    tokens: &Tokens,
) -> Option<(usize, u32)> {
    for _ in 0..2 {
        for (m, row) in map.members().iter().enumerate() {
            let word = row.state.load(Ordering::Acquire);
            if word & 0xff != member_state::FREE {
                continue;
            }
            let generation = ((word >> 32) as u32).wrapping_add(1);
            let joining = u64::from(generation) << 32 | member_state::JOINING;
            if row
                .state
                .compare_exchange(word, joining, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                row.pid.store(who.pid, Ordering::Relaxed);
                row.pid_ns.store(who.pid_ns, Ordering::Relaxed);
                row.token.store(who.token, Ordering::Relaxed);
                for c in [
                    &row.bytes_copied,
                    &row.pages_copied,
                    &row.refs_created,
                    &row.refs_mapped,
                ] {
                    c.store(0, Ordering::Relaxed);
                }
                // Pages still marked with this bit (a dead holder nobody reaped) go first.
                pages::reap(map, m);
                // A reaper that took the row meanwhile (it saw a half-written identity) wins;
                // try another row.
                if row
                    .state
                    .compare_exchange(
                        joining,
                        u64::from(generation) << 32 | member_state::ALIVE,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_ok()
                {
                    return Some((m, generation));
                }
            }
        }
        reap_dead_members(map, tokens, me);
    }
    None
}

/// Marks row `member` of a private pool (one no other process can join) as this process's,
/// alive.
pub(crate) fn claim_private_row(map: &PoolMap, member: usize) {
    let row = &map.members()[member];
    let me = Identity::this_process(0);
    row.pid.store(me.pid, Ordering::Relaxed);
    row.pid_ns.store(me.pid_ns, Ordering::Relaxed);
    row.state
        .store(1 << 32 | member_state::ALIVE, Ordering::Release);
}
