//! Ref slots: where a Ref's page list is written into the pool, and where a mapper validates
//! it. Creating a Ref claims a free slot and lists the buffer's pages in page-table pages the
//! creator holds; mapping checks every word of the slot (its creator, its lengths, that the
//! creator holds each listed page) before taking the pages, and moves the slot READY → TAKEN
//! so a Ref maps once. The creator keeps its hold on the pages until it sees its slot taken
//! (collection) or revokes it, and then frees the slot.
//!
//! This module changes which pages this process holds only through its ledger (`page_ledger`:
//! a use more, a use less, a fresh page from the lease); the slots of a creator that died are
//! freed by its reaper (`members`), not here.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::layout::{
    slot_parts, slot_state, slot_word, MemberRow, PoolMap, RefSlot, MAX_REF_BYTES, PAGE_SIZE,
    SLOT_TABLES, TABLE_ENTRIES,
};
use crate::peer::Creator;
use crate::{pages, PoolError, Ref};

use super::PageLedger;

/// The creator's side of the slot protocol: the Refs this process created and has not yet seen
/// mapped or revoked, each holding its pages (one use each in the ledger) until then.
pub(super) struct CreatedRefs {
    map: Arc<PoolMap>,
    member: usize,
    /// Where the search for a free slot starts: after the last slot this process claimed.
    slot_cursor: usize,
    /// Oldest first.
    outstanding: VecDeque<Outstanding>,
    /// A Ref nobody mapped within this long is revoked.
    ref_ttl: Duration,
}

/// A Ref this process created and has not yet seen mapped or revoked.
struct Outstanding {
    slot: u32,
    generation: u32,
    /// Data pages, then table pages: one local use each.
    pages: Vec<u32>,
    created: Instant,
}

/// How much of the outstanding Refs a [`CreatedRefs::collect`] looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Collect {
    /// The oldest few: what every Ref created or buffer freed pays.
    Some(usize),
    /// Every one ([`crate::Domain::collect`]).
    Full,
    /// Every one, revoking those not mapped yet (leaving the domain).
    All,
}

/// Outstanding Refs a Ref creation or a buffer release looks at: more than one, so the
/// collection keeps ahead of creation even when some Refs wait long to be mapped.
pub(super) const COLLECT_BUDGET: usize = 8;

impl CreatedRefs {
    /// No Refs yet; `member` starts its slot search at its own stretch of the slot table, so
    /// members rarely race for the same free slot.
    pub(super) fn new(map: Arc<PoolMap>, member: usize, ref_ttl: Duration) -> CreatedRefs {
        CreatedRefs {
            map,
            member,
            slot_cursor: member * 64,
            outstanding: VecDeque::new(),
            ref_ttl,
        }
    }

    /// Refs created and not yet seen mapped or revoked.
    pub(super) fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    fn row(&self) -> &MemberRow {
        &self.map.members()[self.member]
    }

