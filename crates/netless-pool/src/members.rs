//! The member table: claiming a row for a joining process, telling live members from dead
//! ones, and reaping the dead (freeing their Ref slots and clearing their holder bit from
//! every page), so a member that dies by any signal leaks nothing.
//!
//! A row's state word runs FREE → JOINING → ALIVE, then back to FREE when the member leaves
//! or through REAPING when it dies; its high 32 bits count reuses. A survivor reaps a dead
//! row only after winning the compare-exchange to REAPING, and reaping is idempotent, so a
//! reaper that dies midway is simply redone by the next. A member is alive while its pid
//! runs with the start time recorded in its row: a reused pid never keeps a dead member's
//! pages.
//!
//! This module never talks on a socket or decides who may join (the coordinator does), and
//! never touches a live member's private ledger of page uses (`domain` does); it frees pages
//! only by clearing a member's holder bit (`pages::reap`).

use std::sync::atomic::Ordering;

use crate::layout::{member_state, slot_parts, slot_state, slot_word, PoolMap, MAX_MEMBERS};
use crate::pages;

/// A process identity: pid and start time. `None` if the process is gone or a zombie.
pub(crate) fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain anything, so parse after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    // Field 22 overall is the 20th after the state (field 3).
    fields.nth(18)?.parse().ok()
}

/// Whether the process recorded in row `member` still runs (same pid, same start time).
pub(crate) fn row_alive(map: &PoolMap, member: usize) -> bool {
    let row = &map.members()[member];
    let pid = row.pid.load(Ordering::Acquire);
    let start = row.start_time.load(Ordering::Acquire);
    pid != 0 && process_start_time(pid) == Some(start)
}

/// Whether process `pid` holds a live row (state ALIVE) of the table.
pub(crate) fn has_live_pid(map: &PoolMap, pid: u32) -> bool {
    pid != 0
        && map.members().iter().any(|m| {
            m.state.load(Ordering::Acquire) & 0xff == member_state::ALIVE
                && m.pid.load(Ordering::Acquire) == pid
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
    row.pid.store(0, Ordering::Relaxed);
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
pub(crate) fn reap_dead_members(map: &PoolMap, me: Option<usize>) -> usize {
    let mut reaped = 0;
    let reaper = me.unwrap_or(0xff) as u64;
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
                by < MAX_MEMBERS && Some(by) != me && !row_alive(map, by)
            }
            _ => false,
        };
        if candidate && !row_alive(map, m) {
            let won = row
                .state
                .compare_exchange(
                    word,
                    (word & !0xffff) | reaper << 8 | member_state::REAPING,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok();
            if won {
                release_member(map, m, false);
                reaped += 1;
            }
        }
    }
    reaped
}

/// Claims a free member row for process `pid`.
pub(crate) fn claim_row(map: &PoolMap, pid: u32, me: Option<usize>) -> Option<(usize, u32)> {
    let start = process_start_time(pid)?;
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
                row.pid.store(pid, Ordering::Relaxed);
                row.start_time.store(start, Ordering::Relaxed);
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
        reap_dead_members(map, me);
    }
    None
}

/// Marks row `member` of a private pool (one no other process can join) as this process's,
/// alive.
pub(crate) fn claim_private_row(map: &PoolMap, member: usize) {
    let row = &map.members()[member];
    let pid = std::process::id();
    row.pid.store(pid, Ordering::Relaxed);
    row.start_time
        .store(process_start_time(pid).unwrap_or(0), Ordering::Relaxed);
    row.state
        .store(1 << 32 | member_state::ALIVE, Ordering::Release);
}
