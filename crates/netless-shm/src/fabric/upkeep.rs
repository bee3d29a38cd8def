//! The fabric's thread: it beats this member's heartbeat (or finds it was evicted), runs
//! the watchers of the layers above, frees what is due, reclaims dead members, and sweeps
//! up what no reclaim reaches, until the last handle on the region drops.

use std::sync::Weak;
use std::time::Instant;

use super::layout::{DIRECTORY, MEMBERS};
use super::members::{self, MemberId};
use super::{alloc, directory, lock, Extent, Fabric, Inner};
use crate::sync::Ordering;

/// The fabric's thread: beats, runs watchers, frees what is due and reclaims dead members,
/// until the last handle drops.
pub(super) fn run(weak: Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let fabric = Fabric { inner };
        let tick = fabric.tick();
        let member = beat(&fabric);
        run_watchers(&fabric);
        if member {
            free_due(&fabric);
            reclaim_dead(&fabric);
            sweep(&fabric);
        }
        drop(fabric);
        std::thread::sleep(tick);
    }
}

/// Beats, if this member is still one: a member whose slot no longer names it (others
/// judged it dead while it was stopped, and reclaimed it) is evicted, and stops.
fn beat(fabric: &Fabric) -> bool {
    let slot = fabric.inner.geometry.member(fabric.inner.me.index as usize);
    let words = &fabric.inner.words;
    let live = (u64::from(fabric.inner.me.generation) << 8) | members::LIVE;
    if words.word(slot + members::M_STATE).load(Ordering::Acquire) != live {
        fabric.inner.evicted.store(true, Ordering::Release);
        return false;
    }
    // One writer (this member), so no atomic add; a forged value only wraps.
    let beat = words.load(slot + members::M_HEARTBEAT).wrapping_add(1);
    words.store(slot + members::M_HEARTBEAT, beat);
    true
}

/// Runs the watchers; one that panics is dropped (and the panic reported), never the
/// thread that keeps this member alive.
fn run_watchers(fabric: &Fabric) {
    let mut watchers = std::mem::take(&mut lock(&fabric.inner.ticks).watchers);
    watchers.retain_mut(|w| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w(fabric))).unwrap_or(false)
    });
    lock(&fabric.inner.ticks).watchers.extend(watchers);
}

fn free_due(fabric: &Fabric) {
    let now = Instant::now();
    let due: Vec<Extent> = {
        let mut ticks = lock(&fabric.inner.ticks);
        let (due, keep) = ticks.later.drain(..).partition(|(at, _)| *at <= now);
        ticks.later = keep;
        due.into_iter().map(|(_, e)| e).collect::<Vec<_>>()
    };
    for extent in due {
        fabric.free(extent);
    }
}

/// Frees what no reclaim reaches, two leases after it is first seen: directory entries a
/// publisher died claiming, and units whose owner is no slot's occupant (every 25th
/// tick: it reads the whole unit table).
fn sweep(fabric: &Fabric) {
    let (words, g) = (&fabric.inner.words, &fabric.inner.geometry);
    let quarantine = 2 * fabric.inner.lease;
    let now = Instant::now();
    let mut ticks = lock(&fabric.inner.ticks);
    ticks.ticks += 1;
    let mut claiming = std::collections::HashMap::new();
    for index in 0..DIRECTORY as u32 {
        if let Some(seen) = directory::claiming(words, g, index) {
            let since = match ticks.claiming.get(&index) {
                Some(&(s, since)) if s == seen => since,
                _ => now,
            };
            if now.duration_since(since) < quarantine
                || !directory::free_stuck(words, g, index, seen)
            {
                claiming.insert(index, (seen, since));
            }
        }
    }
    ticks.claiming = claiming;
    if !ticks.ticks.is_multiple_of(25) {
        return;
    }
    let mut stale = std::collections::HashMap::new();
    for owner in alloc::owners(words, g) {
        let state = words
            .word(g.member(owner.index as usize) + members::M_STATE)
            .load(Ordering::Acquire);
        let occupant = members::phase(state) != members::FREE
            && members::generation(state) == owner.generation;
        if occupant {
            continue;
        }
        let since = ticks.stale.get(&owner).copied().unwrap_or(now);
        if now.duration_since(since) >= quarantine {
            alloc::free_all(words, g, owner);
        } else {
            stale.insert(owner, since);
        }
    }
    ticks.stale = stale;
}

/// Reclaims members dead (or gone) for two leases: their units and directory entries,
/// then their slot.
fn reclaim_dead(fabric: &Fabric) {
    let (words, g) = (&fabric.inner.words, &fabric.inner.geometry);
    for index in 0..MEMBERS {
        if index == fabric.inner.me.index as usize {
            continue;
        }
        let state = words.word(g.member(index) + members::M_STATE);
        let s = state.load(Ordering::Acquire);
        let phase = members::phase(s);
        if phase == members::FREE {
            continue;
        }
        let member = MemberId {
            index: index as u32,
            generation: members::generation(s),
        };
        // A member that left, or one found dead, waits two leases; a reclaim another
        // member started and did not finish is redone by the same rule.
        let alive = phase == members::LIVE && fabric.is_alive(member);
        if alive {
            continue;
        }
        let judge = fabric.judge();
        let dead_for = {
            let mut ticks = lock(&fabric.inner.ticks);
            ticks.observer.alive(&judge, member);
            ticks.observer.dead_for(member).unwrap_or_default()
        };
        if dead_for < 2 * fabric.inner.lease {
            continue;
        }
        let reclaiming = (u64::from(member.generation) << 8) | members::RECLAIMING;
        if phase != members::RECLAIMING
            && state
                .compare_exchange(s, reclaiming, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            continue;
        }
        let units = alloc::free_all(words, g, member);
        let entries = directory::withdraw_all(words, g, member);
        let _ = state.compare_exchange(
            reclaiming,
            u64::from(member.generation) << 8,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        lock(&fabric.inner.ticks).observer.forget(member);
        let _ = (units, entries);
    }
}