    /// A Ref to the `len` bytes in `data_pages`: claims a free slot, lists the pages in fresh
    /// page-table pages, and holds all of them until the Ref is seen mapped or revoked.
    pub(super) fn create(
        &mut self,
        ledger: &mut PageLedger,
        data_pages: &[u32],
        len: usize,
    ) -> Result<Ref, PoolError> {
        self.collect(ledger, Collect::Some(COLLECT_BUDGET));
        let ntables = data_pages.len().div_ceil(TABLE_ENTRIES);
        if ntables > SLOT_TABLES {
            return Err(PoolError::Config(format!(
                "a Ref of {len} bytes exceeds the largest of {MAX_REF_BYTES} bytes"
            )));
        }
        // Count the uses first, so an overflow leaves nothing half-done.
        ledger.use_pages(data_pages)?;
        let undo = |ledger: &mut PageLedger, tables: &[u32]| {
            ledger.unuse_pages(data_pages);
            ledger.unuse_pages(tables);
        };
        let Some((slot, generation)) = self.claim_slot() else {
            undo(ledger, &[]);
            return Err(PoolError::Exhausted(format!(
                "all {} ref slots of the domain are in use: map or revoke Refs, or give the \
                 domain more ref_slots",
                self.map.nslots()
            )));
        };
        let s = &self.map.slots()[slot as usize];
        let mut tables = Vec::with_capacity(ntables);
        for t in 0..ntables {
            let page = match ledger.fresh_page() {
                Ok(p) => p,
                Err(e) => {
                    undo(ledger, &tables);
                    s.state.store(
                        slot_word(generation, 0, slot_state::FREE),
                        Ordering::Release,
                    );
                    return Err(e);
                }
            };
            let entries =
                &data_pages[t * TABLE_ENTRIES..((t + 1) * TABLE_ENTRIES).min(data_pages.len())];
            // SAFETY: `page` is a fresh page held by us alone; `entries` fits in one page
            // (at most TABLE_ENTRIES u32s).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    entries.as_ptr() as *const u8,
                    self.map.page_ptr(page),
                    entries.len() * 4,
                )
            };
            s.tables[t].store(page, Ordering::Relaxed);
            tables.push(page);
        }
        s.len.store(len as u64, Ordering::Relaxed);
        s.npages.store(data_pages.len() as u32, Ordering::Relaxed);
        s.ntables.store(ntables as u32, Ordering::Relaxed);
        s.state.store(
            slot_word(generation, self.member, slot_state::READY),
            Ordering::Release,
        );
        let mut held = data_pages.to_vec();
        held.extend_from_slice(&tables);
        self.outstanding.push_back(Outstanding {
            slot,
            generation,
            pages: held,
            created: Instant::now(),
        });
        self.row().refs_created.fetch_add(1, Ordering::Relaxed);
        Ok(Ref {
            domain: self.map.domain_id(),
            slot,
            generation,
            len: len as u64,
        })
    }

    /// A free slot moved to BUILDING under our name: its index and its new generation.
    fn claim_slot(&mut self) -> Option<(u32, u32)> {
        let slots = self.map.slots();
        let n = slots.len();
        for step in 0..n {
            let i = (self.slot_cursor + step) % n;
            let word = slots[i].state.load(Ordering::Relaxed);
            let (generation, _, state) = slot_parts(word);
            if state != slot_state::FREE {
                continue;
            }
            let next = generation.wrapping_add(1);
            if slots[i]
                .state
                .compare_exchange(
                    word,
                    slot_word(next, self.member, slot_state::BUILDING),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                self.slot_cursor = i + 1;
                return Some((i as u32, next));
            }
        }
        None
    }

    /// Ends our hold on Refs that were mapped; revokes expired ones (or all, on leave).
    /// `Collect::Some(k)` looks at the `k` oldest only (rotating them to the back when they
    /// are still waiting), so that creating a Ref costs O(1) however many are outstanding.
    pub(super) fn collect(&mut self, ledger: &mut PageLedger, scope: Collect) {
        let slots = self.map.slots();
        let all = scope == Collect::All;
        let budget = match scope {
            Collect::Some(k) => k.min(self.outstanding.len()),
            Collect::Full | Collect::All => self.outstanding.len(),
        };
        // Read at most once, and only if a Ref is still waiting to be mapped.
        let mut now = None;
        for _ in 0..budget {
            let Some(o) = self.outstanding.pop_front() else {
                break;
            };
            let s = &slots[o.slot as usize];
            let ready = slot_word(o.generation, self.member, slot_state::READY);
            let taken = slot_word(o.generation, self.member, slot_state::TAKEN);
            let free = slot_word(o.generation, 0, slot_state::FREE);
            let word = s.state.load(Ordering::Acquire);
            let expired = |now: &mut Option<Instant>| {
                all || now
                    .get_or_insert_with(Instant::now)
                    .saturating_duration_since(o.created)
                    >= self.ref_ttl
            };
            let done = if word == taken {
                s.state.store(free, Ordering::Release);
                true
            } else if word == ready && expired(&mut now) {
                match s
                    .state
                    .compare_exchange(ready, free, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => true,
                    Err(now) if now == taken => {
                        s.state.store(free, Ordering::Release);
                        true
                    }
                    Err(_) => false,
                }
            } else if word != ready {
                // Not ours any more: someone wrote our slot. Keep our pages (leaking them to
                // our own exit beats freeing pages a mapper may use).
                tracing::error!(
                    "netless-pool: ref slot {} was overwritten: {word:#x}",
                    o.slot
                );
                continue;
            } else {
                false
            };
            if done {
                ledger.unuse_pages(&o.pages);
            } else {
                self.outstanding.push_back(o);
            }
        }
        ledger.trim_lease();
    }

    /// Ends our hold on a Ref we created and frees its slot; an error if it was mapped
    /// already.
    pub(super) fn revoke(&mut self, ledger: &mut PageLedger, r: &Ref) -> Result<(), PoolError> {
        let at = self.outstanding.iter().position(|o| {
            o.slot == r.slot && o.generation == r.generation && r.domain == self.map.domain_id()
        });
        let Some(at) = at else {
            return Err(PoolError::RefGone(
                "not an outstanding Ref of this process (revoked or collected already)".into(),
            ));
        };
        let o = &self.outstanding[at];
        let s = &self.map.slots()[o.slot as usize];
        let ready = slot_word(o.generation, self.member, slot_state::READY);
        let free = slot_word(o.generation, 0, slot_state::FREE);
        let mapped = s
            .state
            .compare_exchange(ready, free, Ordering::AcqRel, Ordering::Acquire)
            .is_err();
        if mapped {
            s.state.store(free, Ordering::Release);
        }
        let o = self.outstanding.remove(at).expect("index in range");
        ledger.unuse_pages(&o.pages);
        if mapped {
            return Err(PoolError::RefGone("it was mapped already".into()));
        }
        Ok(())
    }
}

