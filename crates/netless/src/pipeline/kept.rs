//! Runs of the receive buffer a pipeline keeps between batches (`wire_flags::KEEP_BLOCKS`):
//! the server leaves such a run claimed after reading it, and the next batch is written
//! there once every request in it is answered. A steady stream of batches thus claims no
//! blocks (no CAS per block) and the block table's lines stay in both caches, unwritten.
//!
//! The block table is memory the server writes: a kept run is checked before each reuse and
//! forgotten if it is no longer ours.

use std::collections::VecDeque;

use super::Pipeline;
use crate::client::Connection;

/// In `slot_run`: the call's request is in no kept run.
const NO_RUN: u32 = u32::MAX;

/// A kept run.
#[derive(Clone, Copy)]
pub(super) struct KeptRun {
    pub(super) start: u32,
    pub(super) blocks: u32,
    /// Requests in it not yet answered (it is reused only at 0).
    pub(super) pending: u32,
}

/// The runs a pipeline keeps and which call is in which.
pub(super) struct KeptRuns {
    /// By id (`None`: a vacant id).
    runs: Vec<Option<KeptRun>>,
    /// Ids of kept runs holding no request in flight, oldest first: the next batches go
    /// there, in the order the server read them (it has long let go of their lines).
    pub(super) idle: VecDeque<u32>,
    /// Per call slot: the kept run its request is in, or [`NO_RUN`].
    slot_run: Vec<u32>,
    /// Blocks held in kept runs.
    pub(super) blocks: u32,
}

impl KeptRuns {
    pub(super) fn new(slots: usize) -> KeptRuns {
        KeptRuns {
            runs: Vec::new(),
            idle: VecDeque::new(),
            slot_run: vec![NO_RUN; slots],
            blocks: 0,
        }
    }

    /// Run `id`, if it is kept.
    #[inline(always)]
    pub(super) fn get(&self, id: u32) -> Option<KeptRun> {
        self.runs.get(id as usize).copied().flatten()
    }

    /// The kept runs.
    pub(super) fn iter(&self) -> impl Iterator<Item = &KeptRun> {
        self.runs.iter().flatten()
    }

    /// Starts keeping `start..start + blocks`; its id.
    pub(super) fn add(&mut self, start: u32, blocks: u32) -> u32 {
        let run = KeptRun {
            start,
            blocks,
            pending: 0,
        };
        self.blocks += blocks;
        match self.runs.iter().position(Option::is_none) {
            Some(id) => {
                self.runs[id] = Some(run);
                id as u32
            }
            None => {
                self.runs.push(Some(run));
                (self.runs.len() - 1) as u32
            }
        }
    }

    /// Stops keeping run `id` (the caller frees its blocks, or leaves them to the server).
    #[inline]
    fn forget(&mut self, id: u32) {
        if let Some(run) = self.runs.get_mut(id as usize).and_then(Option::take) {
            self.blocks -= run.blocks;
        }
    }

    /// Run `id` went to the server holding the requests of `call_ids`.
    #[inline]
    pub(super) fn published(&mut self, id: u32, call_ids: &[u64]) {
        if let Some(Some(run)) = self.runs.get_mut(id as usize) {
            run.pending = call_ids.len() as u32;
        }
        for &call_id in call_ids {
            self.slot_run[Pipeline::slot(call_id)] = id;
        }
    }

    /// An idle kept run of at least `need` blocks, still OWNED by us as a whole: for a batch,
    /// which may fill it.
    #[inline(always)]
    pub(super) fn take_idle_whole(
        &mut self,
        conn: &Connection,
        need: u32,
    ) -> Option<(u32, KeptRun)> {
        self.take_idle(conn, need, |run| run.blocks)
    }

    /// An idle kept run of at least `need` blocks whose first `need` blocks are still OWNED
    /// by us: for a lone request, which writes no more. A lone 64-byte echo reusing a run
    /// kept for an adaptive batch of 32 then reads 2 table words, not 37, a cost every lone
    /// request that reused such a run would pay at low load. A batch that takes the run
    /// later checks all of it.
    #[inline(always)]
    pub(super) fn take_idle_prefix(
        &mut self,
        conn: &Connection,
        need: u32,
    ) -> Option<(u32, KeptRun)> {
        self.take_idle(conn, need, |run| need.min(run.blocks))
    }

    /// An idle kept run of at least `need` blocks whose first `checked(run)` blocks are still
    /// OWNED by us. Smaller runs met on the way are given back (the batches have grown past
    /// them), and ones no longer ours (the table is memory the server writes) forgotten.
    #[inline]
    fn take_idle(
        &mut self,
        conn: &Connection,
        need: u32,
        checked: impl Fn(&KeptRun) -> u32,
    ) -> Option<(u32, KeptRun)> {
        let table = conn.replica.table();
        while let Some(id) = self.idle.pop_front() {
            let Some(run) = self.get(id) else {
                continue;
            };
            if !conn.lease.holds(table, run.start, checked(&run)) {
                self.forget(id);
            } else if run.blocks < need {
                self.forget(id);
                conn.lease.unclaim(table, run.start, run.blocks);
            } else {
                return Some((id, run));
            }
        }
        None
    }

    /// The request of call slot `index` was answered: its run may become idle.
    #[inline]
    pub(super) fn answered(&mut self, index: usize) {
        let Some(id) = self
            .slot_run
            .get_mut(index)
            .map(|r| std::mem::replace(r, NO_RUN))
        else {
            return;
        };
        if let Some(Some(run)) = self.runs.get_mut(id as usize) {
            run.pending = run.pending.saturating_sub(1);
            if run.pending == 0 {
                self.idle.push_back(id);
            }
        }
    }
}