/// The mapper's side of the slot protocol: a Ref's slot, read and validated, not yet taken.
pub(super) struct ValidatedSlot<'pool> {
    slot: &'pool RefSlot,
    /// The slot's state word as validated (READY, the Ref's generation, its creator).
    word: u64,
    /// The Ref's data pages, each held by its creator when validated.
    pages: Vec<u32>,
}

impl<'pool> ValidatedSlot<'pool> {
    /// Reads the slot of `r` and validates every word of it: its domain, its creator (who
    /// must be `from`, if given), its generation and state, its lengths, and that
    /// the creator holds each listed page.
    pub(super) fn read(
        map: &'pool PoolMap,
        r: &Ref,
        from: Option<Creator>,
    ) -> Result<ValidatedSlot<'pool>, PoolError> {
        if r.domain != map.domain_id() {
            return Err(PoolError::ForeignRef {
                theirs: r.domain,
                ours: map.domain_id(),
            });
        }
        let slots = map.slots();
        let s = slots
            .get(r.slot as usize)
            .ok_or_else(|| PoolError::InvalidRef(format!("slot {} out of range", r.slot)))?;
        let word = s.state.load(Ordering::Acquire);
        let (generation, creator, state) = slot_parts(word);
        if creator >= crate::layout::MAX_MEMBERS {
            return Err(PoolError::InvalidRef(format!(
                "its slot names creator {creator}, beyond the member table"
            )));
        }
        if let Some(from) = from {
            if !from.is(&map.members()[creator], creator) {
                return Err(PoolError::InvalidRef(
                    "it was not created by the sending process".to_owned(),
                ));
            }
        }
        if generation != r.generation || state != slot_state::READY {
            return Err(PoolError::RefGone(match state {
                _ if generation != r.generation => {
                    "it was mapped, revoked, or its creator exited".to_owned()
                }
                slot_state::TAKEN => "it was mapped already (a Ref maps once)".to_owned(),
                _ => "it was revoked, or its creator exited".to_owned(),
            }));
        }
        // The slot can be revoked, or its creator reaped, while we read it (its pages then
        // freed and reused): a failed check on a slot that changed meanwhile means the Ref is
        // gone, not forged.
        let invalid = |why: String| {
            if s.state.load(Ordering::Acquire) != word {
                PoolError::RefGone(
                    "it was revoked, or its creator exited, while this process mapped it".into(),
                )
            } else {
                PoolError::InvalidRef(why)
            }
        };
        let len = s.len.load(Ordering::Relaxed);
        let npages = s.npages.load(Ordering::Relaxed) as usize;
        let ntables = s.ntables.load(Ordering::Relaxed) as usize;
        if len != r.len
            || len as usize > MAX_REF_BYTES
            || npages != (len as usize).div_ceil(PAGE_SIZE)
            || ntables != npages.div_ceil(TABLE_ENTRIES)
        {
            return Err(invalid(format!(
                "length {} does not match its slot ({len} bytes, {npages} pages, {ntables} tables)",
                r.len
            )));
        }
        let valid = |p: u32| p < map.npages() && pages::holds(map, creator, p);
        let mut list = Vec::with_capacity(npages);
        for t in 0..ntables {
            let table = s.tables[t].load(Ordering::Relaxed);
            if !valid(table) {
                return Err(invalid(format!("page table {table} is not its creator's")));
            }
            let n = (npages - t * TABLE_ENTRIES).min(TABLE_ENTRIES);
            let mut entries = vec![0u32; n];
            // SAFETY: `table` is in bounds; n <= TABLE_ENTRIES u32s fit in one page. The
            // entries are copied out before use and each is validated below.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    map.page_ptr(table),
                    entries.as_mut_ptr() as *mut u8,
                    n * 4,
                )
            };
            list.extend_from_slice(&entries);
        }
        if let Some(&bad) = list.iter().find(|&&p| !valid(p)) {
            return Err(invalid(format!("page {bad} is not its creator's")));
        }
        Ok(ValidatedSlot {
            slot: s,
            word,
            pages: list,
        })
    }

    /// Takes the Ref: one local use of each of its pages, then the slot READY → TAKEN, if it
    /// is still the slot that was validated; the pages are returned.
    pub(super) fn take(self, ledger: &mut PageLedger) -> Result<Vec<u32>, PoolError> {
        let ValidatedSlot {
            slot: s,
            word,
            pages: list,
        } = self;
        let (generation, creator, _) = slot_parts(word);
        ledger.use_pages(&list)?;
        // The slot must still be the one we validated: then its creator still held every page
        // when we added ourselves, and the pages are the ones it shared.
        let taken = slot_word(generation, creator, slot_state::TAKEN);
        if s.state
            .compare_exchange(word, taken, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            ledger.unuse_pages(&list);
            return Err(PoolError::RefGone(
                "it was revoked (or mapped) while this process mapped it".into(),
            ));
        }
        Ok(list)
    }
}
